/*
 * rb_slots.h - the slot allocator: LIFO free-slot set, high-water mark, FDP affinity pools.
 *
 * Owns: which slots are free. A slot below next_slot is either in use (by an index entry or
 * an in-flight reservation, tracked by the caller) or on the global free list; slots at or
 * above next_slot were never handed out. The global free list and each placement id's pool
 * are doubly linked lists threaded through per-slot arrays that grow with next_slot, so a
 * free slot can leave both lists in O(1). Allocation pops the most recently freed slot.
 * Not thread-safe: the core mutex guards it (rb_core.h).
 */
#ifndef RB_SLOTS_H
#define RB_SLOTS_H

#include <stdint.h>
#include <stddef.h>

#define RB_SLOT_NONE UINT32_MAX

/*
 * Extents (rb_extent.c; off while per is 0): the slots grouped into extents of per consecutive
 * slots, extent 0 starting at slot first (the first slot on an extent_bytes boundary of the
 * device), n whole extents; the slots before first and after the last extent are never handed
 * out. One extent is open per writer stream (per placement id with affinity, else one) and
 * hands out its free slots in order; a new one is opened only when it is full, from the clean
 * extents (every slot free) first, else the closed extent with the most free slots. An extent
 * is on one list: lists[k] (k < per) the closed extents with k free slots, lists[per] the clean
 * ones (oldest first), lists[per + 1] those waiting for their deallocation (hold on: every slot
 * free, handed out again only once rb_ext_clean says the range was deallocated or skipped),
 * lists[per + 2] the open ones (with none clean or closed left with a free slot, a stream takes
 * one of another stream's open extent rather than fail).
 * Per extent: its free slots and its last fill (a tick of put commits; a load hit does not
 * move it, so extents age in the order they were filled: an extent kept for a few hot keys
 * would stay live while its neighbours on the drive's reclaim units are gone, and the drive
 * would copy it; the hot keys are put again instead). rev maps
 * a slot to the index position of the key on it (valid while rev_ok and the index epoch is
 * rev_epoch; rb_core_extent.c rebuilds it otherwise); hot marks a slot whose key was loaded
 * since it was put (what eviction may put again elsewhere rather than lose).
 */
/*
 * Size classes (ncls > 1; rb_core_extent.c): an extent holds slots of one class, cnt[c] of
 * them, at slot ids first + e * per .. + cnt[c] - 1 (per: the count of the smallest class, so
 * ids stay stable integers); the ids past cnt[c] are never free. An extent takes its class
 * when opened and loses it when wholly free (cls RB_EXT_NOCLS: every id free). The closed
 * lists are per class: list r * per + k holds the closed extents of class r (r = ncls: none)
 * with k free slots; clean, pending and open follow them. One extent is open per (stream,
 * class). With ncls 1 (off) every extent is class 0 and cnt[0] is per.
 */
#define RB_EXT_NOCLS 0xffu
#define RB_EXT_CLS_MAX 8u
enum { RB_EXT_CLOSED, RB_EXT_OPEN, RB_EXT_CLEAN, RB_EXT_PENDING, RB_EXT_DEALLOC };
typedef struct rb_extents {
    uint32_t per, first, n;
    uint32_t ncls, cnt[RB_EXT_CLS_MAX];
    uint8_t *cls;                         /* per extent: its class, RB_EXT_NOCLS */
    uint64_t cls_extents[RB_EXT_CLS_MAX]; /* extents holding each class now */
    uint32_t *nfree;
    uint64_t *tick;
    uint8_t *st;           /* RB_EXT_* */
    uint32_t *prev, *next; /* list links */
    uint32_t *head, *tail; /* per + 3 lists */
    uint32_t *open, *cur;  /* per stream: the open extent, the index in it to look at next */
    uint32_t *own;         /* per extent: the stream it is open for (while open) */
    uint32_t nstreams;
    uint32_t *rev;
    uint8_t *hot;
    uint32_t rev_epoch;
    int rev_ok;
    int hold;   /* extents whose slots are all free wait for their deallocation */
    int by_use; /* a load hit also makes its extent the newest (extent_victim_order use) */
    uint64_t clock;
    uint32_t n_clean, n_open, n_pending;
    uint64_t opened, fallbacks, evicted, deallocated, dealloc_skipped;
} rb_extents;

typedef struct rb_slots {
    uint32_t max_slots;
    uint32_t next_slot;
    uint32_t cap;            /* length of the per-slot arrays (>= next_slot) */
    uint32_t *gprev, *gnext; /* global free list links */
    uint32_t ghead, gtail;   /* tail = most recently added */
    uint32_t n_free;
    uint8_t *is_free;
    int affinity;
    uint16_t *pid;           /* latest placement id a slot was allocated with (affinity only) */
    uint32_t *pprev, *pnext; /* per-pid pool links (affinity only) */
    uint32_t *ptail;         /* 65536 pool tails (affinity only) */
    uint32_t *phead;
    uint64_t affinity_hits, affinity_fallbacks;
    uint8_t *state; /* debug builds: each slot's RB_SLOT_* state (NULL otherwise) */
    rb_extents ext;
} rb_slots;

/*
 * The slot state machine, checked in debug builds (RB_DEBUG_INVARIANTS, rb_debug.h):
 * FREE (the allocator's) -> RESERVED (rb_slots_alloc: a put's, in the in-flight table) ->
 * LIVE (the put committed it to the index) -> FREEING (it left the index: held for a
 * checkpoint, quarantined for readers or waiting for its deallocation) -> FREE
 * (rb_slots_release). A put that fails gives its slot back (RESERVED -> FREE); a reserved slot
 * a checkpoint container lists waits like a freed one (RESERVED -> FREEING). rb_slots_reset
 * (recovery, a state applied at run time) leaves a reserved slot RESERVED and makes every other
 * slot below next_slot FREEING: recovery releases those its state does not list, the others
 * leave the index through FREEING. Any other move aborts, naming the slot, its state and the
 * caller.
 */
enum { RB_SLOT_FREE, RB_SLOT_RESERVED, RB_SLOT_LIVE, RB_SLOT_FREEING };
#define RB_SLOT_IN(st) (1u << (st))
#ifdef RB_DEBUG_INVARIANTS
/* Move slot to state to from one of the states in the mask from (RB_SLOT_IN bits). */
void rb_slots_move(rb_slots *s, uint32_t slot, unsigned from, int to, const char *where);
#else
static inline void rb_slots_move(rb_slots *s, uint32_t slot, unsigned from, int to, const char *where)
{
    (void)s;
    (void)slot;
    (void)from;
    (void)to;
    (void)where;
}
#endif

int rb_slots_init(rb_slots *s, uint32_t max_slots, int affinity);
void rb_slots_free(rb_slots *s);
/* Forget every free slot and affinity; set next_slot (<= max_slots). 0 or -ENOMEM. */
int rb_slots_reset(rb_slots *s, uint32_t next_slot);
/* Allocate a slot for placement id pid (0 = none). Returns the slot or RB_SLOT_NONE. */
uint32_t rb_slots_alloc(rb_slots *s, uint16_t pid);
/* Return a slot: ignores out-of-range (>= next_slot) and already free slots. */
void rb_slots_release(rb_slots *s, uint32_t slot);
/* Bytes allocated, for the memory benchmark: 9 per slot of the per-slot arrays (cap: the
 * free-list links and flag), with affinity 10 more per slot and 8 per placement id (the 65536
 * pool ends); with extents 26 per extent (nfree, tick, st, prev, next, cls, own), 5 per slot of
 * max_slots (rev, hot), 8 per list (per lists, (ncls + 1) x per with size classes, and 3 more)
 * and 8 per stream (nstreams, which counts the classes). The debug builds' slot states are not
 * counted. */
size_t rb_slots_mem_bytes(const rb_slots *s);
/* Make the per-slot arrays cover need slots. 0 or -ENOMEM. */
int rb_slots_grow(rb_slots *s, uint32_t need);

/* ---- extents (rb_extent.c) ---- */
/* Turn extents on after rb_slots_init: per slots each (>= 2), the first at slot first; hold:
 * wholly free extents wait for rb_ext_take_pending / rb_ext_clean. 0, -EINVAL (no whole
 * extent fits) or -ENOMEM. Every slot starts out of use, as after rb_slots_reset(s, max). */
int rb_ext_init(rb_slots *s, uint32_t per, uint32_t first, int hold);
/* The same with ncls size classes of cnt[c] slots an extent (cnt[ncls - 1] == per, cnt
 * decreasing; ncls <= RB_EXT_CLS_MAX). Every extent starts without a class. */
int rb_ext_init_classes(rb_slots *s, uint32_t per, uint32_t first, int hold, uint32_t ncls, const uint32_t *cnt);
/* Recovery: extent e (closed, without a class, not wholly free) takes class cls; its ids past
 * the class's count leave the free counts. */
void rb_ext_set_class(rb_slots *s, uint32_t e, uint32_t cls);
/* Slots of an extent of e's class (per when it has none). */
static inline uint32_t rb_ext_cap(const rb_extents *x, uint32_t e)
{
    return x->cls[e] == RB_EXT_NOCLS ? x->per : x->cnt[x->cls[e]];
}
/* Whether extent e is closed and holds a key: what extent eviction may take. */
static inline int rb_ext_candidate(const rb_extents *x, uint32_t e)
{
    return x->st[e] == RB_EXT_CLOSED && x->nfree[e] < rb_ext_cap(x, e);
}
/* Extent e taken as a victim when it is a candidate (rb_ext_candidate): it counts as just
 * filled, so a victim whose keys cannot all go is not chosen again at once. e, or RB_SLOT_NONE
 * when it is no candidate (or out of range). */
uint32_t rb_ext_take(rb_slots *s, uint32_t e);
/* A slot of class cls for placement id pid (rb_slots_alloc with classes). */
uint32_t rb_slots_alloc_sc(rb_slots *s, uint16_t pid, uint32_t cls);
void rb_ext_free(rb_slots *s);
/* rb_slots_reset's part: slots at or above top are free, the others out of use. */
void rb_ext_reset(rb_slots *s, uint32_t top);
uint32_t rb_ext_alloc(rb_slots *s, uint16_t pid, uint32_t cls);
/* A slot below next_slot, not free, is free again (rb_slots_release). */
void rb_ext_release(rb_slots *s, uint32_t slot);
/* An extent waiting for its deallocation, now taken for it (RB_EXT_DEALLOC), or RB_SLOT_NONE. */
uint32_t rb_ext_take_pending(rb_slots *s);
/* A wholly free extent (taken, or still pending) becomes clean; deallocated: its range was. */
void rb_ext_clean(rb_slots *s, uint32_t e, int deallocated);
/* Every pending extent clean, undeallocated (a put out of slots). Returns the slots. */
uint32_t rb_ext_skip_pending(rb_slots *s);
/* The closed extent with live slots filled longest ago, or RB_SLOT_NONE; it then counts as
 * just filled (a victim whose keys cannot all go is not chosen again at once). */
uint32_t rb_ext_victim(rb_slots *s);
static inline uint32_t rb_ext_of(const rb_slots *s, uint32_t slot)
{
    const rb_extents *x = &s->ext;
    if (slot < x->first || slot - x->first >= (uint64_t)x->n * x->per)
        return RB_SLOT_NONE;
    return (slot - x->first) / x->per;
}
/* A key committed on slot at index position pos (hit 0: its extent's last fill), or loaded
 * from it (hit 1): the slot's index position and whether its key was loaded since put. */
static inline void rb_ext_use(rb_slots *s, uint32_t slot, uint32_t pos, int hit)
{
    uint32_t e = s->ext.per ? rb_ext_of(s, slot) : RB_SLOT_NONE;
    if (e == RB_SLOT_NONE)
        return;
    if (!hit || s->ext.by_use)
        s->ext.tick[e] = ++s->ext.clock;
    s->ext.rev[slot] = pos;
    s->ext.hot[slot] = (uint8_t)hit;
}

#endif /* RB_SLOTS_H */
