/*
 * mlog_bench.c - size and speed of a metadata-log base (csrc/core/rb_mlog.c) for a file of
 * index keys: bytes per entry on the device (chunk headers, class table, end record and the
 * padding included) and one thread's encode / decode speed. Driven by mlog_size.py, which
 * writes the keys with the package's object key codec; runs on its own too:
 *
 *   mlog_bench KEYFILE [--pos N] [--sum] [--level L] [--chunk BYTES] [--size BYTES] [--reps R]
 *   mlog_bench KEYFILE --group N [--level L] [--reps R]
 *   mlog_bench KEYFILE --read T1,T2,... [--level L] [--reps R]
 *
 * KEYFILE: one key a line (the entries, in slot order: slot i holds line i). --pos N: every
 * entry has N cached positions (consecutive token positions), default null. --sum: every
 * entry has a checksum. Prints one JSON object.
 *
 * --group N: a log group instead of a base, as a checkpoint after many changes on a full
 * cache writes it: N PUTs of the first N keys and N FREEs, interleaved (FREE, PUT), slots
 * random below 2^21 (a 16 TB device of 8 MiB slots), sealed at 4 KiB blocks with the body
 * deflated at level L (0: raw); also a group of the N PUTs alone and one of the N FREEs alone,
 * so each kind's bytes are known alone and in the mix (the mixed group less the other kind's
 * group). Times: adding the records, sealing, decoding the sealed group (and the raw one).
 *
 * --read T1,T2,...: besides the base's own figures, the base put in a region in memory
 * (superblock 0, the base in area 0, an empty ring) and read back with rb_mlog_read with each
 * thread count (read_ns_per_entry_T: the whole read, superblocks and copies included).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rb_mlog.h"
#include "rb_mlog_read.h"

static double read_bench(const uint8_t *base, uint64_t base_len, uint32_t n_chunks, uint64_t n, uint32_t threads,
                         int reps);
static int group_bench(const rb_mlog_ent *ents, size_t n, int level, int reps);

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
    int npos = -1, with_sum = 0, level = -1, reps = 3; /* level -1: the default */
    long group = 0;
    const char *read_threads = NULL;
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
        else if (!strcmp(argv[i], "--group") && i + 1 < argc)
            group = atol(argv[++i]);
        else if (!strcmp(argv[i], "--read") && i + 1 < argc)
            read_threads = argv[++i];
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
    if (group > 0) {
        int rc = group_bench(ents, (size_t)group < n ? (size_t)group : n, level < 0 ? RB_MLOG_LEVEL_DEFAULT : level, reps);
        free(ents);
        free(pos);
        free(text);
        return rc;
    }
    static const char frag[] = "\"shape\":[2,32,256,1024],\"dtype\":\"bfloat16\",\"fmt\":\"KV_2LTD\"";
    rb_mlog_class cls = {.id = 0, .frag_len = sizeof frag - 1, .frag = frag};
    if (level < 0)
        level = 0;
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
    char rd_json[512] = "";
    if (read_threads) {
        size_t o = 0;
        for (const char *t = read_threads; *t;) {
            uint32_t th = (uint32_t)strtoul(t, NULL, 10);
            double ns = read_bench(base, base_len, (uint32_t)chunks, n, th, reps);
            if (ns < 0)
                return 1;
            o += (size_t)snprintf(rd_json + o, sizeof rd_json - o, "\"read_ns_per_entry_%u\": %.1f, ", th, ns);
            t = strchr(t, ',');
            if (!t)
                break;
            t++;
        }
    }
    printf("{%s\"entries\": %zu, \"key_bytes_avg\": %.1f, \"positions\": %d, \"checksum\": %d, \"level\": %d, "
           "\"chunks\": %llu, \"raw_bytes\": %llu, \"base_bytes\": %llu, \"bytes_per_entry\": %.2f, "
           "\"raw_bytes_per_entry\": %.2f, \"encode_s\": %.4f, \"decode_s\": %.4f, "
           "\"encode_ns_per_entry\": %.1f, \"decode_ns_per_entry\": %.1f, "
           "\"encode_raw_MBps\": %.0f, \"decode_raw_MBps\": %.0f, \"encode_dev_MBps\": %.0f, "
           "\"decode_dev_MBps\": %.0f}\n",
           rd_json, n, n ? (double)key_bytes / (double)n : 0.0, npos, with_sum, level ? level : RB_MLOG_LEVEL_DEFAULT,
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

/* ---- --group ----------------------------------------------------------------------------- */

typedef struct gsink {
    uint64_t n, sum;
} gsink;

static int on_rec(void *ctx, const rb_mlog_rec *r)
{
    gsink *s = ctx;
    s->n++;
    s->sum += r->type == RB_MLOG_PUT ? r->ent.slot + r->ent.key_len : r->slot;
    return 0;
}

/* kinds: 1 = PUTs, 2 = FREEs, 3 = both interleaved. */
static int fill(rb_mlog_genc *g, const rb_mlog_ent *ents, const uint32_t *put_slot, const uint32_t *free_slot,
                size_t n, int kinds)
{
    rb_err err;
    rb_mlog_genc_reset(g);
    for (size_t i = 0; i < n; i++) {
        if ((kinds & 2) && rb_mlog_genc_free_slot(g, free_slot[i], &err) < 0)
            return -1;
        if (kinds & 1) {
            rb_mlog_ent e = ents[i];
            e.slot = put_slot[i];
            if (rb_mlog_genc_put(g, &e, &err) < 0)
                return -1;
        }
    }
    return 0;
}

static int group_bench(const rb_mlog_ent *ents, size_t n, int level, int reps)
{
    const uint64_t ba = 4096;
    uint32_t *ps = malloc(n * sizeof *ps), *fs = malloc(n * sizeof *fs);
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < n; i++) { /* xorshift: slots without structure */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ps[i] = (uint32_t)(x % (1u << 21));
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        fs[i] = (uint32_t)(x % (1u << 21));
    }
    rb_mlog_genc g;
    rb_mlog_genc_init(&g);
    rb_buf out = {0};
    rb_err err;
    uint64_t sealed[4] = {0}, raw[4] = {0}, raw_body = 0;
    for (int k = 1; k <= 3; k++) {
        if (fill(&g, ents, ps, fs, n, k) < 0)
            return 1;
        out.len = 0;
        if (rb_mlog_genc_seal(&g, 7, 9, ba, level, &out, &err) < 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        sealed[k] = out.len;
        raw[k] = rb_mlog_genc_len(&g, ba);
    }
    raw_body = g.body.len;
    double t_add = 1e30, t_seal = 1e30, t_dec = 1e30, t_dec_raw = 1e30;
    uint8_t *grp = NULL, *rgrp = NULL;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        fill(&g, ents, ps, fs, n, 3);
        double t1 = now();
        out.len = 0;
        if (rb_mlog_genc_seal(&g, 7, 9, ba, level, &out, &err) < 0)
            return 1;
        double t2 = now();
        if (t1 - t0 < t_add)
            t_add = t1 - t0;
        if (t2 - t1 < t_seal)
            t_seal = t2 - t1;
    }
    grp = malloc(out.len);
    memcpy(grp, out.data, out.len);
    size_t glen = out.len;
    out.len = 0;
    rb_mlog_genc_seal(&g, 7, 9, ba, 0, &out, &err);
    rgrp = malloc(out.len);
    memcpy(rgrp, out.data, out.len);
    size_t rlen = out.len;
    rb_mlog_gdec d;
    rb_mlog_gdec_init(&d);
    for (int r = 0; r < reps; r++) {
        gsink s = {0, 0};
        double t0 = now();
        if (rb_mlog_gdec_group(&d, grp, glen, ba, 7, 9, NULL, on_rec, &s, &err) != 0 || s.n != 2 * n) {
            fprintf(stderr, "decode: %s\n", err.msg);
            return 1;
        }
        double t1 = now();
        gsink s2 = {0, 0};
        if (rb_mlog_gdec_group(&d, rgrp, rlen, ba, 7, 9, NULL, on_rec, &s2, &err) != 0 || s2.sum != s.sum)
            return 1;
        double t2 = now();
        if (t1 - t0 < t_dec)
            t_dec = t1 - t0;
        if (t2 - t1 < t_dec_raw)
            t_dec_raw = t2 - t1;
    }
    double nn = (double)n, n2 = 2.0 * (double)n;
    printf("{\"group_puts\": %zu, \"group_frees\": %zu, \"level\": %d, \"block\": %llu, "
           "\"raw_bytes\": %llu, \"sealed_bytes\": %llu, \"raw_body\": %llu, "
           "\"put_only_sealed\": %llu, \"put_only_raw\": %llu, \"free_only_sealed\": %llu, \"free_only_raw\": %llu, "
           "\"bytes_per_put\": %.2f, \"bytes_per_free\": %.2f, \"raw_bytes_per_put\": %.2f, \"raw_bytes_per_free\": %.2f, "
           "\"bytes_per_record\": %.2f, \"raw_bytes_per_record\": %.2f, "
           "\"mixed_bytes_per_put\": %.2f, \"mixed_bytes_per_free\": %.2f, "
           "\"add_ns_per_record\": %.1f, \"seal_ns_per_record\": %.1f, \"decode_ns_per_record\": %.1f, "
           "\"decode_raw_ns_per_record\": %.1f}\n",
           n, n, level, (unsigned long long)ba, (unsigned long long)raw[3], (unsigned long long)sealed[3],
           (unsigned long long)raw_body, (unsigned long long)sealed[1], (unsigned long long)raw[1],
           (unsigned long long)sealed[2], (unsigned long long)raw[2], (double)sealed[1] / nn, (double)sealed[2] / nn,
           (double)raw[1] / nn, (double)raw[2] / nn, (double)sealed[3] / n2, (double)raw[3] / n2,
           ((double)sealed[3] - (double)sealed[2]) / nn, ((double)sealed[3] - (double)sealed[1]) / nn, t_add * 1e9 / n2,
           t_seal * 1e9 / n2, t_dec * 1e9 / n2, t_dec_raw * 1e9 / n2);
    free(grp);
    free(rgrp);
    free(ps);
    free(fs);
    rb_mlog_gdec_free(&d);
    rb_buf_free(&out);
    rb_mlog_genc_free(&g);
    return 0;
}

/* ---- --read ------------------------------------------------------------------------------ */

typedef struct region {
    uint8_t *b;
    uint64_t len;
} region;

static int region_read(void *ctx, uint64_t off, void *buf, size_t len, rb_err *err)
{
    region *r = ctx;
    if (off > r->len || len > r->len - off)
        return rb_err_set(err, RB_ERR_OS, 5, "read past the region");
    memcpy(buf, r->b + off, len);
    return 0;
}

static int count_ent(void *ctx, const rb_mlog_ent *e)
{
    sink *s = ctx;
    s->n++;
    s->key_bytes += e->key_len;
    return 0;
}

static double read_bench(const uint8_t *base, uint64_t base_len, uint32_t n_chunks, uint64_t n, uint32_t threads,
                         int reps)
{
    const uint64_t ba = 4096, mib = 1u << 20;
    uint64_t mt = (3 * base_len + mib - 1) / mib * mib;
    if (mt < RB_MLOG_AUTO_MIN)
        mt = RB_MLOG_AUTO_MIN;
    rb_mlog_layout l;
    rb_err err;
    if (rb_mlog_layout_of(mt, ba, &l, &err) < 0 || l.areas[0].len < base_len) {
        fprintf(stderr, "read: no layout for the base\n");
        return -1;
    }
    region r = {.b = calloc(1, mt), .len = mt};
    if (!r.b)
        return -1;
    memcpy(r.b + l.areas[0].off, base, base_len);
    rb_mlog_sb sb;
    memset(&sb, 0, sizeof sb);
    sb.sb_seq = 1;
    sb.generation = 7;
    sb.block_align = ba;
    sb.header_bytes = ba;
    sb.slot_bytes = (8u << 20) + ba;
    sb.meta_total_bytes = mt;
    sb.container_bytes = l.container_bytes;
    sb.data_base = mt;
    sb.max_slots = (uint32_t)n;
    sb.capacity = mt + n * sb.slot_bytes;
    sb.areas[0] = l.areas[0];
    sb.areas[1] = l.areas[1];
    sb.ring.off = l.ring.off;
    sb.ring.len = l.ring.len;
    sb.base.area = 0;
    sb.base.n_chunks = n_chunks;
    sb.base.len = base_len;
    sb.base.n_entries = n;
    sb.base.log_seq = 100;
    sb.base.next_slot = (uint32_t)n;
    sb.ring.start_seq = 101;
    if (rb_mlog_sb_encode(&sb, r.b, ba, &err) < 0) {
        fprintf(stderr, "read: %s\n", err.msg);
        free(r.b);
        return -1;
    }
    double best = 1e30;
    for (int k = 0; k < reps; k++) {
        sink s = {0, 0, 0};
        rb_mlog_read_opts o = {.block_align = ba, .meta_total_bytes = mt, .threads = threads};
        rb_mlog_read_cb cb = {.ent = count_ent, .ctx = &s};
        rb_mlog_read_result res;
        double t0 = now();
        if (rb_mlog_read(&o, region_read, &r, &cb, &res, &err) != 0 || !res.found || !res.base.complete || s.n != n) {
            fprintf(stderr, "read failed: %s (found %d, %llu entries)\n", err.msg, res.found, (unsigned long long)s.n);
            free(r.b);
            return -1;
        }
        double t = now() - t0;
        if (t < best)
            best = t;
    }
    free(r.b);
    return best * 1e9 / (double)n;
}
