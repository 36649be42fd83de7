/*
 * rb_slots.c - LIFO free-slot lists with FDP placement-id affinity pools (see rb_slots.h).
 */
#include "rb_slots.h"
#include "rb_debug.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NPIDS 65536u

int rb_slots_init(rb_slots *s, uint32_t max_slots, int affinity)
{
    memset(s, 0, sizeof(*s));
    s->max_slots = max_slots;
    s->affinity = affinity;
    s->ghead = s->gtail = RB_SLOT_NONE;
    if (affinity) {
        s->phead = malloc(NPIDS * sizeof(uint32_t));
        s->ptail = malloc(NPIDS * sizeof(uint32_t));
        if (!s->phead || !s->ptail) {
            rb_slots_free(s);
            return -ENOMEM;
        }
        memset(s->phead, 0xff, NPIDS * sizeof(uint32_t));
        memset(s->ptail, 0xff, NPIDS * sizeof(uint32_t));
    }
    return 0;
}

void rb_slots_free(rb_slots *s)
{
    free(s->gprev);
    free(s->gnext);
    free(s->is_free);
    free(s->pid);
    free(s->pprev);
    free(s->pnext);
    free(s->phead);
    free(s->ptail);
    free(s->state);
    rb_ext_free(s);
    memset(s, 0, sizeof(*s));
}

int rb_slots_grow(rb_slots *s, uint32_t need)
{
    if (need <= s->cap)
        return 0;
    uint32_t nc = s->cap ? s->cap : 64;
    while (nc < need)
        nc = nc > UINT32_MAX / 2 ? need : nc * 2;
#define GROW(field, T)                                                                                                 \
    do {                                                                                                               \
        T *p = realloc(s->field, (size_t)nc * sizeof(T));                                                              \
        if (!p)                                                                                                        \
            return -ENOMEM;                                                                                            \
        s->field = p;                                                                                                  \
    } while (0)
    GROW(gprev, uint32_t);
    GROW(gnext, uint32_t);
    GROW(is_free, uint8_t);
#ifdef RB_DEBUG_INVARIANTS
    GROW(state, uint8_t);
    memset(s->state + s->cap, RB_SLOT_FREE, nc - s->cap);
#endif
    if (s->affinity) {
        GROW(pid, uint16_t);
        GROW(pprev, uint32_t);
        GROW(pnext, uint32_t);
        memset(s->pid + s->cap, 0, (size_t)(nc - s->cap) * sizeof(uint16_t));
    }
#undef GROW
    memset(s->is_free + s->cap, 0, nc - s->cap);
    s->cap = nc;
    return 0;
}

int rb_slots_reset(rb_slots *s, uint32_t next_slot)
{
    if (next_slot > s->max_slots)
        next_slot = s->max_slots;
    if (rb_slots_grow(s, next_slot) < 0)
        return -ENOMEM;
    if (s->cap) {
        memset(s->is_free, 0, s->cap);
        if (s->affinity)
            memset(s->pid, 0, (size_t)s->cap * sizeof(uint16_t));
    }
#ifdef RB_DEBUG_INVARIANTS
    for (uint32_t x = 0; x < s->cap; x++)
        if (s->state[x] != RB_SLOT_RESERVED)
            s->state[x] = x < next_slot ? RB_SLOT_FREEING : RB_SLOT_FREE;
#endif
    if (s->affinity) {
        memset(s->phead, 0xff, NPIDS * sizeof(uint32_t));
        memset(s->ptail, 0xff, NPIDS * sizeof(uint32_t));
    }
    s->ghead = s->gtail = RB_SLOT_NONE;
    s->n_free = 0;
    s->next_slot = next_slot;
    if (s->ext.per)
        rb_ext_reset(s, next_slot);
    return 0;
}

static void g_unlink(rb_slots *s, uint32_t x)
{
    uint32_t p = s->gprev[x], n = s->gnext[x];
    if (p != RB_SLOT_NONE)
        s->gnext[p] = n;
    else
        s->ghead = n;
    if (n != RB_SLOT_NONE)
        s->gprev[n] = p;
    else
        s->gtail = p;
}

static void p_unlink(rb_slots *s, uint32_t x)
{
    uint16_t id = s->pid[x];
    uint32_t p = s->pprev[x], n = s->pnext[x];
    if (p != RB_SLOT_NONE)
        s->pnext[p] = n;
    else
        s->phead[id] = n;
    if (n != RB_SLOT_NONE)
        s->pprev[n] = p;
    else
        s->ptail[id] = p;
}

#ifdef RB_DEBUG_INVARIANTS
void rb_slots_move(rb_slots *s, uint32_t slot, unsigned from, int to, const char *where)
{
    static const char *const names[] = {"FREE", "RESERVED", "LIVE", "FREEING"};
    if (slot >= s->cap)
        rb_invariant_failed(__FILE__, __LINE__, "slot state: %s: slot %u to %s: past the %u slots known", where, slot,
                            names[to], s->cap);
    if (!(from & RB_SLOT_IN(s->state[slot])))
        rb_invariant_failed(__FILE__, __LINE__, "slot state: %s: slot %u is %s, cannot become %s", where, slot,
                            names[s->state[slot]], names[to]);
    s->state[slot] = (uint8_t)to;
}
#endif

static void take(rb_slots *s, uint32_t x)
{
    g_unlink(s, x);
    if (s->affinity && s->pid[x])
        p_unlink(s, x);
    s->is_free[x] = 0;
    s->n_free--;
}

uint32_t rb_slots_alloc(rb_slots *s, uint16_t pid)
{
    return rb_slots_alloc_sc(s, pid, 0);
}

uint32_t rb_slots_alloc_sc(rb_slots *s, uint16_t pid, uint32_t cls)
{
    uint32_t x;
    if (s->ext.per)
        return rb_ext_alloc(s, pid, cls);
    if (s->affinity && pid && s->ptail[pid] != RB_SLOT_NONE) {
        x = s->ptail[pid];
        take(s, x);
        s->affinity_hits++;
        rb_slots_move(s, x, RB_SLOT_IN(RB_SLOT_FREE), RB_SLOT_RESERVED, __func__);
        return x;
    }
    if (s->gtail != RB_SLOT_NONE) {
        x = s->gtail;
        take(s, x);
        if (s->affinity) {
            if (pid)
                s->affinity_fallbacks++;
            s->pid[x] = pid;
        }
        rb_slots_move(s, x, RB_SLOT_IN(RB_SLOT_FREE), RB_SLOT_RESERVED, __func__);
        return x;
    }
    if (s->next_slot < s->max_slots) {
        if (rb_slots_grow(s, s->next_slot + 1) < 0)
            return RB_SLOT_NONE;
        x = s->next_slot++;
        if (s->affinity)
            s->pid[x] = pid;
        rb_slots_move(s, x, RB_SLOT_IN(RB_SLOT_FREE), RB_SLOT_RESERVED, __func__);
        return x;
    }
    return RB_SLOT_NONE;
}

void rb_slots_release(rb_slots *s, uint32_t x)
{
    if (x < s->next_slot) /* debug builds: a slot is released once, and never while indexed */
        rb_slots_move(s, x, RB_SLOT_IN(RB_SLOT_RESERVED) | RB_SLOT_IN(RB_SLOT_FREEING), RB_SLOT_FREE, __func__);
    if (x >= s->next_slot || s->is_free[x])
        return;
    if (s->ext.per) {
        rb_ext_release(s, x);
        return;
    }
    s->is_free[x] = 1;
    s->n_free++;
    s->gprev[x] = s->gtail;
    s->gnext[x] = RB_SLOT_NONE;
    if (s->gtail != RB_SLOT_NONE)
        s->gnext[s->gtail] = x;
    else
        s->ghead = x;
    s->gtail = x;
    if (s->affinity && s->pid[x]) {
        uint16_t id = s->pid[x];
        s->pprev[x] = s->ptail[id];
        s->pnext[x] = RB_SLOT_NONE;
        if (s->ptail[id] != RB_SLOT_NONE)
            s->pnext[s->ptail[id]] = x;
        else
            s->phead[id] = x;
        s->ptail[id] = x;
    }
}

size_t rb_slots_mem_bytes(const rb_slots *s)
{
    size_t per = 2 * sizeof(uint32_t) + 1 + (s->affinity ? 2 * sizeof(uint32_t) + 2 : 0);
    size_t ext = 0;
    if (s->ext.per) {
        const rb_extents *x = &s->ext;
        size_t lists = (size_t)(x->ncls > 1 ? x->ncls + 1 : 1) * x->per + 3;
        ext = (size_t)x->n * (4 * sizeof(uint32_t) + sizeof(uint64_t) + 2) + /* nfree prev next own, tick, st cls */
              (size_t)s->max_slots * (sizeof(uint32_t) + 1) +                /* rev, hot */
              lists * 2 * sizeof(uint32_t) +
              (size_t)x->nstreams * 2 * sizeof(uint32_t); /* nstreams counts the classes */
    }
    return (size_t)s->cap * per + (s->affinity ? 2 * NPIDS * sizeof(uint32_t) : 0) + ext;
}
