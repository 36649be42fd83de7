/*
 * rb_idx.h - insertion-ordered hash index from key bytes to a small fixed record.
 *
 * Owns: the record array (insertion order, holes until compaction), the open-addressing
 * table (linear probing, backward-shift deletion; each slot holds a record's position and
 * its 32-bit hash, so probing and the backward shift read the table only and a record is
 * dereferenced on a hash match) and each record's key blob. Used three times by the core:
 * the committed index, the in-flight table and the interned metadata classes. Not
 * thread-safe: the owner serialises access (rb_core.h).
 *
 * Memory per live record: sizeof(rb_ent) (48 bytes) in the array, 16..32 bytes of table,
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
/* Bits 8..12 belong to the index: the blob's pool class + 1 (0 = a malloc'd blob), so a free
 * need not read the blob's header. Owners only set or clear the bits above. */
#define RB_ENT_POOL_SHIFT 8
#define RB_ENT_POOL_MASK (0x1Fu << RB_ENT_POOL_SHIFT)

/* Blob layout: [int64 npos][npos x int64 positions][key bytes][NUL]; npos < 0 = null. */
typedef struct rb_ent {
    uint8_t *blob;
    uint64_t size;     /* payload length (index) / class id (class table) */
    uint64_t checksum; /* xxh3-64 of the payload when RB_ENT_HAS_SUM */
    uint32_t slot;     /* slot number (index, in-flight) */
    uint32_t hash;
    uint32_t refcnt; /* lock refcount (index); in flight: the write-back failure epoch at reservation */
    uint32_t cls;    /* interned metadata class id (index, in-flight) */
    uint32_t key_len;
    uint16_t flags;
    uint16_t pid; /* placement id requested at put time (in-flight), 0 = none */
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
    char *cur;                   /* bump region of the newest slab */
    size_t left;
    void *slabs;       /* slab list, linked through each slab's first 16 bytes */
    size_t slab_bytes; /* bytes held in slabs (for rb_idx_mem_bytes) */
} rb_pool;

typedef struct rb_idx {
    rb_ent *ents;
    uint32_t n_ents; /* used array length, live + dead */
    uint32_t cap_ents;
    uint32_t n_live;
    uint32_t first_live;   /* hint: no live record below this position */
    uint32_t hold_compact; /* while nonzero, positions never change (no compaction) */
    uint32_t epoch;        /* changes whenever positions may have (a compaction, a clear) */
    uint64_t *table;       /* low 32 bits: position + 1 (0 = empty); high 32 bits: the hash */
    uint32_t table_mask;   /* table size - 1 (size is a power of two), 0 when no table */
    rb_pool pool;
} rb_idx;

void rb_idx_init(rb_idx *ix);
void rb_idx_free(rb_idx *ix);
/* Remove every record (keeps nothing allocated). */
void rb_idx_clear(rb_idx *ix);

/* The index hash of a key: inline for keys up to RB_HASH_INLINE_MAX bytes (a wyhash-style
 * multiply-fold over 8-byte words, a few dozen instructions), XXH3 above. Only ever held in
 * memory, never stored. */
#define RB_HASH_INLINE_MAX 128u
uint32_t rb_idx_hash_long(const char *key, size_t len);

static inline uint64_t rb_hash_mix(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}
static inline uint64_t rb_hash_rd64(const char *p)
{
    uint64_t v;
    __builtin_memcpy(&v, p, 8);
    return v;
}
static inline uint64_t rb_hash_rd32(const char *p)
{
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}

static inline __attribute__((always_inline)) uint32_t rb_idx_hash(const char *key, size_t len)
{
    const uint64_t s0 = 0xa0761d6478bd642full, s1 = 0xe7037ed1a0b428dbull, s2 = 0x8ebc6af09c88c6e3ull;
    if (len > RB_HASH_INLINE_MAX)
        return rb_idx_hash_long(key, len);
    uint64_t seed = s0, a, b;
    if (len <= 16) {
        if (len >= 4) {
            size_t d = (len >> 3) << 2;
            a = (rb_hash_rd32(key) << 32) | rb_hash_rd32(key + d);
            b = (rb_hash_rd32(key + len - 4) << 32) | rb_hash_rd32(key + len - 4 - d);
        } else if (len > 0) {
            a = ((uint64_t)(uint8_t)key[0] << 16) | ((uint64_t)(uint8_t)key[len >> 1] << 8) | (uint8_t)key[len - 1];
            b = 0;
        } else {
            a = b = 0;
        }
    } else if (len <= 48) {
        seed = rb_hash_mix(rb_hash_rd64(key) ^ s1, rb_hash_rd64(key + 8) ^ seed);
        if (len > 32)
            seed = rb_hash_mix(rb_hash_rd64(key + 16) ^ s2, rb_hash_rd64(key + 24) ^ seed);
        a = rb_hash_rd64(key + len - 16);
        b = rb_hash_rd64(key + len - 8);
    } else {
        const char *q = key;
        size_t i = len;
        do {
            seed = rb_hash_mix(rb_hash_rd64(q) ^ s1, rb_hash_rd64(q + 8) ^ seed);
            q += 16;
            i -= 16;
        } while (i > 16);
        a = rb_hash_rd64(key + len - 16);
        b = rb_hash_rd64(key + len - 8);
    }
    __uint128_t r = (__uint128_t)(a ^ s1) * (b ^ seed);
    uint64_t h = rb_hash_mix((uint64_t)r ^ s0 ^ (uint64_t)len, (uint64_t)(r >> 64) ^ s1 ^ s2);
    return (uint32_t)(h ^ (h >> 32));
}

/* Append a new record (key must be absent). npos < 0: no positions. Returns the position,
 * or UINT32_MAX when out of memory. The returned record is zeroed except key fields and the
 * index's pool bits in flags (RB_ENT_POOL_MASK). */
uint32_t rb_idx_insert(rb_idx *ix, const char *key, size_t len, uint32_t hash, const int64_t *pos, int64_t npos);
/* Delete the live record at pos (frees its blob). */
void rb_idx_remove_at(rb_idx *ix, uint32_t pos);
/* Removal by table slot (from rb_idx_find_slot): a lookup followed by a delete probes the
 * table once. */
void rb_idx_remove_slot(rb_idx *ix, uint32_t tslot);
/* Make room for n live records without growing the table or the array (a bulk load). 0 or
 * -ENOMEM (nothing changed then but what already fitted). */
int rb_idx_reserve(rb_idx *ix, uint32_t n);
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
#define RB_SLOT_POS(v) ((uint32_t)(v)) /* position + 1, 0 = empty */
#define RB_SLOT_HASH(v) ((uint32_t)((v) >> 32))

/* rb_idx_find that also gives the table slot holding the record. Inline: a lookup is a few
 * dozen instructions, and a call's register saves were a good part of them. */
static inline uint32_t rb_idx_find_slot(const rb_idx *ix, const char *key, size_t len, uint32_t hash, uint32_t *tslot)
{
    if (!ix->table)
        return UINT32_MAX;
    const uint64_t *t = ix->table;
    uint32_t mask = ix->table_mask;
    for (uint32_t i = hash & mask;; i = (i + 1) & mask) {
        uint64_t v = t[i];
        if (RB_SLOT_POS(v) == 0)
            return UINT32_MAX;
        /* The record (and its key blob) is read only when the stored hash matches. */
        if (RB_SLOT_HASH(v) == hash) {
            const rb_ent *e = &ix->ents[RB_SLOT_POS(v) - 1];
            if (e->key_len == len && __builtin_memcmp(rb_ent_key(e), key, len) == 0) {
                *tslot = i;
                return RB_SLOT_POS(v) - 1;
            }
        }
    }
}

/* Bring the table line a lookup of hash starts at into the cache (bulk loads). */
static inline void rb_idx_prefetch(const rb_idx *ix, uint32_t hash)
{
    if (ix->table)
        __builtin_prefetch(&ix->table[hash & ix->table_mask], 1);
}

/* Position of the live record with this key, or UINT32_MAX. */
static inline uint32_t rb_idx_find(const rb_idx *ix, const char *key, size_t len, uint32_t hash)
{
    uint32_t tslot;
    return rb_idx_find_slot(ix, key, len, hash, &tslot);
}

/* Bytes allocated for this index (array + table + slabs + large blobs), for the memory
 * benchmark. */
size_t rb_idx_mem_bytes(const rb_idx *ix);

#endif /* RB_IDX_H */
