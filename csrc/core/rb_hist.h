/*
 * rb_hist.h - lock-free log-linear histograms and the core's observability block.
 *
 * A histogram keeps exact counts and an exact sum of uint64 samples (nanoseconds or bytes) in
 * log-linear buckets: four per power of two (HDR-like, at most 25% wide), values 0..3 exact.
 * Every power of two is a bucket boundary, so cumulative counts at le = 2^k are exact. Each
 * field is a relaxed atomic: recording is three atomic adds (rb_hist_add), or three plain
 * relaxed load + store pairs for the one writer of a histogram (rb_hist_add_own), and never
 * takes a lock; a snapshot is exact per field and best effort across fields (a sample may be in
 * count and not yet in its bucket).
 *
 * rb_obs, one per core, holds the operation histograms, the misses of loads by reason, the
 * evictions by cause the core does not already count, and the bytes in flight. Recording is on
 * unless rb_obs.off is set (a measurement switch; the counters of hits and misses stay on).
 *
 * The histograms and counters of rb_obs are sharded so that a call records with plain adds:
 * a recorder takes its thread's shard (one compare-and-swap of the shard's owner flag), adds
 * everything the call has to record with relaxed load + store pairs (one writer at a time, so
 * no sample is lost), and gives the shard back (a release store). When its shard is taken it
 * records into shard 0 with atomic adds instead, so recording never waits. A snapshot sums the
 * shards (rb_obs_read_hist, rb_obs_read_count): exact per field once the recorders are done.
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

/* Add v to a field with one writer (the owner of its shard): a relaxed load and store. */
static inline void rb_hist_bump_own(_Atomic uint64_t *x, uint64_t v)
{
    atomic_store_explicit(x, atomic_load_explicit(x, memory_order_relaxed) + v, memory_order_relaxed);
}

/* rb_hist_add when the caller is the only writer of h (it owns h's shard). */
static inline void rb_hist_add_own(rb_hist *h, uint64_t v)
{
    rb_hist_bump_own(&h->b[rb_hist_index(v)], 1);
    rb_hist_bump_own(&h->sum, v);
    rb_hist_bump_own(&h->count, 1);
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

/* The counters of rb_obs kept per shard. */
enum { RB_OBS_HITS = RB_MISS_COUNT, RB_OBS_DELETED, RB_OBS_NCOUNT };

/* One shard: owned by one recorder at a time (busy), but shard 0, which is only added to
 * atomically. ctr: the misses by reason (RB_MISS_*), then keys loaded (RB_OBS_HITS) and index
 * records a delete removed (RB_OBS_DELETED). */
typedef struct rb_obs_shard {
    _Atomic int busy;
    char pad_[60]; /* busy in a cache line of its own */
    rb_hist h[RB_H_COUNT];
    _Atomic uint64_t ctr[RB_OBS_NCOUNT];
} rb_obs_shard;

#define RB_OBS_SHARDS 8 /* shard 0 shared, 1..7 taken by threads (by a per-thread hint) */

typedef struct rb_obs {
    _Atomic int off;
    _Atomic uint64_t inflight_bytes, peak_inflight_bytes;
    _Atomic uint64_t gone[RB_OBS_GONE]; /* under the core's mu: hash + 1 of keys dropped lately */
    rb_obs_shard sh[RB_OBS_SHARDS];
} rb_obs;

extern const char *const rb_hist_names[RB_H_COUNT];
extern const char *const rb_miss_names[RB_MISS_COUNT];

/* A recorder: the shard it adds to and whether it owns it (plain adds) or not (atomic adds). */
typedef struct rb_obs_w {
    rb_obs_shard *s;
    int own;
} rb_obs_w;

extern _Thread_local unsigned rb_obs_hint; /* this thread's shard, 1..RB_OBS_SHARDS-1 (0: none yet) */
unsigned rb_obs_hint_new(void);

/* Take this thread's shard, or shard 0 (atomic adds) when another recorder holds it. */
static inline rb_obs_w rb_obs_take(rb_obs *o)
{
    unsigned i = rb_obs_hint ? rb_obs_hint : rb_obs_hint_new();
    int free_ = 0;
    if (atomic_compare_exchange_strong_explicit(&o->sh[i].busy, &free_, 1, memory_order_acquire, memory_order_relaxed))
        return (rb_obs_w){&o->sh[i], 1};
    return (rb_obs_w){&o->sh[0], 0};
}
static inline void rb_obs_give(rb_obs_w w)
{
    if (w.own)
        atomic_store_explicit(&w.s->busy, 0, memory_order_release);
}
/* Record v in histogram id (whether or not recording is off: the caller checked). */
static inline void rb_obs_w_add(rb_obs_w w, int id, uint64_t v)
{
    if (w.own)
        rb_hist_add_own(&w.s->h[id], v);
    else
        rb_hist_add(&w.s->h[id], v);
}
/* Add n to counter k (RB_MISS_*, RB_OBS_HITS, RB_OBS_DELETED). */
static inline void rb_obs_w_count(rb_obs_w w, int k, uint64_t n)
{
    if (!n)
        return;
    if (w.own)
        rb_hist_bump_own(&w.s->ctr[k], n);
    else
        atomic_fetch_add_explicit(&w.s->ctr[k], n, memory_order_relaxed);
}

static inline int rb_obs_on(rb_obs *o)
{
    return !atomic_load_explicit(&o->off, memory_order_relaxed);
}
/* The start of a timed operation: its clock, or 0 when recording is off. */
static inline uint64_t rb_obs_t0(rb_obs *o)
{
    return rb_obs_on(o) ? rb_hist_now_ns() : 0;
}
/* The end of one begun at t0 (nothing when t0 is 0), with its own recorder (rare operations). */
static inline void rb_obs_done(rb_obs *o, int id, uint64_t t0)
{
    if (!t0)
        return;
    uint64_t d = rb_hist_now_ns() - t0;
    rb_obs_w w = rb_obs_take(o);
    rb_obs_w_add(w, id, d);
    rb_obs_give(w);
}
/* Bytes enter flight; the bytes in flight now (the INFLIGHT_BYTES sample the caller records
 * when it records its call). Raises the peak. */
static inline uint64_t rb_obs_fly(rb_obs *o, uint64_t bytes)
{
    uint64_t now = atomic_fetch_add_explicit(&o->inflight_bytes, bytes, memory_order_relaxed) + bytes;
    uint64_t cur = atomic_load_explicit(&o->peak_inflight_bytes, memory_order_relaxed);
    while (cur < now && !atomic_compare_exchange_weak_explicit(&o->peak_inflight_bytes, &cur, now, memory_order_relaxed,
                                                               memory_order_relaxed))
        ;
    return now;
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

/* The sum over the shards of histogram id / of counter k of o. */
void rb_obs_read_hist(rb_obs *o, int id, rb_hist_snap *out);
uint64_t rb_obs_read_count(rb_obs *o, int k);

/* What recording costs one load call of keys keys (clock reads, bytes in flight, an outcome per
 * key, counters, and on io_uring (uring set) one batch's stamps): ns per call over iters calls
 * on a scratch rb_obs. 0, -ENOMEM, or -EIO if a sample went missing. */
int rb_hist_recording_cost(unsigned iters, unsigned keys, int uring, uint64_t *ns_per_call);

#endif /* RB_HIST_H */
