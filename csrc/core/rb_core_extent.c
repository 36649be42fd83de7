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
        if (rb_ext_init(&c->slots, c->ext_per, 0, 0) < 0)
            return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
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
    return 0;
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

static void free_keys(char **keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
}

/* The unlocked keys on extent e's slots into keys / lens / hot (room for per). mu held. */
static int64_t extent_keys_locked(rb_core *c, uint32_t e, char **keys, size_t *lens, uint8_t *hot)
{
    const rb_extents *x = &c->slots.ext;
    size_t k = 0;
    for (uint32_t i = 0; i < x->per; i++) {
        uint32_t p = key_on_slot_locked(c, x->first + e * x->per + i);
        if (p == UINT32_MAX || c->index.ents[p].refcnt > 0)
            continue;
        const rb_ent *ent = &c->index.ents[p];
        keys[k] = rb_core_dupn(rb_ent_key(ent), ent->key_len);
        if (!keys[k]) {
            free_keys(keys, k);
            return -ENOMEM;
        }
        hot[k] = x->hot[x->first + e * x->per + i];
        lens[k++] = ent->key_len;
    }
    return (int64_t)k;
}

int64_t rb_core_extent_victim(rb_core *c, char ***keys_out, size_t **lens_out, uint8_t **hot_out, uint32_t *ext)
{
    *ext = UINT32_MAX;
    *keys_out = NULL;
    *lens_out = NULL;
    *hot_out = NULL;
    if (!c->slots.ext.per)
        return -EINVAL;
    char **keys = calloc(c->slots.ext.per, sizeof(char *));
    size_t *lens = calloc(c->slots.ext.per, sizeof(size_t));
    uint8_t *hot = calloc(c->slots.ext.per, 1);
    if (!keys || !lens || !hot) {
        free(keys);
        free(lens);
        free(hot);
        return -ENOMEM;
    }
    pthread_mutex_lock(&c->mu);
    if (!c->slots.ext.rev_ok || c->slots.ext.rev_epoch != c->index.epoch)
        rev_rebuild_locked(c);
    uint32_t e = rb_ext_victim(&c->slots);
    int64_t n = e == UINT32_MAX ? 0 : extent_keys_locked(c, e, keys, lens, hot);
    pthread_mutex_unlock(&c->mu);
    if (n < 0) {
        free(lens);
        free(hot);
        return n; /* keys freed with the ones copied */
    }
    *ext = e;
    *keys_out = keys;
    *lens_out = lens;
    *hot_out = hot;
    return n;
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
}
