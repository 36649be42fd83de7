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
/* Bytes allocated, for the memory benchmark. */
size_t rb_slots_mem_bytes(const rb_slots *s);

#endif /* RB_SLOTS_H */
