/*
 * rb_mlog_read.c - the metadata region of the log-structured format as a whole
 * (rb_mlog_read.h): where its parts lie, how large a blank device's region is, and reading it
 * back: both superblocks, the chosen one's base (chunks decoded on worker threads and handed
 * out in order on the caller's), then the walk of the log ring. The device is reached only
 * through the caller's read callback, in block-aligned reads into aligned buffers.
 */
#include "rb_mlog_read.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static int is_pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* ---- layout and sizing ------------------------------------------------------------------- */

int rb_mlog_layout_of(uint64_t meta_total_bytes, uint64_t block_align, rb_mlog_layout *out, rb_err *err)
{
    static const char W[] = "metadata layout";
    const uint64_t ba = block_align, mt = meta_total_bytes;
    if (!is_pow2(ba) || ba > (1ull << 30))
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s: block_align %llu is not a power of two up to 2^30", W,
                          (unsigned long long)ba);
    if (mt % ba)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s: meta_total_bytes %llu is not a multiple of block_align %llu",
                          W, (unsigned long long)mt, (unsigned long long)ba);
    /* C as rb_container_bytes (rb_config.h) has it; the superblock decoder checks the same rule */
    const uint64_t c = mt / 2 / ba * ba, s = rb_mlog_sb_span(ba), r = c / 4 / ba * ba;
    if (r < 4 * ba || c < s + r + 4 * ba)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "%s: meta_total_bytes %llu is too small: the log ring (%llu bytes) and each base area "
                          "need 4 blocks of %llu at least",
                          W, (unsigned long long)mt, (unsigned long long)r, (unsigned long long)ba);
    memset(out, 0, sizeof *out);
    out->meta_total_bytes = mt;
    out->container_bytes = c;
    out->block_align = ba;
    out->sb_span = s;
    out->areas[0] = (rb_mlog_area){s, c - r - s};
    out->ring = (rb_mlog_area){c - r, r};
    out->areas[1] = (rb_mlog_area){c + s, c - r - s};
    return 0;
}

/* The region of m bytes holds a base area of RB_MLOG_AREA_PER_SLOT bytes per slot left. */
static int auto_fits(uint64_t m, uint64_t capacity, uint64_t slot_bytes, uint64_t ba)
{
    rb_mlog_layout l;
    if (rb_mlog_layout_of(m, ba, &l, NULL) < 0)
        return 0;
    return l.areas[0].len / RB_MLOG_AREA_PER_SLOT >= (capacity - m) / slot_bytes;
}

uint64_t rb_mlog_auto_meta_total(uint64_t capacity, uint64_t slot_bytes, uint64_t block_align)
{
    if (!is_pow2(block_align) || block_align > (1ull << 30) || slot_bytes == 0 || capacity < slot_bytes)
        return 0;
    /* Candidates are multiples of step; the area grows with the region and the slots left shrink,
     * so the sizes that fit are all those from the smallest one up: a binary search finds it. */
    const uint64_t step = block_align > (1ull << 20) ? block_align : (1ull << 20);
    uint64_t lo = (RB_MLOG_AUTO_MIN + step - 1) / step, hi = (capacity - slot_bytes) / step; /* a slot at least */
    if (hi < lo || !auto_fits(hi * step, capacity, slot_bytes, block_align))
        return 0;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (auto_fits(mid * step, capacity, slot_bytes, block_align))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo * step;
}

/* ---- device reads ------------------------------------------------------------------------ */

#define BASE_READ_MAX (64ull << 20) /* one read of a base at most */

typedef struct rdr {
    rb_mlog_pread_fn fn;
    void *ctx;
    rb_mlog_read_result *res;
    uint64_t ba;
} rdr;

static void *abuf(uint64_t ba, uint64_t len)
{
    void *p = NULL;
    size_t a = ba < sizeof(void *) ? sizeof(void *) : (size_t)ba;
    if (len > SIZE_MAX || posix_memalign(&p, a, len ? (size_t)len : a) != 0)
        return NULL;
    return p;
}

static int dev_read(rdr *r, uint64_t off, void *buf, uint64_t len, rb_err *err)
{
    rb_err_clear(err);
    int rc = r->fn(r->ctx, off, buf, (size_t)len, err);
    if (rc == 0) {
        r->res->bytes_read += len;
        return 0;
    }
    if (rc > 0)
        rc = -EIO;
    if (err->kind == RB_ERR_NONE)
        rb_err_set(err, RB_ERR_OS, -rc, "metadata read of %llu bytes at device offset %llu failed",
                   (unsigned long long)len, (unsigned long long)off);
    return rc;
}

/* ---- superblocks ------------------------------------------------------------------------- */

/* Our magic, or one byte off it (a damaged superblock of ours, not another format's bytes). */
static int magic_near(const uint8_t *p)
{
    int diff = 0;
    for (int i = 0; i < 8; i++)
        diff += p[i] != (uint8_t)RB_MLOG_SB_MAGIC[i];
    return diff <= 1;
}

static void sb_read(rdr *r, const rb_mlog_read_opts *o, int which, uint64_t off, uint8_t *buf, uint64_t span,
                    rb_mlog_sb *sb)
{
    rb_mlog_read_result *res = r->res;
    rb_err *why = &res->sb_why[which];
    if (dev_read(r, off, buf, span, why) < 0) {
        res->sb_state[which] = RB_MLOG_SB_IOERR;
        return;
    }
    if (!magic_near(buf)) {
        res->sb_state[which] = RB_MLOG_SB_ABSENT;
        return;
    }
    if (rb_mlog_sb_decode(buf, (size_t)span, sb, why) < 0) {
        res->sb_state[which] = RB_MLOG_SB_DAMAGED;
        return;
    }
    res->sb_meta_total[which] = sb->meta_total_bytes;
    if (sb->block_align != o->block_align || sb->meta_total_bytes != o->meta_total_bytes) {
        rb_err_set(why, RB_ERR_VALUE, EBADMSG,
                   "metadata superblock %d: block_align %llu and meta_total_bytes %llu, "
                   "not the %llu and %llu it is read with",
                   which, (unsigned long long)sb->block_align, (unsigned long long)sb->meta_total_bytes,
                   (unsigned long long)o->block_align, (unsigned long long)o->meta_total_bytes);
        res->sb_state[which] = RB_MLOG_SB_DAMAGED;
        return;
    }
    res->sb_state[which] = RB_MLOG_SB_VALID;
    res->sb_seq_seen[which] = sb->sb_seq;
}

/* ---- the base: read, walk its headers, check it against the superblock -------------------- */

/* A step of the header walk, kept compact (a GAP's report is in gaps[gap]). */
typedef struct cstep {
    int kind, out_of_order;
    uint32_t expect;
    size_t gap;
    rb_mlog_chunk ch;
    rb_mlog_base_end end;
} cstep;

typedef struct baseld {
    uint8_t *buf;
    uint64_t len;
    rb_mlog_base_info bi;
    cstep *st;
    size_t n, cap;
    rb_mlog_damage *gaps;
    size_t ngaps, gcap;
    size_t nchunks; /* CHUNK steps not out of order: the ones decoded */
} baseld;

static void baseld_free(baseld *b)
{
    free(b->buf);
    free(b->st);
    free(b->gaps);
    memset(b, 0, sizeof *b);
}

static int grow(void **p, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? 2 * *cap : 64;
    void *q = realloc(*p, nc * size);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = nc;
    return 0;
}

static int nomem(rb_err *err, const char *what)
{
    return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "%s: out of memory", what);
}

/* Read the base sb points at and walk its headers. 0: usable; 1: not (why says why); <0: a
 * read failed or memory ran out (err). */
static int base_load(rdr *r, const rb_mlog_sb *sb, baseld *b, rb_err *why, rb_err *err)
{
    static const char W[] = "metadata base";
    memset(b, 0, sizeof *b);
    const uint64_t off = rb_mlog_sb_base_off(sb);
    b->len = sb->base.len;
    if (!(b->buf = abuf(r->ba, b->len)))
        return nomem(err, W);
    for (uint64_t done = 0; done < b->len;) {
        uint64_t n = b->len - done > BASE_READ_MAX ? BASE_READ_MAX : b->len - done;
        int rc = dev_read(r, off + done, b->buf + done, n, err);
        if (rc < 0)
            return rc;
        done += n;
    }
    rb_mlog_bdec d;
    rb_mlog_bdec_init(&d);
    int rc = rb_mlog_base_open(b->buf, (size_t)b->len, &d, &b->bi, NULL, why);
    rb_mlog_bdec_free(&d);
    if (rc == -ENOMEM) {
        *err = *why;
        return rc;
    }
    if (rc < 0)
        return 1;
    rb_mlog_bwalk w;
    rb_mlog_bwalk_init(&w, b->buf, (size_t)b->len, &b->bi);
    rb_mlog_bstep st;
    rb_mlog_base_result pre;
    memset(&pre, 0, sizeof pre);
    pre.info = b->bi;
    pre.entries_lost = -1;
    while (rb_mlog_bwalk_next(&w, &st)) {
        if (grow((void **)&b->st, &b->cap, b->n, sizeof *b->st) < 0)
            return nomem(err, W);
        cstep *c = &b->st[b->n++];
        memset(c, 0, sizeof *c);
        c->kind = st.kind;
        c->out_of_order = st.out_of_order;
        c->expect = st.expect;
        c->ch = st.ch;
        c->end = st.end;
        if (st.kind == RB_MLOG_STEP_GAP) {
            if (grow((void **)&b->gaps, &b->gcap, b->ngaps, sizeof *b->gaps) < 0)
                return nomem(err, W);
            c->gap = b->ngaps;
            b->gaps[b->ngaps++] = st.dm;
        } else if (st.kind == RB_MLOG_STEP_CHUNK && !st.out_of_order) {
            b->nchunks++;
        } else if (st.kind == RB_MLOG_STEP_END) {
            pre.have_end = 1;
            pre.end = st.end;
            pre.len = st.end.off + RB_MLOG_END_LEN;
        }
    }
    /* What rb_mlog_base_matches looks at comes from the headers alone: known before any entry
     * is handed out, so a base that does not match delivers nothing. */
    if (rb_mlog_base_matches(sb, &pre, why) < 0)
        return 1;
    return 0;
}

/* ---- the base: chunks decoded on worker threads ------------------------------------------- */

typedef struct aent {
    rb_mlog_ent e;
    size_t koff, poff;
} aent;

/* One chunk's decoded entries, copied out of the decoder's scratch. */
typedef struct slot {
    int done, rc;
    rb_err why;
    aent *v;
    size_t n, cap;
    rb_buf keys;
    int64_t *pos;
    size_t npos, pcap;
} slot;

typedef struct pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    const baseld *b;
    size_t *jobs; /* step index of each chunk to decode, in walk order */
    size_t njobs, next, limit, w;
    int stop;
    slot *slots;
} pool;

static int slot_add(void *ctx, const rb_mlog_ent *e)
{
    slot *s = ctx;
    if (grow((void **)&s->v, &s->cap, s->n, sizeof *s->v) < 0)
        return -ENOMEM;
    aent *a = &s->v[s->n];
    a->e = *e;
    a->koff = s->keys.len;
    a->poff = s->npos;
    if (e->key_len && rb_buf_put(&s->keys, e->key, e->key_len) < 0)
        return -ENOMEM;
    if (e->npos > 0) {
        size_t need = s->npos + (size_t)e->npos;
        if (need > s->pcap) {
            size_t nc = s->pcap ? s->pcap : 256;
            while (nc < need)
                nc *= 2;
            int64_t *p = realloc(s->pos, nc * sizeof *p);
            if (!p)
                return -ENOMEM;
            s->pos = p;
            s->pcap = nc;
        }
        memcpy(s->pos + s->npos, e->pos, (size_t)e->npos * sizeof *e->pos);
        s->npos = need;
    }
    s->n++;
    return 0;
}

static void *worker(void *arg)
{
    pool *p = arg;
    const baseld *b = p->b;
    rb_mlog_bdec d;
    rb_mlog_bdec_init(&d);
    rb_mlog_base_info bi;
    rb_err open_why;
    int open_rc = rb_mlog_base_open(b->buf, (size_t)b->len, &d, &bi, NULL, &open_why);
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->stop && p->next < p->njobs && p->next >= p->limit)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->stop || p->next >= p->njobs) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        size_t i = p->next++;
        pthread_mutex_unlock(&p->mu);
        slot *s = &p->slots[i % p->w];
        s->n = 0;
        s->npos = 0;
        s->keys.len = 0;
        s->keys.oom = 0;
        rb_err_clear(&s->why);
        const rb_mlog_chunk *ch = &b->st[p->jobs[i]].ch;
        if (open_rc != 0) {
            s->rc = open_rc;
            s->why = open_why;
        } else {
            rb_mlog_base_cb acb = {.ent = slot_add, .ctx = s};
            s->rc = rb_mlog_bdec_chunk(&d, b->buf, (size_t)b->len, ch, &acb, &s->why);
            if (s->rc != 0 && d.cb_rc) {
                s->rc = -ENOMEM;
                rb_err_set(&s->why, RB_ERR_NOMEM, ENOMEM, "base chunk %u: out of memory for its entries", ch->index);
            }
        }
        pthread_mutex_lock(&p->mu);
        s->done = 1;
        pthread_cond_broadcast(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
    rb_mlog_bdec_free(&d);
    return NULL;
}

/* Hand a decoded chunk's entries to cb->ent, in order. */
static int slot_deliver(const slot *s, const rb_mlog_read_cb *cb)
{
    if (cb->ents && s->n) {
        rb_mlog_ent *v = malloc(s->n * sizeof *v);
        if (!v)
            return -ENOMEM;
        for (size_t i = 0; i < s->n; i++) {
            v[i] = s->v[i].e;
            v[i].key = s->keys.data ? s->keys.data + s->v[i].koff : "";
            v[i].pos = v[i].npos >= 0 && s->pos ? s->pos + s->v[i].poff : NULL;
        }
        int rc = cb->ents(cb->ctx, v, s->n);
        free(v);
        return rc;
    }
    if (!cb->ent)
        return 0;
    for (size_t i = 0; i < s->n; i++) {
        rb_mlog_ent e = s->v[i].e;
        e.key = s->keys.data ? s->keys.data + s->v[i].koff : "";
        e.pos = e.npos >= 0 && s->pos ? s->pos + s->v[i].poff : NULL;
        int rc = cb->ent(cb->ctx, &e);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* A base being delivered: the judge, the calling thread's decoder, and the pool (nth threads
 * started; 0: every chunk is decoded on the calling thread). */
typedef struct dlv {
    const rb_mlog_read_cb *cb;
    const baseld *b;
    rb_err *err;
    rb_mlog_bjudge j;
    rb_mlog_bdec d;
    pool p;
    pthread_t *th;
    size_t nth, job;
} dlv;

/* Start up to threads decoders (at most one a chunk; none for one chunk or fewer threads than
 * 2) on b's chunks in walk order, with a window of 2 chunks per thread: v->nth says how many
 * run (0: none could be had, decode here). 0, or -ENOMEM with v->err set. */
static int pool_start(dlv *v, size_t threads)
{
    const baseld *b = v->b;
    pool *p = &v->p;
    size_t nth = threads > 1 ? threads : 0;
    if (nth > b->nchunks)
        nth = b->nchunks;
    v->nth = 0;
    if (nth <= 1)
        return 0;
    p->b = b;
    p->w = 2 * nth;
    p->limit = p->w;
    p->jobs = malloc((b->nchunks ? b->nchunks : 1) * sizeof *p->jobs);
    p->slots = calloc(p->w, sizeof *p->slots);
    v->th = calloc(nth, sizeof *v->th);
    if (!p->jobs || !p->slots || !v->th) {
        free(p->jobs);
        free(p->slots);
        free(v->th);
        return nomem(v->err, "metadata base");
    }
    for (size_t k = 0; k < b->n; k++)
        if (b->st[k].kind == RB_MLOG_STEP_CHUNK && !b->st[k].out_of_order)
            p->jobs[p->njobs++] = k;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    size_t started = 0;
    while (started < nth && pthread_create(&v->th[started], NULL, worker, p) == 0)
        started++;
    if (started == 0) { /* no thread to be had: decode here */
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->work);
        pthread_cond_destroy(&p->done);
        free(p->jobs);
        free(p->slots);
        free(v->th);
        v->th = NULL;
    }
    v->nth = started;
    return 0;
}

/* Stop the pool's threads, join them and free what the pool holds. */
static void pool_stop(dlv *v)
{
    pool *p = &v->p;
    if (!v->nth)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < v->nth; i++)
        pthread_join(v->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    for (size_t i = 0; i < p->w; i++) {
        free(p->slots[i].v);
        rb_buf_free(&p->slots[i].keys);
        free(p->slots[i].pos);
    }
    free(p->slots);
    free(p->jobs);
    free(v->th);
}

/* The slot of the pool's job-th chunk, once its worker is done with it. */
static slot *pool_wait(pool *p, size_t job)
{
    slot *s = &p->slots[job % p->w];
    pthread_mutex_lock(&p->mu);
    while (!s->done)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* Give slot s back: the window moves on by one chunk. */
static void pool_release(pool *p, slot *s)
{
    pthread_mutex_lock(&p->mu);
    s->done = 0;
    p->limit++;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
}

/* How a chunk step ends: delivered, damaged (reported, then the walk goes on), or the
 * delivery stops (with the value to return). */
enum { CH_OK, CH_BAD, CH_STOP };

/* Decode the admitted chunk c on the calling thread, its entries to the callback: CH_OK,
 * CH_BAD (dm->why says why), or CH_STOP with *rc (a callback's value, or an error in v->err). */
static int chunk_here(dlv *v, const cstep *c, rb_mlog_damage *dm, int *rc)
{
    const rb_mlog_base_cb ecb = {.ent = v->cb->ent, .ctx = v->cb->ctx};
    *rc = rb_mlog_bdec_chunk(&v->d, v->b->buf, (size_t)v->b->len, &c->ch, &ecb, &dm->why);
    if (*rc == 0)
        return CH_OK;
    if (v->d.cb_rc)
        return CH_STOP; /* a callback stopped: its value is returned */
    if (*rc != -EBADMSG) {
        *v->err = dm->why;
        return CH_STOP;
    }
    *rc = 0;
    return CH_BAD;
}

/* Take the pool's next chunk and (admitted) hand its decoded entries to the callbacks: as
 * chunk_here. */
static int chunk_pooled(dlv *v, int admit, rb_mlog_damage *dm, int *rc)
{
    slot *s = pool_wait(&v->p, v->job++);
    int ok = 0;
    if (admit) {
        if (s->rc == 0) {
            *rc = slot_deliver(s, v->cb);
            ok = *rc == 0;
        } else if (s->rc == -EBADMSG) {
            dm->why = s->why;
        } else {
            *rc = s->rc;
            *v->err = s->why;
        }
    }
    pool_release(&v->p, s);
    if (*rc != 0)
        return CH_STOP;
    return ok ? CH_OK : CH_BAD;
}

/* A CHUNK step: judged, then decoded here or taken from the pool (a chunk out of order is
 * never decoded). As chunk_here; *dm describes the chunk. */
static int chunk_step(dlv *v, const cstep *c, rb_mlog_damage *dm, int *rc)
{
    rb_mlog_bstep st = {.kind = c->kind, .out_of_order = c->out_of_order, .expect = c->expect, .ch = c->ch};
    int admit = rb_mlog_bjudge_admit(&v->j, &st, dm);
    *rc = 0;
    if (v->nth == 0)
        return admit ? chunk_here(v, c, dm, rc) : CH_BAD;
    return c->out_of_order ? CH_BAD : chunk_pooled(v, admit, dm, rc);
}

/* Every step of the base in walk order up to its end record: chunks judged and delivered,
 * gaps and damaged chunks reported. 0, or the value that stopped the delivery. */
static int deliver_steps(dlv *v)
{
    const baseld *b = v->b;
    int rc = 0;
    for (size_t k = 0; k < b->n; k++) {
        const cstep *c = &b->st[k];
        rb_mlog_damage dm;
        if (c->kind == RB_MLOG_STEP_END) {
            rb_mlog_bstep st = {.kind = c->kind, .expect = c->expect, .end = c->end};
            rb_mlog_bjudge_end(&v->j, &st);
            break;
        }
        int how = CH_BAD;
        if (c->kind == RB_MLOG_STEP_GAP)
            dm = b->gaps[c->gap];
        else
            how = chunk_step(v, c, &dm, &rc);
        if (how == CH_STOP)
            break;
        if (how == CH_OK) {
            rb_mlog_bjudge_ok(&v->j, &c->ch);
            continue;
        }
        rb_mlog_bjudge_bad(&v->j);
        if (v->cb->damage && (rc = v->cb->damage(v->cb->ctx, &dm)) != 0)
            break;
    }
    return rc;
}

/* Deliver the base of b: its class table, then every step in walk order, chunks decoded on
 * the calling thread (threads <= 1) or by a pool with a window of 2 chunks per thread. */
static int base_deliver(const rb_mlog_read_opts *o, const rb_mlog_read_cb *cb, const baseld *b,
                        rb_mlog_base_result *res, rb_err *err)
{
    dlv v = {.cb = cb, .b = b, .err = err};
    rb_mlog_bjudge_init(&v.j, res, &b->bi);
    rb_mlog_bdec_init(&v.d);
    rb_mlog_base_info bi;
    rb_mlog_base_cb ccb = {.cls = cb->cls, .ctx = cb->ctx};
    int rc = rb_mlog_base_open(b->buf, (size_t)b->len, &v.d, &bi, &ccb, err);
    if (rc == 0 && (rc = pool_start(&v, o->threads)) == 0) {
        rc = deliver_steps(&v);
        pool_stop(&v);
    }
    rb_mlog_bdec_free(&v.d);
    return rc;
}

/* ---- the log walk ------------------------------------------------------------------------ */

/* The ring bytes read last: [off, off + len) in ring offsets. */
typedef struct win {
    uint8_t *buf;
    uint64_t cap, off, len;
} win;

/* in[0, need) = ring bytes at p (p + need <= ring.len): from the window, or the window read
 * again from p (wsize bytes, or need when more, never past the ring's end; need bytes alone
 * when that read fails). 0; 1: the read failed (why); -ENOMEM. */
static int win_get(rdr *r, const rb_mlog_sb *sb, win *w, uint64_t wsize, uint64_t p, uint64_t need, const uint8_t **in,
                   rb_err *why)
{
    if (w->len && p >= w->off && p + need <= w->off + w->len) {
        *in = w->buf + (p - w->off);
        return 0;
    }
    uint64_t n = sb->ring.len - p;
    if (n > wsize)
        n = wsize;
    if (n < need)
        n = need;
    w->len = 0;
    if (n > w->cap) {
        free(w->buf);
        w->cap = 0;
        if (!(w->buf = abuf(r->ba, n)))
            return nomem(why, "metadata log");
        w->cap = n;
    }
    /* A window that fails may fail for bytes past the log's end: then only the bytes needed
     * decide (so the walk's outcome does not depend on the window's size). */
    if (dev_read(r, sb->ring.off + p, w->buf, n, why) < 0 &&
        (n == need || dev_read(r, sb->ring.off + p, w->buf, (n = need), why) < 0))
        return 1;
    w->off = p;
    w->len = n;
    *in = w->buf;
    return 0;
}

typedef struct grec {
    const rb_mlog_read_cb *cb;
    uint64_t seq;
} grec;

static int on_grec(void *ctx, const rb_mlog_rec *rec)
{
    grec *g = ctx;
    int rc;
    if (rec->type == RB_MLOG_CLASS && g->cb->cls && (rc = g->cb->cls(g->cb->ctx, &rec->cls)) != 0)
        return rc;
    return g->cb->rec ? g->cb->rec(g->cb->ctx, g->seq, rec) : 0;
}

/* A group header the ring scan found (one of the walk's generation): where, its sequence,
 * epoch and length; bad once its body failed. */
typedef struct ghdr {
    uint64_t at, seq, len;
    uint32_t epoch;
    int bad;
} ghdr;

/* The walk of the log ring: where it is (ring offset p, bytes used, the next sequence), the
 * window of ring bytes read last, the group decoder; the headers the ring scan found (once
 * the walk first fails to find its next group), and whether it skipped damage (then the used
 * bytes no longer bound it: sequences do). */
typedef struct walk {
    rdr *r;
    const rb_mlog_sb *sb;
    rb_mlog_read_result *res;
    const rb_mlog_read_cb *cb;
    uint64_t ba, rl, gen, hneed, wsize;
    uint64_t p, used, seq;
    win w;
    rb_mlog_gdec gd;
    grec g;
    ghdr *hs;
    size_t nh, hcap;
    int scanned, jumped;
} walk;

/* The header of group k->seq at ring offset at: 1 (*gi), or 0 with why saying why not; *wr a
 * window read's failure (1: the read failed, why; <0: out of memory, why). A group of an
 * epoch below the last group's was left by a writer that crashed before the one whose group
 * came last: not this one. */
static int group_at(walk *k, uint64_t at, rb_mlog_group_info *gi, rb_err *why, int *wr)
{
    const uint8_t *in = NULL;
    *wr = 0;
    if (k->hneed > k->rl - at) {
        rb_err_set(why, RB_ERR_VALUE, EBADMSG, "metadata log: no room for a group header at ring offset %llu",
                   (unsigned long long)at);
        return 0;
    }
    if ((*wr = win_get(k->r, k->sb, &k->w, k->wsize, at, k->hneed, &in, why)) != 0)
        return 0;
    if (rb_mlog_group_head(in, (size_t)k->hneed, k->ba, k->gen, k->seq, gi, why) != 0)
        return 0;
    if (k->res->groups && gi->epoch < k->res->last_epoch) {
        rb_err_set(why, RB_ERR_VALUE, ESTALE,
                   "metadata log: group %llu at ring offset %llu is of writer epoch %u, below %u before it",
                   (unsigned long long)k->seq, (unsigned long long)at, gi->epoch, k->res->last_epoch);
        return 0;
    }
    return 1;
}

/* Find group k->seq: at k->p, else (a group that did not fit before the ring's end) at ring
 * offset 0, the bytes from k->p to the end wasted. 1 (*at, *waste, *gi); 0 when the walk ends
 * there (res says why; on running out of memory *rc and err). */
static int group_find(walk *k, uint64_t *at_out, uint64_t *waste_out, rb_mlog_group_info *gi, int *rc, rb_err *err)
{
    rb_mlog_read_result *res = k->res;
    uint64_t at = k->p, waste = 0;
    rb_err why, first;
    rb_err_clear(&first);
    int found, wr;
    for (;;) {
        found = group_at(k, at, gi, &why, &wr);
        if (found || wr)
            break;
        if (at == k->p)
            first = why;
        if (at == 0)
            break;
        waste = k->rl - at;
        at = 0;
    }
    if (wr < 0) {
        *err = why;
        *rc = wr;
        return 0;
    }
    if (wr > 0) {
        res->log_end = RB_MLOG_END_IOERR;
        res->log_why = why;
        return 0;
    }
    if (!found) {
        res->log_end = RB_MLOG_END_NONE;
        res->log_why = first;
        return 0;
    }
    *at_out = at;
    *waste_out = waste;
    return 1;
}

/* The log ends torn at ring offset at (why says how); waste bytes were skipped to reach it. */
static void walk_torn(walk *k, uint64_t at, uint64_t waste)
{
    k->res->log_end = RB_MLOG_END_TORN;
    k->res->torn_at = k->res->head = at;
    k->res->used = k->used + waste < k->rl ? k->used + waste : k->rl; /* as group_done */
}

/* Group k->seq of t bytes at ring offset at fits: within the ring, and short of where the log
 * starts. 1, or 0 when the walk ends there (res says why). */
static int group_fits(walk *k, uint64_t at, uint64_t waste, uint64_t t)
{
    rb_mlog_read_result *res = k->res;
    if (t > k->rl - at) {
        walk_torn(k, at, waste);
        rb_err_set(&res->log_why, RB_ERR_VALUE, EBADMSG,
                   "metadata log: group %llu at ring offset %llu: its %llu bytes run past the ring's end",
                   (unsigned long long)k->seq, (unsigned long long)at, (unsigned long long)t);
        return 0;
    }
    if (!k->jumped && k->used + waste + t > k->rl) {
        res->log_end = RB_MLOG_END_FULL;
        rb_err_set(&res->log_why, RB_ERR_VALUE, ENOSPC,
                   "metadata log: group %llu at ring offset %llu would pass where the log starts",
                   (unsigned long long)k->seq, (unsigned long long)at);
        return 0;
    }
    return 1;
}

/* Read group k->seq of t bytes at ring offset at and hand its records to the callbacks: 1;
 * 0 when the walk ends there (res says why: unreadable or torn), or stops with *rc (a
 * callback's value, or out of memory in err). */
static int group_read(walk *k, uint64_t at, uint64_t waste, uint64_t t, rb_mlog_group_info *gi, int *rc, rb_err *err)
{
    const uint8_t *in = NULL;
    rb_err why;
    int wr = win_get(k->r, k->sb, &k->w, k->wsize, at, t, &in, &why);
    if (wr < 0) {
        *err = why;
        *rc = wr;
        return 0;
    }
    if (wr > 0) {
        k->res->log_end = RB_MLOG_END_IOERR;
        k->res->log_why = why;
        return 0;
    }
    k->g.seq = k->seq;
    int dr = rb_mlog_gdec_group(&k->gd, in, (size_t)t, k->ba, k->gen, k->seq, gi, on_grec, &k->g, &why);
    if (dr == 0)
        return 1;
    if (k->gd.cb_rc) { /* a callback stopped */
        *rc = dr;
        return 0;
    }
    if (dr == -ENOMEM) {
        *err = why;
        *rc = dr;
        return 0;
    }
    walk_torn(k, at, waste);
    k->res->log_why = why;
    return 0;
}

/* Group k->seq of t bytes at ring offset at is in: count it and move past it. */
static void group_done(walk *k, uint64_t at, uint64_t waste, uint64_t t, const rb_mlog_group_info *gi)
{
    rb_mlog_read_result *res = k->res;
    res->groups++;
    res->records += gi->n_records;
    res->last_seq = k->seq;
    res->last_epoch = gi->epoch;
    res->last_records = gi->n_records;
    k->used += waste + t;
    k->p = at + t == k->rl ? 0 : at + t;
    k->seq++;
    res->head = k->p;
    res->used = k->used < k->rl ? k->used : k->rl;
}

/* ---- damage in the middle of the log ------------------------------------------------------- */

/* The group headers of the walk's generation in buf, ring bytes [at, at + n), into k->hs.
 * 0, or -ENOMEM (err). */
static int scan_headers(walk *k, uint64_t at, const uint8_t *buf, uint64_t n, rb_err *err)
{
    for (uint64_t o = 0; o + k->hneed <= n; o += k->ba) {
        rb_mlog_group_info gi;
        rb_err why;
        if (memcmp(buf + o, RB_MLOG_GROUP_MAGIC, 8) != 0 ||
            rb_mlog_group_head(buf + o, (size_t)k->hneed, k->ba, k->gen, 0, &gi, &why) != 0 ||
            gi.total_len > k->rl - (at + o))
            continue;
        if (grow((void **)&k->hs, &k->hcap, k->nh, sizeof *k->hs) < 0)
            return nomem(err, "metadata log scan");
        k->hs[k->nh++] = (ghdr){.at = at + o, .seq = gi.seq, .len = gi.total_len, .epoch = gi.epoch};
    }
    return 0;
}

/* Every block of the ring whose bytes read as a group header of the walk's generation, into
 * k->hs: the ring read in windows; a window that cannot be read, a header's bytes at a time
 * (a block that cannot be read is passed over). 0, or -ENOMEM (err). */
static int ring_scan(walk *k, rb_err *err)
{
    k->scanned = 1;
    uint8_t *one = abuf(k->ba, k->hneed);
    if (!one)
        return nomem(err, "metadata log scan");
    int rc = 0;
    for (uint64_t w0 = 0; w0 < k->rl && rc == 0; w0 += k->wsize) {
        const uint64_t n = k->rl - w0 < k->wsize ? k->rl - w0 : k->wsize;
        const uint8_t *in = NULL;
        rb_err why;
        int wr = win_get(k->r, k->sb, &k->w, k->wsize, w0, n, &in, &why);
        if (wr < 0) {
            *err = why;
            rc = wr;
        } else if (wr == 0) {
            rc = scan_headers(k, w0, in, n, err);
        } else {
            for (uint64_t q = w0; q + k->hneed <= w0 + n && rc == 0; q += k->ba)
                if (dev_read(k->r, k->sb->ring.off + q, one, k->hneed, &why) == 0)
                    rc = scan_headers(k, q, one, k->hneed, err);
        }
    }
    free(one);
    return rc;
}

/* The header to go on with after group k->seq was not found at k->p: of those with a higher
 * sequence and an epoch of at least minep, the lowest sequence, then the highest epoch (a dead
 * writer's group of the same sequence has a lower one), then the nearest after k->p. -1: none. */
static long gap_pick(const walk *k, uint32_t minep)
{
    long best = -1;
    for (size_t i = 0; i < k->nh; i++) {
        const ghdr *h = &k->hs[i], *b = best >= 0 ? &k->hs[best] : NULL;
        if (h->bad || h->seq <= k->seq || h->epoch < minep)
            continue;
        uint64_t dh = (h->at + k->rl - k->p) % k->rl;
        if (!b || h->seq < b->seq || (h->seq == b->seq && h->epoch > b->epoch) ||
            (h->seq == b->seq && h->epoch == b->epoch && dh < (b->at + k->rl - k->p) % k->rl))
            best = (long)i;
    }
    return best;
}

/* 1 when the group of header h reads whole and passes every check (its records not handed
 * out); 0 when not; <0 out of memory (err). */
static int gap_group_ok(walk *k, const ghdr *h, rb_err *err)
{
    const uint8_t *in = NULL;
    rb_err why;
    int wr = win_get(k->r, k->sb, &k->w, k->wsize, h->at, h->len, &in, &why);
    if (wr < 0) {
        *err = why;
        return wr;
    }
    rb_mlog_group_info gi;
    if (wr > 0)
        return 0;
    int dr = rb_mlog_gdec_group(&k->gd, in, (size_t)h->len, k->ba, k->gen, h->seq, &gi, NULL, NULL, &why);
    if (dr == -ENOMEM) {
        *err = why;
        return dr;
    }
    return dr == 0;
}

/* The walk skips to the group of header h: the stretch from k->p is reported (records: what
 * the failed group held when its header read, else -1). 0, or a callback's value. */
static int gap_take(walk *k, const ghdr *h, int64_t records)
{
    rb_mlog_read_result *res = k->res;
    rb_mlog_gap g = {.seq = k->seq, .next_seq = h->seq, .next_at = h->at, .why = res->log_why};
    g.at = res->log_end == RB_MLOG_END_TORN ? res->torn_at : k->p; /* a torn group may be at 0 */
    g.records = h->seq == k->seq + 1 ? records : -1;
    if (res->gaps++ == 0) {
        res->gap_at = g.at;
        res->gap_seq = g.seq;
        res->gap_why = g.why;
    }
    res->groups_lost += h->seq - k->seq;
    if (g.records < 0 || res->records_lost < 0)
        res->records_lost = -1;
    else
        res->records_lost += g.records;
    k->used += (h->at + k->rl - k->p) % k->rl;
    k->p = h->at;
    k->seq = h->seq;
    k->jumped = 1;
    res->log_end = RB_MLOG_END_NONE;
    res->torn_at = 0;
    rb_err_clear(&res->log_why);
    return k->cb->gap ? k->cb->gap(k->cb->ctx, &g) : 0;
}

/* The walk found no good group k->seq at k->p (res says why): when a later group of the same
 * writer follows (a valid header of this generation, a higher sequence, an epoch of at least
 * minep, a body that passes), the groups between are damage: reported, and the walk goes on
 * there (1). 0: none follows, the log ends here. <0 (*rc): out of memory or a callback's stop. */
static int walk_resume(walk *k, uint32_t minep, int64_t records, int *rc, rb_err *err)
{
    if (!k->scanned && (*rc = ring_scan(k, err)) != 0)
        return 0;
    for (;;) {
        long i = gap_pick(k, minep);
        if (i < 0)
            return 0;
        int ok = gap_group_ok(k, &k->hs[i], err);
        if (ok < 0) {
            *rc = ok;
            return 0;
        }
        if (ok) {
            *rc = gap_take(k, &k->hs[i], records);
            return *rc == 0;
        }
        k->hs[i].bad = 1;
    }
}

/* One step of the walk: group k->seq found, read and handed out (1), or the walk ends or goes
 * on past damage (0: res says how; *rc a stop). */
static int walk_step(walk *k, int *rc, rb_err *err)
{
    uint64_t at = 0, waste = 0;
    rb_mlog_group_info gi;
    int have = group_find(k, &at, &waste, &gi, rc, err);
    if (have && group_fits(k, at, waste, gi.total_len) && group_read(k, at, waste, gi.total_len, &gi, rc, err)) {
        group_done(k, at, waste, gi.total_len, &gi);
        return 1;
    }
    if (*rc || k->res->log_end == RB_MLOG_END_FULL)
        return 0;
    /* not found, torn or unreadable: damage when a later group of this writer follows */
    uint32_t minep = k->res->groups ? k->res->last_epoch : 0;
    if (have && gi.epoch > minep)
        minep = gi.epoch;
    return walk_resume(k, minep, have ? (int64_t)gi.n_records : -1, rc, err);
}

static int log_walk(rdr *r, const rb_mlog_read_opts *o, const rb_mlog_read_cb *cb, const rb_mlog_sb *sb, rb_err *err)
{
    walk k = {
        .r = r, .sb = sb, .res = r->res, .cb = cb, .ba = sb->block_align, .rl = sb->ring.len, .gen = sb->generation};
    k.hneed = round_up(RB_MLOG_GROUP_HDR_LEN, k.ba);
    k.wsize = o->log_window ? o->log_window / k.ba * k.ba : RB_MLOG_READ_WINDOW;
    if (k.wsize < k.hneed)
        k.wsize = k.hneed;
    k.p = sb->ring.start;
    k.seq = sb->ring.start_seq;
    k.g.cb = cb;
    k.res->last_seq = sb->base.log_seq;
    k.res->head = k.p;
    k.res->log_end = RB_MLOG_END_NONE;
    rb_mlog_gdec_init(&k.gd);
    int rc = 0;
    for (;;) {
        if (!k.jumped && k.used >= k.rl) {
            k.res->log_end = RB_MLOG_END_FULL;
            rb_err_set(&k.res->log_why, RB_ERR_VALUE, ENOSPC,
                       "metadata log: the walk covered the whole ring (%llu bytes)", (unsigned long long)k.rl);
            break;
        }
        /* Sequences only grow (from the base's + 1, never 0); past damage the walk may jump to
         * a header's much higher one. Past 2^64 - 1 a sequence would come round to 0, which
         * expects any group, and such a ring could be walked without end: the log stops there. */
        if (k.seq == 0) {
            k.res->log_end = RB_MLOG_END_FULL;
            rb_err_set(&k.res->log_why, RB_ERR_VALUE, ERANGE,
                       "metadata log: past damage, the sequences reach 2^64 - 1; the log ends there");
            break;
        }
        if (!walk_step(&k, &rc, err))
            break;
    }
    free(k.w.buf);
    free(k.hs);
    rb_mlog_gdec_free(&k.gd);
    return rc;
}

/* ---- the whole read ---------------------------------------------------------------------- */

/* o's geometry can hold the region: block_align a power of two up to 2^30, meta_total_bytes
 * a multiple of it with room for two superblocks; *c the second one's offset. */
static int read_check_opts(const rb_mlog_read_opts *o, uint64_t *c, rb_err *err)
{
    const uint64_t ba = o->block_align, mt = o->meta_total_bytes;
    if (!is_pow2(ba) || ba > (1ull << 30) || mt % ba)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "metadata read: block_align %llu, meta_total_bytes %llu: a power "
                          "of two up to 2^30 and a multiple of it needed",
                          (unsigned long long)ba, (unsigned long long)mt);
    const uint64_t span = rb_mlog_sb_span(ba);
    *c = mt / 2 / ba * ba;
    if (*c < span || *c + span > mt)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "metadata read: meta_total_bytes %llu holds no two superblocks",
                          (unsigned long long)mt);
    return 0;
}

/* Both superblocks (at 0 and c) into sbs, their states in the result. 0, or -ENOMEM. */
static int read_sbs(rdr *r, const rb_mlog_read_opts *o, uint64_t c, rb_mlog_sb sbs[2], rb_err *err)
{
    const uint64_t span = rb_mlog_sb_span(o->block_align);
    memset(sbs, 0, 2 * sizeof *sbs);
    uint8_t *sbuf = abuf(o->block_align, span);
    if (!sbuf)
        return nomem(err, "metadata read");
    sb_read(r, o, 0, 0, sbuf, span, &sbs[0]);
    sb_read(r, o, 1, c, sbuf, span, &sbs[1]);
    free(sbuf);
    return 0;
}

/* The superblock to read on with: of the valid ones, the higher sequence first, the first
 * whose base loads (into b) and matches it (with sb_only the first, its base not read); one
 * whose base does not is marked RB_MLOG_SB_NOBASE. *chosen its index, -1 when none. 0, or <0
 * when a read failed or memory ran out (err). */
static int read_choose(rdr *r, const rb_mlog_read_opts *o, const rb_mlog_sb sbs[2], baseld *b, int *chosen, rb_err *err)
{
    rb_mlog_read_result *res = r->res;
    int cand[2], nc = 0;
    for (int k = 0; k < 2; k++)
        if (res->sb_state[k] == RB_MLOG_SB_VALID)
            cand[nc++] = k;
    if (nc == 2 && sbs[1].sb_seq > sbs[0].sb_seq) {
        cand[0] = 1;
        cand[1] = 0;
    }
    *chosen = -1;
    for (int i = 0; i < nc; i++) {
        int k = cand[i];
        if (o->sb_only) {
            *chosen = k;
            return 0;
        }
        rb_err why;
        rb_err_clear(&why);
        int lr = base_load(r, &sbs[k], b, &why, err);
        if (lr < 0)
            return lr;
        if (lr == 0) {
            *chosen = k;
            return 0;
        }
        res->sb_state[k] = RB_MLOG_SB_NOBASE;
        res->sb_why[k] = why;
        baseld_free(b);
    }
    return 0;
}

/* The chosen superblock in the result, to the callback, then (unless sb_only) its base and
 * the log walk. 0, or the value that stopped the read. */
static int read_deliver(rdr *r, const rb_mlog_read_opts *o, const rb_mlog_read_cb *cb, const rb_mlog_sb *sb, baseld *b,
                        rb_err *err)
{
    rb_mlog_read_result *res = r->res;
    res->found = 1;
    res->sb = *sb;
    int os = res->sb_state[1 - res->which];
    res->fallback = os == RB_MLOG_SB_DAMAGED || os == RB_MLOG_SB_IOERR || os == RB_MLOG_SB_NOBASE;
    res->last_seq = res->sb.base.log_seq;
    res->head = res->sb.ring.start;
    int rc;
    if (cb->sb && (rc = cb->sb(cb->ctx, &res->sb)) != 0)
        return rc;
    if (o->sb_only)
        return 0;
    rc = base_deliver(o, cb, b, &res->base, err);
    baseld_free(b);
    if (rc != 0)
        return rc;
    return log_walk(r, o, cb, &res->sb, err);
}

int rb_mlog_read(const rb_mlog_read_opts *o, rb_mlog_pread_fn rd, void *rctx, const rb_mlog_read_cb *cb,
                 rb_mlog_read_result *res, rb_err *err)
{
    static const rb_mlog_read_cb none;
    rb_err scratch;
    if (!err)
        err = &scratch;
    if (!cb)
        cb = &none;
    memset(res, 0, sizeof *res);
    res->base.entries_lost = -1;
    uint64_t c = 0;
    int rc = read_check_opts(o, &c, err);
    if (rc < 0)
        return rc;
    rdr r = {.fn = rd, .ctx = rctx, .res = res, .ba = o->block_align};
    rb_mlog_sb sbs[2];
    if ((rc = read_sbs(&r, o, c, sbs, err)) < 0)
        return rc;
    baseld b;
    memset(&b, 0, sizeof b);
    int chosen = -1;
    rc = read_choose(&r, o, sbs, &b, &chosen, err);
    if (rc == 0 && chosen >= 0) {
        res->which = chosen;
        rc = read_deliver(&r, o, cb, &sbs[chosen], &b, err);
    }
    baseld_free(&b);
    return rc;
}

int rb_mlog_read_lost(const rb_mlog_read_result *res)
{
    return res->gaps || res->base.chunks_bad || res->log_end == RB_MLOG_END_IOERR;
}
