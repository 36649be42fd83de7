/*
 * rb_core_keys.c - the index operations on keys that do no device I/O: lookups (exists,
 * metadata, offsets), pins (a locked key's refcount), deletes and a snapshot of the keys.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <string.h>

static uint32_t find_locked(rb_core *c, const char *k, size_t l)
{
    return rb_idx_find(&c->index, k, l, rb_idx_hash(k, l));
}

static void lock_ent_locked(rb_core *c, rb_ent *e)
{
    if (e->refcnt++ == 0)
        c->locked_keys++;
}

/*
 * Batched lookups and deletes hash every key before taking the mutex (no shared state
 * involved), so the lock is held only for the index work itself. Without memory for the
 * hashes they hash inline.
 */
#define HASH_STACK 256

static uint32_t *batch_hashes(const char *const *keys, const size_t *lens, size_t n, uint32_t *stack)
{
    uint32_t *h = n <= HASH_STACK ? stack : malloc(n * sizeof(uint32_t));
    if (h)
        for (size_t i = 0; i < n; i++)
            h[i] = rb_idx_hash(keys[i], lens[i]);
    return h;
}

void rb_core_exists_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int lock, uint8_t *results)
{
    uint32_t stack[HASH_STACK];
    uint32_t *hs = batch_hashes(keys, lens, n, stack);
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        uint32_t h = hs ? hs[i] : rb_idx_hash(keys[i], lens[i]);
        uint32_t p = rb_idx_find(&c->index, keys[i], lens[i], h);
        results[i] = p != UINT32_MAX;
        if (lock && results[i])
            lock_ent_locked(c, &c->index.ents[p]);
    }
    pthread_mutex_unlock(&c->mu);
    if (hs != stack)
        free(hs);
}

int rb_core_exists_inflight(rb_core *c, const char *key, size_t len)
{
    pthread_mutex_lock(&c->mu);
    int r = rb_idx_find(&c->inflight, key, len, rb_idx_hash(key, len)) != UINT32_MAX;
    pthread_mutex_unlock(&c->mu);
    return r;
}

static void fill_meta_locked(rb_core *c, const rb_ent *e, rb_meta_out *o)
{
    const rb_class *k = c->cls[e->cls];
    o->found = 1;
    o->offset = rb_slot_offset(c, e->slot);
    o->size = e->size;
    o->dtype = k->dtype;
    o->fmt = k->fmt;
    o->ndim = k->ndim;
    o->dims = k->dims;
    o->npos = rb_ent_npos(e);
    o->pos = NULL;
    if (o->npos > 0) {
        o->pos = malloc((size_t)o->npos * sizeof(int64_t));
        if (o->pos)
            memcpy(o->pos, rb_ent_pos(e), (size_t)o->npos * sizeof(int64_t));
        else
            o->npos = -1;
    }
}

void rb_core_get_metadata_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n, rb_meta_out *out)
{
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        uint32_t p = find_locked(c, keys[i], lens[i]);
        if (p != UINT32_MAX)
            fill_meta_locked(c, &c->index.ents[p], &out[i]);
    }
    pthread_mutex_unlock(&c->mu);
}

size_t rb_core_get_metadata_prefix(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int lock,
                                   const uint8_t *skip, rb_meta_out *out)
{
    size_t i;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        uint32_t p = find_locked(c, keys[i], lens[i]);
        if (p == UINT32_MAX)
            break;
        fill_meta_locked(c, &c->index.ents[p], &out[i]);
        if (lock && !(skip && skip[i]))
            lock_ent_locked(c, &c->index.ents[p]);
    }
    pthread_mutex_unlock(&c->mu);
    return i;
}

void rb_core_unlock_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n)
{
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        uint32_t p = find_locked(c, keys[i], lens[i]);
        if (p == UINT32_MAX)
            continue;
        rb_ent *e = &c->index.ents[p];
        if (e->refcnt > 0 && --e->refcnt == 0)
            c->locked_keys--;
    }
    pthread_mutex_unlock(&c->mu);
}

uint64_t rb_core_delete_locked(rb_core *c, const char *const *keys, const size_t *lens, const uint32_t *hs, size_t n,
                               int force, uint8_t *results)
{
    uint64_t deleted = 0;
    c->ml.lane_want = 1; /* the FREE records of these drops may go to the deletes' lane */
    for (size_t i = 0; i < n; i++) {
        uint32_t h = hs ? hs[i] : rb_idx_hash(keys[i], lens[i]);
        uint32_t tslot;
        uint32_t p = rb_idx_find_slot(&c->index, keys[i], lens[i], h, &tslot);
        if (p != UINT32_MAX && c->index.ents[p].refcnt > 0 && !force) {
            results[i] = 0;
            continue;
        }
        int was = 0;
        if (p != UINT32_MAX) {
            rb_core_drop_accounting_locked(c, p);
            rb_idx_remove_slot(&c->index, tslot);
            c->dirty_total++;
            deleted++;
            was = 1;
        }
        uint32_t q = c->inflight.n_live ? rb_idx_find(&c->inflight, keys[i], lens[i], h) : UINT32_MAX;
        if (q != UINT32_MAX) {
            c->inflight.ents[q].flags |= RB_ENT_CANCELED;
            was = 1;
        }
        results[i] = (uint8_t)was;
    }
    c->ml.lane_want = 0;
    rb_idx_maybe_compact(&c->index);
    return deleted;
}

void rb_core_delete_after(rb_core *c, int kick, uint64_t deleted, uint64_t t0)
{
    if (kick)
        rb_core_ml_kick(c, RB_KICK_FREES);
    /* Format v1 makes a slot no container lists reusable at its delete: deallocated now. */
    if (rb_core_dealloc_pending(c))
        (void)rb_core_dealloc_run(c);
    uint64_t d = t0 ? rb_hist_now_ns() - t0 : 0;
    rb_obs_w w = rb_obs_take(&c->obs);
    rb_obs_w_count(w, RB_OBS_DELETED, deleted);
    if (t0)
        rb_obs_w_add(w, RB_H_DELETE, d);
    rb_obs_give(w);
}

void rb_core_delete_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int force, uint8_t *results)
{
    uint64_t t0 = rb_obs_t0(&c->obs);
    uint32_t stack[HASH_STACK];
    uint32_t *hs = batch_hashes(keys, lens, n, stack);
    pthread_mutex_lock(&c->mu);
    uint64_t deleted = rb_core_delete_locked(c, keys, lens, hs, n, force, results);
    int kick = c->ml.on && c->ml.n_held > 0;
    pthread_mutex_unlock(&c->mu);
    if (hs != stack)
        free(hs);
    rb_core_delete_after(c, kick, deleted, t0);
}

int64_t rb_core_entry_offset(rb_core *c, const char *key, size_t len)
{
    pthread_mutex_lock(&c->mu);
    uint32_t p = find_locked(c, key, len);
    int64_t r = p == UINT32_MAX ? -1 : (int64_t)rb_slot_offset(c, c->index.ents[p].slot);
    pthread_mutex_unlock(&c->mu);
    return r;
}

uint32_t rb_core_lock_refcount(rb_core *c, const char *key, size_t len)
{
    pthread_mutex_lock(&c->mu);
    uint32_t p = find_locked(c, key, len);
    uint32_t r = p == UINT32_MAX ? 0 : c->index.ents[p].refcnt;
    pthread_mutex_unlock(&c->mu);
    return r;
}

int64_t rb_core_snapshot_keys(rb_core *c, size_t max, char ***keys_out, size_t **lens_out)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->index.n_live < max ? c->index.n_live : max;
    char **keys = calloc(n ? n : 1, sizeof(char *));
    size_t *lens = calloc(n ? n : 1, sizeof(size_t));
    size_t k = 0;
    if (!keys || !lens)
        goto oom;
    for (uint32_t p = c->index.first_live; p < c->index.n_ents && k < n; p++) {
        const rb_ent *e = &c->index.ents[p];
        if (e->flags & RB_ENT_DEAD) {
            if (k == 0)
                c->index.first_live = p + 1;
            continue;
        }
        keys[k] = rb_core_dupn(rb_ent_key(e), e->key_len);
        if (!keys[k])
            goto oom;
        lens[k++] = e->key_len;
    }
    pthread_mutex_unlock(&c->mu);
    *keys_out = keys;
    *lens_out = lens;
    return (int64_t)k;
oom:
    pthread_mutex_unlock(&c->mu);
    if (keys)
        for (size_t i = 0; i < k; i++)
            free(keys[i]);
    free(keys);
    free(lens);
    return -ENOMEM;
}
