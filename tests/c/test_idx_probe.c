/*
 * test_idx_probe.c - the index's probe chains under forced hash collisions: every slot holds a
 * record's position and hash, so lookups, backward-shift removals (also across the table's end)
 * and rebuilds must agree with a plain reference model whatever the hashes are. Also: the hash
 * on both sides of the inline/XXH3 length boundary, and blob pool classes kept in the flags
 * (small, large and mixed blobs freed and reused), with the owner's flag bits set meanwhile.
 * Build/run: tests/core/test_idx_probe.py (or the cc line in tests/c/README with this file).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_idx.h"
#include "check.h"

enum { N = 3000 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

static int key_of(int i, char *k)
{
    /* lengths 1..300: pool blobs and malloc'd ones, inline hash and XXH3 */
    int len = 1 + (i * 37) % 300;
    for (int j = 0; j < len; j++)
        k[j] = (char)('a' + (i * 7 + j * 13) % 26);
    int n = snprintf(k, 16, "%d.", i);
    k[n] = '.';
    return len > n ? len : n + 1;
}

/* hash_mode 0: the real hash; 1: all one hash; 2: four hashes whose homes sit at the end of
 * any table of 16..2^20 slots (chains wrap around to slot 0). */
static uint32_t hash_for(int mode, const char *k, int n, int i)
{
    if (mode == 1)
        return 0xdeadbeefu;
    if (mode == 2)
        return 0xfffffffcu + (uint32_t)(i % 4);
    return rb_idx_hash(k, (size_t)n);
}

static void run(int mode)
{
    rb_idx ix;
    rb_idx_init(&ix);
    static uint8_t live[N];
    static char k[512];
    memset(live, 0, sizeof live);
    int n_live = 0;
    for (int round = 0; round < 4 * N; round++) {
        int i = (int)(rnd() % N);
        int n = key_of(i, k);
        uint32_t h = hash_for(mode, k, n, i);
        uint32_t ts;
        uint32_t p = rb_idx_find_slot(&ix, k, (size_t)n, h, &ts);
        CHECK((p != UINT32_MAX) == live[i]);
        if (p == UINT32_MAX) {
            int64_t pos[40];
            int64_t np = i % 5 == 0 ? 40 : i % 2 ? 1 : -1; /* 40 positions: a 320+ byte blob */
            for (int j = 0; j < 40; j++)
                pos[j] = i * 100 + j;
            p = rb_idx_insert(&ix, k, (size_t)n, h, pos, np);
            CHECK(p != UINT32_MAX);
            ix.ents[p].slot = (uint32_t)i;
            ix.ents[p].flags |= RB_ENT_HAS_SUM | RB_ENT_UNVERIFIED; /* owner bits beside the pool's */
            live[i] = 1;
            n_live++;
        } else {
            CHECK(ix.ents[p].slot == (uint32_t)i);
            CHECK(memcmp(rb_ent_key(&ix.ents[p]), k, (size_t)n) == 0 && rb_ent_key(&ix.ents[p])[n] == 0);
            if (i % 5 == 0)
                CHECK(rb_ent_npos(&ix.ents[p]) == 40 && rb_ent_pos(&ix.ents[p])[39] == i * 100 + 39);
            ix.ents[p].flags &= (uint16_t)~RB_ENT_UNVERIFIED;
            if (round % 2)
                rb_idx_remove_slot(&ix, ts);
            else
                rb_idx_remove_at(&ix, p);
            live[i] = 0;
            n_live--;
        }
        CHECK((int)ix.n_live == n_live);
        if (round % 997 == 0) {
            CHECK(rb_idx_maybe_compact(&ix) == 0);
            for (int q = 0; q < N; q++) {
                int m = key_of(q, k);
                uint32_t f = rb_idx_find(&ix, k, (size_t)m, hash_for(mode, k, m, q));
                CHECK((f != UINT32_MAX) == live[q]);
                if (f != UINT32_MAX)
                    CHECK(ix.ents[f].slot == (uint32_t)q && (ix.ents[f].flags & RB_ENT_HAS_SUM));
            }
        }
    }
    /* empty it: the pool keeps one slab, and a refill still works */
    for (int q = 0; q < N; q++) {
        if (!live[q])
            continue;
        int m = key_of(q, k);
        uint32_t p = rb_idx_find(&ix, k, (size_t)m, hash_for(mode, k, m, q));
        CHECK(p != UINT32_MAX);
        rb_idx_remove_at(&ix, p);
    }
    CHECK(ix.n_live == 0 && ix.n_ents == 0);
    int n = key_of(7, k);
    CHECK(rb_idx_insert(&ix, k, (size_t)n, hash_for(mode, k, n, 7), NULL, -1) == 0);
    CHECK(rb_idx_find(&ix, k, (size_t)n, hash_for(mode, k, n, 7)) == 0);
    rb_idx_free(&ix);
}

static void test_hash(void)
{
    static char buf[400];
    for (int i = 0; i < (int)sizeof buf; i++)
        buf[i] = (char)(i * 31 + 7);
    for (size_t len = 0; len < sizeof buf - 8; len++) {
        /* the same bytes at another address hash alike; one changed byte changes the hash */
        static char other[408];
        memcpy(other + 3, buf, len);
        uint32_t h = rb_idx_hash(buf, len);
        CHECK(rb_idx_hash(other + 3, len) == h);
        if (len) {
            other[3 + len / 2] ^= 1;
            CHECK(rb_idx_hash(other + 3, len) != h);
        }
        if (len > RB_HASH_INLINE_MAX)
            CHECK(h == rb_idx_hash_long(buf, len));
    }
}

int main(void)
{
    test_hash();
    for (int mode = 0; mode < 3; mode++)
        run(mode);
    printf("test_idx_probe: ok\n");
    return 0;
}
