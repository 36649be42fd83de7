/*
 * test_mlog.c - C-level tests of the metadata-log codec (csrc/core/rb_mlog.c): round trips of
 * superblocks, log groups (every record kind) and bases (0, 1, many entries, many chunks,
 * shared and unshared keys, binary keys, positions null / empty / many, checksums), sealed
 * groups with the body deflated or not and corruptions of that form, every
 * refusal of the decoders (magic, version, CRC, truncation at every byte, lengths past the
 * buffer, slots out of order, bad varints, amplification bounds), and a damaged base chunk
 * being reported and skipped. Build/run: `make test-c`; exit 0 = pass.
 */
#define ZLIB_CONST
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "check.h"
#include "rb_ckpt.h"
#include "rb_core.h"
#include "rb_mlog.h"

/* ---- helpers --------------------------------------------------------------------------- */

static uint64_t rng_state = 0x1234567887654321ull;
static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t crc(const void *p, size_t n)
{
    return (uint32_t)crc32(0, p, (uInt)n);
}

/* An owned copy of a decoded record or entry. */
typedef struct cp {
    int type;
    char *key;
    uint32_t key_len, slot, cls, flags, id, frag_len;
    uint64_t size, checksum;
    int64_t npos;
    int64_t *pos;
    char *frag;
} cp;

typedef struct coll {
    cp *v;
    size_t n, cap;
    int stop_at; /* return 7 from the callback at this record (-1: never) */
    rb_mlog_damage dmg[64];
    size_t n_dmg;
    size_t n_cls;
} coll;

static void coll_init(coll *c)
{
    memset(c, 0, sizeof *c);
    c->stop_at = -1;
}

static void coll_free(coll *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->v[i].key);
        free(c->v[i].pos);
        free(c->v[i].frag);
    }
    free(c->v);
    memset(c, 0, sizeof *c);
    c->stop_at = -1;
}

static void *memdup(const void *p, size_t n)
{
    void *q = malloc(n ? n : 1);
    CHECK(q);
    if (n)
        memcpy(q, p, n);
    return q;
}

static cp *coll_add(coll *c)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->v = realloc(c->v, c->cap * sizeof *c->v);
        CHECK(c->v);
    }
    cp *x = &c->v[c->n++];
    memset(x, 0, sizeof *x);
    return x;
}

static void copy_ent(cp *x, const rb_mlog_ent *e)
{
    x->key = memdup(e->key, e->key_len);
    x->key_len = e->key_len;
    x->slot = e->slot;
    x->size = e->size;
    x->cls = e->cls;
    x->flags = e->flags;
    x->checksum = e->checksum;
    x->npos = e->npos;
    x->pos = e->npos > 0 ? memdup(e->pos, (size_t)e->npos * 8) : NULL;
}

static int on_rec(void *ctx, const rb_mlog_rec *r)
{
    coll *c = ctx;
    if (c->stop_at >= 0 && (size_t)c->stop_at == c->n)
        return 7;
    cp *x = coll_add(c);
    x->type = r->type;
    if (r->type == RB_MLOG_PUT)
        copy_ent(x, &r->ent);
    else if (r->type == RB_MLOG_FREE)
        x->slot = r->slot;
    else {
        x->id = r->cls.id;
        x->frag_len = r->cls.frag_len;
        x->frag = memdup(r->cls.frag, r->cls.frag_len);
    }
    return 0;
}

static int on_ent(void *ctx, const rb_mlog_ent *e)
{
    coll *c = ctx;
    if (c->stop_at >= 0 && (size_t)c->stop_at == c->n)
        return 7;
    cp *x = coll_add(c);
    x->type = RB_MLOG_PUT;
    copy_ent(x, e);
    return 0;
}

static int on_cls(void *ctx, const rb_mlog_class *k)
{
    ((coll *)ctx)->n_cls++;
    (void)k;
    return 0;
}

static int on_dmg(void *ctx, const rb_mlog_damage *d)
{
    coll *c = ctx;
    if (c->n_dmg < 64)
        c->dmg[c->n_dmg] = *d;
    c->n_dmg++;
    return 0;
}

static int ent_eq(const cp *x, const rb_mlog_ent *e)
{
    if (x->key_len != e->key_len || memcmp(x->key, e->key, e->key_len) || x->slot != e->slot || x->size != e->size ||
        x->cls != e->cls || x->flags != e->flags || x->npos != (e->npos < 0 ? -1 : e->npos))
        return 0;
    if ((e->flags & RB_MLOG_ENT_SUM) && x->checksum != e->checksum)
        return 0;
    for (int64_t i = 0; i < e->npos; i++)
        if (x->pos[i] != e->pos[i])
            return 0;
    return 1;
}

/* ---- superblock ------------------------------------------------------------------------- */

#define MiB (1ull << 20)

static rb_mlog_sb mk_sb(void)
{
    rb_mlog_sb s;
    memset(&s, 0, sizeof s);
    s.sb_seq = 5;
    s.generation = 0xabcdef0123456789ull;
    s.block_align = 4096;
    s.header_bytes = 4096;
    s.slot_bytes = 8 * MiB + 4096;
    s.meta_total_bytes = 64 * MiB;
    s.container_bytes = 32 * MiB;
    s.data_base = 64 * MiB;
    s.max_slots = 1000;
    s.capacity = s.data_base + 1000 * s.slot_bytes + 12345;
    s.areas[0] = (rb_mlog_area){4096, 32 * MiB - 4096};
    s.areas[1] = (rb_mlog_area){32 * MiB + 4096, 16 * MiB};
    s.ring.off = 48 * MiB + 4096;
    s.ring.len = 16 * MiB - 4096;
    s.base.area = 1;
    s.base.n_chunks = 2;
    s.base.len = 8192;
    s.base.n_entries = 10;
    s.base.log_seq = 41;
    s.base.next_slot = 20;
    s.ring.start = 8192;
    s.ring.start_seq = 42;
    return s;
}

static void sb_fix_crc(uint8_t *b)
{
    rb_put_le(b + 252, crc(b, 252), 4);
}

static void test_sb(void)
{
    rb_err err;
    rb_mlog_sb s = mk_sb(), d;
    uint8_t b[4096];
    CHECK(rb_mlog_sb_encode(&s, b, sizeof b, &err) == 0);
    CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) == 0);
    CHECK(memcmp(&s, &d, sizeof s) == 0);
    CHECK(rb_mlog_sb_decode(b, RB_MLOG_SB_LEN, &d, &err) == 0);
    CHECK(rb_mlog_sb_base_off(&d) == s.areas[1].off);
    for (size_t i = RB_MLOG_SB_LEN; i < sizeof b; i++)
        CHECK(b[i] == 0);

    /* What LMCache's format v1 reader sees at offsets 0 and container_bytes: not its magic,
     * not its version, and payload_len 0 (each alone makes it reject the container). */
    rb_ckpt_header h;
    rb_ckpt_header_decode(b, &h);
    CHECK(memcmp(h.magic, "LMCIDX01", 8) != 0);
    CHECK(h.version != 1);
    CHECK(h.payload_len == 0);
    CHECK(strlen(RB_MLOG_SB_MAGIC) == 8);

    /* block_align 1 and 512: the superblock span and the region rules follow. */
    CHECK(rb_mlog_sb_span(1) == 256 && rb_mlog_sb_span(512) == 512 && rb_mlog_sb_span(4096) == 4096);
    rb_mlog_sb s1 = s;
    s1.block_align = 512;
    s1.areas[0].off = 512;
    s1.areas[0].len = 32 * MiB - 512;
    s1.areas[1].off = 32 * MiB + 512;
    s1.ring.start = 512;
    CHECK(rb_mlog_sb_encode(&s1, b, sizeof b, &err) == 0);
    CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) == 0 && memcmp(&s1, &d, sizeof s1) == 0);

    /* The strided layout: a 1 GiB extent holds 127 slots of 8 MiB + 4 KiB, extent 0 on the
     * first 1 GiB boundary; the stride at 224, checked against slot_bytes and max_slots. */
    rb_mlog_sb s2 = s;
    s2.extent_stride = 1024 * MiB;
    s2.max_slots = 8 * 127;
    s2.capacity = 1024 * MiB + 8 * 1024 * MiB + 12345;
    CHECK(rb_mlog_sb_encode(&s2, b, sizeof b, &err) == 0);
    CHECK(rb_get_le(b + 224, 8) == 1024 * MiB);
    CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) == 0 && memcmp(&s2, &d, sizeof s2) == 0);
    CHECK(rb_mlog_sb_slot_offset(&d, 0, 1) == 1024 * MiB);
    CHECK(rb_mlog_sb_slot_offset(&d, 126, 1) == 1024 * MiB + 126 * (8 * MiB + 4096));
    CHECK(rb_mlog_sb_slot_offset(&d, 127, 1) == 2048 * MiB);
    CHECK(rb_mlog_sb_slot_offset(&s, 3, 1) == 64 * MiB + 3 * (8 * MiB + 4096));
    const uint64_t bad_stride[] = {1024 * MiB + 100, 2 * (8 * MiB + 4096), 8 * MiB};
    for (size_t i = 0; i < sizeof bad_stride / sizeof bad_stride[0]; i++) {
        CHECK(rb_mlog_sb_encode(&s2, b, sizeof b, &err) == 0);
        rb_put_le(b + 224, bad_stride[i], 8);
        sb_fix_crc(b);
        CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) == -EBADMSG && strstr(err.msg, "extent stride"));
    }
    CHECK(rb_mlog_sb_encode(&s2, b, sizeof b, &err) == 0);
    rb_put_le(b + 224, 512 * MiB, 8); /* another stride: max_slots no longer matches */
    sb_fix_crc(b);
    CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) == -EBADMSG && strstr(err.msg, "max_slots"));

    /* Size classes at 232: the stride written though a multiple of slot_bytes, an extent of
     * the smallest class's ids, an entry's offset in its size's class. */
    rb_mlog_sb s3 = s;
    const uint64_t small = rb_sc_slot_bytes(s.slot_bytes, s.header_bytes, s.block_align, 2);
    s3.extent_stride = 64 * (8 * MiB + 4096);
    s3.size_classes = 3;
    s3.max_slots = (uint32_t)((s3.capacity - 64 * (8 * MiB + 4096)) / s3.extent_stride * (s3.extent_stride / small));
    CHECK(rb_mlog_sb_encode(&s3, b, sizeof b, &err) == 0 && rb_get_le(b + 232, 4) == 3);
    CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) == 0 && memcmp(&s3, &d, sizeof s3) == 0);
    const uint64_t per = s3.extent_stride / small, mid = rb_sc_slot_bytes(s.slot_bytes, s.header_bytes, 4096, 1);
    CHECK(rb_mlog_sb_slot_offset(&d, 2, 8 * MiB) == s3.extent_stride + 2 * (8 * MiB + 4096));
    CHECK(rb_mlog_sb_slot_offset(&d, (uint32_t)per + 2, 3 * MiB) == 2 * s3.extent_stride + 2 * mid);
    CHECK(rb_mlog_sb_slot_offset(&d, 1, 100) == s3.extent_stride + small);
    rb_put_le(b + 232, 1, 4); /* one class is written as 0 */
    sb_fix_crc(b);
    CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) == -EBADMSG && strstr(err.msg, "size_classes"));

    /* Truncation at every length, every single-bit flip. */
    CHECK(rb_mlog_sb_encode(&s, b, sizeof b, &err) == 0);
    for (size_t n = 0; n < RB_MLOG_SB_LEN; n++)
        CHECK(rb_mlog_sb_decode(b, n, &d, &err) == -EBADMSG);
    for (size_t i = 0; i < RB_MLOG_SB_LEN; i++)
        for (int bit = 0; bit < 8; bit++) {
            b[i] ^= (uint8_t)(1u << bit);
            CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) < 0);
            b[i] ^= (uint8_t)(1u << bit);
        }
    /* Bytes after the superblock are not its concern. */
    b[300] = 1;
    CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) == 0);

    /* Magic, version, length field. */
    CHECK(rb_mlog_sb_encode(&s, b, sizeof b, &err) == 0);
    memcpy(b, "LMCIDX01", 8);
    CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) == -EBADMSG && strstr(err.msg, "magic"));
    CHECK(rb_mlog_sb_encode(&s, b, sizeof b, &err) == 0);
    rb_put_le(b + 8, 3, 4);
    sb_fix_crc(b);
    CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) == -EPROTONOSUPPORT && strstr(err.msg, "version 3"));
    CHECK(err.kind == RB_ERR_VALUE && err.errnum == EPROTONOSUPPORT);
    CHECK(rb_mlog_sb_encode(&s, b, sizeof b, &err) == 0);
    b[100] ^= 1;
    CHECK(rb_mlog_sb_decode(b, sizeof b, &d, &err) == -EBADMSG && strstr(err.msg, "CRC"));

    /* Field by field, with the CRC made right: each must be refused. */
    struct {
        int off, width;
        uint64_t v;
        const char *msg;
    } mut[] = {
        {12, 4, 512, "length field"},
        {16, 4, 1, "reserved"},
        {20, 8, 1, "reserved"},
        {108, 4, 1, "reserved"},
        {180, 4, 1, "reserved"},
        {220, 4, 1, "reserved"},
        {236, 4, 1, "reserved"},
        {232, 4, 1, "size_classes"},
        {232, 4, 3, "size_classes"}, /* classes need an extent stride */
        {216, 4, 0x10000, "writer epoch"},
        {248, 4, 1, "reserved"},
        {32, 8, 0, "sequence is 0"},
        {40, 8, 0, "generation is 0"},
        {48, 8, 3000, "block_align"},
        {48, 8, 0, "block_align"},
        {48, 8, 1ull << 31, "block_align"},
        {56, 8, 100, "header_bytes"},
        {56, 8, 0, "header_bytes"},
        {64, 8, 4096, "slot_bytes"},
        {64, 8, 8 * MiB + 100, "slot_bytes"},
        {72, 8, 64 * MiB + 4096, "data_base"},
        {80, 8, 64 * MiB, "capacity"},
        {80, 8, 64 * MiB + 2000 * (8 * MiB + 4096), "max_slots"},
        {88, 8, 64 * MiB + 100, "meta_total_bytes"},
        {96, 8, 32 * MiB + 4096, "container_bytes"},
        {104, 4, 999, "max_slots"},
        {112, 8, 0, "overlaps a superblock"},
        {112, 8, 100, "block-aligned"},
        {120, 8, 32 * MiB, "overlaps a superblock"},
        {120, 8, 0, "empty"},
        {128, 8, 32 * MiB, "overlaps a superblock"},
        {128, 8, 40 * MiB, "overlaps the region"},
        {136, 8, 64 * MiB, "past the metadata region"},
        {184, 8, 40 * MiB, "overlaps the region"},
        {184, 8, 1ull << 62, "past the metadata region"},
        {192, 8, 0xFFFFFFFFFFFFF000ull, "past the metadata region"},
        {144, 4, 2, "area 2"},
        {152, 8, 0, "length 0"},
        {152, 8, 8000, "length 8000"},
        {152, 8, 32 * MiB, "past its area"},
        {148, 4, 0, "chunks cannot hold"},
        {148, 4, 11, "chunks cannot hold"},
        {160, 8, 21, "cannot fit below next_slot"},
        {176, 4, 1001, "above max_slots"},
        {200, 8, 16 * MiB - 4096, "not a block inside"},
        {200, 8, 100, "not a block inside"},
        {208, 8, 41, "does not follow"},
        {168, 8, 40, "does not follow"},
    };
    for (size_t i = 0; i < sizeof mut / sizeof mut[0]; i++) {
        CHECK(rb_mlog_sb_encode(&s, b, sizeof b, &err) == 0);
        rb_put_le(b + mut[i].off, mut[i].v, mut[i].width);
        sb_fix_crc(b);
        int rc = rb_mlog_sb_decode(b, sizeof b, &d, &err);
        if (rc != -EBADMSG || !strstr(err.msg, mut[i].msg)) {
            fprintf(stderr, "mutation %zu (offset %d): rc %d, %s\n", i, mut[i].off, rc, err.msg);
            CHECK(0);
        }
        CHECK(err.kind == RB_ERR_VALUE && err.errnum == EBADMSG);
    }
    /* The encoder refuses what the decoder would (EINVAL), and short room. */
    rb_mlog_sb t = s;
    t.ring.start_seq = 7;
    CHECK(rb_mlog_sb_encode(&t, b, sizeof b, &err) == -EINVAL && strstr(err.msg, "does not follow"));
    t = s;
    t.areas[1].off = t.areas[0].off;
    CHECK(rb_mlog_sb_encode(&t, b, sizeof b, &err) == -EINVAL && strstr(err.msg, "overlaps"));
    t = s;
    t.base.log_seq = UINT64_MAX;
    t.ring.start_seq = 0;
    CHECK(rb_mlog_sb_encode(&t, b, sizeof b, &err) == -EINVAL);
    CHECK(rb_mlog_sb_encode(&s, b, RB_MLOG_SB_LEN - 1, &err) == -EINVAL);
    /* An empty base (no entries, no chunks) is a valid state. */
    t = s;
    t.base.n_entries = 0;
    t.base.n_chunks = 0;
    CHECK(rb_mlog_sb_encode(&t, b, sizeof b, &err) == 0 && rb_mlog_sb_decode(b, sizeof b, &d, &err) == 0);
}

/* ---- log groups ------------------------------------------------------------------------- */

/* A group whose body is given as bytes (the CRCs right): for refusals of record parsing. */
static size_t raw_group(const void *body, size_t blen, uint32_t nrec, uint8_t *out, size_t cap)
{
    rb_mlog_genc g;
    rb_mlog_genc_init(&g);
    CHECK(rb_buf_put(&g.body, body, blen) == 0);
    g.n_records = nrec;
    size_t total = (size_t)rb_mlog_genc_len(&g, 1);
    CHECK(total <= cap);
    CHECK(rb_mlog_genc_finish(&g, 5, 9, 1, out, total, NULL) == 0);
    rb_mlog_genc_free(&g);
    return total;
}

static int group_refused(const void *body, size_t blen, uint32_t nrec, const char *msg)
{
    uint8_t buf[4096];
    size_t n = raw_group(body, blen, nrec, buf, sizeof buf);
    coll c;
    coll_init(&c);
    rb_err err;
    rb_mlog_group_info gi;
    int rc = rb_mlog_group_decode(buf, n, 1, 5, 9, &gi, on_rec, &c, &err);
    int ok = rc == -EBADMSG && c.n == 0 && strstr(err.msg, msg) != NULL;
    if (!ok)
        fprintf(stderr, "group refusal '%s': rc %d, %zu delivered, msg %s\n", msg, rc, c.n, err.msg);
    coll_free(&c);
    return ok;
}

static void test_group(void)
{
    rb_err err;
    static const char bin[] = {0, 1, (char)0xff, '@', 0, (char)0x80};
    int64_t many[300], ext[5] = {INT64_MIN, INT64_MAX, 0, -1, INT64_MIN};
    for (int i = 0; i < 300; i++)
        many[i] = i < 256 ? 1000 + i : (int64_t)(rnd() >> (i % 64));
    char longkey[3000];
    for (size_t i = 0; i < sizeof longkey; i++)
        longkey[i] = (char)('a' + i % 26);
    static const char frag[] = "\"shape\":[2,32,256,1024],\"dtype\":\"bfloat16\",\"fmt\":\"KV_2LTD\"";
    rb_mlog_ent puts[] = {
        {.key = "meta-llama%2FLlama-3.1-8B-Instruct@0x00000003@0@00ff",
         .key_len = 51,
         .slot = 0,
         .size = 8u << 20,
         .cls = 0,
         .npos = -1},
        {.key = bin,
         .key_len = sizeof bin,
         .slot = UINT32_MAX,
         .size = UINT64_MAX,
         .cls = UINT32_MAX,
         .flags = RB_MLOG_ENT_SUM,
         .checksum = 0x0123456789abcdefull,
         .npos = 0,
         .pos = many},
        {.key = "", .key_len = 0, .slot = 7, .size = 0, .cls = 3, .npos = 300, .pos = many},
        {.key = longkey,
         .key_len = sizeof longkey,
         .slot = 128,
         .size = 1,
         .cls = 1,
         .flags = RB_MLOG_ENT_SUM,
         .checksum = 0,
         .npos = 5,
         .pos = ext},
    };
    rb_mlog_class classes[] = {{.id = 0, .frag_len = sizeof frag - 1, .frag = frag},
                               {.id = UINT32_MAX, .frag_len = 0, .frag = ""}};
    uint32_t frees[] = {0, 1, 127, 128, 16383, 16384, UINT32_MAX};
    const uint64_t aligns[] = {1, 512, 4096};
    for (size_t ai = 0; ai < 3; ai++) {
        rb_mlog_genc g;
        rb_mlog_genc_init(&g);
        /* CLASS, PUT, FREE interleaved: 2 + 4 + 7 records */
        CHECK(rb_mlog_genc_class(&g, &classes[0], &err) == 0);
        for (size_t i = 0; i < 4; i++) {
            CHECK(rb_mlog_genc_put(&g, &puts[i], &err) == 0);
            CHECK(rb_mlog_genc_free_slot(&g, frees[i], &err) == 0);
        }
        CHECK(rb_mlog_genc_class(&g, &classes[1], &err) == 0);
        for (size_t i = 4; i < 7; i++)
            CHECK(rb_mlog_genc_free_slot(&g, frees[i], &err) == 0);
        CHECK(g.n_records == 13);
        uint64_t total = rb_mlog_genc_len(&g, aligns[ai]);
        CHECK(total % aligns[ai] == 0 && total >= RB_MLOG_GROUP_HDR_LEN + g.body.len);
        uint8_t *buf = malloc(total + 100);
        CHECK(buf);
        memset(buf, 0xee, total + 100);
        CHECK(rb_mlog_genc_finish(&g, 77, 1234, aligns[ai], buf, total - 1, &err) == -EINVAL);
        CHECK(rb_mlog_genc_finish(&g, 0, 1234, aligns[ai], buf, total, &err) == -EINVAL);
        CHECK(rb_mlog_genc_finish(&g, 77, 0, aligns[ai], buf, total, &err) == -EINVAL);
        CHECK(rb_mlog_genc_finish(&g, 77, 1234, 3, buf, total, &err) == -EINVAL);
        CHECK(rb_mlog_genc_finish(&g, 77, 1234, aligns[ai], buf, total, &err) == 0);
        for (uint64_t i = RB_MLOG_GROUP_HDR_LEN + g.body.len; i < total; i++)
            CHECK(buf[i] == 0);
        size_t used = RB_MLOG_GROUP_HDR_LEN + g.body.len;

        rb_mlog_group_info gi;
        CHECK(rb_mlog_group_head(buf, RB_MLOG_GROUP_HDR_LEN, aligns[ai], 77, 1234, &gi, &err) == 0);
        CHECK(gi.generation == 77 && gi.seq == 1234 && gi.n_records == 13 && gi.total_len == total &&
              gi.body_len == g.body.len);
        coll c;
        coll_init(&c);
        CHECK(rb_mlog_group_decode(buf, total, aligns[ai], 77, 1234, &gi, on_rec, &c, &err) == 0);
        CHECK(c.n == 13);
        CHECK(c.v[0].type == RB_MLOG_CLASS && c.v[0].id == 0 && c.v[0].frag_len == sizeof frag - 1 &&
              !memcmp(c.v[0].frag, frag, sizeof frag - 1));
        for (size_t i = 0; i < 4; i++) {
            CHECK(c.v[1 + 2 * i].type == RB_MLOG_PUT && ent_eq(&c.v[1 + 2 * i], &puts[i]));
            CHECK(c.v[2 + 2 * i].type == RB_MLOG_FREE && c.v[2 + 2 * i].slot == frees[i]);
        }
        CHECK(c.v[9].type == RB_MLOG_CLASS && c.v[9].id == UINT32_MAX && c.v[9].frag_len == 0);
        for (size_t i = 4; i < 7; i++)
            CHECK(c.v[6 + i].type == RB_MLOG_FREE && c.v[6 + i].slot == frees[i]);
        CHECK(c.v[3].npos == 0 && c.v[1].npos == -1 && c.v[5].npos == 300);
        coll_free(&c);
        /* Without a callback: validation only; without expectations: any id. */
        CHECK(rb_mlog_group_decode(buf, used, aligns[ai], 0, 0, NULL, NULL, NULL, &err) == 0);
        /* Generation or sequence not the expected one: ESTALE, and the header still reported. */
        memset(&gi, 0, sizeof gi);
        CHECK(rb_mlog_group_decode(buf, total, aligns[ai], 78, 1234, &gi, on_rec, &c, &err) == -ESTALE);
        CHECK(gi.generation == 77 && gi.total_len == total && c.n == 0 && strstr(err.msg, "generation 77"));
        CHECK(rb_mlog_group_decode(buf, total, aligns[ai], 77, 1235, &gi, on_rec, &c, &err) == -ESTALE);
        CHECK(strstr(err.msg, "sequence 1234, expected 1235") && err.errnum == ESTALE);
        /* Truncation at every length short of header + body, every bit flip inside them. */
        if (ai == 0) {
            for (size_t n = 0; n < used; n++) {
                uint8_t *t = malloc(n ? n : 1); /* exact size: ASan catches any read past it */
                memcpy(t, buf, n);
                CHECK(rb_mlog_group_decode(t, n, 1, 77, 1234, &gi, on_rec, &c, &err) == -EBADMSG);
                CHECK(c.n == 0);
                free(t);
            }
            for (size_t i = 0; i < used; i++) {
                buf[i] ^= 0x10;
                int rc = rb_mlog_group_decode(buf, used, 1, 77, 1234, &gi, on_rec, &c, &err);
                CHECK(rc == -EBADMSG || rc == -ESTALE);
                CHECK(c.n == 0);
                buf[i] ^= 0x10;
            }
        }
        free(buf);
        rb_mlog_genc_free(&g);
    }

    /* An empty group; reset keeps the buffer; a group header alone. */
    {
        rb_mlog_genc g;
        rb_mlog_genc_init(&g);
        CHECK(rb_mlog_genc_free_slot(&g, 3, &err) == 0);
        rb_mlog_genc_reset(&g);
        CHECK(g.n_records == 0 && g.body.len == 0 && rb_mlog_genc_len(&g, 4096) == 4096);
        uint8_t buf[4096];
        CHECK(rb_mlog_genc_finish(&g, 1, 1, 4096, buf, sizeof buf, &err) == 0);
        rb_mlog_group_info gi;
        coll c;
        coll_init(&c);
        CHECK(rb_mlog_group_decode(buf, sizeof buf, 4096, 1, 1, &gi, on_rec, &c, &err) == 0 && c.n == 0);
        CHECK(gi.total_len == 4096 && gi.body_len == 0);
        CHECK(rb_mlog_group_head(buf, RB_MLOG_GROUP_HDR_LEN - 1, 4096, 0, 0, &gi, &err) == -EBADMSG);
        CHECK(rb_mlog_group_head(buf, RB_MLOG_GROUP_HDR_LEN, 4095, 0, 0, &gi, &err) == -EINVAL);
        rb_mlog_genc_free(&g);
    }

    /* Header refusals with the header CRC right. */
    {
        uint8_t buf[256];
        size_t n = raw_group("\x02\x05", 2, 1, buf, sizeof buf);
        rb_mlog_group_info gi;
        uint8_t t[256];
        struct {
            int off, width;
            uint64_t v;
            const char *msg;
        } mut[] = {{0, 1, 'X', "bad magic"},
                   {36, 4, 2, "flags 0x2 have unknown bits"},
                   {36, 4, 0x00008001u, "unknown bits"},
                   {36, 4, 1, "deflated body length 2 is implausible"},
                   {8, 8, 0, "is 0"},
                   {16, 8, 0, "is 0"},
                   {24, 8, 1ull << 63, "implausible"},
                   {32, 4, 2, "cannot fit"},
                   {24, 8, 3, "truncated"}};
        for (size_t i = 0; i < sizeof mut / sizeof mut[0]; i++) {
            memcpy(t, buf, n);
            rb_put_le(t + mut[i].off, mut[i].v, mut[i].width);
            rb_put_le(t + 40, crc(t, 40), 4);
            int rc = rb_mlog_group_decode(t, n, 1, 0, 0, &gi, NULL, NULL, &err);
            if (rc != -EBADMSG || !strstr(err.msg, mut[i].msg)) {
                fprintf(stderr, "group header mutation %zu: rc %d %s\n", i, rc, err.msg);
                CHECK(0);
            }
        }
        /* Bits 16..31 are the writer epoch: any value decodes, and is reported. */
        memcpy(t, buf, n);
        rb_put_le(t + 36, 0xBEEFu << 16, 4);
        rb_put_le(t + 40, crc(t, 40), 4);
        rb_put_le(t + 44, (uint32_t)crc32(crc32(0, t, 44), t + 48, 2), 4);
        CHECK(rb_mlog_group_decode(t, n, 1, 0, 0, &gi, NULL, NULL, &err) == 0 && gi.epoch == 0xBEEF && gi.flags == 0);
        memcpy(t, buf, n);
        t[45] ^= 1; /* the group CRC itself */
        CHECK(rb_mlog_group_decode(t, n, 1, 0, 0, &gi, NULL, NULL, &err) == -EBADMSG && strstr(err.msg, "CRC"));
        memcpy(t, buf, n);
        t[41] ^= 1; /* the header CRC */
        CHECK(rb_mlog_group_decode(t, n, 1, 0, 0, &gi, NULL, NULL, &err) == -EBADMSG && strstr(err.msg, "header CRC"));
    }

    /* Records that do not parse fail the whole group, even after good ones. */
    CHECK(group_refused("\x02\x05\x09\x00", 4, 2, "type at byte 2 is unknown"));
    CHECK(group_refused("\x02\x05\x00\x00", 4, 2, "type"));
    CHECK(group_refused("\x01\x01"
                        "a"
                        "\x00\x00\x00\x00",
                        7, 2, "type of 1 bytes at byte 7 runs past"));
    CHECK(group_refused("\x01\x01"
                        "a"
                        "\x00\x00\x00\x00\x02",
                        8, 2, "record 1: slot at byte 8 runs past the end"));
    CHECK(group_refused("\x02\x05\x02", 3, 1, "1 bytes after the last record"));
    CHECK(group_refused("\x02\x80\x00", 3, 1, "is not minimal"));
    CHECK(group_refused("\x02\x80", 2, 1, "runs past the end"));
    CHECK(group_refused("\x02\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02", 11, 1, "overflows 64 bits"));
    CHECK(group_refused("\x02\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12, 1, "overflows 64 bits"));
    CHECK(group_refused("\x02\x80\x80\x80\x80\x10", 6, 1, "slot 4294967296"));
    CHECK(group_refused("\x01\x05"
                        "ab",
                        4, 1, "key of 5 bytes at byte 2 runs past"));
    CHECK(group_refused("\x01\x01"
                        "a"
                        "\x00\x00\x80\x80\x80\x80\x10\x00",
                        11, 1, "class id 4294967296"));
    CHECK(group_refused("\x01\x01"
                        "a"
                        "\x00\x00\x00\x04",
                        7, 1, "flags at byte 6 has unknown bits"));
    CHECK(group_refused("\x01\x01"
                        "a"
                        "\x00\x00\x00\x01\x01\x02",
                        9, 1, "checksum of 8 bytes"));
    CHECK(group_refused("\x01\x01"
                        "a"
                        "\x00\x00\x00\x02\x03\x02\x03",
                        10, 1, "position repeats 3"));
    CHECK(group_refused("\x01\x01"
                        "a"
                        "\x00\x00\x00\x02\x02\x02",
                        9, 1, "position repeats at byte 9 runs past"));
    CHECK(group_refused("\x01\x01"
                        "a"
                        "\x00\x00\x00\x02\x81\x80\x40\x00\x00",
                        12, 1, "position count 1048577"));
    CHECK(group_refused("\x01\x01"
                        "a"
                        "\x00\x00\x00\x02\x01",
                        8, 1, "position delta at byte 8 runs past"));
    CHECK(group_refused("\x03\x01\x05"
                        "ab",
                        5, 1, "fragment of 5 bytes"));
    CHECK(group_refused("\x03\x80\x80\x80\x80\x10\x00", 7, 1, "class id 4294967296"));
    CHECK(group_refused("\x03\x01", 2, 1, "fragment length"));
    CHECK(group_refused("\x02\x05\x01\x01"
                        "a"
                        "\x00\x00\x00\x00\x02",
                        10, 3, "record 2"));
    {
        /* A record count the body cannot hold is refused at the header. */
        uint8_t buf[256];
        size_t n = raw_group("\x02\x05", 2, 1, buf, sizeof buf);
        rb_put_le(buf + 32, 2, 4);
        rb_put_le(buf + 40, crc(buf, 40), 4);
        CHECK(rb_mlog_group_decode(buf, n, 1, 0, 0, NULL, NULL, NULL, &err) == -EBADMSG &&
              strstr(err.msg, "cannot fit"));
    }

    /* Positions: RB_MLOG_POS_MAX per record, RB_MLOG_POS_BUDGET per group, both sides. */
    {
        int64_t *pos = malloc(((size_t)RB_MLOG_POS_MAX + 1) * sizeof *pos);
        CHECK(pos);
        for (size_t i = 0; i <= RB_MLOG_POS_MAX; i++)
            pos[i] = (int64_t)i;
        rb_mlog_genc g;
        rb_mlog_genc_init(&g);
        rb_mlog_ent e = {.key = "k", .key_len = 1, .npos = (int64_t)RB_MLOG_POS_MAX + 1, .pos = pos};
        CHECK(rb_mlog_genc_put(&g, &e, &err) == -E2BIG && g.n_records == 0);
        e.npos = RB_MLOG_POS_MAX;
        for (uint32_t i = 0; i < RB_MLOG_POS_BUDGET / RB_MLOG_POS_MAX; i++)
            CHECK(rb_mlog_genc_put(&g, &e, &err) == 0);
        CHECK(rb_mlog_genc_put(&g, &e, &err) == -E2BIG && strstr(err.msg, "start another group"));
        e.npos = 0;
        CHECK(rb_mlog_genc_put(&g, &e, &err) == 0);
        uint64_t total = rb_mlog_genc_len(&g, 1);
        CHECK(total < 1024); /* a run of consecutive positions takes a few bytes */
        uint8_t buf[1024];
        CHECK(rb_mlog_genc_finish(&g, 1, 2, 1, buf, sizeof buf, &err) == 0);
        coll c;
        coll_init(&c);
        CHECK(rb_mlog_group_decode(buf, total, 1, 1, 2, NULL, on_rec, &c, &err) == 0);
        CHECK(c.n == 17 && c.v[0].npos == RB_MLOG_POS_MAX && c.v[15].pos[RB_MLOG_POS_MAX - 1] == RB_MLOG_POS_MAX - 1);
        coll_free(&c);
        /* The same 17 records with positions each: the decoder refuses the 17th. */
        uint8_t body[1024];
        size_t bl = 0;
        for (int i = 0; i < 17; i++) {
            static const uint8_t r[] = {0x01, 0x01, 'k', 0, 0, 0, 0x02, 0x80, 0x80, 0x40, 0x00, 0xff, 0xff, 0x3f};
            memcpy(body + bl, r, sizeof r); /* 2^20 positions: 0, then 2^20-1 repeats of +0 */
            bl += sizeof r;
        }
        CHECK(group_refused(body, bl, 17, "record 16: position count"));
        free(pos);
        rb_mlog_genc_free(&g);
    }
}

/* ---- sealed groups: the body deflated when that saves blocks ---------------------------- */

/* Make the header CRC and the group CRC right again after a change. */
static void group_fix(uint8_t *g)
{
    rb_put_le(g + 40, crc(g, 40), 4);
    uint64_t bl = rb_get_le(g + 24, 8);
    uint32_t c = (uint32_t)crc32(crc32(0, g, 44), g + RB_MLOG_GROUP_HDR_LEN, (uInt)bl);
    rb_put_le(g + 44, c, 4);
}

/* A group of n LMCache-like PUTs (slots 3i) and n FREEs (slots 3i+1), a CLASS first. */
static void fill_group(rb_mlog_genc *g, size_t n, int binary)
{
    static const char frag[] = "\"shape\":[2,32,256,1024],\"dtype\":\"bfloat16\",\"fmt\":\"KV_2LTD\"";
    rb_mlog_class k = {.id = 4, .frag_len = sizeof frag - 1, .frag = frag};
    rb_err err;
    CHECK(rb_mlog_genc_class(g, &k, &err) == 0);
    for (size_t i = 0; i < n; i++) {
        char key[128];
        int kl;
        if (binary) {
            kl = 64;
            for (int j = 0; j < kl; j++)
                key[j] = (char)rnd();
        } else {
            kl = snprintf(key, sizeof key, "meta-llama%%2FLlama-3.1-8B-Instruct@0x%08x@0@%016llx%016llx",
                          (unsigned)(rnd() % 8), (unsigned long long)rnd(), (unsigned long long)rnd());
        }
        int64_t pos[4] = {10, 11, 12, 13};
        rb_mlog_ent e = {.key = key,
                         .key_len = (uint32_t)kl,
                         .slot = (uint32_t)(3 * i),
                         .size = 8u << 20,
                         .cls = 4,
                         .npos = i % 3 ? -1 : 4,
                         .pos = pos};
        CHECK(rb_mlog_genc_put(g, &e, &err) == 0);
        CHECK(rb_mlog_genc_free_slot(g, (uint32_t)(3 * i + 1), &err) == 0);
    }
}

static int same_records(const coll *a, const coll *b)
{
    if (a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++) {
        const cp *x = &a->v[i], *y = &b->v[i];
        if (x->type != y->type || x->slot != y->slot || x->key_len != y->key_len ||
            (x->key_len && memcmp(x->key, y->key, x->key_len)) || x->size != y->size || x->cls != y->cls ||
            x->npos != y->npos || x->id != y->id || x->frag_len != y->frag_len ||
            (x->frag_len && memcmp(x->frag, y->frag, x->frag_len)))
            return 0;
        for (int64_t k = 0; k < x->npos; k++)
            if (x->pos[k] != y->pos[k])
                return 0;
    }
    return 1;
}

/* The group at buf[0, n) is refused with msg (any message when msg is NULL), nothing delivered. */
static int sealed_refused(const uint8_t *buf, size_t n, uint64_t align, const char *msg)
{
    uint8_t *t = malloc(n);
    CHECK(t);
    memcpy(t, buf, n);
    coll c;
    coll_init(&c);
    rb_err err;
    rb_mlog_group_info gi;
    int rc = rb_mlog_group_decode(t, n, align, 0, 0, &gi, on_rec, &c, &err);
    int ok = rc == -EBADMSG && c.n == 0 && (!msg || strstr(err.msg, msg));
    if (!ok)
        fprintf(stderr, "sealed group refusal '%s': rc %d, %zu delivered, %s\n", msg ? msg : "", rc, c.n, err.msg);
    coll_free(&c);
    free(t);
    return ok;
}

static void test_group_seal(void)
{
    rb_err err;
    const uint64_t aligns[] = {1, 512, 4096};
    for (size_t ai = 0; ai < 3; ai++) {
        const uint64_t ba = aligns[ai];
        rb_mlog_genc g;
        rb_mlog_genc_init(&g);
        fill_group(&g, 300, 0);
        /* level 0: exactly what rb_mlog_genc_finish writes, appended after what out holds */
        rb_buf out = {0};
        CHECK(rb_buf_put(&out, "prefix", 6) == 0);
        CHECK(rb_mlog_genc_seal(&g, 9, 17, ba, 0, &out, &err) == 0);
        uint64_t raw_total = rb_mlog_genc_len(&g, ba);
        CHECK(out.len == 6 + raw_total && !memcmp(out.data, "prefix", 6));
        uint8_t *fin = malloc(raw_total);
        CHECK(rb_mlog_genc_finish(&g, 9, 17, ba, fin, raw_total, &err) == 0);
        CHECK(!memcmp(out.data + 6, fin, raw_total));
        coll raw;
        coll_init(&raw);
        CHECK(rb_mlog_group_decode(fin, raw_total, ba, 9, 17, NULL, on_rec, &raw, &err) == 0 && raw.n == 601);
        /* level 1 and 9: deflated, shorter, the same records */
        for (int level = 1; level <= 9; level += 8) {
            out.len = 0;
            CHECK(rb_mlog_genc_seal(&g, 9, 17, ba, level, &out, &err) == 0);
            uint8_t *z = (uint8_t *)out.data;
            size_t zl = out.len;
            CHECK(zl % ba == 0 && zl < raw_total / 2);
            CHECK(rb_get_le(z + 36, 4) == RB_MLOG_GROUP_DEFLATE && rb_get_le(z + 32, 4) == 601);
            uint64_t stored = rb_get_le(z + 24, 8);
            CHECK(rb_get_le(z + 48, 4) == g.body.len && zl == (48 + stored + ba - 1) / ba * ba);
            for (size_t i = 48 + stored; i < zl; i++)
                CHECK(z[i] == 0);
            rb_mlog_group_info gi;
            CHECK(rb_mlog_group_head(z, 48, ba, 9, 17, &gi, &err) == 0);
            CHECK(gi.flags == RB_MLOG_GROUP_DEFLATE && gi.body_len == stored && gi.total_len == zl && gi.raw_len == 0);
            coll c;
            coll_init(&c);
            CHECK(rb_mlog_group_decode(z, zl, ba, 9, 17, &gi, on_rec, &c, &err) == 0);
            CHECK(same_records(&c, &raw) && gi.raw_len == g.body.len);
            coll_free(&c);
            /* one decoder state over many groups, raw and deflated, with a refusal between */
            rb_mlog_gdec d;
            rb_mlog_gdec_init(&d);
            for (int k = 0; k < 3; k++) {
                coll_init(&c);
                CHECK(rb_mlog_gdec_group(&d, z, zl, ba, 9, 17, NULL, on_rec, &c, &err) == 0 && same_records(&c, &raw));
                coll_free(&c);
                CHECK(rb_mlog_gdec_group(&d, z, 47 + stored, ba, 9, 17, NULL, on_rec, &c, &err) == -EBADMSG);
                coll_init(&c);
                CHECK(rb_mlog_gdec_group(&d, fin, raw_total, ba, 9, 17, NULL, on_rec, &c, &err) == 0 &&
                      same_records(&c, &raw));
                coll_free(&c);
            }
            /* a callback's stop: returned, and told apart from a refusal */
            coll_init(&c);
            c.stop_at = 3;
            CHECK(rb_mlog_gdec_group(&d, z, zl, ba, 9, 17, NULL, on_rec, &c, &err) == 7 && d.cb_rc == 7 && c.n == 3);
            coll_free(&c);
            CHECK(rb_mlog_gdec_group(&d, z, zl, ba, 9, 18, NULL, on_rec, &c, &err) == -ESTALE && d.cb_rc == 0);
            rb_mlog_gdec_free(&d);
        }
        free(fin);
        coll_free(&raw);
        rb_buf_free(&out);
        rb_mlog_genc_free(&g);
    }

    /* Deflate is kept only when it saves a block: a small group, random bytes, an empty group. */
    {
        rb_mlog_genc g;
        rb_mlog_genc_init(&g);
        fill_group(&g, 3, 0); /* about 400 bytes: one block of 4096 either way */
        rb_buf out = {0};
        CHECK(rb_mlog_genc_seal(&g, 1, 1, 4096, 6, &out, &err) == 0 && out.len == 4096 &&
              rb_get_le((uint8_t *)out.data + 36, 4) == 0);
        out.len = 0;
        CHECK(rb_mlog_genc_seal(&g, 1, 1, 1, 6, &out, &err) == 0 && rb_get_le((uint8_t *)out.data + 36, 4) == 1);
        CHECK(out.len < rb_mlog_genc_len(&g, 1));
        rb_mlog_genc_reset(&g);
        fill_group(&g, 200, 1); /* 64 random bytes a key: no block to save */
        out.len = 0;
        CHECK(rb_mlog_genc_seal(&g, 1, 1, 4096, 9, &out, &err) == 0 && rb_get_le((uint8_t *)out.data + 36, 4) == 0);
        CHECK(out.len == rb_mlog_genc_len(&g, 4096));
        rb_mlog_genc_reset(&g);
        out.len = 0;
        CHECK(rb_mlog_genc_seal(&g, 1, 1, 512, 1, &out, &err) == 0 && out.len == 512);
        CHECK(rb_mlog_group_decode((uint8_t *)out.data, out.len, 512, 1, 1, NULL, NULL, NULL, &err) == 0);
        /* refusals of the arguments; out untouched */
        out.len = 0;
        CHECK(rb_mlog_genc_seal(&g, 1, 1, 512, 10, &out, &err) == -EINVAL && out.len == 0);
        CHECK(rb_mlog_genc_seal(&g, 1, 1, 512, -1, &out, &err) == -EINVAL);
        CHECK(rb_mlog_genc_seal(&g, 0, 1, 512, 1, &out, &err) == -EINVAL);
        CHECK(rb_mlog_genc_seal(&g, 1, 0, 512, 1, &out, &err) == -EINVAL);
        CHECK(rb_mlog_genc_seal(&g, 1, 1, 500, 1, &out, &err) == -EINVAL && out.len == 0);
        rb_buf_free(&out);
        rb_mlog_genc_free(&g);
    }

    /* Corruptions of a deflated group (CRCs made right, so the checks behind them are reached). */
    {
        rb_mlog_genc g;
        rb_mlog_genc_init(&g);
        fill_group(&g, 100, 0);
        rb_buf out = {0};
        CHECK(rb_mlog_genc_seal(&g, 5, 6, 1, 1, &out, &err) == 0);
        uint8_t *z = (uint8_t *)out.data;
        size_t zl = out.len;
        CHECK(rb_get_le(z + 36, 4) == 1);
        uint64_t stored = rb_get_le(z + 24, 8), rawlen = rb_get_le(z + 48, 4);
        uint8_t *t = malloc(zl + 64);
        CHECK(t);
#define MUT(stmt, msg)                                                                                                 \
    do {                                                                                                               \
        memcpy(t, z, zl);                                                                                              \
        size_t tl = zl;                                                                                                \
        stmt;                                                                                                          \
        group_fix(t);                                                                                                  \
        CHECK(sealed_refused(t, tl, 1, msg));                                                                          \
    } while (0)
        /* the flag: unknown bits; cleared (the stream read as records); set on a raw body */
        MUT(rb_put_le(t + 36, 3, 4), "unknown bits");
        MUT(rb_put_le(t + 36, 0, 4), "log group record");
        {
            rb_buf rb = {0};
            CHECK(rb_mlog_genc_seal(&g, 5, 6, 1, 0, &rb, &err) == 0);
            uint8_t *r = malloc(rb.len);
            memcpy(r, rb.data, rb.len);
            rb_put_le(r + 36, 1, 4);
            group_fix(r);
            CHECK(sealed_refused(r, rb.len, 1, NULL));
            free(r);
            rb_buf_free(&rb);
        }
        /* the raw length: one more, one less, zero, past the maximum, past 1032:1 */
        MUT(rb_put_le(t + 48, rawlen + 1, 4), "does not inflate to its");
        MUT(rb_put_le(t + 48, rawlen - 1, 4), "does not inflate to its");
        MUT(rb_put_le(t + 48, 0, 4), "records cannot fit in 0 raw body bytes");
        MUT(rb_put_le(t + 48, (uint64_t)RB_MLOG_CHUNK_RAW_MAX + 1, 4), "implausible");
        MUT(rb_put_le(t + 48, 1032 * (stored - 4) + 1, 4), "implausible");
        /* records: one more than the raw bytes hold, one more than there are */
        MUT(rb_put_le(t + 32, rawlen / 2 + 1, 4), "cannot fit");
        MUT(rb_put_le(t + 32, 202, 4), "runs past the end");
        MUT(rb_put_le(t + 32, 200, 4), "bytes after the last record");
        /* the stream: truncated, a byte more after it, its bytes flipped */
        MUT((rb_put_le(t + 24, stored - 1, 8), tl = 48 + stored - 1), "does not inflate");
        MUT((t[48 + stored] = 0x55, rb_put_le(t + 24, stored + 1, 8), tl = 48 + stored + 1), "in left");
        MUT(rb_put_le(t + 24, 5, 8), NULL);
        /* a flipped stream bit with the CRC made right may still inflate to records that parse
         * (a literal changed for another of the same code length): refused or whole, never part */
        size_t refused = 0;
        for (size_t i = 52; i < 48 + stored; i++) {
            memcpy(t, z, zl);
            t[i] ^= (uint8_t)(1u << (i % 8));
            group_fix(t);
            coll c;
            coll_init(&c);
            int rc = rb_mlog_group_decode(t, zl, 1, 5, 6, NULL, on_rec, &c, &err);
            CHECK((rc == -EBADMSG && c.n == 0) || (rc == 0 && c.n == 201));
            refused += rc != 0;
            coll_free(&c);
        }
        CHECK(refused > (stored - 4) / 4); /* 1477 of 3048 as written */
#undef MUT
        /* every bit flip and every truncation, CRCs left as they are */
        for (size_t i = 0; i < zl; i++) {
            memcpy(t, z, zl);
            t[i] ^= (uint8_t)(1u << (i % 8));
            coll c;
            coll_init(&c);
            int rc = rb_mlog_group_decode(t, zl, 1, 5, 6, NULL, on_rec, &c, &err);
            CHECK((rc == -EBADMSG || rc == -ESTALE) && c.n == 0);
        }
        for (size_t n = 0; n < zl; n++) {
            uint8_t *x = malloc(n ? n : 1);
            memcpy(x, z, n);
            CHECK(rb_mlog_group_decode(x, n, 1, 5, 6, NULL, NULL, NULL, &err) == -EBADMSG);
            free(x);
        }
        free(t);
        rb_buf_free(&out);
        rb_mlog_genc_free(&g);
    }
}

/* ---- bases ------------------------------------------------------------------------------- */

typedef struct ents {
    rb_mlog_ent *e;
    size_t n;
    char *keys;
    int64_t *pos;
} ents;

static void ents_free(ents *s)
{
    free(s->e);
    free(s->keys);
    free(s->pos);
}

static const uint32_t cls_ids[] = {0, 3, 7};

/* n entries: mode 0 = LMCache object keys (long shared prefix), 1 = random binary keys of
 * 0..40 bytes (little or no sharing); slots ascending with gaps; mixed checksums, classes,
 * positions (null, empty, a token run, random values). */
static ents mk_ents(size_t n, int mode, uint32_t slot0)
{
    ents s;
    s.n = n;
    s.e = calloc(n ? n : 1, sizeof *s.e);
    s.keys = malloc(n * 128 + 1);
    s.pos = malloc((n * 40 + 1) * sizeof *s.pos);
    CHECK(s.e && s.keys && s.pos);
    size_t ko = 0, po = 0;
    uint32_t slot = slot0;
    for (size_t i = 0; i < n; i++) {
        rb_mlog_ent *e = &s.e[i];
        char *k = s.keys + ko;
        if (mode == 0) {
            int len = snprintf(k, 128, "meta-llama%%2FLlama-3.1-8B-Instruct@0x%08x@0@%016llx%016llx",
                               (unsigned)(rnd() % 8), (unsigned long long)rnd(), (unsigned long long)rnd());
            e->key_len = (uint32_t)len;
        } else {
            e->key_len = (uint32_t)(rnd() % 41);
            for (uint32_t j = 0; j < e->key_len; j++)
                k[j] = (char)(rnd() % 4 == 0 && i && j < s.e[i - 1].key_len ? s.e[i - 1].key[j] : (char)rnd());
        }
        e->key = k;
        ko += e->key_len;
        e->slot = slot;
        slot += 1 + (rnd() % 4 == 0 ? (uint32_t)(rnd() % 1000) : 0);
        e->size = rnd() % 3 ? 8u << 20 : rnd() >> (rnd() % 64);
        e->cls = cls_ids[rnd() % 3];
        if (rnd() % 2) {
            e->flags = RB_MLOG_ENT_SUM;
            e->checksum = rnd();
        }
        switch (rnd() % 4) {
        case 0:
            e->npos = -1;
            break;
        case 1:
            e->npos = 0;
            break;
        case 2: {
            e->npos = 1 + (int64_t)(rnd() % 20);
            int64_t st = (int64_t)(rnd() % 100000);
            for (int64_t j = 0; j < e->npos; j++)
                s.pos[po + (size_t)j] = st + j;
            e->pos = s.pos + po;
            po += (size_t)e->npos;
            break;
        }
        default:
            e->npos = 1 + (int64_t)(rnd() % 20);
            for (int64_t j = 0; j < e->npos; j++)
                s.pos[po + (size_t)j] = (int64_t)rnd() >> (rnd() % 64);
            e->pos = s.pos + po;
            po += (size_t)e->npos;
        }
    }
    return s;
}

static const char frag0[] = "\"shape\":[2,32,256,1024],\"dtype\":\"bfloat16\",\"fmt\":\"KV_2LTD\"";
static const rb_mlog_class base_cls[] = {
    {.id = 0, .frag_len = sizeof frag0 - 1, .frag = frag0},
    {.id = 3, .frag_len = 0, .frag = ""},
    {.id = 7, .frag_len = 12, .frag = "\"shape\":null"},
};

/* Encode s into a new buffer (*len bytes). consume_step > 0: take the output in pieces of
 * that many bytes while encoding (the streaming path). */
static uint8_t *encode_base(const ents *s, uint64_t gen, uint32_t next_slot, uint32_t chunk_raw, uint64_t align,
                            size_t consume_step, size_t *len, uint32_t *n_chunks)
{
    rb_err err;
    rb_mlog_benc e;
    rb_mlog_benc_opts o = {.chunk_raw = chunk_raw};
    CHECK(rb_mlog_benc_init(&e, gen, 99, next_slot, base_cls, 3, &o, &err) == 0);
    rb_buf taken = {0};
    for (size_t i = 0; i < s->n; i++) {
        if (rb_mlog_benc_add(&e, &s->e[i], &err) != 0) {
            fprintf(stderr, "add %zu: %s\n", i, err.msg);
            CHECK(0);
        }
        if (consume_step && e.out.len >= consume_step) {
            CHECK(rb_buf_put(&taken, e.out.data, consume_step) == 0);
            rb_mlog_benc_consume(&e, consume_step);
        }
    }
    CHECK(rb_mlog_benc_finish(&e, align, &err) == 0);
    CHECK(rb_mlog_benc_finish(&e, align, &err) == -EINVAL);
    CHECK(rb_mlog_benc_add(&e, &s->e[0], &err) == -EINVAL || s->n == 0);
    CHECK(rb_buf_put(&taken, e.out.data, e.out.len) == 0);
    CHECK(taken.len == e.produced && taken.len % align == 0);
    if (n_chunks)
        *n_chunks = e.n_chunks;
    rb_mlog_benc_free(&e);
    *len = taken.len;
    return (uint8_t *)taken.data;
}

/* Decode and check that exactly the entries of s come out, in order. */
static void check_decodes(const uint8_t *b, size_t len, const ents *s, uint32_t n_chunks)
{
    rb_err err;
    coll c;
    coll_init(&c);
    rb_mlog_base_cb cb = {.cls = on_cls, .ent = on_ent, .damage = on_dmg, .ctx = &c};
    rb_mlog_base_result res;
    int rc = rb_mlog_base_decode(b, len, &cb, &res, &err);
    if (rc != 0 || !res.complete)
        fprintf(stderr, "decode: rc %d complete %d dmg %zu %s / %s\n", rc, res.complete, c.n_dmg, err.msg,
                c.n_dmg ? c.dmg[0].why.msg : "");
    CHECK(rc == 0 && res.complete && res.have_end && c.n_dmg == 0 && res.chunks_bad == 0);
    CHECK(c.n_cls == 3 && c.n == s->n && res.entries == s->n && res.entries_lost == 0);
    CHECK(res.end.n_entries == s->n && res.end.n_chunks == n_chunks && res.chunks_ok == n_chunks);
    CHECK(res.len <= len && len - res.len < 4096);
    for (size_t i = 0; i < s->n; i++)
        if (!ent_eq(&c.v[i], &s->e[i])) {
            fprintf(stderr, "entry %zu differs\n", i);
            CHECK(0);
        }
    coll_free(&c);
}

/* Every delivered entry is one of s's, unchanged (a damaged base never yields a wrong entry). */
static void check_subset(const coll *c, const ents *s)
{
    size_t j = 0;
    for (size_t i = 0; i < c->n; i++) {
        while (j < s->n && s->e[j].slot < c->v[i].slot)
            j++;
        CHECK(j < s->n && ent_eq(&c->v[i], &s->e[j]));
    }
}

/* Chunk headers of a base, by walking it. */
static size_t chunks_of(const uint8_t *b, size_t len, rb_mlog_chunk *out, size_t max, rb_mlog_base_info *bi)
{
    rb_err err;
    rb_mlog_bdec d;
    rb_mlog_bdec_init(&d);
    CHECK(rb_mlog_base_open(b, len, &d, bi, NULL, &err) == 0);
    uint64_t off = bi->chunks_off;
    size_t n = 0;
    rb_mlog_base_end end;
    int rc;
    while ((rc = rb_mlog_base_at(b, len, off, bi, &out[n], &end, &err)) == 1) {
        off += RB_MLOG_CHUNK_HDR_LEN + out[n].comp_len;
        CHECK(++n < max);
    }
    CHECK(rc == 0 && end.off == off && end.n_chunks == n);
    rb_mlog_bdec_free(&d);
    return n;
}

/* A base with one chunk whose raw entry stream is given (the chunk's and the base's CRCs
 * right), for refusals of entry parsing. raw_len_claim: 0 = the real length. */
static size_t raw_base(const void *raw, size_t rlen, uint32_t n, uint32_t first, uint32_t last, uint32_t raw_len_claim,
                       uint8_t *out, size_t cap)
{
    rb_mlog_benc e;
    rb_err err;
    CHECK(rb_mlog_benc_init(&e, 5, 99, 1000, base_cls, 3, NULL, &err) == 0);
    size_t hl = e.out.len;
    CHECK(hl + 2 * RB_MLOG_CHUNK_HDR_LEN + rlen + 64 < cap);
    memcpy(out, e.out.data, hl);
    rb_mlog_benc_free(&e);
    uint8_t *h = out + hl, *c = h + RB_MLOG_CHUNK_HDR_LEN;
    z_stream z;
    memset(&z, 0, sizeof z);
    CHECK(deflateInit2(&z, 1, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    z.next_in = raw;
    z.avail_in = (uInt)rlen;
    z.next_out = c;
    z.avail_out = (uInt)(cap - hl - RB_MLOG_CHUNK_HDR_LEN - 64);
    CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
    uint32_t comp = (uint32_t)z.total_out;
    deflateEnd(&z);
    memcpy(h, RB_MLOG_CHUNK_MAGIC, 8);
    rb_put_le(h + 8, 5, 8);
    rb_put_le(h + 16, 99, 8);
    rb_put_le(h + 24, 0, 4);
    rb_put_le(h + 28, n, 4);
    rb_put_le(h + 32, raw_len_claim ? raw_len_claim : rlen, 4);
    rb_put_le(h + 36, comp, 4);
    rb_put_le(h + 40, first, 4);
    rb_put_le(h + 44, last, 4);
    rb_put_le(h + 48, 1, 4);
    rb_put_le(h + 52, crc(c, comp), 4);
    rb_put_le(h + 56, crc(h, 56), 4);
    uint8_t *t = c + comp;
    uint64_t toff = (uint64_t)(t - out);
    memcpy(t, RB_MLOG_END_MAGIC, 8);
    rb_put_le(t + 8, 5, 8);
    rb_put_le(t + 16, 99, 8);
    rb_put_le(t + 24, n ? n : 1, 8); /* an end record of a base with a chunk counts an entry at least */
    rb_put_le(t + 32, toff, 8);
    rb_put_le(t + 40, 1, 4);
    rb_put_le(t + 44, crc(t, 44), 4);
    return (size_t)toff + RB_MLOG_END_LEN;
}

/* The one chunk of raw_base(...) is refused with msg, nothing delivered, and reported. */
static int chunk_refused(const void *raw, size_t rlen, uint32_t n, uint32_t first, uint32_t last, uint32_t claim,
                         const char *msg)
{
    uint8_t buf[4096];
    size_t len = raw_base(raw, rlen, n, first, last, claim, buf, sizeof buf);
    rb_err err;
    coll c;
    coll_init(&c);
    rb_mlog_base_cb cb = {.ent = on_ent, .damage = on_dmg, .ctx = &c};
    rb_mlog_base_result res;
    int rc = rb_mlog_base_decode(buf, len, &cb, &res, &err);
    int ok = rc == 0 && c.n == 0 && c.n_dmg == 1 && res.chunks_bad == 1 && !res.complete && res.have_end &&
             strstr(c.dmg[0].why.msg, msg) != NULL;
    if (ok && c.dmg[0].n_entries >= 0) /* a chunk the chunk decoder refused: its counts are known */
        ok = c.dmg[0].index == 0 && c.dmg[0].n_entries == n && c.dmg[0].first_slot == first &&
             res.entries_lost == (int64_t)n;
    if (!ok)
        fprintf(stderr, "chunk refusal '%s': rc %d, %zu delivered, %zu damage: %s\n", msg, rc, c.n, c.n_dmg,
                c.n_dmg ? c.dmg[0].why.msg : err.msg);
    coll_free(&c);
    return ok;
}

static void test_base_roundtrip(void)
{
    struct {
        size_t n;
        int mode;
        uint32_t chunk_raw;
        uint64_t align;
        size_t consume;
    } cases[] = {
        {0, 0, 0, 4096, 0},          {1, 0, 0, 4096, 0},      {1, 1, 0, 1, 0},           {500, 0, 0, 512, 0},
        {3000, 0, 4096, 4096, 1000}, {3000, 1, 2048, 1, 777}, {20000, 0, 0, 4096, 4096}, {20000, 1, 1, 4096, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        ents s = mk_ents(cases[ci].n, cases[ci].mode, (uint32_t)(ci * 3));
        uint32_t next = s.n ? s.e[s.n - 1].slot + 1 : 0;
        size_t len;
        uint32_t nch;
        uint8_t *b = encode_base(&s, 11, next, cases[ci].chunk_raw, cases[ci].align, cases[ci].consume, &len, &nch);
        CHECK((cases[ci].n == 0) == (nch == 0));
        if (cases[ci].chunk_raw == 1)
            CHECK(nch == cases[ci].n); /* a chunk per entry */
        if (cases[ci].chunk_raw == 4096)
            CHECK(nch > 10);
        check_decodes(b, len, &s, nch);
        /* The same bytes with no streaming (consume) and the same chunking. */
        size_t len2;
        uint8_t *b2 = encode_base(&s, 11, next, cases[ci].chunk_raw, cases[ci].align, 0, &len2, NULL);
        CHECK(len2 == len && memcmp(b, b2, len) == 0);
        free(b2);
        /* Chunks decode independently: in reverse order, each with its own decoder. */
        if (nch) {
            rb_mlog_chunk *ch = malloc((nch + 1) * sizeof *ch);
            rb_mlog_base_info bi;
            CHECK(chunks_of(b, len, ch, nch + 1, &bi) == nch);
            CHECK(bi.generation == 11 && bi.log_seq == 99 && bi.next_slot == next && bi.n_classes == 3);
            size_t at = s.n;
            for (uint32_t k = nch; k-- > 0;) {
                rb_mlog_bdec d;
                rb_mlog_bdec_init(&d);
                rb_err err;
                rb_mlog_base_info bi2;
                CHECK(rb_mlog_base_open(b, len, &d, &bi2, NULL, &err) == 0);
                coll c;
                coll_init(&c);
                rb_mlog_base_cb cb = {.ent = on_ent, .ctx = &c};
                CHECK(rb_mlog_bdec_chunk(&d, b, len, &ch[k], &cb, &err) == 0);
                CHECK(c.n == ch[k].n_entries && at >= c.n);
                at -= c.n;
                for (size_t i = 0; i < c.n; i++)
                    CHECK(ent_eq(&c.v[i], &s.e[at + i]));
                CHECK(c.v[0].slot == ch[k].first_slot && c.v[c.n - 1].slot == ch[k].last_slot);
                coll_free(&c);
                rb_mlog_bdec_free(&d);
            }
            CHECK(at == 0);
            free(ch);
        }
        free(b);
        ents_free(&s);
    }

    /* Slots at the ends of the range, class ids at theirs. */
    {
        rb_mlog_class cl[] = {{.id = 0, .frag = "", .frag_len = 0}, {.id = UINT32_MAX, .frag = "x", .frag_len = 1}};
        rb_mlog_ent e[] = {{.key = "a", .key_len = 1, .slot = 0, .cls = UINT32_MAX, .npos = -1},
                           {.key = "ab", .key_len = 2, .slot = UINT32_MAX - 1, .size = UINT64_MAX, .npos = -1}};
        rb_mlog_benc enc;
        rb_err err;
        CHECK(rb_mlog_benc_init(&enc, 1, 0, UINT32_MAX, cl, 2, NULL, &err) == 0);
        CHECK(rb_mlog_benc_add(&enc, &e[0], &err) == 0 && rb_mlog_benc_add(&enc, &e[1], &err) == 0);
        CHECK(rb_mlog_benc_finish(&enc, 1, &err) == 0);
        coll c;
        coll_init(&c);
        rb_mlog_base_cb cb = {.ent = on_ent, .ctx = &c};
        rb_mlog_base_result res;
        CHECK(rb_mlog_base_decode((uint8_t *)enc.out.data, enc.out.len, &cb, &res, &err) == 0 && res.complete);
        CHECK(c.n == 2 && ent_eq(&c.v[0], &e[0]) && ent_eq(&c.v[1], &e[1]));
        coll_free(&c);
        rb_mlog_benc_free(&enc);
    }
}

static void test_base_encoder_refusals(void)
{
    rb_err err;
    rb_mlog_benc e;
    rb_mlog_class bad_order[] = {{.id = 3, .frag = "", .frag_len = 0}, {.id = 3, .frag = "", .frag_len = 0}};
    CHECK(rb_mlog_benc_init(&e, 1, 0, 10, bad_order, 2, NULL, &err) == -EINVAL && strstr(err.msg, "ascending"));
    CHECK(rb_mlog_benc_init(&e, 0, 0, 10, base_cls, 3, NULL, &err) == -EINVAL);
    rb_mlog_benc_opts o = {.level = 10};
    CHECK(rb_mlog_benc_init(&e, 1, 0, 10, base_cls, 3, &o, &err) == -EINVAL);
    o = (rb_mlog_benc_opts){.chunk_raw = RB_MLOG_CHUNK_RAW_MAX + 1};
    CHECK(rb_mlog_benc_init(&e, 1, 0, 10, base_cls, 3, &o, &err) == -EINVAL);
    CHECK(rb_mlog_benc_init(&e, 1, 0, 10, base_cls, 3, NULL, &err) == 0);
    rb_mlog_ent a = {.key = "k1", .key_len = 2, .slot = 4, .cls = 3, .npos = -1};
    rb_mlog_ent b = a;
    CHECK(rb_mlog_benc_add(&e, &a, &err) == 0);
    CHECK(rb_mlog_benc_add(&e, &b, &err) == -EINVAL && strstr(err.msg, "ascend strictly"));
    b.slot = 3;
    CHECK(rb_mlog_benc_add(&e, &b, &err) == -EINVAL && strstr(err.msg, "slot 3 after slot 4"));
    b.slot = 10;
    CHECK(rb_mlog_benc_add(&e, &b, &err) == -EINVAL && strstr(err.msg, "next_slot"));
    b.slot = 5;
    b.cls = 4;
    CHECK(rb_mlog_benc_add(&e, &b, &err) == -EINVAL && strstr(err.msg, "class 4"));
    b.cls = 7;
    b.flags = 0x8;
    CHECK(rb_mlog_benc_add(&e, &b, &err) == -EINVAL && strstr(err.msg, "flags"));
    b.flags = 0;
    b.npos = (int64_t)RB_MLOG_POS_MAX + 1;
    CHECK(rb_mlog_benc_add(&e, &b, &err) == -E2BIG);
    b.npos = -1;
    CHECK(rb_mlog_benc_add(&e, &b, &err) == 0); /* still usable after refusals */
    CHECK(rb_mlog_benc_finish(&e, 3, &err) == -EINVAL);
    CHECK(rb_mlog_benc_finish(&e, 8, &err) == 0);
    ents s = {.e = (rb_mlog_ent[]){a, b}, .n = 2};
    uint8_t *copy = malloc(e.out.len);
    memcpy(copy, e.out.data, e.out.len);
    check_decodes(copy, e.out.len, &s, 1);
    free(copy);
    rb_mlog_benc_free(&e);

    /* Positions past the per-chunk budget start a new chunk. */
    int64_t *pos = malloc((size_t)RB_MLOG_POS_MAX * sizeof *pos);
    for (size_t i = 0; i < RB_MLOG_POS_MAX; i++)
        pos[i] = (int64_t)i * 3;
    CHECK(rb_mlog_benc_init(&e, 1, 0, 100, base_cls, 3, NULL, &err) == 0);
    for (uint32_t i = 0; i < 20; i++) {
        rb_mlog_ent x = {.key = "k", .key_len = 1, .slot = i, .npos = RB_MLOG_POS_MAX, .pos = pos};
        CHECK(rb_mlog_benc_add(&e, &x, &err) == 0);
    }
    CHECK(rb_mlog_benc_finish(&e, 1, &err) == 0);
    CHECK(e.n_chunks == 2);
    coll c;
    coll_init(&c);
    rb_mlog_base_cb cb = {.ent = on_ent, .ctx = &c};
    rb_mlog_base_result res;
    CHECK(rb_mlog_base_decode((uint8_t *)e.out.data, e.out.len, &cb, &res, &err) == 0 && res.complete && c.n == 20);
    CHECK(c.v[19].npos == RB_MLOG_POS_MAX && c.v[19].pos[RB_MLOG_POS_MAX - 1] == 3 * ((int64_t)RB_MLOG_POS_MAX - 1));
    coll_free(&c);
    rb_mlog_benc_free(&e);
    free(pos);
}

static void test_base_refusals(void)
{
    rb_err err;
    ents s = mk_ents(60, 0, 10);
    uint32_t next = s.e[59].slot + 1, nch;
    size_t len;
    uint8_t *b = encode_base(&s, 11, next, 1024, 1, 0, &len, &nch);
    CHECK(nch >= 4);
    check_decodes(b, len, &s, nch);
    rb_mlog_base_info bi;
    rb_mlog_chunk ch[64];
    CHECK(chunks_of(b, len, ch, 64, &bi) == nch);
    rb_mlog_base_result res;
    coll c;
    coll_init(&c);
    rb_mlog_base_cb cb = {.cls = on_cls, .ent = on_ent, .damage = on_dmg, .ctx = &c};
    uint8_t *t = malloc(len);

    /* Header: magic, version, CRCs, flags, generation, class table. */
    memcpy(t, b, len);
    t[0] = 'X';
    CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == -EBADMSG && strstr(err.msg, "bad magic") && c.n_cls == 0);
    memcpy(t, b, len);
    rb_put_le(t + 8, 1, 4);
    rb_put_le(t + 52, crc(t, 52), 4);
    CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == -EPROTONOSUPPORT);
    memcpy(t, b, len);
    t[20] ^= 1;
    CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == -EBADMSG && strstr(err.msg, "header CRC"));
    memcpy(t, b, len);
    t[RB_MLOG_BASE_HDR_LEN + 3] ^= 1;
    CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == -EBADMSG && strstr(err.msg, "class table: CRC"));
    struct {
        int off, width;
        uint64_t v;
        const char *msg;
    } mut[] = {{12, 4, 1, "flags"},
               {16, 8, 0, "generation is 0"},
               {40, 8, 1ull << 40, "runs past the end"},
               {36, 4, 1000, "cannot fit"}};
    for (size_t i = 0; i < sizeof mut / sizeof mut[0]; i++) {
        memcpy(t, b, len);
        rb_put_le(t + mut[i].off, mut[i].v, mut[i].width);
        rb_put_le(t + 52, crc(t, 52), 4);
        CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == -EBADMSG && strstr(err.msg, mut[i].msg));
    }
    /* Class tables that do not parse (CRCs right). */
    {
        static const struct {
            const char *tab;
            size_t len;
            uint32_t n;
            const char *msg;
        } tabs[] = {{"\x03\x00\x03\x00", 4, 2, "id 3 does not follow 3"},
                    {"\x03\x00\x01\x00", 4, 2, "id 1 does not follow 3"},
                    {"\x03\x05"
                     "ab",
                     4, 1, "fragment of 5 bytes"},
                    {"\x03\x00\x00", 3, 1, "1 bytes after the last class"},
                    {"\x80\x00", 2, 1, "not minimal"}};
        for (size_t i = 0; i < sizeof tabs / sizeof tabs[0]; i++) {
            uint8_t h[128];
            memcpy(h, b, RB_MLOG_BASE_HDR_LEN);
            memcpy(h + RB_MLOG_BASE_HDR_LEN, tabs[i].tab, tabs[i].len);
            rb_put_le(h + 36, tabs[i].n, 4);
            rb_put_le(h + 40, tabs[i].len, 8);
            rb_put_le(h + 48, crc(h + RB_MLOG_BASE_HDR_LEN, tabs[i].len), 4);
            rb_put_le(h + 52, crc(h, 52), 4);
            int rc = rb_mlog_base_decode(h, RB_MLOG_BASE_HDR_LEN + tabs[i].len, &cb, &res, &err);
            if (rc != -EBADMSG || !strstr(err.msg, tabs[i].msg)) {
                fprintf(stderr, "class table %zu: rc %d %s\n", i, rc, err.msg);
                CHECK(0);
            }
        }
        CHECK(c.n_cls == 0); /* nothing delivered from a table that does not parse */
    }

    /* Truncation at every length: a refusal, or fewer entries with the loss reported; never a
     * wrong entry, never a read past the buffer (exact-size copies). */
    for (size_t n = 0; n < len; n++) {
        uint8_t *x = malloc(n ? n : 1);
        memcpy(x, b, n);
        coll_free(&c);
        coll_init(&c);
        int rc = rb_mlog_base_decode(x, n, &cb, &res, &err);
        if (n < bi.chunks_off) {
            CHECK(rc == -EBADMSG && c.n == 0);
        } else {
            CHECK(rc == 0 && !res.complete && !res.have_end && c.n_dmg >= 1 && res.entries_lost == -1);
            CHECK(c.n == res.entries && res.entries <= s.n);
            check_subset(&c, &s);
        }
        free(x);
    }
    /* Every single-byte damage: the same guarantees. */
    for (size_t i = 0; i < len; i++) {
        memcpy(t, b, len);
        t[i] ^= (uint8_t)(1u << (i % 8));
        coll_free(&c);
        coll_init(&c);
        int rc = rb_mlog_base_decode(t, len, &cb, &res, &err);
        if (i < bi.chunks_off) {
            CHECK(rc < 0 && c.n == 0);
            continue;
        }
        CHECK(rc == 0);
        check_subset(&c, &s);
        CHECK(!res.complete && c.n_dmg >= 1);
    }

    /* A damaged chunk payload: reported with its index and entry count, the rest delivered. */
    memcpy(t, b, len);
    t[ch[1].off + RB_MLOG_CHUNK_HDR_LEN + ch[1].comp_len / 2] ^= 0x40;
    coll_free(&c);
    coll_init(&c);
    CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == 0);
    CHECK(c.n_dmg == 1 && c.dmg[0].index == 1 && c.dmg[0].n_chunks == 1 && c.dmg[0].n_entries == ch[1].n_entries);
    CHECK(c.dmg[0].first_slot == ch[1].first_slot && c.dmg[0].last_slot == ch[1].last_slot);
    CHECK(c.dmg[0].off == ch[1].off && strstr(c.dmg[0].why.msg, "base chunk 1: CRC mismatch"));
    CHECK(res.entries == s.n - ch[1].n_entries && res.entries_lost == ch[1].n_entries && res.have_end &&
          !res.complete && res.chunks_ok == nch - 1 && res.chunks_bad == 1);
    check_subset(&c, &s);
    /* A damaged chunk header: found past by resync, reported with the count of chunks lost. */
    memcpy(t, b, len);
    t[ch[1].off + 30] ^= 0x01;
    coll_free(&c);
    coll_init(&c);
    CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == 0);
    CHECK(c.n_dmg == 1 && c.dmg[0].index == 1 && c.dmg[0].n_chunks == 1 && c.dmg[0].n_entries == -1);
    CHECK(c.dmg[0].off == ch[1].off && c.dmg[0].len == ch[2].off - ch[1].off);
    CHECK(strstr(c.dmg[0].why.msg, "header CRC"));
    CHECK(res.entries == s.n - ch[1].n_entries && res.entries_lost == ch[1].n_entries && res.chunks_ok == nch - 1);
    /* Two headers in a row damaged. */
    memcpy(t, b, len);
    t[ch[1].off] ^= 0x01;
    t[ch[2].off + 4] ^= 0x01;
    coll_free(&c);
    coll_init(&c);
    CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == 0);
    CHECK(c.n_dmg == 1 && c.dmg[0].index == 1 && c.dmg[0].n_chunks == 2 && strstr(c.dmg[0].why.msg, "bad magic"));
    CHECK(res.entries == s.n - ch[1].n_entries - ch[2].n_entries);
    /* The last chunk's header damaged: resync lands on the end record. */
    memcpy(t, b, len);
    t[ch[nch - 1].off + 9] ^= 0x01;
    coll_free(&c);
    coll_init(&c);
    CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == 0);
    CHECK(c.n_dmg == 1 && c.dmg[0].index == nch - 1 && c.dmg[0].n_chunks == 1 && res.have_end);
    CHECK(res.entries_lost == ch[nch - 1].n_entries);
    /* The end record damaged: everything delivered, the end reported missing. */
    memcpy(t, b, len);
    t[res.len - 8] ^= 0x01;
    coll_free(&c);
    coll_init(&c);
    CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == 0);
    CHECK(c.n == s.n && !res.have_end && !res.complete && res.entries_lost == -1 && c.n_dmg == 1);
    CHECK(c.dmg[0].index == nch && strstr(c.dmg[0].why.msg, "header CRC"));
    /* A chunk of another base (same bytes, another generation) in its place: stale, skipped. */
    {
        size_t len2;
        uint8_t *o = encode_base(&s, 12, next, 1024, 1, 0, &len2, NULL);
        CHECK(len2 == len);
        memcpy(t, b, len);
        memcpy(t + ch[1].off, o + ch[1].off, ch[2].off - ch[1].off);
        coll_free(&c);
        coll_init(&c);
        CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == 0);
        CHECK(c.n_dmg == 1 && c.dmg[0].index == 1 && strstr(c.dmg[0].why.msg, "generation 12"));
        CHECK(res.entries == s.n - ch[1].n_entries);
        free(o);
    }
    /* Chunks out of order and slots not above the previous chunk's: skipped as damaged. */
    {
        memcpy(t, b, len);
        /* chunk 2 renumbered 0, CRC right */
        rb_put_le(t + ch[2].off + 24, 0, 4);
        rb_put_le(t + ch[2].off + 56, crc(t + ch[2].off, 56), 4);
        coll_free(&c);
        coll_init(&c);
        CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == 0);
        CHECK(c.n_dmg >= 1 && strstr(c.dmg[0].why.msg, "out of order"));
        check_subset(&c, &s);
        memcpy(t, b, len);
        rb_put_le(t + ch[2].off + 40, ch[1].last_slot, 4); /* first slot = chunk 1's last */
        rb_put_le(t + ch[2].off + 56, crc(t + ch[2].off, 56), 4);
        coll_free(&c);
        coll_init(&c);
        CHECK(rb_mlog_base_decode(t, len, &cb, &res, &err) == 0);
        CHECK(c.n_dmg == 1 && c.dmg[0].index == 2 && strstr(c.dmg[0].why.msg, "is not above slot"));
        CHECK(res.entries == s.n - ch[2].n_entries);
    }
    /* A callback's nonzero return stops decoding and is returned. */
    coll_free(&c);
    coll_init(&c);
    c.stop_at = 5;
    CHECK(rb_mlog_base_decode(b, len, &cb, &res, &err) == 7 && c.n == 5);
    coll_free(&c);
    /* The superblock describing it. */
    {
        rb_mlog_sb sb = mk_sb();
        sb.generation = 11;
        sb.base.log_seq = 99;
        sb.ring.start_seq = 100;
        sb.base.next_slot = next;
        sb.base.n_entries = s.n;
        sb.base.n_chunks = nch;
        sb.base.len = (len + 4095) / 4096 * 4096;
        coll_init(&c);
        CHECK(rb_mlog_base_decode(b, len, &cb, &res, &err) == 0);
        CHECK(rb_mlog_base_matches(&sb, &res, &err) == 0);
        rb_mlog_sb sb2 = sb;
        sb2.generation = 12;
        CHECK(rb_mlog_base_matches(&sb2, &res, &err) == -EBADMSG && strstr(err.msg, "generation"));
        sb2 = sb;
        sb2.base.log_seq = 98;
        CHECK(rb_mlog_base_matches(&sb2, &res, &err) == -EBADMSG && strstr(err.msg, "log sequence"));
        sb2 = sb;
        sb2.base.n_entries--;
        CHECK(rb_mlog_base_matches(&sb2, &res, &err) == -EBADMSG && strstr(err.msg, "end record counts"));
        sb2 = sb;
        sb2.base.next_slot++;
        CHECK(rb_mlog_base_matches(&sb2, &res, &err) == -EBADMSG && strstr(err.msg, "next_slot"));
        res.have_end = 0;
        CHECK(rb_mlog_base_matches(&sb, &res, &err) == -EBADMSG && strstr(err.msg, "no end record"));
        coll_free(&c);
    }
    free(t);
    free(b);
    ents_free(&s);
}

/* Chunk streams that do not parse; each is the only chunk of a base, after a good entry where
 * it helps show that nothing of a refused chunk is delivered. */
static void test_chunk_refusals(void)
{
    /* A good entry: shared 0, suffix 1 "a", slot delta 0, size 0, class 0, flags 0. */
#define GOOD                                                                                                           \
    "\x00\x01"                                                                                                         \
    "a"                                                                                                                \
    "\x00\x00\x00\x00"
    {
        uint8_t buf[4096];
        size_t len = raw_base(GOOD "\x01\x01"
                                   "b\x02\x00\x03\x00",
                              14, 2, 10, 13, 0, buf, sizeof buf);
        coll c;
        coll_init(&c);
        rb_mlog_base_cb cb = {.ent = on_ent, .damage = on_dmg, .ctx = &c};
        rb_mlog_base_result res;
        rb_err err;
        CHECK(rb_mlog_base_decode(buf, len, &cb, &res, &err) == 0 && res.complete && c.n == 2);
        CHECK(c.v[1].slot == 13 && c.v[1].key_len == 2 && !memcmp(c.v[1].key, "ab", 2) && c.v[1].cls == 3);
        coll_free(&c);
    }
    CHECK(chunk_refused("\x01\x01"
                        "a\x00\x00\x00\x00",
                        7, 1, 10, 10, 0, "shared key length 1 at byte 1 is above 0"));
    CHECK(chunk_refused(GOOD "\x02\x01"
                             "b\x00\x00\x00\x00",
                        14, 2, 10, 11, 0, "entry 1: shared key length 2"));
    CHECK(chunk_refused("\x00\x05"
                        "abcd",
                        6, 1, 10, 10, 0, "key suffix of 5 bytes at byte 2 runs past"));
    CHECK(chunk_refused("\x00\x01"
                        "a\x01\x00\x00\x00",
                        7, 1, 10, 10, 0, "slot delta 1 at byte 4 is above 0"));
    CHECK(chunk_refused(GOOD "\x00\x01"
                             "b\x05\x00\x00\x00",
                        14, 2, 10, 12, 0, "slot 16 is past"));
    CHECK(chunk_refused(GOOD "\x00\x01"
                             "b\x00\x00\x00\x00",
                        14, 2, 10, 12, 0, "the last entry has slot 11"));
    CHECK(chunk_refused("\x00\x01"
                        "a\x00\x00\x05\x00",
                        7, 1, 10, 10, 0, "class 5 is not in the class table"));
    CHECK(chunk_refused("\x00\x01"
                        "a\x00\x00\x00\x08",
                        7, 1, 10, 10, 0, "flags at byte 6 has unknown bits"));
    CHECK(chunk_refused("\x00\x01"
                        "a\x00\x80\x00\x00\x00",
                        8, 1, 10, 10, 0, "size at byte 4 is not minimal"));
    CHECK(chunk_refused("\x00\x01"
                        "a\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x00\x00",
                        16, 1, 10, 10, 0, "overflows 64 bits"));
    CHECK(chunk_refused("\x00\x01"
                        "a\x00\x00\x00\x01\x01\x02",
                        9, 1, 10, 10, 0, "checksum of 8 bytes"));
    CHECK(chunk_refused(GOOD "\x00", 8, 1, 10, 10, 0, "1 bytes after the last entry"));
    CHECK(chunk_refused(GOOD "\x00\x01"
                             "b\x00\x00",
                        12, 2, 10, 11, 0, "entry 1: class id at byte 12 runs past"));
    CHECK(chunk_refused("\x00\x01"
                        "a\x00\x00\x00\x02\x02\x04\x05",
                        10, 1, 10, 10, 0, "position repeats 5"));
    CHECK(chunk_refused("\x00\x01"
                        "a\x00\x00\x00\x02\x81\x80\x40",
                        10, 1, 10, 10, 0, "position count 1048577"));
    CHECK(chunk_refused(GOOD, 7, 1, 10, 10, 8, "does not inflate to its 8 raw bytes"));
    CHECK(chunk_refused(GOOD GOOD, 14, 1, 10, 10, 7, "does not inflate to its 7 raw bytes"));
    /* Header plausibility (refused before the payload is looked at; resync finds the end). */
    CHECK(chunk_refused(GOOD, 7, 0, 10, 10, 0, "cannot span its slots"));
    CHECK(chunk_refused(GOOD, 7, 1, 10, 9, 0, "cannot span its slots"));
    CHECK(chunk_refused(GOOD GOOD, 14, 3, 10, 11, 0, "cannot span its slots"));
    CHECK(chunk_refused(GOOD, 7, 1, 10, 1000, 0, "cannot span its slots")); /* next_slot is 1000 */
    CHECK(chunk_refused(GOOD, 7, 2, 10, 11, 0, "raw length 7 is implausible"));
    CHECK(chunk_refused(GOOD, 7, 1, 10, 10, RB_MLOG_CHUNK_RAW_MAX + 1, "implausible"));
    CHECK(chunk_refused(GOOD, 7, 1, 10, 10, 100000, "implausible")); /* past 1032:1 */
    /* 17 entries of 2^20 positions each pass the per-chunk budget. */
    {
        uint8_t raw[17 * 16];
        size_t n = 0;
        for (int i = 0; i < 17; i++) {
            static const uint8_t e[] = {0x00, 0x01, 'k',  0x00, 0x00, 0x00, 0x02,
                                        0x80, 0x80, 0x40, 0x00, 0xff, 0xff, 0x3f};
            memcpy(raw + n, e, sizeof e); /* slot delta 0: the next slot */
            n += sizeof e;
        }
        CHECK(chunk_refused(raw, n, 17, 0, 16, 0, "entry 16: position count"));
    }
    /* Payload past the buffer, and a method other than deflate. */
    {
        uint8_t buf[4096];
        size_t len = raw_base(GOOD, 7, 1, 10, 10, 0, buf, sizeof buf);
        rb_mlog_base_info bi;
        rb_mlog_bdec d;
        rb_mlog_bdec_init(&d);
        rb_err err;
        CHECK(rb_mlog_base_open(buf, len, &d, &bi, NULL, &err) == 0);
        rb_mlog_chunk ch;
        rb_mlog_base_end end;
        CHECK(rb_mlog_base_at(buf, len, bi.chunks_off, &bi, &ch, &end, &err) == 1);
        CHECK(rb_mlog_bdec_chunk(&d, buf, bi.chunks_off + RB_MLOG_CHUNK_HDR_LEN + ch.comp_len - 1, &ch, NULL, &err) ==
                  -EBADMSG &&
              strstr(err.msg, "run past the end"));
        CHECK(rb_mlog_bdec_chunk(&d, buf, len, &ch, NULL, &err) == 0);
        uint8_t *h = buf + bi.chunks_off;
        rb_put_le(h + 48, 2, 4);
        rb_put_le(h + 56, crc(h, 56), 4);
        CHECK(rb_mlog_base_at(buf, len, bi.chunks_off, &bi, &ch, &end, &err) == -EBADMSG && strstr(err.msg, "method"));
        /* The end record's offset field must be where it is. */
        uint8_t *t = buf + len - RB_MLOG_END_LEN;
        rb_put_le(t + 32, 5, 8);
        rb_put_le(t + 44, crc(t, 44), 4);
        CHECK(rb_mlog_base_at(buf, len, len - RB_MLOG_END_LEN, &bi, &ch, &end, &err) == -EBADMSG &&
              strstr(err.msg, "says it is at byte 5"));
        CHECK(rb_mlog_base_resync(buf, len, bi.chunks_off, &bi) == len);
        rb_mlog_bdec_free(&d);
    }
#undef GOOD
}

/* The decoder's plausibility bound on chunk raw lengths holds for what deflate can do. */
static void test_deflate_ratio(void)
{
    size_t n = 64u << 20;
    uint8_t *z = calloc(1, n), *out = malloc(1 << 20);
    CHECK(z && out);
    z_stream s;
    memset(&s, 0, sizeof s);
    CHECK(deflateInit2(&s, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY) == Z_OK);
    s.next_in = z;
    s.avail_in = (uInt)n;
    s.next_out = out;
    s.avail_out = 1 << 20;
    CHECK(deflate(&s, Z_FINISH) == Z_STREAM_END);
    CHECK(n <= 1032ull * s.total_out);
    deflateEnd(&s);
    free(z);
    free(out);
}

int main(void)
{
    test_sb();
    test_group();
    test_group_seal();
    test_base_roundtrip();
    test_base_encoder_refusals();
    test_base_refusals();
    test_chunk_refusals();
    test_deflate_ratio();
    printf("test_mlog: all passed\n");
    return 0;
}
