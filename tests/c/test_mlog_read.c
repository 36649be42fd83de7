/*
 * test_mlog_read.c - C-level tests of the metadata region reader (csrc/core/rb_mlog_read.c):
 * whole region images built in memory with the encoders (superblocks, bases, a ring of
 * groups that wraps to offset 0, stale groups of an older lap and of another generation left
 * in the ring), read back through a memory read callback that checks every read's alignment.
 * Covers the records delivered and their order, head / used / last_seq, torn groups, the
 * superblock choice and its fallbacks, parallel base decoding against the serial decoder,
 * I/O errors, a full ring, callbacks that stop, and the layout and sizing rules.
 * Build/run: `make test-c`; exit 0 = pass.
 */
#define ZLIB_CONST
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "check.h"
#include "rb_ckpt.h"
#include "rb_mlog.h"
#include "rb_mlog_read.h"

#define BA 512u
#define MT (256u << 10) /* C = 128 KiB, ring = 32 KiB (64 blocks), base areas 97.5 KiB */
#define GEN 0x77u

static uint64_t rng_state = 0x5eed5eed12345678ull;
static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- a device in memory ----------------------------------------------------------------- */

typedef struct dev {
    uint8_t *b;
    uint64_t len, ba;
    rb_mlog_layout L;
    uint64_t fail_off, fail_len; /* reads touching [fail_off, +fail_len) fail with EIO */
    uint64_t reads, ring_reads;
} dev;

static int dev_pread(void *ctx, uint64_t off, void *buf, size_t len, rb_err *err)
{
    dev *d = ctx;
    CHECK(len > 0 && off % d->ba == 0 && len % d->ba == 0 && (uintptr_t)buf % d->ba == 0);
    CHECK(off <= d->len && len <= d->len - off);
    d->reads++;
    if (off >= d->L.ring.off && off < d->L.ring.off + d->L.ring.len)
        d->ring_reads++;
    if (d->fail_len && off < d->fail_off + d->fail_len && d->fail_off < off + len)
        return rb_err_set(err, RB_ERR_OS, EIO, "injected EIO reading %zu bytes at %llu", len, (unsigned long long)off);
    memcpy(buf, d->b + off, len);
    return 0;
}

static void dev_init(dev *d)
{
    memset(d, 0, sizeof *d);
    d->len = MT;
    d->ba = BA;
    d->b = calloc(1, MT);
    CHECK(d->b);
    rb_err err;
    CHECK(rb_mlog_layout_of(MT, BA, &d->L, &err) == 0);
}

static void dev_copy(dev *to, const dev *from)
{
    *to = *from;
    to->b = malloc(from->len);
    CHECK(to->b);
    memcpy(to->b, from->b, from->len);
}

/* ---- what the reader delivers, as text (so two reads compare with memcmp) ------------------ */

typedef struct sink {
    rb_buf base;            /* classes (the base's, then the log's CLASS records), entries, damage */
    rb_buf log;             /* sb, records */
    int stop_ent, stop_rec; /* return 9 at this entry / record (-1: never) */
    long n_ent, n_rec;
    uint64_t last_seq_seen;
    int order_ok;
} sink;

static void sink_init(sink *s)
{
    memset(s, 0, sizeof *s);
    s->stop_ent = s->stop_rec = -1;
    s->order_ok = 1;
}

static void sink_free(sink *s)
{
    rb_buf_free(&s->base);
    rb_buf_free(&s->log);
}

static void put_hex(rb_buf *b, const char *p, uint32_t n)
{
    static const char hx[] = "0123456789abcdef";
    for (uint32_t i = 0; i < n; i++) {
        char c[2] = {hx[(uint8_t)p[i] >> 4], hx[(uint8_t)p[i] & 15]};
        CHECK(rb_buf_put(b, c, 2) == 0);
    }
}

static void put_ent(rb_buf *b, const rb_mlog_ent *e)
{
    char t[200];
    uint64_t ph = 0;
    for (int64_t i = 0; i < e->npos; i++)
        ph = ph * 1000003u + (uint64_t)e->pos[i];
    snprintf(t, sizeof t, " slot=%u size=%llu cls=%u flags=%u sum=%llx npos=%lld ph=%llx key=", e->slot,
             (unsigned long long)e->size, e->cls, e->flags,
             (unsigned long long)(e->flags & RB_MLOG_ENT_SUM ? e->checksum : 0), (long long)e->npos,
             (unsigned long long)ph);
    CHECK(rb_buf_puts(b, t) == 0);
    put_hex(b, e->key, e->key_len);
    CHECK(rb_buf_puts(b, "\n") == 0);
}

static int s_sb(void *ctx, const rb_mlog_sb *sb)
{
    sink *s = ctx;
    char t[128];
    snprintf(t, sizeof t, "SB seq=%llu gen=%llu\n", (unsigned long long)sb->sb_seq, (unsigned long long)sb->generation);
    CHECK(rb_buf_puts(&s->log, t) == 0);
    return 0;
}

static int s_cls(void *ctx, const rb_mlog_class *c)
{
    sink *s = ctx;
    char t[64];
    snprintf(t, sizeof t, "CLS %u ", c->id);
    CHECK(rb_buf_puts(&s->base, t) == 0);
    put_hex(&s->base, c->frag, c->frag_len);
    CHECK(rb_buf_puts(&s->base, "\n") == 0);
    return 0;
}

static int s_ent(void *ctx, const rb_mlog_ent *e)
{
    sink *s = ctx;
    if (s->stop_ent >= 0 && s->n_ent == s->stop_ent)
        return 9;
    s->n_ent++;
    CHECK(rb_buf_puts(&s->base, "ENT") == 0);
    put_ent(&s->base, e);
    return 0;
}

static int s_dmg(void *ctx, const rb_mlog_damage *d)
{
    sink *s = ctx;
    char t[512];
    snprintf(t, sizeof t, "DMG index=%u n=%u ents=%lld slots=%u..%u off=%llu len=%llu why=%s\n", d->index, d->n_chunks,
             (long long)d->n_entries, d->first_slot, d->last_slot, (unsigned long long)d->off,
             (unsigned long long)d->len, d->why.msg);
    CHECK(rb_buf_puts(&s->base, t) == 0);
    return 0;
}

static int s_rec(void *ctx, uint64_t seq, const rb_mlog_rec *r)
{
    sink *s = ctx;
    if (s->stop_rec >= 0 && s->n_rec == s->stop_rec)
        return 9;
    s->n_rec++;
    if (seq < s->last_seq_seen)
        s->order_ok = 0;
    s->last_seq_seen = seq;
    char t[96];
    snprintf(t, sizeof t, "REC %llu type=%d", (unsigned long long)seq, r->type);
    CHECK(rb_buf_puts(&s->log, t) == 0);
    if (r->type == RB_MLOG_PUT) {
        put_ent(&s->log, &r->ent);
    } else if (r->type == RB_MLOG_FREE) {
        snprintf(t, sizeof t, " slot=%u\n", r->slot);
        CHECK(rb_buf_puts(&s->log, t) == 0);
    } else {
        snprintf(t, sizeof t, " id=%u\n", r->cls.id);
        CHECK(rb_buf_puts(&s->log, t) == 0);
    }
    return 0;
}

static int s_gap(void *ctx, const rb_mlog_gap *g)
{
    sink *s = ctx;
    char t[160];
    snprintf(t, sizeof t, "GAP %llu..%llu at=%llu next_at=%llu records=%lld\n", (unsigned long long)g->seq,
             (unsigned long long)g->next_seq, (unsigned long long)g->at, (unsigned long long)g->next_at,
             (long long)g->records);
    CHECK(rb_buf_puts(&s->log, t) == 0);
    return 0;
}

static const rb_mlog_read_cb CB = {.sb = s_sb, .cls = s_cls, .ent = s_ent, .rec = s_rec, .damage = s_dmg, .gap = s_gap};

/* ---- building an image ------------------------------------------------------------------- */

static const char frag0[] = "\"shape\":[2,32,256,1024],\"dtype\":\"bfloat16\",\"fmt\":\"KV_2LTD\"";
static const rb_mlog_class base_cls[] = {
    {.id = 0, .frag_len = sizeof frag0 - 1, .frag = frag0},
    {.id = 5, .frag_len = 1, .frag = "x"},
};

typedef struct ents {
    rb_mlog_ent e[600];
    char keys[600][120];
    int64_t pos[600][6];
    size_t n;
} ents;

static void mk_ents(ents *s, size_t n, uint32_t slot0)
{
    CHECK(n <= 600);
    s->n = n;
    uint32_t slot = slot0;
    for (size_t i = 0; i < n; i++) {
        rb_mlog_ent *e = &s->e[i];
        memset(e, 0, sizeof *e);
        int kl = snprintf(s->keys[i], sizeof s->keys[i], "meta-llama%%2FLlama-3.1-8B-Instruct@0x%08x@0@%016llx%016llx",
                          (unsigned)(rnd() % 8), (unsigned long long)rnd(), (unsigned long long)rnd());
        e->key = s->keys[i];
        e->key_len = (uint32_t)kl;
        e->slot = slot;
        slot += 1 + (uint32_t)(rnd() % 3);
        e->size = rnd() % 4 ? 8u << 20 : rnd() % 100000;
        e->cls = base_cls[rnd() % 2].id;
        if (rnd() % 3 == 0) {
            e->flags = RB_MLOG_ENT_SUM;
            e->checksum = rnd();
        }
        e->npos = rnd() % 2 ? -1 : (int64_t)(rnd() % 7);
        for (int64_t k = 0; k < e->npos; k++)
            s->pos[i][k] = 1000 * (int64_t)i + k;
        e->pos = s->pos[i];
    }
}

typedef struct base_desc {
    uint32_t n_chunks, next_slot;
    uint64_t len, n_entries, log_seq;
} base_desc;

/* Encode s as a base into area a of the image. */
static base_desc put_base(dev *d, int a, uint64_t gen, uint64_t log_seq, const ents *s, uint32_t chunk_raw)
{
    rb_err err;
    rb_mlog_benc e;
    rb_mlog_benc_opts o = {.chunk_raw = chunk_raw};
    base_desc bd = {.next_slot = s->n ? s->e[s->n - 1].slot + 1 : 0, .n_entries = s->n, .log_seq = log_seq};
    CHECK(rb_mlog_benc_init(&e, gen, log_seq, bd.next_slot, base_cls, 2, &o, &err) == 0);
    for (size_t i = 0; i < s->n; i++)
        CHECK(rb_mlog_benc_add(&e, &s->e[i], &err) == 0);
    CHECK(rb_mlog_benc_finish(&e, BA, &err) == 0);
    CHECK(e.out.len <= d->L.areas[a].len);
    memcpy(d->b + d->L.areas[a].off, e.out.data, e.out.len);
    bd.n_chunks = e.n_chunks;
    bd.len = e.out.len;
    rb_mlog_benc_free(&e);
    return bd;
}

/* Superblock `which` (0 at offset 0, 1 at container_bytes). */
static void put_sb(dev *d, int which, uint64_t sb_seq, uint64_t gen, int area, const base_desc *bd, uint64_t start)
{
    rb_mlog_sb s;
    memset(&s, 0, sizeof s);
    s.sb_seq = sb_seq;
    s.generation = gen;
    s.block_align = BA;
    s.header_bytes = BA;
    s.slot_bytes = 8 * BA;
    s.meta_total_bytes = MT;
    s.container_bytes = d->L.container_bytes;
    s.data_base = MT;
    s.max_slots = 100000;
    s.capacity = MT + (uint64_t)s.max_slots * s.slot_bytes;
    s.areas[0] = d->L.areas[0];
    s.areas[1] = d->L.areas[1];
    s.ring.off = d->L.ring.off;
    s.ring.len = d->L.ring.len;
    s.base.area = (uint32_t)area;
    s.base.n_chunks = bd->n_chunks;
    s.base.len = bd->len;
    s.base.n_entries = bd->n_entries;
    s.base.log_seq = bd->log_seq;
    s.base.next_slot = bd->next_slot;
    s.ring.start = start;
    s.ring.start_seq = bd->log_seq + 1;
    rb_err err;
    CHECK(rb_mlog_sb_encode(&s, d->b + (which ? d->L.container_bytes : 0), BA, &err) == 0);
}

/* What a group holds: its records, kept to check what the reader delivers. */
typedef struct expect {
    rb_buf log; /* the REC lines, as the sink writes them */
} expect;

static char gkeys[4096][64];
static size_t gkey_n;

/* A group of sequence seq at ring offset at: nput PUTs, nfree FREEs, a CLASS when cls.
 * Returns its total length. The expected REC lines are appended to ex (when given). */
static uint64_t put_group(dev *d, uint64_t at, uint64_t gen, uint64_t seq, int nput, int nfree, int cls, int level,
                          expect *ex)
{
    rb_err err;
    rb_mlog_genc g;
    rb_mlog_genc_init(&g);
    sink tmp;
    sink_init(&tmp);
    if (cls) {
        rb_mlog_class c = {.id = 100 + (uint32_t)seq, .frag_len = 5, .frag = "hello"};
        CHECK(rb_mlog_genc_class(&g, &c, &err) == 0);
        rb_mlog_rec r = {.type = RB_MLOG_CLASS, .cls = c};
        s_rec(&tmp, seq, &r);
    }
    for (int i = 0; i < nput; i++) {
        CHECK(gkey_n < 4096);
        char *k = gkeys[gkey_n++];
        int kl = snprintf(k, 64, "meta-llama%%2FLlama@0x%08x@0@%016llx", i % 8, (unsigned long long)rnd());
        rb_mlog_ent e = {.key = k,
                         .key_len = (uint32_t)kl,
                         .slot = (uint32_t)(seq * 1000 + (uint64_t)i),
                         .size = 8u << 20,
                         .cls = 0,
                         .npos = -1};
        CHECK(rb_mlog_genc_put(&g, &e, &err) == 0);
        rb_mlog_rec r = {.type = RB_MLOG_PUT, .ent = e};
        s_rec(&tmp, seq, &r);
    }
    for (int i = 0; i < nfree; i++) {
        uint32_t slot = (uint32_t)(seq * 7 + (uint64_t)i);
        CHECK(rb_mlog_genc_free_slot(&g, slot, &err) == 0);
        rb_mlog_rec r = {.type = RB_MLOG_FREE, .slot = slot};
        s_rec(&tmp, seq, &r);
    }
    rb_buf out = {0};
    CHECK(rb_mlog_genc_seal(&g, gen, seq, BA, level, &out, &err) == 0);
    CHECK(at % BA == 0 && at + out.len <= d->L.ring.len);
    memcpy(d->b + d->L.ring.off + at, out.data, out.len);
    uint64_t t = out.len;
    if (ex)
        CHECK(rb_buf_put(&ex->log, tmp.log.data, tmp.log.len) == 0);
    sink_free(&tmp);
    rb_buf_free(&out);
    rb_mlog_genc_free(&g);
    return t;
}

/* The main image: superblock 0 (seq 3) over base A in area 0 (log_seq 10), the ring starting
 * at block 40 with groups 11, 12 (to block 56), 13 (too long for the 8 blocks left: at 0), 14
 * (deflated), 15 (a CLASS and FREEs); stale groups of an older lap everywhere else, one of
 * another generation at the end of group 12 (where 13 did not fit) and one of another
 * generation with sequence 16 after group 15. */
typedef struct scene {
    dev d;
    ents A, B;
    base_desc ba, bb;
    uint64_t start, off[6], len[6]; /* groups 11..15 at off[1..5] */
    uint64_t head, used;
    expect ex;      /* REC lines of groups 11..15 */
    size_t ex_at13; /* bytes of ex before group 13 */
    size_t ex_at14;
    size_t ex_at[7];  /* bytes of ex before group 10 + i (ex_at[6]: all) */
    uint32_t nrec[6]; /* records of group 10 + i */
} scene;

static void build(scene *s)
{
    memset(s, 0, sizeof *s);
    dev_init(&s->d);
    dev *d = &s->d;
    const uint64_t rl = d->L.ring.len;
    CHECK(rl == 64 * BA);
    for (uint64_t k = 0; k < rl / BA; k++) /* an older lap of one-block groups, sequences 1..9 */
        put_group(d, k * BA, GEN, 1 + k % 9, 1, 1, 0, 0, NULL);
    mk_ents(&s->A, 400, 3);
    s->ba = put_base(d, 0, GEN, 10, &s->A, 1000);
    CHECK(s->ba.n_chunks >= 20);
    s->start = 40 * BA;
    put_sb(d, 0, 3, GEN, 0, &s->ba, s->start);
    uint64_t p = s->start;
    s->off[1] = p;
    s->ex_at[1] = s->ex.log.len;
    s->len[1] = put_group(d, p, GEN, 11, 150, 3, 0, 0, &s->ex);
    p += s->len[1];
    s->off[2] = p;
    s->ex_at[2] = s->ex.log.len;
    s->len[2] = put_group(d, p, GEN, 12, 1, 2, 0, 1, &s->ex);
    p += s->len[2];
    CHECK(s->len[2] == BA && p < rl);
    uint64_t rem = rl - p;
    put_group(d, p, GEN + 1, 13, 1, 0, 0, 0, NULL); /* another generation's, where 13 did not fit */
    s->ex_at13 = s->ex_at[3] = s->ex.log.len;
    s->off[3] = 0;
    s->len[3] = put_group(d, 0, GEN, 13, 60, 0, 0, 0, &s->ex);
    CHECK(s->len[3] > rem);
    s->ex_at14 = s->ex_at[4] = s->ex.log.len;
    s->off[4] = s->len[3];
    s->len[4] = put_group(d, s->off[4], GEN, 14, 100, 20, 0, 1, &s->ex);
    CHECK(rb_get_le(d->b + d->L.ring.off + s->off[4] + 36, 4) == RB_MLOG_GROUP_DEFLATE && s->len[4] > 3 * BA);
    s->off[5] = s->off[4] + s->len[4];
    s->ex_at[5] = s->ex.log.len;
    s->len[5] = put_group(d, s->off[5], GEN, 15, 0, 5, 1, 0, &s->ex);
    s->ex_at[6] = s->ex.log.len;
    const uint32_t nrec[6] = {0, 153, 3, 60, 120, 6};
    memcpy(s->nrec, nrec, sizeof nrec);
    s->head = s->off[5] + s->len[5];
    CHECK(s->head < s->start);
    put_group(d, s->head, GEN + 1, 16, 1, 0, 0, 0, NULL); /* another generation, the expected sequence */
    s->used = (rl - s->start) + s->head;
}

static void scene_free(scene *s)
{
    free(s->d.b);
    rb_buf_free(&s->ex.log);
}

/* Read d with threads (and a window), into sk. */
static int rd(dev *d, uint32_t threads, uint64_t window, sink *sk, rb_mlog_read_result *res, rb_err *err)
{
    rb_mlog_read_opts o = {.block_align = BA, .meta_total_bytes = MT, .threads = threads, .log_window = window};
    d->reads = d->ring_reads = 0;
    rb_mlog_read_cb cb = CB;
    cb.ctx = sk;
    return rb_mlog_read(&o, dev_pread, d, &cb, res, err);
}

static int buf_eq(const rb_buf *a, const rb_buf *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

/* The base's events as rb_mlog_base_decode gives them from the bytes in area a. */
static void serial_base(const dev *d, int a, uint64_t len, sink *sk, rb_mlog_base_result *res)
{
    rb_mlog_base_cb cb = {.cls = s_cls, .ent = s_ent, .damage = s_dmg, .ctx = sk};
    rb_err err;
    CHECK(rb_mlog_base_decode(d->b + d->L.areas[a].off, len, &cb, res, &err) == 0);
}

static int base_res_eq(const rb_mlog_base_result *a, const rb_mlog_base_result *b)
{
    return a->entries == b->entries && a->chunks_ok == b->chunks_ok && a->chunks_bad == b->chunks_bad &&
           a->entries_lost == b->entries_lost && a->complete == b->complete && a->have_end == b->have_end &&
           a->len == b->len && a->info.generation == b->info.generation && a->info.log_seq == b->info.log_seq &&
           (!a->have_end || (a->end.n_chunks == b->end.n_chunks && a->end.n_entries == b->end.n_entries));
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_layout(void)
{
    rb_err err;
    rb_mlog_layout l;
    CHECK(rb_mlog_layout_of(MT, BA, &l, &err) == 0);
    CHECK(l.container_bytes == 128 << 10 && l.sb_span == BA && l.ring.off == 96 << 10 && l.ring.len == 32 << 10);
    CHECK(l.areas[0].off == BA && l.areas[0].len == (96 << 10) - BA);
    CHECK(l.areas[1].off == (128 << 10) + BA && l.areas[1].len == l.areas[0].len);
    /* 128 MiB at 4 KiB: C = 64 MiB, R = 16 MiB */
    CHECK(rb_mlog_layout_of(128ull << 20, 4096, &l, &err) == 0);
    CHECK(l.ring.len == 16ull << 20 && l.ring.off == 48ull << 20 && l.areas[0].len == (48ull << 20) - 4096);
    CHECK(l.areas[1].off + l.areas[1].len == (128ull << 20) - (16ull << 20));
    /* an odd number of blocks: the last block is in no part */
    CHECK(rb_mlog_layout_of(MT + BA, BA, &l, &err) == 0 && l.container_bytes == 128 << 10);
    CHECK(rb_mlog_layout_of(MT, 500, &l, &err) == -EINVAL);
    CHECK(rb_mlog_layout_of(MT + 1, BA, &l, &err) == -EINVAL);
    CHECK(rb_mlog_layout_of(16 * BA, BA, &l, &err) == -EINVAL && strstr(err.msg, "too small"));
    CHECK(rb_mlog_layout_of(32 * BA, BA, &l, &err) == 0); /* C 16 blocks, R 4, areas 11 */
    CHECK(rb_mlog_layout_of(30 * BA, BA, &l, &err) == -EINVAL);
    /* what the layout gives encodes as a superblock (the decoder's region rules hold) */
    {
        dev d;
        dev_init(&d);
        base_desc bd = {.len = BA, .log_seq = 0};
        put_sb(&d, 0, 1, 1, 0, &bd, 0);
        put_sb(&d, 1, 2, 1, 1, &bd, 0);
        free(d.b);
    }

    /* sizing */
    const uint64_t slot = (8ull << 20) + 4096, tb = 1ull << 40;
    CHECK(rb_mlog_auto_meta_total(64ull << 30, slot, 4096) == RB_MLOG_AUTO_MIN); /* ~8k slots */
    CHECK(rb_mlog_auto_meta_total(100ull << 20, slot, 4096) == 0);               /* below the minimum */
    CHECK(rb_mlog_auto_meta_total((128ull << 20) + slot - 1, slot, 4096) == 0);  /* no slot left */
    CHECK(rb_mlog_auto_meta_total((128ull << 20) + slot, slot, 4096) == RB_MLOG_AUTO_MIN);
    CHECK(rb_mlog_auto_meta_total(tb, slot, 3000) == 0 && rb_mlog_auto_meta_total(tb, 0, 4096) == 0);
    const uint64_t caps[] = {1 * tb, 16 * tb, 60 * tb, 15 * tb + 12345 * 4096};
    const uint64_t slots[] = {slot, 1ull << 20, 64ull << 20};
    for (size_t i = 0; i < 4; i++)
        for (size_t k = 0; k < 3; k++) {
            uint64_t m = rb_mlog_auto_meta_total(caps[i], slots[k], 4096);
            CHECK(m >= RB_MLOG_AUTO_MIN && m % (1 << 20) == 0);
            CHECK(rb_mlog_layout_of(m, 4096, &l, &err) == 0);
            CHECK(l.areas[0].len >= RB_MLOG_AREA_PER_SLOT * ((caps[i] - m) / slots[k]));
            if (m > RB_MLOG_AUTO_MIN) { /* the smallest: 1 MiB less does not hold the slots */
                uint64_t m2 = m - (1 << 20);
                CHECK(rb_mlog_layout_of(m2, 4096, &l, &err) == 0);
                CHECK(l.areas[0].len < RB_MLOG_AREA_PER_SLOT * ((caps[i] - m2) / slots[k]));
            }
        }
    /* 16 TB of 8 MiB slots: about 2M slots, 128 MiB per area, so about 342 MiB in all */
    uint64_t m = rb_mlog_auto_meta_total(16 * tb, slot, 4096);
    CHECK(m > (320ull << 20) && m < (360ull << 20));
    /* a block_align above 1 MiB: multiples of it */
    m = rb_mlog_auto_meta_total(16 * tb, slot, 4ull << 20);
    CHECK(m && m % (4ull << 20) == 0);
}

static void check_main(const scene *s, const sink *sk, const rb_mlog_read_result *res)
{
    CHECK(res->found && res->which == 0 && !res->fallback);
    CHECK(res->sb_state[0] == RB_MLOG_SB_VALID && res->sb_state[1] == RB_MLOG_SB_ABSENT);
    CHECK(res->sb_seq_seen[0] == 3 && res->sb_seq_seen[1] == 0);
    CHECK(res->base.complete && res->base.entries == 400 && res->base.chunks_ok == s->ba.n_chunks);
    CHECK(res->groups == 5 && res->last_seq == 15 && res->head == s->head && res->used == s->used);
    CHECK(res->last_records == s->nrec[5]);
    CHECK(res->log_end == RB_MLOG_END_NONE && strstr(res->log_why.msg, "generation"));
    CHECK(sk->n_ent == 400 && sk->order_ok);
    uint64_t lines = 0;
    for (size_t i = 0; i < s->ex.log.len; i++)
        lines += s->ex.log.data[i] == '\n';
    CHECK(res->records == lines && sk->n_rec == (long)res->records);
    /* the log's text: the SB line, then the records as written (the CLASS of group 15 also
     * went to cls, which this sink writes to the base text once the log began) */
    const char *first = strchr(sk->log.data, '\n');
    CHECK(first && !strncmp(sk->log.data, "SB seq=3", 8));
    size_t rest = sk->log.len - (size_t)(first + 1 - sk->log.data);
    CHECK(rest == s->ex.log.len && !memcmp(first + 1, s->ex.log.data, rest));
}

static void test_main_image(void)
{
    scene s;
    build(&s);
    rb_err err;
    sink a, b, c;
    rb_mlog_read_result ra, rb, rc;
    sink_init(&a);
    CHECK(rd(&s.d, 1, 0, &a, &ra, &err) == 0);
    check_main(&s, &a, &ra);
    /* the log is read in large windows: from the start to the ring's end, then from 0 */
    CHECK(s.d.ring_reads == 2);
    CHECK(ra.bytes_read == 2 * BA + s.ba.len + (s.d.L.ring.len - s.start) + s.d.L.ring.len);
    /* the base part is what rb_mlog_base_decode gives */
    {
        sink t;
        sink_init(&t);
        rb_mlog_base_result br;
        serial_base(&s.d, 0, s.ba.len, &t, &br);
        CHECK(base_res_eq(&br, &ra.base));
        /* a's base text has the log's CLASS appended after the base's part */
        CHECK(t.base.len < a.base.len && !memcmp(t.base.data, a.base.data, t.base.len));
        CHECK(strstr(a.base.data + t.base.len, "CLS 115 68656c6c6f") == a.base.data + t.base.len);
        sink_free(&t);
    }
    /* four threads, and a window of two blocks (groups longer than it are read whole) */
    sink_init(&b);
    CHECK(rd(&s.d, 4, 0, &b, &rb, &err) == 0);
    check_main(&s, &b, &rb);
    CHECK(buf_eq(&a.base, &b.base) && buf_eq(&a.log, &b.log));
    sink_init(&c);
    CHECK(rd(&s.d, 3, 2 * BA, &c, &rc, &err) == 0);
    check_main(&s, &c, &rc);
    CHECK(buf_eq(&a.base, &c.base) && buf_eq(&a.log, &c.log));
    CHECK(s.d.ring_reads > 5);
    sink_free(&a);
    sink_free(&b);
    sink_free(&c);

    /* an unreadable block past the log's end (inside the window that reads it) does not end
     * the walk: only the bytes a group needs decide */
    {
        dev d;
        dev_copy(&d, &s.d);
        d.fail_off = d.L.ring.off + s.head + 2 * BA;
        d.fail_len = BA;
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        check_main(&s, &k, &r);
        sink_free(&k);
        free(d.b);
    }
    /* superblock only */
    {
        rb_mlog_read_opts o = {.block_align = BA, .meta_total_bytes = MT, .sb_only = 1};
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        rb_mlog_read_cb cb = CB;
        cb.ctx = &k;
        CHECK(rb_mlog_read(&o, dev_pread, &s.d, &cb, &r, &err) == 0);
        CHECK(r.found && r.which == 0 && r.groups == 0 && k.n_ent == 0 && r.bytes_read == 2 * BA);
        CHECK(!strncmp(k.log.data, "SB seq=3", 8));
        CHECK(r.last_seq == 10 && r.head == s.start);
        sink_free(&k);
    }
    /* no callbacks at all */
    {
        rb_mlog_read_opts o = {.block_align = BA, .meta_total_bytes = MT, .threads = 2};
        rb_mlog_read_result r;
        CHECK(rb_mlog_read(&o, dev_pread, &s.d, NULL, &r, &err) == 0 && r.groups == 5 && r.base.entries == 400);
    }
    /* a callback's stop is returned: in the base (serial and parallel) and in the log */
    for (uint32_t th = 1; th <= 4; th += 3) {
        sink k;
        sink_init(&k);
        k.stop_ent = 250;
        CHECK(rd(&s.d, th, 0, &k, &ra, &err) == 9 && k.n_ent == 250 && k.n_rec == 0);
        sink_free(&k);
        sink_init(&k);
        k.stop_rec = 100;
        CHECK(rd(&s.d, th, 0, &k, &ra, &err) == 9 && k.n_rec == 100);
        sink_free(&k);
    }
    /* reads of the wrong region */
    {
        rb_mlog_read_opts o = {.block_align = BA, .meta_total_bytes = MT / 2};
        rb_mlog_read_result r;
        sink k;
        sink_init(&k);
        rb_mlog_read_cb cb = CB;
        cb.ctx = &k;
        CHECK(rb_mlog_read(&o, dev_pread, &s.d, &cb, &r, &err) == 0);
        CHECK(!r.found && r.sb_state[0] == RB_MLOG_SB_DAMAGED && r.sb_meta_total[0] == MT);
        CHECK(strstr(r.sb_why[0].msg, "not the 512 and 131072"));
        o.block_align = 500;
        CHECK(rb_mlog_read(&o, dev_pread, &s.d, &cb, &r, &err) == -EINVAL);
        o.block_align = BA;
        o.meta_total_bytes = BA;
        CHECK(rb_mlog_read(&o, dev_pread, &s.d, &cb, &r, &err) == -EINVAL);
        sink_free(&k);
    }
    scene_free(&s);
}

/* The log text a read of s delivers when group 10 + g is skipped as damage at ring offset at
 * (records: what the reader could count of it). */
static void check_gap(const scene *s, const sink *k, const rb_mlog_read_result *r, int g, uint64_t at, int64_t records)
{
    CHECK(r->gaps == 1 && r->groups_lost == 1 && r->gap_seq == 10 + (uint64_t)g && r->gap_at == at);
    CHECK(r->records_lost == records && strstr(r->gap_why.msg, "group"));
    CHECK(r->groups == 4 && r->last_seq == 15 && r->head == s->head && r->used == s->used);
    CHECK(r->log_end == RB_MLOG_END_NONE && k->order_ok);
    char line[160];
    snprintf(line, sizeof line, "GAP %d..%d at=%llu next_at=%llu records=%lld\n", 10 + g, 11 + g,
             (unsigned long long)at, (unsigned long long)s->off[g + 1], (long long)records);
    const char *first = strchr(k->log.data, '\n') + 1, *end = k->log.data + k->log.len;
    size_t a = s->ex_at[g], l = strlen(line), b = s->ex.log.len - s->ex_at[g + 1];
    CHECK((size_t)(end - first) == a + l + b);
    CHECK(!memcmp(first, s->ex.log.data, a) && !memcmp(first + a, line, l));
    CHECK(!memcmp(first + a + l, s->ex.log.data + s->ex_at[g + 1], b));
}

static void test_torn(void)
{
    scene s;
    build(&s);
    rb_err err;
    const uint64_t ring = s.d.L.ring.off;
    struct {
        int g;   /* the group damaged */
        int how; /* 0: a body byte flipped; 1: all but its first block never written (stale bytes);
                    2: as 1, and the group after it never written either (the last one torn) */
    } cases[] = {{4, 0}, {4, 1}, {4, 2}, {3, 0}, {3, 1}, {1, 1}, {5, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        dev d;
        dev_copy(&d, &s.d);
        int g = cases[ci].g;
        uint8_t *at = d.b + ring + s.off[g];
        if (cases[ci].how == 0) {
            at[RB_MLOG_GROUP_HDR_LEN + 3] ^= 0x04;
        } else {
            CHECK(s.len[g] > BA);
            memset(at + BA, 0xa5, s.len[g] - BA);
            if (cases[ci].how == 2) /* an older lap's group where the next would be */
                put_group(&d, s.off[g + 1], GEN, 2, 1, 1, 0, 0, NULL);
        }
        /* a later group follows (the last group, or the one after it gone, is a torn tail) */
        int tail = g == 5 || cases[ci].how == 2;
        for (uint32_t th = 1; th <= 4; th += 3) {
            sink k;
            sink_init(&k);
            rb_mlog_read_result r;
            CHECK(rd(&d, th, 0, &k, &r, &err) == 0);
            if (!tail) {
                check_gap(&s, &k, &r, g, s.off[g], s.nrec[g]);
                sink_free(&k);
                continue;
            }
            CHECK(r.gaps == 0 && r.groups_lost == 0 && r.records_lost == 0);
            CHECK(r.log_end == RB_MLOG_END_TORN && r.torn_at == s.off[g] && r.head == s.off[g]);
            CHECK(r.groups == (uint64_t)g - 1 && r.last_seq == 10 + (uint64_t)g - 1);
            uint64_t used = g >= 3 ? (s.d.L.ring.len - s.start) + s.off[g] : s.off[g] - s.start;
            CHECK(r.used == used);
            CHECK(strstr(r.log_why.msg, "log group"));
            /* only the groups before it were delivered */
            const char *first = strchr(k.log.data, '\n');
            size_t want = s.ex_at[g];
            CHECK(k.log.len - (size_t)(first + 1 - k.log.data) == want && !memcmp(first + 1, s.ex.log.data, want));
            sink_free(&k);
        }
        free(d.b);
    }
    /* The scan for later groups passes over a block it cannot read, a header's bytes at a time
     * for the window that holds it (not the window again for each block). */
    {
        dev d;
        dev_copy(&d, &s.d);
        d.b[ring + s.off[4] + RB_MLOG_GROUP_HDR_LEN + 3] ^= 0x04;
        d.fail_off = ring + s.start - BA; /* an older lap's block */
        d.fail_len = BA;
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        check_gap(&s, &k, &r, 4, s.off[4], s.nrec[4]);
        CHECK(d.reads < 2 * (s.d.L.ring.len / BA)); /* a window read again per block: twice that */
        sink_free(&k);
        free(d.b);
    }
    /* A damaged header (its CRC fails) is no group: as the walk finds group 13 after it, group
     * 12 is damage of unknown size; with 13..15 gone too, the log ends there, NONE. */
    for (int gone = 0; gone < 2; gone++) {
        dev d;
        dev_copy(&d, &s.d);
        d.b[ring + s.off[2] + 20] ^= 1;
        if (gone)
            memset(d.b + ring, 0, s.head); /* groups 13..15 */
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        if (!gone) {
            check_gap(&s, &k, &r, 2, s.off[2], -1);
        } else {
            CHECK(r.log_end == RB_MLOG_END_NONE && r.groups == 1 && r.head == s.off[2] && r.last_seq == 11);
            CHECK(r.gaps == 0 && r.used == s.off[2] - s.start && strstr(r.log_why.msg, "header CRC"));
        }
        sink_free(&k);
        free(d.b);
    }
    /* A group of the expected generation and sequence whose length runs past the ring's end:
     * the header says it is ours and expected, so it is torn (damage: group 13 follows). */
    {
        dev d;
        dev_copy(&d, &s.d);
        uint8_t *h = d.b + ring + s.off[2];
        rb_put_le(h + 24, 20 * BA, 8);
        rb_put_le(h + 32, 1, 4);
        rb_put_le(h + 40, (uint32_t)crc32(0, h, 40), 4);
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        check_gap(&s, &k, &r, 2, s.off[2], 1);
        CHECK(strstr(r.gap_why.msg, "ring's end"));
        sink_free(&k);
        free(d.b);
    }
    scene_free(&s);
}

/* A second base in area 1 (log_seq 12) and superblock 1 over it, its log from group 13. */
static void add_sb1(scene *s, uint64_t sb_seq)
{
    mk_ents(&s->B, 300, 1);
    s->bb = put_base(&s->d, 1, GEN, 12, &s->B, 700);
    put_sb(&s->d, 1, sb_seq, GEN, 1, &s->bb, 0);
}

static void test_sb_choice(void)
{
    rb_err err;
    scene s;
    build(&s);
    add_sb1(&s, 4);
    sink a, b;
    rb_mlog_read_result ra, rb;
    sink_init(&a);
    CHECK(rd(&s.d, 1, 0, &a, &ra, &err) == 0);
    CHECK(ra.found && ra.which == 1 && !ra.fallback && ra.sb_seq_seen[0] == 3 && ra.sb_seq_seen[1] == 4);
    CHECK(ra.base.entries == 300 && ra.base.complete && a.n_ent == 300);
    CHECK(ra.groups == 3 && ra.last_seq == 15 && ra.head == s.head && ra.used == s.head);
    {
        const char *first = strchr(a.log.data, '\n');
        size_t want = s.ex.log.len - s.ex_at13;
        CHECK(!strncmp(a.log.data, "SB seq=4", 8));
        CHECK(a.log.len - (size_t)(first + 1 - a.log.data) == want &&
              !memcmp(first + 1, s.ex.log.data + s.ex_at13, want));
    }
    sink_init(&b);
    CHECK(rd(&s.d, 4, 0, &b, &rb, &err) == 0);
    CHECK(buf_eq(&a.base, &b.base) && buf_eq(&a.log, &b.log) && rb.which == 1);
    sink_free(&a);
    sink_free(&b);

    /* the lower sequence in superblock 1: superblock 0 wins, no fallback */
    {
        dev d;
        dev_copy(&d, &s.d);
        put_sb(&d, 1, 2, GEN, 1, &s.bb, 0);
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        CHECK(r.which == 0 && !r.fallback && r.groups == 5 && r.base.entries == 400 && r.sb_seq_seen[1] == 2);
        sink_free(&k);
        free(d.b);
    }
    /* the newer superblock damaged: a byte of its body, a byte of its magic -> the older one,
     * fallback; two bytes of its magic: not ours (ABSENT), no fallback */
    {
        const int offs[] = {40, 3, -1};
        for (int i = 0; i < 3; i++) {
            dev d;
            dev_copy(&d, &s.d);
            uint8_t *sb1 = d.b + s.d.L.container_bytes;
            if (offs[i] >= 0) {
                sb1[offs[i]] ^= 0x01;
            } else {
                sb1[1] ^= 1;
                sb1[6] ^= 1;
            }
            sink k;
            sink_init(&k);
            rb_mlog_read_result r;
            CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
            CHECK(r.found && r.which == 0 && r.groups == 5 && r.base.entries == 400);
            if (offs[i] >= 0)
                CHECK(r.sb_state[1] == RB_MLOG_SB_DAMAGED && r.fallback == 1 && r.sb_why[1].msg[0]);
            else
                CHECK(r.sb_state[1] == RB_MLOG_SB_ABSENT && r.fallback == 0);
            sink_free(&k);
            free(d.b);
        }
    }
    /* the newer superblock's base overwritten (its area reused): NOBASE, the older one with
     * fallback; its end record damaged: the same (the base does not match), nothing of it
     * delivered */
    {
        for (int how = 0; how < 3; how++) {
            dev d;
            dev_copy(&d, &s.d);
            uint8_t *a1 = d.b + s.d.L.areas[1].off;
            if (how == 0) {
                memset(a1, 0, 2 * BA);
            } else if (how == 1) {
                memcpy(a1, d.b + s.d.L.areas[0].off, s.ba.len); /* base A's bytes: another log_seq */
            } else {                                            /* its end record */
                rb_mlog_base_result br;
                CHECK(rb_mlog_base_decode(a1, s.bb.len, NULL, &br, &err) == 0 && br.have_end);
                a1[br.end.off + 20] ^= 0x10;
            }
            sink k;
            sink_init(&k);
            rb_mlog_read_result r;
            CHECK(rd(&d, how == 1 ? 4 : 1, 0, &k, &r, &err) == 0);
            CHECK(r.found && r.which == 0 && r.fallback == 1 && r.sb_state[1] == RB_MLOG_SB_NOBASE);
            CHECK(r.sb_seq_seen[1] == 4 && r.groups == 5 && r.base.entries == 400 && k.n_ent == 400);
            CHECK(!strncmp(k.log.data, "SB seq=3", 8));
            if (how == 0)
                CHECK(strstr(r.sb_why[1].msg, "bad magic"));
            if (how == 1)
                CHECK(strstr(r.sb_why[1].msg, "log sequence"));
            if (how == 2)
                CHECK(strstr(r.sb_why[1].msg, "no end record"));
            sink_free(&k);
            free(d.b);
        }
    }
    /* both bases unusable: no superblock used */
    {
        dev d;
        dev_copy(&d, &s.d);
        memset(d.b + s.d.L.areas[0].off, 0, BA);
        memset(d.b + s.d.L.areas[1].off, 0, BA);
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        CHECK(!r.found && r.sb_state[0] == RB_MLOG_SB_NOBASE && r.sb_state[1] == RB_MLOG_SB_NOBASE && k.log.len == 0);
        sink_free(&k);
        free(d.b);
    }
    /* a blank region */
    {
        dev d;
        dev_init(&d);
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        CHECK(!r.found && r.sb_state[0] == RB_MLOG_SB_ABSENT && r.sb_state[1] == RB_MLOG_SB_ABSENT);
        sink_free(&k);
        free(d.b);
    }
    /* I/O errors: superblock 1 (newer) -> IOERR and the older one with fallback; the chosen
     * base -> the read fails; the ring at the wrap -> the log ends there (IOERR) */
    {
        dev d;
        dev_copy(&d, &s.d);
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        d.fail_off = s.d.L.container_bytes;
        d.fail_len = 1;
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        CHECK(r.which == 0 && r.fallback && r.sb_state[1] == RB_MLOG_SB_IOERR && strstr(r.sb_why[1].msg, "injected"));
        sink_free(&k);
        sink_init(&k);
        d.fail_off = s.d.L.areas[1].off + 3 * BA;
        CHECK(rd(&d, 4, 0, &k, &r, &err) == -EIO && strstr(err.msg, "injected") && k.n_ent == 0);
        sink_free(&k);
        sink_init(&k);
        d.fail_off = s.d.L.ring.off; /* ring offset 0: where group 13 is */
        CHECK(rd(&d, 4, 0, &k, &r, &err) == 0);
        /* groups 14 and 15 follow the unreadable one: it is damage, skipped */
        CHECK(r.which == 1 && r.gaps == 1 && r.gap_seq == 13 && r.gap_at == 0 && r.records_lost == -1 &&
              rb_mlog_read_lost(&r));
        CHECK(strstr(r.gap_why.msg, "injected") && r.groups == 2 && r.head == s.head && r.last_seq == 15);
        sink_free(&k);
        /* superblock 0 alone: the ring read fails after group 12 (at the wrap) */
        put_sb(&d, 1, 1, GEN, 1, &s.bb, 0); /* older now */
        sink_init(&k);
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        CHECK(r.which == 0 && r.gaps == 1 && r.gap_seq == 13 && r.gap_at == s.off[2] + s.len[2]);
        CHECK(r.groups == 4 && r.last_seq == 15 && r.head == s.head && strstr(r.gap_why.msg, "injected"));
        sink_free(&k);
        /* and with groups 14 and 15 gone, the log ends at the read error */
        memset(d.b + d.L.ring.off + s.off[4], 0, s.len[4] + s.len[5]);
        sink_init(&k);
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        CHECK(r.which == 0 && r.log_end == RB_MLOG_END_IOERR && r.groups == 2 && r.last_seq == 12 && r.gaps == 0);
        CHECK(r.head == s.off[2] + s.len[2] && strstr(r.log_why.msg, "injected"));
        /* which recovery counts as damage (a new generation, entries checked), not a torn tail */
        CHECK(rb_mlog_read_lost(&r));
        d.fail_len = 0;
        sink_free(&k);
        sink_init(&k);
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        CHECK(r.log_end != RB_MLOG_END_IOERR && r.gaps == 0 && !r.base.chunks_bad && !rb_mlog_read_lost(&r));
        sink_free(&k);
        free(d.b);
    }
    scene_free(&s);
}

/* Parallel decoding delivers and reports exactly what the serial decoder does, damage included. */
static void test_parallel_equals_serial(void)
{
    rb_err err;
    scene s;
    build(&s);
    const uint8_t *a0 = s.d.b + s.d.L.areas[0].off;
    rb_mlog_chunk ch[256];
    size_t nch = 0;
    {
        rb_mlog_bdec d;
        rb_mlog_bdec_init(&d);
        rb_mlog_base_info bi;
        CHECK(rb_mlog_base_open(a0, s.ba.len, &d, &bi, NULL, &err) == 0);
        uint64_t off = bi.chunks_off;
        rb_mlog_base_end end;
        while (rb_mlog_base_at(a0, s.ba.len, off, &bi, &ch[nch], &end, &err) == 1) {
            off += RB_MLOG_CHUNK_HDR_LEN + ch[nch].comp_len;
            nch++;
        }
        rb_mlog_bdec_free(&d);
    }
    CHECK(nch == s.ba.n_chunks && nch >= 20);
    for (int how = 0; how < 8; how++) {
        dev d;
        dev_copy(&d, &s.d);
        uint8_t *b = d.b + d.L.areas[0].off;
        switch (how) {
        case 0:
            break;
        case 1: /* payloads of three chunks */
            for (int k = 2; k < 9; k += 3)
                b[ch[k].off + RB_MLOG_CHUNK_HDR_LEN + ch[k].comp_len / 2] ^= 0x20;
            break;
        case 2: /* a header, two headers in a row */
            b[ch[3].off + 30] ^= 1;
            b[ch[10].off] ^= 1;
            b[ch[11].off + 9] ^= 1;
            break;
        case 3: /* chunk 5 renumbered 2 (out of order), CRC right */
            rb_put_le(b + ch[5].off + 24, 2, 4);
            rb_put_le(b + ch[5].off + 56, (uint32_t)crc32(0, b + ch[5].off, 56), 4);
            break;
        case 4: /* chunk 7's first slot not above chunk 6's last */
            rb_put_le(b + ch[7].off + 40, ch[6].last_slot, 4);
            rb_put_le(b + ch[7].off + 56, (uint32_t)crc32(0, b + ch[7].off, 56), 4);
            break;
        case 5: /* chunk 6's payload bad, so chunk 7 (slots above 5's) is judged against 5 */
            b[ch[6].off + RB_MLOG_CHUNK_HDR_LEN + 1] ^= 0x01;
            rb_put_le(b + ch[7].off + 40, ch[6].first_slot, 4);
            rb_put_le(b + ch[7].off + 56, (uint32_t)crc32(0, b + ch[7].off, 56), 4);
            break;
        case 6: /* the first and the last chunk's headers */
            b[ch[0].off + 12] ^= 1;
            b[ch[nch - 1].off + 50] ^= 1;
            break;
        default: /* a chunk of another base in the place of chunk 4 (a stale one) */
            rb_put_le(b + ch[4].off + 8, GEN + 1, 8);
            rb_put_le(b + ch[4].off + 56, (uint32_t)crc32(0, b + ch[4].off, 56), 4);
            break;
        }
        sink t;
        sink_init(&t);
        rb_mlog_base_result br;
        serial_base(&d, 0, s.ba.len, &t, &br);
        if (how)
            CHECK(!br.complete && br.chunks_bad > 0);
        for (uint32_t th = 1; th <= 5; th++) {
            sink k;
            sink_init(&k);
            rb_mlog_read_result r;
            CHECK(rd(&d, th, 0, &k, &r, &err) == 0);
            CHECK(r.found && r.which == 0 && r.groups == 5);
            CHECK(base_res_eq(&br, &r.base));
            CHECK(k.base.len >= t.base.len && !memcmp(k.base.data, t.base.data, t.base.len));
            sink_free(&k);
        }
        sink_free(&t);
        free(d.b);
    }
    scene_free(&s);
}

/* A ring where every position holds the next group: the walk stops after the whole ring. */
static void test_full_ring(void)
{
    rb_err err;
    dev d;
    dev_init(&d);
    ents e;
    mk_ents(&e, 10, 0);
    base_desc bd = put_base(&d, 0, GEN, 10, &e, 0);
    const uint64_t rl = d.L.ring.len, start = 10 * BA;
    put_sb(&d, 0, 1, GEN, 0, &bd, start);
    uint64_t n = rl / BA;
    for (uint64_t k = 0; k < n; k++)
        CHECK(put_group(&d, (start + k * BA) % rl, GEN, 11 + k, 1, 1, 0, 0, NULL) == BA);
    for (uint32_t th = 1; th <= 2; th++) {
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        CHECK(rd(&d, th, 0, &k, &r, &err) == 0);
        CHECK(r.log_end == RB_MLOG_END_FULL && r.groups == n && r.used == rl && r.head == start);
        CHECK(r.last_seq == 10 + n && k.order_ok);
        sink_free(&k);
    }
    /* the last group but one says it is three blocks long (its header CRC right): it would
     * pass the start, so the walk stops before it */
    {
        uint8_t *h = d.b + d.L.ring.off + (start + (n - 2) * BA) % rl;
        rb_put_le(h + 24, 2 * BA + 100, 8);
        rb_put_le(h + 40, (uint32_t)crc32(0, h, 40), 4);
    }
    {
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        CHECK(r.log_end == RB_MLOG_END_FULL && r.groups == n - 2 && r.used == rl - 2 * BA);
        CHECK(strstr(r.log_why.msg, "would pass"));
        sink_free(&k);
    }
    /* the group at the start is of another generation: the groups after it are replayed past
     * the gap, and past the one that says it is too long (its body fails) to the last one (the
     * ring is no longer the bound: the sequences are) */
    put_group(&d, start, GEN + 5, 11, 1, 1, 0, 0, NULL);
    {
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        CHECK(r.gaps == 2 && r.groups_lost == 2 && r.gap_seq == 11 && r.gap_at == start && r.records_lost == -1);
        CHECK(r.groups == n - 2 && r.last_seq == 10 + n && r.log_end == RB_MLOG_END_NONE && k.order_ok);
        CHECK(r.head == start && r.used == rl);
        sink_free(&k);
    }
    /* nothing of this generation after it: nothing replayed */
    for (uint64_t k = 1; k < n; k++)
        put_group(&d, (start + k * BA) % rl, GEN + 5, 11 + k, 1, 1, 0, 0, NULL);
    {
        sink k;
        sink_init(&k);
        rb_mlog_read_result r;
        CHECK(rd(&d, 1, 0, &k, &r, &err) == 0);
        CHECK(r.log_end == RB_MLOG_END_NONE && r.groups == 0 && r.head == start && r.used == 0 && r.last_seq == 10);
        CHECK(r.gaps == 0);
        sink_free(&k);
    }
    free(d.b);
}

/* ---- damage, exhaustively: every bit of a small log and of both superblocks -------------- */

/* The index a read rebuilds, per slot: a hash of the key it holds (0: free), the base's entries
 * then the log's records applied as the core does (a PUT vacates the slot and moves the key). */
#define DS_SLOTS 256
typedef struct dstate {
    uint64_t slot[DS_SLOTS];
    uint64_t gaps_seen;
} dstate;

static uint64_t key_hash(const char *k, uint32_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)k[i]) * 1099511628211ull;
    return h | 1;
}

static void ds_put(dstate *d, const rb_mlog_ent *e)
{
    CHECK(e->slot < DS_SLOTS);
    uint64_t h = key_hash(e->key, e->key_len);
    for (uint32_t s = 0; s < DS_SLOTS; s++)
        if (d->slot[s] == h)
            d->slot[s] = 0;
    d->slot[e->slot] = h;
}

static int ds_ent(void *ctx, const rb_mlog_ent *e)
{
    ds_put(ctx, e);
    return 0;
}

static int ds_rec(void *ctx, uint64_t seq, const rb_mlog_rec *r)
{
    (void)seq;
    dstate *d = ctx;
    if (r->type == RB_MLOG_PUT)
        ds_put(d, &r->ent);
    else if (r->type == RB_MLOG_FREE && r->slot < DS_SLOTS)
        d->slot[r->slot] = 0;
    return 0;
}

static int ds_gap(void *ctx, const rb_mlog_gap *g)
{
    (void)g;
    ((dstate *)ctx)->gaps_seen++;
    return 0;
}

/* A small log: base of 20 entries, groups 11..15 from block 59 of 64 (group 14, deflated, does
 * not fit at the end and is at 0); records that free base slots, reuse them, move keys. The
 * slots each group's records name, to bound what damage to it may change. */
typedef struct dscene {
    dev d;
    ents base;
    uint64_t off[6], len[6], body[6];
    uint32_t nrec[6];
    uint8_t touched[6][DS_SLOTS];
    char keys[64][40];
    int kslot[64]; /* where each key was last put, -1: nowhere yet */
} dscene;

typedef struct drec {
    int free; /* 1: FREE slot; 0: PUT key (an index into dscene.keys) at slot */
    uint32_t slot;
    int key;
} drec;

static uint64_t dgroup(dscene *s, int g, uint64_t at, const drec *r, int n, int level)
{
    rb_err err;
    rb_mlog_genc e;
    rb_mlog_genc_init(&e);
    e.epoch = 3;
    for (int i = 0; i < n; i++) {
        s->touched[g][r[i].slot] = 1;
        if (r[i].free) {
            CHECK(rb_mlog_genc_free_slot(&e, r[i].slot, &err) == 0);
            continue;
        }
        const char *k = s->keys[r[i].key];
        rb_mlog_ent me = {.key = k, .key_len = (uint32_t)strlen(k), .slot = r[i].slot, .size = 4096, .npos = -1};
        CHECK(rb_mlog_genc_put(&e, &me, &err) == 0);
        /* a key moved: its old slot changes too */
        if (s->kslot[r[i].key] >= 0)
            s->touched[g][s->kslot[r[i].key]] = 1;
        s->kslot[r[i].key] = (int)r[i].slot;
    }
    rb_buf out = {0};
    CHECK(rb_mlog_genc_seal(&e, GEN, 10 + (uint64_t)g, BA, level, &out, &err) == 0);
    CHECK(at + out.len <= s->d.L.ring.len);
    memcpy(s->d.b + s->d.L.ring.off + at, out.data, out.len);
    s->off[g] = at;
    s->len[g] = out.len;
    s->body[g] = rb_get_le((const uint8_t *)out.data + 24, 8);
    s->nrec[g] = (uint32_t)n;
    rb_buf_free(&out);
    rb_mlog_genc_free(&e);
    return at + s->len[g];
}

static void dbuild(dscene *s)
{
    memset(s, 0, sizeof *s);
    dev_init(&s->d);
    mk_ents(&s->base, 20, 3);
    CHECK(s->base.e[19].slot < 80);
    for (int i = 0; i < 64; i++) {
        snprintf(s->keys[i], sizeof s->keys[i], "model@0x%08x@0@%016llx", i % 8, (unsigned long long)rnd());
        s->kslot[i] = -1;
    }
    base_desc bd = put_base(&s->d, 0, GEN, 10, &s->base, 300);
    const uint64_t start = 59 * BA;
    put_sb(&s->d, 0, 5, GEN, 0, &bd, start);
    put_sb(&s->d, 1, 4, GEN, 0, &bd, start); /* the mirror a first format writes */
    const uint32_t b2 = s->base.e[2].slot, b5 = s->base.e[5].slot, b7 = s->base.e[7].slot;
    const drec g11[] = {{0, 100, 0}, {1, b2, 0}, {0, 101, 1}};
    const drec g12[] = {{0, b2, 2}, {1, b5, 0}, {0, 102, 3}, {1, 100, 0}};
    drec g13[24], g14[30];
    for (int i = 0; i < 23; i++)
        g13[i] = (drec){0, 110 + (uint32_t)i, 4 + i};
    g13[23] = (drec){1, b7, 0};
    for (int i = 0; i < 30; i++) /* keys of group 13 moved, and new ones */
        g14[i] = (drec){0, 140 + (uint32_t)i, i < 5 ? 4 + i : 22 + i};
    const drec g15[] = {{1, 140, 0}, {0, b5, 60}, {1, 101, 0}};
    uint64_t p = dgroup(s, 1, start, g11, 3, 0);
    p = dgroup(s, 2, p, g12, 4, 0);
    p = dgroup(s, 3, p, g13, 24, 1); /* deflated */
    CHECK(rb_get_le(s->d.b + s->d.L.ring.off + s->off[3] + 36, 4) & RB_MLOG_GROUP_DEFLATE);
    p = dgroup(s, 4, 0, g14, 30, 0); /* does not fit before the ring's end: at 0 */
    CHECK(s->len[4] > s->d.L.ring.len - s->off[3] - s->len[3] && s->off[3] > s->off[2]);
    dgroup(s, 5, p, g15, 3, 0);
}

static void dread(dev *d, dstate *st, rb_mlog_read_result *r)
{
    memset(st, 0, sizeof *st);
    rb_mlog_read_opts o = {.block_align = BA, .meta_total_bytes = MT, .threads = 1};
    rb_mlog_read_cb cb = {.ctx = st, .ent = ds_ent, .rec = ds_rec, .gap = ds_gap};
    rb_err err;
    CHECK(rb_mlog_read(&o, dev_pread, d, &cb, r, &err) == 0);
    CHECK(r->gaps == st->gaps_seen);
}

/* Slots whose key differs from the truth t, all of them among the slots group g's records name
 * (g 0: none may differ); how many keys of t are not where they were. */
static uint32_t ds_diff(const dscene *s, const dstate *t, const dstate *x, int g)
{
    uint32_t lost = 0;
    for (uint32_t k = 0; k < DS_SLOTS; k++) {
        if (t->slot[k] == x->slot[k])
            continue;
        CHECK(g > 0 && s->touched[g][k]);
        lost += t->slot[k] != 0;
    }
    return lost;
}

/* One bit of group g flipped: the read's state differs from the truth only in the group's
 * slots, keys lost at most its records; damage before the last group is reported as a gap. */
static void dflip_group(const dscene *s, dev *d, const dstate *truth, int g, uint64_t bit)
{
    const uint64_t at = d->L.ring.off + s->off[g] + bit / 8;
    d->b[at] ^= (uint8_t)(1u << (bit % 8));
    dstate st;
    rb_mlog_read_result r;
    dread(d, &st, &r);
    d->b[at] ^= (uint8_t)(1u << (bit % 8));
    /* header: a byte the header CRC covers, or that CRC (the group CRC after it is the body's) */
    const int inside = bit / 8 < RB_MLOG_GROUP_HDR_LEN + s->body[g], header = bit / 8 < 44;
    uint32_t lost = ds_diff(s, truth, &st, inside ? g : 0);
    CHECK(lost <= s->nrec[g]);
    CHECK(r.found && r.which == 0 && !r.fallback);
    if (!inside) { /* padding: no part of the group */
        CHECK(r.gaps == 0 && r.groups == 5);
    } else if (g < 5) {
        CHECK(r.gaps == 1 && r.groups_lost == 1 && r.gap_seq == 10 + (uint64_t)g && r.groups == 4);
        /* a header that does not read is looked for where the walk stood (its group may be at 0) */
        const uint64_t stood = g == 4 && header ? s->off[3] + s->len[3] : s->off[g];
        CHECK(r.last_seq == 15 && r.gap_at == stood && r.head == s->off[5] + s->len[5]);
        CHECK(r.records_lost == (header ? -1 : (int64_t)s->nrec[g]));
    } else { /* the last group: a torn tail */
        CHECK(r.gaps == 0 && r.groups == 4 && r.last_seq == 14 && r.head == s->off[5]);
    }
}

static void test_damage_every_bit(void)
{
    dscene s;
    dbuild(&s);
    dstate truth;
    rb_mlog_read_result r;
    dread(&s.d, &truth, &r);
    CHECK(r.groups == 5 && r.gaps == 0 && r.last_seq == 15 && r.log_end == RB_MLOG_END_NONE);
    uint64_t flips = 0;
    for (int g = 1; g <= 5; g++)
        for (uint64_t bit = 0; bit < s.len[g] * 8; bit++, flips++)
            dflip_group(&s, &s.d, &truth, g, bit);
    /* both superblocks: one damaged, the other (a mirror) recovers the same state, reported as
     * a fallback; past its 256 bytes the span is no part of it */
    for (int w = 0; w < 2; w++)
        for (uint64_t bit = 0; bit < BA * 8; bit++, flips++) {
            uint8_t *at = s.d.b + (w ? s.d.L.container_bytes : 0) + bit / 8;
            *at ^= (uint8_t)(1u << (bit % 8));
            dstate st;
            dread(&s.d, &st, &r);
            *at ^= (uint8_t)(1u << (bit % 8));
            CHECK(ds_diff(&s, &truth, &st, 0) == 0 && r.groups == 5 && r.gaps == 0);
            CHECK(r.fallback == (bit / 8 < 256) && r.which == (bit / 8 < 256 ? 1 - w : 0));
        }
    /* the log cut at every group boundary (groups g.. gone): a torn tail, nothing reported,
     * only the cut groups' slots differ */
    for (int g = 1; g <= 5; g++) {
        dev d;
        dev_copy(&d, &s.d);
        for (int k = g; k <= 5; k++)
            memset(d.b + d.L.ring.off + s.off[k], 0, s.len[k]);
        dstate st;
        dread(&d, &st, &r);
        CHECK(r.gaps == 0 && r.groups == (uint64_t)g - 1);
        for (uint32_t k = 0; k < DS_SLOTS; k++) {
            int cut = 0;
            for (int j = g; j <= 5; j++)
                cut |= s.touched[j][k];
            CHECK(truth.slot[k] == st.slot[k] || cut);
        }
        free(d.b);
    }
    printf("test_mlog_read: %llu bits flipped one at a time, 5 cuts\n", (unsigned long long)flips);
    free(s.d.b);
}

/* The log ends with an end mark (a group of no records, as a writer appends at a clean
 * close): it is replayed like any group (last_records 0, the head past it); a flip in the
 * group before it, the last one of changes, is damage (the mark follows it), reported with
 * its records; a flip in the mark itself is a torn tail that loses nothing. */
static void test_end_mark(void)
{
    scene s;
    build(&s);
    rb_err err;
    const uint64_t ring = s.d.L.ring.off;
    CHECK(put_group(&s.d, s.head, GEN, 16, 0, 0, 0, 1, NULL) == BA); /* never deflated */
    sink k;
    sink_init(&k);
    rb_mlog_read_result r;
    CHECK(rd(&s.d, 1, 0, &k, &r, &err) == 0);
    CHECK(r.groups == 6 && r.last_seq == 16 && r.last_records == 0 && r.gaps == 0);
    CHECK(r.head == s.head + BA && r.used == s.used + BA && r.records == (uint64_t)k.n_rec);
    const uint64_t total = r.records;
    sink_free(&k);
    const uint64_t body = rb_get_le(s.d.b + ring + s.off[5] + 24, 8);
    uint64_t gaps = 0, clean = 0;
    for (uint64_t bit = 0; bit < s.len[5] * 8; bit++) {
        uint8_t *at = s.d.b + ring + s.off[5] + bit / 8;
        *at ^= (uint8_t)(1u << (bit % 8));
        sink_init(&k);
        CHECK(rd(&s.d, 1, 0, &k, &r, &err) == 0);
        *at ^= (uint8_t)(1u << (bit % 8));
        CHECK(r.last_seq == 16 && r.last_records == 0 && r.head == s.head + BA && k.order_ok);
        if (bit / 8 >= RB_MLOG_GROUP_HDR_LEN + body) { /* the padding: no part of the group */
            CHECK(r.gaps == 0 && r.groups == 6);
            clean++;
        } else {
            CHECK(r.gaps == 1 && r.groups_lost == 1 && r.gap_seq == 15 && r.gap_at == s.off[5]);
            CHECK(r.groups == 5 && (r.records_lost == s.nrec[5] || r.records_lost == -1));
            CHECK(r.records == total - s.nrec[5]);
            gaps++;
        }
        sink_free(&k);
    }
    CHECK(gaps == (RB_MLOG_GROUP_HDR_LEN + body) * 8 && clean + gaps == s.len[5] * 8);
    for (uint64_t bit = 0; bit < RB_MLOG_GROUP_HDR_LEN * 8; bit++) {
        uint8_t *at = s.d.b + ring + s.head + bit / 8;
        *at ^= (uint8_t)(1u << (bit % 8));
        sink_init(&k);
        CHECK(rd(&s.d, 1, 0, &k, &r, &err) == 0);
        *at ^= (uint8_t)(1u << (bit % 8));
        CHECK(r.gaps == 0 && r.groups == 5 && r.last_seq == 15 && r.last_records == s.nrec[5]);
        CHECK(r.head == s.head && r.used == s.used);
        sink_free(&k);
    }
    printf("test_mlog_read: end mark, %llu bits of the last group flipped\n", (unsigned long long)(gaps + clean));
    scene_free(&s);
}

int main(void)
{
    test_layout();
    test_main_image();
    test_torn();
    test_sb_choice();
    test_parallel_equals_serial();
    test_full_ring();
    test_end_mark();
    test_damage_every_bit();
    printf("test_mlog_read: all passed\n");
    return 0;
}
