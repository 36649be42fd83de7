/*
 * rb_core_mlog.c - the core's side of the log-structured metadata format
 * (docs/metadata-log.md): the change journal, the checkpoint that writes it as log groups,
 * compaction into a new base beside the current one and the superblock switch, the first
 * format of a blank or format v1 device. Recovery from the base and the log is in
 * rb_core_mlog_rec.c.
 *
 * Durability rules:
 *   - A checkpoint flushes (every payload and header its PUT records name is durable), writes
 *     its groups at the ring's head, each flushed before the next (so a group that fails with
 *     a later one after it is damage, not a torn tail), flushes again; only then do the slots its FREE records
 *     name return to the allocator. A failed write leaves its pages queued: they are written
 *     again, the same bytes at the same ring offsets.
 *   - A base is built from the index in slices (mu taken and dropped per slice, never held for
 *     O(N) work) while groups go on being appended. It covers the log up to sequence Q, the
 *     last group closed when it began; every change after Q is in a later group, and records
 *     are idempotent per slot, so the base and the groups after Q replay to the index even
 *     where the base saw some of those changes already. Switch: flush (the base and what it
 *     names are durable), write the other superblock (base, ring start at group Q + 1),
 *     flush; then groups up to Q are dead.
 *
 * Lock order: ml.cmp_mu -> ckpt_mu -> mu.
 */
#include "rb_core_mlog_int.h"
#include "rb_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* A page is closed once its records reach this many bytes: groups stay small enough to seal
 * and write without stalling, and a torn one loses little. */
#define ML_PAGE_RAW (256u << 10)
/* Entries copied out of the index per slice while a base is built (mu held for one slice). */
#define ML_SLICE 4096u
/* Base bytes gathered before each write into the area. */
#define ML_BASE_WRITE (8u << 20)
/* zlib level of log groups. */
#define ML_GROUP_LEVEL 1

/* ---- set-up ---------------------------------------------------------------------------- */

int rb_core_ml_init(rb_core *c, rb_err *err)
{
    rb_mlw *m = &c->ml;
    pthread_mutex_init(&m->cmp_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->gap_cv, &ca);
    pthread_condattr_destroy(&ca);
    m->on = c->cfg.meta_format == RB_META_LOG;
    if (!m->on)
        return 0;
    rb_err e;
    if (rb_mlog_layout_of(c->cfg.meta_total_bytes, c->cfg.block_align, &m->lay, &e) < 0)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "meta_total_bytes=%llu is too small for the log metadata format (%s); use at least "
                          "%llu or meta_format='v1'",
                          (unsigned long long)c->cfg.meta_total_bytes, e.msg,
                          (unsigned long long)(64 * c->cfg.block_align));
    return 0;
}

static void page_free(rb_mlpage *p)
{
    if (!p)
        return;
    rb_mlog_genc_free(&p->g);
    free(p->frees);
    free(p->put_slots);
    free(p->img);
    free(p);
}

void rb_core_ml_free(rb_core *c)
{
    rb_mlw *m = &c->ml;
    for (size_t i = 0; i < m->n_pg; i++)
        page_free(m->pg[i]);
    page_free(m->lane);
    free(m->put_pend);
    free(m->pg);
    free(m->cls_disk);
    free(m->held_base);
    pthread_mutex_destroy(&m->cmp_mu);
    pthread_cond_destroy(&m->gap_cv);
}

/* 1 when a decodable superblock of ours sits at off (its region size in *meta). */
static int sb_at(rb_core *c, uint64_t off, uint8_t *blk, uint64_t span, uint64_t *meta)
{
    rb_err e;
    rb_mlog_sb sb;
    if (off + span > c->capacity || rb_core_dev_read(c, off, blk, span, span, span, 0, &e) < 0 ||
        rb_mlog_sb_decode(blk, span, &sb, &e) < 0)
        return 0;
    *meta = sb.meta_total_bytes;
    return 1;
}

uint64_t rb_core_ml_region_bytes(rb_core *c)
{
    const uint64_t ba = c->cfg.block_align, span = rb_mlog_sb_span(ba);
    /* size classes: sized for the smallest class's slots, as many ids as the layout has */
    const uint64_t one = c->cfg.size_classes > 1
                             ? rb_sc_slot_bytes(c->cfg.slot_bytes, c->cfg.header_bytes, ba, c->cfg.size_classes - 1)
                             : c->cfg.slot_bytes;
    uint64_t autosz = rb_mlog_auto_meta_total(c->capacity, one, ba), meta = 0;
    rb_err ae;
    uint8_t *blk = rb_alloc_aligned(ba, span, &ae);
    if (!blk)
        return RB_META_TOTAL_LMCACHE;
    if (sb_at(c, 0, blk, span, &meta) || sb_at(c, rb_container_bytes(RB_META_TOTAL_LMCACHE, ba), blk, span, &meta) ||
        (autosz && sb_at(c, rb_container_bytes(autosz, ba), blk, span, &meta))) {
        /* a superblock of ours says */
    } else {
        /* a v1 container header of this core's magic at either of LMCache's positions: keep
         * LMCache's region (the move to the log format keeps every slot where it is) */
        rb_err e;
        int v1 = 0;
        const uint64_t offs[2] = {0, rb_container_bytes(RB_META_TOTAL_LMCACHE, ba)};
        for (int k = 0; k < 2 && !v1; k++)
            v1 = offs[k] + span <= c->capacity && rb_core_dev_read(c, offs[k], blk, span, span, span, 0, &e) == 0 &&
                 memcmp(blk, c->cfg.meta_magic, 8) == 0;
        meta = v1 || autosz == 0 ? RB_META_TOTAL_LMCACHE : autosz;
    }
    free(blk);
    return meta;
}

/* ---- the journal (mu held) ------------------------------------------------------------- */

/* Close the open page, if it has records: it gets the next log sequence. */
static void close_page_locked(rb_core *c)
{
    rb_mlw *m = &c->ml;
    if (m->n_pg == 0)
        return;
    rb_mlpage *p = m->pg[m->n_pg - 1];
    if (p->seq != 0 || (p->g.n_records == 0 && p->n_frees == 0))
        return;
    p->seq = ++m->last_seq;
}

/* Room in the page queue for one more page. 0 or -ENOMEM. mu held. */
static int pg_room_locked(rb_mlw *m)
{
    if (m->n_pg < m->cap_pg)
        return 0;
    size_t nc = m->cap_pg ? m->cap_pg * 2 : 16;
    rb_mlpage **np = realloc(m->pg, nc * sizeof(*np));
    if (!np)
        return -ENOMEM;
    m->pg = np;
    m->cap_pg = nc;
    return 0;
}

static rb_mlpage *new_page(void)
{
    rb_mlpage *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    rb_mlog_genc_init(&p->g);
    p->t0_ns = rb_now_ns();
    return p;
}

static rb_mlpage *open_page_locked(rb_core *c)
{
    rb_mlw *m = &c->ml;
    if (m->n_pg && m->pg[m->n_pg - 1]->seq == 0) {
        rb_mlpage *p = m->pg[m->n_pg - 1];
        if (p->g.body.len < ML_PAGE_RAW)
            return p;
        close_page_locked(c);
    }
    rb_mlpage *p = pg_room_locked(m) < 0 ? NULL : new_page();
    if (!p)
        return NULL;
    m->pg[m->n_pg++] = p;
    /* Every RB_ML_PENDING_MAX bytes of full pages waiting: the periodic thread writes them,
     * busy or not (a checkpoint that failed is tried again at the next such step). */
    size_t waiting = m->n_pg - 1, step = RB_ML_PENDING_MAX / ML_PAGE_RAW;
    if (waiting && waiting % step == 0)
        rb_core_ml_kick(c, RB_KICK_WRITE);
    return p;
}

/* ---- the deletes' lane (mu held) --------------------------------------------------------
 *
 * A checkpoint writes the closed pages in order, after a flush that makes every payload their
 * PUT records name durable. Through the page cache that flush writes back every page the
 * puts dirtied, and the slots an eviction freed wait for it. The FREE record of a deleted key
 * whose slot no waiting page names in a PUT record goes instead to the lane, a page of its
 * own that a checkpoint writes first, synced by itself (rb_core_meta_write_synced), before
 * the flush (write_lane_first). Replay reaches the same index with it moved ahead of the
 * waiting pages: its records are FREEs of slots none of them names (a PUT of the slot is
 * there only while put_pend says so; a later PUT of it cannot be journaled while the slot is
 * held for the lane's group; a FREE of it no other page can hold), and a FREE of slot S
 * vacates S whatever key moved meanwhile (a PUT of the deleted key again, in a waiting page,
 * moves it to another slot). A crash after the lane and before the pages loses only changes
 * that no checkpoint had acknowledged. The lane goes ahead only where nothing of the queue is
 * on the device yet, its sequence the first of the waiting pages (theirs move up by one), and
 * never during a base's build (whose covered sequences are fixed); otherwise it is closed
 * after the pages like any page (lane_to_end_locked). */

static int put_pend_has(const rb_mlw *m, uint32_t slot)
{
    size_t w = slot / 64;
    return w < m->put_pend_words && ((m->put_pend[w] >> (slot % 64)) & 1u);
}

/* Page p now holds a PUT record of slot: its bit set and the slot listed on the page, whose
 * drop clears the bit. Out of memory for either: the lane is off for good. */
static void note_put_slot_locked(rb_core *c, rb_mlpage *p, uint32_t slot)
{
    rb_mlw *m = &c->ml;
    size_t w = slot / 64;
    if (w >= m->put_pend_words) {
        size_t nw = m->put_pend_words ? m->put_pend_words : 1024;
        while (nw <= w)
            nw *= 2;
        uint64_t *np = realloc(m->put_pend, nw * sizeof(*np));
        if (!np) {
            m->lane_off = 1;
            return;
        }
        memset(np + m->put_pend_words, 0, (nw - m->put_pend_words) * sizeof(*np));
        m->put_pend = np;
        m->put_pend_words = nw;
    }
    m->put_pend[w] |= 1ull << (slot % 64);
    /* unlisted, a base's rebuild of the map would lose the bit while the page still waits */
    if (rb_slot_list_push(&p->put_slots, &p->n_put_slots, &p->cap_put_slots, slot) < 0)
        m->lane_off = 1;
}

static void clear_put_slots_locked(rb_mlw *m, const rb_mlpage *p)
{
    for (size_t i = 0; i < p->n_put_slots; i++) {
        uint32_t s = p->put_slots[i];
        if (s / 64 < m->put_pend_words)
            m->put_pend[s / 64] &= ~(1ull << (s % 64));
    }
}

/* After a base: the bits of the pages still waiting, and no other. */
static void put_pend_rebuild_locked(rb_mlw *m)
{
    if (m->put_pend_words)
        memset(m->put_pend, 0, m->put_pend_words * sizeof(*m->put_pend));
    for (size_t i = 0; i < m->n_pg; i++)
        for (size_t j = 0; j < m->pg[i]->n_put_slots; j++) {
            uint32_t s = m->pg[i]->put_slots[j];
            if (s / 64 < m->put_pend_words)
                m->put_pend[s / 64] |= 1ull << (s % 64);
        }
}

/* The lane, for the FREE record of slot, or NULL: the ordinary page takes it. */
static rb_mlpage *lane_for_locked(rb_core *c, uint32_t slot)
{
    rb_mlw *m = &c->ml;
    if (!m->lane_want || m->lane_off || m->state != RB_ML_LIVE || m->need_base || put_pend_has(m, slot))
        return NULL;
    if (m->lane && m->lane->g.body.len >= ML_PAGE_RAW)
        return NULL;
    if (!m->lane)
        m->lane = new_page();
    return m->lane;
}

static int lane_waits(const rb_mlw *m)
{
    return m->lane && m->lane->n_frees > 0;
}

uint64_t rb_core_ml_held_taken_locked(const rb_core *c)
{
    const rb_mlw *m = &c->ml;
    uint64_t n = 0;
    for (size_t i = 0; i < m->n_pg; i++)
        n += m->pg[i]->taken ? m->pg[i]->n_frees : 0;
    return n;
}

/* The lane, closed after the pages (before an open page left empty) with the next sequence.
 * 0, or -ENOMEM (it stays the lane). */
static int lane_to_end_locked(rb_core *c)
{
    rb_mlw *m = &c->ml;
    if (!lane_waits(m))
        return 0;
    if (pg_room_locked(m) < 0)
        return -ENOMEM;
    size_t at = m->n_pg && m->pg[m->n_pg - 1]->seq == 0 ? m->n_pg - 1 : m->n_pg;
    memmove(m->pg + at + 1, m->pg + at, (m->n_pg - at) * sizeof(*m->pg));
    m->pg[at] = m->lane;
    m->n_pg++;
    m->lane->seq = ++m->last_seq;
    m->lane = NULL;
    return 0;
}

/* The lane moved to the head of the queue with the first waiting sequence, the closed pages'
 * moving up by one, when it may go ahead of them (above); NULL when not. */
static rb_mlpage *lane_to_front_locked(rb_core *c)
{
    rb_mlw *m = &c->ml;
    if (!lane_waits(m) || m->state != RB_ML_LIVE || m->need_base || !m->epoch_claimed || m->cmp_active)
        return NULL;
    for (size_t i = 0; i < m->n_pg; i++)
        if (m->pg[i]->img || m->pg[i]->placed)
            return NULL;
    if (pg_room_locked(m) < 0)
        return NULL;
    uint64_t seq = m->n_pg && m->pg[0]->seq ? m->pg[0]->seq : m->last_seq + 1;
    for (size_t i = 0; i < m->n_pg; i++)
        if (m->pg[i]->seq)
            m->pg[i]->seq++;
    m->last_seq++;
    rb_mlpage *l = m->lane;
    l->seq = seq;
    memmove(m->pg + 1, m->pg, m->n_pg * sizeof(*m->pg));
    m->pg[0] = l;
    m->n_pg++;
    m->lane = NULL;
    return l;
}

void rb_core_ml_forget_frees_locked(rb_core *c)
{
    rb_mlw *m = &c->ml;
    for (size_t i = 0; i <= m->n_pg; i++) {
        rb_mlpage *p = i < m->n_pg ? m->pg[i] : m->lane;
        if (p) {
            m->n_held -= p->n_frees;
            p->n_frees = 0;
        }
    }
    m->n_held_base = 0;
}

void rb_core_free_lane_off(rb_core *c)
{
    pthread_mutex_lock(&c->mu);
    c->ml.lane_off = 1;
    pthread_mutex_unlock(&c->mu);
}

/* The oldest page (the lane included) holding a change no durable group has, or NULL. */
static const rb_mlpage *oldest_page_locked(const rb_core *c)
{
    const rb_mlw *m = &c->ml;
    const rb_mlpage *l = lane_waits(m) ? m->lane : NULL;
    for (size_t i = 0; i < m->n_pg; i++)
        if (m->pg[i]->g.n_records || m->pg[i]->n_frees)
            return l && l->t0_ns < m->pg[i]->t0_ns ? l : m->pg[i];
    return l;
}

static uint64_t period_ns(const rb_core *c)
{
    uint64_t s = c->cfg.meta_checkpoint_interval_sec ? c->cfg.meta_checkpoint_interval_sec : 1;
    return s * 1000000000ull;
}

int rb_core_ml_overdue_locked(const rb_core *c, uint64_t now_ns)
{
    const rb_mlw *m = &c->ml;
    if (!m->on)
        return 0;
    if (m->need_base) /* a change the journal lost: its age is unknown */
        return 1;
    const rb_mlpage *p = oldest_page_locked(c);
    if (p && now_ns - p->t0_ns >= period_ns(c))
        return 1;
    uint64_t raw = m->lane ? m->lane->g.body.len : 0;
    for (size_t i = 0; i < m->n_pg; i++)
        raw += m->pg[i]->g.body.len;
    return raw >= RB_ML_PENDING_MAX;
}

uint64_t rb_core_ml_wait_ns(rb_core *c, uint64_t period)
{
    if (!c->ml.on)
        return period;
    pthread_mutex_lock(&c->mu);
    const rb_mlpage *p = oldest_page_locked(c);
    uint64_t t0 = p ? p->t0_ns : 0;
    pthread_mutex_unlock(&c->mu);
    uint64_t now = rb_now_ns();
    /* Overdue already (the checkpoint just tried failed, or the period changed): the next
     * attempt one period on, never a busy loop. */
    if (!t0 || t0 + period <= now)
        return period;
    return t0 + period - now;
}

size_t rb_core_ml_journal_bytes_locked(const rb_core *c)
{
    const rb_mlw *m = &c->ml;
    size_t b = m->cap_pg * sizeof(*m->pg) + (size_t)m->cap_cls_disk * sizeof(*m->cls_disk) +
               m->cap_held_base * sizeof(*m->held_base) + m->put_pend_words * sizeof(*m->put_pend);
    for (size_t i = 0; i <= m->n_pg; i++) {
        const rb_mlpage *p = i < m->n_pg ? m->pg[i] : m->lane;
        if (p)
            b += sizeof(*p) + p->g.body.cap + p->cap_frees * sizeof(*p->frees) +
                 p->cap_put_slots * sizeof(*p->put_slots) + (p->img ? p->img_len : 0);
    }
    return b;
}

uint64_t rb_core_ml_pending_records_locked(const rb_core *c)
{
    const rb_mlw *m = &c->ml;
    uint64_t n = m->lane ? m->lane->g.n_records : 0;
    for (size_t i = 0; i < m->n_pg; i++)
        n += m->pg[i]->g.n_records;
    return n;
}

/* The journal could not take a change: the next checkpoint writes a whole base instead. */
static void journal_lost_locked(rb_core *c)
{
    c->ml.need_base++;
    c->ml.journal_lost++;
}

/* A slot that must wait for the next base (its FREE could not be journaled). */
static void hold_for_base_locked(rb_core *c, uint32_t slot)
{
    rb_mlw *m = &c->ml;
    /* out of memory: kept out of use until the next recovery, never reused unsafely */
    (void)rb_slot_list_push(&m->held_base, &m->n_held_base, &m->cap_held_base, slot);
}

/* Class k's id in this generation, given now if it has none. UINT32_MAX when out of memory. */
static uint32_t class_id_locked(rb_core *c, uint32_t k)
{
    rb_mlw *m = &c->ml;
    if (ml_u32_room(&m->cls_disk, &m->cap_cls_disk, k, 16, 0xff) < 0)
        return UINT32_MAX;
    if (m->cls_disk[k] == UINT32_MAX) {
        if (m->next_disk_cls >= ML_CLS_LOGGED)
            return UINT32_MAX;
        m->cls_disk[k] = m->next_disk_cls++;
    }
    return ML_CLS_ID(m->cls_disk[k]);
}

/* The id class k has in this generation's records, a CLASS record appended first when neither
 * the base nor a live group defines it. UINT32_MAX when the record cannot be appended. */
static uint32_t disk_class_locked(rb_core *c, uint32_t k)
{
    rb_mlw *m = &c->ml;
    uint32_t id = class_id_locked(c, k);
    if (id == UINT32_MAX || (m->cls_disk[k] & ML_CLS_LOGGED))
        return id;
    rb_mlpage *p = open_page_locked(c);
    if (!p)
        return UINT32_MAX;
    const rb_class *cl = c->cls[k];
    rb_mlog_class rc = {.id = id, .frag_len = (uint32_t)cl->json_len, .frag = cl->json};
    rb_err e;
    if (rb_mlog_genc_class(&p->g, &rc, &e) < 0)
        return UINT32_MAX;
    m->cls_disk[k] |= ML_CLS_LOGGED;
    return id;
}

static void ent_to_mlog(const rb_ent *e, uint32_t disk_cls, rb_mlog_ent *me)
{
    me->key = rb_ent_key(e);
    me->key_len = e->key_len;
    me->slot = e->slot;
    me->size = e->size;
    me->cls = disk_cls;
    me->flags = (e->flags & RB_ENT_HAS_SUM) ? RB_MLOG_ENT_SUM : 0;
    me->checksum = (e->flags & RB_ENT_HAS_SUM) ? e->checksum : 0;
    me->npos = rb_ent_npos(e);
    me->pos = me->npos > 0 ? rb_ent_pos(e) : NULL;
}

void rb_core_ml_put_locked(rb_core *c, const rb_ent *e)
{
    uint32_t dk = disk_class_locked(c, e->cls);
    rb_mlpage *p = dk == UINT32_MAX ? NULL : open_page_locked(c);
    if (!p) {
        journal_lost_locked(c);
        return;
    }
    rb_mlog_ent me;
    ent_to_mlog(e, dk, &me);
    rb_err er;
    int rc = rb_mlog_genc_put(&p->g, &me, &er);
    if (rc == -E2BIG) { /* the page's positions are used up: the next page takes it */
        close_page_locked(c);
        p = open_page_locked(c);
        rc = p ? rb_mlog_genc_put(&p->g, &me, &er) : -ENOMEM;
    }
    if (rc < 0) {
        journal_lost_locked(c);
    } else {
        p->n_puts++;
        note_put_slot_locked(c, p, e->slot);
    }
}

void rb_core_ml_free_locked(rb_core *c, uint32_t slot)
{
    rb_mlw *m = &c->ml;
    rb_mlpage *p = lane_for_locked(c, slot);
    if (!p)
        p = open_page_locked(c);
    rb_err er;
    if (p && p->n_frees == p->cap_frees) {
        size_t nc = p->cap_frees ? p->cap_frees * 2 : 64;
        uint32_t *np = realloc(p->frees, nc * sizeof(*np));
        if (np) {
            p->frees = np;
            p->cap_frees = nc;
        }
    }
    if (!p || p->n_frees == p->cap_frees || rb_mlog_genc_free_slot(&p->g, slot, &er) < 0) {
        journal_lost_locked(c);
        hold_for_base_locked(c, slot);
        return;
    }
    p->frees[p->n_frees++] = slot;
    m->n_held++;
}

/* Release the slots a page's FREE records name (its group is durable, or a durable base
 * covers it). mu held. */
static void release_page_locked(rb_core *c, rb_mlpage *p)
{
    for (size_t i = 0; i < p->n_frees; i++)
        rb_core_free_slot_locked(c, p->frees[i]);
    c->ml.n_held -= p->n_frees;
    p->n_frees = 0;
}

/* Drop the first n pages of the queue. mu held. */
static void drop_pages_locked(rb_core *c, size_t n)
{
    rb_mlw *m = &c->ml;
    for (size_t i = 0; i < n; i++) {
        release_page_locked(c, m->pg[i]);
        clear_put_slots_locked(m, m->pg[i]);
        page_free(m->pg[i]);
    }
    if (n == 0)
        return;
    memmove(m->pg, m->pg + n, (m->n_pg - n) * sizeof(*m->pg));
    m->n_pg -= n;
}

/* ---- group writes ---------------------------------------------------------------------- */

static int write_sb(rb_core *c, const rb_mlog_sb *sb, int which, rb_err *err);

static int seal_page(rb_core *c, rb_mlpage *p, rb_err *err)
{
    if (p->img)
        return 0;
    rb_mlw *m = &c->ml;
    const uint64_t ba = c->cfg.block_align;
    rb_buf b = {0};
    p->g.epoch = (uint16_t)m->epoch;
    int rc = rb_mlog_genc_seal(&p->g, m->generation, p->seq, ba, ML_GROUP_LEVEL, &b, err);
    if (rc < 0) {
        rb_buf_free(&b);
        return rc;
    }
    p->img = rb_alloc_aligned(ba, b.len, err);
    if (!p->img) {
        rb_buf_free(&b);
        return -ENOMEM;
    }
    memcpy(p->img, b.data, b.len);
    p->img_len = b.len;
    rb_buf_free(&b);
    return 0;
}

/* Choose where the page's group goes (once: a retry writes it there again). mu held.
 * -ENOSPC when the ring has no room for it until a compaction frees some. */
static int place_page_locked(rb_core *c, rb_mlpage *p, rb_err *err)
{
    if (p->placed)
        return 0;
    rb_mlw *m = &c->ml;
    const uint64_t len = m->lay.ring.len;
    uint64_t waste = 0, pos = m->head;
    if (p->img_len > len - m->head) {
        waste = len - m->head;
        pos = 0;
    }
    if (m->lhead + waste + p->img_len - m->lstart > len) {
        m->ring_full++;
        m->cmp_urgent = 1;
        rb_core_ml_kick(c, RB_KICK_COMPACT);
        return rb_err_set(err, RB_ERR_RUNTIME, ENOSPC,
                          "the metadata log is full (%llu of %llu bytes live, a group of %zu bytes waits): a "
                          "compaction must run first",
                          (unsigned long long)(m->lhead - m->lstart), (unsigned long long)len, p->img_len);
    }
    p->pos = pos;
    p->lpos = m->lhead + waste;
    p->placed = 1;
    m->end_marked = 0; /* the log's last group now (an end mark sets it again once durable) */
    m->head = pos + p->img_len;
    if (m->head == len)
        m->head = 0;
    uint64_t was = m->lhead - m->lstart;
    m->lhead = p->lpos + p->img_len;
    if (was * 2 <= len && (m->lhead - m->lstart) * 2 > len)
        rb_core_ml_kick(c, RB_KICK_COMPACT); /* past half full: compaction is due now, not at the next period */
    if (m->cmp_active && !m->cmp_placed && p->seq == m->cmp_q + 1) {
        m->cmp_placed = 1;
        m->cmp_pos = p->pos;
        m->cmp_lpos = p->lpos;
    }
    return 0;
}

/* The closed pages, copied into *pages (they stay put until this writer drops them); *k their
 * number, *dirty_snap the dirty_total they cover. With none, the changes cancelled out and are
 * counted persisted. 0, or -ENOMEM. Takes and drops mu. */
static int take_closed_pages(rb_core *c, rb_mlpage ***pages, size_t *k, uint64_t *dirty_snap)
{
    rb_mlw *m = &c->ml;
    pthread_mutex_lock(&c->mu);
    if (m->need_base) {
        pthread_mutex_unlock(&c->mu);
        return -EAGAIN;
    }
    close_page_locked(c);
    if (lane_to_end_locked(c) < 0) {
        pthread_mutex_unlock(&c->mu);
        return -ENOMEM;
    }
    size_t n = m->n_pg;
    if (n && m->pg[n - 1]->seq == 0)
        n--;
    *k = n;
    *dirty_snap = c->dirty_total;
    *pages = NULL;
    if (n == 0 && *dirty_snap > c->persisted)
        c->persisted = *dirty_snap; /* nothing journaled: the changes cancelled out */
    if (n)
        *pages = malloc(n * sizeof(**pages));
    if (n && *pages)
        memcpy(*pages, m->pg, n * sizeof(**pages));
    for (size_t i = 0; *pages && i < n; i++)
        m->pg[i]->taken = 1;
    pthread_mutex_unlock(&c->mu);
    return n && !*pages ? -ENOMEM : 0;
}

/* Whether any of the pages holds a PUT record (a payload that must be durable first). */
static int pages_name_payloads(rb_core *c, rb_mlpage **pages, size_t k)
{
    int any = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < k && !any; i++)
        any = pages[i]->n_puts > 0;
    pthread_mutex_unlock(&c->mu);
    return any;
}

/* Before the groups: this process's first group claims its epoch in a superblock (the current
 * one with the next sequence, in the other place), made durable by the flush that makes every
 * payload the groups name durable. Groups of FREE records alone (the evictor's deletes) name
 * no payload: without a claim they need no flush first. 0 or <0. */
static int groups_prologue(rb_core *c, rb_mlpage **pages, size_t k, rb_err *err)
{
    rb_mlw *m = &c->ml;
    int rc = 0;
    rb_mlog_sb claim;
    int claiming = !m->epoch_claimed;
    if (!claiming && !pages_name_payloads(c, pages, k))
        return 0;
    if (claiming) {
        pthread_mutex_lock(&c->mu);
        claim = m->sb;
        claim.sb_seq = m->sb_seq_seen + 1;
        claim.epoch = m->epoch;
        pthread_mutex_unlock(&c->mu);
        rc = write_sb(c, &claim, m->sb_which ^ 1, err);
    }
    if (rc == 0)
        rc = rb_core_flush(c, err);
    if (rc == 0 && claiming) {
        pthread_mutex_lock(&c->mu);
        m->sb = claim;
        m->sb_which ^= 1;
        m->sb_seq_seen = claim.sb_seq;
        m->epoch_claimed = 1;
        pthread_mutex_unlock(&c->mu);
    }
    return rc;
}

/* Seal, place and write pages[0..k) at the ring's head, each group durable before the next is
 * written: with ranged (rb_core_meta_can_sync_range), each written with a sync of its own
 * bytes (the prologue's flush made the payloads durable; the other pages the puts dirtied need
 * not be written back), else a flush between two groups (the caller flushes after the last);
 * *bytes and *records what they hold. 0 or <0 (the first failure). */
static int write_pages(rb_core *c, rb_mlpage **pages, size_t k, int ranged, uint64_t *bytes, uint64_t *records,
                       rb_err *err)
{
    rb_mlw *m = &c->ml;
    for (size_t i = 0; i < k; i++) {
        rb_mlpage *p = pages[i];
        int rc = seal_page(c, p, err);
        if (rc < 0)
            return rc;
        pthread_mutex_lock(&c->mu);
        rc = place_page_locked(c, p, err);
        pthread_mutex_unlock(&c->mu);
        if (rc < 0)
            return rc;
        uint64_t off = m->lay.ring.off + p->pos;
        rc = ranged ? rb_core_meta_write_synced(c, off, p->img, p->img_len, err)
                    : rb_core_meta_write(c, off, p->img, p->img_len, err);
        if (rc < 0) {
            rb_core_explain_device_error(c, "metadata log write", off, err);
            return rc;
        }
        *bytes += p->img_len;
        *records += p->g.n_records;
        /* each group durable before the next is written: a group that fails its checks with a
         * later one after it is then damage, never a torn tail (rb_mlog_read's gaps) */
        if (!ranged && i + 1 < k && (rc = rb_core_flush(c, err)) < 0)
            return rc;
    }
    return 0;
}

/* The ring had no room for a group (place_page_locked): a compaction must run first. */
static int ring_full_err(const rb_err *e)
{
    return e->kind == RB_ERR_RUNTIME && e->errnum == ENOSPC;
}

/* The groups could not be written (err says why). A failed write or flush: entries the trust
 * layer dropped were journaled after their PUT records, in a later page, and the two groups
 * are not atomic together, so a whole base, written next, says at once what is durable. A
 * full ring only waits for a compaction. */
static void groups_failed(rb_core *c, const rb_err *err)
{
    if (!ring_full_err(err)) {
        pthread_mutex_lock(&c->mu);
        c->ml.need_base++;
        pthread_mutex_unlock(&c->mu);
    }
    rb_core_set_ckpt_error(c, err);
}

/* k groups of bytes holding records were written. mu held. */
static void count_groups_locked(rb_mlw *m, size_t k, uint64_t bytes, uint64_t records)
{
    m->groups_written += k;
    m->group_bytes += bytes;
    m->last_group_bytes = bytes;
    m->last_group_records = records;
}

/* The first k pages are durable: dropped (their FREE slots released), the counters moved. */
static void groups_done(rb_core *c, size_t k, uint64_t dirty_snap, uint64_t bytes, uint64_t records)
{
    rb_mlw *m = &c->ml;
    pthread_mutex_lock(&c->mu);
    drop_pages_locked(c, k);
    if (dirty_snap > c->persisted)
        c->persisted = dirty_snap;
    c->ckpt_written++;
    c->meta_seq = m->last_seq;
    count_groups_locked(m, k, bytes, records);
    pthread_mutex_unlock(&c->mu);
}

/* The deletes' lane written ahead of the waiting pages (ckpt_mu held; lane_to_front_locked
 * says when it may), synced by itself: no flush, since its group names no payload and this
 * process's epoch is claimed. Durable, it is dropped and its slots are released; the waiting
 * pages keep their changes, so nothing counts as persisted. 1 written, 0 not now, <0 failed
 * (the lane stays at the queue's head, placed, for the next checkpoint to write again). */
static int write_lane_first(rb_core *c, rb_err *err)
{
    rb_mlw *m = &c->ml;
    if (!rb_core_meta_can_sync_range(c))
        return 0;
    pthread_mutex_lock(&c->mu);
    rb_mlpage *p = lane_to_front_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (!p)
        return 0;
    uint64_t bytes = 0, records = 0;
    int rc = write_pages(c, &p, 1, 1, &bytes, &records, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    if (p->seq > c->meta_seq)
        c->meta_seq = p->seq;
    if (m->n_pg && m->pg[0] == p) /* the queue's head only moves under ckpt_mu */
        drop_pages_locked(c, 1);  /* p is freed */
    count_groups_locked(m, 1, bytes, records);
    m->lane_groups++;
    m->lane_records += records;
    pthread_mutex_unlock(&c->mu);
    return 1;
}

/* ckpt_mu let go by a group writer: a lane writer waiting for it or for a gap looks again. */
static void ckpt_release(rb_core *c)
{
    pthread_mutex_unlock(&c->ckpt_mu);
    pthread_cond_broadcast(&c->ml.gap_cv);
}

/* Until this thread holds ckpt_mu (0) or may write the lane in another writer's flush gap (1,
 * gap_lane then set). A writer that holds ckpt_mu without opening a gap (a base, the groups
 * after their flush) is waited for: woken when a group writer lets it go, and looked at again
 * every millisecond for the others. */
static int ckpt_or_gap(rb_core *c)
{
    rb_mlw *m = &c->ml;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (m->flush_gap && !m->gap_lane) {
            m->gap_lane = 1;
            pthread_mutex_unlock(&c->mu);
            return 1;
        }
        pthread_mutex_unlock(&c->mu);
        if (pthread_mutex_trylock(&c->ckpt_mu) == 0)
            return 0;
        pthread_mutex_lock(&c->mu);
        if (m->flush_gap && !m->gap_lane)
            continue;
        struct timespec ts;
        rb_deadline_in(&ts, 1000000);
        (void)pthread_cond_timedwait(&m->gap_cv, &c->mu, &ts);
    }
}

void rb_core_ml_wait_writer(rb_core *c)
{
    pthread_mutex_lock(&c->ckpt_mu);
    ckpt_release(c);
}

int rb_core_ml_release_lane(rb_core *c, rb_err *err)
{
    int gap = ckpt_or_gap(c);
    int rc = write_lane_first(c, err);
    if (gap) {
        pthread_mutex_lock(&c->mu);
        c->ml.gap_lane = 0;
        c->ml.gap_lanes += rc == 1;
        pthread_cond_broadcast(&c->ml.gap_cv);
        pthread_mutex_unlock(&c->mu);
    } else {
        ckpt_release(c);
    }
    if (rc < 0)
        groups_failed(c, err);
    /* a full ring: the lane waits at the queue's head for the checkpoint that compacts */
    return rc < 0 && ring_full_err(err) ? 0 : rc;
}

/* After a flush gap, mu held: lanes that writers in the gap put at the queue's head and could
 * not write (they stay there, maybe placed) go first among the pages, as they would have been
 * taken had they been there before: *pages and *k grow by them. 0, or -ENOMEM. */
static int take_lanes_left_locked(rb_core *c, rb_mlpage ***pages, size_t *k)
{
    rb_mlw *m = &c->ml;
    size_t j = 0;
    while (j < m->n_pg && m->pg[j] != (*pages)[0])
        j++;
    if (j == 0 || j == m->n_pg) /* the latter cannot be: the queue's head moves under ckpt_mu */
        return 0;
    rb_mlpage **np = realloc(*pages, (*k + j) * sizeof(*np));
    if (!np)
        return -ENOMEM;
    memmove(np + j, np, *k * sizeof(*np));
    for (size_t i = 0; i < j; i++) {
        np[i] = m->pg[i];
        np[i]->taken = 1;
    }
    *pages = np;
    *k += j;
    return 0;
}

/* groups_prologue, its flush a gap for the lane (rb_mlw.flush_gap) once the epoch is claimed
 * (before that, the claim's superblock goes first, and no lane may go ahead of it). 0, <0
 * failed, or 1: a flush failed meanwhile (a lane's synced write in the gap): the trust layer
 * dropped entries whose FREEs are journaled after the pages, so a whole base goes first. The
 * test hook's delay (rb_core_set_ckpt_delay_ms) is spent in the gap, as a slow flush. */
static int prologue_in_gap(rb_core *c, rb_mlpage ***pages, size_t *k, rb_err *err)
{
    rb_mlw *m = &c->ml;
    pthread_mutex_lock(&c->mu);
    int gap = m->epoch_claimed && rb_core_meta_can_sync_range(c);
    m->flush_gap = gap;
    uint64_t need0 = m->need_base;
    pthread_mutex_unlock(&c->mu);
    if (gap)
        pthread_cond_broadcast(&m->gap_cv);
    uint32_t delay = atomic_load(&c->ckpt_delay_ms);
    if (delay)
        usleep(delay * 1000u);
    int rc = groups_prologue(c, *pages, *k, err);
    if (!gap)
        return rc;
    pthread_mutex_lock(&c->mu);
    m->flush_gap = 0;
    while (m->gap_lane)
        pthread_cond_wait(&m->gap_cv, &c->mu);
    if (rc == 0 && m->need_base != need0)
        rc = 1;
    if (rc == 0 && take_lanes_left_locked(c, pages, k) < 0) {
        m->need_base++; /* the pages cannot follow the lanes left at the head: a base says it all */
        rc = rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Write the closed pages (ckpt_mu held, state LIVE). 1 written, 0 none to write, <0 failed;
 * -EAGAIN, nothing written, while a whole base must come first (need_base: after a failed
 * flush the pages may hold the PUT of an entry it dropped, whose FREE is in a later page that
 * a crash between the two groups would lose; the base says at once what is durable). */
static int write_groups(rb_core *c, rb_err *err)
{
    rb_mlpage **pages;
    size_t k;
    uint64_t dirty_snap;
    /* the deletes' lane first: its slots come back before the flush of the pages' payloads */
    int lane = write_lane_first(c, err);
    if (lane < 0) {
        groups_failed(c, err);
        return lane;
    }
    int tk = take_closed_pages(c, &pages, &k, &dirty_snap);
    if (tk == -EAGAIN)
        return rb_err_set(err, RB_ERR_RUNTIME, EAGAIN,
                          "metadata log groups not written: a whole base must be written first (a flush "
                          "failed, or the journal lost a change)");
    if (tk < 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    if (k == 0)
        return lane;
    uint64_t bytes = 0, records = 0;
    int ranged = rb_core_meta_can_sync_range(c);
    int rc = prologue_in_gap(c, &pages, &k, err);
    if (rc == 0)
        rc = write_pages(c, pages, k, ranged, &bytes, &records, err);
    if (rc == 0 && !ranged)
        rc = rb_core_flush(c, err);
    if (rc != 0) {
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; i < k; i++)
            pages[i]->taken = 0; /* they wait, in the queue, for the next checkpoint */
        pthread_mutex_unlock(&c->mu);
    }
    free(pages);
    if (rc == 1)
        return rb_err_set(err, RB_ERR_RUNTIME, EAGAIN,
                          "metadata log groups not written: a flush failed while they waited, and a whole "
                          "base must be written first");
    if (rc < 0) {
        groups_failed(c, err);
        return rc;
    }
    groups_done(c, k, dirty_snap, bytes, records);
    return 1;
}

/* ---- bases ----------------------------------------------------------------------------- */

typedef struct ml_pair {
    uint32_t slot, pos;
} ml_pair;

/* Sort by slot: two passes of 16-bit radix (slots are distinct 32-bit values). */
static int sort_pairs(ml_pair *a, size_t n)
{
    ml_pair *t = malloc((n ? n : 1) * sizeof(*t));
    size_t *cnt = calloc(65536, sizeof(*cnt));
    if (!t || !cnt) {
        free(t);
        free(cnt);
        return -ENOMEM;
    }
    for (int pass = 0; pass < 2; pass++) {
        const int sh = pass * 16;
        memset(cnt, 0, 65536 * sizeof(*cnt));
        for (size_t i = 0; i < n; i++)
            cnt[(a[i].slot >> sh) & 0xffff]++;
        size_t sum = 0;
        for (size_t b = 0; b < 65536; b++) {
            size_t v = cnt[b];
            cnt[b] = sum;
            sum += v;
        }
        for (size_t i = 0; i < n; i++)
            t[cnt[(a[i].slot >> sh) & 0xffff]++] = a[i];
        memcpy(a, t, n * sizeof(*a));
    }
    free(t);
    free(cnt);
    return 0;
}

/* One entry copied out of the index (its key and positions in the slice's arena). */
typedef struct ml_copy {
    rb_mlog_ent e;
    size_t key_at, pos_at;
} ml_copy;

typedef struct ml_base {
    uint64_t q; /* the log sequence it covers */
    uint32_t next_slot;
    uint32_t n_cls_core; /* core classes that existed when it began */
    uint64_t len;        /* bytes on the device (padded) */
    uint64_t n_entries;
    uint32_t n_chunks;
    int area;
    int stopped;       /* the build stopped because the core is closing (ML_BB_STOP_ON_CLOSE) */
    uint32_t wb_epoch; /* the core's failed flushes when the build began */
} ml_base;

/* Write the bytes the encoder has produced into the area (all of them when final, else whole
 * blocks of at least ML_BASE_WRITE). */
static int base_drain(rb_core *c, rb_mlog_benc *be, const rb_mlog_area *area, uint64_t *written, uint8_t **bounce,
                      int final, rb_err *err)
{
    const uint64_t ba = c->cfg.block_align;
    size_t have = be->out.len;
    if (!final && have < ML_BASE_WRITE)
        return 0;
    size_t n = final ? have : have / ba * ba;
    if (n == 0)
        return 0;
    if (*written + n > area->len)
        return rb_err_set(err, RB_ERR_RUNTIME, EFBIG,
                          "the index does not fit a base area of the metadata region (%llu bytes): use a larger "
                          "meta_total_bytes",
                          (unsigned long long)area->len);
    if (!*bounce) {
        *bounce = rb_alloc_aligned(ba, ML_BASE_WRITE + ba * 2 + (final ? rb_round_up(n, ba) : 0), err);
        if (!*bounce)
            return -ENOMEM;
    }
    size_t done = 0;
    while (done < n) {
        size_t part = n - done > ML_BASE_WRITE ? ML_BASE_WRITE : n - done;
        size_t wlen = rb_round_up(part, ba);
        memcpy(*bounce, be->out.data + done, part);
        memset(*bounce + part, 0, wlen - part);
        uint64_t off = area->off + *written;
        int rc = rb_core_meta_write(c, off, *bounce, wlen, err);
        if (rc < 0) {
            rb_core_explain_device_error(c, "metadata base write", off, err);
            return rc;
        }
        *written += part;
        done += part;
    }
    rb_mlog_benc_consume(be, n);
    return 0;
}

/* One base being built (build_base). */
typedef struct base_build {
    rb_core *c;
    ml_base *out;
    uint8_t *used;   /* per core class that existed when it began: an entry uses it */
    uint32_t n_ents; /* index positions when it began */
    ml_pair *pairs;  /* live entries: slot and index position */
    size_t n_pairs, cap_pairs;
    rb_mlog_class *tab; /* the class table, ids ascending */
    char *frags;        /* its fragments */
    uint32_t n_tab;
    rb_mlog_benc be;
    int have_be;
    ml_copy *cp;      /* one slice of entries copied out of the index */
    rb_buf arena;     /* their keys and positions */
    uint8_t *bounce;  /* block-aligned write buffer */
    uint64_t written; /* bytes written into the area */
    int flags;        /* ML_BB_* */
} base_build;

/* build_base's flags: the caller holds no ckpt_mu, so due groups are written between slices;
 * the build stops (-ECANCELED) once the core is closing (the periodic thread's compaction:
 * close's own checkpoint compacts if it must). */
#define ML_BB_MEANWHILE 1
#define ML_BB_STOP_ON_CLOSE 2

/* Begin under mu: the open page closed (Q = its sequence), the generation's classes to be
 * defined again by the base, the positions frozen (hold_compact). 0, or -ENOMEM before any of
 * that. */
static int base_begin(base_build *bb)
{
    rb_core *c = bb->c;
    rb_mlw *m = &c->ml;
    ml_base *out = bb->out;
    pthread_mutex_lock(&c->mu);
    close_page_locked(c);
    /* the deletes' lane too: the base covers its records as any page's before Q (an index
     * replaced at run time may give its slots to other keys, which its FREEs after the base
     * would vacate) */
    if (lane_to_end_locked(c) < 0) {
        pthread_mutex_unlock(&c->mu);
        return -ENOMEM;
    }
    out->q = m->last_seq;
    out->wb_epoch = c->wb_epoch;
    out->next_slot = c->slots.next_slot < c->usable_slots ? c->slots.next_slot : c->usable_slots;
    out->n_cls_core = c->n_cls;
    /* The base defines the classes its entries use, and nothing older survives it: a change
     * journaled from now on logs its class again when it is not one of those. */
    for (uint32_t k = 0; k < m->cap_cls_disk; k++)
        if (m->cls_disk[k] != UINT32_MAX)
            m->cls_disk[k] &= ~ML_CLS_LOGGED;
    bb->used = calloc(out->n_cls_core ? out->n_cls_core : 1, 1);
    if (!bb->used) {
        pthread_mutex_unlock(&c->mu);
        return -ENOMEM;
    }
    bb->n_ents = c->index.n_ents;
    bb->cap_pairs = c->index.n_live;
    c->index.hold_compact++;
    m->cmp_active = 1;
    m->cmp_placed = 0;
    m->cmp_q = out->q;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* The live entries of index positions [p0, p1) that the base covers onto bb->pairs. mu held.
 * 0 or -ENOMEM. */
static int collect_slice_locked(base_build *bb, uint32_t p0, uint32_t p1)
{
    const rb_core *c = bb->c;
    for (uint32_t p = p0; p < p1; p++) {
        const rb_ent *e = &c->index.ents[p];
        if ((e->flags & RB_ENT_DEAD) || e->slot >= bb->out->next_slot || e->cls >= bb->out->n_cls_core)
            continue; /* put after Q began: in a later group */
        if (bb->n_pairs == bb->cap_pairs) {
            size_t nc = bb->cap_pairs * 2 + 1024;
            ml_pair *np = realloc(bb->pairs, nc * sizeof(*np));
            if (!np)
                return -ENOMEM;
            bb->pairs = np;
            bb->cap_pairs = nc;
        }
        bb->pairs[bb->n_pairs].slot = e->slot;
        bb->pairs[bb->n_pairs].pos = p;
        bb->n_pairs++;
        bb->used[e->cls] = 1;
    }
    return 0;
}

/* Step 1: which positions hold live entries, slice by slice (mu per slice). 0 or <0. */
static int base_collect(base_build *bb, rb_err *err)
{
    rb_core *c = bb->c;
    bb->pairs = malloc((bb->cap_pairs ? bb->cap_pairs : 1) * sizeof(*bb->pairs));
    if (!bb->pairs)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    for (uint32_t p0 = 0; p0 < bb->n_ents; p0 += 65536) {
        pthread_mutex_lock(&c->mu);
        uint32_t p1 = p0 + 65536 < bb->n_ents ? p0 + 65536 : bb->n_ents;
        if (p1 > c->index.n_ents)
            p1 = c->index.n_ents; /* cleared meanwhile (a state applied at run time) */
        int rc = collect_slice_locked(bb, p0, p1);
        pthread_mutex_unlock(&c->mu);
        if (rc < 0)
            return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    }
    return 0;
}

/* An id in the generation for every class the entries use, now defined by the base (and by
 * the live log before it: every class an entry uses was logged when the entry was); counted
 * into bb->n_tab and *frag_bytes. mu held. 0 or -ENOMEM. */
static int class_ids_locked(base_build *bb, size_t *frag_bytes)
{
    rb_core *c = bb->c;
    rb_mlw *m = &c->ml;
    for (uint32_t k = 0; k < bb->out->n_cls_core; k++) {
        if (!bb->used[k])
            continue;
        if (class_id_locked(c, k) == UINT32_MAX)
            return -ENOMEM;
        *frag_bytes += c->cls[k]->json_len;
        bb->n_tab++;
        m->cls_disk[k] |= ML_CLS_LOGGED;
    }
    return 0;
}

/* bb->tab and bb->frags filled with the classes the entries use. mu held. */
static void class_table_fill_locked(base_build *bb)
{
    const rb_core *c = bb->c;
    size_t at = 0;
    uint32_t t_i = 0;
    for (uint32_t k = 0; k < bb->out->n_cls_core; k++) {
        if (!bb->used[k])
            continue;
        memcpy(bb->frags + at, c->cls[k]->json, c->cls[k]->json_len);
        bb->tab[t_i].id = ML_CLS_ID(c->ml.cls_disk[k]);
        bb->tab[t_i].frag = bb->frags + at;
        bb->tab[t_i].frag_len = (uint32_t)c->cls[k]->json_len;
        at += c->cls[k]->json_len;
        t_i++;
    }
}

/* The class table: the classes the entries use, with their ids (given now if need be),
 * ascending by id. 0 or <0. */
static int base_class_table(base_build *bb, rb_err *err)
{
    rb_core *c = bb->c;
    size_t frag_bytes = 0;
    pthread_mutex_lock(&c->mu);
    int rc = class_ids_locked(bb, &frag_bytes);
    if (rc == 0) {
        bb->tab = calloc(bb->n_tab ? bb->n_tab : 1, sizeof(*bb->tab));
        bb->frags = malloc(frag_bytes ? frag_bytes : 1);
        if (!bb->tab || !bb->frags)
            rc = -ENOMEM;
    }
    if (rc == 0)
        class_table_fill_locked(bb);
    pthread_mutex_unlock(&c->mu);
    if (rc < 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    /* ids are handed out in order, but sort anyway (the encoder wants them ascending) */
    rb_mlog_class *tab = bb->tab;
    for (uint32_t i = 1; i < bb->n_tab; i++)
        for (uint32_t j = i; j > 0 && tab[j - 1].id > tab[j].id; j--) {
            rb_mlog_class t = tab[j];
            tab[j] = tab[j - 1];
            tab[j - 1] = t;
        }
    return 0;
}

/* Copy entry e into k, its key and positions into the arena (positions 8-byte aligned: they
 * are read as int64_t). mu held. */
static void copy_entry_locked(base_build *bb, const rb_ent *e, ml_copy *k)
{
    static const char pad[8];
    rb_buf *arena = &bb->arena;
    ent_to_mlog(e, ML_CLS_ID(bb->c->ml.cls_disk[e->cls]), &k->e);
    k->key_at = arena->len;
    rb_buf_put(arena, k->e.key, k->e.key_len);
    if (k->e.npos > 0) {
        rb_buf_put(arena, pad, (8 - arena->len % 8) % 8);
        k->pos_at = arena->len;
        rb_buf_put(arena, (const char *)k->e.pos, (size_t)k->e.npos * 8);
    } else {
        k->pos_at = arena->len;
    }
}

/* Copy pairs [i0, i1) still live into bb->cp (mu taken for the slice). Returns how many. */
static size_t copy_slice(base_build *bb, size_t i0, size_t i1)
{
    rb_core *c = bb->c;
    size_t nc = 0;
    bb->arena.len = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = i0; i < i1; i++) {
        uint32_t p = bb->pairs[i].pos;
        if (p >= c->index.n_ents)
            continue;
        const rb_ent *e = &c->index.ents[p];
        if ((e->flags & RB_ENT_DEAD) || e->slot != bb->pairs[i].slot)
            continue; /* deleted since step 1: its FREE is in a group after Q */
        copy_entry_locked(bb, e, &bb->cp[nc++]);
    }
    pthread_mutex_unlock(&c->mu);
    return nc;
}

/* Hand the nc copied entries to the encoder. 0 or <0. */
static int encode_slice(base_build *bb, size_t nc, rb_err *err)
{
    for (size_t j = 0; j < nc; j++) {
        ml_copy *k = &bb->cp[j];
        k->e.key = bb->arena.data + k->key_at;
        k->e.pos = k->e.npos > 0 ? (const int64_t *)(bb->arena.data + k->pos_at) : NULL;
        int rc = rb_mlog_benc_add(&bb->be, &k->e, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Step 3: encode, a slice of entries copied out under mu at a time, and write into area. */
static int closing(rb_core *c)
{
    pthread_mutex_lock(&c->mu);
    int closed = c->closed;
    pthread_mutex_unlock(&c->mu);
    return closed;
}

/* Between two slices of a base that takes seconds (millions of entries), the changes made
 * meanwhile go on being written as groups when a checkpoint is due (rb_core_ckpt_due_locked:
 * the log's age and size bounds hold during a compaction too). Not once the ring is full: the
 * groups wait for this compaction then; nor while a whole base must come first (need_base,
 * which write_groups checks again): those wait for the next checkpoint's. A failure is recorded
 * as any checkpoint's (and a failed flush makes switch_base refuse this base). */
static void groups_meanwhile(base_build *bb)
{
    rb_core *c = bb->c;
    if (!(bb->flags & ML_BB_MEANWHILE))
        return;
    pthread_mutex_lock(&c->mu);
    int due = c->ml.state == RB_ML_LIVE && !c->closed && !c->ml.cmp_urgent && !c->ml.need_base &&
              rb_core_ckpt_due_locked(c, 0, 0);
    pthread_mutex_unlock(&c->mu);
    if (!due)
        return;
    rb_err e;
    pthread_mutex_lock(&c->ckpt_mu);
    (void)write_groups(c, &e);
    ckpt_release(c);
}

static int base_encode(base_build *bb, const rb_mlog_area *area, rb_err *err)
{
    rb_core *c = bb->c;
    const uint64_t ba = c->cfg.block_align;
    ml_base *out = bb->out;
    int rc = rb_mlog_benc_init(&bb->be, c->ml.generation, out->q, out->next_slot, bb->tab, bb->n_tab, NULL, err);
    if (rc < 0)
        return rc;
    bb->have_be = 1;
    bb->cp = malloc(ML_SLICE * sizeof(*bb->cp));
    if (!bb->cp)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    for (size_t i0 = 0; i0 < bb->n_pairs && rc == 0; i0 += ML_SLICE) {
        size_t nc = copy_slice(bb, i0, i0 + ML_SLICE < bb->n_pairs ? i0 + ML_SLICE : bb->n_pairs);
        if (bb->arena.oom)
            return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
        rc = encode_slice(bb, nc, err);
        if (rc == 0)
            rc = base_drain(c, &bb->be, area, &bb->written, &bb->bounce, 0, err);
        groups_meanwhile(bb);
        if (rc == 0 && (bb->flags & ML_BB_STOP_ON_CLOSE) && closing(c)) {
            out->stopped = 1;
            rc = rb_err_set(err, RB_ERR_RUNTIME, ECANCELED, "compaction stopped: the core is closing");
        }
    }
    if (rc == 0)
        rc = rb_mlog_benc_finish(&bb->be, ba, err);
    if (rc == 0)
        rc = base_drain(c, &bb->be, area, &bb->written, &bb->bounce, 1, err);
    if (rc == 0) {
        out->len = rb_round_up(bb->written, ba);
        out->n_entries = bb->be.n_entries;
        out->n_chunks = bb->be.n_chunks;
    }
    return rc;
}

/* The build is over (rc its result): positions unfrozen, a failed build no longer active,
 * its time recorded, everything it held freed. */
static void base_end(base_build *bb, int rc, uint64_t t0)
{
    rb_core *c = bb->c;
    rb_mlw *m = &c->ml;
    pthread_mutex_lock(&c->mu);
    c->index.hold_compact--;
    rb_idx_maybe_compact(&c->index);
    if (rc < 0) {
        m->cmp_active = 0;
        if (rc == -EFBIG)
            m->base_too_large++;
    }
    m->last_base_ns = rb_now_ns() - t0;
    pthread_mutex_unlock(&c->mu);
    if (bb->have_be)
        rb_mlog_benc_free(&bb->be);
    free(bb->tab);
    free(bb->frags);
    free(bb->used);
    free(bb->pairs);
    free(bb->cp);
    free(bb->bounce);
    rb_buf_free(&bb->arena);
}

/*
 * Build a base of the index into base area `area` (no lock held on entry; cmp_mu held): begin
 * under mu, then 1: the live positions, the class table, 2: slot order, 3: encode and write.
 */
static int build_base(rb_core *c, int area, int flags, ml_base *out, rb_err *err)
{
    uint64_t t0 = rb_now_ns();
    memset(out, 0, sizeof(*out));
    out->area = area;
    base_build bb;
    memset(&bb, 0, sizeof bb);
    bb.c = c;
    bb.out = out;
    bb.flags = flags;
    if (base_begin(&bb) < 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    int rc = base_collect(&bb, err);
    if (rc == 0)
        rc = base_class_table(&bb, err);
    if (rc == 0 && sort_pairs(bb.pairs, bb.n_pairs) < 0)
        rc = rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    if (rc == 0)
        rc = base_encode(&bb, &c->ml.lay.areas[area], err);
    base_end(&bb, rc, t0);
    return rc;
}

/* Fill a superblock for base b (mu held). */
static void sb_fill_locked(rb_core *c, const ml_base *b, uint64_t sb_seq, uint64_t ring_start, rb_mlog_sb *sb)
{
    rb_mlw *m = &c->ml;
    memset(sb, 0, sizeof(*sb));
    sb->sb_seq = sb_seq;
    sb->generation = m->generation;
    sb->block_align = c->cfg.block_align;
    sb->header_bytes = c->cfg.header_bytes;
    sb->slot_bytes = c->cfg.slot_bytes;
    sb->data_base = c->data_base;
    sb->capacity = c->capacity;
    sb->meta_total_bytes = c->cfg.meta_total_bytes;
    sb->container_bytes = c->container_bytes;
    sb->max_slots = c->max_slots;
    sb->extent_stride = c->ext_stride;
    sb->size_classes = c->n_sc > 1 ? c->n_sc : 0;
    sb->areas[0] = m->lay.areas[0];
    sb->areas[1] = m->lay.areas[1];
    sb->base.area = (uint32_t)b->area;
    sb->base.n_chunks = b->n_chunks;
    sb->base.len = b->len;
    sb->base.n_entries = b->n_entries;
    sb->base.log_seq = b->q;
    sb->base.next_slot = b->next_slot;
    sb->ring.off = m->lay.ring.off;
    sb->ring.len = m->lay.ring.len;
    sb->ring.start = ring_start;
    sb->ring.start_seq = b->q + 1;
    sb->epoch = m->epoch;
}

static int write_sb(rb_core *c, const rb_mlog_sb *sb, int which, rb_err *err)
{
    const uint64_t ba = c->cfg.block_align, span = rb_mlog_sb_span(ba);
    uint8_t *blk = rb_alloc_aligned(ba, span, err);
    if (!blk)
        return -ENOMEM;
    int rc = rb_mlog_sb_encode(sb, blk, span, err);
    uint64_t off = (uint64_t)which * c->container_bytes;
    if (rc == 0) {
        rc = rb_core_meta_write(c, off, blk, span, err);
        if (rc < 0)
            rb_core_explain_device_error(c, "metadata superblock write", off, err);
    }
    free(blk);
    return rc;
}

/* A fresh base replaced the v1 containers (or an older generation): what they listed is no
 * longer a hazard, and the slots held for them return to use. mu held. */
static void forget_v1_refs_locked(rb_core *c)
{
    c->ref_unknown = 0;
    free(c->ref);
    c->ref = NULL;
    c->ref_cap = 0;
    rb_core_held_dedupe_locked(c);
    for (size_t i = 0; i < c->n_held; i++)
        rb_core_free_slot_locked(c, c->held[i]);
    c->n_held = 0;
    c->good_container = -1;
}

/* Superblock sb (written into place which, sequence seq) made base b current: the log starts
 * at lstart, the pages up to Q are covered by the base (unwritten ones are never written, and
 * the slots their FREE records name are free in the base), as are the slots held for it; t0
 * when the switch began. mu held. */
static void switch_done_locked(rb_core *c, const ml_base *b, const rb_mlog_sb *sb, int which, uint64_t lstart,
                               int fresh, uint64_t t0)
{
    rb_mlw *m = &c->ml;
    m->sb = *sb;
    m->sb_which = which;
    m->sb_seq_seen = sb->sb_seq;
    m->lstart = lstart;
    m->state = RB_ML_LIVE;
    if (lstart == m->lhead)
        m->end_marked = 1; /* no group after the base: nothing for an end mark to follow */
    m->epoch_claimed = 1;  /* the superblock just written names it */
    m->cmp_active = 0;
    m->cmp_urgent = 0;
    size_t n = 0;
    while (n < m->n_pg && m->pg[n]->seq != 0 && m->pg[n]->seq <= b->q)
        n++;
    drop_pages_locked(c, n);
    put_pend_rebuild_locked(m); /* a bit no page clears (a slot a page could not list) goes */
    for (size_t i = 0; i < m->n_held_base; i++)
        rb_core_free_slot_locked(c, m->held_base[i]);
    m->n_held_base = 0;
    m->bases_written++;
    m->last_base_bytes = b->len;
    m->last_base_entries = b->n_entries;
    m->last_switch_ns = rb_now_ns() - t0;
    if (fresh)
        forget_v1_refs_locked(c);
    c->ref_unknown &= (uint8_t)~0x4u;
}

/* A flush failed since base b began (mu held): the trust layer dropped entries whose bytes
 * may be lost, and the base may list them (copied before the drop), their FREE records only in
 * a later page. The base is abandoned (-EIO); the next checkpoint writes a whole base
 * (need_base, set with the drop). */
static int base_outdated_locked(rb_core *c, const ml_base *b, rb_err *err)
{
    if (c->wb_epoch == b->wb_epoch)
        return 0;
    c->ml.need_base++;
    return rb_err_set(err, RB_ERR_RUNTIME, EIO,
                      "metadata base abandoned: a device flush failed while it was built (%u failures), so it "
                      "may list entries the failure dropped; the next checkpoint writes a whole base",
                      (unsigned)(c->wb_epoch - b->wb_epoch));
}

/*
 * Make base b current (ckpt_mu held). fresh: the device gets its first superblocks of this
 * generation (both copies, so a damaged one falls back to the same state); else the other
 * superblock than the current one. Refused when a flush failed during the build
 * (base_outdated_locked: checked after the flush that makes the base durable, with ckpt_mu
 * held, so no other flush runs before the superblock lands).
 */
static int switch_base(rb_core *c, const ml_base *b, int fresh, rb_err *err)
{
    rb_mlw *m = &c->ml;
    uint64_t t0 = rb_now_ns();
    int rc = rb_core_flush(c, err); /* the base, and every payload it names */
    rb_mlog_sb sb;
    uint64_t lstart = 0;
    int which = 0, sb_issued = 0; /* a superblock write was issued: durable or not, whatever it returned */
    if (rc == 0) {
        pthread_mutex_lock(&c->mu);
        rc = base_outdated_locked(c, b, err);
        if (rc == 0) {
            uint64_t start = m->cmp_placed ? m->cmp_pos : m->head;
            lstart = m->cmp_placed ? m->cmp_lpos : m->lhead;
            uint64_t seq = m->sb_seq_seen + (fresh ? 2 : 1); /* above every superblock seen */
            which = fresh ? 0 : m->sb_which ^ 1;
            sb_fill_locked(c, b, seq, start, &sb);
        }
        pthread_mutex_unlock(&c->mu);
        sb_issued = rc == 0;
        if (rc == 0)
            rc = write_sb(c, &sb, which, err);
    }
    if (rc == 0 && fresh) {
        rb_mlog_sb mirror = sb;
        mirror.sb_seq = sb.sb_seq - 1;
        rc = write_sb(c, &mirror, 1, err);
    }
    if (rc == 0)
        rc = rb_core_flush(c, err);
    pthread_mutex_lock(&c->mu);
    if (rc == 0) {
        switch_done_locked(c, b, &sb, which, lstart, fresh, t0);
    } else {
        m->cmp_active = 0;
        /* A superblock naming this base may be durable, its log starting at Q + 1 where this
         * writer would still put a queued page of Q or below: a whole base next, under a
         * superblock above it, before any group. */
        if (sb_issued)
            m->need_base++;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* A block of zeros over v1 container 0's header, so a crash before the first superblock lands
 * recovers from container 1 (which holds the newest v1 checkpoint by then). */
/* Zero len bytes at each of the n metadata offsets, then flush. */
static int zero_meta_blocks(rb_core *c, const uint64_t *offs, int n, uint64_t len, rb_err *err)
{
    uint8_t *z = rb_alloc_aligned(c->cfg.block_align, len, err);
    if (!z)
        return -ENOMEM;
    memset(z, 0, len);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = rb_core_meta_write(c, offs[i], z, len, err);
    free(z);
    if (rc == 0)
        rc = rb_core_flush(c, err);
    return rc;
}

static int invalidate_v1_header0(rb_core *c, rb_err *err)
{
    const uint64_t at0 = 0;
    return zero_meta_blocks(c, &at0, 1, c->cfg.block_align, err);
}

/* A new generation: nothing of an older one on the device is read as its own. Its writer
 * epochs start again at 1; a fresh one starts the ring at 0. */
static void new_generation(rb_core *c, int fresh)
{
    rb_mlw *m = &c->ml;
    uint64_t g = 0;
    while (g == 0 || g == m->generation)
        if (getrandom(&g, sizeof g, 0) != (ssize_t)sizeof g)
            g = rb_now_ns() ^ ((uint64_t)getpid() << 32);
    m->generation = g;
    m->epoch = 1;
    m->newgen = 0;
    if (fresh)
        m->head = m->lhead = m->lstart = 0;
}

/* The move of a format v1 device: its newest checkpoint made sure to be in container 1 (good:
 * the container that holds it now), then container 0's header cleared. 0 or <0. */
static int leave_v1(rb_core *c, int good, rb_err *err)
{
    if (good != 1) {
        rb_err e;
        int rc = rb_core_ckpt_v1_locked(c, 1, 0, 1, &e);
        if (rc < 0 && e.errnum != EFBIG) {
            *err = e;
            return rc;
        }
        /* too large for v1: no v1 copy survives the move (a crash before the superblock lands
         * loses the index, never misreads it) */
    }
    return invalidate_v1_header0(c, err);
}

/*
 * A whole base now (ckpt_mu and cmp_mu held): the first one of a blank device, the move of a
 * format v1 device (its newest checkpoint first made sure to be in container 1, container 0's
 * header cleared, the base into area 0, then the superblocks over both container headers),
 * or a new base after the journal lost a change.
 */
static int rebase_locked(rb_core *c, rb_err *err)
{
    rb_mlw *m = &c->ml;
    pthread_mutex_lock(&c->mu);
    int state = m->state;
    uint64_t need = m->need_base;
    int good = c->good_container;
    pthread_mutex_unlock(&c->mu);
    int fresh = state != RB_ML_LIVE;
    if (fresh || m->newgen)
        new_generation(c, fresh);
    int rc = state == RB_ML_MIGRATE ? leave_v1(c, good, err) : 0;
    if (rc < 0)
        return rc;
    ml_base b;
    int area = fresh ? 0 : (int)(m->sb.base.area ^ 1u);
    rc = build_base(c, area, 0, &b, err); /* ckpt_mu held */
    if (rc == 0)
        rc = switch_base(c, &b, fresh, err);
    if (rc == 0) {
        pthread_mutex_lock(&c->mu);
        /* a change lost while the base was built needs another */
        m->need_base = m->need_base == need ? 0 : 1;
        pthread_mutex_unlock(&c->mu);
    }
    return rc;
}

/* A whole base when the state or a lost change needs one (checked again under the locks).
 * 1 written, 0 none needed, <0 failed (recorded). */
static int base_if_needed(rb_core *c, rb_err *err)
{
    rb_mlw *m = &c->ml;
    pthread_mutex_lock(&m->cmp_mu);
    pthread_mutex_lock(&c->ckpt_mu);
    pthread_mutex_lock(&c->mu);
    int base = m->state != RB_ML_LIVE || m->need_base;
    pthread_mutex_unlock(&c->mu);
    int rc = base ? rebase_locked(c, err) : 0;
    ckpt_release(c);
    pthread_mutex_unlock(&m->cmp_mu);
    if (rc < 0) {
        rb_core_set_ckpt_error(c, err);
        return rc;
    }
    return base;
}

/* 1 when groups are to be written: the state is LIVE and a base was just written (base), this
 * is a retry, a checkpoint is due, or a page holds something. mu held. */
static int groups_wanted_locked(rb_core *c, int base, int round, size_t room_n)
{
    rb_mlw *m = &c->ml;
    return m->state == RB_ML_LIVE && (base || round || rb_core_ckpt_due_locked(c, 1, room_n) || lane_waits(m) ||
                                      (m->n_pg && (m->pg[0]->seq != 0 || m->pg[0]->g.n_records)));
}

/* The ring is full and the compaction that would empty it failed (ce): the error names that
 * cause (a base too large for its area says which setting to enlarge), and so does the status's
 * last checkpoint error (the failure itself is counted once, by groups_failed). */
static void ring_full_cause(rb_core *c, rb_err *err, const rb_err *ce)
{
    rb_mlw *m = &c->ml;
    pthread_mutex_lock(&c->mu);
    uint64_t live = m->lhead - m->lstart, len = m->lay.ring.len;
    pthread_mutex_unlock(&c->mu);
    rb_err_set(err, RB_ERR_RUNTIME, ENOSPC,
               "the metadata log is full (%llu of %llu bytes live) and the compaction "
               "that would empty it failed: %s",
               (unsigned long long)live, (unsigned long long)len, ce->msg);
    pthread_mutex_lock(&c->mu);
    snprintf(c->ckpt_error, sizeof c->ckpt_error, "%s", err->msg);
    pthread_mutex_unlock(&c->mu);
}

/* Write the groups (ckpt_mu per round); when the ring is full (a burst outran the periodic
 * compaction, or there is no periodic thread), compact here and write them again once. As
 * write_groups. */
static int write_groups_rounds(rb_core *c, int base, size_t room_n, rb_err *err)
{
    int rc = 0;
    for (int round = 0;; round++) {
        pthread_mutex_lock(&c->ckpt_mu);
        pthread_mutex_lock(&c->mu);
        int go = groups_wanted_locked(c, base, round, room_n);
        pthread_mutex_unlock(&c->mu);
        rc = go ? write_groups(c, err) : 0;
        ckpt_release(c);
        if (rc >= 0 || round || !ring_full_err(err))
            return rc;
        rb_err ce;
        if (rb_core_ml_compact(c, 0, &ce) < 0) { /* not forced: one that ran meanwhile made room */
            ring_full_cause(c, err, &ce);
            return rc;
        }
    }
}

/* The groups, after the whole base this checkpoint wrote (*base 1) or did not need; when a
 * flush failed in between (write_groups' -EAGAIN: a whole base is due again), that base first,
 * once more (*base then 1). As write_groups_rounds. */
static int groups_after_base(rb_core *c, int *base, size_t room_n, rb_err *err)
{
    int rc = write_groups_rounds(c, *base, room_n, err);
    if (rc != -EAGAIN)
        return rc;
    int b = base_if_needed(c, err);
    if (b < 0)
        return b;
    *base |= b;
    rc = write_groups_rounds(c, *base, room_n, err);
    if (rc == -EAGAIN)
        rb_core_set_ckpt_error(c, err);
    return rc;
}

/* A put's room from the deletes' lane alone, without the payloads' flush: 1 when that gave
 * it, 0 when a checkpoint must still be written (after a full ring too: it compacts first,
 * the lane among its groups), <0 failed. */
static int room_from_lane(rb_core *c, int force, size_t room_n, rb_err *err)
{
    int lr = rb_core_ml_release_lane(c, err);
    if (lr < 0)
        return lr;
    pthread_mutex_lock(&c->mu);
    int still = lr <= 0 || rb_core_ckpt_due_locked(c, force, room_n);
    c->room_ckpts += !still;
    pthread_mutex_unlock(&c->mu);
    return !still;
}

/* Before the groups: the whole base when one is due (*base then says whether it was written),
 * else a put's room from the lane alone. 0 to go on to the groups, 1 done, <0 failed. */
static int before_groups(rb_core *c, int force, size_t room_n, int *base, rb_err *err)
{
    if (*base) {
        *base = base_if_needed(c, err);
        return *base < 0 ? *base : 0;
    }
    return room_n ? room_from_lane(c, force, room_n, err) : 0;
}

int rb_core_ml_checkpoint(rb_core *c, int force, size_t room_n, rb_err *err)
{
    rb_mlw *m = &c->ml;
    pthread_mutex_lock(&c->mu);
    int go = rb_core_ckpt_due_locked(c, force, room_n);
    int base = go && (m->state != RB_ML_LIVE || m->need_base);
    pthread_mutex_unlock(&c->mu);
    if (!go)
        return 0;
    (void)rb_core_check_size(c);
    if (c->dev == NULL || rb_dev_enter(c->dev) < 0)
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "RawBlockCore is closed");
    rb_dev_leave(c->dev);
    int pre = before_groups(c, force, room_n, &base, err);
    if (pre != 0)
        return pre;
    int rc = groups_after_base(c, &base, room_n, err);
    int base_only = rc == 0 && base; /* the base covered every change: a checkpoint too */
    if (base_only)
        rc = 1;
    if (rc > 0 && (room_n || base_only)) {
        pthread_mutex_lock(&c->mu);
        c->room_ckpts += room_n ? 1 : 0;
        c->ckpt_written += base_only;
        pthread_mutex_unlock(&c->mu);
    }
    return rc;
}

/* ---- the end mark at a clean close ---------------------------------------------------- */

/* 1 when close is to append an end mark: the log is live, its last group is a real one, and no
 * page waits (a final checkpoint that failed leaves its pages queued, and a base that is due
 * is not written: the log then ends with what is durable, unmarked). mu held. */
static int end_mark_wanted_locked(const rb_core *c)
{
    const rb_mlw *m = &c->ml;
    if (m->state != RB_ML_LIVE || m->end_marked || m->need_base || m->newgen || lane_waits(m))
        return 0;
    for (size_t i = 0; i < m->n_pg; i++)
        if (m->pg[i]->seq != 0 || m->pg[i]->g.n_records)
            return 0;
    return 1;
}

/* Write end mark mk (its sequence given): the epoch claimed first when this writer has not
 * yet, then sealed, placed, written and flushed. ckpt_mu held. 0 or <0 (err; -ENOSPC when the
 * ring has no room for it). */
static int end_mark_put(rb_core *c, rb_mlpage *mk, rb_err *err)
{
    rb_mlw *m = &c->ml;
    int rc = m->epoch_claimed ? 0 : groups_prologue(c, NULL, 0, err);
    if (rc == 0)
        rc = seal_page(c, mk, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = place_page_locked(c, mk, err);
    pthread_mutex_unlock(&c->mu);
    if (rc < 0)
        return rc;
    uint64_t off = m->lay.ring.off + mk->pos;
    rc = rb_core_meta_write(c, off, mk->img, mk->img_len, err);
    if (rc < 0) {
        rb_core_explain_device_error(c, "metadata log end mark write", off, err);
        return rc;
    }
    return rb_core_flush(c, err);
}

/* One attempt (ckpt_mu taken here): 1 written, 0 none wanted, <0 failed (err). */
static int end_mark_once(rb_core *c, rb_err *err)
{
    rb_mlw *m = &c->ml;
    rb_mlpage mk;
    memset(&mk, 0, sizeof mk);
    rb_mlog_genc_init(&mk.g);
    pthread_mutex_lock(&c->ckpt_mu);
    pthread_mutex_lock(&c->mu);
    int go = end_mark_wanted_locked(c);
    if (go)
        mk.seq = ++m->last_seq;
    pthread_mutex_unlock(&c->mu);
    int rc = go ? end_mark_put(c, &mk, err) : 0;
    pthread_mutex_lock(&c->mu);
    if (go && !mk.placed && m->last_seq == mk.seq)
        m->last_seq--; /* nothing on the device has its sequence: the next group takes it */
    if (go && rc == 0) {
        m->end_marked = 1;
        c->meta_seq = mk.seq;
    }
    pthread_mutex_unlock(&c->mu);
    ckpt_release(c);
    free(mk.img);
    rb_mlog_genc_free(&mk.g);
    return rc < 0 ? rc : go;
}

int rb_core_ml_end_mark(rb_core *c, rb_err *err)
{
    if (!c->ml.on || c->dev == NULL)
        return 0;
    int rc = end_mark_once(c, err);
    if (rc < 0 && ring_full_err(err)) {
        /* no block left in the ring: a compaction leaves no group after its base to mark */
        rb_err ce;
        if (rb_core_ml_compact(c, 0, &ce) < 0)
            ring_full_cause(c, err, &ce);
        else
            rc = end_mark_once(c, err);
    }
    if (rc < 0)
        rb_core_set_ckpt_error(c, err);
    return rc;
}

/* ---- compaction ------------------------------------------------------------------------ */

int rb_core_ml_compact_due(rb_core *c)
{
    rb_mlw *m = &c->ml;
    pthread_mutex_lock(&c->mu);
    int due = m->on && m->state == RB_ML_LIVE && !c->closed &&
              (m->cmp_urgent || (m->lhead - m->lstart) * 2 > m->lay.ring.len);
    pthread_mutex_unlock(&c->mu);
    return due;
}

static int compact_impl(rb_core *c, int force, int flags, rb_err *err)
{
    rb_mlw *m = &c->ml;
    if (!m->on)
        return 0;
    pthread_mutex_lock(&m->cmp_mu);
    pthread_mutex_lock(&c->mu);
    int live = m->state == RB_ML_LIVE; /* also while closing: the final checkpoint may need room */
    int due = m->cmp_urgent || (m->lhead - m->lstart) * 2 > m->lay.ring.len;
    int area = (int)(m->sb.base.area ^ 1u);
    pthread_mutex_unlock(&c->mu);
    if (!live || (!force && !due)) {
        pthread_mutex_unlock(&m->cmp_mu);
        return 0;
    }
    ml_base b;
    uint64_t t0 = rb_obs_t0(&c->obs);
    int rc = build_base(c, area, flags, &b, err);
    if (rc == 0) {
        pthread_mutex_lock(&c->ckpt_mu);
        rc = switch_base(c, &b, 0, err);
        ckpt_release(c);
    }
    if (rc == 0) {
        rb_obs_done(&c->obs, RB_H_COMPACTION, t0);
        pthread_mutex_lock(&c->mu);
        m->compactions++;
        pthread_mutex_unlock(&c->mu);
    } else if (!b.stopped) {
        rb_core_set_ckpt_error(c, err);
    }
    pthread_mutex_unlock(&m->cmp_mu);
    return b.stopped ? 0 : rc < 0 ? rc : 1;
}

int rb_core_ml_compact(rb_core *c, int force, rb_err *err)
{
    return compact_impl(c, force, ML_BB_MEANWHILE, err);
}

int rb_core_ml_compact_periodic(rb_core *c, rb_err *err)
{
    return compact_impl(c, 0, ML_BB_MEANWHILE | ML_BB_STOP_ON_CLOSE, err);
}

int rb_core_compact(rb_core *c, rb_err *err)
{
    int rc = rb_core_ml_compact(c, 1, err);
    (void)rb_core_dealloc_run(c); /* the slots the base made reusable */
    return rc;
}

int rb_core_ml_wipe_superblocks(rb_core *c, rb_err *err)
{
    const uint64_t offs[2] = {0, c->container_bytes};
    int rc = zero_meta_blocks(c, offs, 2, rb_mlog_sb_span(c->cfg.block_align), err);
    if (rc == 0) {
        pthread_mutex_lock(&c->mu);
        c->ml.wipe_sbs = 0;
        pthread_mutex_unlock(&c->mu);
    }
    return rc;
}
