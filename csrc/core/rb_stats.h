/*
 * rb_stats.h - lifetime I/O counters of one device, shared by every engine.
 *
 * The unit is an attempt: one pread/pwrite family syscall (posix) or one SQE accepted by the
 * kernel (io_uring). Bytes are the requested length of the attempt. The 15 fields named like
 * LMCache's io_stats_snapshot() come first and keep its meaning; the rest are ours. Counters
 * are relaxed atomics: a snapshot is best effort across fields, exact per field.
 *
 * The io_uring scheduler's (rb_uring.h): read_/write_inflight_bytes, the bytes of attempts in
 * the kernel now, and their lifetime peaks (peak_inflight_bytes: both together); split_requests,
 * requests sent as more than one attempt; budget_waits, worker rounds in which a lane waited for
 * its byte budget or (writes) its share of the ring; read_/write_pending_bytes, the bytes of
 * requests submitted and not finished (queued in the scheduler or in the kernel): what a load
 * submitted now waits behind.
 */
#ifndef RB_STATS_H
#define RB_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#define RB_STATS_FIELDS(X)                                                                                             \
    X(read_attempts)                                                                                                   \
    X(write_attempts)                                                                                                  \
    X(read_submitted_bytes)                                                                                            \
    X(write_submitted_bytes)                                                                                           \
    X(completed_attempts)                                                                                              \
    X(failed_attempts)                                                                                                 \
    X(bounce_attempts)                                                                                                 \
    X(bounce_submitted_bytes)                                                                                          \
    X(fixed_buffer_attempts)                                                                                           \
    X(fixed_buffer_submitted_bytes)                                                                                    \
    X(outstanding_requests)                                                                                            \
    X(peak_outstanding_requests)                                                                                       \
    X(queued_requests)                                                                                                 \
    X(peak_queued_requests)                                                                                            \
    X(queue_full_events)                                                                                               \
    X(read_completed_bytes)                                                                                            \
    X(write_completed_bytes)                                                                                           \
    X(short_io_resubmits)                                                                                              \
    X(max_batch_size)                                                                                                  \
    X(batches_submitted)                                                                                               \
    X(nowait_hits)                                                                                                     \
    X(nowait_misses)                                                                                                   \
    X(fixed_buffer_fallbacks)                                                                                          \
    X(read_inflight_bytes)                                                                                             \
    X(peak_read_inflight_bytes)                                                                                        \
    X(write_inflight_bytes)                                                                                            \
    X(peak_write_inflight_bytes)                                                                                       \
    X(peak_inflight_bytes)                                                                                             \
    X(split_requests)                                                                                                  \
    X(budget_waits)                                                                                                    \
    X(read_pending_bytes)                                                                                              \
    X(write_pending_bytes)

typedef struct rb_stats {
#define RB_STATS_ATOMIC(name) _Atomic uint64_t name;
    RB_STATS_FIELDS(RB_STATS_ATOMIC)
#undef RB_STATS_ATOMIC
} rb_stats;

typedef struct rb_stats_snapshot {
#define RB_STATS_PLAIN(name) uint64_t name;
    RB_STATS_FIELDS(RB_STATS_PLAIN)
#undef RB_STATS_PLAIN
} rb_stats_snapshot;

#define RB_STAT_ADD(st, field, n) atomic_fetch_add_explicit(&(st)->field, (uint64_t)(n), memory_order_relaxed)
#define RB_STAT_SUB(st, field, n) atomic_fetch_sub_explicit(&(st)->field, (uint64_t)(n), memory_order_relaxed)

/* Raise a lifetime maximum to at least v. */
static inline void rb_stat_max(_Atomic uint64_t *peak, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(peak, memory_order_relaxed);
    while (cur < v && !atomic_compare_exchange_weak_explicit(peak, &cur, v, memory_order_relaxed, memory_order_relaxed))
        ;
}

static inline void rb_stats_read(rb_stats *st, rb_stats_snapshot *out)
{
#define RB_STATS_LOAD(name) out->name = atomic_load_explicit(&st->name, memory_order_relaxed);
    RB_STATS_FIELDS(RB_STATS_LOAD)
#undef RB_STATS_LOAD
}

#endif /* RB_STATS_H */
