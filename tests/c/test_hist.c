/*
 * test_hist.c - the log-linear histogram of rb_hist.h: every value lands in the bucket whose
 * bounds hold it, bounds rise without gaps, every power of two is a boundary, and recording
 * from several threads at once loses no sample: into one histogram, and into a core's sharded
 * rb_obs by more threads than it has shards (owned shards and the shared shard 0 at once).
 */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_hist.h"

static uint64_t lower(unsigned i)
{
    return i == 0 ? 0 : rb_hist_upper(i - 1);
}

static void check_value(uint64_t v)
{
    unsigned i = rb_hist_index(v);
    assert(i < RB_HIST_N);
    assert(lower(i) <= v);
    assert(v < rb_hist_upper(i) || (i == RB_HIST_N - 1 && rb_hist_upper(i) == UINT64_MAX));
}

static rb_hist shared;

static void *writer(void *arg)
{
    uint64_t base = (uint64_t)(uintptr_t)arg;
    for (uint64_t k = 0; k < 100000; k++)
        rb_hist_add(&shared, base + k);
    return NULL;
}

static rb_obs *obs;
#define OBS_THREADS 12 /* more than RB_OBS_SHARDS - 1: hints repeat, so owners and shard 0 mix */
#define OBS_CALLS 50000

static void *obs_writer(void *arg)
{
    uint64_t base = (uint64_t)(uintptr_t)arg;
    for (uint64_t k = 0; k < OBS_CALLS; k++) {
        rb_obs_w w = rb_obs_take(obs);
        rb_obs_w_add(w, RB_H_LOAD, base + k);
        rb_obs_w_add(w, RB_H_LOAD_BYTES, 1u << 16);
        rb_obs_w_count(w, RB_OBS_HITS, 2);
        rb_obs_w_count(w, RB_MISS_EVICTED, 1);
        rb_obs_give(w);
    }
    return NULL;
}

/* Every sample recorded through rb_obs_take by OBS_THREADS threads is in the shards' sums. */
static void check_obs_shards(void)
{
    obs = calloc(1, sizeof(*obs));
    assert(obs);
    pthread_t t[OBS_THREADS];
    for (uintptr_t k = 0; k < OBS_THREADS; k++)
        assert(pthread_create(&t[k], NULL, obs_writer, (void *)(k * 1000)) == 0);
    for (int k = 0; k < OBS_THREADS; k++)
        pthread_join(t[k], NULL);
    rb_hist_snap s;
    rb_obs_read_hist(obs, RB_H_LOAD, &s);
    uint64_t n = 0, want_sum = 0;
    for (unsigned i = 0; i < RB_HIST_N; i++)
        n += s.b[i];
    for (uint64_t k = 0; k < OBS_THREADS; k++)
        want_sum += OBS_CALLS * (k * 1000) + (uint64_t)OBS_CALLS * (OBS_CALLS - 1) / 2;
    assert(n == OBS_THREADS * OBS_CALLS && s.count == n && s.sum == want_sum);
    rb_obs_read_hist(obs, RB_H_LOAD_BYTES, &s);
    assert(s.count == OBS_THREADS * OBS_CALLS && s.sum == (uint64_t)OBS_THREADS * OBS_CALLS << 16);
    assert(rb_obs_read_count(obs, RB_OBS_HITS) == 2ull * OBS_THREADS * OBS_CALLS);
    assert(rb_obs_read_count(obs, RB_MISS_EVICTED) == (uint64_t)OBS_THREADS * OBS_CALLS);
    for (unsigned k = 1; k < RB_OBS_SHARDS; k++)
        assert(atomic_load(&obs->sh[k].busy) == 0); /* every shard given back */
    free(obs);
}

int main(void)
{
    for (unsigned i = 1; i < RB_HIST_N; i++)
        assert(rb_hist_upper(i) > rb_hist_upper(i - 1)); /* no gaps: bucket i starts where i-1 ends */
    for (unsigned k = 2; k < 64; k++) {                  /* powers of two open a bucket */
        uint64_t p = 1ull << k;
        assert(lower(rb_hist_index(p)) == p);
        check_value(p - 1);
        check_value(p);
        check_value(p + 1);
    }
    for (uint64_t v = 0; v < 100000; v++)
        check_value(v);
    check_value(UINT64_MAX);
    assert(rb_hist_index(UINT64_MAX) == RB_HIST_N - 1);
    for (unsigned i = 8; i < RB_HIST_N - 1; i++) /* log-linear: at most a quarter of its lower edge wide */
        assert(rb_hist_upper(i) - lower(i) <= lower(i) / 4);

    pthread_t t[4];
    for (uintptr_t k = 0; k < 4; k++)
        assert(pthread_create(&t[k], NULL, writer, (void *)(k * 1000)) == 0);
    for (int k = 0; k < 4; k++)
        pthread_join(t[k], NULL);
    rb_hist_snap s;
    rb_hist_read(&shared, &s);
    uint64_t n = 0, want_sum = 0;
    for (unsigned i = 0; i < RB_HIST_N; i++)
        n += s.b[i];
    for (uint64_t k = 0; k < 4; k++)
        want_sum += 100000 * (k * 1000) + 100000ull * 99999 / 2;
    assert(n == 400000 && s.count == 400000 && s.sum == want_sum);
    check_obs_shards();
    printf("test_hist: ok\n");
    return 0;
}
