/*
 * rb_hist.h - lock-free log-linear histograms and the core's observability block.
 *
 * A histogram keeps exact counts and an exact sum of uint64 samples (nanoseconds or bytes) in
 * log-linear buckets: four per power of two (HDR-like, at most 25% wide), values 0..3 exact.
 * Every power of two is a bucket boundary, so cumulative counts at le = 2^k are exact. Each
 * field is a relaxed atomic: recording is three atomic adds and never takes a lock; a snapshot
 * is exact per field and best effort across fields (a sample may be in count and not yet in
 * its bucket).
 *
 * rb_obs, one per core, holds the operation histograms, the misses of loads by reason, the
 * evictions by cause the core does not already count, and the bytes in flight. Recording is on
 * unless rb_obs.off is set (a measurement switch; the cost is a clock read per operation).
 */
#ifndef RB_HIST_H
#define RB_HIST_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define RB_HIST_SUB 4 /* buckets per power of two */
#define RB_HIST_N 252 /* 4 exact + 4 per power of two from 2^2 to 2^63 */

typedef struct rb_hist {
    _Atomic uint64_t count, sum;
    _Atomic uint64_t b[RB_HIST_N];
} rb_hist;

/* The bucket of v: 0..3 for v < 4, else 4 + 4 * (msb - 2) + the two bits below the msb. */
static inline unsigned rb_hist_index(uint64_t v)
{
    if (v < 4)
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    return 4u + 4u * (msb - 2u) + (unsigned)((v >> (msb - 2u)) & 3u);
}

/* The exclusive upper bound of bucket i (UINT64_MAX for the last). */
static inline uint64_t rb_hist_upper(unsigned i)
{
    if (i < 4)
        return i + 1;
    unsigned k = i - 4u, msb = k / 4u + 2u, sub = k % 4u;
    if (msb == 63u && sub == 3u)
        return UINT64_MAX;
    return (uint64_t)(5u + sub) << (msb - 2u);
}

static inline void rb_hist_add(rb_hist *h, uint64_t v)
{
    atomic_fetch_add_explicit(&h->b[rb_hist_index(v)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum, v, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

static inline uint64_t rb_hist_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The histograms of a core, by id, and their names (rb_hist_names; unit in the name). */
#define RB_HIST_IDS(X)                                                                                                 \
    X(PUT, "put_ns")                    /* one put_many call */                                                        \
    X(LOAD, "load_ns")                  /* one load_many call */                                                       \
    X(DELETE, "delete_ns")              /* one delete_many call */                                                     \
    X(CHECKPOINT, "checkpoint_ns")      /* one checkpoint (format v1 container, or log group/base) */                  \
    X(COMPACTION, "compaction_ns")      /* one base of the log format written */                                       \
    X(DEALLOC, "dealloc_ns")            /* one deallocation run */                                                     \
    X(VALIDATE, "validate_ns")          /* one slot-header validation pass (or slice) */                               \
    X(QUEUE_WAIT, "queue_wait_ns")      /* io_uring batch: handed to the engine until in the kernel */                 \
    X(DEVICE, "device_ns")              /* io_uring batch: in the kernel until its last completion */                  \
    X(INFLIGHT_BYTES, "inflight_bytes") /* bytes of loads and puts in flight, seen as each begins */                   \
    X(PUT_BYTES, "put_bytes")           /* payload bytes of one put_many call */                                       \
    X(LOAD_BYTES, "load_bytes")         /* payload bytes one load_many call served */

enum {
#define RB_HIST_ENUM(id, name) RB_H_##id,
    RB_HIST_IDS(RB_HIST_ENUM)
#undef RB_HIST_ENUM
        RB_H_COUNT
};

/* Why a key a load asked for was not served. */
#define RB_MISS_IDS(X)                                                                                                 \
    X(ABSENT, "absent")                 /* not indexed, and not dropped lately */                                      \
    X(EVICTED, "evicted")               /* not indexed: dropped lately (deleted, evicted) */                           \
    X(REFUSED_HEADER, "refused_header") /* its slot header did not vouch for it */                                     \
    X(CHECKSUM, "checksum")             /* its payload failed its checksum */                                          \
    X(DEVICE_ERROR, "device_error")     /* its read failed (or the device shrank below it) */

enum {
#define RB_MISS_ENUM(id, name) RB_MISS_##id,
    RB_MISS_IDS(RB_MISS_ENUM)
#undef RB_MISS_ENUM
        RB_MISS_COUNT
};

/* Keys dropped lately, by hash: a direct-mapped table a load's absent key is looked up in to
 * tell "evicted" from "absent" (a collision may call an absent key evicted: a statistic). */
#define RB_OBS_GONE 4096

typedef struct rb_obs {
    _Atomic int off;
    rb_hist h[RB_H_COUNT];
    _Atomic uint64_t miss[RB_MISS_COUNT];
    _Atomic uint64_t hits, deleted; /* keys loaded; index records a delete removed */
    _Atomic uint64_t inflight_bytes, peak_inflight_bytes;
    _Atomic uint64_t gone[RB_OBS_GONE]; /* under the core's mu: hash + 1 of keys dropped lately */
} rb_obs;

extern const char *const rb_hist_names[RB_H_COUNT];
extern const char *const rb_miss_names[RB_MISS_COUNT];

/* The start of a timed operation: its clock, or 0 when recording is off. */
static inline uint64_t rb_obs_t0(rb_obs *o)
{
    return atomic_load_explicit(&o->off, memory_order_relaxed) ? 0 : rb_hist_now_ns();
}
/* The end of one begun at t0 (nothing when t0 is 0). */
static inline void rb_obs_done(rb_obs *o, int id, uint64_t t0)
{
    if (t0)
        rb_hist_add(&o->h[id], rb_hist_now_ns() - t0);
}
static inline void rb_obs_add(rb_obs *o, int id, uint64_t v)
{
    if (!atomic_load_explicit(&o->off, memory_order_relaxed))
        rb_hist_add(&o->h[id], v);
}
static inline void rb_obs_count(_Atomic uint64_t *ctr, uint64_t n)
{
    if (n)
        atomic_fetch_add_explicit(ctr, n, memory_order_relaxed);
}
/* bytes enter flight: sampled into INFLIGHT_BYTES, peak raised */
static inline void rb_obs_fly(rb_obs *o, uint64_t bytes)
{
    uint64_t now = atomic_fetch_add_explicit(&o->inflight_bytes, bytes, memory_order_relaxed) + bytes;
    uint64_t cur = atomic_load_explicit(&o->peak_inflight_bytes, memory_order_relaxed);
    while (cur < now && !atomic_compare_exchange_weak_explicit(&o->peak_inflight_bytes, &cur, now, memory_order_relaxed,
                                                               memory_order_relaxed))
        ;
    rb_obs_add(o, RB_H_INFLIGHT_BYTES, now);
}
static inline void rb_obs_land(rb_obs *o, uint64_t bytes)
{
    atomic_fetch_sub_explicit(&o->inflight_bytes, bytes, memory_order_relaxed);
}
/* A key left the index (core mu held): remember its hash. */
static inline void rb_obs_gone(rb_obs *o, uint32_t hash)
{
    atomic_store_explicit(&o->gone[hash % RB_OBS_GONE], (uint64_t)hash + 1, memory_order_relaxed);
}
/* Whether an absent key's hash was dropped lately. */
static inline int rb_obs_was_gone(rb_obs *o, uint32_t hash)
{
    return atomic_load_explicit(&o->gone[hash % RB_OBS_GONE], memory_order_relaxed) == (uint64_t)hash + 1;
}

/* A plain copy of one histogram (rb_hist_read). */
typedef struct rb_hist_snap {
    uint64_t count, sum;
    uint64_t b[RB_HIST_N];
} rb_hist_snap;

static inline void rb_hist_read(rb_hist *h, rb_hist_snap *out)
{
    out->count = atomic_load_explicit(&h->count, memory_order_relaxed);
    out->sum = atomic_load_explicit(&h->sum, memory_order_relaxed);
    for (unsigned i = 0; i < RB_HIST_N; i++)
        out->b[i] = atomic_load_explicit(&h->b[i], memory_order_relaxed);
}

/* What recording costs one load call of keys keys on io_uring (clock reads, bytes in flight, an
 * outcome per key, counters, one batch's stamps): ns per call over iters calls on a scratch
 * rb_obs. 0, -ENOMEM, or -EIO if a sample went missing. */
int rb_hist_recording_cost(unsigned iters, unsigned keys, uint64_t *ns_per_call);

#endif /* RB_HIST_H */
