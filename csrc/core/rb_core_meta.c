/*
 * rb_core_meta.c - what both metadata formats share: the recovery entry (the log format's
 * superblocks first, rb_core_mlog_rec.c, else format v1's containers, rb_core_v1.c), the
 * checkpoint entry and its decision, metadata writes and flushes with their error reporting,
 * and the periodic checkpoint thread.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

int rb_core_meta_can_sync_range(rb_core *c)
{
    rb_nvme_ns ns;
    return !atomic_load(&c->no_flush) && !atomic_load(&c->no_dsync) && !rb_dev_nvme_ns(c->dev, &ns) &&
           !(rb_core_uses_uring(c) && c->cfg.meta_checkpoint_placement_id);
}

/* Whether a synced write's failure says the flag itself is refused, before any byte was
 * written: EOPNOTSUPP (a file without its own write path), EINVAL or ENOSYS (a kernel or a
 * sandbox without pwritev2's flags). */
static int dsync_refused(const rb_xfer *x, const rb_err *err)
{
    int e = err->errnum;
    return x->done == 0 && err->kind == RB_ERR_OS && (e == EOPNOTSUPP || e == EINVAL || e == ENOSYS);
}

/* One pwritev2(RWF_DSYNC) of buf at off. 0, <0 (err), or 1 when the flag is refused
 * (dsync_refused: nothing written). */
static int write_dsync(rb_core *c, uint64_t off, void *buf, size_t len, rb_err *err)
{
    if (rb_dev_enter(c->dev) < 0)
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "RawBlockCore is closed");
    rb_xfer x;
    int rc = rb_xfer_init(c->dev, &x, 1, off, buf, len, len, len, err);
    x.dsync = 1;
    if (rc == 0)
        rc = rb_xfer_prepare(c->dev, &x, err);
    while (rc == 0 && (rc = rb_xfer_run(c->dev, &x, err)) == -EINTR)
        rc = 0;
    if (rc < 0 && dsync_refused(&x, err))
        rc = 1;
    rb_xfer_release(&x);
    rb_dev_leave(c->dev);
    return rc;
}

/*
 * One metadata write durable by itself (rb_core_meta_can_sync_range): pwritev2(RWF_DSYNC)
 * writes back only its own range, then flushes the drive's write cache, where fdatasync would
 * write back every page the puts dirtied since the last flush. For a log group whose payloads
 * an earlier flush already made durable. A failure counts as a failed flush (and an injected
 * flush fault fails it): the kernel reports a write-back error of any page of the file to the
 * next sync of the descriptor, this one included, so the entries not proven durable are
 * dropped as after a failed fdatasync. A success proves nothing about other writes. Where the
 * flag is refused (dsync_refused), this write and every later one of the core are written and
 * then flushed whole, as before ranged syncs (no_dsync; rb_core_meta_can_sync_range says 0).
 */
int rb_core_meta_write_synced(rb_core *c, uint64_t off, void *buf, size_t len, rb_err *err)
{
    int rc;
    if (rb_core_take_flush_fault(c))
        rc = rb_err_set(err, RB_ERR_OS, EIO, "pwritev2(RWF_DSYNC) failed (injected)");
    else
        rc = atomic_load(&c->no_dsync) ? 1 : write_dsync(c, off, buf, len, err);
    if (rc == 1) {
        atomic_store(&c->no_dsync, 1);
        rc = rb_core_meta_write(c, off, buf, len, err);
        return rc < 0 ? rc : rb_core_flush(c, err);
    }
    if (rc == 0) {
        atomic_fetch_add(&c->flushes, 1);
        return 0;
    }
    if (err->kind == RB_ERR_VALUE || err->kind == RB_ERR_NOMEM)
        return rc;
    rb_core_note_fault(c, "synced write", off, err);
    pthread_mutex_lock(&c->mu);
    rb_core_flush_done_locked(c, rb_core_flush_begin_locked(c), 0);
    pthread_mutex_unlock(&c->mu);
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
 * A checkpoint decision. force as rb_core_checkpoint; room_n > 0: due only while a put of
 * room_n keys still needs it (rb_core_room_needed_locked), dirty or not.
 */
int rb_core_ckpt_due_locked(rb_core *c, int force, size_t room_n)
{
    if (room_n)
        return !c->closed && rb_core_room_needed_locked(c, room_n);
    int dirty = c->dirty_total > c->persisted;
    if (!dirty || force)
        return dirty;
    uint64_t now = rb_now_ns();
    int idle = c->inflight_io == 0 && now - c->last_io_ns >= (uint64_t)c->cfg.meta_idle_quiet_ms * 1000000ull;
    /* the log format: also when its journal is overdue, busy or not (rb_core_ml_overdue_locked) */
    return idle || rb_core_ml_overdue_locked(c, now);
}

/* Metadata writes so far (format v1 containers, log groups and bases): a checkpoint that
 * wrote none is not timed. */
static uint64_t meta_writes(rb_core *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t n = c->ckpt_written + c->ml.groups_written + c->ml.bases_written;
    pthread_mutex_unlock(&c->mu);
    return n;
}

static int checkpoint_impl(rb_core *c, int force, size_t room_n, rb_err *err)
{
    uint64_t t0 = rb_obs_t0(&c->obs), before = t0 ? meta_writes(c) : 0;
    int rc;
    if (c->ml.on) {
        rc = rb_core_ml_checkpoint(c, force, room_n, err);
    } else {
        pthread_mutex_lock(&c->ckpt_mu);
        rc = rb_core_ckpt_v1_locked(c, force, room_n, -1, err);
        pthread_mutex_unlock(&c->ckpt_mu);
    }
    if (t0 && meta_writes(c) != before)
        rb_obs_done(&c->obs, RB_H_CHECKPOINT, t0);
    return rc;
}

int rb_core_checkpoint(rb_core *c, int force, rb_err *err)
{
    int rc = checkpoint_impl(c, force, 0, err);
    (void)rb_core_dealloc_run(c); /* the slots it made reusable (a failure is counted there) */
    return rc;
}

/* Whether release_held is to write a whole checkpoint (with the flush of every payload written
 * since the last): only for FREEs that nothing under way will make durable, not those of pages
 * another checkpoint is writing, nor, once a lane was written (lane_written), those of a lane
 * begun since (the deletes that made them woke the periodic thread for the next lane).
 * *under_way: some freed slot waits in pages another checkpoint is writing. */
static int held_waiting(rb_core *c, int lane_written, int *under_way)
{
    pthread_mutex_lock(&c->mu);
    uint64_t taken = c->ml.on ? rb_core_ml_held_taken_locked(c) : 0;
    uint64_t lane = lane_written && c->ml.lane ? c->ml.lane->n_frees : 0;
    *under_way = taken > 0;
    int waiting = rb_core_held_locked(c) - taken - lane > 0 || c->ref_unknown || !c->ml.on;
    pthread_mutex_unlock(&c->mu);
    return waiting;
}

int rb_core_release_held(rb_core *c, rb_err *err)
{
    if (c->dev == NULL || rb_dev_enter(c->dev) < 0)
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "RawBlockCore is closed");
    rb_dev_leave(c->dev);
    int rc = c->ml.on ? rb_core_ml_release_lane(c, err) : 0; /* a full log: 0, the checkpoint compacts */
    if (rc >= 0) {
        int under_way;
        int waiting = held_waiting(c, rc == 1, &under_way);
        if (!waiting && under_way) {
            /* Freed slots wait in pages another checkpoint is writing: it is waited for (its
             * lock), not written again, so that a slot still held when this returns waits for
             * a change to the index, as callers take it (rb_core_reclaim, the plugin's
             * evict-ahead). The pages it could not write wait for the checkpoint below. */
            rb_core_ml_wait_writer(c);
            waiting = held_waiting(c, rc == 1, &under_way);
        }
        if (waiting) {
            int r2 = checkpoint_impl(c, 1, 0, err);
            rc = r2 < 0 ? r2 : rc | r2;
        }
    }
    (void)rb_core_dealloc_run(c); /* the slots it made reusable (a failure is counted there) */
    return rc;
}

int rb_core_reclaim(rb_core *c, rb_err *err)
{
    int written = 0, rc = 0;
    pthread_mutex_lock(&c->reclaim_mu);
    while (written < RB_RECLAIM_MAX) {
        pthread_mutex_lock(&c->mu);
        int waiting = !c->closed && rb_core_held_locked(c) > 0;
        pthread_mutex_unlock(&c->mu);
        if (!waiting)
            break;
        rc = rb_core_release_held(c, err);
        if (rc <= 0)
            break;
        written++;
    }
    pthread_mutex_unlock(&c->reclaim_mu);
    return rc < 0 ? rc : written;
}

int rb_core_checkpoint_room(rb_core *c, size_t n, rb_err *err)
{
    return checkpoint_impl(c, 1, n ? n : 1, err);
}

/* ---- recovery at open ------------------------------------------------------------------ */

/* Recovery at open: the format the device holds chooses the reader. */
int rb_core_recover(rb_core *c, rb_err *err)
{
    /* Superblocks of the log format first: where they are valid, the v1 container headers they
     * replaced are gone, and a v1 header left in the other half is older than them. */
    int rc = rb_core_ml_recover(c, err);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    rc = rb_core_v1_recover(c, err);
    if (rc == 0 && c->ml.on)
        c->ml.state = c->rec_outcome == RB_REC_BLANK ? RB_ML_FRESH : RB_ML_MIGRATE;
    return rc;
}

/* ---- periodic thread ------------------------------------------------------------------- */

/* Whether the monotonic clock has reached ts. */
static int deadline_passed(const struct timespec *ts)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > ts->tv_sec || (now.tv_sec == ts->tv_sec && now.tv_nsec >= ts->tv_nsec);
}

/* One round of the periodic thread, woken by the kicks kicked (RB_KICK_*, 0: its deadline ts).
 * A kick writes now: the journal passed RB_ML_PENDING_MAX, all of it; deletes freed slots,
 * what makes them reusable (rb_core_release_held: the deletes' lane, alone when that is
 * enough); buffered puts, the start of their write-back. The period's checkpoint waits for an
 * idle moment, or in the log format for its oldest change to be a period old. Failures are
 * recorded in the status. 1 when the round wrote no checkpoint for a background wake-up before
 * the deadline, which then stands for the next round (a write-behind's wake-ups, every 8 MiB
 * of puts, would otherwise push it back for as long as the puts go on). */
static int thread_round(rb_core *c, int kicked, const struct timespec *ts)
{
    rb_err e;
    if ((kicked & RB_KICK_FREES) && !(kicked & RB_KICK_WRITE)) /* a whole one writes the lane first */
        rb_core_release_held(c, &e);
    /* after the lane: the write-back's submission may wait for the device's queue */
    if ((kicked & RB_KICK_WRITE_BEHIND) && rb_dev_enter(c->dev) == 0) {
        atomic_fetch_add(&c->write_behinds, (uint64_t)rb_dev_write_behind(c->dev));
        rb_dev_leave(c->dev);
    }
    /* a compaction's or a write-behind's wake-up alone writes no checkpoint, unless the period
     * ended meanwhile */
    int background = kicked && !(kicked & ~(RB_KICK_COMPACT | RB_KICK_WRITE_BEHIND));
    if (background && !deadline_passed(ts))
        return 1;
    rb_core_checkpoint(c, kicked & RB_KICK_WRITE, &e);
    return 0;
}

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
    const uint64_t period =
        (uint64_t)(c->cfg.meta_checkpoint_interval_sec ? c->cfg.meta_checkpoint_interval_sec : 1) * 1000000000ull;
    int backlog = 0; /* freed slots still wait for their deallocation: the next round soon */
    int stands = 0;  /* the last round left its deadline standing (thread_round) */
    struct timespec ts;
    for (;;) {
        /* 10 ms with a backlog (another thread's run may hold the batch); else the period, or
         * less: until the oldest journaled change is one period old (log format). Computed
         * before thr_mu (it takes mu). */
        if (!stands || backlog)
            rb_deadline_in(&ts, backlog ? 10ull * 1000 * 1000 : rb_core_ml_wait_ns(c, period));
        pthread_mutex_lock(&c->thr_mu);
        while (!c->thr_stop && !c->thr_kick && pthread_cond_timedwait(&c->thr_cv, &c->thr_mu, &ts) != ETIMEDOUT)
            ;
        if (c->thr_stop)
            break;
        int kicked = c->thr_kick;
        c->thr_kick = 0;
        pthread_mutex_unlock(&c->thr_mu);
        rb_err e;
        stands = thread_round(c, kicked, &ts);
        /* The log format compacts here, off every caller's path, once the ring is past half
         * full (or full: then groups wait for it); stopped by a close. */
        if (c->ml.on && rb_core_ml_compact_due(c)) {
            rb_core_ml_compact_periodic(c, &e);
            (void)rb_core_dealloc_run(c);
        }
        backlog = rb_core_dealloc_pending(c);
    }
    pthread_mutex_unlock(&c->thr_mu);
    return NULL;
}

void rb_core_note_buffered(rb_core *c, uint64_t bytes)
{
    if (!c->thr_started || c->dev->odirect || c->dev->uring_cmd)
        return;
    uint64_t acc = atomic_fetch_add(&c->wb_acc, bytes) + bytes;
    if (acc >= RB_WRITE_BEHIND_BYTES && atomic_exchange(&c->wb_acc, 0) >= RB_WRITE_BEHIND_BYTES)
        rb_core_ml_kick(c, RB_KICK_WRITE_BEHIND);
}

void rb_core_ml_kick(rb_core *c, int why)
{
    if (!c->thr_started)
        return;
    pthread_mutex_lock(&c->thr_mu);
    c->thr_kick |= why;
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
