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

/* The recording one load call of keys keys does on an io_uring core, on a scratch rb_obs (the
 * cost measure of the harness's histcost part): the call's clock reads, bytes in flight, one
 * outcome per key, the counters, and one batch's queue-wait and device stamps. */
static void record_one_load(rb_obs *o, unsigned keys, uint8_t *outcome)
{
    uint64_t t0 = rb_obs_t0(o);
    rb_obs_fly(o, (uint64_t)keys << 16);
    uint64_t given = rb_obs_t0(o), kern = rb_hist_now_ns();
    uint64_t miss[RB_MISS_COUNT] = {0}, hits = 0, served = 0;
    for (unsigned i = 0; i < keys; i++) {
        if (outcome[i] == 0) {
            hits++;
            served += 1u << 16;
        } else {
            miss[outcome[i] % RB_MISS_COUNT]++;
        }
    }
    uint64_t end = rb_hist_now_ns();
    rb_obs_add(o, RB_H_QUEUE_WAIT, kern - given);
    rb_obs_add(o, RB_H_DEVICE, end - kern);
    for (int k = 0; k < RB_MISS_COUNT; k++)
        rb_obs_count(&o->miss[k], miss[k]);
    rb_obs_count(&o->hits, hits);
    rb_obs_add(o, RB_H_LOAD_BYTES, served);
    rb_obs_land(o, (uint64_t)keys << 16);
    rb_obs_done(o, RB_H_LOAD, t0);
}

int rb_hist_recording_cost(unsigned iters, unsigned keys, uint64_t *ns_per_call)
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
        record_one_load(o, keys, outcome);
    t = rb_hist_now_ns() - t;
    *ns_per_call = iters ? t / iters : 0;
    int ok = atomic_load(&o->h[RB_H_LOAD].count) == iters && atomic_load(&o->hits) == (uint64_t)iters * keys;
    free(o);
    free(outcome);
    return ok ? 0 : -EIO;
}
