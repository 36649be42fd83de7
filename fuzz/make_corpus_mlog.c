/*
 * make_corpus_mlog.c - writes the committed seed corpora of fuzz_mlog (fuzz/corpus/mlog/):
 * valid superblocks, log groups with every record kind (raw and deflated bodies), bases of
 * several shapes, raw chunk streams and round-trip inputs, each prefixed with fuzz_mlog's
 * mode byte; and of fuzz_mlog_read (fuzz/corpus/mlog_read/): small region images (one or two
 * superblocks, bases, a ring of groups that wraps, stale groups) after its option bytes.
 * Deterministic. Run from the repository root: make fuzz-corpus-mlog
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_mlog.h"
#include "rb_mlog_read.h"

static const char *dir = "fuzz/corpus/mlog";
static const char *dir_read = "fuzz/corpus/mlog_read";

static void out_to(const char *d, const char *name, uint8_t mode, const void *p, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", d, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(&mode, 1, 1, f) != 1 || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static void out(const char *name, uint8_t mode, const void *p, size_t n)
{
    out_to(dir, name, mode, p, n);
}

static void die(const char *what, const rb_err *err)
{
    fprintf(stderr, "%s: %s\n", what, err->msg);
    exit(1);
}

static const rb_mlog_class cls[] = {
    {.id = 0, .frag = "\"shape\":[1],\"dtype\":null,\"fmt\":\"BINARY\"", .frag_len = 39},
    {.id = 3, .frag = "", .frag_len = 0},
    {.id = 7, .frag = "x", .frag_len = 1},
};

static void superblocks(void)
{
    rb_mlog_sb s;
    memset(&s, 0, sizeof s);
    s.sb_seq = 3;
    s.generation = 0x5eed;
    s.block_align = 4096;
    s.header_bytes = 4096;
    s.slot_bytes = 65536;
    s.meta_total_bytes = 1 << 20;
    s.container_bytes = 512 << 10;
    s.data_base = 1 << 20;
    s.capacity = 16 << 20;
    s.max_slots = (uint32_t)((s.capacity - s.data_base) / s.slot_bytes);
    s.areas[0] = (rb_mlog_area){4096, (512 << 10) - 4096};
    s.areas[1] = (rb_mlog_area){(512 << 10) + 4096, 256 << 10};
    s.ring.off = (768 << 10) + 4096;
    s.ring.len = (256 << 10) - 4096;
    s.base.area = 0;
    s.base.len = 4096;
    s.base.n_entries = 3;
    s.base.n_chunks = 1;
    s.base.log_seq = 10;
    s.base.next_slot = 5;
    s.ring.start = 8192;
    s.ring.start_seq = 11;
    uint8_t b[RB_MLOG_SB_LEN];
    rb_err err;
    if (rb_mlog_sb_encode(&s, b, sizeof b, &err))
        die("superblock", &err);
    out("sb-valid", 0, b, sizeof b);
    out("sb-valid-fix", 8, b, sizeof b);
    s.block_align = 512;
    s.ring.start = 512;
    s.base.area = 1;
    s.base.len = 512;
    s.base.n_entries = s.base.n_chunks = 0;
    if (rb_mlog_sb_encode(&s, b, sizeof b, &err))
        die("superblock", &err);
    out("sb-512-empty-base-fix", 8, b, sizeof b);
}

static void groups(void)
{
    static const int64_t pos[] = {100, 101, 102, 103, -5, 7, 7, 7};
    rb_mlog_ent puts[] = {
        {.key = "raw_block_ci@0x00000000@0@00000001", .key_len = 34, .slot = 0, .size = 100, .npos = -1},
        {.key = "raw_block_ci@0x00000000@0@00000002",
         .key_len = 34,
         .slot = 1,
         .size = 61440,
         .cls = 3,
         .flags = RB_MLOG_ENT_SUM,
         .checksum = 0x0123456789abcdefull,
         .npos = 8,
         .pos = pos},
        {.key = "\0\xff", .key_len = 2, .slot = 300, .size = 1, .cls = 7, .npos = 0, .pos = pos},
    };
    rb_mlog_genc g;
    rb_mlog_genc_init(&g);
    rb_err err;
    if (rb_mlog_genc_class(&g, &cls[0], &err) || rb_mlog_genc_put(&g, &puts[0], &err) ||
        rb_mlog_genc_free_slot(&g, 7, &err) || rb_mlog_genc_put(&g, &puts[1], &err) ||
        rb_mlog_genc_class(&g, &cls[2], &err) || rb_mlog_genc_put(&g, &puts[2], &err) ||
        rb_mlog_genc_free_slot(&g, 0xffffffffu, &err))
        die("group", &err);
    const uint8_t aligns[] = {0, 9}; /* log2 */
    for (int i = 0; i < 2; i++) {
        uint64_t a = 1ull << aligns[i];
        size_t n = (size_t)rb_mlog_genc_len(&g, a);
        uint8_t *b = malloc(n + 1);
        b[0] = aligns[i];
        if (rb_mlog_genc_finish(&g, 0x5eed, 12, a, b + 1, n, &err))
            die("group", &err);
        char name[64];
        snprintf(name, sizeof name, "group-align%u", (unsigned)a);
        out(name, 1, b, n + 1);
        snprintf(name, sizeof name, "group-align%u-fix", (unsigned)a);
        out(name, 9, b, n + 1);
        free(b);
    }
    /* a group whose body deflates: many PUTs of similar keys, sealed at level 1 */
    for (uint32_t i = 0; i < 60; i++) {
        char key[64];
        int kl = snprintf(key, sizeof key, "meta-llama%%2FLlama-3.1-8B@0x%08x@0@%016llx", i % 8,
                          (unsigned long long)i * 0x9e3779b97f4a7c15ull);
        rb_mlog_ent e = {.key = key, .key_len = (uint32_t)kl, .slot = 1000 + i, .size = 8u << 20, .npos = -1};
        if (rb_mlog_genc_put(&g, &e, &err) || rb_mlog_genc_free_slot(&g, 2000 + i, &err))
            die("group", &err);
    }
    rb_buf zb = {0};
    uint8_t lg = 9;
    if (rb_buf_put(&zb, &lg, 1) || rb_mlog_genc_seal(&g, 0x5eed, 13, 512, 1, &zb, &err))
        die("group", &err);
    if (rb_get_le((uint8_t *)zb.data + 1 + 36, 4) != RB_MLOG_GROUP_DEFLATE)
        die("group: not deflated", &err);
    out("group-deflated-align512", 1, zb.data, zb.len);
    out("group-deflated-align512-fix", 9, zb.data, zb.len);
    rb_buf_free(&zb);
    rb_mlog_genc_reset(&g);
    uint8_t b[1 + 48];
    b[0] = 0;
    if (rb_mlog_genc_finish(&g, 1, 1, 1, b + 1, 48, &err))
        die("group", &err);
    out("group-empty", 1, b, sizeof b);
    rb_mlog_genc_free(&g);
}

static void base(const char *name, size_t n, uint32_t chunk_raw, int damage)
{
    rb_mlog_benc e;
    rb_mlog_benc_opts o = {.chunk_raw = chunk_raw};
    rb_err err;
    if (rb_mlog_benc_init(&e, 0x5eed, 10, (uint32_t)(2 * n + 1), cls, 3, &o, &err))
        die("base", &err);
    static const int64_t pos[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (size_t i = 0; i < n; i++) {
        char key[64];
        int kl = snprintf(key, sizeof key, "meta-llama%%2FLlama-3.1-8B@0x%08x@0@%016llx", (unsigned)(i % 8),
                          (unsigned long long)i * 0x9e3779b97f4a7c15ull);
        rb_mlog_ent x = {.key = key,
                         .key_len = (uint32_t)kl,
                         .slot = (uint32_t)(2 * i),
                         .size = 8u << 20,
                         .cls = cls[i % 3].id,
                         .npos = i % 4 ? -1 : (int64_t)(i % 16),
                         .pos = pos};
        if (i % 5 == 0) {
            x.flags = RB_MLOG_ENT_SUM;
            x.checksum = i * 0x5851f42d4c957f2dull;
        }
        if (rb_mlog_benc_add(&e, &x, &err))
            die("base", &err);
    }
    if (rb_mlog_benc_finish(&e, 512, &err))
        die("base", &err);
    if (damage && e.out.len > 200)
        e.out.data[e.out.len / 2] ^= 0x20;
    out(name, damage ? 2 : 10, e.out.data, e.out.len);
    rb_mlog_benc_free(&e);
}

/* ---- region images for fuzz_mlog_read: 32 KiB at 512-byte blocks --------------------------- */

#define R_BA 512u
#define R_MT (32u << 10)
#define R_GEN 0x5eedu

static uint64_t rstate = 42;
static uint64_t rnext(void)
{
    uint64_t z = (rstate += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct rbase {
    uint32_t n_chunks, next_slot;
    uint64_t len, n_entries, log_seq;
} rbase;

static rbase r_base(uint8_t *img, const rb_mlog_layout *l, int area, uint64_t log_seq, size_t n)
{
    rb_mlog_benc e;
    rb_mlog_benc_opts o = {.chunk_raw = 256};
    rb_err err;
    rbase rb = {.next_slot = (uint32_t)(2 * n + 1), .n_entries = n, .log_seq = log_seq};
    if (rb_mlog_benc_init(&e, R_GEN, log_seq, rb.next_slot, cls, 3, &o, &err))
        die("region base", &err);
    static const int64_t pos[] = {5, 6, 7, 8};
    for (size_t i = 0; i < n; i++) {
        char key[64];
        int kl = snprintf(key, sizeof key, "meta-llama%%2FLlama@0x%08x@0@%016llx", (unsigned)(i % 8),
                          (unsigned long long)rnext());
        rb_mlog_ent x = {.key = key,
                         .key_len = (uint32_t)kl,
                         .slot = (uint32_t)(2 * i),
                         .size = 8u << 20,
                         .cls = cls[i % 3].id,
                         .npos = i % 3 ? -1 : 4,
                         .pos = pos};
        if (rb_mlog_benc_add(&e, &x, &err))
            die("region base", &err);
    }
    if (rb_mlog_benc_finish(&e, R_BA, &err) || e.out.len > l->areas[area].len)
        die("region base", &err);
    memcpy(img + l->areas[area].off, e.out.data, e.out.len);
    rb.n_chunks = e.n_chunks;
    rb.len = e.out.len;
    rb_mlog_benc_free(&e);
    return rb;
}

static void r_sb(uint8_t *img, const rb_mlog_layout *l, int which, uint64_t sb_seq, int area, const rbase *b,
                 uint64_t start)
{
    rb_mlog_sb s;
    memset(&s, 0, sizeof s);
    s.sb_seq = sb_seq;
    s.generation = R_GEN;
    s.block_align = R_BA;
    s.header_bytes = R_BA;
    s.slot_bytes = 8 * R_BA;
    s.meta_total_bytes = R_MT;
    s.container_bytes = l->container_bytes;
    s.data_base = R_MT;
    s.max_slots = 5000;
    s.capacity = R_MT + 5000ull * s.slot_bytes;
    s.areas[0] = l->areas[0];
    s.areas[1] = l->areas[1];
    s.ring.off = l->ring.off;
    s.ring.len = l->ring.len;
    s.base.area = (uint32_t)area;
    s.base.n_chunks = b->n_chunks;
    s.base.len = b->len;
    s.base.n_entries = b->n_entries;
    s.base.log_seq = b->log_seq;
    s.base.next_slot = b->next_slot;
    s.ring.start = start;
    s.ring.start_seq = b->log_seq + 1;
    rb_err err;
    if (rb_mlog_sb_encode(&s, img + (which ? l->container_bytes : 0), R_BA, &err))
        die("region superblock", &err);
}

/* A group of nput PUTs and nfree FREEs (a CLASS first when with_cls) at ring offset at. */
static uint64_t r_group(uint8_t *img, const rb_mlog_layout *l, uint64_t at, uint64_t gen, uint64_t seq, int nput,
                        int nfree, int with_cls, int level)
{
    rb_mlog_genc g;
    rb_mlog_genc_init(&g);
    rb_err err;
    if (with_cls && rb_mlog_genc_class(&g, &cls[2], &err))
        die("region group", &err);
    for (int i = 0; i < nput; i++) {
        char key[64];
        int kl = snprintf(key, sizeof key, "meta-llama%%2FLlama@0x%08x@0@%08llx", i % 8,
                          (unsigned long long)(rnext() & 0xffffffffu));
        rb_mlog_ent x = {.key = key,
                         .key_len = (uint32_t)kl,
                         .slot = (uint32_t)(seq * 100 + (uint64_t)i),
                         .size = 8u << 20,
                         .cls = 0,
                         .npos = -1};
        if (rb_mlog_genc_put(&g, &x, &err))
            die("region group", &err);
    }
    for (int i = 0; i < nfree; i++)
        if (rb_mlog_genc_free_slot(&g, (uint32_t)(seq * 3 + (uint64_t)i), &err))
            die("region group", &err);
    rb_buf b = {0};
    if (rb_mlog_genc_seal(&g, gen, seq, R_BA, level, &b, &err) || at + b.len > l->ring.len)
        die("region group", &err);
    memcpy(img + l->ring.off + at, b.data, b.len);
    uint64_t t = b.len;
    rb_buf_free(&b);
    rb_mlog_genc_free(&g);
    return t;
}

/* Write [options][fail block][image without its trailing zeros]. */
static void r_out(const char *name, uint8_t opt, uint16_t fail_block, const uint8_t *img)
{
    size_t n = R_MT;
    while (n && img[n - 1] == 0)
        n--;
    uint8_t *b = malloc(2 + n);
    b[0] = (uint8_t)fail_block;
    b[1] = (uint8_t)(fail_block >> 8);
    memcpy(b + 2, img, n);
    out_to(dir_read, name, opt, b, 2 + n);
    free(b);
}

static void regions(void)
{
    rb_mlog_layout l;
    rb_err err;
    if (rb_mlog_layout_of(R_MT, R_BA, &l, &err))
        die("region layout", &err);
    uint8_t *img = calloc(1, R_MT);
    const uint64_t rl = l.ring.len;          /* 8 blocks */
    for (uint64_t k = 0; k < rl / R_BA; k++) /* an older lap */
        r_group(img, &l, k * R_BA, R_GEN, 1 + k, 1, 1, 0, 0);
    rbase a = r_base(img, &l, 0, 10, 40);
    r_sb(img, &l, 0, 2, 0, &a, 3 * R_BA);
    uint64_t p = 3 * R_BA;
    p += r_group(img, &l, p, R_GEN, 11, 2, 1, 0, 0);          /* block 3 */
    p += r_group(img, &l, p, R_GEN, 12, 10, 0, 0, 0);         /* blocks 4.. */
    r_group(img, &l, p, R_GEN + 1, 13, 1, 0, 0, 0);           /* another generation where 13 did not fit */
    uint64_t q = r_group(img, &l, 0, R_GEN, 13, 15, 5, 0, 1); /* deflated, at 0 */
    if (rb_get_le(img + l.ring.off + 36, 4) != RB_MLOG_GROUP_DEFLATE || q != R_BA)
        die("region group 13: not deflated into one block", &err);
    q += r_group(img, &l, q, R_GEN, 14, 0, 3, 1, 0); /* a CLASS */
    r_out("region-one-sb-fix", 1, 0, img);
    r_out("region-one-sb", 0, 0, img);
    r_out("region-one-sb-window-fix", 3, 0, img);
    r_out("region-one-sb-ioerr-ring", 5, (uint16_t)((l.ring.off) / R_BA), img);
    /* damage in the middle of the log: group 12's body, then its header (13 and 14 follow) */
    {
        uint8_t *d = malloc(R_MT);
        memcpy(d, img, R_MT);
        d[l.ring.off + 4 * R_BA + RB_MLOG_GROUP_HDR_LEN + 7] ^= 0x20;
        r_out("region-one-sb-damaged-body", 0, 0, d);
        memcpy(d, img, R_MT);
        d[l.ring.off + 4 * R_BA + 17] ^= 0x01;
        r_out("region-one-sb-damaged-header", 2, 0, d);
        free(d);
    }
    rbase b = r_base(img, &l, 1, 12, 25);
    r_sb(img, &l, 1, 3, 1, &b, 0);
    r_out("region-two-sb-fix", 1, 0, img);
    r_out("region-two-sb-window", 2, 0, img);
    r_out("region-two-sb-ioerr-sb1", 5, (uint16_t)(l.container_bytes / R_BA), img);
    r_out("region-two-sb-ioerr-base1", 5, (uint16_t)(l.areas[1].off / R_BA + 1), img);
    /* the newer superblock's base overwritten */
    memset(img + l.areas[1].off, 0, R_BA);
    r_out("region-nobase-fix", 1, 0, img);
    free(img);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        dir = argv[1];
    if (argc > 2)
        dir_read = argv[2];
    superblocks();
    groups();
    base("base-empty-fix", 0, 0, 0);
    base("base-1-fix", 1, 0, 0);
    base("base-40-chunks-fix", 40, 256, 0);
    base("base-40-damaged", 40, 256, 1);
    /* mode 3: n(2) first(2) last(2) raw entry stream */
    static const uint8_t chunk1[] = {2,    0,    10,   0,   13,   0,    0x00, 0x01, 'a',  0x00, 0x00, 0x00,
                                     0x00, 0x01, 0x01, 'b', 0x02, 0x00, 0x03, 0x03, 0x01, 1,    2,    3,
                                     4,    5,    6,    7,   8,    0x03, 0x04, 0x02, 0x02, 0x05, 0x0a, 0x00};
    out("chunk-2", 3, chunk1, sizeof chunk1);
    /* mode 4: control bytes for the round trip */
    uint8_t rt[512];
    for (size_t i = 0; i < sizeof rt; i++)
        rt[i] = (uint8_t)(i * 37 + (i >> 3));
    out("roundtrip-512", 4, rt, sizeof rt);
    out("roundtrip-64", 4, rt, 64);
    regions();
    return 0;
}
