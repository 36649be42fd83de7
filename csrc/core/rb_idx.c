/*
 * rb_idx.c - insertion-ordered open-addressing hash index (see rb_idx.h).
 */
#include "rb_idx.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <xxhash.h>

#define SLOT_POS RB_SLOT_POS
#define SLOT_HASH RB_SLOT_HASH
#define SLOT_MAKE(pos1, hash) ((uint64_t)(hash) << 32 | (uint32_t)(pos1))

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Slabs start small and double (each new one as large as all before it) up to SLAB_MAX, so a
 * small index - the in-flight table, the metadata classes, a cache of a few entries - holds
 * about what it uses. */
#define SLAB_MIN 1024u
#define SLAB_MAX (64u * 1024u)
#define SLAB_HDR 16u /* next-slab pointer and the slab's size: keeps chunks 16-byte aligned */

static size_t slab_size(const void *slab)
{
    return *(const size_t *)((const char *)slab + sizeof(void *));
}

static size_t blob_bytes(size_t key_len, int64_t npos)
{
    return 8 + (npos > 0 ? (size_t)npos * 8 : 0) + key_len + 1;
}

/* Pool class of an n-byte blob + 1, 0 for a malloc'd one (what RB_ENT_POOL_MASK holds). */
static unsigned pool_tag(size_t n)
{
    return n > RB_POOL_MAX ? 0 : (unsigned)((n + RB_POOL_STEP - 1) / RB_POOL_STEP);
}

static void *pool_alloc(rb_pool *pl, unsigned tag, size_t n)
{
    if (!tag)
        return malloc(n);
    unsigned k = tag - 1;
    size_t sz = (size_t)(k + 1) * RB_POOL_STEP;
    void *p = pl->free[k];
    if (p) {
        UNPOISON(p, sz);
        pl->free[k] = *(void **)p;
        return p;
    }
    if (pl->left < sz) {
        size_t bytes = pl->slab_bytes < SLAB_MIN ? SLAB_MIN : pl->slab_bytes > SLAB_MAX ? SLAB_MAX : pl->slab_bytes;
        char *slab = malloc(bytes);
        if (!slab)
            return NULL;
        *(void **)slab = pl->slabs;
        *(size_t *)(slab + sizeof(void *)) = bytes;
        pl->slabs = slab;
        pl->slab_bytes += bytes;
        /* The unused tail of the previous slab is simply abandoned (< RB_POOL_MAX bytes). */
        pl->cur = slab + SLAB_HDR;
        pl->left = bytes - SLAB_HDR;
        POISON(pl->cur, pl->left);
    }
    p = pl->cur;
    pl->cur += sz;
    pl->left -= sz;
    UNPOISON(p, sz);
    return p;
}

static void pool_free(rb_pool *pl, void *p, unsigned tag)
{
    if (!tag) {
        free(p);
        return;
    }
    unsigned k = tag - 1;
    *(void **)p = pl->free[k];
    pl->free[k] = p;
    POISON((char *)p + sizeof(void *), (size_t)(k + 1) * RB_POOL_STEP - sizeof(void *));
}

/* Every slab back to the system, except the newest one when keep_one (no live pool blob may
 * remain): an index that keeps emptying and refilling, like the in-flight table, then does not
 * allocate a slab per use. */
static void pool_release(rb_pool *pl, int keep_one)
{
    char *kept = keep_one ? pl->slabs : NULL;
    for (void *s = kept ? *(void **)kept : pl->slabs; s;) {
        void *next = *(void **)s;
        UNPOISON(s, slab_size(s));
        free(s);
        s = next;
    }
    memset(pl, 0, sizeof(*pl));
    if (kept) {
        *(void **)kept = NULL;
        pl->slabs = kept;
        pl->slab_bytes = slab_size(kept);
        pl->cur = kept + SLAB_HDR;
        pl->left = pl->slab_bytes - SLAB_HDR;
        POISON(pl->cur, pl->left);
    }
}

static void free_blob(rb_idx *ix, rb_ent *e)
{
    pool_free(&ix->pool, e->blob, (e->flags & RB_ENT_POOL_MASK) >> RB_ENT_POOL_SHIFT);
    e->blob = NULL;
}

void rb_idx_init(rb_idx *ix)
{
    memset(ix, 0, sizeof(*ix));
}

void rb_idx_clear(rb_idx *ix)
{
    for (uint32_t i = 0; i < ix->n_ents; i++)
        if (!(ix->ents[i].flags & RB_ENT_DEAD))
            free_blob(ix, &ix->ents[i]);
    free(ix->ents);
    free(ix->table);
    pool_release(&ix->pool, 0);
    uint32_t hold = ix->hold_compact; /* a reader of positions may still be walking it */
    uint32_t epoch = ix->epoch;
    rb_idx_init(ix);
    ix->hold_compact = hold;
    ix->epoch = epoch + 1;
}

void rb_idx_free(rb_idx *ix)
{
    rb_idx_clear(ix);
}

uint32_t rb_idx_hash_long(const char *key, size_t len)
{
    uint64_t h = XXH3_64bits(key, len);
    return (uint32_t)(h ^ (h >> 32));
}

/* The table's memory. A table of millions of records is probed at random: in 4 KiB pages nearly
 * every probe also misses the TLB (perf at 10M entries: most of a bulk load's insert time), so
 * tables of 4 MiB and more ask for transparent huge pages. Zeroed either way. */
#define RB_IDX_HUGE_BYTES (4u << 20)
static uint64_t *table_alloc(uint32_t size)
{
    size_t bytes = (size_t)size * sizeof(uint64_t);
    if (bytes < RB_IDX_HUGE_BYTES)
        return calloc(size, sizeof(uint64_t));
    void *p = NULL;
    if (posix_memalign(&p, 2u << 20, bytes) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint: without THP it is 4 KiB pages as before */
#endif
    memset(p, 0, bytes);
    return p;
}

static int rebuild_table(rb_idx *ix, uint32_t size)
{
    uint64_t *t = table_alloc(size);
    if (!t)
        return -ENOMEM;
    uint32_t mask = size - 1;
    for (uint32_t p = 0; p < ix->n_ents; p++) {
        if (ix->ents[p].flags & RB_ENT_DEAD)
            continue;
        uint32_t h = ix->ents[p].hash;
        uint32_t i = h & mask;
        while (t[i])
            i = (i + 1) & mask;
        t[i] = SLOT_MAKE(p + 1, h);
    }
    free(ix->table);
    ix->table = t;
    ix->table_mask = mask;
    return 0;
}

int rb_idx_reserve(rb_idx *ix, uint32_t n)
{
    if (n > UINT32_MAX / 4)
        return -ENOMEM;
    if (n < 16)
        n = 16; /* the array grows by half its size: never from fewer than 16 */
    uint32_t tsize = ix->table ? ix->table_mask + 1 : 0, want = 16;
    while (want < 2 * n)
        want *= 2;
    if (want > tsize && rebuild_table(ix, want) < 0)
        return -ENOMEM;
    if (ix->cap_ents < n) {
        rb_ent *ne = realloc(ix->ents, (size_t)n * sizeof(rb_ent));
        if (!ne)
            return -ENOMEM;
        ix->ents = ne;
        ix->cap_ents = n;
    }
    return 0;
}

int rb_idx_maybe_compact(rb_idx *ix)
{
    uint32_t dead = ix->n_ents - ix->n_live;
    if (ix->hold_compact || dead < 64 || dead < ix->n_live)
        return 0;
    ix->epoch++;
    uint32_t w = 0;
    for (uint32_t r = 0; r < ix->n_ents; r++) {
        if (ix->ents[r].flags & RB_ENT_DEAD)
            continue;
        if (w != r)
            ix->ents[w] = ix->ents[r];
        w++;
    }
    ix->n_ents = w;
    ix->first_live = 0;
    /* Shrink the array when it is mostly empty. */
    if (ix->cap_ents > 64 && w < ix->cap_ents / 4) {
        uint32_t nc = ix->cap_ents / 2;
        rb_ent *ne = realloc(ix->ents, (size_t)nc * sizeof(rb_ent));
        if (ne) {
            ix->ents = ne;
            ix->cap_ents = nc;
        }
    }
    uint32_t size = ix->table_mask + 1;
    while (size > 16 && (uint64_t)ix->n_live * 8 < size)
        size /= 2;
    return rebuild_table(ix, size);
}

/* Room for one more record: the table at most half full of live records (dead records' table
 * entries are removed, so only live ones count), the array grown after a compaction when it is
 * full. 0, or -1 when out of memory. */
static int insert_room(rb_idx *ix)
{
    uint32_t tsize = ix->table ? ix->table_mask + 1 : 0;
    if ((uint64_t)(ix->n_live + 1) * 2 > tsize) {
        uint32_t ns = tsize ? tsize * 2 : 16;
        if (rebuild_table(ix, ns) < 0)
            return -1;
    }
    if (ix->n_ents < ix->cap_ents)
        return 0;
    if (rb_idx_maybe_compact(ix) < 0)
        return -1;
    if (ix->n_ents == ix->cap_ents) {
        uint32_t nc = ix->cap_ents ? ix->cap_ents + ix->cap_ents / 2 + 1 : 16;
        rb_ent *ne = realloc(ix->ents, (size_t)nc * sizeof(rb_ent));
        if (!ne)
            return -1;
        ix->ents = ne;
        ix->cap_ents = nc;
    }
    return 0;
}

/* A record's blob (layout in rb_idx.h) holding the key and its positions, from the pool (its
 * class in *tag, 0 when malloc'd), or NULL when out of memory. */
static uint8_t *blob_new(rb_idx *ix, const char *key, size_t len, const int64_t *pos, int64_t npos, unsigned *tag)
{
    size_t np = npos > 0 ? (size_t)npos : 0;
    size_t nb = blob_bytes(len, npos);
    *tag = pool_tag(nb);
    uint8_t *blob = pool_alloc(&ix->pool, *tag, nb);
    if (!blob)
        return NULL;
    memcpy(blob, &npos, 8);
    if (np)
        memcpy(blob + 8, pos, np * 8);
    memcpy(blob + 8 + np * 8, key, len);
    blob[8 + np * 8 + len] = 0;
    return blob;
}

uint32_t rb_idx_insert(rb_idx *ix, const char *key, size_t len, uint32_t hash, const int64_t *pos, int64_t npos)
{
    if (len > UINT32_MAX - 64 || ix->n_ents == UINT32_MAX - 1)
        return UINT32_MAX;
    if (insert_room(ix) < 0)
        return UINT32_MAX;
    unsigned tag;
    uint8_t *blob = blob_new(ix, key, len, pos, npos, &tag);
    if (!blob)
        return UINT32_MAX;

    uint32_t p = ix->n_ents++;
    rb_ent *e = &ix->ents[p];
    memset(e, 0, sizeof(*e));
    e->blob = blob;
    e->hash = hash;
    e->key_len = (uint32_t)len;
    e->flags = (uint16_t)(tag << RB_ENT_POOL_SHIFT);
    uint32_t i = hash & ix->table_mask;
    while (ix->table[i])
        i = (i + 1) & ix->table_mask;
    ix->table[i] = SLOT_MAKE(p + 1, hash);
    ix->n_live++;
    return p;
}

void rb_idx_remove_at(rb_idx *ix, uint32_t pos)
{
    uint32_t mask = ix->table_mask;
    uint32_t i = ix->ents[pos].hash & mask;
    while (SLOT_POS(ix->table[i]) != pos + 1)
        i = (i + 1) & mask;
    rb_idx_remove_slot(ix, i);
}

void rb_idx_remove_slot(rb_idx *ix, uint32_t i)
{
    uint32_t mask = ix->table_mask;
    uint64_t *t = ix->table;
    rb_ent *e = &ix->ents[SLOT_POS(t[i]) - 1];
    /* Backward-shift deletion keeps probe chains intact without tombstones; a slot's home
     * comes from the hash it holds, so the shift reads no record. */
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint64_t v = t[j];
        if (SLOT_POS(v) == 0)
            break;
        uint32_t home = SLOT_HASH(v) & mask;
        /* Move v back to i if i lies cyclically in [home, j). */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t[i] = v;
            i = j;
        }
    }
    t[i] = 0;
    free_blob(ix, e);
    e->flags = RB_ENT_DEAD; /* also clears the pool class: the blob is gone */
    ix->n_live--;
    if (ix->n_live == 0) {
        /* Everything gone: start over so the array does not keep growing, and hand the
         * blob slabs back but one (large, malloc'd blobs were freed one by one). */
        ix->n_ents = 0;
        ix->first_live = 0;
        pool_release(&ix->pool, 1);
    }
}

size_t rb_idx_mem_bytes(const rb_idx *ix)
{
    size_t b =
        (size_t)ix->cap_ents * sizeof(rb_ent) + (ix->table ? ((size_t)ix->table_mask + 1) * sizeof(uint64_t) : 0);
    b += ix->pool.slab_bytes;
    for (uint32_t p = 0; p < ix->n_ents; p++) {
        const rb_ent *e = &ix->ents[p];
        if (e->flags & RB_ENT_DEAD)
            continue;
        if (!(e->flags & RB_ENT_POOL_MASK))
            b += blob_bytes(e->key_len, rb_ent_npos(e));
    }
    return b;
}
