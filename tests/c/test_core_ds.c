/*
 * test_core_ds.c - C-level tests of the core's data structures (no Python): the ordered
 * hash index (insert/find/remove/compaction under churn), the slot allocator (LIFO,
 * high-water mark, affinity pools), BLAKE2b against RFC 7693's test vector
 * and against its many-keys-at-once form, and the whole-key hash with the slot-header rule that
 * tells apart keys sharing an identity.
 * Build/run: see tests/c/README (cc ... && ./test_core_ds); exit 0 = pass.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "rb_ckpt.h"
#include "rb_core_ident.h"
#include "rb_idx.h"
#include "rb_slots.h"
#include "check.h"

static void test_idx(void)
{
    rb_idx ix;
    rb_idx_init(&ix);
    char k[32];
    enum { N = 20000 };
    for (int i = 0; i < N; i++) {
        int n = snprintf(k, sizeof k, "key-%d", i);
        int64_t pos[2] = {i, -i};
        uint32_t p = rb_idx_insert(&ix, k, (size_t)n, rb_idx_hash(k, (size_t)n), pos, i % 3 ? 2 : -1);
        CHECK(p != UINT32_MAX);
        ix.ents[p].slot = (uint32_t)i;
    }
    CHECK(ix.n_live == N);
    for (int i = 0; i < N; i += 2) { /* delete the even keys */
        int n = snprintf(k, sizeof k, "key-%d", i);
        uint32_t p = rb_idx_find(&ix, k, (size_t)n, rb_idx_hash(k, (size_t)n));
        CHECK(p != UINT32_MAX && ix.ents[p].slot == (uint32_t)i);
        rb_idx_remove_at(&ix, p);
    }
    CHECK(rb_idx_maybe_compact(&ix) == 0);
    for (int i = 0; i < N; i++) {
        int n = snprintf(k, sizeof k, "key-%d", i);
        uint32_t p = rb_idx_find(&ix, k, (size_t)n, rb_idx_hash(k, (size_t)n));
        if (i % 2 == 0) {
            CHECK(p == UINT32_MAX);
        } else {
            CHECK(p != UINT32_MAX && ix.ents[p].slot == (uint32_t)i);
            CHECK(strcmp(rb_ent_key(&ix.ents[p]), k) == 0);
            if (i % 3) {
                CHECK(rb_ent_npos(&ix.ents[p]) == 2 && rb_ent_pos(&ix.ents[p])[0] == i);
            } else {
                CHECK(rb_ent_npos(&ix.ents[p]) == -1);
            }
        }
    }
    /* insertion order survives compaction */
    int last = -1;
    for (uint32_t p = 0; p < ix.n_ents; p++) {
        if (ix.ents[p].flags & RB_ENT_DEAD)
            continue;
        CHECK((int)ix.ents[p].slot > last);
        last = (int)ix.ents[p].slot;
    }
    rb_idx_free(&ix);
}

static void test_slots(void)
{
    rb_slots s;
    CHECK(rb_slots_init(&s, 4, 0) == 0);
    CHECK(rb_slots_reset(&s, 0) == 0);
    for (uint32_t i = 0; i < 4; i++)
        CHECK(rb_slots_alloc(&s, 0) == i);
    CHECK(rb_slots_alloc(&s, 0) == RB_SLOT_NONE);
    rb_slots_release(&s, 1);
    rb_slots_release(&s, 3);
    rb_slots_release(&s, 3); /* duplicate ignored */
    rb_slots_release(&s, 9); /* out of range ignored */
    CHECK(s.n_free == 2);
    CHECK(rb_slots_alloc(&s, 0) == 3); /* LIFO */
    CHECK(rb_slots_alloc(&s, 0) == 1);
    rb_slots_free(&s);

    CHECK(rb_slots_init(&s, 8, 1) == 0);
    CHECK(rb_slots_reset(&s, 0) == 0);
    uint32_t a = rb_slots_alloc(&s, 1), b = rb_slots_alloc(&s, 7), c = rb_slots_alloc(&s, 0);
    rb_slots_release(&s, a);
    rb_slots_release(&s, b);
    rb_slots_release(&s, c);
    CHECK(rb_slots_alloc(&s, 1) == a && s.affinity_hits == 1);
    CHECK(rb_slots_alloc(&s, 9) == c && s.affinity_fallbacks == 1); /* most recently freed */
    CHECK(rb_slots_alloc(&s, 7) == b && s.affinity_hits == 2);
    rb_slots_free(&s);
}

/* Extents of 4 slots from slot 2 on a 16-slot allocator: slots 2..13, three extents. */
static void test_extents(void)
{
    rb_slots s;
    CHECK(rb_slots_init(&s, 16, 0) == 0);
    CHECK(rb_ext_init(&s, 4, 2, 1) == 0 && s.ext.n == 3 && s.ext.n_clean == 3);
    CHECK(rb_slots_reset(&s, 0) == 0);
    for (uint32_t i = 0; i < 12; i++)
        CHECK(rb_slots_alloc(&s, 0) == 2 + i);                         /* in order, extent by extent */
    CHECK(rb_slots_alloc(&s, 0) == RB_SLOT_NONE && s.next_slot == 16); /* nothing past the last extent */
    for (uint32_t x = 2; x < 6; x++)
        rb_slots_release(&s, x); /* extent 0 wholly free: waits for its deallocation */
    CHECK(s.ext.n_pending == 1 && s.ext.n_clean == 0);
    rb_slots_release(&s, 7);
    rb_slots_release(&s, 12);
    rb_slots_release(&s, 13);
    CHECK(rb_slots_alloc(&s, 0) == 12); /* no clean extent: the emptiest (extent 2) */
    CHECK(rb_slots_alloc(&s, 0) == 13);
    CHECK(rb_slots_alloc(&s, 0) == 7 && s.ext.fallbacks == 2);
    uint32_t e = rb_ext_take_pending(&s);
    CHECK(e == 0 && s.ext.n_pending == 0);
    rb_ext_clean(&s, e, 1);
    CHECK(s.ext.deallocated == 1 && rb_slots_alloc(&s, 0) == 2);
    rb_slots_release(&s, 2);
    CHECK(rb_slots_alloc(&s, 0) == 3); /* the open extent goes on in order */
    /* victim: the closed extent filled longest ago; a load (hit) marks the key hot and does not
     * keep its extent, a put commit does */
    rb_ext_use(&s, 8, 0, 0);  /* extent 1 filled last */
    rb_ext_use(&s, 12, 0, 1); /* extent 2 loaded after that */
    CHECK(s.ext.hot[12] == 1 && s.ext.hot[8] == 0);
    CHECK(rb_ext_victim(&s) == 2 && rb_ext_victim(&s) == 1);
    rb_slots_free(&s);
    CHECK(rb_slots_init(&s, 5, 0) == 0);
    CHECK(rb_ext_init(&s, 4, 2, 0) == -EINVAL); /* no whole extent */
    rb_slots_free(&s);
}

/* Size classes: three extents of 8 ids, classes of 2, 4 and 8 slots. An extent takes the class
 * of the put that opens it, hands out only that class's ids, and a wholly free extent loses its
 * class, so any class takes it next. */
static void test_extent_classes(void)
{
    rb_slots s;
    const uint32_t cnt[3] = {2, 4, 8};
    CHECK(rb_slots_init(&s, 24, 0) == 0);
    CHECK(rb_ext_init_classes(&s, 8, 0, 0, 3, cnt) == 0 && s.ext.n == 3 && s.ext.n_clean == 3);
    CHECK(rb_slots_reset(&s, 0) == 0 && s.n_free == 24);
    CHECK(rb_slots_alloc_sc(&s, 0, 0) == 0 && s.ext.cls[0] == 0 && s.n_free == 24 - 6 - 1);
    CHECK(rb_slots_alloc_sc(&s, 0, 2) == 8 && s.ext.cls[1] == 2); /* another class: its own extent */
    CHECK(rb_slots_alloc_sc(&s, 0, 0) == 1);
    CHECK(rb_slots_alloc_sc(&s, 0, 1) == 16 && s.ext.cls[2] == 1); /* class 0's extent is full */
    CHECK(rb_slots_alloc_sc(&s, 0, 0) == RB_SLOT_NONE);            /* no clean extent, none of its class */
    for (uint32_t i = 1; i < 8; i++)
        CHECK(rb_slots_alloc_sc(&s, 0, 2) == 8 + i);
    CHECK(rb_slots_alloc_sc(&s, 0, 2) == RB_SLOT_NONE);
    rb_slots_release(&s, 5); /* a hole of class 0's extent: never free */
    CHECK(s.is_free[5] == 0 && s.ext.nfree[0] == 0);
    rb_slots_release(&s, 0);
    rb_slots_release(&s, 1); /* extent 0 wholly free: clean, without a class */
    CHECK(s.ext.cls[0] == RB_EXT_NOCLS && s.ext.nfree[0] == 8 && s.ext.n_clean == 1);
    for (uint32_t i = 0; i < 8; i++)
        CHECK(rb_slots_alloc_sc(&s, 0, 2) == i); /* the smallest class takes every id */
    CHECK(rb_ext_victim(&s) == 1 && s.ext.cls_extents[2] == 2 && s.ext.cls_extents[1] == 1);
    rb_slots_free(&s);
    /* recovery: every id out of use, an extent given its class, the unlisted released */
    CHECK(rb_slots_init(&s, 24, 0) == 0);
    CHECK(rb_ext_init_classes(&s, 8, 0, 0, 3, cnt) == 0);
    CHECK(rb_slots_reset(&s, 24) == 0 && s.n_free == 0);
    rb_ext_set_class(&s, 1, 0);
    for (uint32_t x = 0; x < 24; x++)
        if (x != 9)
            rb_slots_release(&s, x);
    CHECK(s.n_free == 8 + 1 + 8 && s.ext.nfree[1] == 1 && s.ext.n_clean == 2); /* id 8; 10..15 holes */
    CHECK(rb_slots_alloc_sc(&s, 0, 0) == 0);                                   /* a clean extent first */
    CHECK(rb_slots_alloc_sc(&s, 0, 2) == 16 && rb_slots_alloc_sc(&s, 0, 0) == 1);
    rb_slots_free(&s);
    CHECK(rb_slots_init(&s, 24, 0) == 0);
    const uint32_t bad[2] = {4, 2};
    CHECK(rb_ext_init_classes(&s, 2, 0, 0, 2, bad) == -EINVAL); /* counts must grow */
    rb_slots_free(&s);
}

static void test_blake2b(void)
{
    /* RFC 7693 Appendix A: BLAKE2b-512("abc") */
    static const uint8_t want[8] = {0xBA, 0x80, 0xA5, 0x3F, 0x98, 0x1C, 0x4D, 0x0D};
    uint8_t out[64];
    rb_blake2b(out, 64, "abc", 3);
    CHECK(memcmp(out, want, 8) == 0);
    uint64_t id;
    CHECK(rb_key_identity(RB_NS_LEGACY, "m@1@0@ff@half", 13, &id) == 0 && id == 255);
    CHECK(rb_key_identity(RB_NS_LEGACY, "m@1@0@zz@half", 13, &id) < 0);
    CHECK(rb_key_identity(RB_NS_LEGACY, "m@1@0@ff", 8, &id) < 0);
}

/* rb_blake2b64_many over msg[0..n) against the scalar BLAKE2b of each message. */
static void check_many(const uint8_t *const *msg, const size_t *len, size_t n, uint64_t *got)
{
    rb_blake2b64_many(msg, len, n, got);
    for (size_t i = 0; i < n; i++) {
        uint8_t d[8];
        uint64_t want;
        rb_blake2b(d, 8, msg[i], len[i]);
        memcpy(&want, d, 8);
        CHECK(got[i] == want);
    }
}

/* The many-at-once digest (four one-block keys per pass with AVX2) gives, for every count and
 * mix of lengths (0 to 300 bytes: one and several blocks, the 128-byte edge), what the scalar
 * BLAKE2b gives each key alone. */
static void test_blake2b_many(void)
{
    enum { N = 301 };
    static uint8_t text[N][N];
    const uint8_t *msg[N];
    size_t len[N];
    uint64_t got[N];
    unsigned x = 12345;
    for (size_t i = 0; i < N; i++) {
        for (size_t j = 0; j < N; j++) {
            x = x * 1103515245u + 12345u;
            text[i][j] = (uint8_t)(x >> 16);
        }
        msg[i] = text[i];
    }
    for (size_t n = 0; n <= 9; n++) { /* every tail length of a pass of four */
        for (size_t i = 0; i < n; i++)
            len[i] = (i * 37 + n) % 130;
        check_many(msg, len, n, got);
    }
    for (size_t i = 0; i < N; i++)
        len[i] = (i * 7919) % N; /* lengths 0..300 in a scattered order */
    check_many(msg, len, N, got);
}

/* Two legacy keys of one chunk hash (two lmcache.tag.* tenants) have one identity and two key
 * hashes; a header written for one vouches for it and not for the other, and a header without
 * a key hash (LMCache's) vouches on the identity as before. */
static void test_key_hash(void)
{
    static const char ka[] = "m@1@0@ff@half@tenant%a", kb[] = "m@1@0@ff@half@tenant%b";
    uint64_t ia, ib;
    CHECK(rb_key_identity(RB_NS_LEGACY, ka, strlen(ka), &ia) == 0 &&
          rb_key_identity(RB_NS_LEGACY, kb, strlen(kb), &ib) == 0);
    CHECK(ia == 255 && ib == 255);
    const uint64_t ha = rb_key_hash(ka, strlen(ka)), hb = rb_key_hash(kb, strlen(kb));
    CHECK(ha == XXH3_64bits(ka, strlen(ka)) && ha != 0 && ha != hb);
    rb_slot_hdr written_a = {.identity = ia, .payload_len = 100, .key_hash = ha};
    rb_slot_want want_a = {.identity = ia, .key_hash = ha, .size = 100};
    rb_slot_want want_b = {.identity = ib, .key_hash = hb, .size = 100};
    CHECK(rb_slot_header_vouches(&written_a, &want_a));
    CHECK(!rb_slot_header_vouches(&written_a, &want_b));
    rb_slot_hdr lmcache = {.identity = ia, .payload_len = 100}; /* zeros from byte 24 */
    CHECK(rb_slot_header_vouches(&lmcache, &want_a) && rb_slot_header_vouches(&lmcache, &want_b));
    /* the identity, the length and a record's checksum still decide as before */
    want_a.size = 99;
    CHECK(!rb_slot_header_vouches(&written_a, &want_a));
    want_a.size = 100;
    want_a.has_sum = 1;
    want_a.sum = 5;
    CHECK(!rb_slot_header_vouches(&written_a, &want_a));
    written_a.has_sum = 1;
    written_a.sum = 5;
    CHECK(rb_slot_header_vouches(&written_a, &want_a));
}

/* rb_slots_mem_bytes against its documented formula (rb_slots.h), with and without extents,
 * size classes and affinity. */
static size_t mem_formula(const rb_slots *s, uint32_t n, uint32_t per, uint32_t ncls, int affinity)
{
    size_t b = (size_t)s->cap * (9 + (affinity ? 10 : 0)) + (affinity ? 8 * 65536 : 0);
    if (per) {
        size_t lists = (size_t)(ncls > 1 ? ncls + 1 : 1) * per + 3;
        b += (size_t)n * 26 + (size_t)s->max_slots * 5 + lists * 8 + (size_t)(affinity ? 65536 : 1) * ncls * 8;
    }
    return b;
}

static void test_slots_mem_bytes(void)
{
    const uint32_t cnt[3] = {2, 4, 8};
    for (int affinity = 0; affinity <= 1; affinity++) {
        for (uint32_t ncls = 0; ncls <= 3; ncls++) { /* 0: no extents */
            rb_slots s;
            CHECK(rb_slots_init(&s, 24, affinity) == 0);
            if (ncls)
                CHECK(rb_ext_init_classes(&s, 8, 0, 0, ncls, cnt + 3 - ncls) == 0 && s.ext.n == 3);
            CHECK(rb_slots_reset(&s, 24) == 0 && s.cap >= 24);
            CHECK(rb_slots_mem_bytes(&s) == mem_formula(&s, 3, ncls ? 8 : 0, ncls, affinity));
            rb_slots_free(&s);
        }
    }
}

int main(void)
{
    test_idx();
    test_slots();
    test_extents();
    test_extent_classes();
    test_slots_mem_bytes();
    test_blake2b();
    test_blake2b_many();
    test_key_hash();
    puts("test_core_ds: ok");
    return 0;
}
