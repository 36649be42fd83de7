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
} rb_slots;

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
