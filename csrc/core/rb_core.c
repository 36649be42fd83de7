/*
 * rb_core.c - the core's lifecycle: open (device, layout, recovery), close, free; the status
 * report and the memory figure; the test and benchmark hooks. The operations live in
 * rb_core_put.c, rb_core_load.c and rb_core_keys.c (see rb_core_int.h for the whole map).
 */
#include "rb_core_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rb_config.h"
#include "rb_probe.h"

uint64_t rb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void rb_deadline_in(struct timespec *ts, uint64_t ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    uint64_t n = (uint64_t)ts->tv_nsec + ns % 1000000000ull;
    ts->tv_sec += (time_t)(ns / 1000000000ull + n / 1000000000ull);
    ts->tv_nsec = (long)(n % 1000000000ull);
}

/* ---- test and benchmark hooks --------------------------------------------------------- */

void rb_core_set_ckpt_delay_ms(rb_core *c, uint32_t ms)
{
    atomic_store(&c->ckpt_delay_ms, ms);
}

void rb_core_set_load_check_off(rb_core *c, int off)
{
    atomic_store(&c->no_load_check, off);
}

void rb_core_set_ckpt_no_flush(rb_core *c, int on)
{
    atomic_store(&c->no_flush, on);
}

void rb_core_set_load_delay_ms(rb_core *c, uint32_t ms)
{
    atomic_store(&c->load_delay_ms, ms);
}

/* ---- lifecycle ------------------------------------------------------------------------- */

/* Refuse a device that holds someone else's data (a file system, a RAID/LVM member, a
 * partition table): the first checkpoint would overwrite it. A path the probe cannot open is
 * left to rb_dev_open, which reports it. */
static int refuse_foreign_device(const char *path, int uring_cmd, rb_err *err)
{
    char what[128];
    rb_err perr;
    rb_err_clear(&perr);
    /* A generic NVMe character device (ngXnY) takes no read(2), so libblkid cannot look at it:
     * the namespace's block device (nvmeXnY) shows the same bytes. */
    char blk[64];
    const char *base = strrchr(path, '/');
    unsigned ctrl, nsn;
    char tail;
    base = base ? base + 1 : path;
    if (uring_cmd && sscanf(base, "ng%un%u%c", &ctrl, &nsn, &tail) == 2) {
        snprintf(blk, sizeof(blk), "/dev/nvme%un%u", ctrl, nsn);
        if (access(blk, F_OK) == 0 && rb_probe_foreign(blk, what, sizeof(what), &perr) > 0)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                              "device_path's namespace holds a %s (found by libblkid on %s): refusing to overwrite "
                              "a device that is not a raw-block cache. Wipe it first (wipefs -a) or set "
                              "allow_foreign_device=True (rust_raw_block.allow_foreign_device: true). device_path='%s'",
                              what, blk, path);
        return 0;
    }
    if (rb_probe_foreign(path, what, sizeof(what), &perr) <= 0)
        return 0;
    /* The path last: a long one is what the message's length limit cuts. */
    return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                      "device_path holds a %s (found by libblkid): refusing to overwrite a device that is not a "
                      "raw-block cache. Wipe it first (wipefs -a) or set allow_foreign_device=True "
                      "(rust_raw_block.allow_foreign_device: true). device_path='%s'",
                      what, path);
}

/* 1 when the device starts with metadata of ours: a log-format superblock, or a format v1
 * container header with this core's magic, at offset 0. Such a device is not handed to
 * libblkid, whose probe drops the device's page cache (posix_fadvise DONTNEED), so a reopen
 * would read its metadata from the medium. Offset 0 only: a file system made over a device of
 * ours rewrites its start (mkfs wipes the old signatures there), while our second superblock
 * or container further on may survive it. */
static int looks_ours(rb_core *c)
{
    const uint64_t ba = c->cfg.block_align, span = rb_mlog_sb_span(ba);
    rb_err e;
    if (span > c->dev->size)
        return 0;
    uint8_t *blk = rb_alloc_aligned(ba, span, &e);
    if (!blk)
        return 0;
    rb_mlog_sb sb;
    int ours = rb_core_dev_read(c, 0, blk, span, span, span, 0, &e) == 0 &&
               (rb_mlog_sb_decode(blk, span, &sb, &e) == 0 || memcmp(blk, c->cfg.meta_magic, 8) == 0);
    free(blk);
    return ours;
}

/* A new core for cfg (a copy, with its own device path): locks, indexes and the trust state
 * set up, nothing opened. NULL when out of memory. */
static rb_core *core_new(const rb_core_cfg *cfg)
{
    rb_core *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->cfg = *cfg;
    c->path = strdup(cfg->device_path);
    if (!c->path) {
        free(c);
        return NULL;
    }
    c->cfg.device_path = c->path;
    c->good_container = -1;
    c->apply_container = -1;
    c->rec_lost = -1;
    pthread_mutex_init(&c->reclaim_mu, NULL);
    pthread_mutex_init(&c->ckpt_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->idle_cv, NULL);
    pthread_mutex_init(&c->thr_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->thr_cv, &ca);
    pthread_condattr_destroy(&ca);
    rb_core_trust_init(c);
    rb_idx_init(&c->index);
    rb_idx_init(&c->inflight);
    rb_idx_init(&c->classes);
    c->last_io_ns = rb_now_ns();
    return c;
}

/* A device open that failed: the errno's text and name in the message ("open failed: No such
 * file or directory (ENOENT)"), as the core's other device errors give them; the binding adds
 * the path (OSError's filename). */
static void name_open_errno(rb_err *err)
{
    const char *name = err->kind == RB_ERR_OS && err->errnum > 0 ? strerrorname_np(err->errnum) : NULL;
    if (!name || strncmp(err->msg, "open failed", 11) != 0 || strstr(err->msg, name))
        return;
    char was[sizeof err->msg];
    memcpy(was, err->msg, sizeof was);
    rb_err_set(err, RB_ERR_OS, err->errnum, "%s: %s (%s)", was, strerror(err->errnum), name);
}

/* Open the device (exclusively) and, unless allowed, refuse one holding foreign data. */
static int open_device(rb_core *c, const rb_core_cfg *cfg, rb_err *err)
{
    rb_dev_config dc = {
        .path = cfg->device_path,
        .writable = 1,
        .odirect = cfg->use_odirect,
        .engine = cfg->io_engine,
        .uring_cmd = cfg->use_uring_cmd,
        .alignment = (size_t)cfg->block_align,
        .queue_depth = cfg->iouring_queue_depth,
        .max_transfer = cfg->use_uring_cmd ? cfg->max_data_transfer_size : 0,
        .lock = RB_LOCK_EXCLUSIVE, /* one writer per device, until close */
        .sched = {.mode = cfg->io_scheduler,
                  .read_max_bytes = cfg->read_max_bytes_in_flight,
                  .write_max_bytes = cfg->write_max_bytes_in_flight,
                  .write_piece_bytes = cfg->write_piece_bytes},
    };
    int rc = rb_dev_open(&dc, &c->dev, err);
    if (rc < 0) {
        name_open_errno(err);
        return rc;
    }
    /* The read-only foreign-device probe runs once the lock is held: a device another writer
     * holds, or a mounted one, is reported as such rather than by what its bytes look like. */
    if (!cfg->allow_foreign_device && !looks_ours(c))
        return refuse_foreign_device(cfg->device_path, cfg->use_uring_cmd, err);
    return 0;
}

/* The usable capacity and the metadata region's size (c->cfg.meta_total_bytes) on the opened
 * device: 0, or -ENOSPC when the region leaves no room for data. */
static int layout_region(rb_core *c, const rb_core_cfg *cfg, rb_err *err)
{
    uint64_t size = c->dev->size;
    c->capacity = (cfg->capacity_bytes > 0 && cfg->capacity_bytes < size) ? cfg->capacity_bytes : size;
    /* The log format at LMCache's default region size: the device's own size, or one sized from
     * the slot count on a blank device (rb_core_ml_region_bytes). */
    if (c->cfg.meta_format == RB_META_LOG && c->cfg.meta_total_bytes == RB_META_TOTAL_LMCACHE)
        c->cfg.meta_total_bytes = rb_core_ml_region_bytes(c);
    if (c->cfg.meta_total_bytes >= c->capacity)
        return rb_err_set(err, RB_ERR_RUNTIME, ENOSPC,
                          "metadata region exceeds usable device capacity: meta_total_bytes=%llu, usable "
                          "capacity %llu bytes (capacity_bytes=%llu, device %llu bytes)",
                          (unsigned long long)c->cfg.meta_total_bytes, (unsigned long long)c->capacity,
                          (unsigned long long)cfg->capacity_bytes, (unsigned long long)size);
    return 0;
}

/* The slots the data area holds into *ms: LMCache's layout (slot i at data_base + i *
 * slot_bytes), or with the log format and extent_bytes not a multiple of slot_bytes the
 * strided one (rb_slot_offset): whole extents from the first extent_bytes boundary at or past
 * data_base, floor(extent_bytes / slot_bytes) slots each. 0, or <0 with err. */
static int layout_slots(rb_core *c, const rb_core_cfg *cfg, uint64_t *ms, rb_err *err)
{
    const uint64_t eb = cfg->extent_bytes, sb = cfg->slot_bytes;
    c->n_sc = cfg->size_classes > 1 ? cfg->size_classes : 1;
    for (uint32_t k = 0; k < c->n_sc; k++)
        c->sc_bytes[k] = rb_sc_slot_bytes(sb, cfg->header_bytes, cfg->block_align, k);
    if (c->cfg.meta_format != RB_META_LOG || eb == 0 || (eb % sb == 0 && c->n_sc == 1)) {
        *ms = (c->capacity - c->data_base) / sb;
        return 0;
    }
    c->ext_base = rb_round_up(c->data_base, eb);
    uint64_t n = c->ext_base < c->capacity ? (c->capacity - c->ext_base) / eb : 0;
    if (n == 0)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "extent_bytes=%llu leaves no whole extent in the data area (%llu bytes from offset %llu "
                          "to the capacity %llu)",
                          (unsigned long long)eb, (unsigned long long)(c->capacity - c->data_base),
                          (unsigned long long)c->data_base, (unsigned long long)c->capacity);
    c->ext_stride = eb;
    c->ext_per = (uint32_t)(eb / c->sc_bytes[c->n_sc - 1]); /* size classes: the smallest's count */
    *ms = n * c->ext_per;
    return 0;
}

/* Layout (LMCache's geometry, no superblock; or strided, layout_slots): the metadata region,
 * then slots of slot_bytes to the end of the usable capacity; the slot allocator set up for
 * them. */
static int layout(rb_core *c, const rb_core_cfg *cfg, rb_err *err)
{
    int rc = layout_region(c, cfg, err);
    if (rc < 0)
        return rc;
    c->data_base = c->cfg.meta_total_bytes;
    rc = rb_core_extent_resolve(c, err);
    if (rc < 0)
        return rc;
    uint64_t ms = 0;
    rc = layout_slots(c, &c->cfg, &ms, err);
    if (rc < 0)
        return rc;
    if (ms == 0)
        return rb_err_set(err, RB_ERR_RUNTIME, ENOSPC,
                          "raw block capacity too small for slot size after metadata: slot_bytes=%llu, %llu "
                          "bytes left after meta_total_bytes=%llu",
                          (unsigned long long)cfg->slot_bytes, (unsigned long long)(c->capacity - c->data_base),
                          (unsigned long long)c->cfg.meta_total_bytes);
    if (ms > UINT32_MAX - 1)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "too many slots (%llu); use a larger slot_bytes",
                          (unsigned long long)ms);
    c->max_slots = (uint32_t)ms;
    c->usable_slots = c->max_slots;
    c->dev_size_seen = c->dev->size;
    c->container_bytes = rb_container_bytes(c->cfg.meta_total_bytes, cfg->block_align);
    c->payload_cap = c->container_bytes - cfg->block_align;
    c->slot_cap = cfg->slot_bytes - cfg->header_bytes;
    rc = rb_slots_init(&c->slots, c->max_slots, cfg->fdp_slot_affinity_enabled);
    if (rc < 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    return rb_core_extent_init(c, err);
}

/* Debug builds: the core's mutexes by rank, so taking them out of lock order aborts
 * (rb_debug.h); nothing in a release build. */
static void rank_locks(rb_core *c)
{
    rb_lk_rank(&c->reclaim_mu, RB_LK_RECLAIM);
    rb_lk_rank(&c->ml.cmp_mu, RB_LK_CMP);
    rb_lk_rank(&c->ckpt_mu, RB_LK_CKPT);
    rb_lk_rank(&c->dl_mu, RB_LK_DL);
    rb_lk_rank(&c->mu, RB_LK_MU);
    rb_lk_rank(&c->thr_mu, RB_LK_THR);
    rb_lk_rank(&c->fault_mu, RB_LK_FAULT);
}

/* The state on the device: deallocation and the metadata writer set up, recovery, then the
 * periodic thread when configured. */
static int open_state(rb_core *c, const rb_core_cfg *cfg, rb_err *err)
{
    rb_core_dealloc_init(c);
    int rc = rb_core_ml_init(c, err);
    rank_locks(c);
    if (rc < 0)
        return rc;
    uint64_t t_rec = rb_now_ns();
    rc = rb_core_recover(c, err);
    c->rec_ns = rb_now_ns() - t_rec;
    if (rc < 0)
        return rc;
    if (cfg->meta_enable_periodic)
        return rb_core_start_thread(c, err);
    return 0;
}

int rb_core_open(const rb_core_cfg *cfg, rb_core **out, rb_err *err)
{
    int rc = rb_core_cfg_check(cfg, err);
    if (rc < 0)
        return rc;
    rb_core *c = core_new(cfg);
    if (!c)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    rc = open_device(c, cfg, err);
    if (rc == 0)
        rc = layout(c, cfg, err);
    if (rc == 0)
        rc = open_state(c, cfg, err);
    if (rc < 0) {
        rb_core_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void rb_core_close(rb_core *c, rb_close_result *res)
{
    memset(res, 0, sizeof(*res));
    pthread_mutex_lock(&c->mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->mu);
        res->repeat = 1;
        return;
    }
    c->closed = 1;
    pthread_mutex_unlock(&c->mu);

    rb_core_stop_thread(c);

    /* Our I/O is synchronous and bounded: wait for calls already admitted to finish, so the
     * final checkpoint covers their commits and no caller is left inside the device. */
    pthread_mutex_lock(&c->mu);
    while (c->inflight_io > 0 || c->inflight.n_live > 0)
        pthread_cond_wait(&c->idle_cv, &c->mu);
    pthread_mutex_unlock(&c->mu);

    int rc = rb_core_checkpoint(c, 1, &res->ckpt_err); /* and the deallocations it allows */
    if (rc > 0)
        res->final_written = 1;
    else if (rc < 0)
        res->ckpt_failed = 1;
    /* the log format: a group of no records after the last one, so damage to that one is told
     * from a torn tail at the next open */
    if (rc >= 0 && rb_core_ml_end_mark(c, &res->ckpt_err) < 0)
        res->ckpt_failed = 1;
    if (c->dev && rb_dev_close(c->dev, &res->dev_err) < 0)
        res->dev_close_failed = 1;
}

void rb_core_free(rb_core *c)
{
    if (!c)
        return;
    rb_core_stop_thread(c);
    if (c->dev)
        rb_dev_free(c->dev);
    rb_idx_free(&c->index);
    rb_idx_free(&c->inflight);
    rb_core_classes_free(c);
    rb_slots_free(&c->slots);
    rb_core_hold_free(c);
    rb_core_ml_free(c);
    rb_core_dealloc_free(c);
    pthread_mutex_destroy(&c->reclaim_mu);
    pthread_mutex_destroy(&c->ckpt_mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->idle_cv);
    pthread_mutex_destroy(&c->thr_mu);
    pthread_cond_destroy(&c->thr_cv);
    rb_core_trust_free(c);
    free(c->path);
    free(c);
}

/* ---- status ---------------------------------------------------------------------------- */

/* The slot and extent counters eviction decides on (mu held): what rb_core_counts_get fills. */
static void status_counts_locked(const rb_core *c, rb_core_status *st)
{
    st->usable_slots = c->usable_slots;
    st->next_slot = c->slots.next_slot;
    st->free_slots = c->slots.n_free + (c->slots.ext.per ? 0 : c->dl_npend + c->dl_inflight);
    rb_core_extent_status_locked(c, st);
    st->indexed = c->index.n_live;
    st->inflight_keys = c->inflight.n_live;
    st->locked_keys = c->locked_keys;
    st->held_slots = rb_core_held_locked(c);
    st->room_ckpts = c->room_ckpts;
    st->closed = c->closed;
}

/* Layout, slots and the index (mu held). */
static void status_slots_locked(const rb_core *c, rb_core_status *st)
{
    st->capacity_bytes = c->capacity;
    st->data_base = c->data_base;
    st->container_bytes = c->container_bytes;
    st->max_slots = c->max_slots;
    status_counts_locked(c, st);
    rb_core_dealloc_status_locked(c, st);
    st->inflight_io = c->inflight_io;
    st->affinity_hits = c->slots.affinity_hits;
    st->affinity_fallbacks = c->slots.affinity_fallbacks;
    st->held_total = c->held_total;
}

/* Checkpoints, recovery and the verdicts of loads (mu held). */
static void status_ckpt_locked(const rb_core *c, rb_core_status *st)
{
    st->meta_seq = c->meta_seq;
    st->dirty_total = c->dirty_total;
    st->persisted = c->persisted;
    st->ckpt_written = c->ckpt_written;
    st->ckpt_failures = c->ckpt_failures;
    st->ckpt_too_large = c->ckpt_too_large;
    st->checksum_failures = c->checksum_failures;
    st->recovery_dropped = c->recovery_dropped;
    st->recovery_entries_loaded = c->recovery_entries_loaded;
    st->unverified = c->n_unverified;
    st->deferred_verified = c->deferred_verified;
    st->deferred_dropped = c->deferred_dropped;
    st->recovery_loaded = c->recovery_loaded;
    st->recovery_outcome = c->rec_outcome;
    st->recovery_seq = c->rec_seq;
    st->recovery_ns = c->rec_ns;
    st->recovery_read_ns = c->ml.rec_read_ns;
    st->recovery_rejected_seq = c->rec_rejected_seq;
    st->recovery_lost = c->rec_lost;
    st->meta_format = c->cfg.meta_format;
    st->checksum_dropped = c->sum_dropped;
    st->flushes = atomic_load(&c->flushes);
    st->write_behinds = atomic_load(&c->write_behinds);
    st->skipped = c->apply_skipped;
    st->load_rejected = c->load_rejected;
    memcpy(st->ckpt_error, c->ckpt_error, sizeof st->ckpt_error);
}

/* The log-structured metadata writer (mu held; cfg.meta_format == RB_META_LOG). */
static void status_log_locked(const rb_core *c, rb_core_status *st)
{
    const rb_mlw *m = &c->ml;
    st->log_state = m->state;
    st->log_ring_bytes = m->lay.ring.len;
    st->log_live_bytes = m->lhead - m->lstart;
    st->log_seq = m->last_seq;
    st->log_groups_written = m->groups_written;
    st->log_lane_groups = m->lane_groups;
    st->log_lane_records = m->lane_records;
    st->log_lane_in_flush = m->gap_lanes;
    st->log_bytes_written = m->group_bytes;
    st->log_last_group_bytes = m->last_group_bytes;
    st->log_last_group_records = m->last_group_records;
    st->log_pending_pages = m->n_pg;
    st->log_pending_records = rb_core_ml_pending_records_locked(c);
    st->log_journal_bytes = rb_core_ml_journal_bytes_locked(c);
    st->bases_written = m->bases_written;
    st->base_last_bytes = m->last_base_bytes;
    st->base_last_entries = m->last_base_entries;
    st->base_too_large = m->base_too_large;
    st->compactions = m->compactions;
    st->base_last_ns = m->last_base_ns;
    st->log_journal_lost = m->journal_lost;
    st->log_ring_full = m->ring_full;
    st->log_recovered_groups = m->rec_groups;
    st->log_recovered_records = m->rec_records;
    st->log_recovered_gaps = m->rec_gaps;
    st->log_recovered_groups_lost = m->rec_groups_lost;
    st->log_recovered_records_lost = m->rec_records_lost;
    st->base_area_bytes = m->lay.areas[0].len;
    st->log_generation = m->generation;
}

/* Write-back failures and the device's size (mu held). */
static void status_trust_locked(const rb_core *c, rb_core_status *st)
{
    st->writeback_failures = c->wb_epoch;
    st->writeback_dropped = c->wb_dropped;
    st->shrink_dropped = c->shrink_dropped;
    st->retired_slots = c->retired_slots;
    st->undurable_writes = c->commits - c->commits_proven;
    st->device_size = c->dev_size_seen; /* usable_slots: status_counts_locked */
}

/* The fault journal, oldest first (takes fault_mu). */
static void status_faults(rb_core *c, rb_core_status *st)
{
    pthread_mutex_lock(&c->fault_mu);
    st->faults_total = c->n_faults;
    memcpy(st->fault_by_errno, c->fault_by_errno, sizeof st->fault_by_errno);
    uint64_t kept = c->n_faults < RB_FAULTS_KEPT ? c->n_faults : RB_FAULTS_KEPT;
    for (uint64_t k = 0; k < kept; k++) /* oldest first */
        st->faults[k] = c->faults[(c->n_faults - kept + k) % RB_FAULTS_KEPT];
    st->n_faults_kept = (uint32_t)kept;
    pthread_mutex_unlock(&c->fault_mu);
}

void rb_core_status_get(rb_core *c, rb_core_status *st)
{
    memset(st, 0, sizeof(*st));
    pthread_mutex_lock(&c->mu);
    status_slots_locked(c, st);
    status_ckpt_locked(c, st);
    if (c->ml.on)
        status_log_locked(c, st);
    status_trust_locked(c, st);
    pthread_mutex_unlock(&c->mu);
    status_faults(c, st);
    if (c->dev)
        rb_stats_read(&c->dev->stats, &st->io);
}

void rb_core_counts_get(rb_core *c, rb_core_status *st)
{
    memset(st, 0, sizeof(*st));
    pthread_mutex_lock(&c->mu);
    status_counts_locked(c, st);
    pthread_mutex_unlock(&c->mu);
}

size_t rb_core_mem_bytes(rb_core *c)
{
    pthread_mutex_lock(&c->mu);
    size_t b = rb_idx_mem_bytes(&c->index) + rb_idx_mem_bytes(&c->inflight) + rb_slots_mem_bytes(&c->slots) +
               rb_core_trust_mem_bytes(c) + (c->ml.on ? rb_core_ml_journal_bytes_locked(c) : 0);
    pthread_mutex_unlock(&c->mu);
    return b;
}
