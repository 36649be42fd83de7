/*
 * rb_core_hold.c - when a freed slot may be used again: the readers' quarantine (a slot a
 * load may still be reading waits for it), the held list (a slot a checkpoint container on
 * the device lists waits for checkpoints that exclude it), the containers' slot references,
 * whether a put needs a checkpoint to get slots, and a record leaving the index.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Release what no reader can hold any more, advancing the generation as far as possible. */
static void quarantine_advance_locked(rb_core *c)
{
    for (;;) {
        unsigned cur = (unsigned)(c->rd_gen & 1), prev = cur ^ 1u;
        if (c->rd_active[prev])
            return; /* readers of the previous generation may hold any slot freed since */
        for (size_t i = 0; i < c->rd_npend[prev]; i++)
            rb_core_release_slot_locked(c, c->rd_pend[prev][i]);
        c->rd_npend[prev] = 0;
        if (c->rd_npend[cur] == 0)
            return;
        /* Age the current generation: new readers start in the next one, and the slots freed
         * so far are released once the current readers are gone. */
        c->rd_gen++;
    }
}

void rb_core_quarantine_slot_locked(rb_core *c, uint32_t slot)
{
    unsigned g = (unsigned)(c->rd_gen & 1);
    if (rb_slot_list_push(&c->rd_pend[g], &c->rd_npend[g], &c->rd_cap[g], slot) < 0)
        return; /* kept out of use (see rb_core_int.h) */
    c->rd_quarantined++;
    /* Start a new generation now if the previous one has no readers left, so readers that
     * begin after this free do not hold the slot back. */
    quarantine_advance_locked(c);
}

uint64_t rb_core_reader_begin_locked(rb_core *c)
{
    c->rd_active[c->rd_gen & 1]++;
    return c->rd_gen;
}

void rb_core_reader_end_locked(rb_core *c, uint64_t gen)
{
    c->rd_active[gen & 1]--;
    quarantine_advance_locked(c);
}

void rb_core_quarantine_reset_locked(rb_core *c)
{
    c->rd_npend[0] = c->rd_npend[1] = 0;
    c->n_held = 0;
}

void rb_core_hold_slot_locked(rb_core *c, uint32_t slot)
{
    /* RESERVED: a slot just taken that a container lists (take_slot_locked) */
    rb_slots_move(&c->slots, slot, RB_SLOT_IN(RB_SLOT_RESERVED) | RB_SLOT_IN(RB_SLOT_FREEING), RB_SLOT_FREEING,
                  __func__);
    if (rb_slot_list_push(&c->held, &c->n_held, &c->cap_held, slot) < 0)
        return; /* kept out of use until the next recovery: never reused unsafely */
    c->held_total++;
}

static int cmp_slot(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

void rb_core_held_dedupe_locked(rb_core *c)
{
    if (c->n_held < 2)
        return;
    qsort(c->held, c->n_held, sizeof(*c->held), cmp_slot);
    size_t k = 1;
    for (size_t i = 1; i < c->n_held; i++)
        if (c->held[i] != c->held[k - 1])
            c->held[k++] = c->held[i];
    c->n_held = k;
}

int rb_core_ref_reserve_locked(rb_core *c, uint32_t n)
{
    if (n <= c->ref_cap)
        return 0;
    uint32_t nc = c->ref_cap ? c->ref_cap : 1024;
    while (nc < n)
        nc = nc > UINT32_MAX / 2 ? n : nc * 2;
    uint8_t *np = realloc(c->ref, nc);
    if (!np)
        return -ENOMEM;
    memset(np + c->ref_cap, 0, nc - c->ref_cap);
    c->ref = np;
    c->ref_cap = nc;
    return 0;
}

int rb_core_room_needed_locked(const rb_core *c, size_t n)
{
    if (c->ref_unknown)
        return 1;
    /* never-used slots count only while they lie inside the device (it may have shrunk) */
    uint32_t fresh = c->usable_slots > c->slots.next_slot ? c->usable_slots - c->slots.next_slot : 0;
    uint64_t avail = (uint64_t)c->slots.n_free + fresh + c->dl_npend;
    return rb_core_held_locked(c) > 0 && avail < n;
}

void rb_core_drop_accounting_locked(rb_core *c, uint32_t p)
{
    rb_ent *e = &c->index.ents[p];
    rb_obs_gone(&c->obs, e->hash);
    if (e->refcnt > 0)
        c->locked_keys--;
    if (e->flags & RB_ENT_UNVERIFIED)
        c->n_unverified--;
    if (c->ml.on)
        rb_core_ml_free_locked(c, e->slot); /* journaled; reusable once the FREE is durable */
    else
        rb_core_free_slot_locked(c, e->slot);
}

void rb_core_drop_locked(rb_core *c, uint32_t p)
{
    rb_core_drop_accounting_locked(c, p);
    rb_idx_remove_at(&c->index, p);
}

void rb_core_hold_free(rb_core *c)
{
    free(c->rd_pend[0]);
    free(c->rd_pend[1]);
    free(c->ref);
    free(c->held);
}
