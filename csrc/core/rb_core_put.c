/*
 * rb_core_put.c - the put path: a slot reserved for each key under mu (an in-flight record),
 * its header and payload written without the lock (posix one key at a time, or io_uring
 * chunks of keys in one batch), then the key committed to the index or its reservation rolled
 * back; and the checkpoint written when only a checkpoint can give a put slots (make_room).
 */
#include "rb_core_int.h"

#include <errno.h>
#include <string.h>
#include <xxhash.h>

#include "rb_core_ident.h"

/* The first failure of a put_many call, for its caller (kept when one is already there). */
#define PUT_FAIL(fail, ...)                                                                                            \
    do {                                                                                                               \
        if ((fail) && (fail)->kind == RB_ERR_NONE)                                                                     \
            rb_err_set((fail), __VA_ARGS__);                                                                           \
    } while (0)

/* ---- reservation ----------------------------------------------------------------------- */

/* Whether the item's slot identity is the one its key names. Loads and recovery judge a slot
 * header by the identity the encoded key names (a parse: cheap); one stored under another
 * could never be vouched for. Object keys' identity is their BLAKE2b, which the key codec
 * computes: not hashed again here. */
static int identity_named(const rb_core *c, const rb_put_item *it)
{
    uint64_t named;
    return c->cfg.key_namespace != RB_NS_LEGACY ||
           (rb_key_identity(RB_NS_LEGACY, it->key, it->key_len, &named) >= 0 && named == it->identity);
}

/* The checks before a slot is taken for item (index hash h), mu held: 1 already indexed
 * (result True), 0 refused (result False, why in *fail), 2 go on. */
static int reserve_admit_locked(rb_core *c, const rb_put_item *it, uint32_t h, rb_err *fail)
{
    if (rb_idx_find(&c->index, it->key, it->key_len, h) != UINT32_MAX)
        return 1;
    if (rb_idx_find(&c->inflight, it->key, it->key_len, h) != UINT32_MAX) {
        PUT_FAIL(fail, RB_ERR_RUNTIME, EBUSY, "the key is being stored by another call");
        return 0;
    }
    if (!identity_named(c, it)) {
        PUT_FAIL(fail, RB_ERR_VALUE, EINVAL,
                 "the key's slot identity 0x%016llx is not the chunk hash its encoded form names: it could not "
                 "be checked when loaded",
                 (unsigned long long)it->identity);
        return 0;
    }
    if (it->len > c->slot_cap || rb_xfer_len(c, it->len) > c->slot_cap) {
        PUT_FAIL(fail, RB_ERR_VALUE, EFBIG, "a payload of %zu bytes does not fit a slot (%llu bytes after the header)",
                 it->len, (unsigned long long)c->slot_cap);
        return 0;
    }
    if (c->ref_unknown) {
        /* any slot may be listed by a container not read at open (make_room) */
        PUT_FAIL(fail, RB_ERR_RUNTIME, ENOSPC,
                 "no slot can be reused until a checkpoint is written (a container not read at open may list any)");
        return 0;
    }
    return 2;
}

/* A slot for a key of placement id pid, mu held. Reusable slots still waiting for their
 * deallocation are taken when none is free; a slot past the end of a device that shrank is
 * retired, one a container lists is held. RB_SLOT_NONE when there is none (*nospace set, why
 * in *fail). */
static uint32_t take_slot_locked(rb_core *c, uint16_t pid, size_t len, rb_err *fail, int *nospace)
{
    /* size classes: the smallest whose slot holds the payload (recovery derives the same) */
    uint32_t sc = c->n_sc > 1 ? rb_sc_of(len, c->cfg.slot_bytes, c->cfg.header_bytes, c->cfg.block_align, c->n_sc) : 0;
    for (;;) {
        uint32_t s = rb_slots_alloc_sc(&c->slots, pid, sc);
        if (s == RB_SLOT_NONE && rb_core_dealloc_take_locked(c) > 0)
            s = rb_slots_alloc_sc(&c->slots, pid, sc); /* reusable slots still waiting for deallocation */
        if (s == RB_SLOT_NONE) {
            *nospace = 1;
            unsigned long long held = (unsigned long long)rb_core_held_locked(c);
            if (c->n_sc > 1) /* the ids count slots of the smallest class, not what fits */
                PUT_FAIL(fail, RB_ERR_RUNTIME, ENOSPC,
                         "no free slot of size class %u (%llu-byte slots): %u slot ids (counted in the smallest "
                         "class's slots), %u indexed, %u being written, %llu waiting for a checkpoint",
                         sc, (unsigned long long)c->sc_bytes[sc], c->usable_slots, c->index.n_live, c->inflight.n_live,
                         held);
            else
                PUT_FAIL(fail, RB_ERR_RUNTIME, ENOSPC,
                         "no free slot: %u slots, %u indexed, %u being written, %llu waiting for a checkpoint",
                         c->usable_slots, c->index.n_live, c->inflight.n_live, held);
            return RB_SLOT_NONE;
        }
        if (s >= c->usable_slots) {
            c->retired_slots++; /* past the end of a device that shrank: never used again */
            continue;
        }
        if (s >= c->ref_cap || !c->ref[s])
            return s;
        /* A container lists it (a state applied at run time can put next_slot below slots a
         * container lists): it waits like any other freed slot. */
        rb_core_hold_slot_locked(c, s);
    }
}

/* Reserve a slot for item under mu. Returns 1 (already indexed: result True), 0 (failed:
 * result False, why in *fail) or 2 (reserved: *slot set, in-flight record inserted). */
static int reserve_locked(rb_core *c, const rb_put_item *it, uint32_t *slot, rb_err *fail, int *nospace)
{
    uint32_t h = rb_idx_hash(it->key, it->key_len);
    int admit = reserve_admit_locked(c, it, h, fail);
    if (admit != 2)
        return admit;
    uint32_t cls = rb_core_intern_class(c, &it->meta);
    if (cls == UINT32_MAX) {
        PUT_FAIL(fail, RB_ERR_NOMEM, ENOMEM, "out of memory");
        return 0;
    }
    uint32_t s = take_slot_locked(c, it->pid, it->len, fail, nospace);
    if (s == RB_SLOT_NONE)
        return 0;
    uint32_t p = rb_idx_insert(&c->inflight, it->key, it->key_len, h, it->meta.pos, it->meta.npos);
    if (p == UINT32_MAX) {
        rb_slots_release(&c->slots, s);
        PUT_FAIL(fail, RB_ERR_NOMEM, ENOMEM, "out of memory");
        return 0;
    }
    rb_ent *e = &c->inflight.ents[p];
    e->slot = s;
    e->cls = cls;
    e->size = it->len;
    e->pid = it->pid;
    e->refcnt = c->wb_epoch; /* in flight: the write-back failure epoch the write began in */
    *slot = s;
    return 2;
}

/* When only a checkpoint can give this put slots (freed slots wait until checkpoints that
 * exclude them are durable; a container not read at open may list any slot), write one, at
 * most once per container. A failure is recorded in the status; the put then gets what slots
 * there are. */
static void make_room(rb_core *c, size_t n)
{
    for (int round = 0; round < 2; round++) {
        pthread_mutex_lock(&c->mu);
        int need = !c->closed && rb_core_room_needed_locked(c, n);
        pthread_mutex_unlock(&c->mu);
        if (!need)
            return;
        rb_err e;
        if (rb_core_checkpoint_room(c, n, &e) < 0)
            return;
    }
}

/* reserve_locked; and when no slot is free while freed slots wait for a durable record of
 * their release, that record is written (make_room, mu dropped meanwhile) and the reservation
 * tried again: another thread may have taken the slots a first record released. want: keys
 * of the call still to be stored (what the record is written for). */
static int reserve_room_locked(rb_core *c, const rb_put_item *it, size_t want, uint32_t *slot, rb_err *fail)
{
    for (int tries = 0;; tries++) {
        int was_clear = fail && fail->kind == RB_ERR_NONE, nospace = 0;
        int r = reserve_locked(c, it, slot, fail, &nospace);
        if (r == 0 && nospace && c->dl_inflight > 0 && !c->closed) {
            /* The only freed slots are in a deallocation: they are back in use when it ends. */
            if (was_clear)
                rb_err_clear(fail);
            while (c->dl_inflight > 0)
                pthread_cond_wait(&c->dl_cv, &c->mu);
            tries--;
            continue;
        }
        if (r != 0 || !nospace || tries == 4 || c->closed || !rb_core_room_needed_locked(c, 1))
            return r;
        if (was_clear)
            rb_err_clear(fail);
        pthread_mutex_unlock(&c->mu);
        make_room(c, want);
        pthread_mutex_lock(&c->mu);
    }
}

/* ---- commit ---------------------------------------------------------------------------- */

/* The written key enters the index (index hash h) on the slot of its in-flight record r, mu
 * held: 2 committed; 1 when a state applied meanwhile already holds the key (that entry is
 * kept), 0 out of memory, the slot going back in both cases. */
static int commit_index_locked(rb_core *c, const rb_put_item *it, uint32_t h, const rb_ent *r, uint64_t sum,
                               rb_err *fail)
{
    if (rb_idx_find(&c->index, it->key, it->key_len, h) != UINT32_MAX) {
        rb_core_slot_back_locked(c, r->slot);
        return 1;
    }
    uint32_t q = UINT32_MAX;
    if (rb_core_write_committed_locked(c, r->slot) == 0)
        q = rb_idx_insert(&c->index, it->key, it->key_len, h, rb_ent_pos(r), rb_ent_npos(r));
    if (q == UINT32_MAX) {
        rb_core_slot_back_locked(c, r->slot);
        PUT_FAIL(fail, RB_ERR_NOMEM, ENOMEM, "out of memory");
        return 0;
    }
    rb_slots_move(&c->slots, r->slot, RB_SLOT_IN(RB_SLOT_RESERVED), RB_SLOT_LIVE, __func__);
    rb_ent *e = &c->index.ents[q];
    e->slot = r->slot;
    rb_ext_use(&c->slots, r->slot, q, 0);
    e->size = r->size;
    e->cls = r->cls;
    if (c->cfg.verify_payload_checksum) {
        e->checksum = sum;
        e->flags |= RB_ENT_HAS_SUM;
    }
    if (c->ml.on)
        rb_core_ml_put_locked(c, e);
    return 2;
}

/* Commit (ok) or roll back the reservation of item under mu. Returns the result (0 failed, 1
 * already indexed, 2 committed). A write that was in progress while a flush failed is rolled
 * back (its bytes may be among those the failed write-back lost), and so is one whose slot a
 * shrink of the device left outside it. */
static int commit_locked(rb_core *c, const rb_put_item *it, int ok, uint64_t sum, rb_err *fail)
{
    uint32_t h = rb_idx_hash(it->key, it->key_len);
    uint32_t p = rb_idx_find(&c->inflight, it->key, it->key_len, h);
    if (p == UINT32_MAX)
        return 0;
    rb_ent r = c->inflight.ents[p];
    int result = 0;
    if (ok && r.refcnt != c->wb_epoch) {
        PUT_FAIL(fail, RB_ERR_OS, EIO, "a device flush failed while the key was being written (see the fault journal)");
        ok = 0;
    }
    if (ok && r.slot >= c->usable_slots) {
        PUT_FAIL(fail, RB_ERR_OS, ENOSPC, "the device shrank below the key's slot while it was being written");
        ok = 0;
    }
    if (ok && !(r.flags & RB_ENT_CANCELED)) {
        result = commit_index_locked(c, it, h, &r, sum, fail);
    } else {
        rb_core_slot_back_locked(c, r.slot);
        if (ok)
            PUT_FAIL(fail, RB_ERR_RUNTIME, ECANCELED, "the key was deleted while it was being written");
    }
    c->dirty_total++;
    p = rb_idx_find(&c->inflight, it->key, it->key_len, h);
    rb_idx_remove_at(&c->inflight, p);
    if (c->inflight.n_live == 0)
        pthread_cond_broadcast(&c->idle_cv);
    return result;
}

/* A put's write at off failed: the whole story into *fail (the first of the call). */
static void put_write_failed(const rb_core *c, uint64_t off, const rb_err *werr, rb_err *fail)
{
    if (!fail || fail->kind != RB_ERR_NONE)
        return;
    rb_core_fault_text(c, "write", off, werr, fail->msg, sizeof fail->msg);
    fail->kind = werr->kind;
    fail->errnum = werr->errnum;
}

/* The slot header of item (header_bytes bytes at out): LMCache's fields, the checksum record
 * when has_sum, and the hash of the whole key, so that a key sharing the identity (a legacy key
 * of the same chunk hash) can never be served from this slot. */
static void put_header_encode(const rb_core *c, const rb_put_item *it, int has_sum, uint64_t sum, uint8_t *out)
{
    const rb_slot_hdr h = {.identity = it->identity,
                           .payload_len = it->len,
                           .sum = sum,
                           .key_hash = rb_key_hash(it->key, it->key_len),
                           .has_sum = has_sum};
    rb_slot_header_encode(out, c->cfg.header_bytes, &h);
}

/* ---- posix path ------------------------------------------------------------------------ */

/* posix put of one key: header, then payload. *woff: the offset of a write that failed. */
static int write_slot(rb_core *c, const rb_put_item *it, uint32_t slot, uint8_t *hdr, uint64_t *sum, uint64_t *woff,
                      rb_err *err)
{
    uint64_t off = rb_slot_offset(c, slot);
    int has_sum = c->cfg.verify_payload_checksum;
    *sum = has_sum ? XXH3_64bits(it->buf, it->len) : 0;
    put_header_encode(c, it, has_sum, *sum, hdr);
    *woff = off;
    int rc = rb_core_dev_write(c, off, hdr, c->cfg.header_bytes, c->cfg.header_bytes, c->cfg.header_bytes, 1, err);
    if (rc < 0)
        return rc;
    *woff = off + c->cfg.header_bytes;
    return rb_core_dev_write(c, *woff, it->buf, it->len, it->len, rb_xfer_len(c, it->len), 1, err);
}

/* posix put of item, want keys of the call still to be stored (it included), hdr a scratch
 * header block: reserve, write, commit. The key's result (0 failed, 1 already indexed, 2
 * committed), or -1 when the core is closed (nothing done). */
static int put_one_posix(rb_core *c, const rb_put_item *it, size_t want, uint8_t *hdr, rb_err *fail)
{
    uint32_t slot;
    pthread_mutex_lock(&c->mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->mu);
        return -1;
    }
    int r = reserve_room_locked(c, it, want, &slot, fail);
    if (r != 2) {
        pthread_mutex_unlock(&c->mu);
        return r;
    }
    rb_core_io_begin_locked(c, 1);
    pthread_mutex_unlock(&c->mu);

    rb_err werr;
    uint64_t sum = 0, woff = 0;
    int ok = write_slot(c, it, slot, hdr, &sum, &woff, &werr) == 0;
    if (!ok)
        put_write_failed(c, woff, &werr, fail);

    pthread_mutex_lock(&c->mu);
    rb_core_io_end_locked(c, 1);
    int res = commit_locked(c, it, ok, sum, fail);
    pthread_mutex_unlock(&c->mu);
    return res;
}

/* Keys left False by a close that began during the call, with no other failure reported. */
static void put_closed_reason(rb_core *c, const uint8_t *results, size_t n, rb_err *fail)
{
    if (!fail || fail->kind != RB_ERR_NONE || memchr(results, 0, n) == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    int closed = c->closed;
    pthread_mutex_unlock(&c->mu);
    if (closed)
        rb_err_set(fail, RB_ERR_RUNTIME, ESHUTDOWN, "RawBlockCore is closed");
}

/* posix path (LMCache's sequential path): each key in turn, until a close. As
 * rb_core_put_many. */
static int put_many_posix(rb_core *c, const rb_put_item *items, size_t n, uint8_t *results, uint32_t *stored,
                          size_t *n_stored, rb_err *fail, rb_err *err)
{
    uint8_t *hdr = rb_alloc_aligned(c->cfg.block_align, c->cfg.header_bytes, err);
    if (!hdr)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int res = put_one_posix(c, &items[i], n - i, hdr, fail);
        if (res < 0)
            break;
        results[i] = res != 0;
        if (res == 2)
            stored[(*n_stored)++] = (uint32_t)i;
    }
    free(hdr);
    put_closed_reason(c, results, n, fail);
    return 0;
}

/* ---- io_uring path --------------------------------------------------------------------- */

/*
 * io_uring put path, one chunk of at most RB_PUT_CHUNK unique keys (uniq[0..m) are item
 * indices):
 *   1. under mu, no I/O: reserve a slot for every key (indexed -> True; in flight elsewhere,
 *      oversize or no free slot -> False, isolated to that key);
 *   2. no lock: prepare each reserved key (checksum, header encode); a preparation failure is
 *      isolated to that key, which gets nothing queued;
 *   3. every payload and every header in one batch: one submission and one wait, as the
 *      kernel floor does. The order in which they reach the device does not matter: a freed
 *      slot is reused only once no checkpoint on the device lists it (rb_core_hold_slot_locked),
 *      and a checkpoint lists a key only after both of its writes completed and were flushed,
 *      so recovery never looks at a slot whose put was torn;
 *   4. under mu: all-or-nothing commit of the prepared keys (any submission or completion
 *      failure rolls every reservation of the chunk back).
 */
#define RB_PUT_CHUNK 64

typedef struct put_scratch {
    uint8_t *hdrs;                /* RB_PUT_CHUNK aligned header blocks */
    rb_uop ops[2 * RB_PUT_CHUNK]; /* payloads, then headers */
    uint32_t plan[RB_PUT_CHUNK];
    uint32_t slot[RB_PUT_CHUNK];
    uint64_t sum[RB_PUT_CHUNK];
    uint8_t prepared[RB_PUT_CHUNK];
} put_scratch;

/* One io_uring put_many call: its arguments and scratch, shared by its chunks. */
typedef struct put_call {
    rb_core *c;
    const rb_put_item *items;
    uint8_t *results;
    uint32_t *stored;
    size_t *n_stored;
    rb_err *fail;
    put_scratch *w;
} put_call;

/* Stage 1, under mu: reserve a slot for each key of the chunk (w->plan, w->slot) and enter
 * the I/O accounting for them. Returns how many were reserved; *closed set when the core was
 * closed before every key was looked at. */
static size_t chunk_reserve(put_call *pc, const uint32_t *uniq, size_t m, int *closed)
{
    rb_core *c = pc->c;
    put_scratch *w = pc->w;
    size_t np = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t q = 0; q < m; q++) {
        const rb_put_item *it = &pc->items[uniq[q]];
        if (c->closed) {
            *closed = 1;
            break;
        }
        uint32_t slot;
        int r = reserve_room_locked(c, it, m - q, &slot, pc->fail);
        if (r != 2) {
            pc->results[uniq[q]] = (uint8_t)r;
            continue;
        }
        w->plan[np] = uniq[q];
        w->slot[np++] = slot;
    }
    if (np)
        rb_core_io_begin_locked(c, np);
    pthread_mutex_unlock(&c->mu);
    return np;
}

/* Stage 2 for reserved key p: its checksum (w->sum) and slot header (in w->hdrs). 1 prepared,
 * 0 when the preparation failed (the prep fault hook; why in *fail). */
static int chunk_prepare_key(put_call *pc, size_t p)
{
    rb_core *c = pc->c;
    put_scratch *w = pc->w;
    const uint64_t hb = c->cfg.header_bytes;
    const rb_put_item *it = &pc->items[w->plan[p]];
    w->prepared[p] = 0;
    w->sum[p] = 0;
    if (rb_core_take_fault(&c->fault_prep)) {
        /* batch buffer preparation failed: nothing queued for this key */
        PUT_FAIL(pc->fail, RB_ERR_RUNTIME, EIO, "preparing the write failed (injected)");
        return 0;
    }
    int has_sum = c->cfg.verify_payload_checksum;
    w->sum[p] = has_sum ? XXH3_64bits(it->buf, it->len) : 0;
    put_header_encode(c, it, has_sum, w->sum[p], w->hdrs + p * hb);
    w->prepared[p] = 1;
    return 1;
}

/* Describe one write of len bytes at off (total bytes on the device) for placement id pid. */
static void write_op(rb_uop *o, uint64_t off, const void *buf, size_t len, size_t total, uint16_t pid)
{
    o->off = off;
    o->buf = (void *)buf;
    o->buf_len = len;
    o->payload_len = len;
    o->total_len = total;
    o->copy_len = (size_t)-1;
    o->write = 1;
    o->pid = pid;
}

/* Stage 2, no lock: prepare each of the np reserved keys and queue the prepared keys' payload
 * writes, then their header writes, in w->ops. Returns the ops queued, *npay of them
 * payloads. */
static size_t chunk_prepare(put_call *pc, size_t np, size_t *npay)
{
    rb_core *c = pc->c;
    put_scratch *w = pc->w;
    const uint64_t hb = c->cfg.header_bytes;
    size_t nops = 0;
    for (size_t p = 0; p < np; p++) {
        if (!chunk_prepare_key(pc, p))
            continue;
        const rb_put_item *it = &pc->items[w->plan[p]];
        /* header and payload of a key go to the same reclaim unit handle */
        write_op(&w->ops[nops++], rb_slot_offset(c, w->slot[p]) + hb, it->buf, it->len, rb_xfer_len(c, it->len),
                 it->pid);
    }
    *npay = nops;
    for (size_t p = 0; p < np; p++) {
        if (w->prepared[p])
            write_op(&w->ops[nops++], rb_slot_offset(c, w->slot[p]), w->hdrs + p * hb, hb, hb,
                     pc->items[w->plan[p]].pid);
    }
    return nops;
}

/* Stage 3, no lock: the nops queued writes in one batch. 1 when every one completed (or none
 * was queued), else 0 with the first failure in *fail. */
static int chunk_write(put_call *pc, size_t nops, size_t npay)
{
    put_scratch *w = pc->w;
    int ok = 1;
    if (npay) {
        rb_err berr;
        (void)rb_core_uring_ops(pc->c, w->ops, nops, 0, 1, &berr); /* every op's rc says how it ended */
        for (size_t i = 0; ok && i < nops; i++) {
            ok = w->ops[i].rc == 0;
            if (!ok)
                put_write_failed(pc->c, w->ops[i].off, &w->ops[i].err, pc->fail);
        }
    }
    return ok;
}

/* Stage 4, under mu: leave the I/O accounting and commit (ok) or roll back each of the np
 * reserved keys, publishing their results. */
static void chunk_commit(put_call *pc, size_t np, int ok)
{
    rb_core *c = pc->c;
    put_scratch *w = pc->w;
    pthread_mutex_lock(&c->mu);
    rb_core_io_end_locked(c, np);
    for (size_t p = 0; p < np; p++) {
        uint32_t i = w->plan[p];
        int res = commit_locked(c, &pc->items[i], ok && w->prepared[p], w->sum[p], pc->fail);
        pc->results[i] = res != 0;
        if (res == 2)
            pc->stored[(*pc->n_stored)++] = i;
    }
    pthread_mutex_unlock(&c->mu);
}

/* One chunk of m unique keys (item indexes uniq), the four stages above. Returns 1 when the
 * core was closed meanwhile (the keys not reserved stay False), else 0. */
static int put_chunk_uring(put_call *pc, const uint32_t *uniq, size_t m)
{
    int closed = 0;
    size_t np = chunk_reserve(pc, uniq, m, &closed);
    if (!np)
        return closed;
    size_t npay, nops = chunk_prepare(pc, np, &npay);
    chunk_commit(pc, np, chunk_write(pc, nops, npay));
    return closed;
}

/* The distinct keys of items: uniq[0..*m) the indexes of first occurrences, first[i] the index
 * of item i's first occurrence. 0, or -ENOMEM (err). */
static int put_dedupe(const rb_put_item *items, size_t n, uint32_t *uniq, uint32_t *first, size_t *m, rb_err *err)
{
    rb_idx seen;
    rb_idx_init(&seen);
    int rc = 0;
    *m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t h = rb_idx_hash(items[i].key, items[i].key_len);
        uint32_t p = n > 1 ? rb_idx_find(&seen, items[i].key, items[i].key_len, h) : UINT32_MAX;
        if (p != UINT32_MAX) {
            first[i] = seen.ents[p].slot;
            continue;
        }
        if (n > 1) {
            p = rb_idx_insert(&seen, items[i].key, items[i].key_len, h, NULL, -1);
            if (p == UINT32_MAX) {
                rc = rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
                break;
            }
            seen.ents[p].slot = (uint32_t)i;
        }
        first[i] = (uint32_t)i;
        uniq[(*m)++] = (uint32_t)i;
    }
    rb_idx_free(&seen);
    return rc;
}

/* io_uring path: each distinct key stored once, in chunks, until a close; a repeated key gets
 * its first occurrence's result. As rb_core_put_many. */
static int put_many_uring(rb_core *c, const rb_put_item *items, size_t n, uint8_t *results, uint32_t *stored,
                          size_t *n_stored, rb_err *fail, rb_err *err)
{
    /* Not zeroed: every field of a chunk's entries is written before it is read (zeroing the
     * ~40 KiB of op records, error texts included, was a visible share of a put's CPU). */
    put_scratch *w = malloc(sizeof(*w));
    uint32_t *uniq = malloc(n * sizeof(uint32_t));
    uint32_t *first = malloc(n * sizeof(uint32_t)); /* item -> index of its first occurrence */
    size_t m = 0;
    int rc;
    if (w)
        w->hdrs = rb_alloc_aligned(c->cfg.block_align, RB_PUT_CHUNK * c->cfg.header_bytes, err);
    if (!w || !w->hdrs || !uniq || !first)
        rc = rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    else
        rc = put_dedupe(items, n, uniq, first, &m, err);
    if (rc == 0) {
        put_call pc = {c, items, results, stored, n_stored, fail, w};
        for (size_t lo = 0; lo < m; lo += RB_PUT_CHUNK) {
            size_t cnt = m - lo < RB_PUT_CHUNK ? m - lo : RB_PUT_CHUNK;
            if (put_chunk_uring(&pc, uniq + lo, cnt))
                break; /* closed: the remaining keys stay False */
        }
        for (size_t i = 0; i < n; i++)
            if (first[i] != i)
                results[i] = results[first[i]];
    }
    if (w)
        free(w->hdrs);
    free(w);
    free(uniq);
    free(first);
    return rc;
}

/* The put path proper (rb_core_put_many times it). */
static int put_many_run(rb_core *c, const rb_put_item *items, size_t n, uint8_t *results, uint32_t *stored,
                        size_t *n_stored, rb_err *fail, rb_err *err)
{
    *n_stored = 0;
    memset(results, 0, n);
    rb_err_clear(fail);
    make_room(c, n);
    if (!rb_core_uses_uring(c))
        return put_many_posix(c, items, n, results, stored, n_stored, fail, err);
    int rc = put_many_uring(c, items, n, results, stored, n_stored, fail, err);
    put_closed_reason(c, results, n, fail);
    return rc;
}

int rb_core_put_many(rb_core *c, const rb_put_item *items, size_t n, uint8_t *results, uint32_t *stored,
                     size_t *n_stored, rb_err *fail, rb_err *err)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += items[i].len;
    uint64_t t0 = rb_obs_t0(&c->obs);
    uint64_t fly = rb_obs_fly(&c->obs, bytes);
    int rc = put_many_run(c, items, n, results, stored, n_stored, fail, err);
    if (rc == 0 && *n_stored)
        rb_core_note_buffered(c, bytes);
    rb_obs_land(&c->obs, bytes);
    if (t0) {
        uint64_t d = rb_hist_now_ns() - t0;
        rb_obs_w w = rb_obs_take(&c->obs);
        rb_obs_w_add(w, RB_H_PUT, d);
        rb_obs_w_add(w, RB_H_INFLIGHT_BYTES, fly);
        rb_obs_w_add(w, RB_H_PUT_BYTES, bytes);
        rb_obs_give(w);
    }
    return rc;
}
