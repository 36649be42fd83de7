/*
 * rb_idx.h - insertion-ordered hash index from key bytes to a small fixed record.
 *
 * Owns: the record array (insertion order, holes until compaction), the open-addressing
 * table (linear probing, backward-shift deletion, u32 positions) and each record's key
 * blob. Used three times by the core: the committed index, the in-flight table and the
 * interned metadata classes. Not thread-safe: the owner serialises access (rb_core.h).
 *
 * Memory per live record: sizeof(rb_ent) (48 bytes) in the array, 4..16 bytes of table,
 * one blob (key bytes + NUL, plus cached positions when present). Blobs up to RB_POOL_MAX
 * bytes come from the index's own size-class pool (rb_pool below), larger ones from malloc.
 */
#ifndef RB_IDX_H
#define RB_IDX_H

#include <stddef.h>
#include <stdint.h>

#define RB_ENT_DEAD 0x1u     /* hole in the array (deleted, awaiting compaction) */
#define RB_ENT_HAS_SUM 0x2u  /* checksum holds the payload's xxh3-64 */
#define RB_ENT_CANCELED 0x4u /* in-flight record whose key was deleted meanwhile */
/* Index record recovered from a checkpoint without slot-header validation
 * (meta_verify_on_load=False): its first load reads and judges the slot header before the
 * payload counts as loaded, then clears the mark (or drops the record). */
#define RB_ENT_UNVERIFIED 0x8u

/* Blob layout: [int64 npos][npos x int64 positions][key bytes][NUL]; npos < 0 = null. */
typedef struct rb_ent {
    uint8_t *blob;
    uint64_t size;     /* payload length (index) / class id (class table) */
    uint64_t checksum; /* xxh3-64 of the payload when RB_ENT_HAS_SUM */
    uint32_t slot;     /* slot number (index, in-flight) */
    uint32_t hash;
    uint32_t refcnt;   /* lock refcount (index only) */
    uint32_t cls;      /* interned metadata class id (index, in-flight) */
    uint32_t key_len;
    uint16_t flags;
    uint16_t pid;      /* placement id requested at put time (in-flight), 0 = none */
} rb_ent;

/*
 * Blob pool: size classes in RB_POOL_STEP steps up to RB_POOL_MAX, carved from slabs (1 KiB,
 * doubling up to 64 KiB) and recycled through per-class intrusive free lists. A key's blob is
 * allocated and freed with a few instructions instead of a malloc/free pair (which, for a batch
 * delete, cost more than the index work itself), and blobs allocated together sit together.
 * Slabs go back to the system when the index empties (all but the newest) and on
 * rb_idx_clear(). Under AddressSanitizer free chunks are poisoned, so a use after free is
 * still reported.
 */
#define RB_POOL_STEP 16u
#define RB_POOL_MAX 256u
#define RB_POOL_CLASSES (RB_POOL_MAX / RB_POOL_STEP)

typedef struct rb_pool {
    void *free[RB_POOL_CLASSES]; /* free chunks per class, linked through their first 8 bytes */
    char *cur;                    /* bump region of the newest slab */
    size_t left;
    void *slabs;                  /* slab list, linked through each slab's first 16 bytes */
    size_t slab_bytes;            /* bytes held in slabs (for rb_idx_mem_bytes) */
} rb_pool;

typedef struct rb_idx {
    rb_ent *ents;
    uint32_t n_ents; /* used array length, live + dead */
    uint32_t cap_ents;
    uint32_t n_live;
    uint32_t first_live; /* hint: no live record below this position */
    uint32_t *table;     /* position + 1, 0 = empty */
    uint32_t table_mask; /* table size - 1 (size is a power of two), 0 when no table */
    rb_pool pool;
} rb_idx;

void rb_idx_init(rb_idx *ix);
void rb_idx_free(rb_idx *ix);
/* Remove every record (keeps nothing allocated). */
void rb_idx_clear(rb_idx *ix);

uint32_t rb_idx_hash(const char *key, size_t len);
/* Position of the live record with this key, or UINT32_MAX. */
uint32_t rb_idx_find(const rb_idx *ix, const char *key, size_t len, uint32_t hash);
/* Append a new record (key must be absent). npos < 0: no positions. Returns the position,
 * or UINT32_MAX when out of memory. The returned record is zeroed except key fields. */
uint32_t rb_idx_insert(rb_idx *ix, const char *key, size_t len, uint32_t hash, const int64_t *pos,
                       int64_t npos);
/* Delete the live record at pos (frees its blob). */
void rb_idx_remove_at(rb_idx *ix, uint32_t pos);
/* rb_idx_find that also gives the table slot holding the record, and the removal by that slot:
 * a lookup followed by a delete probes the table once. */
uint32_t rb_idx_find_slot(const rb_idx *ix, const char *key, size_t len, uint32_t hash, uint32_t *tslot);
void rb_idx_remove_slot(rb_idx *ix, uint32_t tslot);
/* Compact the array when holes dominate; positions change. Returns 0 or -ENOMEM. */
int rb_idx_maybe_compact(rb_idx *ix);

static inline const char *rb_ent_key(const rb_ent *e)
{
    int64_t npos;
    __builtin_memcpy(&npos, e->blob, sizeof npos);
    return (const char *)e->blob + 8 + (npos > 0 ? (size_t)npos * 8 : 0);
}
static inline int64_t rb_ent_npos(const rb_ent *e)
{
    int64_t npos;
    __builtin_memcpy(&npos, e->blob, sizeof npos);
    return npos;
}
static inline const int64_t *rb_ent_pos(const rb_ent *e)
{
    return (const int64_t *)(e->blob + 8);
}
/* Bytes allocated for this index (array + table + slabs + large blobs), for the memory
 * benchmark. */
size_t rb_idx_mem_bytes(const rb_idx *ix);

#endif /* RB_IDX_H */
