/*
 * rb_extent.c - the extent allocator (see rb_slots.h): slots handed out an extent at a time,
 * space coming back an extent at a time.
 *
 * Every operation is O(1) but two: opening an extent when none is clean looks for the closed
 * one with the most free slots (at most per lists), and the victim choice (the eviction
 * thread's, never a put's or a load's) scans the extents. Finding the next free slot of an
 * open extent scans its slots from where the last one was taken: per slots over the extent's
 * whole fill. With no clean or closed extent left with a free slot, a put looks through the
 * other streams' open extents (per slots each at most) before it fails.
 */
#include "rb_slots.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NPIDS 65536u

/* The list indices (rb_slots.h): closed extents of class row r with k free slots at r * per +
 * k, then the clean, pending and open lists. */
static uint32_t nlists(const rb_extents *x)
{
    return (x->ncls > 1 ? x->ncls + 1 : 1) * x->per;
}
#define L_CLEAN(x) nlists(x)
#define L_PEND(x) (nlists(x) + 1)
#define L_OPEN(x) (nlists(x) + 2)
static uint32_t l_closed(const rb_extents *x, uint32_t e)
{
    uint32_t row = x->cls[e] == RB_EXT_NOCLS ? x->ncls : x->cls[e];
    return row * x->per + x->nfree[e];
}

void rb_ext_free(rb_slots *s)
{
    rb_extents *x = &s->ext;
    free(x->nfree);
    free(x->tick);
    free(x->st);
    free(x->prev);
    free(x->next);
    free(x->head);
    free(x->tail);
    free(x->open);
    free(x->cur);
    free(x->rev);
    free(x->hot);
    free(x->cls);
    free(x->own);
    memset(x, 0, sizeof(*x));
}

/* Extent e onto the tail of list k / off its list k. */
static void push(rb_extents *x, uint32_t k, uint32_t e)
{
    x->prev[e] = x->tail[k];
    x->next[e] = RB_SLOT_NONE;
    if (x->tail[k] != RB_SLOT_NONE)
        x->next[x->tail[k]] = e;
    else
        x->head[k] = e;
    x->tail[k] = e;
}

static void unlink_ext(rb_extents *x, uint32_t k, uint32_t e)
{
    uint32_t p = x->prev[e], n = x->next[e];
    if (p != RB_SLOT_NONE)
        x->next[p] = n;
    else
        x->head[k] = n;
    if (n != RB_SLOT_NONE)
        x->prev[n] = p;
    else
        x->tail[k] = p;
}

/* The per-extent, per-list and per-stream arrays for n extents. 0 or -ENOMEM. */
static int ext_arrays(rb_slots *s, uint32_t n, uint32_t per)
{
    rb_extents *x = &s->ext;
    x->nstreams = (s->affinity ? NPIDS : 1) * x->ncls;
    x->nfree = calloc(n, sizeof(uint32_t));
    x->tick = calloc(n, sizeof(uint64_t));
    x->st = calloc(n, 1);
    x->prev = malloc(n * sizeof(uint32_t));
    x->next = malloc(n * sizeof(uint32_t));
    x->per = per;
    x->head = malloc(((size_t)nlists(x) + 3) * sizeof(uint32_t));
    x->tail = malloc(((size_t)nlists(x) + 3) * sizeof(uint32_t));
    x->cls = calloc(n, 1);
    x->own = calloc(n, sizeof(uint32_t));
    x->open = malloc(x->nstreams * sizeof(uint32_t));
    x->cur = calloc(x->nstreams, sizeof(uint32_t));
    x->rev = malloc((size_t)s->max_slots * sizeof(uint32_t));
    x->hot = calloc(s->max_slots, 1);
    int ok = x->nfree && x->tick && x->st && x->prev && x->next && x->head && x->tail && x->open && x->cur && x->rev &&
             x->hot && x->cls && x->own;
    return ok ? 0 : -ENOMEM;
}

int rb_ext_init(rb_slots *s, uint32_t per, uint32_t first, int hold)
{
    return rb_ext_init_classes(s, per, first, hold, 1, &per);
}

int rb_ext_init_classes(rb_slots *s, uint32_t per, uint32_t first, int hold, uint32_t ncls, const uint32_t *cnt)
{
    if (per < 2 || first >= s->max_slots || (s->max_slots - first) / per == 0 || ncls == 0 || ncls > RB_EXT_CLS_MAX ||
        cnt[ncls - 1] != per)
        return -EINVAL;
    for (uint32_t k = 1; k < ncls; k++)
        if (cnt[k] < cnt[k - 1] || cnt[k - 1] == 0)
            return -EINVAL;
    rb_extents *x = &s->ext;
    uint32_t n = (s->max_slots - first) / per;
    x->ncls = ncls;
    memcpy(x->cnt, cnt, ncls * sizeof(*cnt));
    if (ext_arrays(s, n, per) < 0 || rb_slots_grow(s, s->max_slots) < 0) {
        rb_ext_free(s);
        return -ENOMEM;
    }
    x->first = first;
    x->n = n;
    x->hold = hold;
    uint32_t next = s->next_slot;
    rb_ext_reset(s, next);
    return 0;
}

/* The lists rebuilt from the free counts; no extent open or pending. */
static void rebuild_lists(rb_extents *x)
{
    memset(x->head, 0xff, ((size_t)nlists(x) + 3) * sizeof(uint32_t));
    memset(x->tail, 0xff, ((size_t)nlists(x) + 3) * sizeof(uint32_t));
    memset(x->open, 0xff, x->nstreams * sizeof(uint32_t));
    x->n_clean = x->n_open = x->n_pending = 0;
    for (uint32_t e = 0; e < x->n; e++) {
        int clean = x->nfree[e] == x->per;
        x->st[e] = clean ? RB_EXT_CLEAN : RB_EXT_CLOSED;
        x->n_clean += clean;
        push(x, clean ? L_CLEAN(x) : l_closed(x, e), e);
    }
}

void rb_ext_reset(rb_slots *s, uint32_t top)
{
    rb_extents *x = &s->ext;
    /* with classes every extent starts without one (recovery gives those holding entries theirs,
     * rb_ext_set_class) and the high-water mark is the end: ids past a class's count are holes */
    memset(x->cls, x->ncls > 1 ? RB_EXT_NOCLS : 0, x->n);
    memset(x->cls_extents, 0, sizeof(x->cls_extents));
    for (uint32_t e = 0; e < x->n; e++) {
        uint32_t lo = x->first + e * x->per, hi = lo + x->per;
        uint32_t from = top > lo ? (top < hi ? top : hi) : lo;
        x->nfree[e] = hi - from;
        if (hi > from)
            memset(s->is_free + from, 1, hi - from);
        if (x->ncls > 1)
            s->n_free += hi - from;
    }
    if (x->ncls > 1)
        s->next_slot = s->max_slots;
    rebuild_lists(x);
    memset(x->hot, 0, s->max_slots);
    x->rev_ok = 0;
    if (top >= x->first + x->n * x->per && top < s->max_slots) {
        /* as take() leaves it; the slots past the last extent are below it, never free (a
         * recovery frees those its state does not list: they stay out of use) */
#ifdef RB_DEBUG_INVARIANTS
        memset(s->state + top, RB_SLOT_FREEING, s->max_slots - top);
#endif
        s->next_slot = s->max_slots;
    }
}

/* Extent e's class becomes cls (RB_EXT_NOCLS: none, every id free): the ids past the new
 * class's count leave the free counts, those up to it join them. Off every list. */
static void class_to(rb_slots *s, uint32_t e, uint32_t cls)
{
    rb_extents *x = &s->ext;
    uint32_t base = x->first + e * x->per, from = rb_ext_cap(x, e);
    if (x->cls[e] != RB_EXT_NOCLS)
        x->cls_extents[x->cls[e]]--;
    x->cls[e] = (uint8_t)cls;
    uint32_t to = rb_ext_cap(x, e);
    if (cls != RB_EXT_NOCLS)
        x->cls_extents[cls]++;
    for (uint32_t i = to; i < from; i++) /* fewer ids: the free ones past to become holes */
        if (s->is_free[base + i]) {
            s->is_free[base + i] = 0;
            x->nfree[e]--;
            s->n_free--;
        }
    for (uint32_t i = from; i < to; i++) { /* more ids (wholly free): the holes are free */
        s->is_free[base + i] = 1;
        x->nfree[e]++;
        s->n_free++;
    }
}

void rb_ext_set_class(rb_slots *s, uint32_t e, uint32_t cls)
{
    rb_extents *x = &s->ext;
    if (x->ncls < 2 || cls >= x->ncls || x->st[e] != RB_EXT_CLOSED || x->cls[e] == cls)
        return;
    unlink_ext(x, l_closed(x, e), e);
    class_to(s, e, cls);
    push(x, l_closed(x, e), e);
}

/* A closed or open extent whose every slot is free: clean, or pending its deallocation (with
 * classes it loses its class: any class may open it next). */
static void whole_free(rb_slots *s, uint32_t e)
{
    rb_extents *x = &s->ext;
    if (x->ncls > 1)
        class_to(s, e, RB_EXT_NOCLS);
    if (x->hold) {
        x->st[e] = RB_EXT_PENDING;
        x->n_pending++;
        push(x, L_PEND(x), e);
    } else {
        x->st[e] = RB_EXT_CLEAN;
        x->n_clean++;
        push(x, L_CLEAN(x), e);
    }
}

void rb_ext_release(rb_slots *s, uint32_t slot)
{
    rb_extents *x = &s->ext;
    uint32_t e = rb_ext_of(s, slot);
    if (e == RB_SLOT_NONE)
        return; /* before the first extent or after the last: never handed out again */
    if ((slot - x->first) % x->per >= rb_ext_cap(x, e))
        return; /* past its class's slots: a hole, never free */
    if (x->st[e] != RB_EXT_CLOSED) {
        s->is_free[slot] = 1;
        s->n_free++;
        x->nfree[e]++; /* open: the stream goes on from where it is */
        return;
    }
    unlink_ext(x, l_closed(x, e), e);
    s->is_free[slot] = 1;
    s->n_free++;
    if (++x->nfree[e] == rb_ext_cap(x, e))
        whole_free(s, e);
    else
        push(x, l_closed(x, e), e);
}

/* The stream's open extent is full: closed. */
static void close_open(rb_slots *s, uint32_t stream)
{
    rb_extents *x = &s->ext;
    uint32_t e = x->open[stream];
    x->open[stream] = RB_SLOT_NONE;
    x->n_open--;
    unlink_ext(x, L_OPEN(x), e);
    if (x->nfree[e] == rb_ext_cap(x, e)) {
        whole_free(s, e);
        return;
    }
    x->st[e] = RB_EXT_CLOSED;
    push(x, l_closed(x, e), e);
}

/* Open a clean extent for the stream (of class cls), else the closed one of that class with
 * the most free slots. */
static int open_next(rb_slots *s, uint32_t stream, uint32_t cls)
{
    rb_extents *x = &s->ext;
    uint32_t e = x->head[L_CLEAN(x)], l = L_CLEAN(x);
    if (e == RB_SLOT_NONE) {
        uint32_t k, row = cls * x->per;
        for (k = x->cnt[cls] - 1; k > 0 && x->head[row + k] == RB_SLOT_NONE; k--)
            ;
        if (k == 0)
            return 0;
        l = row + k;
        e = x->head[l];
        x->fallbacks++;
    } else {
        x->n_clean--;
    }
    unlink_ext(x, l, e);
    if (x->ncls > 1 && x->cls[e] != cls)
        class_to(s, e, cls);
    x->st[e] = RB_EXT_OPEN;
    push(x, L_OPEN(x), e);
    x->open[stream] = e;
    x->own[e] = stream;
    x->cur[stream] = 0;
    x->n_open++;
    x->opened++;
    return 1;
}

/* The slot taken: out of the free counts; next_slot past it. */
static void take(rb_slots *s, uint32_t slot)
{
    rb_extents *x = &s->ext;
    s->is_free[slot] = 0;
    x->nfree[rb_ext_of(s, slot)]--;
    if (slot < s->next_slot) {
        s->n_free--;
        return;
    }
    /* the free slots between the old high-water mark and this one are now below it */
    uint32_t from = s->next_slot > x->first ? s->next_slot : x->first;
    s->n_free += slot - from;
    s->next_slot = slot + 1;
    if (s->next_slot == x->first + x->n * x->per)
        s->next_slot = s->max_slots; /* the slots after the last extent are never handed out */
}

/* No clean or closed extent has a free slot: one of another stream's open extent (affinity; a
 * slot freed there after the stream went past it), the open extents looked at in turn. */
static uint32_t take_from_open(rb_slots *s, uint32_t cls)
{
    rb_extents *x = &s->ext;
    for (uint32_t e = x->head[L_OPEN(x)]; e != RB_SLOT_NONE; e = x->next[e]) {
        if (x->nfree[e] == 0 || x->cls[e] != cls)
            continue;
        for (uint32_t slot = x->first + e * x->per, end = slot + x->cnt[cls]; slot < end; slot++)
            if (s->is_free[slot]) {
                take(s, slot);
                rb_slots_move(s, slot, RB_SLOT_IN(RB_SLOT_FREE), RB_SLOT_RESERVED, __func__);
                return slot;
            }
    }
    return RB_SLOT_NONE;
}

/* Size classes, nothing of class cls left: an extent open for another class whose every slot
 * is free (its keys deleted since) is closed, so it becomes clean (or pending) for any class.
 * 1 when one was. */
static int free_idle_open(rb_slots *s, uint32_t cls)
{
    rb_extents *x = &s->ext;
    for (uint32_t e = x->head[L_OPEN(x)]; e != RB_SLOT_NONE; e = x->next[e])
        if (x->cls[e] != cls && x->nfree[e] == rb_ext_cap(x, e)) {
            close_open(s, x->own[e]);
            return 1;
        }
    return 0;
}

uint32_t rb_ext_alloc(rb_slots *s, uint16_t pid, uint32_t cls)
{
    rb_extents *x = &s->ext;
    if (cls >= x->ncls)
        cls = 0;
    uint32_t stream = (s->affinity ? pid : 0) * x->ncls + cls;
    for (;;) {
        uint32_t e = x->open[stream];
        if (e != RB_SLOT_NONE) {
            uint32_t base = x->first + e * x->per;
            for (uint32_t i = x->cur[stream]; i < x->cnt[cls]; i++) {
                if (!s->is_free[base + i])
                    continue;
                x->cur[stream] = i + 1;
                take(s, base + i);
                rb_slots_move(s, base + i, RB_SLOT_IN(RB_SLOT_FREE), RB_SLOT_RESERVED, __func__);
                return base + i;
            }
            close_open(s, stream);
        }
        if (open_next(s, stream, cls))
            continue;
        uint32_t slot = take_from_open(s, cls);
        if (slot != RB_SLOT_NONE || x->ncls < 2 || !free_idle_open(s, cls))
            return slot;
    }
}

uint32_t rb_ext_take_pending(rb_slots *s)
{
    rb_extents *x = &s->ext;
    uint32_t e = x->head[L_PEND(x)];
    if (e == RB_SLOT_NONE)
        return e;
    unlink_ext(x, L_PEND(x), e);
    x->st[e] = RB_EXT_DEALLOC;
    x->n_pending--;
    return e;
}

void rb_ext_clean(rb_slots *s, uint32_t e, int deallocated)
{
    rb_extents *x = &s->ext;
    if (x->st[e] == RB_EXT_PENDING) {
        unlink_ext(x, L_PEND(x), e);
        x->n_pending--;
    }
    if (deallocated)
        x->deallocated++;
    else
        x->dealloc_skipped++;
    x->st[e] = RB_EXT_CLEAN;
    x->n_clean++;
    push(x, L_CLEAN(x), e);
}

uint32_t rb_ext_skip_pending(rb_slots *s)
{
    uint32_t n = 0;
    for (uint32_t e; (e = s->ext.head[L_PEND(&s->ext)]) != RB_SLOT_NONE; n += s->ext.per)
        rb_ext_clean(s, e, 0);
    return n;
}

uint32_t rb_ext_take(rb_slots *s, uint32_t e)
{
    rb_extents *x = &s->ext;
    if (e >= x->n || !rb_ext_candidate(x, e))
        return RB_SLOT_NONE;
    x->tick[e] = ++x->clock;
    x->evicted++;
    return e;
}

uint32_t rb_ext_victim(rb_slots *s)
{
    rb_extents *x = &s->ext;
    uint32_t best = RB_SLOT_NONE;
    for (uint32_t e = 0; e < x->n; e++)
        if (rb_ext_candidate(x, e) && (best == RB_SLOT_NONE || x->tick[e] < x->tick[best]))
            best = e;
    return best == RB_SLOT_NONE ? best : rb_ext_take(s, best);
}
