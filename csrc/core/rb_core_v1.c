/*
 * rb_core_v1.c - format v1's metadata (LMCache's JSON checkpoint containers): the checkpoint
 * writer (state v1 JSON into the two mirrored containers) and recovery (the newest valid
 * container, applied by rb_core_apply.c; a fallback to the older one reported with what it
 * lost). The entry points both formats share are in rb_core_meta.c.
 */
#include "rb_core_int.h"

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
    rb_core_held_dedupe_locked(c);
    for (size_t i = 0; i < c->n_held; i++) {
        uint32_t s = c->held[i];
        if (s < c->ref_cap && c->ref[s])
            c->held[keep++] = s;
        else
            rb_core_free_slot_locked(c, s); /* no bits: never back onto the held list */
    }
    c->n_held = keep;
}

/* One v1 checkpoint being written. */
typedef struct v1_ckpt {
    rb_buf b;            /* the state v1 document */
    uint64_t seq;        /* its container sequence */
    uint64_t dirty_snap; /* dirty_total it covers */
    int target;          /* the container it goes into */
    int outcome;         /* settle_refs_locked's, should the write fail */
    uint8_t *payload;    /* the document, zero-padded to block_align */
    uint8_t *hdr;        /* the container header block */
    uint64_t padded;     /* payload bytes */
} v1_ckpt;

/* 1 when a checkpoint is to be written (want_target >= 0 always writes), else 0. A device that
 * shrank is checked first: what lies past its end is not listed. Takes and drops mu. */
static int v1_ckpt_wanted(rb_core *c, int force, size_t room_n, int want_target)
{
    pthread_mutex_lock(&c->mu);
    int go = want_target >= 0 || rb_core_ckpt_due_locked(c, force, room_n);
    pthread_mutex_unlock(&c->mu);
    /* A system call, so without mu; the entries it drops only make the state dirtier, so the
     * decision stands. */
    if (go)
        (void)rb_core_check_size(c);
    return go;
}

/* The sequence of the next checkpoint: one past meta_seq, or two so it goes into want_target
 * (>= 0), or never into the container that holds the newest checkpoint we trust. mu held. */
static uint64_t v1_next_seq_locked(const rb_core *c, int want_target)
{
    uint64_t seq = c->meta_seq + 1;
    int lands = (int)((seq - 1) % 2);
    if (want_target >= 0 ? lands != want_target : c->good_container >= 0 && lands == c->good_container)
        seq++;
    return seq;
}

/* Under mu: the core still open, the state encoded, the sequence and the container chosen.
 * 0, or <0 with err set (closed; out of memory, the references then settled as unwritten). */
static int v1_ckpt_snapshot(rb_core *c, int want_target, v1_ckpt *w, rb_err *err)
{
    pthread_mutex_lock(&c->mu);
    if (c->dev == NULL || rb_dev_enter(c->dev) < 0) {
        pthread_mutex_unlock(&c->mu);
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "RawBlockCore is closed");
    }
    rb_dev_leave(c->dev);
    int rc = encode_state_locked(c, &w->b);
    w->dirty_snap = c->dirty_total;
    w->seq = v1_next_seq_locked(c, want_target);
    w->target = (int)((w->seq - 1) % 2);
    if (rc < 0)
        settle_refs_locked(c, w->target, 0);
    pthread_mutex_unlock(&c->mu);
    if (rc < 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory serialising the checkpoint");
    return 0;
}

/* The payload and header blocks of w's document, after the size check and the test delay.
 * 0 or <0 (too large for a container, out of memory). */
static int v1_ckpt_images(rb_core *c, v1_ckpt *w, rb_err *err)
{
    if (w->b.len > c->payload_cap) {
        int rc =
            rb_err_set(err, RB_ERR_RUNTIME, EFBIG, "metadata payload too large (%zu > %llu), checkpoint not written",
                       w->b.len, (unsigned long long)c->payload_cap);
        pthread_mutex_lock(&c->mu);
        c->ckpt_too_large++;
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    uint32_t delay = atomic_load(&c->ckpt_delay_ms);
    if (delay)
        usleep(delay * 1000u);
    const uint64_t ba = c->cfg.block_align;
    w->padded = rb_round_up(w->b.len, ba);
    w->payload = rb_alloc_aligned(ba, w->padded, err);
    w->hdr = rb_alloc_aligned(ba, ba, err);
    if (!w->payload || !w->hdr)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    memcpy(w->payload, w->b.data, w->b.len);
    memset(w->payload + w->b.len, 0, w->padded - w->b.len);
    memset(w->hdr, 0, ba);
    rb_ckpt_header h;
    memcpy(h.magic, c->cfg.meta_magic, 8);
    h.version = c->cfg.meta_version;
    h.seq = w->seq;
    h.payload_len = w->b.len;
    h.crc = rb_crc32(w->b.data, w->b.len);
    rb_ckpt_header_encode(&h, w->hdr);
    return 0;
}

/* One metadata write of w's container, a failure told whole. */
static int v1_ckpt_put(rb_core *c, uint64_t off, void *buf, size_t len, rb_err *err)
{
    int rc = rb_core_meta_write(c, off, buf, len, err);
    if (rc < 0)
        rb_core_explain_device_error(c, "checkpoint write", off, err);
    return rc;
}

/* The device writes, in the order the durability rules above need (superblocks of a log the
 * device held wiped first). 0 or <0; w->outcome says whether the container may have changed. */
static int v1_ckpt_write(rb_core *c, v1_ckpt *w, rb_err *err)
{
    const uint64_t ba = c->cfg.block_align;
    const uint64_t base = (uint64_t)w->target * c->container_bytes;
    int rc = 0;
    if (c->ml.wipe_sbs) {
        /* The device held the log format: neither superblock may outlive this checkpoint. */
        w->outcome = -1;
        rc = rb_core_ml_wipe_superblocks(c, err);
    }
    if (rc == 0)
        rc = rb_core_flush(c, err);
    if (rc < 0)
        return rc;
    w->outcome = -1; /* from here on the container may have changed */
    rc = v1_ckpt_put(c, base + ba, w->payload, w->padded, err);
    if (rc == 0)
        rc = rb_core_flush(c, err);
    if (rc == 0)
        rc = v1_ckpt_put(c, base, w->hdr, ba, err);
    if (rc == 0)
        rc = rb_core_flush(c, err);
    return rc;
}

/* w is durable: its container lists exactly the slots it named. */
static void v1_ckpt_done(rb_core *c, const v1_ckpt *w, size_t room_n)
{
    pthread_mutex_lock(&c->mu);
    settle_refs_locked(c, w->target, 1);
    c->ref_unknown &= (uint8_t)~0x4u; /* a log the device held is gone (wipe_sbs) */
    c->meta_seq = w->seq;
    c->good_container = w->target;
    if (w->dirty_snap > c->persisted)
        c->persisted = w->dirty_snap;
    c->ckpt_written++;
    if (room_n)
        c->room_ckpts++;
    pthread_mutex_unlock(&c->mu);
}

/*
 * One format v1 checkpoint. Durability: flush, container payload, flush, container header,
 * flush. The first flush makes every payload and slot header that the checkpoint lists durable
 * before anything points at them; the second keeps a header from reaching the medium before its
 * payload; the third makes the checkpoint itself durable before its slots are trusted as settled
 * (settle_refs_locked).
 */
int rb_core_ckpt_v1_locked(rb_core *c, int force, size_t room_n, int want_target, rb_err *err)
{
    if (!v1_ckpt_wanted(c, force, room_n, want_target))
        return 0;
    v1_ckpt w;
    memset(&w, 0, sizeof w);
    int rc = v1_ckpt_snapshot(c, want_target, &w, err);
    if (rc == 0) {
        rc = v1_ckpt_images(c, &w, err);
        if (rc == 0)
            rc = v1_ckpt_write(c, &w, err);
        if (rc == 0) {
            v1_ckpt_done(c, &w, room_n);
            rc = 1;
        } else {
            pthread_mutex_lock(&c->mu);
            settle_refs_locked(c, w.target, w.outcome);
            pthread_mutex_unlock(&c->mu);
            rb_core_set_ckpt_error(c, err);
        }
    }
    free(w.payload);
    free(w.hdr);
    rb_buf_free(&w.b);
    return rc;
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

/* What recovery learned of the two containers before it applies one. */
typedef struct v1_rec {
    rb_ckpt_header h[2];
    int ours[2]; /* a valid header of this core's magic and version */
    /* A header that was ours before something damaged it: 1 the magic one byte off, or a
     * payload still there under a header zeroed or overwritten; 2 the magic intact and a field
     * out of range (its seq may be readable). Not loadable, but not a blank container either. */
    int damaged[2];
    uint64_t max_seq;     /* the newest valid header's */
    int bad;              /* newer container that could not be read, -1 none */
    char bad_why[96];     /* why */
    uint8_t *bad_payload; /* its bytes, when they could be read (CRC mismatch) */
} v1_rec;

/* Judge container k's header, read into hb (ba bytes). */
static void v1_judge_header(rb_core *c, v1_rec *r, int k, uint8_t *hb)
{
    const uint64_t ba = c->cfg.block_align;
    rb_ckpt_header *h = &r->h[k];
    rb_err e;
    if (rb_core_dev_read(c, (uint64_t)k * c->container_bytes, hb, ba, ba, ba, 0, &e) < 0)
        return;
    rb_ckpt_header_decode(hb, h);
    int magic_off = 0;
    for (int i = 0; i < 8; i++)
        magic_off += h->magic[i] != c->cfg.meta_magic[i];
    if (magic_off != 0 || h->version != c->cfg.meta_version || h->payload_len == 0 || h->payload_len > c->payload_cap) {
        r->damaged[k] = magic_off == 0 ? 2 : magic_off == 1 ? 1 : 0;
        /* A header zeroed or overwritten over a checkpoint payload that is still there. */
        static const char doc[] = "{\"version\":";
        if (!r->damaged[k] && rb_core_dev_read(c, (uint64_t)k * c->container_bytes + ba, hb, ba, ba, ba, 0, &e) == 0 &&
            memcmp(hb, doc, sizeof doc - 1) == 0)
            r->damaged[k] = 1;
        return;
    }
    r->ours[k] = 1;
    c->ref_unknown |= (uint8_t)(1u << k);
    if (h->seq > r->max_seq)
        r->max_seq = h->seq;
}

/* Read and judge both container headers. 0 or -ENOMEM. */
static int v1_read_headers(rb_core *c, v1_rec *r, rb_err *err)
{
    const uint64_t ba = c->cfg.block_align;
    uint8_t *hb = rb_alloc_aligned(ba, ba, err);
    if (!hb)
        return -ENOMEM;
    for (int k = 0; k < 2; k++)
        v1_judge_header(c, r, k, hb);
    free(hb);
    return 0;
}

/* Note container k as the newer one that could not be read, unless one already is. */
static int v1_note_bad(v1_rec *r, int k, const char *why)
{
    if (r->bad >= 0)
        return 0;
    r->bad = k;
    snprintf(r->bad_why, sizeof r->bad_why, "%s", why);
    return 1;
}

/* Container k's payload into *out (block-aligned, CRC checked). 1 read, 0 unreadable (noted
 * in r), -ENOMEM. */
static int v1_read_payload(rb_core *c, v1_rec *r, int k, uint8_t **out, rb_err *err)
{
    const uint64_t ba = c->cfg.block_align;
    uint64_t padded = rb_round_up(r->h[k].payload_len, ba);
    uint8_t *p = rb_alloc_aligned(ba, padded, err);
    if (!p)
        return -ENOMEM;
    rb_err e;
    if (rb_core_dev_read(c, (uint64_t)k * c->container_bytes + ba, p, padded, padded, padded, 0, &e) < 0) {
        char why[96];
        snprintf(why, sizeof why, "read failed: %.60s", e.msg);
        v1_note_bad(r, k, why);
        free(p);
        return 0;
    }
    if (rb_crc32(p, r->h[k].payload_len) != r->h[k].crc) {
        if (v1_note_bad(r, k, "payload CRC mismatch"))
            r->bad_payload = p;
        else
            free(p);
        return 0;
    }
    *out = p;
    return 1;
}

/* Container k was applied, and the newer container bad could not be: the outcome FALLBACK,
 * told with what the older checkpoint lacks. */
static void v1_report_fallback(rb_core *c, const v1_rec *r, int k)
{
    const int bad = r->bad;
    c->rec_outcome = RB_REC_FALLBACK;
    c->rec_rejected_seq = r->damaged[bad] == 1 ? 0 : r->h[bad].seq;
    c->rec_lost = r->damaged[bad] ? -1 : count_lost(c, r->bad_payload, r->h[bad].payload_len);
    char lost[96];
    if (c->rec_lost >= 0)
        snprintf(lost, sizeof lost, "%lld entries it listed are not in the older one", (long long)c->rec_lost);
    else
        snprintf(lost, sizeof lost, "entries written between the two checkpoints are lost");
    char bad_seq[32] = "seq unknown";
    if (r->damaged[bad] != 1)
        snprintf(bad_seq, sizeof bad_seq, "seq %llu", (unsigned long long)r->h[bad].seq);
    snprintf(c->ckpt_error, sizeof c->ckpt_error,
             "newest checkpoint (container %d, %s) is unreadable (%s); recovered the older checkpoint "
             "(container %d, seq %llu): %s",
             bad, bad_seq, r->bad_why, k, (unsigned long long)r->h[k].seq, lost);
}

/* Container k was applied: the outcome LOADED, or FALLBACK when a newer one was unreadable
 * or the other header damaged. */
static void v1_loaded(rb_core *c, v1_rec *r, int k)
{
    c->recovery_loaded = 1;
    c->good_container = k;
    c->rec_seq = r->h[k].seq;
    /* The other header was damaged: it may have been the newer checkpoint (its seq field is no
     * more trustworthy than the rest of it). */
    if (r->damaged[k ^ 1])
        v1_note_bad(r, k ^ 1, "damaged header");
    if (r->bad < 0)
        c->rec_outcome = RB_REC_LOADED;
    else
        v1_report_fallback(c, r, k);
}

/* Read, check and apply container k. 1 applied or rejected (the outcome set), 0 unreadable
 * (the next container is tried), <0 error. */
static int v1_try_container(rb_core *c, v1_rec *r, int k, rb_err *err)
{
    uint8_t *p = NULL;
    int rc = v1_read_payload(c, r, k, &p, err);
    if (rc <= 0)
        return rc;
    rb_err why;
    rb_err_clear(&why);
    c->apply_container = k;
    rc = rb_core_apply_state_json(c, (const char *)p, r->h[k].payload_len, &why);
    c->apply_container = -1;
    free(p);
    if (rc < 0) {
        *err = why;
        return rc;
    }
    if (rc == 0) {
        c->rec_outcome = RB_REC_REJECTED;
        snprintf(c->ckpt_error, sizeof c->ckpt_error, "metadata payload rejected by checks: %.200s", why.msg);
        return 1;
    }
    v1_loaded(c, r, k);
    return 1;
}

/* No container could be read: the outcome UNREADABLE, the index empty. */
static void v1_report_unreadable(rb_core *c, v1_rec *r)
{
    c->rec_outcome = RB_REC_UNREADABLE;
    c->rec_rejected_seq = r->max_seq;
    if (r->bad < 0)
        snprintf(r->bad_why, sizeof r->bad_why, "damaged header");
    snprintf(c->ckpt_error, sizeof c->ckpt_error,
             "the device holds a checkpoint (newest seq %llu) but none is readable (%s); started with an "
             "empty index",
             (unsigned long long)r->max_seq, r->bad_why);
}

/*
 * Recovery: the newest container of ours whose payload reads back with its CRC is applied; an
 * older one only when every newer one is unreadable (a fallback, reported with what it lost).
 * Until its entries are known, each container of ours keeps every slot out of use
 * (ref_unknown); a put that finds no slot then writes a checkpoint over it (make_room in
 * rb_core_put.c).
 */
int rb_core_v1_recover(rb_core *c, rb_err *err)
{
    v1_rec r;
    memset(&r, 0, sizeof r);
    r.bad = -1;
    if (v1_read_headers(c, &r, err) < 0)
        return -ENOMEM;
    /* Resume the sequence from the newest valid header, whatever happens to its payload. */
    c->meta_seq = r.max_seq;
    if (!r.ours[0] && !r.ours[1] && !r.damaged[0] && !r.damaged[1]) {
        c->rec_outcome = RB_REC_BLANK;
        return 0;
    }
    if (!c->cfg.load_checkpoint_on_init) {
        c->rec_outcome = RB_REC_SKIPPED;
        return 0;
    }
    const int newest = r.ours[1] && (!r.ours[0] || r.h[1].seq > r.h[0].seq);
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++)
        if (r.ours[newest ^ i])
            rc = v1_try_container(c, &r, newest ^ i, err);
    if (rc > 0)
        rc = 0;
    if (rc == 0 && c->rec_outcome == RB_REC_BLANK) /* no container was loaded or rejected */
        v1_report_unreadable(c, &r);
    free(r.bad_payload);
    return rc;
}
