/*
 * rb_core_validate.c - slot-header validation of the indexed entries (meta_verify_on_load,
 * verify_payload_checksum, revalidate, the log format's background validation): the headers
 * are read from the page cache on one thread, with O_DIRECT by reader threads, or through
 * io_uring two groups in flight while the calling thread hashes the keys' expected identities;
 * an entry whose header does not name its key, size and checksum leaves the index.
 */
#include "rb_core_int.h"
#include "rb_core_ident.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct vitem {
    char *key;
    size_t key_len;
    uint32_t slot;
    uint64_t size;
    uint64_t checksum; /* the record's checksum and flags at the snapshot */
    uint16_t flags;
    /* results */
    int hdr_ok;
    rb_slot_hdr hdr; /* the header read, when hdr_ok */
    /* the identity and key hash the key's header must carry, computed off the core mutex
     * (want_state: 0 not yet, 1 computed, -1 the key has no identity, i.e. the entry is bad) */
    int want_state;
    uint64_t want, key_hash;
} vitem;

typedef struct vjob {
    rb_core *c;
    vitem *items;
    size_t lo, hi;
} vjob;

static void read_header_into(rb_core *c, vitem *v, uint8_t *buf)
{
    rb_err e;
    size_t n = rb_header_read_len(c);
    v->hdr_ok = 0;
    if (rb_core_dev_read(c, rb_slot_offset(c, v->slot), buf, n, n, n, 0, &e) < 0)
        return;
    if (rb_slot_header_decode(buf, n, &v->hdr) == 0)
        v->hdr_ok = 1;
}

enum { ID_GROUP = 64 }; /* object keys hashed per rb_blake2b64_many call */

/* who[j]->want = the object-key identity of msg[j] (len[j] bytes), for j < k <= ID_GROUP. */
static void set_identities(vitem **who, const uint8_t *const *msg, const size_t *len, size_t k)
{
    uint64_t dig[ID_GROUP];
    rb_blake2b64_many(msg, len, k, dig);
    for (size_t j = 0; j < k; j++) {
        who[j]->want = dig[j];
        who[j]->want_state = 1;
    }
}

/* The key identity and key hash items[lo..hi) expect (BLAKE2b of the key: about as costly as
 * reading a cached header, so the readers compute it beside their I/O rather than the judge
 * after it; the key hash, xxh3 of ~100 bytes, ~12 ns). */
static void want_identities(const rb_core *c, vitem *items, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++)
        if (items[i].want_state == 0)
            items[i].key_hash = rb_key_hash(items[i].key, items[i].key_len);
    if (c->cfg.key_namespace != RB_NS_OBJECT) {
        for (size_t i = lo; i < hi; i++) {
            vitem *v = &items[i];
            if (v->want_state == 0)
                v->want_state = rb_key_identity(c->cfg.key_namespace, v->key, v->key_len, &v->want) == 0 ? 1 : -1;
        }
        return;
    }
    /* object keys: BLAKE2b of groups of keys, several per pass (rb_blake2b64_many) */
    const uint8_t *msg[ID_GROUP];
    size_t len[ID_GROUP];
    vitem *who[ID_GROUP];
    size_t k = 0;
    for (size_t i = lo; i < hi; i++) {
        vitem *v = &items[i];
        if (v->want_state != 0)
            continue;
        msg[k] = (const uint8_t *)v->key;
        len[k] = v->key_len;
        who[k++] = v;
        if (k == ID_GROUP) {
            set_identities(who, msg, len, k);
            k = 0;
        }
    }
    if (k)
        set_identities(who, msg, len, k);
}

static void *vjob_run(void *arg)
{
    vjob *j = arg;
    rb_err e;
    uint8_t *buf = rb_alloc_aligned(j->c->cfg.block_align, j->c->cfg.header_bytes, &e);
    if (buf) {
        for (size_t i = j->lo; i < j->hi; i++)
            read_header_into(j->c, &j->items[i], buf);
        free(buf);
    } /* else hdr_ok stays 0: those entries are dropped */
    want_identities(j->c, j->items, j->lo, j->hi);
    return NULL;
}

/* Read the headers of items[0..n) with up to recovery_threads parallel readers, each given at
 * least 16 headers, when the reads wait for the device. From the page cache a header costs
 * about a microsecond and the readers only contend: two or eight threads were no faster than
 * the calling thread alone at 500 to 30,000 headers (and up to 4x slower at 500), so cached
 * headers are read on the calling thread. */
static void read_headers_parallel(rb_core *c, vitem *items, size_t n)
{
    size_t workers = rb_block_transfers(c) ? c->cfg.recovery_read_threads : 1;
    if (workers > (n + 15) / 16)
        workers = (n + 15) / 16;
    if (workers <= 1) {
        vjob j = {c, items, 0, n};
        vjob_run(&j);
        return;
    }
    size_t per = (n + workers - 1) / workers;
    vjob jobs[64];
    pthread_t th[64];
    int started[64] = {0};
    if (workers > 64)
        workers = 64;
    per = (n + workers - 1) / workers;
    for (size_t w = 0; w < workers; w++) {
        size_t lo = w * per, hi = lo + per > n ? n : lo + per;
        jobs[w] = (vjob){c, items, lo, hi};
        if (lo >= hi)
            continue;
        if (pthread_create(&th[w], NULL, vjob_run, &jobs[w]) == 0)
            started[w] = 1;
        else
            vjob_run(&jobs[w]);
    }
    for (size_t w = 0; w < workers; w++)
        if (started[w])
            pthread_join(th[w], NULL);
}

static void decode_header_into(rb_core *c, vitem *v, const uint8_t *buf)
{
    v->hdr_ok = rb_slot_header_decode(buf, rb_header_read_len(c), &v->hdr) == 0;
}

/* The io_uring header reader's state: two groups of reads, one buffer half and one ops half
 * each (group g uses half g & 1). */
typedef struct hdr_ring {
    rb_core *c;
    vitem *items;
    size_t n;
    size_t hb;    /* stride and read length of one header */
    size_t qd;    /* reads per batch */
    size_t group; /* headers per group */
    uint8_t *buf; /* 2 * group headers */
    uint8_t *one; /* one header, for a read done again alone */
    rb_uop *ops;  /* 2 * group */
    rb_uops_run run[2];
} hdr_ring;

/* Headers per group: at least 256 (several batches when the queue depth is small), at most
 * 2 MiB of buffer, at most n. */
static size_t ring_group_size(size_t qd, size_t hb, size_t n)
{
    size_t group = qd < 256 ? (256 + qd - 1) / qd * qd : qd;
    size_t cap = ((size_t)2 << 20) / hb;
    if (group > cap)
        group = cap ? cap : 1;
    return group > n ? n : group;
}

/* Submit the reads of group g. */
static void ring_submit(hdr_ring *r, size_t g)
{
    size_t lo = g * r->group, cnt = r->n - lo < r->group ? r->n - lo : r->group;
    rb_uop *o = r->ops + (g & 1) * r->group;
    uint8_t *b = r->buf + (g & 1) * r->group * r->hb;
    for (size_t j = 0; j < cnt; j++) {
        o[j].off = rb_slot_offset(r->c, r->items[lo + j].slot);
        o[j].buf = b + j * r->hb;
        o[j].buf_len = o[j].payload_len = o[j].total_len = o[j].copy_len = r->hb;
        o[j].write = 0;
    }
    rb_err e;
    (void)rb_core_uring_ops_begin(r->c, &r->run[g & 1], o, cnt, r->qd, 0, &e);
}

/* Finish group g: its keys' identities hashed while the engine reads, then its headers
 * decoded (a failed read is done again alone, synchronously). */
static void ring_finish(hdr_ring *r, size_t g)
{
    size_t lo = g * r->group, cnt = r->n - lo < r->group ? r->n - lo : r->group;
    rb_uop *o = r->ops + (g & 1) * r->group;
    uint8_t *b = r->buf + (g & 1) * r->group * r->hb;
    want_identities(r->c, r->items, lo, lo + cnt);
    rb_core_uring_ops_finish(&r->run[g & 1]);
    for (size_t j = 0; j < cnt; j++) {
        if (o[j].rc == 0)
            decode_header_into(r->c, &r->items[lo + j], b + j * r->hb);
        else
            read_header_into(r->c, &r->items[lo + j], r->one);
    }
}

/*
 * io_uring: the headers are read in groups of batches of iouring_queue_depth reads, two groups
 * in flight: while the engine reads group g+1, the calling thread computes the identities group
 * g's keys expect and decodes group g's headers, so the hashing and the reads run on both cores
 * and the engine never waits for the judge. A header whose read failed is read again alone with
 * a synchronous pread; a failed submission means every header of it is. The verdicts are
 * therefore the ones the posix readers reach.
 */
static void read_headers_uring(rb_core *c, vitem *items, size_t n)
{
    hdr_ring r = {.c = c, .items = items, .n = n, .hb = rb_header_read_len(c)};
    r.qd = c->cfg.iouring_queue_depth ? c->cfg.iouring_queue_depth : 1;
    r.group = ring_group_size(r.qd, r.hb, n);
    rb_err e;
    r.buf = rb_alloc_aligned(c->cfg.block_align, 2 * r.group * r.hb, &e);
    r.one = rb_alloc_aligned(c->cfg.block_align, r.hb, &e);
    r.ops = calloc(2 * r.group, sizeof(*r.ops));
    const int ready = r.buf && r.one && r.ops;
    if (ready) {
        /* Touch the buffer once: a buffered read into a page not yet faulted in cannot complete
         * inline and is handed to an io-wq kernel thread (several times slower per header). */
        memset(r.buf, 0, 2 * r.group * r.hb);
        size_t ngroups = (n + r.group - 1) / r.group;
        for (size_t g = 0; g <= ngroups; g++) {
            if (g < ngroups)
                ring_submit(&r, g); /* into half g & 1 */
            if (g > 0)
                ring_finish(&r, g - 1); /* the other half */
        }
    }
    free(r.buf);
    free(r.one);
    free(r.ops);
    if (!ready)
        read_headers_parallel(c, items, n);
}

/* Copy the live entries at index positions [lo, hi) (clipped to the index) into *items, their
 * keys into one block *keys (the index may change while the headers are read). mu held. The
 * number copied, or -ENOMEM. */
static int64_t snapshot_items_locked(rb_core *c, uint32_t lo, uint32_t hi, vitem **items, char **keys)
{
    if (hi > c->index.n_ents)
        hi = c->index.n_ents;
    size_t n = 0, key_bytes = 0;
    for (uint32_t p = lo; p < hi; p++)
        if (!(c->index.ents[p].flags & RB_ENT_DEAD)) {
            key_bytes += (size_t)c->index.ents[p].key_len + 1;
            n++;
        }
    *items = calloc(n ? n : 1, sizeof(**items));
    *keys = malloc(key_bytes ? key_bytes : 1);
    if (!*items || !*keys) {
        free(*items);
        free(*keys);
        return -ENOMEM;
    }
    char *kp = *keys;
    size_t k = 0;
    for (uint32_t p = lo; p < hi; p++) {
        const rb_ent *e = &c->index.ents[p];
        if (e->flags & RB_ENT_DEAD)
            continue;
        vitem *v = &(*items)[k++];
        v->key = kp;
        memcpy(kp, rb_ent_key(e), e->key_len + 1);
        kp += e->key_len + 1;
        v->key_len = e->key_len;
        v->slot = e->slot;
        v->size = e->size;
        v->checksum = e->checksum;
        v->flags = e->flags;
    }
    return (int64_t)k;
}

/* Read the headers of items[0..k) and compute the identities they must carry, on the path
 * that suits the device. No lock held. */
static void read_items(rb_core *c, int sequential, vitem *items, size_t k)
{
    if (sequential) {
        vjob j = {c, items, 0, k};
        vjob_run(&j);
    } else if (rb_core_uses_uring(c) && k > 1 && rb_block_transfers(c)) {
        /* Batches pay off where a read waits for the device. A buffered read through the ring
         * completes inline, on the engine thread, so there the batch only adds the hand-off:
         * page-cache headers are read as the posix engine reads them. */
        read_headers_uring(c, items, k);
    } else {
        read_headers_parallel(c, items, k);
    }
    want_identities(c, items, 0, k); /* whatever a failed path left out */
}

/* 1 when v's header does not vouch for its entry: unread, the key has no identity, or
 * rb_slot_header_vouches (the rule loads apply) says no: another key's identity or key hash,
 * another size, or, for a record that carries a checksum (from the checkpoint), not the same
 * one in the header. */
static int item_bad(const vitem *v)
{
    const rb_slot_want w = {.identity = v->want,
                            .key_hash = v->key_hash,
                            .size = v->size,
                            .sum = v->checksum,
                            .has_sum = (v->flags & RB_ENT_HAS_SUM) != 0};
    return !v->hdr_ok || v->want_state != 1 || !rb_slot_header_vouches(&v->hdr, &w);
}

/* The index record v was copied from, or NULL when it changed meanwhile: gone, moved, or
 * deleted and put again (LIFO slot reuse gives it the same slot), or judged by a load: the
 * header read may be the old record's. mu held. */
static rb_ent *item_record_locked(rb_core *c, const vitem *v, uint32_t *pos)
{
    uint32_t p = rb_idx_find(&c->index, v->key, v->key_len, rb_idx_hash(v->key, v->key_len));
    if (p == UINT32_MAX || c->index.ents[p].slot != v->slot)
        return NULL;
    rb_ent *e = &c->index.ents[p];
    if (e->size != v->size || e->checksum != v->checksum ||
        ((e->flags ^ v->flags) & (RB_ENT_HAS_SUM | RB_ENT_UNVERIFIED)))
        return NULL;
    *pos = p;
    return e;
}

/* Apply the verdicts on items[0..k): a bad entry leaves the index, a good one is verified
 * (and takes the header's checksum). mu held. Returns how many were dropped. */
static uint64_t judge_items_locked(rb_core *c, const vitem *items, size_t k)
{
    uint64_t dropped = 0;
    for (size_t i = 0; i < k; i++) {
        const vitem *v = &items[i];
        uint32_t p;
        rb_ent *e = item_record_locked(c, v, &p);
        if (!e)
            continue;
        if (item_bad(v)) {
            rb_core_drop_locked(c, p);
            dropped++;
            continue;
        }
        if (e->flags & RB_ENT_UNVERIFIED) {
            e->flags &= (uint16_t)~RB_ENT_UNVERIFIED;
            c->n_unverified--;
        }
        if (v->hdr.has_sum) {
            e->checksum = v->hdr.sum;
            e->flags |= RB_ENT_HAS_SUM;
        }
    }
    return dropped;
}

/* Validate the live entries at index positions [lo, hi) (clipped to the index). */
static int validate_range(rb_core *c, int sequential, uint32_t lo, uint32_t hi)
{
    vitem *items;
    char *keys;
    uint64_t t0 = rb_obs_t0(&c->obs);
    pthread_mutex_lock(&c->mu);
    int64_t got = snapshot_items_locked(c, lo, hi, &items, &keys);
    if (got < 0) {
        pthread_mutex_unlock(&c->mu);
        return -ENOMEM;
    }
    const size_t k = (size_t)got;
    if (k)
        c->inflight_io++;
    uint64_t rd_gen = rb_core_reader_begin_locked(c);
    pthread_mutex_unlock(&c->mu);

    read_items(c, sequential, items, k);

    pthread_mutex_lock(&c->mu);
    uint64_t dropped = judge_items_locked(c, items, k);
    if (dropped) {
        c->dirty_total++;
        c->recovery_dropped += dropped;
    }
    if (k)
        c->inflight_io--;
    rb_core_reader_end_locked(c, rd_gen);
    c->last_io_ns = rb_now_ns();
    if (c->inflight_io == 0)
        pthread_cond_broadcast(&c->idle_cv);
    rb_idx_maybe_compact(&c->index);
    pthread_mutex_unlock(&c->mu);
    free(keys);
    free(items);
    if (k)
        rb_obs_done(&c->obs, RB_H_VALIDATE, t0);
    return 0;
}

int rb_core_validate_entries(rb_core *c, int sequential)
{
    return validate_range(c, sequential, 0, UINT32_MAX);
}

int rb_core_validate_sliced(rb_core *c, const int *stop)
{
    const uint32_t step = 1u << 16;
    for (uint32_t lo = 0;; lo += step) {
        pthread_mutex_lock(&c->mu);
        uint32_t n = c->index.n_ents;
        pthread_mutex_unlock(&c->mu);
        if (lo >= n || __atomic_load_n(stop, __ATOMIC_RELAXED))
            return 0;
        int rc = validate_range(c, 0, lo, lo + step);
        if (rc < 0)
            return rc;
    }
}

int rb_core_revalidate(rb_core *c, int sequential, uint64_t *dropped)
{
    pthread_mutex_lock(&c->mu);
    uint64_t before = c->recovery_dropped;
    pthread_mutex_unlock(&c->mu);
    int rc = rb_core_validate_entries(c, sequential);
    pthread_mutex_lock(&c->mu);
    *dropped = c->recovery_dropped - before;
    pthread_mutex_unlock(&c->mu);
    return rc;
}
