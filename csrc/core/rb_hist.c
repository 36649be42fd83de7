/*
 * rb_hist.c - the names of the core's histograms and miss reasons (rb_hist.h).
 */
#include "rb_hist.h"

#include <errno.h>
#include <stdlib.h>

const char *const rb_hist_names[RB_H_COUNT] = {
#define RB_HIST_NAME(id, name) name,
    RB_HIST_IDS(RB_HIST_NAME)
#undef RB_HIST_NAME
};

const char *const rb_miss_names[RB_MISS_COUNT] = {
#define RB_MISS_NAME(id, name) name,
    RB_MISS_IDS(RB_MISS_NAME)
#undef RB_MISS_NAME
};

_Thread_local unsigned rb_obs_hint;
static _Atomic unsigned next_hint;

/* This thread's shard: the threads take shards 1..RB_OBS_SHARDS-1 in turn. */
unsigned rb_obs_hint_new(void)
{
    rb_obs_hint = 1u + atomic_fetch_add_explicit(&next_hint, 1, memory_order_relaxed) % (RB_OBS_SHARDS - 1u);
    return rb_obs_hint;
}

void rb_obs_read_hist(rb_obs *o, int id, rb_hist_snap *out)
{
    rb_hist_read(&o->sh[0].h[id], out);
    for (unsigned k = 1; k < RB_OBS_SHARDS; k++) {
        rb_hist_snap s;
        rb_hist_read(&o->sh[k].h[id], &s);
        out->count += s.count;
        out->sum += s.sum;
        for (unsigned i = 0; i < RB_HIST_N; i++)
            out->b[i] += s.b[i];
    }
}

uint64_t rb_obs_read_count(rb_obs *o, int k)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < RB_OBS_SHARDS; i++)
        n += atomic_load_explicit(&o->sh[i].ctr[k], memory_order_relaxed);
    return n;
}

/* The recording one load call of keys keys does, on a scratch rb_obs (the cost measure of the
 * harness's histcost part), as rb_core_load_many and its io_uring batch (uring) do it: the
 * call's clock reads and bytes in flight, the batch's queue-wait and device stamps, one outcome
 * per key, and the call's histograms and counters under one recorder. */
static void record_one_load(rb_obs *o, unsigned keys, int uring, const uint8_t *outcome)
{
    uint64_t t0 = rb_obs_t0(o);
    uint64_t fly = rb_obs_fly(o, (uint64_t)keys << 16);
    if (uring) {
        uint64_t given = rb_obs_t0(o), kern = rb_hist_now_ns(), end = rb_hist_now_ns();
        rb_obs_w w = rb_obs_take(o);
        rb_obs_w_add(w, RB_H_QUEUE_WAIT, kern - given);
        rb_obs_w_add(w, RB_H_DEVICE, end - kern);
        rb_obs_give(w);
    }
    uint64_t miss[RB_MISS_COUNT] = {0}, hits = 0, served = 0;
    for (unsigned i = 0; i < keys; i++) {
        if (outcome[i] == 0) {
            hits++;
            served += 1u << 16;
        } else {
            miss[outcome[i] % RB_MISS_COUNT]++;
        }
    }
    rb_obs_land(o, (uint64_t)keys << 16);
    uint64_t d = t0 ? rb_hist_now_ns() - t0 : 0;
    rb_obs_w w = rb_obs_take(o);
    if (t0) {
        rb_obs_w_add(w, RB_H_LOAD, d);
        rb_obs_w_add(w, RB_H_INFLIGHT_BYTES, fly);
        rb_obs_w_add(w, RB_H_LOAD_BYTES, served);
    }
    for (int k = 0; k < RB_MISS_COUNT; k++)
        rb_obs_w_count(w, k, miss[k]);
    rb_obs_w_count(w, RB_OBS_HITS, hits);
    rb_obs_give(w);
}

int rb_hist_recording_cost(unsigned iters, unsigned keys, int uring, uint64_t *ns_per_call)
{
    rb_obs *o = calloc(1, sizeof(*o));
    uint8_t *outcome = calloc(keys ? keys : 1, 1);
    if (!o || !outcome) {
        free(o);
        free(outcome);
        return -ENOMEM;
    }
    uint64_t t = rb_hist_now_ns();
    for (unsigned i = 0; i < iters; i++)
        record_one_load(o, keys, uring, outcome);
    t = rb_hist_now_ns() - t;
    *ns_per_call = iters ? t / iters : 0;
    rb_hist_snap s;
    rb_obs_read_hist(o, RB_H_LOAD, &s);
    int ok = s.count == iters && rb_obs_read_count(o, RB_OBS_HITS) == (uint64_t)iters * keys;
    free(o);
    free(outcome);
    return ok ? 0 : -EIO;
}
