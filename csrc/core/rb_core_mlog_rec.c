/*
 * rb_core_mlog_rec.c - recovery from the log-structured metadata format at open
 * (docs/metadata-log.md): the base and the log groups after it replayed into the index by
 * rb_mlog_read's callbacks (records are idempotent per slot), then the allocator, the writer's
 * state (generation, epoch, ring) and the outcome taken from what was read. A device that holds
 * no superblock of ours is left to format v1's recovery.
 */
#include "rb_core_mlog_int.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- recovery -------------------------------------------------------------------------- */

typedef struct ml_rec {
    rb_core *c;
    uint32_t *slot_pos; /* per slot: index position + 1, 0 = free */
    uint32_t cap_slots;
    uint32_t *cls_map; /* disk class id -> core class id (UINT32_MAX unknown) */
    uint32_t cap_map, max_disk;
    uint32_t top; /* slot high-water mark seen */
    uint64_t loaded, skipped, replaced;
    int geometry_bad, layout_bad, oom;
    rb_err why;
} ml_rec;

static int slot_room(ml_rec *r, uint32_t slot);

static int rec_sb(void *ctx, const rb_mlog_sb *sb)
{
    ml_rec *r = ctx;
    rb_core *c = r->c;
    static const char *const names[] = {"block_align", "header_bytes", "slot_bytes", "meta_total_bytes"};
    const uint64_t have[] = {sb->block_align, sb->header_bytes, sb->slot_bytes, sb->meta_total_bytes};
    const uint64_t want[] = {c->cfg.block_align, c->cfg.header_bytes, c->cfg.slot_bytes, c->cfg.meta_total_bytes};
    for (int i = 0; i < 4; i++) {
        if (have[i] != want[i]) {
            rb_err_set(&r->why, RB_ERR_VALUE, EINVAL,
                       "Device metadata %s mismatch (the device says %llu, the configuration %llu); ignoring "
                       "metadata",
                       names[i], (unsigned long long)have[i], (unsigned long long)want[i]);
            r->geometry_bad = 1;
            return 1;
        }
    }
    const uint32_t have_sc = sb->size_classes > 1 ? sb->size_classes : 1;
    if (have_sc != c->n_sc) {
        /* an extent's slots sit at its class's offsets: refuse rather than read them elsewhere */
        rb_err_set(&r->why, RB_ERR_VALUE, EINVAL,
                   "size class mismatch: the device's extents are laid out for size_classes=%u, the configuration "
                   "says size_classes=%u: reopen with the device's value",
                   have_sc, c->n_sc);
        r->layout_bad = 1;
        return 1;
    }
    if (sb->extent_stride != c->ext_stride) {
        /* The slots are not where this configuration would look: refuse, never read one at the
         * wrong offset (0: the identity layout, extents off or whole slots). */
        rb_err_set(&r->why, RB_ERR_VALUE, EINVAL,
                   "extent layout mismatch: the device's slots are laid out for extent_bytes=%llu, the "
                   "configuration says extent_bytes=%llu%s (slot_bytes=%llu; 0 = slots back to back): reopen with "
                   "the device's value",
                   (unsigned long long)sb->extent_stride, (unsigned long long)c->cfg.extent_bytes,
                   strcmp(c->ext_source ? c->ext_source : "setting", "setting") ? " (resolved from auto)" : "",
                   (unsigned long long)sb->slot_bytes);
        r->layout_bad = 1;
        return 1;
    }
    r->top = sb->base.next_slot < c->max_slots ? sb->base.next_slot : c->max_slots;
    /* A bulk load: room for the base's entries and slots up front (best effort). */
    uint64_t n = sb->base.n_entries < c->max_slots ? sb->base.n_entries : c->max_slots;
    (void)rb_idx_reserve(&c->index, (uint32_t)n);
    if (r->top)
        (void)slot_room(r, r->top - 1);
    return 0;
}

/* The metadata a class fragment's document o names into mi (the dimensions into *dims, which
 * the caller frees): ndim -2 when a dimension is not an integer, -1 with no shape. */
static void frag_meta(struct json_object *o, rb_meta_in *mi, int64_t **dims)
{
    struct json_object *v;
    mi->ndim = -1;
    mi->npos = -1;
    if (json_object_object_get_ex(o, "shape", &v) && json_object_get_type(v) == json_type_array) {
        size_t n = json_object_array_length(v);
        *dims = malloc((n ? n : 1) * sizeof(**dims));
        if (*dims) {
            mi->ndim = (int64_t)n;
            for (size_t i = 0; i < n; i++)
                if (rb_json_as_i64(json_object_array_get_idx(v, i), &(*dims)[i]) < 0)
                    mi->ndim = -2;
        }
        mi->dims = *dims;
    }
    if (json_object_object_get_ex(o, "dtype", &v) && json_object_get_type(v) == json_type_string) {
        mi->dtype = json_object_get_string(v);
        mi->dtype_len = (size_t)json_object_get_string_len(v);
    }
    if (json_object_object_get_ex(o, "fmt", &v) && json_object_get_type(v) == json_type_string) {
        mi->fmt = json_object_get_string(v);
        mi->fmt_len = (size_t)json_object_get_string_len(v);
    }
}

/* *id: the core class of fragment k ("shape":...,"dtype":...,"fmt":...), interned, or
 * UINT32_MAX when it does not read. mu held. 0 or -ENOMEM. */
static int frag_class(rb_core *c, const rb_mlog_class *k, uint32_t *id)
{
    char *doc = malloc((size_t)k->frag_len + 3);
    if (!doc)
        return -ENOMEM;
    doc[0] = '{';
    memcpy(doc + 1, k->frag, k->frag_len);
    doc[k->frag_len + 1] = '}';
    doc[k->frag_len + 2] = 0;
    struct json_object *o = rb_json_parse(doc, (size_t)k->frag_len + 2);
    free(doc);
    *id = UINT32_MAX;
    if (o && json_object_get_type(o) == json_type_object) {
        rb_meta_in mi = {0};
        int64_t *dims = NULL;
        frag_meta(o, &mi, &dims);
        if (mi.ndim >= -1)
            *id = rb_core_intern_class(c, &mi);
        free(dims);
    }
    if (o)
        json_object_put(o);
    return 0;
}

/* A class record of the base or the log read back into the core's table. */
static int rec_cls(void *ctx, const rb_mlog_class *k)
{
    ml_rec *r = ctx;
    uint32_t id;
    if (ml_u32_room(&r->cls_map, &r->cap_map, k->id, 16, 0xff) < 0 || frag_class(r->c, k, &id) < 0) {
        r->oom = 1;
        return -ENOMEM;
    }
    r->cls_map[k->id] = id; /* UINT32_MAX: its entries are skipped */
    if (k->id + 1 > r->max_disk)
        r->max_disk = k->id + 1;
    return 0;
}

static int slot_room(ml_rec *r, uint32_t slot)
{
    if (ml_u32_room(&r->slot_pos, &r->cap_slots, slot, 4096, 0) < 0) {
        r->oom = 1;
        return -ENOMEM;
    }
    return 0;
}

/* Whatever the index holds at slot (mu held) leaves it. */
static void rec_vacate(ml_rec *r, uint32_t slot)
{
    rb_core *c = r->c;
    if (slot >= r->cap_slots || r->slot_pos[slot] == 0)
        return;
    uint32_t p = r->slot_pos[slot] - 1;
    rb_ent *e = &c->index.ents[p];
    if (e->flags & RB_ENT_UNVERIFIED)
        c->n_unverified--;
    rb_idx_remove_at(&c->index, p);
    r->slot_pos[slot] = 0;
    r->replaced++;
}

/* An entry of the base or a PUT record: slot S holds this key now. mu held. */
static int rec_apply_put_h(ml_rec *r, const rb_mlog_ent *e, uint32_t h);

static int rec_apply_put(ml_rec *r, const rb_mlog_ent *e)
{
    return rec_apply_put_h(r, e, rb_idx_hash(e->key, e->key_len));
}

static int rec_apply_put_h(ml_rec *r, const rb_mlog_ent *e, uint32_t h)
{
    rb_core *c = r->c;
    uint32_t cls = e->cls < r->cap_map ? r->cls_map[e->cls] : UINT32_MAX;
    if (e->slot >= c->max_slots || e->size == 0 || e->size > c->slot_cap || cls == UINT32_MAX) {
        rec_vacate(r, e->slot); /* the slot no longer holds what it held; nor this key */
        r->skipped++;
        return 0;
    }
    if (slot_room(r, e->slot) < 0)
        return -ENOMEM;
    rec_vacate(r, e->slot);
    uint32_t old = rb_idx_find(&c->index, e->key, e->key_len, h);
    if (old != UINT32_MAX) /* the key moved */
        rec_vacate(r, c->index.ents[old].slot);
    uint32_t p = rb_idx_insert(&c->index, e->key, e->key_len, h, e->pos, e->npos);
    if (p == UINT32_MAX) {
        r->oom = 1;
        return -ENOMEM;
    }
    rb_ent *x = &c->index.ents[p];
    x->slot = e->slot;
    x->size = e->size;
    x->cls = cls;
    if (e->flags & RB_MLOG_ENT_SUM) {
        x->checksum = e->checksum;
        x->flags |= RB_ENT_HAS_SUM;
    }
    x->flags |= RB_ENT_UNVERIFIED; /* judged at its first load, or by validation */
    c->n_unverified++;
    r->slot_pos[e->slot] = p + 1;
    if (e->slot + 1 > r->top)
        r->top = e->slot + 1;
    return 0;
}

static int rec_ent(void *ctx, const rb_mlog_ent *e)
{
    return rec_apply_put(ctx, e);
}

/* A chunk's entries: hashed and their table lines prefetched a window ahead of the inserts
 * (each insert's probe is otherwise a cache miss into a table of millions). */
static int rec_ents(void *ctx, const rb_mlog_ent *e, size_t n)
{
    ml_rec *r = ctx;
    enum { W = 32 };
    uint32_t hs[W];
    for (size_t i0 = 0; i0 < n; i0 += W) {
        size_t m = n - i0 < W ? n - i0 : W;
        for (size_t j = 0; j < m; j++) {
            hs[j] = rb_idx_hash(e[i0 + j].key, e[i0 + j].key_len);
            rb_idx_prefetch(&r->c->index, hs[j]);
        }
        for (size_t j = 0; j < m; j++) {
            int rc = rec_apply_put_h(r, &e[i0 + j], hs[j]);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

static int rec_rec(void *ctx, uint64_t seq, const rb_mlog_rec *x)
{
    (void)seq;
    ml_rec *r = ctx;
    int rc = 0;
    if (x->type == RB_MLOG_PUT)
        rc = rec_apply_put(r, &x->ent);
    else if (x->type == RB_MLOG_FREE)
        rec_vacate(r, x->slot);
    return rc;
}

static int rec_damage(void *ctx, const rb_mlog_damage *d)
{
    (void)ctx;
    (void)d;
    return 0; /* counted from the result */
}

static int ml_pread(void *ctx, uint64_t off, void *buf, size_t len, rb_err *err)
{
    rb_core *c = ctx;
    return rb_core_dev_read(c, off, buf, len, len, len, 0, err);
}

/* Read the region (superblocks only, unless the log format is on and loading is asked) into
 * the index under mu, the callbacks rebuilding it into r. As rb_mlog_read. */
static int ml_read(rb_core *c, ml_rec *r, rb_mlog_read_result *res, rb_err *err)
{
    rb_mlw *m = &c->ml;
    rb_mlog_read_opts o = {.block_align = c->cfg.block_align,
                           .meta_total_bytes = c->cfg.meta_total_bytes,
                           .threads = c->cfg.recovery_read_threads > 4 ? 4 : c->cfg.recovery_read_threads,
                           .sb_only = !m->on || !c->cfg.load_checkpoint_on_init};
    memset(r, 0, sizeof(*r));
    r->c = c;
    rb_err_clear(&r->why);
    rb_mlog_read_cb cb = {
        .ctx = r, .sb = rec_sb, .cls = rec_cls, .ent = rec_ent, .ents = rec_ents, .rec = rec_rec, .damage = rec_damage};
    memset(res, 0, sizeof(*res));
    /* mu is held across the read: its callbacks run on this thread and change the index (at
     * open, before any other thread can use the core; the device reads take no core lock). */
    uint64_t t0 = rb_now_ns();
    pthread_mutex_lock(&c->mu);
    c->index.hold_compact++; /* slot_pos holds positions */
    int rc = rb_mlog_read(&o, ml_pread, c, o.sb_only ? NULL : &cb, res, err);
    c->index.hold_compact--;
    pthread_mutex_unlock(&c->mu);
    m->rec_read_ns = rb_now_ns() - t0;
    return rc;
}

/* 1 when the region holds the log format: a superblock read, or one damaged or without a
 * readable base. */
static int ml_ours(const rb_mlog_read_result *res)
{
    return res->found || res->sb_state[0] == RB_MLOG_SB_DAMAGED || res->sb_state[1] == RB_MLOG_SB_DAMAGED ||
           res->sb_state[0] == RB_MLOG_SB_NOBASE || res->sb_state[1] == RB_MLOG_SB_NOBASE;
}

/* Format v1 configured (meta_format='v1'): 0 with no log on the device; with one, 1 when told
 * to start empty (format v1 takes the device over), else an error. */
static int ml_found_under_v1(rb_core *c, int ours, rb_err *err)
{
    if (!ours)
        return 0;
    if (!c->cfg.load_checkpoint_on_init) {
        /* Its first checkpoint clears both superblocks first; until then no slot is reused
         * (the log may list any). */
        pthread_mutex_lock(&c->mu);
        c->ml.wipe_sbs = 1;
        c->ref_unknown |= 0x4u;
        c->rec_outcome = RB_REC_SKIPPED;
        pthread_mutex_unlock(&c->mu);
        return 1;
    }
    return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                      "the device holds the log-structured metadata format, which meta_format='v1' does not "
                      "write: set meta_format='log' (LMCache 0.5.6's own core cannot read this device). "
                      "device_path='%s'",
                      c->path);
}

/* The outcome when the log is not read (REJECTED already, SKIPPED, UNREADABLE), or -1 when it
 * was read. */
static int ml_unread_outcome(rb_core *c, const rb_mlog_read_result *res, int outcome)
{
    if (outcome < 0 && !c->cfg.load_checkpoint_on_init)
        outcome = RB_REC_SKIPPED;
    if (outcome < 0 && !res->found) {
        outcome = RB_REC_UNREADABLE;
        snprintf(c->ckpt_error, sizeof c->ckpt_error,
                 "the device holds log-format metadata but no superblock with a readable base (%.150s; %.150s); "
                 "started with an empty index",
                 res->sb_why[0].msg, res->sb_why[1].msg);
    }
    return outcome;
}

/* Not read (outcome): a new generation is written at the first checkpoint, and until then no
 * slot is reused (what is on the device may list any). */
static void ml_start_fresh(rb_core *c, const ml_rec *r, const rb_mlog_read_result *res, int outcome)
{
    pthread_mutex_lock(&c->mu);
    rb_idx_clear(&c->index);
    c->n_unverified = 0;
    c->ref_unknown |= 0x4u;
    c->rec_outcome = outcome;
    c->rec_rejected_seq = res->found ? res->sb.sb_seq : 0;
    if (outcome == RB_REC_REJECTED)
        snprintf(c->ckpt_error, sizeof c->ckpt_error, "metadata rejected by checks: %.400s", r->why.msg);
    c->ml.state = RB_ML_FRESH;
    pthread_mutex_unlock(&c->mu);
}

/* 1 when what was read lost something to damage: log groups skipped, base chunks dropped,
 * the log cut short by a read error (rb_mlog_read_lost). */
static int ml_damaged(const rb_mlog_read_result *res)
{
    return rb_mlog_read_lost(res);
}

/* The writer's state from what was read: the superblock, the generation, this writer's epoch
 * (above every one the log and the superblock name, the latter covering a writer that crashed
 * before any of its groups survived; used up: a new generation), the ring, the counters. mu
 * held. */
static void ml_adopt_log_locked(rb_core *c, const rb_mlog_read_result *res)
{
    rb_mlw *m = &c->ml;
    m->sb = res->sb;
    m->sb_which = res->which;
    m->generation = res->sb.generation;
    m->epoch = (res->last_epoch > res->sb.epoch ? res->last_epoch : res->sb.epoch) + 1;
    m->epoch_claimed = 0;
    /* Epochs used up, or damage read past: the next checkpoint writes a whole base in a new
     * generation (so the damaged stretch is never read again, and what was skipped past is in
     * the base), before any group of this one. */
    if (m->epoch > RB_MLOG_EPOCH_MAX || ml_damaged(res)) {
        m->newgen = 1;
        m->need_base++;
    }
    m->last_seq = res->last_seq;
    m->head = res->head;
    m->lstart = 0;
    m->lhead = res->used;
    m->state = RB_ML_LIVE;
    /* an end mark last (a clean close), or no group: close appends none until a group follows */
    m->end_marked = res->groups == 0 || res->last_records == 0;
    m->rec_groups = res->groups;
    m->rec_records = res->records;
    m->rec_gaps = res->gaps;
    m->rec_groups_lost = res->groups_lost;
    m->rec_records_lost = res->records_lost;
    m->rec_log_end = res->log_end;
    m->rec_chunks_bad = res->base.chunks_bad;
    m->rec_entries_lost = res->base.entries_lost > 0 ? (uint64_t)res->base.entries_lost : 0;
}

/* The classes keep their ids in this generation; the next new one follows them. mu held. */
static void ml_adopt_classes_locked(rb_core *c, const ml_rec *r)
{
    rb_mlw *m = &c->ml;
    for (uint32_t d = 0; d < r->max_disk && d < r->cap_map; d++) {
        uint32_t k = r->cls_map[d];
        if (k == UINT32_MAX)
            continue;
        if (ml_u32_room(&m->cls_disk, &m->cap_cls_disk, k, 16, 0xff) < 0)
            continue;                       /* logged again under a new id when used */
        m->cls_disk[k] = d | ML_CLS_LOGGED; /* the base or a live group defines it */
    }
    m->next_disk_cls = r->max_disk;
}

/* ckpt_error for a log that went on past damage (mu held). */
static void ml_report_gaps_locked(rb_core *c, const rb_mlog_read_result *res)
{
    char recs[32] = "uncounted";
    if (res->records_lost >= 0)
        snprintf(recs, sizeof recs, "%lld", (long long)res->records_lost);
    snprintf(c->ckpt_error, sizeof c->ckpt_error,
             "metadata log damaged: group %llu at ring offset %llu (device offset %llu) failed (%.96s) and later "
             "groups follow: %llu groups lost in %llu places (records: %s), the later ones replayed%s; entries are "
             "checked against their slot headers, the next checkpoint writes a whole base",
             (unsigned long long)res->gap_seq, (unsigned long long)res->gap_at,
             (unsigned long long)(res->sb.ring.off + res->gap_at), res->gap_why.msg,
             (unsigned long long)res->groups_lost, (unsigned long long)res->gaps, recs,
             res->fallback ? "; the newest superblock is unusable" : "");
}

/* ckpt_error for a log cut short by a read error, no later group found (mu held). */
static void ml_report_ioerr_locked(rb_core *c, const rb_mlog_read_result *res)
{
    snprintf(c->ckpt_error, sizeof c->ckpt_error,
             "metadata log cut short by a read error: group %llu at ring offset %llu (device offset %llu) "
             "unreadable (%.160s), it and any group after it lost to this open%s; entries are checked against "
             "their slot headers, the next checkpoint writes a whole base in a new generation",
             (unsigned long long)(res->last_seq + 1), (unsigned long long)res->head,
             (unsigned long long)(res->sb.ring.off + res->head), res->log_why.msg,
             res->base.chunks_bad ? "; base chunks damaged too" : "");
}

/* The recovery outcome, LOADED, FALLBACK or DAMAGED (a part lost: log groups skipped past,
 * base chunks), and what was lost on the way. mu held. */
static void ml_report_locked(rb_core *c, const rb_mlog_read_result *res)
{
    c->rec_outcome = ml_damaged(res) ? RB_REC_DAMAGED : res->fallback ? RB_REC_FALLBACK : RB_REC_LOADED;
    if (res->gaps)
        ml_report_gaps_locked(c, res);
    else if (res->fallback)
        snprintf(c->ckpt_error, sizeof c->ckpt_error,
                 "the newest metadata superblock is unusable (%.150s); recovered from the other one (sequence "
                 "%llu), every entry's slot header checked%s",
                 res->sb_why[res->which ^ 1].msg, (unsigned long long)res->sb.sb_seq,
                 res->base.chunks_bad ? "; base chunks damaged too" : "");
    else if (res->log_end == RB_MLOG_END_IOERR)
        ml_report_ioerr_locked(c, res);
    else if (res->base.chunks_bad)
        snprintf(c->ckpt_error, sizeof c->ckpt_error,
                 "metadata partly unreadable: %u base chunks damaged (%lld entries lost); entries are checked "
                 "against their slot headers, the next checkpoint writes a whole base",
                 res->base.chunks_bad, (long long)res->base.entries_lost);
}

/* The index holds what was read: the allocator rebuilt (a slot no durable record lists is
 * free), the writer's state and the core's counters set. 0 or -ENOMEM. */
static int ml_adopt(rb_core *c, const ml_rec *r, const rb_mlog_read_result *res, rb_err *err)
{
    pthread_mutex_lock(&c->mu);
    if (rb_slots_reset(&c->slots, r->top) < 0) {
        pthread_mutex_unlock(&c->mu);
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    }
    if (c->n_sc > 1)
        rb_core_sc_recover_locked(c, r->slot_pos, r->cap_slots);
    for (uint32_t s = 0; s < r->top; s++)
        if (s >= r->cap_slots || r->slot_pos[s] == 0)
            rb_core_release_slot_locked(c, s);
    ml_adopt_log_locked(c, res);
    ml_adopt_classes_locked(c, r);
    c->meta_seq = res->last_seq;
    c->recovery_loaded = 1;
    c->recovery_entries_loaded = c->index.n_live;
    c->apply_skipped = r->skipped;
    c->rec_seq = res->sb.sb_seq;
    c->dirty_total = ml_damaged(res); /* then the whole base is due at the next checkpoint, or at close */
    c->persisted = 0;
    ml_report_locked(c, res);
    rb_idx_maybe_compact(&c->index);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* After the read (rc as rb_mlog_read): 0 nothing of ours (blank or format v1), 1 handled
 * (*loaded when the index now holds the log's state), <0 error. */
static int ml_settle(rb_core *c, const ml_rec *r, const rb_mlog_read_result *res, int rc, int *loaded, rb_err *err)
{
    const int ours = ml_ours(res);
    if (!c->ml.on)
        return ml_found_under_v1(c, ours, err);
    int outcome = -1;
    if (rc > 0 && r->layout_bad) {
        *err = r->why;
        return -EINVAL;
    }
    if (rc > 0 && r->geometry_bad) {
        outcome = RB_REC_REJECTED;
    } else if (rc != 0) {
        if (rc > 0)
            rc = r->oom ? -ENOMEM : -EIO;
        if (err->kind == RB_ERR_NONE)
            rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory reading the metadata log");
        return rc;
    }
    if (!ours)
        return 0;
    outcome = ml_unread_outcome(c, res, outcome);
    if (outcome >= 0) {
        ml_start_fresh(c, r, res, outcome);
        return 1;
    }
    rc = ml_adopt(c, r, res, err);
    *loaded = rc == 0;
    return rc < 0 ? rc : 1;
}

/* Validation of what was loaded, when configured, after damage or after a fallback. With the
 * periodic thread it runs there, after open has returned: every load judges its entry's header
 * until then (the same verdict), so it only decides when a bad entry leaves the index. After a
 * fallback it runs here, before any load. 1, or -ENOMEM. */
static int ml_validate(rb_core *c, int fallback, int damaged, rb_err *err)
{
    if (!c->cfg.meta_verify_on_load && !c->cfg.verify_payload_checksum && !fallback && !damaged)
        return 1;
    if (c->cfg.meta_enable_periodic && !fallback)
        c->ml.bg_validate = 1;
    else if (rb_core_validate_entries(c, 0) < 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory validating slot headers");
    return 1;
}

int rb_core_ml_recover(rb_core *c, rb_err *err)
{
    rb_mlw *m = &c->ml;
    ml_rec r;
    rb_mlog_read_result res;
    int rc = ml_read(c, &r, &res, err);
    for (int k = 0; k < 2; k++)
        if (res.sb_seq_seen[k] > m->sb_seq_seen)
            m->sb_seq_seen = res.sb_seq_seen[k];
    int loaded = 0;
    rc = ml_settle(c, &r, &res, rc, &loaded, err);
    free(r.slot_pos);
    free(r.cls_map);
    return loaded ? ml_validate(c, res.fallback, ml_damaged(&res), err) : rc;
}
