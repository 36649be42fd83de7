/*
 * rb_mlog.c - the codec of the log-structured metadata format: superblock, log groups and
 * records, compacted bases in zlib chunks (see rb_mlog.h; byte layouts in
 * docs/metadata-log.md). Plain data in, bytes out and back; no I/O, no locks.
 */
#define ZLIB_CONST
#include "rb_mlog.h"
#include "rb_core.h" /* size classes: rb_sc_slot_bytes */

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#ifdef RB_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

/*
 * Raw deflate of in[0, in_len) into exactly out_len bytes at out, consuming all of in; the
 * decoder state lives in *zp (made on first use, freed by zstate_free). libdeflate where the
 * build has it (whole-buffer decoding: a base of 1M LMCache object keys decodes in 160 ns an
 * entry against zlib's 322, `make bench-mlog`), else zlib. 0, 1 when the bytes do not decode to exactly that, -ENOMEM. *got: bytes produced.
 */
static int raw_inflate(void **zp, const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len, size_t *got,
                       size_t *left)
{
#ifdef RB_HAVE_LIBDEFLATE
    if (!*zp && !(*zp = libdeflate_alloc_decompressor()))
        return -ENOMEM;
    size_t used_in = 0, made = 0;
    enum libdeflate_result r = libdeflate_deflate_decompress_ex(*zp, in, in_len, out, out_len, &used_in, &made);
    *got = made;
    *left = r == LIBDEFLATE_SUCCESS ? in_len - used_in : in_len;
    return r == LIBDEFLATE_SUCCESS && used_in == in_len && made == out_len ? 0 : 1;
#else
    if (!*zp) {
        z_stream *z = calloc(1, sizeof *z);
        if (!z || inflateInit2(z, -15) != Z_OK) {
            free(z);
            return -ENOMEM;
        }
        *zp = z;
    } else if (inflateReset(*zp) != Z_OK) {
        return -ENOMEM;
    }
    z_stream *z = *zp;
    z->next_in = in;
    z->avail_in = (uInt)in_len;
    z->next_out = out;
    z->avail_out = (uInt)out_len;
    int zr = inflate(z, Z_FINISH);
    *got = z->total_out;
    *left = z->avail_in;
    return zr == Z_STREAM_END && z->avail_in == 0 && z->total_out == out_len ? 0 : 1;
#endif
}

static void zstate_free(void *z)
{
    if (!z)
        return;
#ifdef RB_HAVE_LIBDEFLATE
    libdeflate_free_decompressor(z);
#else
    inflateEnd(z);
    free(z);
#endif
}

/* ---- primitives ------------------------------------------------------------------------- */

/* CRC-32 (zlib's) of more bytes after crc; crc 0 starts one. */
static uint32_t crc_more(uint32_t crc, const void *buf, size_t len)
{
#ifdef RB_HAVE_LIBDEFLATE
    /* the same CRC-32 as zlib's, with carry-less multiplication where the CPU has it */
    return libdeflate_crc32(crc, buf, len);
#else
    uLong c = crc;
    const Bytef *p = buf;
    while (len) {
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        c = crc32(c, p, n);
        p += n;
        len -= n;
    }
    return (uint32_t)c;
#endif
}

static int bad(rb_err *err, const char *what, const char *fmt_detail, unsigned long long a, unsigned long long b)
{
    /* A refusal: "<what>: <detail>" where detail may use a and b (two %llu at most). */
    char detail[192];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(detail, sizeof detail, fmt_detail, a, b);
#pragma GCC diagnostic pop
    return rb_err_set(err, RB_ERR_VALUE, EBADMSG, "%s: %s", what, detail);
}

static int nomem(rb_err *err, const char *what)
{
    return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "%s: out of memory", what);
}

/* b := its first keep bytes, then n bytes from p (the previous key becomes the next one). */
static int key_set(rb_buf *b, size_t keep, const void *p, size_t n)
{
    b->len = keep;
    if (n == 0)
        return 0;
    if (rb_buf_reserve(b, n) < 0) {
        b->oom = 0; /* the buffer is still good: the caller decides */
        return -ENOMEM;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

/* LEB128: 7 bits a byte, low first; at most 10 bytes for a u64. */
#define VARINT_MAX 10

static inline uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static inline uint64_t zigzag(uint64_t d) /* d: a two's complement difference */
{
    return (d << 1) ^ (uint64_t) - (int64_t)(d >> 63);
}

static inline uint64_t unzigzag(uint64_t z)
{
    return (z >> 1) ^ (uint64_t) - (int64_t)(z & 1);
}

enum { V_OK = 0, V_TRUNC = -1, V_OVERFLOW = -2, V_OVERLONG = -3 };
static const char *const varint_why[] = {"ok", "runs past the end", "overflows 64 bits", "is not minimal"};

/* Read a varint from *pp (not past end); canonical encodings only (no high zero groups). */
static inline int get_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    const uint8_t *p = *pp;
    if (p < end && *p < 0x80) {
        *out = *p;
        *pp = p + 1;
        return V_OK;
    }
    uint64_t v = 0;
    for (int i = 0; i < VARINT_MAX; i++) {
        if (p == end)
            return V_TRUNC;
        uint8_t b = *p++;
        if (i == VARINT_MAX - 1 && b > 1)
            return V_OVERFLOW;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (b == 0 && i > 0)
                return V_OVERLONG;
            *out = v;
            *pp = p;
            return V_OK;
        }
    }
    return V_OVERFLOW;
}

/* A record reader over one body or chunk stream: the position, the end, where the stream
 * began (for offsets in messages), and what is being read (formatted only for a message). */
enum { RD_GROUP, RD_CLASS, RD_CHUNK };
typedef struct rd {
    const uint8_t *p, *end, *start;
    int kind; /* RD_*: "log group record <i>", "base class <i>", "base chunk <c> entry <i>" */
    uint32_t c, i;
    rb_err *err;
} rd;

static const char *rd_what(const rd *r, char *buf, size_t n)
{
    if (r->kind == RD_GROUP)
        snprintf(buf, n, "log group record %u", r->i);
    else if (r->kind == RD_CLASS)
        snprintf(buf, n, "base class %u", r->i);
    else
        snprintf(buf, n, "base chunk %u entry %u", r->c, r->i);
    return buf;
}

static int rd_fail(rd *r, const char *field, const char *why)
{
    char w[64];
    rb_err_set(r->err, RB_ERR_VALUE, EBADMSG, "%s: %s at byte %llu %s", rd_what(r, w, sizeof w), field,
               (unsigned long long)(r->p - r->start), why);
    return -EBADMSG;
}

/* A refusal about the current record, as bad() words it. */
static int rd_bad(rd *r, const char *fmt_detail, unsigned long long a, unsigned long long b)
{
    char w[64];
    return bad(r->err, rd_what(r, w, sizeof w), fmt_detail, a, b);
}

static int rd_nomem(rd *r)
{
    char w[64];
    return nomem(r->err, rd_what(r, w, sizeof w));
}

static int rd_varint(rd *r, const char *field, uint64_t max, uint64_t *out)
{
    int v = get_varint(&r->p, r->end, out);
    if (v != V_OK)
        return rd_fail(r, field, varint_why[-v]);
    if (*out > max) {
        char w[64];
        rb_err_set(r->err, RB_ERR_VALUE, EBADMSG, "%s: %s %llu at byte %llu is above %llu", rd_what(r, w, sizeof w),
                   field, (unsigned long long)*out, (unsigned long long)(r->p - r->start), (unsigned long long)max);
        return -EBADMSG;
    }
    return 0;
}

static int rd_bytes(rd *r, const char *field, uint64_t n, const uint8_t **out)
{
    if (n > (uint64_t)(r->end - r->p)) {
        char w[64];
        rb_err_set(r->err, RB_ERR_VALUE, EBADMSG, "%s: %s of %llu bytes at byte %llu runs past the end (%llu left)",
                   rd_what(r, w, sizeof w), field, (unsigned long long)n, (unsigned long long)(r->p - r->start),
                   (unsigned long long)(r->end - r->p));
        return -EBADMSG;
    }
    *out = r->p;
    r->p += n;
    return 0;
}

/* ---- the entry tail shared by PUT records and base entries -------------------------------
 * size (varint; in bases a zigzag delta from the previous entry's size), class (varint),
 * flags byte (bit 0: checksum follows, bit 1: positions follow), checksum (8 bytes LE),
 * positions: varint count, then runs of equal deltas until count values are given: zigzag
 * varint delta (from the previous value, the first from 0), varint repeats after the first.
 * A run of token positions (the usual case) takes one run after the first value.
 */
#define TAIL_SUM 0x1u
#define TAIL_POS 0x2u

/* Upper bound of the bytes an entry takes besides key bytes. 0 when npos is absurd. */
static size_t tail_bound(const rb_mlog_ent *e)
{
    if (e->npos > (int64_t)RB_MLOG_POS_MAX)
        return 0;
    size_t npos = e->npos > 0 ? (size_t)e->npos : 0;
    return 6 * VARINT_MAX + 1 + 8 + (2 * npos + 1) * VARINT_MAX;
}

static uint64_t npos_of(const rb_mlog_ent *e)
{
    return e->npos > 0 ? (uint64_t)e->npos : 0;
}

static uint8_t *put_tail(uint8_t *p, const rb_mlog_ent *e, uint64_t size_field)
{
    p = put_varint(p, size_field);
    p = put_varint(p, e->cls);
    *p++ = (uint8_t)((e->flags & RB_MLOG_ENT_SUM ? TAIL_SUM : 0) | (e->npos >= 0 ? TAIL_POS : 0));
    if (e->flags & RB_MLOG_ENT_SUM) {
        rb_put_le(p, e->checksum, 8);
        p += 8;
    }
    if (e->npos >= 0) {
        p = put_varint(p, (uint64_t)e->npos);
        uint64_t prev = 0;
        for (int64_t i = 0; i < e->npos;) {
            uint64_t d = (uint64_t)e->pos[i] - prev;
            int64_t j = i + 1;
            while (j < e->npos && (uint64_t)e->pos[j] - (uint64_t)e->pos[j - 1] == d)
                j++;
            p = put_varint(p, zigzag(d));
            p = put_varint(p, (uint64_t)(j - i - 1));
            prev = (uint64_t)e->pos[j - 1];
            i = j;
        }
    }
    return p;
}

/* Grow *pos to hold n positions. */
static int pos_reserve(int64_t **pos, size_t *cap, uint64_t n)
{
    if (n <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < n)
        nc *= 2;
    int64_t *p = realloc(*pos, nc * sizeof **pos);
    if (!p)
        return -ENOMEM;
    *pos = p;
    *cap = nc;
    return 0;
}

/* Read a tail into e (size_field raw: the caller undoes a delta). Positions go to *pos;
 * *budget is what the group or chunk may still decode, and is charged. */
static int rd_tail(rd *r, rb_mlog_ent *e, uint64_t *size_field, int64_t **pos, size_t *pos_cap, uint64_t *budget)
{
    uint64_t v;
    int rc;
    if ((rc = rd_varint(r, "size", UINT64_MAX, size_field)) < 0)
        return rc;
    if ((rc = rd_varint(r, "class id", UINT32_MAX, &v)) < 0)
        return rc;
    e->cls = (uint32_t)v;
    const uint8_t *fp = NULL;
    if ((rc = rd_bytes(r, "flags", 1, &fp)) < 0)
        return rc;
    if (*fp & ~(TAIL_SUM | TAIL_POS)) {
        r->p--;
        return rd_fail(r, "flags", "has unknown bits");
    }
    e->flags = 0;
    e->checksum = 0;
    if (*fp & TAIL_SUM) {
        const uint8_t *s = NULL;
        if ((rc = rd_bytes(r, "checksum", 8, &s)) < 0)
            return rc;
        e->flags |= RB_MLOG_ENT_SUM;
        e->checksum = rb_get_le(s, 8);
    }
    e->npos = -1;
    e->pos = NULL;
    if (*fp & TAIL_POS) {
        uint64_t n;
        const uint8_t *at = r->p;
        if ((rc = rd_varint(r, "position count", RB_MLOG_POS_MAX, &n)) < 0)
            return rc;
        if (n > *budget) {
            r->p = at;
            return rd_fail(r, "position count", "exceeds what a group or chunk may hold in all");
        }
        *budget -= n;
        if (pos_reserve(pos, pos_cap, n) < 0)
            return rd_nomem(r);
        uint64_t prev = 0;
        for (uint64_t i = 0; i < n;) {
            uint64_t z, rep;
            if ((rc = rd_varint(r, "position delta", UINT64_MAX, &z)) < 0 ||
                (rc = rd_varint(r, "position repeats", n - i - 1, &rep)) < 0)
                return rc;
            uint64_t d = unzigzag(z);
            for (uint64_t k = 0; k <= rep; k++) {
                prev += d;
                (*pos)[i++] = (int64_t)prev;
            }
        }
        e->npos = (int64_t)n;
        e->pos = *pos;
    }
    return 0;
}

/* ---- superblock -------------------------------------------------------------------------- */

#define SB_CRC_OFF (RB_MLOG_SB_LEN - 4)

static int is_pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

/* [a, a + alen) and [b, b + blen) overlap (lengths already checked not to wrap). */
static int overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    return a < b + blen && b < a + alen;
}

/* The superblock's ids and block sizes: nonzero ids, block_align a power of two up to 2^30,
 * header_bytes, slot_bytes and meta_total_bytes multiples of it in that order. */
static int sb_check_sizes(const rb_mlog_sb *s, rb_err *err)
{
    static const char W[] = "metadata superblock";
    const uint64_t ba = s->block_align;
    if (s->sb_seq == 0)
        return bad(err, W, "sequence is 0", 0, 0);
    if (s->generation == 0)
        return bad(err, W, "generation is 0", 0, 0);
    if (!is_pow2(ba) || ba > (1ull << 30))
        return bad(err, W, "block_align %llu is not a power of two up to 2^30", ba, 0);
    if (s->header_bytes < 24 || s->header_bytes % ba)
        return bad(err, W, "header_bytes %llu is not a multiple of block_align %llu of at least 24", s->header_bytes,
                   ba);
    if (s->slot_bytes <= s->header_bytes || s->slot_bytes % ba)
        return bad(err, W, "slot_bytes %llu is not a multiple of block_align above header_bytes %llu", s->slot_bytes,
                   s->header_bytes);
    if (s->meta_total_bytes <= ba || s->meta_total_bytes % ba)
        return bad(err, W, "meta_total_bytes %llu is not a multiple of block_align %llu above it", s->meta_total_bytes,
                   ba);
    return 0;
}

/* The superblock's geometry: the containers halve the metadata region and hold a superblock,
 * the data follows the region, and max_slots is what the data area holds. */
/* The extent stride and size classes of s, and the slot count they give into *ms. */
static int sb_check_extents(const rb_mlog_sb *s, uint64_t *ms, rb_err *err)
{
    static const char W[] = "metadata superblock";
    const uint64_t ba = s->block_align, st = s->extent_stride, sb = s->slot_bytes;
    const uint32_t ncls = s->size_classes;
    if (ncls == 1 || ncls > RB_SIZE_CLASSES_MAX || (ncls && (!st || s->header_bytes >= sb)))
        return bad(err, W, "size_classes %llu is not 2 to %u with an extent stride", (unsigned long long)ncls,
                   RB_SIZE_CLASSES_MAX);
    if (st && (st % ba || st / sb < 2 || st / sb > 0xFFFFFFull || (st % sb == 0 && !ncls)))
        return bad(err, W,
                   "extent stride %llu is not a multiple of block_align of 2 or more slots of %llu bytes, "
                   "not whole slots",
                   st, sb);
    *ms = (s->capacity - s->data_base) / sb;
    if (st) {
        uint64_t eb0 = (s->data_base + st - 1) / st * st;
        uint64_t per = st / (ncls ? rb_sc_slot_bytes(sb, s->header_bytes, ba, ncls - 1) : sb);
        *ms = eb0 < s->capacity ? (s->capacity - eb0) / st * per : 0;
    }
    return 0;
}

static int sb_check_geometry(const rb_mlog_sb *s, rb_err *err)
{
    static const char W[] = "metadata superblock";
    const uint64_t ba = s->block_align;
    if (s->container_bytes != s->meta_total_bytes / 2 / ba * ba)
        return bad(err, W, "container_bytes %llu is not half of the metadata region in blocks (%llu)",
                   s->container_bytes, s->meta_total_bytes / 2 / ba * ba);
    const uint64_t span = rb_mlog_sb_span(ba);
    if (s->container_bytes < span)
        return bad(err, W, "container_bytes %llu leaves no room for a superblock of %llu bytes", s->container_bytes,
                   span);
    if (s->data_base != s->meta_total_bytes)
        return bad(err, W, "data_base %llu is not meta_total_bytes %llu", s->data_base, s->meta_total_bytes);
    if (s->capacity <= s->data_base)
        return bad(err, W, "capacity %llu is not above data_base %llu", s->capacity, s->data_base);
    uint64_t ms = 0;
    int rc = sb_check_extents(s, &ms, err);
    if (rc < 0)
        return rc;
    if (ms == 0 || ms > UINT32_MAX - 1 || s->max_slots != ms)
        return bad(err, W, "max_slots %llu does not match the geometry (%llu)", s->max_slots, ms);
    return 0;
}

/* Region i of reg (the two base areas and the ring): non-empty, block-aligned, inside the
 * metadata region, clear of both superblocks and of the regions before it. */
static int sb_check_region(const rb_mlog_sb *s, const rb_mlog_area *reg, int i, rb_err *err)
{
    static const char *const rname[3] = {"base area 0", "base area 1", "log ring"};
    const uint64_t ba = s->block_align, mt = s->meta_total_bytes, span = rb_mlog_sb_span(ba);
    char what[64];
    snprintf(what, sizeof what, "metadata superblock %s", rname[i]);
    if (reg[i].len == 0 || reg[i].off % ba || reg[i].len % ba)
        return bad(err, what, "offset %llu, length %llu: empty or not block-aligned", reg[i].off, reg[i].len);
    if (reg[i].off > mt || reg[i].len > mt - reg[i].off)
        return bad(err, what, "ends at %llu, past the metadata region (%llu bytes)",
                   reg[i].off > mt ? reg[i].off : reg[i].off + reg[i].len, mt);
    if (overlaps(reg[i].off, reg[i].len, 0, span) || overlaps(reg[i].off, reg[i].len, s->container_bytes, span))
        return bad(err, what, "at offset %llu overlaps a superblock (at 0 and %llu)", reg[i].off, s->container_bytes);
    for (int j = 0; j < i; j++)
        if (overlaps(reg[i].off, reg[i].len, reg[j].off, reg[j].len))
            return bad(err, what, "at offset %llu overlaps the region at offset %llu", reg[i].off, reg[j].off);
    return 0;
}

/* The base the superblock points at: in area 0 or 1 and within it, its counts plausible. */
static int sb_check_base(const rb_mlog_sb *s, rb_err *err)
{
    static const char WB[] = "metadata superblock base";
    if (s->base.area > 1)
        return bad(err, WB, "area %llu is not 0 or 1", s->base.area, 0);
    if (s->base.len == 0 || s->base.len % s->block_align || s->base.len > s->areas[s->base.area].len)
        return bad(err, WB, "length %llu is empty, not block-aligned or past its area (%llu bytes)", s->base.len,
                   s->areas[s->base.area].len);
    if (s->base.next_slot > s->max_slots)
        return bad(err, WB, "next_slot %llu is above max_slots %llu", s->base.next_slot, s->max_slots);
    if (s->base.n_entries > s->base.next_slot)
        return bad(err, WB, "%llu entries cannot fit below next_slot %llu", s->base.n_entries, s->base.next_slot);
    if ((s->base.n_entries == 0) != (s->base.n_chunks == 0) || s->base.n_chunks > s->base.n_entries)
        return bad(err, WB, "%llu chunks cannot hold %llu entries", s->base.n_chunks, s->base.n_entries);
    if ((uint64_t)s->base.n_chunks > s->base.len / RB_MLOG_CHUNK_HDR_LEN)
        return bad(err, WB, "%llu chunks cannot fit in %llu bytes", s->base.n_chunks, s->base.len);
    return 0;
}

/* The log ring starts at a block inside it, with the sequence after the base's. */
static int sb_check_ring(const rb_mlog_sb *s, rb_err *err)
{
    static const char WR[] = "metadata superblock log ring";
    if (s->ring.start >= s->ring.len || s->ring.start % s->block_align)
        return bad(err, WR, "start %llu is not a block inside the ring (%llu bytes)", s->ring.start, s->ring.len);
    if (s->base.log_seq == UINT64_MAX || s->ring.start_seq != s->base.log_seq + 1)
        return bad(err, WR, "first sequence %llu does not follow the base's %llu", s->ring.start_seq, s->base.log_seq);
    return 0;
}

/* Every field of a superblock, in the order a reader meets them: sizes, geometry, the regions,
 * the base, the ring. 0, or -EBADMSG with err saying what is wrong. */
static int sb_check(const rb_mlog_sb *s, rb_err *err)
{
    int rc = sb_check_sizes(s, err);
    if (rc < 0 || (rc = sb_check_geometry(s, err)) < 0)
        return rc;
    const rb_mlog_area reg[3] = {s->areas[0], s->areas[1], {s->ring.off, s->ring.len}};
    for (int i = 0; i < 3; i++)
        if ((rc = sb_check_region(s, reg, i, err)) < 0)
            return rc;
    if ((rc = sb_check_base(s, err)) < 0)
        return rc;
    return sb_check_ring(s, err);
}

int rb_mlog_sb_encode(const rb_mlog_sb *sb, uint8_t *out, size_t out_len, rb_err *err)
{
    if (out_len < RB_MLOG_SB_LEN)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "metadata superblock: %zu bytes of room, %u needed", out_len,
                          RB_MLOG_SB_LEN);
    int rc = sb_check(sb, err);
    if (rc < 0) {
        if (err)
            err->errnum = EINVAL;
        return -EINVAL;
    }
    memset(out, 0, out_len);
    memcpy(out, RB_MLOG_SB_MAGIC, 8);
    rb_put_le(out + 8, RB_MLOG_VERSION, 4);
    rb_put_le(out + 12, RB_MLOG_SB_LEN, 4);
    /* 16: flags, 20..32: reserved (a format v1 reader finds payload_len 0 at 20) */
    rb_put_le(out + 32, sb->sb_seq, 8);
    rb_put_le(out + 40, sb->generation, 8);
    rb_put_le(out + 48, sb->block_align, 8);
    rb_put_le(out + 56, sb->header_bytes, 8);
    rb_put_le(out + 64, sb->slot_bytes, 8);
    rb_put_le(out + 72, sb->data_base, 8);
    rb_put_le(out + 80, sb->capacity, 8);
    rb_put_le(out + 88, sb->meta_total_bytes, 8);
    rb_put_le(out + 96, sb->container_bytes, 8);
    rb_put_le(out + 104, sb->max_slots, 4);
    rb_put_le(out + 112, sb->areas[0].off, 8);
    rb_put_le(out + 120, sb->areas[0].len, 8);
    rb_put_le(out + 128, sb->areas[1].off, 8);
    rb_put_le(out + 136, sb->areas[1].len, 8);
    rb_put_le(out + 144, sb->base.area, 4);
    rb_put_le(out + 148, sb->base.n_chunks, 4);
    rb_put_le(out + 152, sb->base.len, 8);
    rb_put_le(out + 160, sb->base.n_entries, 8);
    rb_put_le(out + 168, sb->base.log_seq, 8);
    rb_put_le(out + 176, sb->base.next_slot, 4);
    rb_put_le(out + 184, sb->ring.off, 8);
    rb_put_le(out + 192, sb->ring.len, 8);
    rb_put_le(out + 200, sb->ring.start, 8);
    rb_put_le(out + 208, sb->ring.start_seq, 8);
    rb_put_le(out + 216, sb->epoch, 4);
    rb_put_le(out + 224, sb->extent_stride, 8);
    rb_put_le(out + 232, sb->size_classes > 1 ? sb->size_classes : 0, 4);
    rb_put_le(out + SB_CRC_OFF, crc_more(0, out, SB_CRC_OFF), 4);
    return 0;
}

/* 1 when in[a, b) is all zero. */
static int zero_bytes(const uint8_t *in, size_t a, size_t b)
{
    for (size_t i = a; i < b; i++)
        if (in[i])
            return 0;
    return 1;
}

int rb_mlog_sb_decode(const uint8_t *in, size_t len, rb_mlog_sb *out, rb_err *err)
{
    static const char W[] = "metadata superblock";
    if (len < RB_MLOG_SB_LEN)
        return bad(err, W, "%llu bytes, %llu needed", len, RB_MLOG_SB_LEN);
    if (memcmp(in, RB_MLOG_SB_MAGIC, 8) != 0)
        return bad(err, W, "bad magic", 0, 0);
    uint32_t ver = (uint32_t)rb_get_le(in + 8, 4);
    if (ver != RB_MLOG_VERSION)
        return rb_err_set(err, RB_ERR_VALUE, EPROTONOSUPPORT, "%s: format version %u, this build reads %u", W, ver,
                          RB_MLOG_VERSION);
    uint32_t sblen = (uint32_t)rb_get_le(in + 12, 4);
    if (sblen != RB_MLOG_SB_LEN)
        return bad(err, W, "length field %llu, expected %llu", sblen, RB_MLOG_SB_LEN);
    uint32_t stored = (uint32_t)rb_get_le(in + SB_CRC_OFF, 4), crc = crc_more(0, in, SB_CRC_OFF);
    if (stored != crc)
        return bad(err, W, "CRC mismatch (stored 0x%08llx, computed 0x%08llx)", stored, crc);
    if (!zero_bytes(in, 16, 32) || !zero_bytes(in, 108, 112) || !zero_bytes(in, 180, 184) ||
        !zero_bytes(in, 220, 224) || !zero_bytes(in, 236, SB_CRC_OFF))
        return bad(err, W, "flags or reserved bytes are not zero", 0, 0);
    rb_mlog_sb s;
    memset(&s, 0, sizeof s);
    s.sb_seq = rb_get_le(in + 32, 8);
    s.generation = rb_get_le(in + 40, 8);
    s.block_align = rb_get_le(in + 48, 8);
    s.header_bytes = rb_get_le(in + 56, 8);
    s.slot_bytes = rb_get_le(in + 64, 8);
    s.data_base = rb_get_le(in + 72, 8);
    s.capacity = rb_get_le(in + 80, 8);
    s.meta_total_bytes = rb_get_le(in + 88, 8);
    s.container_bytes = rb_get_le(in + 96, 8);
    s.max_slots = (uint32_t)rb_get_le(in + 104, 4);
    s.areas[0].off = rb_get_le(in + 112, 8);
    s.areas[0].len = rb_get_le(in + 120, 8);
    s.areas[1].off = rb_get_le(in + 128, 8);
    s.areas[1].len = rb_get_le(in + 136, 8);
    s.base.area = (uint32_t)rb_get_le(in + 144, 4);
    s.base.n_chunks = (uint32_t)rb_get_le(in + 148, 4);
    s.base.len = rb_get_le(in + 152, 8);
    s.base.n_entries = rb_get_le(in + 160, 8);
    s.base.log_seq = rb_get_le(in + 168, 8);
    s.base.next_slot = (uint32_t)rb_get_le(in + 176, 4);
    s.ring.off = rb_get_le(in + 184, 8);
    s.ring.len = rb_get_le(in + 192, 8);
    s.ring.start = rb_get_le(in + 200, 8);
    s.ring.start_seq = rb_get_le(in + 208, 8);
    s.epoch = (uint32_t)rb_get_le(in + 216, 4);
    s.extent_stride = rb_get_le(in + 224, 8);
    s.size_classes = (uint32_t)rb_get_le(in + 232, 4);
    if (s.epoch > RB_MLOG_EPOCH_MAX)
        return bad(err, W, "writer epoch %llu is above %llu", s.epoch, RB_MLOG_EPOCH_MAX);
    int rc = sb_check(&s, err);
    if (rc < 0)
        return rc;
    *out = s;
    return 0;
}

uint64_t rb_mlog_sb_slot_offset(const rb_mlog_sb *sb, uint32_t slot, uint64_t size)
{
    const uint64_t st = sb->extent_stride, hb = sb->header_bytes, ba = sb->block_align;
    if (!st)
        return sb->data_base + (uint64_t)slot * sb->slot_bytes;
    uint64_t per = st / sb->slot_bytes, one = sb->slot_bytes;
    if (sb->size_classes > 1) {
        per = st / rb_sc_slot_bytes(sb->slot_bytes, hb, ba, sb->size_classes - 1);
        one = rb_sc_slot_bytes(sb->slot_bytes, hb, ba, rb_sc_of(size, sb->slot_bytes, hb, ba, sb->size_classes));
    }
    const uint64_t base = (sb->data_base + st - 1) / st * st;
    return base + slot / per * st + slot % per * one;
}

/* ---- log groups -------------------------------------------------------------------------- */

#define GRP_HCRC_OFF 40
#define GRP_CRC_OFF 44
#define GRP_ZHDR 4 /* a deflated body starts with its raw length */
/* Deflate expands at most 1032:1 (258-byte matches in 2 bits); anything beyond is damage. */
#define DEFLATE_MAX_RATIO 1032u

void rb_mlog_genc_init(rb_mlog_genc *g)
{
    memset(g, 0, sizeof *g);
}

void rb_mlog_genc_free(rb_mlog_genc *g)
{
    rb_buf_free(&g->body);
    g->n_records = 0;
}

void rb_mlog_genc_reset(rb_mlog_genc *g)
{
    g->body.len = 0;
    g->body.oom = 0;
    g->n_records = 0;
    g->n_pos = 0;
}

static int genc_room(rb_mlog_genc *g, size_t n, rb_err *err)
{
    if (g->n_records == UINT32_MAX)
        return rb_err_set(err, RB_ERR_VALUE, E2BIG, "log group: more than %u records", UINT32_MAX);
    if (n == 0 || rb_buf_reserve(&g->body, n) < 0)
        return n ? nomem(err, "log group") : rb_err_set(err, RB_ERR_VALUE, E2BIG, "log group: record too large");
    return 0;
}

int rb_mlog_genc_put(rb_mlog_genc *g, const rb_mlog_ent *e, rb_err *err)
{
    size_t tb = tail_bound(e);
    if (tb == 0 || e->key_len > SIZE_MAX / 2 - tb)
        return rb_err_set(err, RB_ERR_VALUE, E2BIG, "log group PUT: %lld positions, at most %u", (long long)e->npos,
                          RB_MLOG_POS_MAX);
    if (npos_of(e) > RB_MLOG_POS_BUDGET - g->n_pos)
        return rb_err_set(err, RB_ERR_VALUE, E2BIG,
                          "log group PUT: the group holds %llu positions, %lld more "
                          "would pass %u; start another group",
                          (unsigned long long)g->n_pos, (long long)e->npos, RB_MLOG_POS_BUDGET);
    int rc = genc_room(g, 1 + 2 * VARINT_MAX + e->key_len + tb, err);
    if (rc < 0)
        return rc;
    uint8_t *p0 = (uint8_t *)g->body.data + g->body.len, *p = p0;
    *p++ = RB_MLOG_PUT;
    p = put_varint(p, e->key_len);
    if (e->key_len)
        memcpy(p, e->key, e->key_len);
    p += e->key_len;
    p = put_varint(p, e->slot);
    p = put_tail(p, e, e->size);
    g->body.len += (size_t)(p - p0);
    g->n_records++;
    g->n_pos += npos_of(e);
    return 0;
}

int rb_mlog_genc_free_slot(rb_mlog_genc *g, uint32_t slot, rb_err *err)
{
    int rc = genc_room(g, 1 + VARINT_MAX, err);
    if (rc < 0)
        return rc;
    uint8_t *p0 = (uint8_t *)g->body.data + g->body.len, *p = p0;
    *p++ = RB_MLOG_FREE;
    p = put_varint(p, slot);
    g->body.len += (size_t)(p - p0);
    g->n_records++;
    return 0;
}

int rb_mlog_genc_class(rb_mlog_genc *g, const rb_mlog_class *c, rb_err *err)
{
    int rc = genc_room(g, 1 + 2 * VARINT_MAX + (size_t)c->frag_len, err);
    if (rc < 0)
        return rc;
    uint8_t *p0 = (uint8_t *)g->body.data + g->body.len, *p = p0;
    *p++ = RB_MLOG_CLASS;
    p = put_varint(p, c->id);
    p = put_varint(p, c->frag_len);
    if (c->frag_len)
        memcpy(p, c->frag, c->frag_len);
    p += c->frag_len;
    g->body.len += (size_t)(p - p0);
    g->n_records++;
    return 0;
}

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

uint64_t rb_mlog_genc_len(const rb_mlog_genc *g, uint64_t block_align)
{
    return round_up(RB_MLOG_GROUP_HDR_LEN + (uint64_t)g->body.len, block_align ? block_align : 1);
}

/* Header fields and CRCs of a group whose stored body (body_len bytes) is at out + 48. */
static void group_header(uint8_t *out, uint64_t generation, uint64_t seq, uint64_t body_len, uint32_t n_records,
                         uint32_t flags)
{
    memcpy(out, RB_MLOG_GROUP_MAGIC, 8);
    rb_put_le(out + 8, generation, 8);
    rb_put_le(out + 16, seq, 8);
    rb_put_le(out + 24, body_len, 8);
    rb_put_le(out + 32, n_records, 4);
    rb_put_le(out + 36, flags, 4);
    rb_put_le(out + GRP_HCRC_OFF, crc_more(0, out, GRP_HCRC_OFF), 4);
    uint32_t crc = crc_more(crc_more(0, out, GRP_CRC_OFF), out + RB_MLOG_GROUP_HDR_LEN, (size_t)body_len);
    rb_put_le(out + GRP_CRC_OFF, crc, 4);
}

int rb_mlog_genc_finish(const rb_mlog_genc *g, uint64_t generation, uint64_t seq, uint64_t block_align, uint8_t *out,
                        size_t out_len, rb_err *err)
{
    if (!is_pow2(block_align) || generation == 0 || seq == 0)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "log group: block_align %llu, generation %llu, seq %llu: "
                          "a power of two and nonzero ids needed",
                          (unsigned long long)block_align, (unsigned long long)generation, (unsigned long long)seq);
    if (g->body.oom)
        return nomem(err, "log group");
    uint64_t total = rb_mlog_genc_len(g, block_align);
    if (out_len < total)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "log group: %zu bytes of room, %llu needed", out_len,
                          (unsigned long long)total);
    if (g->body.len)
        memcpy(out + RB_MLOG_GROUP_HDR_LEN, g->body.data, g->body.len);
    group_header(out, generation, seq, g->body.len, g->n_records, (uint32_t)g->epoch << RB_MLOG_GROUP_EPOCH_SHIFT);
    memset(out + RB_MLOG_GROUP_HDR_LEN + g->body.len, 0, out_len - RB_MLOG_GROUP_HDR_LEN - g->body.len);
    return 0;
}

/* Deflate g's body into the group at h (after the header: its raw length, then the stream)
 * where that saves a block: the compressed group must end at least one block before the raw
 * one (raw_total bytes), so the stream gets that much room and no more (deflate stops early
 * when the body does not compress enough). *stored: the stored body's length when deflated.
 * 1 deflated, 0 not, -ENOMEM. */
static int group_deflate(const rb_mlog_genc *g, uint8_t *h, uint64_t raw_total, uint64_t block_align, int level,
                         uint64_t *stored)
{
    if (level <= 0 || raw_total <= block_align || g->body.len > RB_MLOG_CHUNK_RAW_MAX ||
        raw_total - block_align <= RB_MLOG_GROUP_HDR_LEN + GRP_ZHDR)
        return 0;
    uint64_t room = raw_total - block_align - RB_MLOG_GROUP_HDR_LEN - GRP_ZHDR;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return -ENOMEM;
    z.next_in = (const Bytef *)g->body.data;
    z.avail_in = (uInt)g->body.len;
    z.next_out = h + RB_MLOG_GROUP_HDR_LEN + GRP_ZHDR;
    z.avail_out = (uInt)(room < UINT_MAX ? room : UINT_MAX);
    int zr = deflate(&z, Z_FINISH);
    uint64_t comp = z.total_out;
    deflateEnd(&z);
    if (zr != Z_STREAM_END)
        return 0;
    rb_put_le(h + RB_MLOG_GROUP_HDR_LEN, g->body.len, GRP_ZHDR);
    *stored = GRP_ZHDR + comp;
    return 1;
}

int rb_mlog_genc_seal(const rb_mlog_genc *g, uint64_t generation, uint64_t seq, uint64_t block_align, int level,
                      rb_buf *out, rb_err *err)
{
    if (!is_pow2(block_align) || generation == 0 || seq == 0 || level < 0 || level > 9)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "log group: block_align %llu, generation %llu, seq %llu, "
                          "level %d: a power of two, nonzero ids and a level 0..9 needed",
                          (unsigned long long)block_align, (unsigned long long)generation, (unsigned long long)seq,
                          level);
    if (g->body.oom || out->oom)
        return nomem(err, "log group");
    const uint64_t raw_total = rb_mlog_genc_len(g, block_align);
    const size_t at = out->len;
    if (raw_total > SIZE_MAX - at || rb_buf_reserve(out, (size_t)raw_total) < 0) {
        out->oom = 0;
        return nomem(err, "log group");
    }
    uint8_t *h = (uint8_t *)out->data + at;
    uint64_t stored = g->body.len;
    int z = group_deflate(g, h, raw_total, block_align, level, &stored);
    if (z < 0)
        return nomem(err, "log group");
    uint32_t flags = z ? RB_MLOG_GROUP_DEFLATE : 0;
    if (!flags && g->body.len)
        memcpy(h + RB_MLOG_GROUP_HDR_LEN, g->body.data, g->body.len);
    group_header(h, generation, seq, stored, g->n_records, flags | ((uint32_t)g->epoch << RB_MLOG_GROUP_EPOCH_SHIFT));
    uint64_t total = round_up(RB_MLOG_GROUP_HDR_LEN + stored, block_align);
    memset(h + RB_MLOG_GROUP_HDR_LEN + stored, 0, (size_t)(total - RB_MLOG_GROUP_HDR_LEN - stored));
    out->len = at + (size_t)total;
    return 0;
}

/* A group header's body length and record count fit each other (a deflated body: its raw
 * length then a stream of 2 bytes at least, the records in the raw bytes); g->raw_len is the
 * body's when stored raw, 0 (not known yet) when deflated. */
static int group_body_plausible(rb_mlog_group_info *g, rb_err *err)
{
    static const char W[] = "log group";
    if (g->flags & RB_MLOG_GROUP_DEFLATE) {
        if (g->body_len < GRP_ZHDR + 2 || g->body_len > GRP_ZHDR + (uint64_t)RB_MLOG_CHUNK_RAW_MAX)
            return bad(err, W, "deflated body length %llu is implausible", g->body_len, 0);
        if ((uint64_t)g->n_records > RB_MLOG_CHUNK_RAW_MAX / 2)
            return bad(err, W, "%llu records cannot fit in a deflated body", g->n_records, 0);
        g->raw_len = 0;
        return 0;
    }
    if (g->body_len > (1ull << 62))
        return bad(err, W, "body length %llu is implausible", g->body_len, 0);
    if ((uint64_t)g->n_records > g->body_len / 2) /* a record takes 2 bytes at least */
        return bad(err, W, "%llu records cannot fit in %llu body bytes", g->n_records, g->body_len);
    g->raw_len = g->body_len;
    return 0;
}

int rb_mlog_group_head(const uint8_t *in, size_t len, uint64_t block_align, uint64_t expect_gen, uint64_t expect_seq,
                       rb_mlog_group_info *gi, rb_err *err)
{
    static const char W[] = "log group";
    if (!is_pow2(block_align))
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s: block_align %llu is not a power of two", W,
                          (unsigned long long)block_align);
    if (len < RB_MLOG_GROUP_HDR_LEN)
        return bad(err, W, "%llu bytes, the header needs %llu", len, RB_MLOG_GROUP_HDR_LEN);
    if (memcmp(in, RB_MLOG_GROUP_MAGIC, 8) != 0)
        return bad(err, W, "bad magic", 0, 0);
    uint32_t stored = (uint32_t)rb_get_le(in + GRP_HCRC_OFF, 4), crc = crc_more(0, in, GRP_HCRC_OFF);
    if (stored != crc)
        return bad(err, W, "header CRC mismatch (stored 0x%08llx, computed 0x%08llx)", stored, crc);
    rb_mlog_group_info g;
    g.flags = (uint32_t)rb_get_le(in + 36, 4);
    g.epoch = g.flags >> RB_MLOG_GROUP_EPOCH_SHIFT;
    g.flags &= (1u << RB_MLOG_GROUP_EPOCH_SHIFT) - 1;
    if (g.flags & ~RB_MLOG_GROUP_DEFLATE)
        return bad(err, W, "flags 0x%llx have unknown bits", g.flags, 0);
    g.generation = rb_get_le(in + 8, 8);
    g.seq = rb_get_le(in + 16, 8);
    g.body_len = rb_get_le(in + 24, 8);
    g.n_records = (uint32_t)rb_get_le(in + 32, 4);
    if (g.generation == 0 || g.seq == 0)
        return bad(err, W, "generation %llu or sequence %llu is 0", g.generation, g.seq);
    int rc = group_body_plausible(&g, err);
    if (rc < 0)
        return rc;
    g.total_len = round_up(RB_MLOG_GROUP_HDR_LEN + g.body_len, block_align);
    *gi = g;
    if (expect_gen && g.generation != expect_gen)
        return rb_err_set(err, RB_ERR_VALUE, ESTALE, "%s: generation %llu, expected %llu", W,
                          (unsigned long long)g.generation, (unsigned long long)expect_gen);
    if (expect_seq && g.seq != expect_seq)
        return rb_err_set(err, RB_ERR_VALUE, ESTALE, "%s: sequence %llu, expected %llu", W, (unsigned long long)g.seq,
                          (unsigned long long)expect_seq);
    return 0;
}

/* A PUT record after its type byte: key, slot, then the entry tail. */
static int rd_put(rd *r, rb_mlog_rec *rec, int64_t **pos, size_t *pos_cap, uint64_t *budget)
{
    const uint8_t *k = NULL;
    uint64_t v;
    int rc;
    if ((rc = rd_varint(r, "key length", UINT32_MAX, &v)) < 0 || (rc = rd_bytes(r, "key", v, &k)) < 0)
        return rc;
    rec->ent.key = (const char *)k;
    rec->ent.key_len = (uint32_t)v;
    if ((rc = rd_varint(r, "slot", UINT32_MAX, &v)) < 0)
        return rc;
    rec->ent.slot = (uint32_t)v;
    return rd_tail(r, &rec->ent, &rec->ent.size, pos, pos_cap, budget);
}

/* A CLASS record after its type byte: the class id, then its fragment. */
static int rd_class(rd *r, rb_mlog_class *cls)
{
    const uint8_t *f = NULL;
    uint64_t v;
    int rc;
    if ((rc = rd_varint(r, "class id", UINT32_MAX, &v)) < 0)
        return rc;
    cls->id = (uint32_t)v;
    if ((rc = rd_varint(r, "fragment length", UINT32_MAX, &v)) < 0 || (rc = rd_bytes(r, "fragment", v, &f)) < 0)
        return rc;
    cls->frag = (const char *)f;
    cls->frag_len = (uint32_t)v;
    return 0;
}

/* One record of a body into *rec (zeroed first). */
static int rd_record(rd *r, rb_mlog_rec *rec, int64_t **pos, size_t *pos_cap, uint64_t *budget)
{
    const uint8_t *tp = NULL;
    uint64_t v;
    int rc;
    memset(rec, 0, sizeof *rec);
    if ((rc = rd_bytes(r, "type", 1, &tp)) < 0)
        return rc;
    rec->type = *tp;
    switch (*tp) {
    case RB_MLOG_PUT:
        return rd_put(r, rec, pos, pos_cap, budget);
    case RB_MLOG_FREE:
        if ((rc = rd_varint(r, "slot", UINT32_MAX, &v)) < 0)
            return rc;
        rec->slot = (uint32_t)v;
        return 0;
    case RB_MLOG_CLASS:
        return rd_class(r, &rec->cls);
    default:
        r->p--;
        return rd_fail(r, "type", "is unknown");
    }
}

/* Parse the records of a body; deliver them to fn when fn is set. */
static int group_records(const uint8_t *body, uint64_t body_len, uint32_t n, rb_mlog_rec_fn fn, void *ctx,
                         int64_t **pos, size_t *pos_cap, rb_err *err)
{
    rd r = {.p = body, .end = body + body_len, .start = body, .kind = RD_GROUP, .err = err};
    uint64_t budget = RB_MLOG_POS_BUDGET;
    for (uint32_t i = 0; i < n; i++) {
        r.i = i;
        rb_mlog_rec rec;
        int rc = rd_record(&r, &rec, pos, pos_cap, &budget);
        if (rc < 0)
            return rc;
        if (fn && (rc = fn(ctx, &rec)) != 0)
            return rc;
    }
    if (r.p != r.end)
        return bad(err, "log group", "%llu bytes after the last record (body of %llu)",
                   (unsigned long long)(r.end - r.p), body_len);
    return 0;
}

void rb_mlog_gdec_init(rb_mlog_gdec *d)
{
    memset(d, 0, sizeof *d);
}

void rb_mlog_gdec_free(rb_mlog_gdec *d)
{
    zstate_free(d->z);
    free(d->raw);
    free(d->pos);
    memset(d, 0, sizeof *d);
}

/* Inflate a deflated body (after its CRC was checked) into d->raw; *raw_len its length. */
static int group_inflate(rb_mlog_gdec *d, const uint8_t *body, uint64_t body_len, uint32_t n_records, uint64_t *raw_len,
                         rb_err *err)
{
    static const char W[] = "log group";
    uint64_t raw = rb_get_le(body, GRP_ZHDR), comp = body_len - GRP_ZHDR;
    if (raw > RB_MLOG_CHUNK_RAW_MAX || raw > (uint64_t)DEFLATE_MAX_RATIO * comp)
        return bad(err, W, "deflated body: raw length %llu is implausible (compressed %llu)", raw, comp);
    if ((uint64_t)n_records > raw / 2)
        return bad(err, W, "%llu records cannot fit in %llu raw body bytes", n_records, raw);
    if (raw > d->raw_cap || !d->raw) {
        uint8_t *p = realloc(d->raw, raw ? (size_t)raw : 1);
        if (!p)
            return nomem(err, W);
        d->raw = p;
        d->raw_cap = raw ? (size_t)raw : 1;
    }
    size_t got = 0, left = 0;
    int zr = raw_inflate(&d->z, body + GRP_ZHDR, (size_t)comp, d->raw, (size_t)raw, &got, &left);
    if (zr < 0)
        return nomem(err, W);
    if (zr)
        return rb_err_set(err, RB_ERR_VALUE, EBADMSG,
                          "%s: deflated body does not inflate to its %llu raw bytes "
                          "(%zu out, %zu in left)",
                          W, (unsigned long long)raw, got, left);
    *raw_len = raw;
    return 0;
}

int rb_mlog_gdec_group(rb_mlog_gdec *d, const uint8_t *in, size_t len, uint64_t block_align, uint64_t expect_gen,
                       uint64_t expect_seq, rb_mlog_group_info *gi, rb_mlog_rec_fn fn, void *ctx, rb_err *err)
{
    d->cb_rc = 0;
    rb_mlog_group_info g;
    int rc = rb_mlog_group_head(in, len, block_align, expect_gen, expect_seq, &g, err);
    if (gi && (rc == 0 || rc == -ESTALE))
        *gi = g;
    if (rc < 0)
        return rc;
    if (g.body_len > len - RB_MLOG_GROUP_HDR_LEN)
        return bad(err, "log group", "truncated: the body needs %llu bytes, %llu given", g.body_len,
                   len - RB_MLOG_GROUP_HDR_LEN);
    const uint8_t *body = in + RB_MLOG_GROUP_HDR_LEN;
    uint32_t stored = (uint32_t)rb_get_le(in + GRP_CRC_OFF, 4);
    uint32_t crc = crc_more(crc_more(0, in, GRP_CRC_OFF), body, (size_t)g.body_len);
    if (stored != crc)
        return bad(err, "log group", "CRC mismatch (stored 0x%08llx, computed 0x%08llx)", stored, crc);
    uint64_t raw_len = g.body_len;
    if (g.flags & RB_MLOG_GROUP_DEFLATE) {
        if ((rc = group_inflate(d, body, g.body_len, g.n_records, &raw_len, err)) < 0)
            return rc;
        body = d->raw;
    }
    rc = group_records(body, raw_len, g.n_records, NULL, NULL, &d->pos, &d->pos_cap, err);
    if (rc == 0 && fn) {
        rc = group_records(body, raw_len, g.n_records, fn, ctx, &d->pos, &d->pos_cap, err);
        if (rc != 0)
            d->cb_rc = rc; /* the first pass checked every record: only fn stops the second */
    }
    if (rc == 0 && gi)
        gi->raw_len = raw_len;
    return rc;
}

int rb_mlog_group_decode(const uint8_t *in, size_t len, uint64_t block_align, uint64_t expect_gen, uint64_t expect_seq,
                         rb_mlog_group_info *gi, rb_mlog_rec_fn fn, void *ctx, rb_err *err)
{
    rb_mlog_gdec d;
    rb_mlog_gdec_init(&d);
    int rc = rb_mlog_gdec_group(&d, in, len, block_align, expect_gen, expect_seq, gi, fn, ctx, err);
    rb_mlog_gdec_free(&d);
    return rc;
}

/* ---- bases: shared layout ---------------------------------------------------------------- */

#define BASE_HCRC_OFF 52
#define CHUNK_HCRC_OFF 56
#define END_CRC_OFF 44
#define CHUNK_METHOD_DEFLATE 1u
/* An entry takes 6 raw bytes at least: shared, suffix length, slot delta, size, class, flags. */
#define ENT_MIN_RAW 6u
static int class_known(const uint32_t *ids, uint32_t n, uint32_t id)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ids[mid] == id)
            return 1;
        if (ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* ---- base encoder ------------------------------------------------------------------------ */

/* The class table's ids ascend strictly; *tab: the most bytes it takes encoded. */
static int benc_class_bound(const rb_mlog_class *cls, uint32_t n_cls, size_t *tab, rb_err *err)
{
    *tab = 0;
    for (uint32_t i = 0; i < n_cls; i++) {
        if (i && cls[i].id <= cls[i - 1].id)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "base encoder: class ids not strictly ascending (%u after %u)",
                              cls[i].id, cls[i - 1].id);
        *tab += 2 * VARINT_MAX + cls[i].frag_len;
    }
    return 0;
}

/* Write the base header and class table at the start of e->out (room reserved) and keep the
 * class ids in e->cls_ids. */
static void benc_header(rb_mlog_benc *e, const rb_mlog_class *cls, uint32_t n_cls)
{
    uint8_t *h = (uint8_t *)e->out.data, *p = h + RB_MLOG_BASE_HDR_LEN;
    for (uint32_t i = 0; i < n_cls; i++) {
        e->cls_ids[i] = cls[i].id;
        p = put_varint(p, cls[i].id);
        p = put_varint(p, cls[i].frag_len);
        if (cls[i].frag_len)
            memcpy(p, cls[i].frag, cls[i].frag_len);
        p += cls[i].frag_len;
    }
    uint64_t tab_len = (uint64_t)(p - h) - RB_MLOG_BASE_HDR_LEN;
    memcpy(h, RB_MLOG_BASE_MAGIC, 8);
    rb_put_le(h + 8, RB_MLOG_VERSION, 4);
    rb_put_le(h + 12, 0, 4);
    rb_put_le(h + 16, e->generation, 8);
    rb_put_le(h + 24, e->log_seq, 8);
    rb_put_le(h + 32, e->next_slot, 4);
    rb_put_le(h + 36, n_cls, 4);
    rb_put_le(h + 40, tab_len, 8);
    rb_put_le(h + 48, crc_more(0, h + RB_MLOG_BASE_HDR_LEN, (size_t)tab_len), 4);
    rb_put_le(h + BASE_HCRC_OFF, crc_more(0, h, BASE_HCRC_OFF), 4);
    e->out.len = (size_t)(p - h);
    e->produced = e->out.len;
}

int rb_mlog_benc_init(rb_mlog_benc *e, uint64_t generation, uint64_t log_seq, uint32_t next_slot,
                      const rb_mlog_class *cls, uint32_t n_cls, const rb_mlog_benc_opts *opts, rb_err *err)
{
    static const char W[] = "base encoder";
    memset(e, 0, sizeof *e);
    int level = opts && opts->level ? opts->level : RB_MLOG_LEVEL_DEFAULT;
    uint32_t chunk_raw = opts && opts->chunk_raw ? opts->chunk_raw : RB_MLOG_CHUNK_RAW_DEFAULT;
    if (generation == 0 || level < 1 || level > 9 || chunk_raw > RB_MLOG_CHUNK_RAW_MAX)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s: generation %llu, level %d, chunk_raw %u: out of range", W,
                          (unsigned long long)generation, level, chunk_raw);
    size_t tab = 0;
    int rc = benc_class_bound(cls, n_cls, &tab, err);
    if (rc < 0)
        return rc;
    e->chunk_raw = chunk_raw;
    e->generation = generation;
    e->log_seq = log_seq;
    e->next_slot = next_slot;
    e->cls_ids = malloc((n_cls ? n_cls : 1) * sizeof *e->cls_ids);
    z_stream *z = calloc(1, sizeof *z);
    if (!e->cls_ids || !z || rb_buf_reserve(&e->out, RB_MLOG_BASE_HDR_LEN + tab) < 0 ||
        deflateInit2(z, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
        free(z);
        rb_mlog_benc_free(e);
        return nomem(err, W);
    }
    e->z = z;
    e->n_cls = n_cls;
    benc_header(e, cls, n_cls);
    return 0;
}

void rb_mlog_benc_free(rb_mlog_benc *e)
{
    if (e->z) {
        deflateEnd(e->z);
        free(e->z);
    }
    rb_buf_free(&e->out);
    rb_buf_free(&e->raw);
    rb_buf_free(&e->key);
    free(e->cls_ids);
    memset(e, 0, sizeof *e);
}

static size_t common_prefix(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen, i = 0;
    while (i + 8 <= n) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        if (x != y)
            break;
        i += 8;
    }
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Compress the raw stream into out as one chunk. */
static int benc_flush(rb_mlog_benc *e, rb_err *err)
{
    if (e->chunk_n == 0)
        return 0;
    z_stream *z = e->z;
    uLong bound = deflateBound(z, (uLong)e->raw.len);
    if (rb_buf_reserve(&e->out, RB_MLOG_CHUNK_HDR_LEN + (size_t)bound) < 0)
        return nomem(err, "base encoder");
    uint8_t *h = (uint8_t *)e->out.data + e->out.len, *c = h + RB_MLOG_CHUNK_HDR_LEN;
    if (deflateReset(z) != Z_OK)
        return rb_err_set(err, RB_ERR_RUNTIME, EIO, "base encoder: deflateReset failed");
    z->next_in = (const Bytef *)e->raw.data;
    z->avail_in = (uInt)e->raw.len;
    z->next_out = c;
    z->avail_out = (uInt)bound;
    int zr = deflate(z, Z_FINISH);
    if (zr != Z_STREAM_END)
        return rb_err_set(err, RB_ERR_RUNTIME, EIO, "base encoder: deflate of chunk %u returned %d", e->n_chunks, zr);
    uint32_t comp = (uint32_t)z->total_out;
    memcpy(h, RB_MLOG_CHUNK_MAGIC, 8);
    rb_put_le(h + 8, e->generation, 8);
    rb_put_le(h + 16, e->log_seq, 8);
    rb_put_le(h + 24, e->n_chunks, 4);
    rb_put_le(h + 28, e->chunk_n, 4);
    rb_put_le(h + 32, e->raw.len, 4);
    rb_put_le(h + 36, comp, 4);
    rb_put_le(h + 40, e->first_slot, 4);
    rb_put_le(h + 44, e->prev_slot, 4);
    rb_put_le(h + 48, CHUNK_METHOD_DEFLATE, 4); /* method byte, then 3 reserved zero bytes */
    rb_put_le(h + 52, crc_more(0, c, comp), 4);
    rb_put_le(h + CHUNK_HCRC_OFF, crc_more(0, h, CHUNK_HCRC_OFF), 4);
    e->out.len += RB_MLOG_CHUNK_HDR_LEN + comp;
    e->produced += RB_MLOG_CHUNK_HDR_LEN + comp;
    e->n_chunks++;
    e->chunk_n = 0;
    e->chunk_pos = 0;
    e->raw.len = 0;
    return 0;
}

/* ent may follow what e holds: e started, its slot above the last and below next_slot, a
 * class of the table, known flags, and a size a chunk can hold; *tb the tail's bound. */
static int benc_check(const rb_mlog_benc *e, const rb_mlog_ent *ent, size_t *tb, rb_err *err)
{
    static const char W[] = "base encoder";
    if (e->finished || !e->z)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s: not started, or already finished", W);
    if (e->any && ent->slot <= e->prev_slot)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s: slot %u after slot %u: slots must ascend strictly", W,
                          ent->slot, e->prev_slot);
    if (ent->slot >= e->next_slot)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s: slot %u is not below next_slot %u", W, ent->slot,
                          e->next_slot);
    if (!class_known(e->cls_ids, e->n_cls, ent->cls))
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s: slot %u has class %u, which is not in the class table", W,
                          ent->slot, ent->cls);
    if (ent->flags & ~RB_MLOG_ENT_SUM)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s: slot %u has unknown flags 0x%x", W, ent->slot, ent->flags);
    *tb = tail_bound(ent);
    if (*tb == 0 || ent->key_len > RB_MLOG_CHUNK_RAW_MAX)
        return rb_err_set(err, RB_ERR_VALUE, E2BIG, "%s: slot %u: the entry cannot fit a chunk", W, ent->slot);
    return 0;
}

/* Encode ent after the raw stream's end (room reserved), its key sharing shared bytes with the
 * previous one (first: it starts a chunk, deltas from 0); the bytes it takes. */
static size_t benc_encode(rb_mlog_benc *e, const rb_mlog_ent *ent, size_t shared, int first)
{
    uint8_t *p0 = (uint8_t *)e->raw.data + e->raw.len, *p = p0;
    p = put_varint(p, shared);
    p = put_varint(p, ent->key_len - shared);
    if (ent->key_len > shared)
        memcpy(p, ent->key + shared, ent->key_len - shared);
    p += ent->key_len - shared;
    p = put_varint(p, first ? 0 : (uint64_t)ent->slot - e->prev_slot - 1);
    p = put_tail(p, ent, zigzag(ent->size - (first ? 0 : e->prev_size)));
    return (size_t)(p - p0);
}

/* Keep ent's n encoded bytes: its key becomes the previous one (the tail of the buffer only
 * when it differs) and the chunk's counts take it. Out of memory for the key drops the entry
 * and closes the chunk, so the encoder stays consistent. */
static int benc_commit(rb_mlog_benc *e, const rb_mlog_ent *ent, size_t shared, size_t n, int first, rb_err *err)
{
    if (key_set(&e->key, shared, ent->key_len > shared ? ent->key + shared : NULL, ent->key_len - shared) < 0) {
        e->key.len = 0; /* the next entry starts a chunk */
        if (e->chunk_n) {
            int rc = benc_flush(e, err);
            if (rc < 0)
                return rc;
        }
        return nomem(err, "base encoder");
    }
    e->raw.len += n;
    if (first)
        e->first_slot = ent->slot;
    e->prev_slot = ent->slot;
    e->prev_size = ent->size;
    e->chunk_n++;
    e->chunk_pos += npos_of(ent);
    e->n_entries++;
    e->any = 1;
    return 0;
}

int rb_mlog_benc_add(rb_mlog_benc *e, const rb_mlog_ent *ent, rb_err *err)
{
    static const char W[] = "base encoder";
    size_t tb = 0;
    int rc = benc_check(e, ent, &tb, err);
    if (rc < 0)
        return rc;
    if (e->chunk_n && (e->raw.len >= e->chunk_raw || npos_of(ent) > RB_MLOG_POS_BUDGET - e->chunk_pos) &&
        (rc = benc_flush(e, err)) < 0)
        return rc;
    for (;;) {
        int first = e->chunk_n == 0;
        if (rb_buf_reserve(&e->raw, 3 * VARINT_MAX + (size_t)ent->key_len + tb) < 0)
            return nomem(err, W);
        size_t shared = first ? 0 : common_prefix(e->key.data, e->key.len, ent->key, ent->key_len);
        size_t n = benc_encode(e, ent, shared, first);
        if (e->raw.len + n <= RB_MLOG_CHUNK_RAW_MAX)
            return benc_commit(e, ent, shared, n, first, err);
        if (first)
            return rb_err_set(err, RB_ERR_VALUE, E2BIG, "%s: slot %u: the entry takes %zu bytes, a chunk %u", W,
                              ent->slot, n, RB_MLOG_CHUNK_RAW_MAX);
        if ((rc = benc_flush(e, err)) < 0)
            return rc;
    }
}

int rb_mlog_benc_finish(rb_mlog_benc *e, uint64_t block_align, rb_err *err)
{
    static const char W[] = "base encoder";
    if (e->finished || !e->z || !is_pow2(block_align))
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "%s: finish of an encoder not started or already finished, "
                          "or block_align %llu not a power of two",
                          W, (unsigned long long)block_align);
    int rc = benc_flush(e, err);
    if (rc < 0)
        return rc;
    uint64_t end = e->produced + RB_MLOG_END_LEN, padded = round_up(end, block_align);
    if (rb_buf_reserve(&e->out, (size_t)(padded - e->produced)) < 0)
        return nomem(err, W);
    uint8_t *h = (uint8_t *)e->out.data + e->out.len;
    memcpy(h, RB_MLOG_END_MAGIC, 8);
    rb_put_le(h + 8, e->generation, 8);
    rb_put_le(h + 16, e->log_seq, 8);
    rb_put_le(h + 24, e->n_entries, 8);
    rb_put_le(h + 32, e->produced, 8);
    rb_put_le(h + 40, e->n_chunks, 4);
    rb_put_le(h + END_CRC_OFF, crc_more(0, h, END_CRC_OFF), 4);
    memset(h + RB_MLOG_END_LEN, 0, (size_t)(padded - end));
    e->out.len += (size_t)(padded - e->produced);
    e->produced = padded;
    e->finished = 1;
    return 0;
}

void rb_mlog_benc_consume(rb_mlog_benc *e, size_t n)
{
    if (n > e->out.len)
        n = e->out.len;
    if (n == 0)
        return;
    memmove(e->out.data, e->out.data + n, e->out.len - n);
    e->out.len -= n;
}

/* ---- base decoder ------------------------------------------------------------------------ */

void rb_mlog_bdec_init(rb_mlog_bdec *d)
{
    memset(d, 0, sizeof *d);
}

void rb_mlog_bdec_free(rb_mlog_bdec *d)
{
    zstate_free(d->z);
    free(d->raw);
    rb_buf_free(&d->key);
    free(d->pos);
    free(d->cls_ids);
    memset(d, 0, sizeof *d);
}

/* Parse the class table; deliver each class when deliver. */
static int class_table(const uint8_t *tab, uint64_t tab_len, uint32_t n, uint32_t *ids, const rb_mlog_base_cb *cb,
                       int deliver, rb_err *err)
{
    rd r = {.p = tab, .end = tab + tab_len, .start = tab, .kind = RD_CLASS, .err = err};
    for (uint32_t i = 0; i < n; i++) {
        r.i = i;
        uint64_t id, fl;
        const uint8_t *f = NULL;
        int rc;
        if ((rc = rd_varint(&r, "id", UINT32_MAX, &id)) < 0 ||
            (rc = rd_varint(&r, "fragment length", UINT32_MAX, &fl)) < 0 || (rc = rd_bytes(&r, "fragment", fl, &f)) < 0)
            return rc;
        if (i && id <= ids[i - 1])
            return rd_bad(&r, "id %llu does not follow %llu", id, ids[i - 1]);
        ids[i] = (uint32_t)id;
        if (deliver) {
            rb_mlog_class c = {.id = (uint32_t)id, .frag_len = (uint32_t)fl, .frag = (const char *)f};
            if ((rc = cb->cls(cb->ctx, &c)) != 0)
                return rc;
        }
    }
    if (r.p != r.end)
        return bad(err, "base class table", "%llu bytes after the last class", (unsigned long long)(r.end - r.p), 0);
    return 0;
}

/* The base header at in (len >= its length): magic, version, CRC, flags, a nonzero generation
 * and a class table that fits and passes its CRC; its fields in *b, the table's length in
 * *tab_len. */
static int base_header(const uint8_t *in, size_t len, rb_mlog_base_info *b, uint64_t *tab_len, rb_err *err)
{
    static const char W[] = "base";
    if (memcmp(in, RB_MLOG_BASE_MAGIC, 8) != 0)
        return bad(err, W, "bad magic", 0, 0);
    uint32_t ver = (uint32_t)rb_get_le(in + 8, 4);
    if (ver != RB_MLOG_VERSION)
        return rb_err_set(err, RB_ERR_VALUE, EPROTONOSUPPORT, "%s: format version %u, this build reads %u", W, ver,
                          RB_MLOG_VERSION);
    uint32_t stored = (uint32_t)rb_get_le(in + BASE_HCRC_OFF, 4), crc = crc_more(0, in, BASE_HCRC_OFF);
    if (stored != crc)
        return bad(err, W, "header CRC mismatch (stored 0x%08llx, computed 0x%08llx)", stored, crc);
    if (rb_get_le(in + 12, 4) != 0)
        return bad(err, W, "flags are not zero", 0, 0);
    b->generation = rb_get_le(in + 16, 8);
    b->log_seq = rb_get_le(in + 24, 8);
    b->next_slot = (uint32_t)rb_get_le(in + 32, 4);
    b->n_classes = (uint32_t)rb_get_le(in + 36, 4);
    *tab_len = rb_get_le(in + 40, 8);
    if (b->generation == 0)
        return bad(err, W, "generation is 0", 0, 0);
    if (*tab_len > len - RB_MLOG_BASE_HDR_LEN)
        return bad(err, W, "class table of %llu bytes runs past the end (%llu given)", *tab_len, len);
    if ((uint64_t)b->n_classes > *tab_len / 2)
        return bad(err, W, "%llu classes cannot fit in %llu bytes", b->n_classes, *tab_len);
    stored = (uint32_t)rb_get_le(in + 48, 4);
    crc = crc_more(0, in + RB_MLOG_BASE_HDR_LEN, (size_t)*tab_len);
    if (stored != crc)
        return bad(err, "base class table", "CRC mismatch (stored 0x%08llx, computed 0x%08llx)", stored, crc);
    return 0;
}

int rb_mlog_base_open(const uint8_t *in, size_t len, rb_mlog_bdec *d, rb_mlog_base_info *bi, const rb_mlog_base_cb *cb,
                      rb_err *err)
{
    static const char W[] = "base";
    d->cb_rc = 0;
    if (len < RB_MLOG_BASE_HDR_LEN)
        return bad(err, W, "%llu bytes, the header needs %llu", len, RB_MLOG_BASE_HDR_LEN);
    rb_mlog_base_info b;
    uint64_t tab_len = 0;
    int rc = base_header(in, len, &b, &tab_len, err);
    if (rc < 0)
        return rc;
    const uint8_t *tab = in + RB_MLOG_BASE_HDR_LEN;
    uint32_t *ids = realloc(d->cls_ids, (b.n_classes ? b.n_classes : 1) * sizeof *ids);
    if (!ids)
        return nomem(err, W);
    d->cls_ids = ids;
    d->n_cls = 0;
    rc = class_table(tab, tab_len, b.n_classes, ids, cb, 0, err);
    if (rc == 0 && cb && cb->cls)
        rc = class_table(tab, tab_len, b.n_classes, ids, cb, 1, err);
    if (rc != 0)
        return rc;
    d->n_cls = b.n_classes;
    d->next_slot = b.next_slot;
    b.chunks_off = RB_MLOG_BASE_HDR_LEN + tab_len;
    *bi = b;
    return 0;
}

/* The end record at h (header checked) of the base bi, which must say it is at off. */
static int base_end_at(const uint8_t *h, uint64_t off, const rb_mlog_base_info *bi, rb_mlog_base_end *end,
                       const char *W, rb_err *err)
{
    rb_mlog_base_end e = {
        .off = rb_get_le(h + 32, 8), .n_chunks = (uint32_t)rb_get_le(h + 40, 4), .n_entries = rb_get_le(h + 24, 8)};
    if (e.off != off)
        return bad(err, W, "the end record says it is at byte %llu", e.off, 0);
    if (e.n_entries > bi->next_slot || e.n_chunks > e.n_entries)
        return bad(err, W, "end record: %llu entries in %llu chunks is implausible", e.n_entries, e.n_chunks);
    *end = e;
    return 0;
}

/* The chunk header at h (header checked) at off of the base bi: deflate, its slots and
 * lengths plausible. */
static int base_chunk_at(const uint8_t *h, uint64_t off, const rb_mlog_base_info *bi, rb_mlog_chunk *ch, const char *W,
                         rb_err *err)
{
    rb_mlog_chunk c = {.off = off,
                       .index = (uint32_t)rb_get_le(h + 24, 4),
                       .n_entries = (uint32_t)rb_get_le(h + 28, 4),
                       .raw_len = (uint32_t)rb_get_le(h + 32, 4),
                       .comp_len = (uint32_t)rb_get_le(h + 36, 4),
                       .first_slot = (uint32_t)rb_get_le(h + 40, 4),
                       .last_slot = (uint32_t)rb_get_le(h + 44, 4),
                       .crc = (uint32_t)rb_get_le(h + 52, 4)};
    if (rb_get_le(h + 48, 4) != CHUNK_METHOD_DEFLATE)
        return bad(err, W, "chunk method/reserved word 0x%llx is not 1 (deflate)", rb_get_le(h + 48, 4), 0);
    if (c.n_entries == 0 || c.first_slot > c.last_slot || c.last_slot >= bi->next_slot ||
        c.n_entries - 1 > c.last_slot - c.first_slot)
        return bad(err, W, "chunk of %llu entries cannot span its slots (up to next_slot %llu)", c.n_entries,
                   bi->next_slot);
    if (c.raw_len > RB_MLOG_CHUNK_RAW_MAX || c.raw_len < (uint64_t)ENT_MIN_RAW * c.n_entries ||
        c.raw_len > (uint64_t)DEFLATE_MAX_RATIO * c.comp_len)
        return bad(err, W, "chunk raw length %llu is implausible (compressed %llu)", c.raw_len, c.comp_len);
    *ch = c;
    return 1;
}

int rb_mlog_base_at(const uint8_t *in, size_t len, uint64_t off, const rb_mlog_base_info *bi, rb_mlog_chunk *ch,
                    rb_mlog_base_end *end, rb_err *err)
{
    char W[48];
    snprintf(W, sizeof W, "base at byte %llu", (unsigned long long)off);
    if (off > len || len - off < 8)
        return bad(err, W, "truncated: %llu bytes left", off > len ? 0 : len - off, 0);
    const uint8_t *h = in + off;
    int is_chunk = memcmp(h, RB_MLOG_CHUNK_MAGIC, 8) == 0;
    if (!is_chunk && memcmp(h, RB_MLOG_END_MAGIC, 8) != 0)
        return bad(err, W, "no chunk or end record (bad magic)", 0, 0);
    size_t need = is_chunk ? RB_MLOG_CHUNK_HDR_LEN : RB_MLOG_END_LEN, crc_off = is_chunk ? CHUNK_HCRC_OFF : END_CRC_OFF;
    if (len - off < need)
        return bad(err, W, "truncated header: %llu bytes left, %llu needed", len - off, need);
    uint32_t stored = (uint32_t)rb_get_le(h + crc_off, 4), crc = crc_more(0, h, crc_off);
    if (stored != crc)
        return bad(err, W, "header CRC mismatch (stored 0x%08llx, computed 0x%08llx)", stored, crc);
    uint64_t gen = rb_get_le(h + 8, 8), seq = rb_get_le(h + 16, 8);
    if (gen != bi->generation || seq != bi->log_seq)
        return rb_err_set(err, RB_ERR_VALUE, ESTALE,
                          "%s: belongs to the base of generation %llu at log sequence %llu, not %llu at %llu", W,
                          (unsigned long long)gen, (unsigned long long)seq, (unsigned long long)bi->generation,
                          (unsigned long long)bi->log_seq);
    return is_chunk ? base_chunk_at(h, off, bi, ch, W, err) : base_end_at(h, off, bi, end, W, err);
}

uint64_t rb_mlog_base_resync(const uint8_t *in, size_t len, uint64_t off, const rb_mlog_base_info *bi)
{
    for (uint64_t q = off + 1; q < len && len - q >= 8; q++) {
        const uint8_t *p = memchr(in + q, 'R', (size_t)(len - q));
        if (!p)
            break;
        q = (uint64_t)(p - in);
        if (len - q < 8)
            break;
        if (memcmp(p, RB_MLOG_CHUNK_MAGIC, 8) != 0 && memcmp(p, RB_MLOG_END_MAGIC, 8) != 0)
            continue;
        rb_mlog_chunk ch;
        rb_mlog_base_end end;
        if (rb_mlog_base_at(in, len, q, bi, &ch, &end, NULL) >= 0)
            return q;
    }
    return len;
}

/* An entry's key: the bytes it shares with the previous key in *key, then its suffix; *key
 * becomes it. */
static int rd_key(rd *r, rb_buf *key)
{
    uint64_t shared, suf;
    const uint8_t *s = NULL;
    int rc;
    if ((rc = rd_varint(r, "shared key length", key->len, &shared)) < 0 ||
        (rc = rd_varint(r, "key suffix length", UINT32_MAX - shared, &suf)) < 0 ||
        (rc = rd_bytes(r, "key suffix", suf, &s)) < 0)
        return rc;
    if (key_set(key, (size_t)shared, s, (size_t)suf) < 0)
        return rd_nomem(r);
    return 0;
}

/* Parse a chunk's raw stream; deliver the entries when deliver. */
static int chunk_entries(rb_mlog_bdec *d, const rb_mlog_chunk *ch, const rb_mlog_base_cb *cb, int deliver, rb_err *err)
{
    rd r = {.p = d->raw, .end = d->raw + ch->raw_len, .start = d->raw, .kind = RD_CHUNK, .c = ch->index, .err = err};
    uint64_t prev_slot = 0, prev_size = 0, budget = RB_MLOG_POS_BUDGET;
    d->key.len = 0;
    for (uint32_t i = 0; i < ch->n_entries; i++) {
        r.i = i;
        uint64_t v;
        int rc;
        if ((rc = rd_key(&r, &d->key)) < 0 || (rc = rd_varint(&r, "slot delta", i ? UINT32_MAX : 0, &v)) < 0)
            return rc;
        uint64_t slot = i ? prev_slot + 1 + v : ch->first_slot;
        if (slot > ch->last_slot)
            return rd_bad(&r, "slot %llu is past the chunk's last slot %llu", slot, ch->last_slot);
        rb_mlog_ent e;
        uint64_t zs;
        if ((rc = rd_tail(&r, &e, &zs, &d->pos, &d->pos_cap, &budget)) < 0)
            return rc;
        if (!class_known(d->cls_ids, d->n_cls, e.cls))
            return rd_bad(&r, "class %llu is not in the class table", e.cls, 0);
        prev_size += unzigzag(zs);
        prev_slot = slot;
        if (deliver) {
            e.key = d->key.data;
            e.key_len = (uint32_t)d->key.len;
            e.slot = (uint32_t)slot;
            e.size = prev_size;
            if ((rc = cb->ent(cb->ctx, &e)) != 0) {
                d->cb_rc = rc;
                return rc;
            }
        }
    }
    if (prev_slot != ch->last_slot)
        return rd_bad(&r, "the last entry has slot %llu, the chunk says %llu", prev_slot, ch->last_slot);
    if (r.p != r.end)
        return rd_bad(&r, "%llu bytes after the last entry", (unsigned long long)(r.end - r.p), 0);
    return 0;
}

int rb_mlog_bdec_chunk(rb_mlog_bdec *d, const uint8_t *in, size_t len, const rb_mlog_chunk *ch,
                       const rb_mlog_base_cb *cb, rb_err *err)
{
    char W[48];
    snprintf(W, sizeof W, "base chunk %u", ch->index);
    d->cb_rc = 0;
    uint64_t at = ch->off + RB_MLOG_CHUNK_HDR_LEN;
    if (at > len || ch->comp_len > len - at)
        return bad(err, W, "compressed bytes run past the end (%llu needed at byte %llu)", ch->comp_len, at);
    const uint8_t *comp = in + at;
    uint32_t crc = crc_more(0, comp, ch->comp_len);
    if (crc != ch->crc)
        return bad(err, W, "CRC mismatch (stored 0x%08llx, computed 0x%08llx)", ch->crc, crc);
    if (ch->raw_len > d->raw_cap) {
        uint8_t *p = realloc(d->raw, ch->raw_len);
        if (!p)
            return nomem(err, W);
        d->raw = p;
        d->raw_cap = ch->raw_len;
    }
    size_t got = 0, left = 0;
    int zr = raw_inflate(&d->z, comp, ch->comp_len, d->raw, ch->raw_len, &got, &left);
    if (zr < 0)
        return nomem(err, W);
    if (zr)
        return rb_err_set(err, RB_ERR_VALUE, EBADMSG, "%s: does not inflate to its %u raw bytes (%zu out, %zu in left)",
                          W, ch->raw_len, got, left);
    int rc = chunk_entries(d, ch, cb, 0, err);
    if (rc == 0 && cb && cb->ent)
        rc = chunk_entries(d, ch, cb, 1, err);
    return rc;
}

/* ---- the base walk: chunk headers, then the judgment of each chunk in order ----------------- */

void rb_mlog_bwalk_init(rb_mlog_bwalk *w, const uint8_t *in, size_t len, const rb_mlog_base_info *bi)
{
    memset(w, 0, sizeof *w);
    w->in = in;
    w->len = len;
    w->bi = *bi;
    w->off = bi->chunks_off;
}

/* *st := a GAP step of the walk's damage: n_chunks chunks lost from the one expected, the
 * bytes [off, off + len). */
static void bwalk_gap(const rb_mlog_bwalk *w, rb_mlog_bstep *st, uint32_t n_chunks, uint64_t off, uint64_t len)
{
    memset(st, 0, sizeof *st);
    st->kind = RB_MLOG_STEP_GAP;
    st->dm = w->dm;
    st->dm.index = w->expect;
    st->dm.n_chunks = n_chunks;
    st->dm.n_entries = -1;
    st->dm.first_slot = st->dm.last_slot = UINT32_MAX;
    st->dm.off = off;
    st->dm.len = len;
}

/* The next chunk or end header from w->off on: 1 a chunk (*ch), 0 the end record (*end), at
 * *off; -1 when the base ends first. A damaged header starts a gap (w->gap, w->gap_off and
 * w->dm say where and why) and the walk resyncs at the next header. */
static int bwalk_find(rb_mlog_bwalk *w, rb_mlog_chunk *ch, rb_mlog_base_end *end, uint64_t *off_out)
{
    const uint8_t *in = w->in;
    const size_t len = w->len;
    for (;;) {
        rb_err e;
        const uint64_t off = w->off;
        int at = off < len ? rb_mlog_base_at(in, len, off, &w->bi, ch, end, &e) : -EBADMSG;
        if (off >= len)
            rb_err_set(&e, RB_ERR_VALUE, EBADMSG, "base: ends at byte %llu without its end record",
                       (unsigned long long)len);
        if (at < 0 && !w->gap) { /* a damaged header: find the next one, then say what was lost */
            w->gap = 1;
            w->gap_off = off;
            memset(&w->dm, 0, sizeof w->dm);
            w->dm.why = e;
        }
        if (at >= 0) {
            *off_out = off;
            return at;
        }
        if (off >= len)
            return -1;
        w->off = rb_mlog_base_resync(in, len, off, &w->bi);
    }
}

/* *st := the GAP step before the header at off whose chunk index is next_index: the damage
 * since w->gap_off, or (no damaged header) the chunks missing from the one expected. */
static void bwalk_gap_before(rb_mlog_bwalk *w, rb_mlog_bstep *st, uint64_t off, uint32_t next_index)
{
    if (!w->gap) {
        memset(&w->dm, 0, sizeof w->dm);
        rb_err_set(&w->dm.why, RB_ERR_VALUE, EBADMSG, "base: chunks %u to %u are missing", w->expect, next_index - 1);
        w->gap_off = off;
    }
    bwalk_gap(w, st, next_index > w->expect ? next_index - w->expect : 0, w->gap_off, off - w->gap_off);
    w->gap = 0;
    if (next_index > w->expect)
        w->expect = next_index;
}

/* *st := the step of the header found at off (at: 1 a chunk, 0 the end record); the walk
 * moves past a chunk, and is over after the end record unless a GAP step precedes it. */
static void bwalk_header(rb_mlog_bwalk *w, rb_mlog_bstep *st, int at, const rb_mlog_chunk *ch,
                         const rb_mlog_base_end *end, uint64_t off, int gap_step)
{
    memset(st, 0, sizeof *st);
    st->expect = w->expect;
    if (at == 0) {
        st->kind = RB_MLOG_STEP_END;
        st->end = *end;
        if (!gap_step)
            w->over = 1;
        return;
    }
    st->kind = RB_MLOG_STEP_CHUNK;
    st->ch = *ch;
    st->out_of_order = ch->index < w->expect;
    if (ch->index >= w->expect)
        w->expect = ch->index + 1;
    w->off = off + RB_MLOG_CHUNK_HDR_LEN + (uint64_t)ch->comp_len;
}

int rb_mlog_bwalk_next(rb_mlog_bwalk *w, rb_mlog_bstep *st)
{
    if (w->pending) {
        *st = w->pend;
        w->pending = 0;
        if (st->kind == RB_MLOG_STEP_END)
            w->over = 1;
        return 1;
    }
    if (w->over)
        return 0;
    rb_mlog_chunk ch;
    rb_mlog_base_end end;
    uint64_t off = 0;
    int at = bwalk_find(w, &ch, &end, &off);
    if (at < 0) { /* the damage runs to the base's end */
        const uint64_t len = w->len, from = w->gap_off < len ? w->gap_off : len;
        bwalk_gap(w, st, 0, from, len - from);
        w->over = 1;
        return 1;
    }
    /* A GAP step comes first when headers were damaged or chunks are missing; the header's
     * step is then kept for the next call. */
    const uint32_t next_index = at == 1 ? ch.index : end.n_chunks;
    const int gap_step = w->gap || next_index > w->expect;
    if (gap_step) {
        bwalk_gap_before(w, st, off, next_index);
        w->pending = 1;
    }
    bwalk_header(w, gap_step ? &w->pend : st, at, &ch, &end, off, gap_step);
    return 1;
}

void rb_mlog_bjudge_init(rb_mlog_bjudge *j, rb_mlog_base_result *res, const rb_mlog_base_info *bi)
{
    memset(res, 0, sizeof *res);
    res->entries_lost = -1;
    res->info = *bi;
    j->res = res;
    j->prev_last = 0;
    j->have_prev = 0;
}

int rb_mlog_bjudge_admit(rb_mlog_bjudge *j, const rb_mlog_bstep *st, rb_mlog_damage *dm)
{
    const rb_mlog_chunk *ch = &st->ch;
    memset(dm, 0, sizeof *dm);
    dm->index = ch->index;
    dm->n_chunks = 1;
    dm->n_entries = ch->n_entries;
    dm->first_slot = ch->first_slot;
    dm->last_slot = ch->last_slot;
    dm->off = ch->off;
    dm->len = RB_MLOG_CHUNK_HDR_LEN + (uint64_t)ch->comp_len;
    if (st->out_of_order) {
        rb_err_set(&dm->why, RB_ERR_VALUE, EBADMSG, "base chunk %u: out of order (chunk %u expected)", ch->index,
                   st->expect);
        return 0;
    }
    if (j->have_prev && ch->first_slot <= j->prev_last) {
        rb_err_set(&dm->why, RB_ERR_VALUE, EBADMSG, "base chunk %u: first slot %u is not above slot %u", ch->index,
                   ch->first_slot, j->prev_last);
        return 0;
    }
    return 1;
}

void rb_mlog_bjudge_ok(rb_mlog_bjudge *j, const rb_mlog_chunk *ch)
{
    j->res->chunks_ok++;
    j->res->entries += ch->n_entries;
    j->have_prev = 1;
    j->prev_last = ch->last_slot;
}

void rb_mlog_bjudge_bad(rb_mlog_bjudge *j)
{
    j->res->chunks_bad++;
}

void rb_mlog_bjudge_end(rb_mlog_bjudge *j, const rb_mlog_bstep *st)
{
    rb_mlog_base_result *res = j->res;
    res->have_end = 1;
    res->end = st->end;
    res->len = st->end.off + RB_MLOG_END_LEN;
    if (st->end.n_entries >= res->entries)
        res->entries_lost = (int64_t)(st->end.n_entries - res->entries);
    res->complete = res->chunks_bad == 0 && st->end.n_chunks == st->expect && st->end.n_entries == res->entries;
}

int rb_mlog_base_decode(const uint8_t *in, size_t len, const rb_mlog_base_cb *cb, rb_mlog_base_result *res, rb_err *err)
{
    memset(res, 0, sizeof *res);
    res->entries_lost = -1;
    rb_mlog_bdec d;
    rb_mlog_bdec_init(&d);
    rb_mlog_base_info bi;
    int rc = rb_mlog_base_open(in, len, &d, &bi, cb, err);
    if (rc != 0)
        goto out;
    rb_mlog_bjudge j;
    rb_mlog_bjudge_init(&j, res, &bi);
    rb_mlog_bwalk w;
    rb_mlog_bwalk_init(&w, in, len, &bi);
    rb_mlog_bstep st;
    while (rb_mlog_bwalk_next(&w, &st)) {
        rb_mlog_damage dm;
        if (st.kind == RB_MLOG_STEP_END) {
            rb_mlog_bjudge_end(&j, &st);
            break;
        }
        if (st.kind == RB_MLOG_STEP_GAP) {
            dm = st.dm;
        } else if (rb_mlog_bjudge_admit(&j, &st, &dm)) {
            rc = rb_mlog_bdec_chunk(&d, in, len, &st.ch, cb, &dm.why);
            if (rc == 0) {
                rb_mlog_bjudge_ok(&j, &st.ch);
                continue;
            }
            if (d.cb_rc)
                break; /* a callback stopped: its value is returned */
            if (rc != -EBADMSG) {
                if (err) /* out of memory or zlib trouble: not damage, and not to be skipped */
                    *err = dm.why;
                break;
            }
            rc = 0;
        }
        rb_mlog_bjudge_bad(&j);
        if (cb && cb->damage && (rc = cb->damage(cb->ctx, &dm)) != 0)
            break;
    }
out:
    rb_mlog_bdec_free(&d);
    return rc;
}

int rb_mlog_base_matches(const rb_mlog_sb *sb, const rb_mlog_base_result *res, rb_err *err)
{
    static const char W[] = "base";
    const rb_mlog_base_info *bi = &res->info;
    if (bi->generation != sb->generation)
        return bad(err, W, "generation %llu, the superblock's is %llu", bi->generation, sb->generation);
    if (bi->log_seq != sb->base.log_seq)
        return bad(err, W, "covers log sequence %llu, the superblock says %llu", bi->log_seq, sb->base.log_seq);
    if (bi->next_slot != sb->base.next_slot)
        return bad(err, W, "next_slot %llu, the superblock says %llu", bi->next_slot, sb->base.next_slot);
    if (!res->have_end)
        return bad(err, W, "no end record", 0, 0);
    if (res->end.n_entries != sb->base.n_entries || res->end.n_chunks != sb->base.n_chunks)
        return bad(err, W, "end record counts %llu entries and %llu chunks, not the superblock's", res->end.n_entries,
                   res->end.n_chunks);
    if (res->len > sb->base.len)
        return bad(err, W, "%llu bytes long, the superblock says %llu", res->len, sb->base.len);
    return 0;
}
