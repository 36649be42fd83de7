/*
 * rb_core_ckpt.c - checkpoint writer (state v1 JSON into the two mirrored containers),
 * recovery (newest valid container, layout checks, free-list rebuild, slot-header
 * validation with parallel readers) and the periodic checkpoint thread.
 */
#include "rb_core_int.h"
#include "rb_core_ident.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- writer ---------------------------------------------------------------------------- */

static int encode_state_locked(rb_core *c, rb_buf *b)
{
    const rb_core_cfg *g = &c->cfg;
    rb_buf_puts(b, "{\"version\":1,\"device_path\":");
    rb_buf_json_str(b, c->path, strlen(c->path));
    rb_buf_puts(b, ",\"capacity_bytes\":");
    rb_buf_u64(b, c->capacity);
    rb_buf_puts(b, ",\"block_align\":");
    rb_buf_u64(b, g->block_align);
    rb_buf_puts(b, ",\"header_bytes\":");
    rb_buf_u64(b, g->header_bytes);
    rb_buf_puts(b, ",\"slot_bytes\":");
    rb_buf_u64(b, g->slot_bytes);
    rb_buf_puts(b, ",\"meta_total_bytes\":");
    rb_buf_u64(b, g->meta_total_bytes);
    rb_buf_puts(b, ",\"meta_magic\":");
    rb_buf_json_str(b, (const char *)g->meta_magic, 8);
    rb_buf_puts(b, ",\"meta_version\":");
    rb_buf_u64(b, g->meta_version);
    rb_buf_puts(b, ",\"data_base_offset\":");
    rb_buf_u64(b, c->data_base);
    rb_buf_puts(b, ",\"next_slot\":");
    /* On a device that shrank, the slots past its end are retired (the allocator's next_slot
     * runs past them) and no entry lies there: a reader, ours or LMCache's, rejects a state
     * whose next_slot exceeds the slots the device holds, so name only the slots that remain. */
    rb_buf_u64(b, c->slots.next_slot < c->usable_slots ? c->slots.next_slot : c->usable_slots);
    rb_buf_puts(b, ",\"entries\":{");
    /* Mark the slots this checkpoint lists (RB_REF_PEND) until it is settled. */
    for (uint32_t s = 0; s < c->ref_cap; s++)
        c->ref[s] &= (uint8_t)~RB_REF_PEND;
    int first = 1;
    for (uint32_t p = 0; p < c->index.n_ents; p++) {
        const rb_ent *e = &c->index.ents[p];
        if (e->flags & RB_ENT_DEAD)
            continue;
        if (rb_core_ref_reserve_locked(c, e->slot + 1) < 0)
            return -ENOMEM;
        c->ref[e->slot] |= RB_REF_PEND;
        if (!first)
            rb_buf_puts(b, ",");
        first = 0;
        rb_buf_json_str(b, rb_ent_key(e), e->key_len);
        rb_buf_puts(b, ":{\"offset\":");
        rb_buf_u64(b, rb_slot_offset(c, e->slot));
        rb_buf_puts(b, ",\"size\":");
        rb_buf_u64(b, e->size);
        rb_buf_puts(b, ",");
        const rb_class *k = c->cls[e->cls];
        rb_buf_put(b, k->json, k->json_len);
        rb_buf_puts(b, ",\"cached_positions\":");
        int64_t np = rb_ent_npos(e);
        if (np < 0) {
            rb_buf_puts(b, "null");
        } else {
            rb_buf_puts(b, "[");
            const int64_t *pos = rb_ent_pos(e);
            for (int64_t i = 0; i < np; i++) {
                if (i)
                    rb_buf_puts(b, ",");
                rb_buf_i64(b, pos[i]);
            }
            rb_buf_puts(b, "]");
        }
        if (e->flags & RB_ENT_HAS_SUM) {
            /* Ours (LMCache reads only the fields it knows): whether the slot carries a
             * checksum must not rest on the slot header's marker alone, which one flipped bit
             * would erase. */
            rb_buf_puts(b, ",\"" RB_ENT_SUM_FIELD "\":\"");
            rb_buf_sum_hex(b, e->checksum);
            rb_buf_puts(b, "\"");
        }
        rb_buf_puts(b, "}");
    }
    rb_buf_puts(b, "}}");
    return b->oom ? -ENOMEM : 0;
}

/* One metadata write, through the io_uring engine when the core uses it. */
int rb_core_meta_write(rb_core *c, uint64_t off, void *buf, size_t len, rb_err *err)
{
    if (!rb_core_uses_uring(c))
        return rb_core_dev_write(c, off, buf, len, len, len, 0, err);
    rb_uop o = {.off = off,
                .buf = buf,
                .buf_len = len,
                .payload_len = len,
                .total_len = len,
                .copy_len = (size_t)-1,
                .write = 1,
                .pid = (uint16_t)c->cfg.meta_checkpoint_placement_id};
    int rc = rb_core_uring_ops(c, &o, 1, 0, 0, err);
    if (rc == 0 && o.rc < 0) {
        *err = o.err;
        rc = o.rc;
    }
    return rc;
}

/* A device error of the checkpoint writer, told whole (operation, offset, path, errno) in err
 * itself: what checkpoint_now() raises and checkpoint_last_error keeps. */
void rb_core_explain_device_error(const rb_core *c, const char *op, uint64_t off, rb_err *err)
{
    if (err->kind != RB_ERR_OS && !(err->kind == RB_ERR_RUNTIME && err->errnum == EIO))
        return;
    char text[sizeof err->msg];
    rb_core_fault_text(c, op, off, err, text, sizeof text);
    memcpy(err->msg, text, sizeof text);
}

void rb_core_set_ckpt_error(rb_core *c, const rb_err *err)
{
    pthread_mutex_lock(&c->mu);
    c->ckpt_failures++;
    snprintf(c->ckpt_error, sizeof c->ckpt_error, "%s", err->msg);
    pthread_mutex_unlock(&c->mu);
}

/*
 * Settle the slot references after a checkpoint into container t. outcome: 1 durable (t now
 * lists exactly the RB_REF_PEND slots), -1 unknown (a write was attempted and failed: t may
 * hold its old or its new contents, so it keeps both), 0 nothing was written. Held slots that
 * no container lists any more return to use (through the reader quarantine). mu held.
 */
static void settle_refs_locked(rb_core *c, int t, int outcome)
{
    const uint8_t bit = (uint8_t)(1u << t);
    for (uint32_t s = 0; s < c->ref_cap; s++) {
        uint8_t r = c->ref[s];
        if (!r)
            continue;
        uint8_t pend = r & RB_REF_PEND;
        r &= (uint8_t)~RB_REF_PEND;
        if (outcome > 0)
            r = (uint8_t)((r & ~bit) | (pend ? bit : 0));
        else if (outcome < 0 && pend)
            r |= bit;
        c->ref[s] = r;
    }
    if (outcome > 0)
        c->ref_unknown &= (uint8_t)~bit;
    size_t keep = 0;
    for (size_t i = 0; i < c->n_held; i++) {
        uint32_t s = c->held[i];
        if (s < c->ref_cap && c->ref[s])
            c->held[keep++] = s;
        else
            rb_core_free_slot_locked(c, s); /* no bits: never back onto the held list */
    }
    c->n_held = keep;
}

/* fdatasync under the device's admission gate, with its durability accounting: a success
 * proves every key committed before it began; a failure goes into the fault journal and drops
 * every entry not yet proven (rb_core_flush_done_locked). The benchmark hook that skips
 * flushes counts as a success. */
int rb_core_flush(rb_core *c, rb_err *err)
{
    pthread_mutex_lock(&c->mu);
    uint64_t gen = rb_core_flush_begin_locked(c);
    pthread_mutex_unlock(&c->mu);
    int rc = 0;
    if (!atomic_load(&c->no_flush)) {
        if (rb_dev_enter(c->dev) < 0)
            return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "RawBlockCore is closed");
        rc = rb_core_take_flush_fault(c) ? rb_err_set(err, RB_ERR_OS, EIO, "fdatasync failed (injected)")
                                         : rb_dev_flush(c->dev, err);
        rb_dev_leave(c->dev);
        if (rc == 0)
            atomic_fetch_add(&c->flushes, 1);
        else
            rb_core_note_fault(c, "flush", UINT64_MAX, err);
    }
    if (rc < 0)
        rb_core_explain_device_error(c, "flush", UINT64_MAX, err);
    pthread_mutex_lock(&c->mu);
    rb_core_flush_done_locked(c, gen, rc == 0);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/*
 * One checkpoint. force as rb_core_checkpoint; room_n > 0: written only while a put of room_n
 * keys still needs it (rb_core_room_needed_locked), dirty or not.
 *
 * Durability: flush, container payload, flush, container header, flush. The first flush makes
 * every payload and slot header that the checkpoint lists durable before anything points at
 * them; the second keeps a header from reaching the medium before its payload; the third makes
 * the checkpoint itself durable before its slots are trusted as settled (settle_refs_locked).
 */
int rb_core_ckpt_due_locked(rb_core *c, int force, size_t room_n)
{
    if (room_n)
        return !c->closed && rb_core_room_needed_locked(c, room_n);
    int dirty = c->dirty_total > c->persisted;
    int idle = c->inflight_io == 0 && rb_now_ns() - c->last_io_ns >= (uint64_t)c->cfg.meta_idle_quiet_ms * 1000000ull;
    return dirty && (force || idle);
}

int rb_core_ckpt_v1_locked(rb_core *c, int force, size_t room_n, int want_target, rb_err *err)
{
    pthread_mutex_lock(&c->mu);
    int go = want_target >= 0 || rb_core_ckpt_due_locked(c, force, room_n);
    if (!go) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    /* A device that shrank: what lies past its end is not listed (a system call, so without
     * mu; the entries it drops only make the state dirtier, so the decision above stands). */
    pthread_mutex_unlock(&c->mu);
    (void)rb_core_check_size(c);
    pthread_mutex_lock(&c->mu);
    if (c->dev == NULL || rb_dev_enter(c->dev) < 0) {
        pthread_mutex_unlock(&c->mu);
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "RawBlockCore is closed");
    }
    rb_dev_leave(c->dev);
    rb_buf b = {0};
    int rc = encode_state_locked(c, &b);
    uint64_t dirty_snap = c->dirty_total;
    uint64_t seq = c->meta_seq + 1;
    /* Never overwrite the container that holds the newest checkpoint we trust. */
    if (want_target >= 0) {
        if ((int)((seq - 1) % 2) != want_target)
            seq++;
    } else if (c->good_container >= 0 && (int)((seq - 1) % 2) == c->good_container) {
        seq++;
    }
    const int target = (int)((seq - 1) % 2);
    int outcome = 0; /* settle_refs_locked */
    uint8_t *payload = NULL, *hdr = NULL;
    if (rc < 0) {
        settle_refs_locked(c, target, 0);
        pthread_mutex_unlock(&c->mu);
        rc = rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory serialising the checkpoint");
        goto out;
    }
    pthread_mutex_unlock(&c->mu);
    if (b.len > c->payload_cap) {
        rc = rb_err_set(err, RB_ERR_RUNTIME, EFBIG, "metadata payload too large (%zu > %llu), checkpoint not written",
                        b.len, (unsigned long long)c->payload_cap);
        pthread_mutex_lock(&c->mu);
        c->ckpt_too_large++;
        pthread_mutex_unlock(&c->mu);
        goto failed;
    }
    uint32_t delay = atomic_load(&c->ckpt_delay_ms);
    if (delay)
        usleep(delay * 1000u);

    const uint64_t ba = c->cfg.block_align;
    uint64_t padded = rb_round_up(b.len, ba);
    payload = rb_alloc_aligned(ba, padded, err);
    hdr = rb_alloc_aligned(ba, ba, err);
    if (!payload || !hdr) {
        rc = rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
        goto failed;
    }
    memcpy(payload, b.data, b.len);
    memset(payload + b.len, 0, padded - b.len);
    memset(hdr, 0, ba);
    rb_ckpt_header h;
    memcpy(h.magic, c->cfg.meta_magic, 8);
    h.version = c->cfg.meta_version;
    h.seq = seq;
    h.payload_len = b.len;
    h.crc = rb_crc32(b.data, b.len);
    rb_ckpt_header_encode(&h, hdr);
    uint64_t base = (uint64_t)target * c->container_bytes;
    if (c->ml.wipe_sbs) {
        /* The device held the log format: neither superblock may outlive this checkpoint. */
        outcome = -1;
        rc = rb_core_ml_wipe_superblocks(c, err);
        if (rc < 0)
            goto failed;
    }
    rc = rb_core_flush(c, err);
    if (rc < 0)
        goto failed;
    outcome = -1; /* from here on the container may have changed */
    rc = rb_core_meta_write(c, base + ba, payload, padded, err);
    if (rc < 0)
        rb_core_explain_device_error(c, "checkpoint write", base + ba, err);
    if (rc == 0)
        rc = rb_core_flush(c, err);
    if (rc == 0) {
        rc = rb_core_meta_write(c, base, hdr, ba, err);
        if (rc < 0)
            rb_core_explain_device_error(c, "checkpoint write", base, err);
    }
    if (rc == 0)
        rc = rb_core_flush(c, err);
    if (rc < 0)
        goto failed;
    pthread_mutex_lock(&c->mu);
    settle_refs_locked(c, target, 1);
    c->ref_unknown &= (uint8_t)~0x4u; /* a log the device held is gone (wipe_sbs) */
    c->meta_seq = seq;
    c->good_container = target;
    if (dirty_snap > c->persisted)
        c->persisted = dirty_snap;
    c->ckpt_written++;
    if (room_n)
        c->room_ckpts++;
    pthread_mutex_unlock(&c->mu);
    rc = 1;
    goto out;
failed:
    pthread_mutex_lock(&c->mu);
    settle_refs_locked(c, target, outcome);
    pthread_mutex_unlock(&c->mu);
    rb_core_set_ckpt_error(c, err);
out:
    free(payload);
    free(hdr);
    rb_buf_free(&b);
    return rc;
}

static int checkpoint_impl(rb_core *c, int force, size_t room_n, rb_err *err)
{
    if (c->ml.on)
        return rb_core_ml_checkpoint(c, force, room_n, err);
    pthread_mutex_lock(&c->ckpt_mu);
    int rc = rb_core_ckpt_v1_locked(c, force, room_n, -1, err);
    pthread_mutex_unlock(&c->ckpt_mu);
    return rc;
}

int rb_core_checkpoint(rb_core *c, int force, rb_err *err)
{
    int rc = checkpoint_impl(c, force, 0, err);
    (void)rb_core_dealloc_run(c); /* the slots it made reusable (a failure is counted there) */
    return rc;
}

int rb_core_checkpoint_room(rb_core *c, size_t n, rb_err *err)
{
    return checkpoint_impl(c, 1, n ? n : 1, err);
}

/* ---- apply + validation ---------------------------------------------------------------- */

typedef struct vitem {
    char *key;
    size_t key_len;
    uint32_t slot;
    uint64_t size;
    uint64_t checksum; /* the record's checksum and flags at the snapshot */
    uint16_t flags;
    /* results */
    int hdr_ok, has_sum;
    uint64_t identity, len, sum;
    /* the identity the key's header must carry, computed off the core mutex (want_state: 0 not
     * yet, 1 computed, -1 the key has none, i.e. the entry is bad) */
    int want_state;
    uint64_t want;
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
    if (rb_slot_header_decode(buf, n, &v->identity, &v->len, &v->has_sum, &v->sum) == 0)
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

/* The key identity items[lo..hi) expect (BLAKE2b of the key: about as costly as reading a
 * cached header, so the readers compute it beside their I/O rather than the judge after it). */
static void want_identities(const rb_core *c, vitem *items, size_t lo, size_t hi)
{
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
    v->hdr_ok = rb_slot_header_decode(buf, rb_header_read_len(c), &v->identity, &v->len, &v->has_sum, &v->sum) == 0;
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
    const size_t hb = rb_header_read_len(c); /* stride and read length of one header */
    size_t qd = c->cfg.iouring_queue_depth ? c->cfg.iouring_queue_depth : 1;
    /* At least 256 headers per group (several batches when the queue depth is small), at most
     * 2 MiB of buffer per group. */
    size_t group = qd < 256 ? (256 + qd - 1) / qd * qd : qd;
    size_t cap = ((size_t)2 << 20) / hb;
    if (group > cap)
        group = cap ? cap : 1;
    if (group > n)
        group = n;
    rb_err e;
    uint8_t *buf = rb_alloc_aligned(c->cfg.block_align, 2 * group * hb, &e);
    uint8_t *one = rb_alloc_aligned(c->cfg.block_align, hb, &e);
    rb_uop *ops = calloc(2 * group, sizeof(*ops));
    if (!buf || !one || !ops) {
        free(buf);
        free(one);
        free(ops);
        read_headers_parallel(c, items, n);
        return;
    }
    /* Touch the buffer once: a buffered read into a page not yet faulted in cannot complete
     * inline and is handed to an io-wq kernel thread (several times slower per header). */
    memset(buf, 0, 2 * group * hb);
    size_t ngroups = (n + group - 1) / group;
    rb_uops_run run[2];
    for (size_t g = 0; g <= ngroups; g++) {
        /* submit group g (half g & 1), then finish group g - 1 (the other half) */
        if (g < ngroups) {
            size_t lo = g * group, cnt = n - lo < group ? n - lo : group;
            rb_uop *o = ops + (g & 1) * group;
            uint8_t *b = buf + (g & 1) * group * hb;
            for (size_t j = 0; j < cnt; j++) {
                o[j].off = rb_slot_offset(c, items[lo + j].slot);
                o[j].buf = b + j * hb;
                o[j].buf_len = o[j].payload_len = o[j].total_len = o[j].copy_len = hb;
                o[j].write = 0;
            }
            (void)rb_core_uring_ops_begin(c, &run[g & 1], o, cnt, qd, 0, &e);
        }
        if (g == 0)
            continue;
        size_t p = g - 1, lo = p * group, cnt = n - lo < group ? n - lo : group;
        rb_uop *o = ops + (p & 1) * group;
        uint8_t *b = buf + (p & 1) * group * hb;
        want_identities(c, items, lo, lo + cnt);
        rb_core_uring_ops_finish(&run[p & 1]);
        for (size_t j = 0; j < cnt; j++) {
            if (o[j].rc == 0)
                decode_header_into(c, &items[lo + j], b + j * hb);
            else
                read_header_into(c, &items[lo + j], one);
        }
    }
    free(buf);
    free(one);
    free(ops);
}

/* Validate the live entries at index positions [lo, hi) (clipped to the index). */
static int validate_range(rb_core *c, int sequential, uint32_t lo, uint32_t hi)
{
    pthread_mutex_lock(&c->mu);
    if (hi > c->index.n_ents)
        hi = c->index.n_ents;
    size_t n = 0, key_bytes = 0;
    for (uint32_t p = lo; p < hi; p++)
        if (!(c->index.ents[p].flags & RB_ENT_DEAD)) {
            key_bytes += (size_t)c->index.ents[p].key_len + 1;
            n++;
        }
    /* the keys are copied (the index may change while the headers are read) into one block */
    vitem *items = calloc(n ? n : 1, sizeof(*items));
    char *keys = malloc(key_bytes ? key_bytes : 1);
    size_t k = 0;
    if (!items || !keys) {
        pthread_mutex_unlock(&c->mu);
        free(items);
        free(keys);
        return -ENOMEM;
    }
    char *kp = keys;
    for (uint32_t p = lo; p < hi; p++) {
        const rb_ent *e = &c->index.ents[p];
        if (e->flags & RB_ENT_DEAD)
            continue;
        items[k].key = kp;
        memcpy(kp, rb_ent_key(e), e->key_len + 1);
        kp += e->key_len + 1;
        items[k].key_len = e->key_len;
        items[k].slot = e->slot;
        items[k].size = e->size;
        items[k].checksum = e->checksum;
        items[k].flags = e->flags;
        k++;
    }
    if (k)
        c->inflight_io++;
    uint64_t rd_gen = rb_core_reader_begin_locked(c);
    pthread_mutex_unlock(&c->mu);

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
    uint64_t dropped = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < k; i++) {
        vitem *v = &items[i];
        /* A record that carries a checksum (from the checkpoint) needs the same one in the
         * header: a header whose marker was damaged must not turn the check off. */
        int bad = !v->hdr_ok || v->want_state != 1 || v->want != v->identity || v->len != v->size ||
                  ((v->flags & RB_ENT_HAS_SUM) && (!v->has_sum || v->sum != v->checksum));
        uint32_t p = rb_idx_find(&c->index, v->key, v->key_len, rb_idx_hash(v->key, v->key_len));
        if (p == UINT32_MAX || c->index.ents[p].slot != v->slot)
            continue; /* changed meanwhile */
        rb_ent *e = &c->index.ents[p];
        /* Deleted and put again (LIFO slot reuse gives it the same slot), or judged by a
         * load: the header read above may be the old record's. */
        if (e->size != v->size || e->checksum != v->checksum ||
            ((e->flags ^ v->flags) & (RB_ENT_HAS_SUM | RB_ENT_UNVERIFIED)))
            continue;
        if (bad) {
            rb_core_drop_locked(c, p);
            dropped++;
            continue;
        }
        if (e->flags & RB_ENT_UNVERIFIED) {
            e->flags &= (uint16_t)~RB_ENT_UNVERIFIED;
            c->n_unverified--;
        }
        if (v->has_sum) {
            e->checksum = v->sum;
            e->flags |= RB_ENT_HAS_SUM;
        }
    }
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

static int64_t *json_int_list(struct json_object *o, int64_t *n, int *bad)
{
    *bad = 0;
    *n = -1;
    if (!o || json_object_get_type(o) == json_type_null)
        return NULL;
    if (json_object_get_type(o) != json_type_array) {
        *bad = 1;
        return NULL;
    }
    size_t len = json_object_array_length(o);
    int64_t *v = malloc((len ? len : 1) * sizeof(int64_t));
    if (!v) {
        *bad = 1;
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        if (rb_json_as_i64(json_object_array_get_idx(o, i), &v[i]) < 0) {
            free(v);
            *bad = 1;
            return NULL;
        }
    }
    *n = (int64_t)len;
    return v;
}

static const char *json_opt_str(struct json_object *o, size_t *len)
{
    if (!o || json_object_get_type(o) != json_type_string)
        return NULL; /* null (or a non-string, stored as null) */
    *len = (size_t)json_object_get_string_len(o);
    return json_object_get_string(o);
}

/*
 * A checkpoint's top-level fields, from either reader. Integer fields: st 0 absent, 1 an
 * integer (val), 2 present but not convertible. Strings: str_st 0 absent, 1 a string, 2 other.
 */
typedef struct top_view {
    uint8_t st[RB_FTOP_N];
    int64_t val[RB_FTOP_N];
    uint8_t str_st[RB_FTOP_N];
    const char *str[RB_FTOP_N];
    size_t str_len[RB_FTOP_N];
} top_view;

static int top_matches(const top_view *t, int f, uint64_t want)
{
    return t->st[f] == 0 || (t->st[f] == 1 && t->val[f] >= 0 && (uint64_t)t->val[f] == want);
}

/* 1 acceptable (next_slot set), 0 rejected (err says why). */
static int check_top(rb_core *c, const top_view *t, int64_t *next_slot, rb_err *err)
{
    if (t->st[RB_FTOP_VERSION] != 1 || t->val[RB_FTOP_VERSION] != 1) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata version unsupported; ignoring metadata");
        return 0;
    }
    if (t->str_st[RB_FTOP_DEVICE_PATH] == 1 && t->str_len[RB_FTOP_DEVICE_PATH] > 0 &&
        strcmp(t->str[RB_FTOP_DEVICE_PATH], c->path) != 0) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata device_path mismatch; ignoring metadata");
        return 0;
    }
    static const int fields[] = {RB_FTOP_BLOCK_ALIGN, RB_FTOP_HEADER_BYTES, RB_FTOP_SLOT_BYTES, RB_FTOP_META_TOTAL};
    const uint64_t want[] = {c->cfg.block_align, c->cfg.header_bytes, c->cfg.slot_bytes, c->cfg.meta_total_bytes};
    for (int i = 0; i < 4; i++) {
        if (!top_matches(t, fields[i], want[i])) {
            rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata %s mismatch; ignoring metadata",
                       rb_ftop_names[fields[i]]);
            return 0;
        }
    }
    if (t->str_st[RB_FTOP_META_MAGIC] && (t->str_st[RB_FTOP_META_MAGIC] != 1 || t->str_len[RB_FTOP_META_MAGIC] != 8 ||
                                          memcmp(t->str[RB_FTOP_META_MAGIC], c->cfg.meta_magic, 8) != 0)) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata meta_magic mismatch; ignoring metadata");
        return 0;
    }
    if (!top_matches(t, RB_FTOP_META_VERSION, c->cfg.meta_version)) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata meta_version mismatch; ignoring metadata");
        return 0;
    }
    int64_t ns = t->val[RB_FTOP_NEXT_SLOT];
    if (t->st[RB_FTOP_NEXT_SLOT] != 1 || ns < 0 || (uint64_t)ns > c->max_slots) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata next_slot invalid; ignoring metadata");
        return 0;
    }
    *next_slot = ns;
    return 1;
}

/* Clear the index and slots for a new state (takes mu; returns with it held on success). */
static int apply_begin(rb_core *c, int64_t next_slot, uint8_t **used_out, rb_err *err)
{
    /* A deallocation in progress ends first: its slots must not take keys of the new state. */
    pthread_mutex_lock(&c->dl_mu);
    pthread_mutex_lock(&c->mu);
    pthread_mutex_unlock(&c->dl_mu);
    /* Slots reserved by puts in flight stay reserved, also those at or beyond the state's
     * next_slot: the allocator's next_slot moves past them, or it would hand them out again
     * while the put still commits its key there. */
    int64_t top = next_slot;
    for (uint32_t p = 0; p < c->inflight.n_ents; p++)
        if (!(c->inflight.ents[p].flags & RB_ENT_DEAD) && c->inflight.ents[p].slot >= (uint64_t)top)
            top = (int64_t)c->inflight.ents[p].slot + 1;
    uint8_t *used = calloc((size_t)top + 1, 1);
    if (!used) {
        pthread_mutex_unlock(&c->mu);
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    }
    rb_idx_clear(&c->index);
    c->locked_keys = 0;
    c->n_unverified = 0;
    /* The allocator is rebuilt from the new state: a quarantined slot is either claimed by it or
     * freed again by apply_end (and quarantined anew if readers are still in flight). */
    rb_core_quarantine_reset_locked(c);
    rb_core_dealloc_reset_locked(c);
    if (rb_slots_reset(&c->slots, (uint32_t)top) < 0) {
        pthread_mutex_unlock(&c->mu);
        free(used);
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    }
    for (uint32_t p = 0; p < c->inflight.n_ents; p++)
        if (!(c->inflight.ents[p].flags & RB_ENT_DEAD))
            used[c->inflight.ents[p].slot] = 1;
    *used_out = used;
    return 0;
}

/* The slot an entry takes, or -1 when it is skipped: LMCache's offset/size rules, plus ours
 * (a slot never handed out, or one already claimed). mu held. */
static int64_t entry_slot(const rb_core *c, const uint8_t *used, int64_t next_slot, int has_off, int64_t off,
                          int has_size, int64_t size)
{
    if (!has_off || !has_size)
        return -1;
    if (off < 0 || (uint64_t)off < c->data_base || ((uint64_t)off - c->data_base) % c->cfg.slot_bytes)
        return -1;
    uint64_t slot = ((uint64_t)off - c->data_base) / c->cfg.slot_bytes;
    if (slot >= c->max_slots || size <= 0 || (uint64_t)size > c->slot_cap)
        return -1;
    if (slot >= (uint64_t)next_slot || used[slot])
        return -1;
    return (int64_t)slot;
}

/* Add one entry (mu held). 0, or -1 when out of memory. */
static int insert_entry(rb_core *c, uint8_t *used, const char *key, size_t klen, uint32_t h, uint32_t slot,
                        int64_t size, uint32_t cls, const int64_t *pos, int64_t npos, int has_sum, uint64_t sum)
{
    uint32_t p = cls == UINT32_MAX ? UINT32_MAX : rb_idx_insert(&c->index, key, klen, h, pos, npos);
    if (p == UINT32_MAX)
        return -1;
    rb_ent *e = &c->index.ents[p];
    e->slot = slot;
    e->size = (uint64_t)size;
    e->cls = cls;
    if (has_sum) {
        e->checksum = sum;
        e->flags |= RB_ENT_HAS_SUM;
    }
    /* Judged by validate_entries right after (verify_on_load), else by its first load. */
    e->flags |= RB_ENT_UNVERIFIED;
    c->n_unverified++;
    used[slot] = 1;
    return 0;
}

/* Free the unclaimed slots, reset the dirty state, drop mu; then validate if configured. */
static int apply_end(rb_core *c, uint8_t *used, uint64_t loaded, uint64_t skipped, int oom, rb_err *err)
{
    c->apply_skipped = skipped; /* entries the state lists that its checks refused */
    if (c->apply_container >= 0) {
        /* Recovery: what the container lists, exactly, before validation drops anything (a
         * dropped entry's slot stays listed on the device until a checkpoint replaces it). */
        const uint8_t bit = (uint8_t)(1u << c->apply_container);
        if (rb_core_ref_reserve_locked(c, c->slots.next_slot) < 0) {
            oom = 1;
            c->ref_unknown |= bit; /* keeps every slot out of use until it is rewritten */
        } else {
            for (uint32_t s = 0; s < c->slots.next_slot; s++)
                if (used[s])
                    c->ref[s] |= bit;
            c->ref_unknown &= (uint8_t)~bit;
        }
    }
    for (uint32_t s = 0; s < c->slots.next_slot; s++) /* the state's, or past the in-flight slots */
        if (!used[s])
            rb_core_free_slot_locked(c, s); /* quarantined while readers of the old state run */
    c->dirty_total = 0;
    c->persisted = 0;
    c->recovery_entries_loaded = loaded;
    if (c->ml.on && c->apply_container < 0) {
        /* A state applied at run time replaced the index without journaling it: the next
         * checkpoint writes a whole base, and until it is durable no slot is reused (the log on
         * the device may list any). */
        c->ml.need_base++;
        c->ref_unknown |= 0x4u;
        c->dirty_total = 1;
    }
    pthread_mutex_unlock(&c->mu);
    free(used);
    if (oom)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory applying metadata");
    if (c->cfg.meta_verify_on_load || c->cfg.verify_payload_checksum) {
        if (rb_core_validate_entries(c, 0) < 0)
            return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory validating slot headers");
    }
    return 1;
}

static void json_top_view(struct json_object *st, top_view *t)
{
    memset(t, 0, sizeof(*t));
    for (int f = 0; f < RB_FTOP_N; f++) {
        struct json_object *o;
        if (f == RB_FTOP_ENTRIES || !json_object_object_get_ex(st, rb_ftop_names[f], &o))
            continue;
        t->st[f] = rb_json_as_i64(o, &t->val[f]) == 0 ? 1 : 2;
        if (json_object_get_type(o) == json_type_string) {
            t->str_st[f] = 1;
            t->str[f] = json_object_get_string(o);
            t->str_len[f] = (size_t)json_object_get_string_len(o);
        } else {
            t->str_st[f] = 2;
        }
    }
}

/* 1 applied, 0 rejected (reason in err->msg), <0 error. Runs without any core lock held. */
static int apply_state(rb_core *c, struct json_object *st, rb_err *err)
{
    if (!st || json_object_get_type(st) != json_type_object) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "metadata is not an object");
        return 0;
    }
    top_view t;
    json_top_view(st, &t);
    int64_t next_slot;
    if (!check_top(c, &t, &next_slot, err))
        return 0;
    struct json_object *entries = NULL;
    json_object_object_get_ex(st, "entries", &entries);
    struct json_object *entries_raw = entries;
    int bad_entries = entries && json_object_get_type(entries) != json_type_object;
    if (bad_entries)
        entries = NULL;

    uint8_t *used;
    int rc = apply_begin(c, next_slot, &used, err);
    if (rc < 0)
        return rc;
    uint64_t loaded = 0, skipped = 0;
    int oom = 0;
    if (bad_entries) /* an "entries" that is not an object: whatever it held is lost */
        skipped +=
            json_object_get_type(entries_raw) == json_type_array ? (uint64_t)json_object_array_length(entries_raw) : 1;
    if (entries) {
        json_object_object_foreach(entries, key, val)
        {
            if (!val || json_object_get_type(val) != json_type_object) {
                skipped++;
                continue;
            }
            struct json_object *fo, *fs;
            int64_t off = 0, size = 0;
            int has_off = json_object_object_get_ex(val, "offset", &fo) && rb_json_as_i64(fo, &off) == 0;
            int has_size = json_object_object_get_ex(val, "size", &fs) && rb_json_as_i64(fs, &size) == 0;
            int64_t slot = entry_slot(c, used, next_slot, has_off, off, has_size, size);
            if (slot < 0) {
                skipped++;
                continue;
            }
            uint64_t sum = 0;
            int has_sum = json_object_object_get_ex(val, RB_ENT_SUM_FIELD, &fo);
            if (has_sum &&
                (json_object_get_type(fo) != json_type_string ||
                 rb_sum_parse_hex(json_object_get_string(fo), (size_t)json_object_get_string_len(fo), &sum) < 0)) {
                skipped++;
                continue; /* a checksum we cannot read: the entry cannot be trusted */
            }
            size_t klen = strlen(key);
            uint32_t h = rb_idx_hash(key, klen);
            if (rb_idx_find(&c->index, key, klen, h) != UINT32_MAX) {
                skipped++;
                continue;
            }
            struct json_object *jo;
            int bad_shape, bad_pos;
            int64_t ndim, npos;
            int64_t *dims = json_int_list(json_object_object_get_ex(val, "shape", &jo) ? jo : NULL, &ndim, &bad_shape);
            int64_t *pos =
                json_int_list(json_object_object_get_ex(val, "cached_positions", &jo) ? jo : NULL, &npos, &bad_pos);
            rb_meta_in m = {0};
            m.ndim = bad_shape ? -1 : ndim;
            m.dims = dims;
            m.npos = bad_pos ? -1 : npos;
            m.pos = pos;
            m.dtype = json_opt_str(json_object_object_get_ex(val, "dtype", &jo) ? jo : NULL, &m.dtype_len);
            m.fmt = json_opt_str(json_object_object_get_ex(val, "fmt", &jo) ? jo : NULL, &m.fmt_len);
            uint32_t cls = rb_core_intern_class(c, &m);
            int r = insert_entry(c, used, key, klen, h, (uint32_t)slot, size, cls, m.pos, m.npos, has_sum, sum);
            free(dims);
            free(pos);
            if (r < 0) {
                oom = 1;
                break;
            }
            loaded++;
        }
    }
    return apply_end(c, used, loaded, skipped, oom, err);
}

static int same_class(const rb_fstate *fs, const rb_fent *a, const rb_fent *b)
{
    return a->ndim == b->ndim &&
           (a->ndim <= 0 || memcmp(fs->pool + a->dims_at, fs->pool + b->dims_at, (size_t)a->ndim * 8) == 0) &&
           !a->dtype == !b->dtype && a->dtype_len == b->dtype_len &&
           (!a->dtype || memcmp(a->dtype, b->dtype, a->dtype_len) == 0) && !a->fmt == !b->fmt &&
           a->fmt_len == b->fmt_len && (!a->fmt || memcmp(a->fmt, b->fmt, a->fmt_len) == 0);
}

/* apply_state for a document read by rb_fstate_parse: same checks, same rules, same order. */
static int apply_fstate(rb_core *c, const rb_fstate *fs, rb_err *err)
{
    top_view t;
    memset(&t, 0, sizeof(t));
    char path_buf[4096];
    for (int f = 0; f < RB_FTOP_N; f++) {
        if (f == RB_FTOP_ENTRIES || !fs->has[f])
            continue;
        if (f == RB_FTOP_DEVICE_PATH || f == RB_FTOP_META_MAGIC) {
            t.str_st[f] = 1;
            t.str[f] = fs->str[f];
            t.str_len[f] = fs->str_len[f];
        } else {
            t.st[f] = 1;
            t.val[f] = fs->num[f];
            t.str_st[f] = 2;
        }
    }
    /* check_top compares the device path as a C string. */
    if (t.str_st[RB_FTOP_DEVICE_PATH] == 1) {
        size_t n = t.str_len[RB_FTOP_DEVICE_PATH];
        if (n >= sizeof path_buf)
            n = sizeof path_buf - 1; /* longer than PATH_MAX: cannot equal c->path either */
        memcpy(path_buf, t.str[RB_FTOP_DEVICE_PATH], n);
        path_buf[n] = 0;
        t.str[RB_FTOP_DEVICE_PATH] = path_buf;
    }
    int64_t next_slot;
    if (!check_top(c, &t, &next_slot, err))
        return 0;
    uint8_t *used;
    int rc = apply_begin(c, next_slot, &used, err);
    if (rc < 0)
        return rc;
    uint64_t loaded = 0, skipped = 0;
    int oom = 0;
    const rb_fent *prev = NULL; /* last interned entry: consecutive entries mostly share a class */
    uint32_t prev_cls = UINT32_MAX;
    for (size_t i = 0; i < fs->n; i++) {
        const rb_fent *e = &fs->ents[i];
        int64_t slot = entry_slot(c, used, next_slot, e->has_off, e->off, e->has_size, e->size);
        if (slot < 0) {
            skipped++;
            continue; /* keys are distinct (rb_fstate_parse): no index lookup needed */
        }
        uint32_t cls;
        if (prev && same_class(fs, prev, e)) {
            cls = prev_cls;
        } else {
            rb_meta_in m = {0};
            m.ndim = e->ndim;
            m.dims = e->ndim > 0 ? fs->pool + e->dims_at : NULL;
            m.dtype = e->dtype;
            m.dtype_len = e->dtype_len;
            m.fmt = e->fmt;
            m.fmt_len = e->fmt_len;
            m.npos = e->npos;
            cls = rb_core_intern_class(c, &m);
            prev = cls == UINT32_MAX ? NULL : e;
            prev_cls = cls;
        }
        if (insert_entry(c, used, e->key, e->klen, e->hash, (uint32_t)slot, e->size, cls,
                         e->npos > 0 ? fs->pool + e->pos_at : NULL, e->npos, e->has_sum, e->sum) < 0) {
            oom = 1;
            break;
        }
        loaded++;
    }
    return apply_end(c, used, loaded, skipped, oom, err);
}

int rb_core_apply_state_json_ex(rb_core *c, const char *json, size_t len, int generic, rb_err *err)
{
    if (!generic) {
        rb_fstate fs;
        int rc = rb_fstate_parse(json, len, &fs);
        if (rc < 0)
            return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory reading metadata");
        if (rc > 0) {
            rc = apply_fstate(c, &fs, err);
            rb_fstate_free(&fs);
            return rc;
        }
    }
    struct json_object *st = rb_json_parse(json, len);
    if (!st) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "metadata payload is not valid JSON");
        return 0;
    }
    int rc = apply_state(c, st, err);
    json_object_put(st);
    return rc;
}

int rb_core_apply_state_json(rb_core *c, const char *json, size_t len, rb_err *err)
{
    return rb_core_apply_state_json_ex(c, json, len, 0, err);
}

/* ---- recovery at open ------------------------------------------------------------------ */

/* Entries of a rejected checkpoint payload (still parseable JSON) that are not in the index
 * recovered instead; -1 when that cannot be told. */
static int64_t count_lost(rb_core *c, const uint8_t *payload, uint64_t len)
{
    if (!payload)
        return -1;
    struct json_object *st = rb_json_parse((const char *)payload, (size_t)len), *ents;
    if (!st)
        return -1;
    int64_t lost = -1;
    if (json_object_get_type(st) == json_type_object && json_object_object_get_ex(st, "entries", &ents) &&
        json_object_get_type(ents) == json_type_object) {
        lost = 0;
        pthread_mutex_lock(&c->mu);
        json_object_object_foreach(ents, key, val)
        {
            (void)val;
            size_t kl = strlen(key);
            if (rb_idx_find(&c->index, key, kl, rb_idx_hash(key, kl)) == UINT32_MAX)
                lost++;
        }
        pthread_mutex_unlock(&c->mu);
    }
    json_object_put(st);
    return lost;
}

/*
 * Recovery: the newest container of ours whose payload reads back with its CRC is applied; an
 * older one only when every newer one is unreadable (a fallback, reported with what it lost).
 * Until its entries are known, each container of ours keeps every slot out of use
 * (ref_unknown); the first put then writes a checkpoint over it (make_room in rb_core.c).
 */
static int recover_v1(rb_core *c, rb_err *err);

int rb_core_recover(rb_core *c, rb_err *err)
{
    /* Superblocks of the log format first: where they are valid, the v1 container headers they
     * replaced are gone, and a v1 header left in the other half is older than them. */
    int rc = rb_core_ml_recover(c, err);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    rc = recover_v1(c, err);
    if (rc == 0 && c->ml.on)
        c->ml.state = c->rec_outcome == RB_REC_BLANK ? RB_ML_FRESH : RB_ML_MIGRATE;
    return rc;
}

static int recover_v1(rb_core *c, rb_err *err)
{
    const uint64_t ba = c->cfg.block_align;
    uint8_t *hb = rb_alloc_aligned(ba, ba, err);
    if (!hb)
        return -ENOMEM;
    rb_ckpt_header h[2];
    int ours[2] = {0, 0};
    /* A header that was ours before something damaged it: the magic one byte off, or the magic
     * intact and a field out of range. Not loadable, but not a blank container either. */
    int damaged[2] = {0, 0};
    uint64_t max_hdr_seq = 0;
    for (int k = 0; k < 2; k++) {
        rb_err e;
        if (rb_core_dev_read(c, (uint64_t)k * c->container_bytes, hb, ba, ba, ba, 0, &e) < 0)
            continue;
        rb_ckpt_header_decode(hb, &h[k]);
        int magic_off = 0;
        for (int i = 0; i < 8; i++)
            magic_off += h[k].magic[i] != c->cfg.meta_magic[i];
        if (magic_off != 0 || h[k].version != c->cfg.meta_version || h[k].payload_len == 0 ||
            h[k].payload_len > c->payload_cap) {
            damaged[k] = magic_off == 0 ? 2 : magic_off == 1 ? 1 : 0; /* 2: its seq may be readable */
            /* A header zeroed or overwritten over a checkpoint payload that is still there. */
            static const char doc[] = "{\"version\":";
            if (!damaged[k] && rb_core_dev_read(c, (uint64_t)k * c->container_bytes + ba, hb, ba, ba, ba, 0, &e) == 0 &&
                memcmp(hb, doc, sizeof doc - 1) == 0)
                damaged[k] = 1;
            continue;
        }
        ours[k] = 1;
        c->ref_unknown |= (uint8_t)(1u << k);
        if (h[k].seq > max_hdr_seq)
            max_hdr_seq = h[k].seq;
    }
    free(hb);
    /* Resume the sequence from the newest valid header, whatever happens to its payload. */
    c->meta_seq = max_hdr_seq;
    if (!ours[0] && !ours[1] && !damaged[0] && !damaged[1]) {
        c->rec_outcome = RB_REC_BLANK;
        return 0;
    }
    if (!c->cfg.load_checkpoint_on_init) {
        c->rec_outcome = RB_REC_SKIPPED;
        return 0;
    }
    int order[2] = {0, 1};
    if (ours[1] && (!ours[0] || h[1].seq > h[0].seq)) {
        order[0] = 1;
        order[1] = 0;
    }
    int bad = -1; /* newer container that could not be read */
    char bad_why[96] = "";
    uint8_t *bad_payload = NULL; /* its bytes, when they could be read (CRC mismatch) */
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        int k = order[i];
        if (!ours[k])
            continue;
        uint64_t padded = rb_round_up(h[k].payload_len, ba);
        uint8_t *p = rb_alloc_aligned(ba, padded, err);
        if (!p) {
            rc = -ENOMEM;
            break;
        }
        rb_err e;
        if (rb_core_dev_read(c, (uint64_t)k * c->container_bytes + ba, p, padded, padded, padded, 0, &e) < 0) {
            if (bad < 0) {
                bad = k;
                snprintf(bad_why, sizeof bad_why, "read failed: %.60s", e.msg);
            }
            free(p);
            continue;
        }
        if (rb_crc32(p, h[k].payload_len) != h[k].crc) {
            if (bad < 0) {
                bad = k;
                snprintf(bad_why, sizeof bad_why, "payload CRC mismatch");
                bad_payload = p;
            } else {
                free(p);
            }
            continue;
        }
        rb_err why;
        rb_err_clear(&why);
        c->apply_container = k;
        rc = rb_core_apply_state_json(c, (const char *)p, h[k].payload_len, &why);
        c->apply_container = -1;
        free(p);
        if (rc < 0) {
            *err = why;
            break;
        }
        if (rc == 0) {
            c->rec_outcome = RB_REC_REJECTED;
            snprintf(c->ckpt_error, sizeof c->ckpt_error, "metadata payload rejected by checks: %.200s", why.msg);
            break;
        }
        rc = 0;
        c->recovery_loaded = 1;
        c->good_container = k;
        c->rec_seq = h[k].seq;
        int other = k ^ 1;
        if (bad < 0 && damaged[other]) {
            /* The other header was damaged: it may have been the newer checkpoint (its seq field
             * is no more trustworthy than the rest of it). */
            bad = other;
            snprintf(bad_why, sizeof bad_why, "damaged header");
        }
        if (bad < 0) {
            c->rec_outcome = RB_REC_LOADED;
            break;
        }
        c->rec_outcome = RB_REC_FALLBACK;
        c->rec_rejected_seq = damaged[bad] == 1 ? 0 : h[bad].seq;
        c->rec_lost = damaged[bad] ? -1 : count_lost(c, bad_payload, h[bad].payload_len);
        char lost[96];
        if (c->rec_lost >= 0)
            snprintf(lost, sizeof lost, "%lld entries it listed are not in the older one", (long long)c->rec_lost);
        else
            snprintf(lost, sizeof lost, "entries written between the two checkpoints are lost");
        char bad_seq[32] = "seq unknown";
        if (damaged[bad] != 1)
            snprintf(bad_seq, sizeof bad_seq, "seq %llu", (unsigned long long)h[bad].seq);
        snprintf(c->ckpt_error, sizeof c->ckpt_error,
                 "newest checkpoint (container %d, %s) is unreadable (%s); recovered the older checkpoint "
                 "(container %d, seq %llu): %s",
                 bad, bad_seq, bad_why, k, (unsigned long long)h[k].seq, lost);
        break;
    }
    if (rc == 0 && c->rec_outcome == RB_REC_BLANK) { /* no container was loaded or rejected */
        c->rec_outcome = RB_REC_UNREADABLE;
        c->rec_rejected_seq = max_hdr_seq;
        if (bad < 0)
            snprintf(bad_why, sizeof bad_why, "damaged header");
        snprintf(c->ckpt_error, sizeof c->ckpt_error,
                 "the device holds a checkpoint (newest seq %llu) but none is readable (%s); started with an "
                 "empty index",
                 (unsigned long long)max_hdr_seq, bad_why);
    }
    free(bad_payload);
    return rc;
}

/* ---- periodic thread ------------------------------------------------------------------- */

static void *ckpt_thread(void *arg)
{
    rb_core *c = arg;
    if (c->ml.bg_validate) {
        /* log format: start-up validation after open returned, in slices, so close() need not
         * wait for the rest (records left unverified are judged by their first load). Out of
         * memory: the same. Records that move meanwhile (the index compacts) may be skipped. */
        (void)rb_core_validate_sliced(c, &c->thr_stop);
        c->ml.bg_validate = 0;
    }
    pthread_mutex_lock(&c->thr_mu);
    int backlog = 0; /* freed slots still wait for their deallocation: the next round soon */
    while (!c->thr_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (backlog) {
            ts.tv_nsec += 10 * 1000 * 1000; /* 10 ms: another thread's run may hold the batch */
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
        } else {
            ts.tv_sec += c->cfg.meta_checkpoint_interval_sec ? c->cfg.meta_checkpoint_interval_sec : 1;
        }
        while (!c->thr_stop && !c->thr_kick && pthread_cond_timedwait(&c->thr_cv, &c->thr_mu, &ts) != ETIMEDOUT)
            ;
        if (c->thr_stop)
            break;
        int kicked = c->thr_kick;
        c->thr_kick = 0;
        pthread_mutex_unlock(&c->thr_mu);
        rb_err e;
        /* A kick (log format: deletes freed slots) writes the small group that makes them
         * reusable now; the period's checkpoint waits for an idle moment. Failures are
         * recorded in the status. */
        rb_core_checkpoint(c, kicked, &e);
        /* The log format compacts here, off every caller's path, once the ring is past half
         * full (or full: then groups wait for it). */
        if (c->ml.on && rb_core_ml_compact_due(c)) {
            rb_core_ml_compact(c, 0, &e);
            (void)rb_core_dealloc_run(c);
        }
        backlog = rb_core_dealloc_pending(c);
        pthread_mutex_lock(&c->thr_mu);
    }
    pthread_mutex_unlock(&c->thr_mu);
    return NULL;
}

void rb_core_ml_kick(rb_core *c)
{
    if (!c->thr_started)
        return;
    pthread_mutex_lock(&c->thr_mu);
    c->thr_kick = 1;
    pthread_cond_signal(&c->thr_cv);
    pthread_mutex_unlock(&c->thr_mu);
}

int rb_core_start_thread(rb_core *c, rb_err *err)
{
    int rc = pthread_create(&c->thr, NULL, ckpt_thread, c);
    if (rc != 0)
        return rb_err_set(err, RB_ERR_RUNTIME, rc, "cannot start the checkpoint thread");
    c->thr_started = 1;
    return 0;
}

void rb_core_stop_thread(rb_core *c)
{
    if (!c->thr_started)
        return;
    pthread_mutex_lock(&c->thr_mu);
    c->thr_stop = 1;
    pthread_cond_broadcast(&c->thr_cv);
    pthread_mutex_unlock(&c->thr_mu);
    pthread_join(c->thr, NULL);
    c->thr_started = 0;
}
