/*
 * mlog_bench.c - size and speed of a metadata-log base (csrc/core/rb_mlog.c) for a file of
 * index keys: bytes per entry on the device (chunk headers, class table, end record and the
 * padding included) and one thread's encode / decode speed. Driven by mlog_size.py, which
 * writes the keys with the package's object key codec; runs on its own too:
 *
 *   mlog_bench KEYFILE [--pos N] [--sum] [--level L] [--chunk BYTES] [--size BYTES] [--reps R]
 *
 * KEYFILE: one key a line (the entries, in slot order: slot i holds line i). --pos N: every
 * entry has N cached positions (consecutive token positions), default null. --sum: every
 * entry has a checksum. Prints one JSON object.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rb_mlog.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct sink {
    uint64_t n, key_bytes, sum;
} sink;

static int on_ent(void *ctx, const rb_mlog_ent *e)
{
    sink *s = ctx;
    s->n++;
    s->key_bytes += e->key_len;
    s->sum += e->slot + e->size + (uint64_t)e->npos + (unsigned char)e->key[e->key_len - 1];
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s KEYFILE [--pos N] [--sum] [--level L] [--chunk BYTES] [--size BYTES] [--reps R]\n",
                argv[0]);
        return 2;
    }
    int npos = -1, with_sum = 0, level = 0, reps = 3;
    uint32_t chunk = 0;
    uint64_t size = 8u << 20;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--pos") && i + 1 < argc)
            npos = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sum"))
            with_sum = 1;
        else if (!strcmp(argv[i], "--level") && i + 1 < argc)
            level = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
            chunk = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--size") && i + 1 < argc)
            size = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long flen = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)flen + 1);
    if (!text || fread(text, 1, (size_t)flen, f) != (size_t)flen)
        return 1;
    fclose(f);
    size_t n = 0, cap = 1024;
    rb_mlog_ent *ents = malloc(cap * sizeof *ents);
    int64_t *pos = NULL;
    if (npos > 0) {
        pos = malloc((size_t)npos * sizeof *pos);
        for (int i = 0; i < npos; i++)
            pos[i] = i;
    }
    uint64_t key_bytes = 0;
    for (char *p = text, *end = text + flen; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (n == cap)
            ents = realloc(ents, (cap *= 2) * sizeof *ents);
        rb_mlog_ent *e = &ents[n];
        memset(e, 0, sizeof *e);
        e->key = p;
        e->key_len = (uint32_t)len;
        e->slot = (uint32_t)n;
        e->size = size;
        e->cls = 0;
        e->npos = npos;
        e->pos = pos;
        if (with_sum) {
            e->flags = RB_MLOG_ENT_SUM;
            e->checksum = 0x9e3779b97f4a7c15ull * (n + 1); /* stands in for an xxh3: no structure */
            e->checksum ^= e->checksum >> 29;
            e->checksum *= 0xbf58476d1ce4e5b9ull;
        }
        key_bytes += len;
        n++;
        p += len + 1;
    }
    static const char frag[] = "\"shape\":[2,32,256,1024],\"dtype\":\"bfloat16\",\"fmt\":\"KV_2LTD\"";
    rb_mlog_class cls = {.id = 0, .frag_len = sizeof frag - 1, .frag = frag};
    rb_mlog_benc_opts o = {.chunk_raw = chunk, .level = level};
    rb_err err;
    double t_enc = 1e30, t_dec = 1e30;
    uint64_t base_len = 0, raw_total = 0, chunks = 0;
    uint8_t *base = NULL;
    for (int r = 0; r < reps; r++) {
        rb_mlog_benc e;
        double t0 = now();
        if (rb_mlog_benc_init(&e, 7, 100, (uint32_t)n, &cls, 1, &o, &err) < 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        for (size_t i = 0; i < n; i++)
            if (rb_mlog_benc_add(&e, &ents[i], &err) < 0) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
        if (rb_mlog_benc_finish(&e, 4096, &err) < 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double t = now() - t0;
        if (t < t_enc)
            t_enc = t;
        chunks = e.n_chunks;
        base_len = e.out.len;
        free(base);
        base = malloc(base_len);
        memcpy(base, e.out.data, base_len);
        rb_mlog_benc_free(&e);
    }
    for (int r = 0; r < reps; r++) {
        sink s = {0, 0, 0};
        rb_mlog_base_cb cb = {.ent = on_ent, .ctx = &s};
        rb_mlog_base_result res;
        double t0 = now();
        if (rb_mlog_base_decode(base, base_len, &cb, &res, &err) < 0 || !res.complete || s.n != n) {
            fprintf(stderr, "decode failed: %s (complete %d, %llu of %zu)\n", err.msg, res.complete,
                    (unsigned long long)s.n, n);
            return 1;
        }
        double t = now() - t0;
        if (t < t_dec)
            t_dec = t;
    }
    /* Raw stream size: sum of the chunks' raw lengths. */
    {
        rb_mlog_bdec d;
        rb_mlog_bdec_init(&d);
        rb_mlog_base_info bi;
        rb_mlog_base_open(base, base_len, &d, &bi, NULL, &err);
        uint64_t off = bi.chunks_off;
        rb_mlog_chunk ch;
        rb_mlog_base_end end;
        while (rb_mlog_base_at(base, base_len, off, &bi, &ch, &end, &err) == 1) {
            raw_total += ch.raw_len;
            off += RB_MLOG_CHUNK_HDR_LEN + ch.comp_len;
        }
        rb_mlog_bdec_free(&d);
    }
    printf("{\"entries\": %zu, \"key_bytes_avg\": %.1f, \"positions\": %d, \"checksum\": %d, \"level\": %d, "
           "\"chunks\": %llu, \"raw_bytes\": %llu, \"base_bytes\": %llu, \"bytes_per_entry\": %.2f, "
           "\"raw_bytes_per_entry\": %.2f, \"encode_s\": %.4f, \"decode_s\": %.4f, "
           "\"encode_ns_per_entry\": %.1f, \"decode_ns_per_entry\": %.1f, "
           "\"encode_raw_MBps\": %.0f, \"decode_raw_MBps\": %.0f, \"encode_dev_MBps\": %.0f, "
           "\"decode_dev_MBps\": %.0f}\n",
           n, n ? (double)key_bytes / (double)n : 0.0, npos, with_sum, level ? level : RB_MLOG_LEVEL_DEFAULT,
           (unsigned long long)chunks, (unsigned long long)raw_total, (unsigned long long)base_len,
           n ? (double)base_len / (double)n : 0.0, n ? (double)raw_total / (double)n : 0.0, t_enc, t_dec,
           t_enc * 1e9 / (double)n, t_dec * 1e9 / (double)n, (double)raw_total / t_enc / 1e6,
           (double)raw_total / t_dec / 1e6, (double)base_len / t_enc / 1e6, (double)base_len / t_dec / 1e6);
    free(base);
    free(ents);
    free(pos);
    free(text);
    return 0;
}
