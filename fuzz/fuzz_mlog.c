/*
 * fuzz_mlog.c - libFuzzer target: the metadata-log decoders (csrc/core/rb_mlog.c) on
 * arbitrary bytes, and encoder -> decoder round trips of entries drawn from the input.
 *
 * Input: byte 0 picks the path (bits 0..2) and whether the harness first makes the input's
 * CRCs right (bit 3: the fuzzer would rarely produce a matching CRC-32, and every parser
 * behind a CRC would go unexercised); the rest is the document:
 *   0: superblock decode
 *   1: log group: byte 1 = log2 of block_align (mod 13), then the group (head, then decode,
 *      raw or deflated body; also with one decoder state kept across calls)
 *   2: base: the whole decode (chunk headers walked to fix their CRCs), plus the chunk walk
 *   3: one base chunk: bytes 1..2 = entry count, 3..4 = first slot, 5..6 = last slot, the rest
 *      is the chunk's raw entry stream; the harness compresses it into a base around it
 *   4: round trip: entries drawn from the bytes, encoded as a base and as a log group (raw,
 *      and sealed with the body deflated), decoded, compared (abort on any difference)
 * Every decoder gets an exact-size heap copy so ASan sees any read past the end.
 */
#define ZLIB_CONST
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "rb_mlog.h"

static uint32_t crc(const void *p, size_t n)
{
    return (uint32_t)crc32(0, p, (uInt)n);
}

/* Callbacks that touch what they are given (so ASan checks it). */
static uint64_t sink;
static int on_rec(void *ctx, const rb_mlog_rec *r)
{
    (void)ctx;
    if (r->type == RB_MLOG_PUT) {
        for (uint32_t i = 0; i < r->ent.key_len; i++)
            sink += (uint8_t)r->ent.key[i];
        for (int64_t i = 0; i < r->ent.npos; i++)
            sink += (uint64_t)r->ent.pos[i];
    } else if (r->type == RB_MLOG_CLASS) {
        for (uint32_t i = 0; i < r->cls.frag_len; i++)
            sink += (uint8_t)r->cls.frag[i];
    }
    return 0;
}
static int on_ent(void *ctx, const rb_mlog_ent *e)
{
    rb_mlog_rec r = {.type = RB_MLOG_PUT, .ent = *e};
    return on_rec(ctx, &r);
}
static int on_cls(void *ctx, const rb_mlog_class *c)
{
    rb_mlog_rec r = {.type = RB_MLOG_CLASS, .cls = *c};
    return on_rec(ctx, &r);
}
static int on_dmg(void *ctx, const rb_mlog_damage *d)
{
    (void)ctx;
    sink += d->index + strlen(d->why.msg);
    return 0;
}
static const rb_mlog_base_cb cbs = {.cls = on_cls, .ent = on_ent, .damage = on_dmg};

static void fix_group(uint8_t *g, size_t len)
{
    if (len < RB_MLOG_GROUP_HDR_LEN)
        return;
    rb_put_le(g + 40, crc(g, 40), 4);
    uint64_t bl = rb_get_le(g + 24, 8);
    if (bl <= len - RB_MLOG_GROUP_HDR_LEN) {
        uint32_t c = (uint32_t)crc32(crc32(0, g, 44), g + RB_MLOG_GROUP_HDR_LEN, (uInt)bl);
        rb_put_le(g + 44, c, 4);
    }
}

static void fix_base(uint8_t *b, size_t len)
{
    if (len < RB_MLOG_BASE_HDR_LEN)
        return;
    uint64_t tl = rb_get_le(b + 40, 8);
    if (tl <= len - RB_MLOG_BASE_HDR_LEN)
        rb_put_le(b + 48, crc(b + RB_MLOG_BASE_HDR_LEN, (size_t)tl), 4);
    rb_put_le(b + 52, crc(b, 52), 4);
    if (tl > len - RB_MLOG_BASE_HDR_LEN)
        return;
    for (uint64_t off = RB_MLOG_BASE_HDR_LEN + tl; off + 8 <= len;) {
        uint8_t *h = b + off;
        if (!memcmp(h, RB_MLOG_END_MAGIC, 8) && len - off >= RB_MLOG_END_LEN) {
            rb_put_le(h + 44, crc(h, 44), 4);
            return;
        }
        if (memcmp(h, RB_MLOG_CHUNK_MAGIC, 8) || len - off < RB_MLOG_CHUNK_HDR_LEN)
            return;
        uint64_t cl = rb_get_le(h + 36, 4);
        if (cl <= len - off - RB_MLOG_CHUNK_HDR_LEN)
            rb_put_le(h + 52, crc(h + RB_MLOG_CHUNK_HDR_LEN, (size_t)cl), 4);
        rb_put_le(h + 56, crc(h, 56), 4);
        off += RB_MLOG_CHUNK_HDR_LEN + cl;
    }
}

static void decode_base(const uint8_t *b, size_t len)
{
    rb_mlog_base_result res;
    rb_err err;
    (void)rb_mlog_base_decode(b, len, &cbs, &res, &err);
    /* The walk a parallel reader would do: every chunk header, each chunk on its own. */
    rb_mlog_bdec d;
    rb_mlog_bdec_init(&d);
    rb_mlog_base_info bi;
    if (rb_mlog_base_open(b, len, &d, &bi, NULL, &err) == 0) {
        uint64_t off = bi.chunks_off;
        for (int guard = 0; off < len && guard < 4096; guard++) {
            rb_mlog_chunk ch;
            rb_mlog_base_end end;
            int rc = rb_mlog_base_at(b, len, off, &bi, &ch, &end, &err);
            if (rc == 1) {
                (void)rb_mlog_bdec_chunk(&d, b, len, &ch, &cbs, &err);
                off += RB_MLOG_CHUNK_HDR_LEN + (uint64_t)ch.comp_len;
            } else if (rc == 0) {
                break;
            } else {
                off = rb_mlog_base_resync(b, len, off, &bi);
            }
        }
    }
    rb_mlog_bdec_free(&d);
}

static const rb_mlog_class cls[] = {
    {.id = 0, .frag = "\"shape\":[1],\"dtype\":null,\"fmt\":\"BINARY\"", .frag_len = 39},
    {.id = 3, .frag = "", .frag_len = 0},
    {.id = 7, .frag = "x", .frag_len = 1},
};

/* Mode 3: a base around one chunk of the given raw stream. */
static void one_chunk(const uint8_t *in, size_t len)
{
    if (len < 6)
        return;
    uint32_t n = (uint32_t)rb_get_le(in, 2), first = (uint32_t)rb_get_le(in + 2, 2), last = (uint32_t)rb_get_le(in + 4, 2);
    const uint8_t *raw = in + 6;
    size_t rlen = len - 6;
    rb_mlog_benc e;
    rb_err err;
    if (rb_mlog_benc_init(&e, 5, 9, 1u << 16, cls, 3, NULL, &err) != 0)
        return;
    size_t hl = e.out.len, cap = hl + RB_MLOG_CHUNK_HDR_LEN + compressBound((uLong)rlen) + 64 + RB_MLOG_END_LEN;
    uint8_t *b = malloc(cap);
    if (!b) {
        rb_mlog_benc_free(&e);
        return;
    }
    memcpy(b, e.out.data, hl);
    rb_mlog_benc_free(&e);
    uint8_t *h = b + hl, *c = h + RB_MLOG_CHUNK_HDR_LEN;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 1, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
        free(b);
        return;
    }
    z.next_in = raw;
    z.avail_in = (uInt)rlen;
    z.next_out = c;
    z.avail_out = (uInt)(cap - hl - RB_MLOG_CHUNK_HDR_LEN - RB_MLOG_END_LEN);
    int zr = deflate(&z, Z_FINISH);
    uint32_t comp = (uint32_t)z.total_out;
    deflateEnd(&z);
    if (zr != Z_STREAM_END) {
        free(b);
        return;
    }
    memcpy(h, RB_MLOG_CHUNK_MAGIC, 8);
    rb_put_le(h + 8, 5, 8);
    rb_put_le(h + 16, 9, 8);
    rb_put_le(h + 24, 0, 4);
    rb_put_le(h + 28, n, 4);
    rb_put_le(h + 32, rlen, 4);
    rb_put_le(h + 36, comp, 4);
    rb_put_le(h + 40, first, 4);
    rb_put_le(h + 44, last, 4);
    rb_put_le(h + 48, 1, 4);
    rb_put_le(h + 52, crc(c, comp), 4);
    rb_put_le(h + 56, crc(h, 56), 4);
    uint8_t *t = c + comp;
    memcpy(t, RB_MLOG_END_MAGIC, 8);
    rb_put_le(t + 8, 5, 8);
    rb_put_le(t + 16, 9, 8);
    rb_put_le(t + 24, n, 8);
    rb_put_le(t + 32, (uint64_t)(t - b), 8);
    rb_put_le(t + 40, 1, 4);
    rb_put_le(t + 44, crc(t, 44), 4);
    size_t blen = (size_t)(t - b) + RB_MLOG_END_LEN;
    decode_base(b, blen);
    free(b);
}

/* Mode 4: entries drawn from the bytes, through both encoders and back. */
typedef struct rt {
    const rb_mlog_ent *e;
    size_t n, at;
} rt;

static int same(const rb_mlog_ent *a, const rb_mlog_ent *b)
{
    if (a->key_len != b->key_len || (a->key_len && memcmp(a->key, b->key, a->key_len)) || a->slot != b->slot ||
        a->size != b->size || a->cls != b->cls || a->flags != b->flags || (a->npos < 0 ? -1 : a->npos) != b->npos)
        return 0;
    if ((a->flags & RB_MLOG_ENT_SUM) && a->checksum != b->checksum)
        return 0;
    for (int64_t i = 0; i < a->npos; i++)
        if (a->pos[i] != b->pos[i])
            return 0;
    return 1;
}

static int rt_ent(void *ctx, const rb_mlog_ent *e)
{
    rt *r = ctx;
    if (r->at >= r->n || !same(&r->e[r->at], e))
        abort();
    r->at++;
    return 0;
}

static int rt_rec(void *ctx, const rb_mlog_rec *rec)
{
    if (rec->type != RB_MLOG_PUT)
        abort();
    return rt_ent(ctx, &rec->ent);
}

static void round_trip(const uint8_t *in, size_t len)
{
    enum { MAXE = 256 };
    rb_mlog_ent e[MAXE];
    int64_t pos[MAXE][8];
    size_t n = 0, i = 0;
    uint32_t slot = 0;
    while (i + 4 <= len && n < MAXE) {
        uint8_t ctl = in[i], kl = in[i + 1] % 48, gap = in[i + 2], np = in[i + 3];
        i += 4;
        if (kl > len - i)
            kl = (uint8_t)(len - i);
        rb_mlog_ent *x = &e[n];
        memset(x, 0, sizeof *x);
        x->key = (const char *)in + i;
        x->key_len = kl;
        i += kl;
        slot += (ctl & 1) ? gap : 1u;
        x->slot = slot;
        x->size = (ctl & 2) ? (uint64_t)gap << (ctl >> 2) : (8u << 20);
        x->cls = cls[(ctl >> 4) % 3].id;
        if (ctl & 0x40) {
            x->flags = RB_MLOG_ENT_SUM;
            x->checksum = 0x9e3779b97f4a7c15ull * (n + 1);
        }
        x->npos = (np & 0x80) ? -1 : np % 9;
        for (int64_t k = 0; k < x->npos; k++)
            pos[n][k] = (np & 0x40) ? (int64_t)k + gap : (int64_t)(0x123456789ull * (uint64_t)(k + 1) * gap - ctl);
        x->pos = pos[n];
        n++;
        slot++;
    }
    rb_err err;
    /* base, with a small chunk size so several chunks come out */
    rb_mlog_benc enc;
    rb_mlog_benc_opts o = {.chunk_raw = 64 + (len % 512)};
    if (rb_mlog_benc_init(&enc, 3, 4, slot + 1, cls, 3, &o, &err) != 0)
        abort();
    for (size_t k = 0; k < n; k++)
        if (rb_mlog_benc_add(&enc, &e[k], &err) != 0)
            abort();
    if (rb_mlog_benc_finish(&enc, 512, &err) != 0)
        abort();
    uint8_t *b = malloc(enc.out.len);
    if (!b)
        abort();
    memcpy(b, enc.out.data, enc.out.len);
    rt r = {.e = e, .n = n};
    rb_mlog_base_cb cb = {.ent = rt_ent, .ctx = &r};
    rb_mlog_base_result res;
    if (rb_mlog_base_decode(b, enc.out.len, &cb, &res, &err) != 0 || !res.complete || r.at != n)
        abort();
    free(b);
    rb_mlog_benc_free(&enc);
    /* log group */
    rb_mlog_genc g;
    rb_mlog_genc_init(&g);
    for (size_t k = 0; k < n; k++)
        if (rb_mlog_genc_put(&g, &e[k], &err) != 0)
            abort();
    size_t gl = (size_t)rb_mlog_genc_len(&g, 4096);
    uint8_t *gb = malloc(gl);
    if (!gb || rb_mlog_genc_finish(&g, 3, 5, 4096, gb, gl, &err) != 0)
        abort();
    r.at = 0;
    if (rb_mlog_group_decode(gb, gl, 4096, 3, 5, NULL, rt_rec, &r, &err) != 0 || r.at != n)
        abort();
    free(gb);
    /* sealed: deflated where that saves a block (align 1: nearly always), decoded with one
     * decoder state twice; level 0 gives what finish gave */
    rb_mlog_gdec gd;
    rb_mlog_gdec_init(&gd);
    const uint64_t aligns[] = {1, 512};
    for (int k = 0; k < 2; k++) {
        rb_buf sb = {0};
        int level = 1 + (int)(len % 9);
        if (rb_mlog_genc_seal(&g, 3, 6, aligns[k], level, &sb, &err) != 0 || sb.len % aligns[k] ||
            sb.len > rb_mlog_genc_len(&g, aligns[k]))
            abort();
        uint8_t *sg = malloc(sb.len);
        if (!sg)
            abort();
        memcpy(sg, sb.data, sb.len);
        for (int rep = 0; rep < 2; rep++) {
            r.at = 0;
            rb_mlog_group_info gi;
            if (rb_mlog_gdec_group(&gd, sg, sb.len, aligns[k], 3, 6, &gi, rt_rec, &r, &err) != 0 || r.at != n ||
                gi.raw_len != g.body.len || gi.total_len != sb.len)
                abort();
        }
        free(sg);
        rb_buf_free(&sb);
    }
    rb_mlog_gdec_free(&gd);
    rb_mlog_genc_free(&g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int mode = data[0] & 7, fix = data[0] & 8;
    size_t len = size - 1;
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return 0;
    memcpy(copy, data + 1, len);
    rb_err err;
    switch (mode) {
    case 0: {
        if (fix && len >= RB_MLOG_SB_LEN)
            rb_put_le(copy + 252, crc(copy, 252), 4);
        rb_mlog_sb sb;
        if (rb_mlog_sb_decode(copy, len, &sb, &err) == 0) {
            /* what decodes encodes back to the same bytes */
            uint8_t out[RB_MLOG_SB_LEN];
            if (rb_mlog_sb_encode(&sb, out, sizeof out, &err) != 0 || memcmp(out, copy, RB_MLOG_SB_LEN) != 0)
                abort();
        }
        break;
    }
    case 1: {
        if (len < 1)
            break;
        uint64_t align = 1ull << (copy[0] % 13);
        uint8_t *g = malloc(len - 1 ? len - 1 : 1);
        if (!g)
            break;
        memcpy(g, copy + 1, len - 1);
        if (fix)
            fix_group(g, len - 1);
        rb_mlog_group_info gi;
        (void)rb_mlog_group_head(g, len - 1, align, 0, 0, &gi, &err);
        int rc = rb_mlog_group_decode(g, len - 1, align, 0, 0, &gi, on_rec, NULL, &err);
        /* a decoder state kept across groups gives the same answer, after another group too */
        rb_mlog_gdec gd;
        rb_mlog_gdec_init(&gd);
        for (int rep = 0; rep < 2; rep++)
            if (rb_mlog_gdec_group(&gd, g, len - 1, align, 0, 0, &gi, on_rec, NULL, &err) != rc)
                abort();
        rb_mlog_gdec_free(&gd);
        free(g);
        break;
    }
    case 2:
        if (fix)
            fix_base(copy, len);
        decode_base(copy, len);
        break;
    case 3:
        one_chunk(copy, len);
        break;
    case 4:
        round_trip(copy, len);
        break;
    default:
        break;
    }
    free(copy);
    return 0;
}
