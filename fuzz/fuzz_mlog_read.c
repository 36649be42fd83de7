/*
 * fuzz_mlog_read.c - libFuzzer target: the metadata region reader (csrc/core/rb_mlog_read.c)
 * on small region images. The input is [options][fail block: 2 bytes LE][image bytes]; the
 * image is a region of FZ_MT bytes at block_align FZ_BA (zeros past the input), read through
 * a memory callback that aborts on any read that is not block-aligned, not into an aligned
 * buffer, or outside the region.
 *
 * Options: bit 0: make the CRCs right first (superblocks, the bases they point at and those
 * of the standard layout, every group header found in the ring), so the parsers behind them
 * are reached; bit 1: the second read walks the log two blocks at a time; bit 2: reads that
 * touch the fail block return EIO (both reads).
 *
 * Each image is read twice, with 1 thread and with 3 (and maybe another window): everything
 * delivered and the results must be the same; the base part must also be what
 * rb_mlog_base_decode gives from the same bytes; the log's sequences must all be accounted
 * for (replayed, or lost in a reported gap: damage the walk went on past), records and gaps
 * delivered in sequence order. Any difference aborts.
 */
#define ZLIB_CONST
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "rb_mlog.h"
#include "rb_mlog_read.h"

#define FZ_BA 512u
#define FZ_MT (32u << 10)

static uint32_t crc(const void *p, size_t n)
{
    return (uint32_t)crc32(0, p, (uInt)n);
}

/* ---- the device ------------------------------------------------------------------------- */

typedef struct img {
    uint8_t *b;
    int fail;
    uint64_t fail_off;
} img;

static int img_read(void *ctx, uint64_t off, void *buf, size_t len, rb_err *err)
{
    img *m = ctx;
    if (len == 0 || off % FZ_BA || len % FZ_BA || (uintptr_t)buf % FZ_BA || off > FZ_MT || len > FZ_MT - off)
        abort();
    if (m->fail && off <= m->fail_off && m->fail_off < off + len)
        return rb_err_set(err, RB_ERR_OS, EIO, "injected EIO at %llu", (unsigned long long)off);
    memcpy(buf, m->b + off, len);
    return 0;
}

/* ---- what a read delivers, hashed ------------------------------------------------------- */

typedef struct hsh {
    uint64_t base, cls,
        log; /* the base's entries and damage; classes (the base's, then the log's); sb, records, gaps */
    uint64_t gaps, last_seq; /* gaps reported; the sequence of the last record or gap */
    int order_bad;           /* a record or gap out of sequence order */
} hsh;

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0x100000001b3ull;
}

static uint64_t mix_bytes(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = mix(h, b[i]);
    return mix(h, n);
}

static uint64_t mix_ent(uint64_t h, const rb_mlog_ent *e)
{
    h = mix_bytes(h, e->key, e->key_len);
    h = mix(mix(mix(mix(h, e->slot), e->size), e->cls), e->flags);
    if (e->flags & RB_MLOG_ENT_SUM)
        h = mix(h, e->checksum);
    h = mix(h, (uint64_t)e->npos);
    for (int64_t i = 0; i < e->npos; i++)
        h = mix(h, (uint64_t)e->pos[i]);
    return h;
}

static int h_sb(void *ctx, const rb_mlog_sb *sb)
{
    hsh *h = ctx;
    h->log = mix(mix(h->log, sb->sb_seq), sb->generation);
    return 0;
}
static int h_cls(void *ctx, const rb_mlog_class *c)
{
    hsh *h = ctx;
    h->cls = mix_bytes(mix(h->cls, c->id), c->frag, c->frag_len);
    return 0;
}
static int h_ent(void *ctx, const rb_mlog_ent *e)
{
    hsh *h = ctx;
    h->base = mix_ent(mix(h->base, 1), e);
    return 0;
}
static int h_dmg(void *ctx, const rb_mlog_damage *d)
{
    hsh *h = ctx;
    h->base = mix(mix(mix(mix(mix(h->base, 2), d->index), d->n_chunks), (uint64_t)d->n_entries), d->off);
    h->base = mix_bytes(mix(mix(h->base, d->len), d->first_slot), d->why.msg, strlen(d->why.msg));
    return 0;
}
static int h_gap(void *ctx, const rb_mlog_gap *g)
{
    hsh *h = ctx;
    h->log = mix(mix(mix(mix(mix(mix(h->log, 3), g->seq), g->next_seq), g->at), g->next_at), (uint64_t)g->records);
    h->log = mix_bytes(h->log, g->why.msg, strlen(g->why.msg));
    /* a gap lies after every record before it, and skips at least one group */
    h->order_bad |= g->seq <= h->last_seq || g->next_seq <= g->seq || g->records < -1;
    h->last_seq = g->next_seq;
    h->gaps++;
    return 0;
}
static int h_rec(void *ctx, uint64_t seq, const rb_mlog_rec *r)
{
    hsh *h = ctx;
    h->order_bad |= seq < h->last_seq;
    h->last_seq = seq;
    h->log = mix(mix(h->log, seq), (uint64_t)r->type);
    if (r->type == RB_MLOG_PUT)
        h->log = mix_ent(h->log, &r->ent);
    else if (r->type == RB_MLOG_FREE)
        h->log = mix(h->log, r->slot);
    else
        h->log = mix_bytes(mix(h->log, r->cls.id), r->cls.frag, r->cls.frag_len);
    return 0;
}

static uint64_t res_hash(const rb_mlog_read_result *r)
{
    uint64_t h = 0;
    const uint64_t v[] = {(uint64_t)r->found,
                          (uint64_t)r->which,
                          (uint64_t)r->fallback,
                          (uint64_t)r->sb_state[0],
                          (uint64_t)r->sb_state[1],
                          r->sb_seq_seen[0],
                          r->sb_seq_seen[1],
                          r->base.entries,
                          r->base.chunks_ok,
                          r->base.chunks_bad,
                          (uint64_t)r->base.entries_lost,
                          (uint64_t)r->base.complete,
                          (uint64_t)r->base.have_end,
                          r->base.len,
                          r->groups,
                          r->records,
                          r->last_seq,
                          r->head,
                          r->used,
                          (uint64_t)r->log_end,
                          r->torn_at,
                          r->gaps,
                          r->groups_lost,
                          (uint64_t)r->records_lost,
                          r->gap_at,
                          r->gap_seq};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        h = mix(h, v[i]);
    return h;
}

/* ---- making CRCs right ------------------------------------------------------------------- */

static void fix_base(uint8_t *b, uint64_t len)
{
    if (len < RB_MLOG_BASE_HDR_LEN || memcmp(b, RB_MLOG_BASE_MAGIC, 8))
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

static void fix_ring(uint8_t *r, uint64_t len)
{
    for (uint64_t p = 0; p + RB_MLOG_GROUP_HDR_LEN <= len; p += FZ_BA) {
        uint8_t *g = r + p;
        if (memcmp(g, RB_MLOG_GROUP_MAGIC, 8))
            continue;
        rb_put_le(g + 40, crc(g, 40), 4);
        uint64_t bl = rb_get_le(g + 24, 8);
        if (bl <= len - p - RB_MLOG_GROUP_HDR_LEN) {
            uint32_t c = (uint32_t)crc32(crc32(0, g, 44), g + RB_MLOG_GROUP_HDR_LEN, (uInt)bl);
            rb_put_le(g + 44, c, 4);
        }
    }
}

static void fix_image(uint8_t *b)
{
    rb_mlog_layout l;
    if (rb_mlog_layout_of(FZ_MT, FZ_BA, &l, NULL) != 0)
        abort();
    const uint64_t sbo[2] = {0, l.container_bytes};
    for (int k = 0; k < 2; k++) {
        uint8_t *s = b + sbo[k];
        if (memcmp(s, RB_MLOG_SB_MAGIC, 8) == 0)
            rb_put_le(s + 252, crc(s, 252), 4);
        rb_mlog_sb sb;
        if (rb_mlog_sb_decode(s, FZ_BA, &sb, NULL) == 0 && sb.meta_total_bytes == FZ_MT) {
            fix_base(b + rb_mlog_sb_base_off(&sb), sb.base.len);
            fix_ring(b + sb.ring.off, sb.ring.len);
        }
    }
    for (int a = 0; a < 2; a++)
        fix_base(b + l.areas[a].off, l.areas[a].len);
    fix_ring(b + l.ring.off, l.ring.len);
    for (int k = 0; k < 2; k++) /* a base's CRCs may sit in the other superblock's bytes: last */
        if (memcmp(b + sbo[k], RB_MLOG_SB_MAGIC, 8) == 0)
            rb_put_le(b + sbo[k] + 252, crc(b + sbo[k], 252), 4);
}

/* ---- the target -------------------------------------------------------------------------- */

static void one_read(img *m, uint32_t threads, uint64_t window, hsh *h, rb_mlog_read_result *res, int *rc)
{
    rb_mlog_read_opts o = {.block_align = FZ_BA, .meta_total_bytes = FZ_MT, .threads = threads, .log_window = window};
    rb_mlog_read_cb cb = {
        .ctx = h, .sb = h_sb, .cls = h_cls, .ent = h_ent, .rec = h_rec, .damage = h_dmg, .gap = h_gap};
    rb_err err;
    memset(h, 0, sizeof *h);
    *rc = rb_mlog_read(&o, img_read, m, &cb, res, &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    const uint8_t opt = data[0];
    img m = {.fail = opt & 4, .fail_off = (rb_get_le(data + 1, 2) % (FZ_MT / FZ_BA)) * FZ_BA};
    if (posix_memalign((void **)&m.b, FZ_BA, FZ_MT) != 0)
        return 0;
    memset(m.b, 0, FZ_MT);
    size_t n = size - 3 < FZ_MT ? size - 3 : FZ_MT;
    memcpy(m.b, data + 3, n);
    if (opt & 1)
        fix_image(m.b);
    hsh h1, h2;
    rb_mlog_read_result r1, r2;
    int rc1, rc2;
    one_read(&m, 1, 0, &h1, &r1, &rc1);
    one_read(&m, 3, (opt & 2) ? 2 * FZ_BA : 0, &h2, &r2, &rc2);
    if (rc1 != rc2 || h1.base != h2.base || h1.cls != h2.cls || h1.log != h2.log || res_hash(&r1) != res_hash(&r2))
        abort();
    if (rc1 == 0 && r1.found && !m.fail) {
        /* the reader's base part is the serial decoder's on the same bytes */
        hsh h3;
        memset(&h3, 0, sizeof h3);
        rb_mlog_base_cb bcb = {.cls = h_cls, .ent = h_ent, .damage = h_dmg, .ctx = &h3};
        rb_mlog_base_result br;
        rb_err err;
        const rb_mlog_sb *sb = &r1.sb;
        if (rb_mlog_base_decode(m.b + rb_mlog_sb_base_off(sb), sb->base.len, &bcb, &br, &err) != 0)
            abort();
        if (h3.base != h1.base || br.entries != r1.base.entries || br.chunks_ok != r1.base.chunks_ok ||
            br.chunks_bad != r1.base.chunks_bad || br.entries_lost != r1.base.entries_lost ||
            br.complete != r1.base.complete || br.len != r1.base.len)
            abort();
        /* the log's accounting: every sequence from the base's on replayed or counted lost */
        if (r1.used > sb->ring.len || r1.head >= sb->ring.len || r1.head % FZ_BA || r1.last_seq < sb->base.log_seq ||
            r1.last_seq - sb->base.log_seq != r1.groups + r1.groups_lost)
            abort();
        /* gaps: as many as reported, in order, none without a group lost, the first one's where
         * the callbacks saw it */
        if (h1.order_bad || h1.gaps != r1.gaps || (r1.gaps == 0) != (r1.groups_lost == 0) || r1.gaps > r1.groups_lost ||
            r1.records_lost < -1 || (r1.gaps == 0 && r1.records_lost != 0) ||
            (r1.gaps && (r1.gap_seq <= sb->base.log_seq || r1.gap_seq > r1.last_seq || r1.gap_at % FZ_BA ||
                         r1.gap_at >= sb->ring.len)))
            abort();
        if (r1.log_end == RB_MLOG_END_TORN && r1.torn_at != r1.head)
            abort();
    }
    free(m.b);
    return 0;
}
