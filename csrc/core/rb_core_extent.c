/*
 * rb_core_extent.c - the core's side of extents (extent_bytes, rb_slots.h): their geometry at
 * open, the victim extent's keys for eviction, their counters.
 *
 * With extent_bytes a multiple of slot_bytes, extents are an allocator choice, not a layout:
 * the metadata of either format records slot numbers as before, so a device written with
 * extents opens without them and the other way round. Otherwise (the log format only) the
 * layout is strided (rb_slot_offset), recorded in the superblock, and a device opens only
 * with the extent_bytes it was written with. Their deallocation is rb_core_dealloc.c's, a whole extent at a time.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int rb_core_extent_init(rb_core *c, rb_err *err)
{
    uint64_t eb = c->cfg.extent_bytes, sb = c->cfg.slot_bytes;
    if (eb == 0)
        return 0;
    if (c->ext_stride) { /* strided (rb_slot_offset): slot 0 starts extent 0 */
        uint32_t cnt[RB_SIZE_CLASSES_MAX];
        for (uint32_t k = 0; k < c->n_sc; k++)
            cnt[k] = (uint32_t)(eb / c->sc_bytes[k]);
        cnt[c->n_sc - 1] = c->ext_per;
        if (rb_ext_init_classes(&c->slots, c->ext_per, 0, 0, c->n_sc, cnt) < 0)
            return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
        c->slots.ext.by_use = c->cfg.extent_victim_order == RB_VICTIM_USE;
        return 0;
    }
    /* Extent 0 starts on the first extent_bytes boundary of the device at or past the data
     * area's start (or as close past it as whole slots allow, when data_base is not a multiple
     * of slot_bytes' alignment to it): the slots before are never handed out. */
    uint64_t gap = (eb - c->data_base % eb) % eb;
    uint64_t first = (gap + sb - 1) / sb;
    uint64_t per = eb / sb;
    if (first >= c->max_slots || (c->max_slots - first) / per == 0)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "extent_bytes=%llu leaves no whole extent in the data area (%u slots of %llu bytes from "
                          "offset %llu)",
                          (unsigned long long)eb, c->max_slots, (unsigned long long)sb,
                          (unsigned long long)c->data_base);
    int rc = rb_ext_init(&c->slots, (uint32_t)per, (uint32_t)first, 0);
    if (rc < 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    c->slots.ext.by_use = c->cfg.extent_victim_order == RB_VICTIM_USE;
    return 0;
}

void rb_core_sc_recover_locked(rb_core *c, uint32_t *slot_pos, uint32_t cap)
{
    rb_slots *sl = &c->slots;
    const uint64_t sb = c->cfg.slot_bytes, hb = c->cfg.header_bytes, ba = c->cfg.block_align;
    for (uint32_t p = 0; p < c->index.n_ents; p++) {
        const rb_ent *e = &c->index.ents[p];
        if (e->flags & RB_ENT_DEAD)
            continue;
        uint32_t k = e->slot / c->ext_per, i = e->slot % c->ext_per;
        uint32_t want = rb_sc_of(e->size, sb, hb, ba, c->n_sc);
        if (sl->ext.cls[k] == RB_EXT_NOCLS)
            rb_ext_set_class(sl, k, want); /* its first entry names it */
        if (sl->ext.cls[k] == want && i < sl->ext.cnt[want])
            continue;
        /* damage: a size another class's, or a slot past the class's count: never read there */
        if (e->flags & RB_ENT_UNVERIFIED)
            c->n_unverified--;
        if (e->slot < cap)
            slot_pos[e->slot] = 0; /* released with the unlisted slots */
        rb_idx_remove_at(&c->index, p);
        c->sc_dropped++;
        c->recovery_dropped++;
    }
}

/* The slot -> index position map, from the index (after a compaction or a new state). mu held. */
static void rev_rebuild_locked(rb_core *c)
{
    rb_extents *x = &c->slots.ext;
    for (uint32_t p = 0; p < c->index.n_ents; p++) {
        const rb_ent *e = &c->index.ents[p];
        if (!(e->flags & RB_ENT_DEAD) && e->slot < c->slots.cap)
            x->rev[e->slot] = p;
    }
    x->rev_epoch = c->index.epoch;
    x->rev_ok = 1;
}

/* The index position of the key on slot, or UINT32_MAX (free, being written or freed). */
static uint32_t key_on_slot_locked(const rb_core *c, uint32_t slot)
{
    uint32_t p = c->slots.ext.rev[slot];
    if (c->slots.is_free[slot] || p >= c->index.n_ents)
        return UINT32_MAX;
    const rb_ent *e = &c->index.ents[p];
    return !(e->flags & RB_ENT_DEAD) && e->slot == slot ? p : UINT32_MAX;
}

/* The n key strings copied into keys (the array stays its caller's). */
static void free_key_strs(char **keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
}

/* The unlocked keys on extent e's slots into keys / lens / hot (room for per): how many, or
 * -ENOMEM with the ones copied freed (the arrays stay the caller's). mu held. */
static int64_t extent_keys_locked(rb_core *c, uint32_t e, char **keys, size_t *lens, uint8_t *hot)
{
    const rb_extents *x = &c->slots.ext;
    size_t k = 0;
    for (uint32_t i = 0, n = rb_ext_cap(x, e); i < n; i++) {
        uint32_t p = key_on_slot_locked(c, x->first + e * x->per + i);
        if (p == UINT32_MAX || c->index.ents[p].refcnt > 0)
            continue;
        const rb_ent *ent = &c->index.ents[p];
        keys[k] = rb_core_dupn(rb_ent_key(ent), ent->key_len);
        if (!keys[k]) {
            free_key_strs(keys, k);
            return -ENOMEM;
        }
        hot[k] = x->hot[x->first + e * x->per + i];
        lens[k++] = ent->key_len;
    }
    return (int64_t)k;
}

/* The want first candidates in (tick, extent) order (tick: the last fill, or with
 * extent_victim_order use the last use; the first is the one rb_ext_victim takes) into out, in
 * that order: how many (fewer when there are fewer). One pass over the extents, each candidate
 * placed among the want kept so far: O(extents x want) at worst, O(extents) in practice. */
static uint32_t ext_oldest(const rb_extents *x, uint32_t want, uint32_t *out)
{
    uint32_t k = 0;
    for (uint32_t e = 0; e < x->n && want; e++) {
        if (!rb_ext_candidate(x, e))
            continue;
        if (k == want && x->tick[e] >= x->tick[out[k - 1]])
            continue; /* no older than the youngest kept (ties: the lower extent first) */
        uint32_t i = k < want ? k++ : k - 1;
        for (; i > 0 && x->tick[out[i - 1]] > x->tick[e]; i--)
            out[i] = out[i - 1];
        out[i] = e;
    }
    return k;
}

/* The extent a mode names, under mu: 0 victim (the oldest, taken), 2 take (extent which, when
 * a candidate: rb_ext_take). */
static uint32_t ext_choose_locked(rb_core *c, int mode, uint32_t which)
{
    if (mode == 0)
        return rb_ext_victim(&c->slots);
    return rb_ext_take(&c->slots, which);
}

/* The three arrays a look at extents fills (room keys each), zeroed, into *keys / *lens / *hot
 * (all NULL first): 0, or -ENOMEM with none kept. */
static int key_arrays(size_t room, char ***keys, size_t **lens, uint8_t **hot)
{
    *keys = calloc(room, sizeof(char *));
    *lens = calloc(room, sizeof(size_t));
    *hot = calloc(room, 1);
    if (*keys && *lens && *hot)
        return 0;
    free(*keys);
    free(*lens);
    free(*hot);
    *keys = NULL;
    *lens = NULL;
    *hot = NULL;
    return -ENOMEM;
}

/* The slot-to-key map the extents' key lists read, rebuilt if the index changed since. mu held. */
static void rev_fresh_locked(rb_core *c)
{
    if (!c->slots.ext.rev_ok || c->slots.ext.rev_epoch != c->index.epoch)
        rev_rebuild_locked(c);
}

static int64_t extent_look(rb_core *c, int mode, uint32_t which, char ***keys_out, size_t **lens_out, uint8_t **hot_out,
                           uint32_t *ext)
{
    *ext = UINT32_MAX;
    *keys_out = NULL;
    *lens_out = NULL;
    *hot_out = NULL;
    if (!c->slots.ext.per)
        return -EINVAL;
    char **keys;
    size_t *lens;
    uint8_t *hot;
    if (key_arrays(c->slots.ext.per, &keys, &lens, &hot) < 0)
        return -ENOMEM;
    pthread_mutex_lock(&c->mu);
    rev_fresh_locked(c);
    uint32_t e = ext_choose_locked(c, mode, which);
    int64_t n = e == UINT32_MAX ? 0 : extent_keys_locked(c, e, keys, lens, hot);
    pthread_mutex_unlock(&c->mu);
    if (n < 0) {
        free(keys); /* the ones copied were freed */
        free(lens);
        free(hot);
        return n;
    }
    *ext = e;
    *keys_out = keys;
    *lens_out = lens;
    *hot_out = hot;
    return n;
}

int64_t rb_core_extent_victim(rb_core *c, char ***keys_out, size_t **lens_out, uint8_t **hot_out, uint32_t *ext)
{
    return extent_look(c, 0, 0, keys_out, lens_out, hot_out, ext);
}

/* The keys of the extents out names (n of them) into keys / lens / hot (room for n x per),
 * their counts into counts: the number of keys, or -ENOMEM (the keys copied freed, the arrays
 * the caller's). mu held. */
static int64_t extents_keys_locked(rb_core *c, const uint32_t *out, uint32_t n, uint32_t *counts, char **keys,
                                   size_t *lens, uint8_t *hot)
{
    int64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        int64_t got = extent_keys_locked(c, out[i], keys + total, lens + total, hot + total);
        if (got < 0) {
            free_key_strs(keys, (size_t)total); /* the extents before; this one's were freed */
            return got;
        }
        counts[i] = (uint32_t)got;
        total += got;
    }
    return total;
}

int64_t rb_core_extent_peek(rb_core *c, uint32_t want, uint32_t *exts, uint32_t *counts, char ***keys_out,
                            size_t **lens_out, uint8_t **hot_out)
{
    *keys_out = NULL;
    *lens_out = NULL;
    *hot_out = NULL;
    if (!c->slots.ext.per)
        return -EINVAL;
    if (want == 0)
        return 0;
    char **keys;
    size_t *lens;
    uint8_t *hot;
    if (key_arrays((size_t)want * c->slots.ext.per, &keys, &lens, &hot) < 0)
        return -ENOMEM;
    pthread_mutex_lock(&c->mu);
    rev_fresh_locked(c);
    uint32_t n = ext_oldest(&c->slots.ext, want, exts);
    int64_t rc = extents_keys_locked(c, exts, n, counts, keys, lens, hot);
    pthread_mutex_unlock(&c->mu);
    if (rc < 0) {
        free(keys); /* the ones copied were freed */
        free(lens);
        free(hot);
        return rc;
    }
    *keys_out = keys;
    *lens_out = lens;
    *hot_out = hot;
    return n;
}

int64_t rb_core_extent_take(rb_core *c, uint32_t e, char ***keys_out, size_t **lens_out, uint8_t **hot_out,
                            uint32_t *ext)
{
    return extent_look(c, 2, e, keys_out, lens_out, hot_out, ext);
}

void rb_core_extent_status_locked(const rb_core *c, rb_core_status *st)
{
    const rb_extents *x = &c->slots.ext;
    st->extent_slots = x->per;
    st->extent_base = c->ext_base;
    st->extent_stride = c->ext_stride;
    st->extent_tail_bytes = c->ext_stride ? c->ext_stride - (uint64_t)c->ext_per * c->cfg.slot_bytes : 0;
    st->extents_total = x->n;
    st->extents_clean = x->n_clean;
    st->extents_open = x->n_open;
    st->extents_pending = x->n_pending;
    st->extents_opened = x->opened;
    st->extent_fallbacks = x->fallbacks;
    st->extents_evicted = x->evicted;
    st->extent_deallocs = x->deallocated;
    st->extent_dealloc_skipped = x->dealloc_skipped;
    st->extent_bytes = c->cfg.extent_bytes;
    st->extent_reclaim_unit = c->ext_ru;
    st->extent_source = c->ext_source ? c->ext_source : "setting";
    st->size_classes = c->n_sc;
    st->size_class_dropped = c->sc_dropped;
    for (uint32_t k = 0; k < c->n_sc && c->n_sc > 1; k++) {
        st->class_extents[k] = x->cls_extents[k];
        st->class_slot_bytes[k] = c->sc_bytes[k];
    }
    if (c->n_sc > 1) /* the bytes past the smallest class's slots */
        st->extent_tail_bytes = c->ext_stride - (uint64_t)c->ext_per * c->sc_bytes[c->n_sc - 1];
}

/* ---- the evictor's pass in one call (rb_core_extent_evict) ------------------------------ */

void rb_keys_free(rb_keys *k)
{
    free_key_strs(k->keys, k->n);
    free(k->keys);
    free(k->lens);
    memset(k, 0, sizeof(*k));
}

/* Room in l for more keys past its n: 0 or -ENOMEM (l unchanged but for a larger array). */
static int keys_reserve(rb_keys *l, size_t more)
{
    if (l->cap - l->n >= more)
        return 0;
    size_t cap = l->cap ? 2 * l->cap : 64;
    if (cap < l->n + more)
        cap = l->n + more;
    char **k = realloc(l->keys, cap * sizeof(char *));
    if (!k)
        return -ENOMEM;
    l->keys = k;
    size_t *n = realloc(l->lens, cap * sizeof(size_t));
    if (!n)
        return -ENOMEM;
    l->lens = n;
    l->cap = cap;
    return 0;
}

/* key (len bytes, malloc'd) onto the end of l, which takes it; keys_reserve made the room. */
static void keys_add(rb_keys *l, char *key, size_t len)
{
    l->keys[l->n] = key;
    l->lens[l->n++] = len;
}

/* One victim's work areas: its keys as extent_keys_locked copies them, the ones to delete
 * and the delete's results (room for per keys each). */
typedef struct {
    char **keys;
    size_t *lens;
    uint8_t *hot;
    const char **del;
    size_t *del_lens;
    uint8_t *kept, *res;
} evict_bufs;

static void bufs_free(evict_bufs *b)
{
    free(b->keys);
    free(b->lens);
    free(b->hot);
    free(b->del);
    free(b->del_lens);
    free(b->kept);
    free(b->res);
}

static int bufs_alloc(evict_bufs *b, size_t per)
{
    memset(b, 0, sizeof(*b));
    if (key_arrays(per, &b->keys, &b->lens, &b->hot) < 0)
        return -ENOMEM;
    b->del = malloc(per * sizeof(char *));
    b->del_lens = malloc(per * sizeof(size_t));
    b->kept = malloc(per);
    b->res = malloc(per);
    if (b->del && b->del_lens && b->kept && b->res)
        return 0;
    bufs_free(b);
    return -ENOMEM;
}

/* Which of n keys are kept (b->kept[i]): with keep_hot the hot ones first in slot order, at
 * most half of n (each eviction frees at least half of what it looked at; reinsert_choice in
 * lmcache_rawblock/extent_evict.py is the same rule); the others go into b->del. Returns how
 * many are to be deleted. */
static size_t choose_kept(evict_bufs *b, size_t n, int keep_hot)
{
    size_t room = keep_hot ? n / 2 : 0, nd = 0;
    for (size_t i = 0; i < n; i++) {
        b->kept[i] = b->hot[i] && room > 0;
        if (b->kept[i]) {
            room--;
            continue;
        }
        b->del[nd] = b->keys[i];
        b->del_lens[nd++] = b->lens[i];
    }
    return nd;
}

/* The victim's n keys handed over: the kept ones to out->hot, the deleted ones to out->gone
 * with RB_EVICT_KEYS (evict_one made room for them); the rest freed. */
static void hand_keys(evict_bufs *b, size_t n, int flags, rb_evict_pass *out)
{
    for (size_t i = 0, d = 0; i < n; i++) {
        int deleted = !b->kept[i] && b->res[d++];
        rb_keys *to = b->kept[i] ? &out->hot : deleted && (flags & RB_EVICT_KEYS) ? &out->gone : NULL;
        if (to)
            keys_add(to, b->keys[i], b->lens[i]);
        else
            free(b->keys[i]);
    }
}

/* The victim extent's keys deleted but the kept ones: 1 when it took any, 0 when no victim is
 * left (none, or one taken before this call: seen[0..n_seen)), -ENOMEM. */
static int evict_one(rb_core *c, int flags, evict_bufs *b, uint32_t *seen, uint32_t n_seen, rb_evict_pass *out)
{
    /* room for what hand_keys lists, made before the delete: once keys are deleted, each must
     * reach the caller (its owner is told from out->gone) */
    size_t per = c->slots.ext.per;
    if (((flags & RB_EVICT_KEYS) && keys_reserve(&out->gone, per) < 0) ||
        ((flags & RB_EVICT_KEEP_HOT) && keys_reserve(&out->hot, per) < 0))
        return -ENOMEM;
    uint64_t t0 = rb_obs_t0(&c->obs);
    pthread_mutex_lock(&c->mu);
    rev_fresh_locked(c);
    uint32_t e = rb_ext_victim(&c->slots);
    for (uint32_t i = 0; e != UINT32_MAX && i < n_seen; i++)
        if (seen[i] == e)
            e = UINT32_MAX;
    int64_t n = e == UINT32_MAX ? 0 : extent_keys_locked(c, e, b->keys, b->lens, b->hot);
    if (n <= 0) {
        pthread_mutex_unlock(&c->mu);
        return n < 0 ? (int)n : 0;
    }
    seen[n_seen] = e;
    size_t nd = choose_kept(b, (size_t)n, flags & RB_EVICT_KEEP_HOT);
    uint64_t deleted = rb_core_delete_locked(c, b->del, b->del_lens, NULL, nd, 0, b->res);
    int kick = c->ml.on && c->ml.n_held > 0; /* as a delete: its wake-up may write the whole checkpoint too */
    pthread_mutex_unlock(&c->mu);
    rb_core_delete_after(c, kick, deleted, t0);
    out->deleted += deleted;
    size_t hot_before = out->hot.n;
    hand_keys(b, (size_t)n, flags, out);
    int took = deleted > 0 || out->hot.n > hot_before;
    out->extents += (uint32_t)took;
    return took;
}

/* Clean extents (or extents waiting for their deallocation) short of reserve, at least batch
 * when any are; 0 once closed. mu held. */
static uint32_t missing_clean_locked(const rb_core *c, uint32_t reserve, uint32_t batch)
{
    const rb_extents *x = &c->slots.ext;
    uint64_t have = (uint64_t)x->n_clean + x->n_pending;
    if (c->closed || have >= reserve)
        return 0;
    uint32_t missing = (uint32_t)(reserve - have);
    return missing > batch ? missing : batch;
}

/* Up to missing victims (evict_one each, until none is left): 0 or -ENOMEM. */
static int evict_victims(rb_core *c, uint32_t missing, int flags, rb_evict_pass *out)
{
    evict_bufs b;
    uint32_t *seen = malloc(missing * sizeof(uint32_t));
    if (!seen || bufs_alloc(&b, c->slots.ext.per) < 0) {
        free(seen);
        return -ENOMEM;
    }
    int rc = 0;
    for (uint32_t i = 0; i < missing && (rc = evict_one(c, flags, &b, seen, i, out)) > 0; i++)
        ;
    bufs_free(&b);
    free(seen);
    return rc < 0 ? rc : 0;
}

int rb_core_extent_evict(rb_core *c, uint32_t reserve, uint32_t batch, int flags, rb_evict_pass *out, rb_err *err)
{
    memset(out, 0, sizeof(*out));
    out->reclaimed = -1;
    if (!c->slots.ext.per)
        return rb_err_set(err, RB_ERR_RUNTIME, EINVAL, "extent eviction needs extents: extent_bytes is 0 (off)");
    pthread_mutex_lock(&c->mu);
    uint64_t opened = c->slots.ext.opened;
    uint32_t missing = missing_clean_locked(c, reserve, batch);
    pthread_mutex_unlock(&c->mu);
    if (missing && evict_victims(c, missing, flags, out) < 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    int rc = 0;
    if ((flags & RB_EVICT_RECLAIM) && out->hot.n == 0) {
        rc = rb_core_reclaim(c, err);
        out->reclaimed = rc < 0 ? -1 : rc;
    }
    pthread_mutex_lock(&c->mu);
    out->opened = c->slots.ext.opened - opened;
    pthread_mutex_unlock(&c->mu);
    return rc < 0 ? rc : 0;
}
