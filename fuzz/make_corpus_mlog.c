/*
 * make_corpus_mlog.c - writes the committed seed corpus of fuzz_mlog (fuzz/corpus/mlog/):
 * valid superblocks, log groups with every record kind, bases of several shapes, raw chunk
 * streams and round-trip inputs, each prefixed with fuzz_mlog's mode byte. Deterministic.
 * Run from the repository root: make fuzz-corpus-mlog
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_mlog.h"

static const char *dir = "fuzz/corpus/mlog";

static void out(const char *name, uint8_t mode, const void *p, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(&mode, 1, 1, f) != 1 || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
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
        {.key = "raw_block_ci@0x00000000@0@00000002", .key_len = 34, .slot = 1, .size = 61440, .cls = 3,
         .flags = RB_MLOG_ENT_SUM, .checksum = 0x0123456789abcdefull, .npos = 8, .pos = pos},
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
        rb_mlog_ent x = {.key = key, .key_len = (uint32_t)kl, .slot = (uint32_t)(2 * i), .size = 8u << 20,
                         .cls = cls[i % 3].id, .npos = i % 4 ? -1 : (int64_t)(i % 16), .pos = pos};
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

int main(int argc, char **argv)
{
    if (argc > 1)
        dir = argv[1];
    superblocks();
    groups();
    base("base-empty-fix", 0, 0, 0);
    base("base-1-fix", 1, 0, 0);
    base("base-40-chunks-fix", 40, 256, 0);
    base("base-40-damaged", 40, 256, 1);
    /* mode 3: n(2) first(2) last(2) raw entry stream */
    static const uint8_t chunk1[] = {2, 0, 10, 0, 13, 0, 0x00, 0x01, 'a', 0x00, 0x00, 0x00, 0x00,
                                     0x01, 0x01, 'b', 0x02, 0x00, 0x03, 0x03, 0x01, 1, 2, 3, 4, 5, 6, 7, 8,
                                     0x03, 0x04, 0x02, 0x02, 0x05, 0x0a, 0x00};
    out("chunk-2", 3, chunk1, sizeof chunk1);
    /* mode 4: control bytes for the round trip */
    uint8_t rt[512];
    for (size_t i = 0; i < sizeof rt; i++)
        rt[i] = (uint8_t)(i * 37 + (i >> 3));
    out("roundtrip-512", 4, rt, sizeof rt);
    out("roundtrip-64", 4, rt, 64);
    return 0;
}
