/*
 * rb_core_load.c - the load path: each key's record snapshotted under mu, its slot header and
 * payload read without the lock (posix one key at a time, or one io_uring batch), the header
 * judged, payload checksums checked, and the verdicts settled in the index under mu again.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "rb_core_ident.h"

/*
 * Every load reads the key's slot header with its payload and serves the payload only when
 * the header vouches for it:
 *   posix:    one preadv of the whole header (into a scratch block) and the payload (straight
 *             into the caller's buffer), the header being the bytes just before the payload;
 *   io_uring: a header read (rb_header_read_len bytes) queued next to the payload read in
 *             the same batch (passthrough too: both are NVMe commands of one submission).
 * The verdict is recovery's rule, rb_slot_header_vouches (magic, identity of the key in its
 * namespace, payload length, the hash of the whole key when the header carries one, and, when
 * the record has a checksum, the header's checksum record equal to it). Any other header is a miss (no error): the caller's buffer is zeroed, since what landed
 * there is not this key's, and the record is dropped. That closes the cases start-up
 * validation cannot see: another writer in the slot, a device that shrank and grew back
 * (zeros), a slot reused under a stale index. A failed read is a failed key and keeps the
 * record, unless the device shrank below the slot (a miss; rb_core_check_size drops it).
 *
 * A record recovered without slot-header validation (RB_ENT_UNVERIFIED,
 * meta_verify_on_load=False) is judged the same way, and its payload is also checked against
 * the header's checksum record when there is one; a good verdict clears the mark.
 */
enum { LV_NONE = 0, LV_GOOD, LV_BAD, LV_SUMBAD };

/* The caller's buffer a data read of a size-byte payload may reach: the whole padded transfer
 * when it goes straight into a buffer that holds it, else the payload. */
static inline size_t read_target_len(const rb_core *c, size_t buf_len, uint64_t size)
{
    size_t blen = c->cfg.enable_zero_copy ? buf_len : size;
    size_t xl = rb_xfer_len(c, size);
    return blen >= xl ? xl : size;
}

/* Erase what a rejected read left in the caller's buffer: it is not this key's. */
static inline void erase_read(const rb_core *c, rb_load_item *it, uint64_t size)
{
    memset(it->buf, 0, read_target_len(c, it->buf_len, size));
}

/* One key of a rb_core_load_many call: its record as the snapshot under c->mu saw it, and
 * what the load decided about it. */
struct load_snap {
    uint32_t slot;
    uint32_t pop, hop; /* io_uring: op index of the payload / header read */
    uint64_t size, sum;
    uint64_t want;     /* the identity the key's slot header must carry */
    uint64_t key_hash; /* the key hash it must carry when it has one (rb_key_hash) */
    uint8_t has_sum, unverified, verdict;
    uint8_t judged;  /* the header is read and judged (always, but for the benchmark hook) */
    uint8_t want_ok; /* want is set (a legacy key that does not parse has no identity) */
    uint8_t gone;    /* not indexed, and dropped lately (rb_obs_was_gone) */
};

/* The verdict on a slot header read for a record (see above): sn->want and sn->key_hash are
 * what the key's header must carry (want_ok 0: the key has no identity, so no header is its),
 * judged by rb_slot_header_vouches, the rule start-up validation applies. payload: also check
 * it against the header's checksum record (records not yet verified), else NULL. */
static int judge_slot(const struct load_snap *sn, const uint8_t *hdr, size_t hdr_len, const uint8_t *payload,
                      uint64_t *sum_fail)
{
    const rb_slot_want w = {
        .identity = sn->want, .key_hash = sn->key_hash, .size = sn->size, .sum = sn->sum, .has_sum = sn->has_sum};
    rb_slot_hdr h;
    if (!sn->want_ok || rb_slot_header_decode(hdr, hdr_len, &h) < 0 || !rb_slot_header_vouches(&h, &w))
        return LV_BAD;
    if (payload && h.has_sum && XXH3_64bits(payload, sn->size) != h.sum) {
        (*sum_fail)++;
        return LV_BAD;
    }
    return LV_GOOD;
}

/* One rb_core_load_many call between its two c->mu sections: the snapshot, the read plan and
 * what the settle stage publishes. Read and written without any lock (only this call sees it). */
struct load_run {
    rb_core *c;
    rb_load_item *items;
    struct load_snap *s;
    size_t n, n_found, n_unv;
    int no_check;  /* the benchmark hook: verified records are not judged */
    int uring;     /* reads go through the io_uring batch (else posix, one at a time) */
    size_t hl;     /* bytes of one header read */
    rb_uop *ops;   /* io_uring: the batch, nops used */
    uint8_t *hdrs; /* header buffers: io_uring one per found key (hl each), posix one */
    size_t nops, nhdr;
    uint64_t sum_fail; /* payload checksum failures seen */
    size_t n_sumbad;   /* keys failed by verify_payload_checksum */
    size_t n_bad;      /* keys whose slot header was refused */
    size_t n_failed;   /* keys whose read failed */
    uint64_t bytes;    /* payload bytes of the found keys (in flight meanwhile) */
};

/* No lock: reset every item's outputs (the items are the caller's). */
static void load_reset_items(rb_load_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        items[i].ok = 0;
        items[i].status = 0;
        rb_err_clear(&items[i].err);
        items[i].npos = -1;
        items[i].pos = NULL;
    }
}

/* c->mu held: read each key's record from the index into r->s and copy its cached positions
 * out to the item (npos -2 when out of memory); counts the found and the unverified records. */
static void load_snapshot_locked(struct load_run *r)
{
    rb_core *c = r->c;
    rb_load_item *items = r->items;
    struct load_snap *s = r->s;
    for (size_t i = 0; i < r->n; i++) {
        uint32_t h = rb_idx_hash(items[i].key, items[i].key_len);
        uint32_t p = rb_idx_find(&c->index, items[i].key, items[i].key_len, h);
        if (p == UINT32_MAX) {
            s[i].slot = RB_SLOT_NONE;
            s[i].gone = (uint8_t)rb_obs_was_gone(&c->obs, h);
            continue;
        }
        const rb_ent *e = &c->index.ents[p];
        s[i].slot = e->slot;
        rb_ext_use(&c->slots, e->slot, p, 1); /* a hit: the key hot (its extent's age kept) */
        s[i].size = e->size;
        s[i].sum = e->checksum;
        s[i].has_sum = (e->flags & RB_ENT_HAS_SUM) != 0;
        s[i].unverified = (e->flags & RB_ENT_UNVERIFIED) != 0;
        s[i].judged = s[i].unverified || !r->no_check;
        r->n_unv += s[i].unverified;
        r->n_found++;
        r->bytes += e->size;
        int64_t np = rb_ent_npos(e);
        items[i].npos = np;
        if (np > 0) {
            items[i].pos = malloc((size_t)np * sizeof(int64_t));
            if (items[i].pos)
                memcpy(items[i].pos, rb_ent_pos(e), (size_t)np * sizeof(int64_t));
            else
                items[i].npos = -2; /* out of memory: reported as a failed key */
        }
    }
}

/* No lock: the test hook's pause between the snapshot and the reads (load_delay_ms). */
static void load_test_delay(rb_core *c)
{
    uint32_t delay = atomic_load(&c->load_delay_ms);
    if (delay) {
        struct timespec ts = {(time_t)(delay / 1000), (long)(delay % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* No lock: choose the engine and allocate the header buffers (and the io_uring batch: a
 * header and a payload read per found key). Out of memory for the batch falls back to posix
 * reads, one at a time; 0, or -ENOMEM when not even one header buffer can be had. */
static int load_plan(struct load_run *r, rb_err *err)
{
    rb_core *c = r->c;
    const size_t nf = r->n_found ? r->n_found : 1;
    r->uring = rb_core_uses_uring(c);
    if (r->uring) {
        r->hl = rb_header_read_len(c);
        /* Not zeroed: load_queue_uring writes every field an op's run reads. */
        r->ops = malloc(2 * nf * sizeof(*r->ops));
        r->hdrs = rb_alloc_aligned(c->cfg.block_align, nf * r->hl, err);
        if (r->ops && r->hdrs)
            return 0;
        free(r->ops);
        free(r->hdrs);
        r->ops = NULL;
        r->hdrs = NULL;
        r->uring = 0;
    }
    r->hl = c->cfg.header_bytes;
    r->hdrs = rb_alloc_aligned(c->cfg.block_align, r->hl, err);
    return r->hdrs ? 0 : -ENOMEM;
}

/* No lock: whether a key is to be read (found, positions copied, a buffer that holds the
 * payload); a key that cannot be gets its status and error here. */
static int load_item_readable(const struct load_snap *sn, rb_load_item *it)
{
    if (sn->slot == RB_SLOT_NONE)
        return 0;
    if (it->npos == -2) {
        it->status = rb_err_set(&it->err, RB_ERR_NOMEM, ENOMEM, "out of memory");
        return 0;
    }
    size_t len = sn->size;
    if (it->buf_len < len) {
        it->status =
            rb_err_set(&it->err, RB_ERR_VALUE, EINVAL, "output buffer too small: cap=%zu need=%zu", it->buf_len, len);
        return 0;
    }
    return 1;
}

/* No lock: the identity and key hash each judged key's header must carry, object keys' identity
 * hashed several per pass (rb_blake2b64_many: the BLAKE2b is most of a judgement's CPU; the
 * key hash, xxh3 of ~100 bytes, ~12 ns). */
static void load_identities(struct load_run *r)
{
    enum { GROUP = 64 };
    const uint8_t *msg[GROUP];
    size_t len[GROUP];
    struct load_snap *who[GROUP];
    uint64_t dig[GROUP];
    const int object = r->c->cfg.key_namespace == RB_NS_OBJECT;
    size_t k = 0;
    for (size_t i = 0; i <= r->n; i++) {
        if (i < r->n) {
            struct load_snap *sn = &r->s[i];
            const rb_load_item *it = &r->items[i];
            if (sn->slot == RB_SLOT_NONE || !sn->judged)
                continue;
            sn->key_hash = rb_key_hash(it->key, it->key_len);
            if (!object) {
                sn->want_ok = rb_key_identity(r->c->cfg.key_namespace, it->key, it->key_len, &sn->want) == 0;
                continue;
            }
            msg[k] = (const uint8_t *)it->key;
            len[k] = it->key_len;
            who[k++] = sn;
            if (k < GROUP)
                continue;
        }
        if (k) {
            rb_blake2b64_many(msg, len, k, dig);
            for (size_t j = 0; j < k; j++) {
                who[j]->want = dig[j];
                who[j]->want_ok = 1;
            }
            k = 0;
        }
    }
}

/* No lock: judge a key whose reads completed from the header bytes read for it; a refused
 * payload is erased from the caller's buffer. */
static void load_judge(struct load_run *r, rb_load_item *it, struct load_snap *sn, const uint8_t *hdr)
{
    sn->verdict = (uint8_t)judge_slot(sn, hdr, r->hl, sn->unverified ? it->buf : NULL, &r->sum_fail);
    if (sn->verdict == LV_BAD) {
        erase_read(r->c, it, sn->size);
        r->n_bad++;
    } else {
        it->ok = 1;
    }
}

/* No lock: append a key's header and payload reads to the io_uring batch (writes r->ops,
 * r->nops, r->nhdr and the key's op indexes in *sn). */
static void load_queue_uring(struct load_run *r, rb_load_item *it, struct load_snap *sn)
{
    rb_core *c = r->c;
    size_t len = sn->size;
    uint64_t soff = rb_slot_offset(c, sn->slot);
    /* Batched: reads of at most queue-depth requests per batch, bounced by the engine when
     * the destination is unaligned for O_DIRECT or shorter than the transfer. */
    if (sn->judged) {
        rb_uop *h = &r->ops[r->nops];
        h->off = soff;
        h->buf = r->hdrs + r->nhdr++ * r->hl;
        h->buf_len = h->payload_len = h->total_len = h->copy_len = r->hl;
        h->write = 0;
        sn->hop = (uint32_t)r->nops++;
    }
    rb_uop *o = &r->ops[r->nops];
    o->off = soff + c->cfg.header_bytes;
    o->buf = it->buf;
    o->buf_len = c->cfg.enable_zero_copy ? it->buf_len : len;
    o->payload_len = len;
    o->total_len = rb_xfer_len(c, len);
    o->copy_len = len;
    o->write = 0;
    sn->pop = (uint32_t)r->nops++;
}

/* No lock: posix read of a key's header (into the scratch block) and payload (into the
 * caller's buffer) in one system call, then its verdict. */
static void load_read_posix(struct load_run *r, rb_load_item *it, struct load_snap *sn)
{
    rb_core *c = r->c;
    size_t len = sn->size;
    size_t blen = c->cfg.enable_zero_copy ? it->buf_len : len;
    uint64_t off = rb_slot_offset(c, sn->slot) + c->cfg.header_bytes;
    int rc = rb_core_dev_read_headed(c, off, r->hdrs, sn->judged ? r->hl : 0, it->buf, blen, len, rb_xfer_len(c, len),
                                     &it->err);
    if (rc < 0) {
        it->status = rc;
        r->n_failed++;
        erase_read(c, it, sn->size); /* whatever landed is not vouched for */
        return;
    }
    if (sn->judged)
        load_judge(r, it, sn, r->hdrs);
    else
        it->ok = 1;
}

/* No lock: issue every readable key's reads: queued in the io_uring batch, or done now
 * through posix. */
static void load_issue(struct load_run *r)
{
    for (size_t i = 0; i < r->n; i++) {
        if (!load_item_readable(&r->s[i], &r->items[i]))
            continue;
        if (r->uring)
            load_queue_uring(r, &r->items[i], &r->s[i]);
        else
            load_read_posix(r, &r->items[i], &r->s[i]);
    }
}

/* No lock: run the io_uring batch, then turn each key's two op results into its outcome. */
static void load_run_uring(struct load_run *r)
{
    rb_core *c = r->c;
    if (!r->nops)
        return;
    rb_err berr;
    (void)rb_core_uring_ops(c, r->ops, r->nops, c->cfg.iouring_queue_depth, 1, &berr); /* per-op results */
    const rb_uop *ops = r->ops;
    for (size_t i = 0; i < r->n; i++) {
        rb_load_item *it = &r->items[i];
        struct load_snap *sn = &r->s[i];
        if (sn->slot == RB_SLOT_NONE || it->status < 0)
            continue;
        const rb_uop *h = sn->judged ? &ops[sn->hop] : NULL, *o = &ops[sn->pop];
        const rb_uop *bad = h && h->rc < 0 ? h : o->rc < 0 ? o : NULL;
        if (bad) {
            it->status = bad->rc;
            it->err = bad->err;
            r->n_failed++;
            erase_read(c, it, sn->size); /* the other read may have landed: not vouched for */
        } else if (h) {
            load_judge(r, it, sn, h->buf);
        } else {
            it->ok = 1;
        }
    }
}

/* No lock: after failed reads, whether the device shrank below their slots: such a key is a
 * miss, not a failure (rb_core_check_size has dropped its record). */
static void load_check_shrink(struct load_run *r)
{
    if (!r->n_failed)
        return;
    uint32_t usable = rb_core_check_size(r->c);
    for (size_t i = 0; i < r->n; i++) {
        rb_load_item *it = &r->items[i];
        const struct load_snap *sn = &r->s[i];
        if (it->status < 0 && sn->slot != RB_SLOT_NONE && sn->slot >= usable && it->buf_len >= sn->size) {
            it->status = 0; /* the destination was erased when the read failed */
            rb_err_clear(&it->err);
        }
    }
}

/* No lock: with verify_payload_checksum, fail each loaded key whose payload does not match
 * its record's checksum (buffer erased, verdict LV_SUMBAD); then free the positions of every
 * key that did not load. */
static void load_check_sums(struct load_run *r)
{
    rb_core *c = r->c;
    const size_t n = r->n;
    rb_load_item *items = r->items;
    struct load_snap *s = r->s;
    for (size_t i = 0; i < n && c->cfg.verify_payload_checksum; i++) {
        rb_load_item *it = &items[i];
        struct load_snap *sn = &s[i];
        if (!it->ok || !sn->has_sum || XXH3_64bits(it->buf, sn->size) == sn->sum)
            continue;
        r->sum_fail++;
        r->n_sumbad++;
        it->ok = 0;
        it->status = rb_err_set(&it->err, RB_ERR_OS, EBADMSG, "payload checksum mismatch at offset %llu",
                                (unsigned long long)(rb_slot_offset(c, sn->slot) + c->cfg.header_bytes));
        erase_read(c, it, sn->size);
        sn->verdict = LV_SUMBAD;
    }
    for (size_t i = 0; i < n; i++) {
        if (!items[i].ok) {
            free(items[i].pos);
            items[i].pos = NULL;
            items[i].npos = -1;
        }
    }
}

/* c->mu held: apply one judged key's verdict to its record, unless the record changed since
 * the snapshot (deleted, re-put on another slot). Counts what it removes from the index. */
static void load_settle_one_locked(rb_core *c, const rb_load_item *it, const struct load_snap *sn, uint64_t *dropped,
                                   uint64_t *unv_dropped, uint64_t *sum_dropped)
{
    uint32_t p = rb_idx_find(&c->index, it->key, it->key_len, rb_idx_hash(it->key, it->key_len));
    if (p == UINT32_MAX)
        return;
    rb_ent *e = &c->index.ents[p];
    if (e->slot != sn->slot)
        return;
    if (sn->verdict == LV_SUMBAD) {
        if ((e->flags & RB_ENT_HAS_SUM) && e->checksum == sn->sum) {
            rb_core_drop_locked(c, p);
            (*sum_dropped)++;
        }
        return;
    }
    int unverified = (e->flags & RB_ENT_UNVERIFIED) != 0;
    if (sn->verdict == LV_BAD) {
        rb_core_drop_locked(c, p);
        (*dropped)++;
        *unv_dropped += (uint64_t)unverified;
    } else if (unverified) {
        e->flags &= (uint16_t)~RB_ENT_UNVERIFIED;
        c->n_unverified--;
        c->deferred_verified++;
    }
}

/* c->mu held: publish the call's checksum failures and settle the judged records in the index
 * and the counters. A record whose payload failed its checksum leaves the index like one
 * whose header was refused: it would fail every load, and every checkpoint would carry it on. */
static void load_settle_locked(struct load_run *r)
{
    rb_core *c = r->c;
    c->checksum_failures += r->sum_fail;
    if (!r->n_unv && !r->n_sumbad && !r->n_bad)
        return;
    uint64_t dropped = 0, unv_dropped = 0, sum_dropped = 0;
    for (size_t i = 0; i < r->n; i++) {
        if (r->s[i].verdict != LV_NONE && (r->s[i].verdict != LV_GOOD || r->s[i].unverified))
            load_settle_one_locked(c, &r->items[i], &r->s[i], &dropped, &unv_dropped, &sum_dropped);
    }
    c->load_rejected += dropped;
    if (unv_dropped) {
        c->recovery_dropped += unv_dropped;
        c->deferred_dropped += unv_dropped;
    }
    c->sum_dropped += sum_dropped;
    if (dropped || sum_dropped) {
        c->dirty_total++;
        rb_idx_maybe_compact(&c->index);
    }
}

/* No lock: count each key's outcome (served, or a miss by reason) and the bytes served. */
static void load_outcomes(const struct load_run *r, uint64_t *miss, uint64_t *hits, uint64_t *served)
{
    for (size_t i = 0; i < r->n; i++) {
        const struct load_snap *sn = &r->s[i];
        const rb_load_item *it = &r->items[i];
        if (it->ok) {
            (*hits)++;
            *served += sn->size;
        } else if (sn->slot == RB_SLOT_NONE) {
            miss[sn->gone ? RB_MISS_EVICTED : RB_MISS_ABSENT]++;
        } else if (sn->verdict == LV_SUMBAD) {
            miss[RB_MISS_CHECKSUM]++;
        } else if (sn->verdict == LV_BAD) {
            miss[RB_MISS_REFUSED_HEADER]++;
        } else if (it->status < 0 && it->err.kind != RB_ERR_VALUE && it->err.kind != RB_ERR_NOMEM) {
            miss[RB_MISS_DEVICE_ERROR]++;
        } else if (it->status == 0) {
            miss[RB_MISS_DEVICE_ERROR]++; /* the device shrank below its slot */
        }
    }
}

/* No lock: record the call under one recorder: its time since t0 and the bytes in flight as it
 * began (fly) when recording is on (t0 set), and when it ran (ok) each key's outcome and the
 * bytes served. */
static void load_observe(struct load_run *r, uint64_t t0, uint64_t fly, int ok)
{
    uint64_t d = t0 ? rb_hist_now_ns() - t0 : 0;
    uint64_t miss[RB_MISS_COUNT] = {0}, hits = 0, served = 0;
    if (ok)
        load_outcomes(r, miss, &hits, &served);
    rb_obs_w w = rb_obs_take(&r->c->obs);
    if (t0) {
        rb_obs_w_add(w, RB_H_LOAD, d);
        rb_obs_w_add(w, RB_H_INFLIGHT_BYTES, fly);
        if (ok)
            rb_obs_w_add(w, RB_H_LOAD_BYTES, served);
    }
    if (ok) {
        for (int k = 0; k < RB_MISS_COUNT; k++)
            rb_obs_w_count(w, k, miss[k]);
        rb_obs_w_count(w, RB_OBS_HITS, hits);
    }
    rb_obs_give(w);
}

/*
 * Stages: snapshot the records under c->mu (and enter the I/O and reader accounting), plan the
 * reads, run them without the lock (posix one at a time, or one io_uring batch), look at the
 * device size after failed reads, check payload checksums, then settle verdicts and leave the
 * accounting under c->mu again.
 */
int rb_core_load_many(rb_core *c, rb_load_item *items, size_t n, rb_err *err)
{
    uint64_t t0 = rb_obs_t0(&c->obs);
    struct load_run r = {.c = c, .items = items, .n = n, .no_check = atomic_load(&c->no_load_check)};
    r.s = calloc(n ? n : 1, sizeof(*r.s));
    if (!r.s)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    load_reset_items(items, n);
    pthread_mutex_lock(&c->mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->mu);
        free(r.s);
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "RawBlockCore cannot admit reads after shutdown");
    }
    load_snapshot_locked(&r);
    rb_core_io_begin_locked(c, 1);
    uint64_t rd_gen = rb_core_reader_begin_locked(c);
    pthread_mutex_unlock(&c->mu);
    uint64_t fly = rb_obs_fly(&c->obs, r.bytes);
    load_test_delay(c);

    int rc = load_plan(&r, err);
    if (rc == 0) {
        load_identities(&r);
        load_issue(&r);
        load_run_uring(&r);
        load_check_shrink(&r);
        load_check_sums(&r);
    } else {
        for (size_t i = 0; i < n; i++)
            free(items[i].pos);
        load_reset_items(items, n);
    }
    free(r.ops);
    free(r.hdrs);

    pthread_mutex_lock(&c->mu);
    load_settle_locked(&r);
    rb_core_reader_end_locked(c, rd_gen);
    rb_core_io_end_locked(c, 1);
    pthread_mutex_unlock(&c->mu);
    rb_obs_land(&c->obs, r.bytes);
    load_observe(&r, t0, fly, rc == 0);
    free(r.s);
    return rc < 0 ? rc : (int)(r.n_bad > INT32_MAX ? INT32_MAX : r.n_bad);
}
