/*
 * rb_core_dealloc.c - freed slots given back to the device.
 *
 * A slot becomes reusable when no durable metadata lists its old key any more (format v1: both
 * containers exclude it; the log format: its FREE record is durable) and no reader can still be
 * reading it (the quarantine in rb_core_hold.c). At that moment, with deallocation on, it does
 * not go back to the allocator yet: it waits on a pending list until rb_core_dealloc_run
 * deallocates its range, then returns to the allocator. So a deallocation never reaches a slot
 * that holds a key: the slot is out of the allocator while its range is being deallocated.
 *
 * Runs are batched with the operation that freed the slots: the checkpoint that made FREE
 * records durable (the periodic thread, an explicit checkpoint, close), a compaction, and in
 * format v1, which frees at the delete itself, delete_many (its binding runs it after the call,
 * without the GIL). Never on the put path: a put that finds no free slot takes
 * pending ones without deallocating them (dealloc_skipped): the write about to land on the slot
 * retires its old bytes on the drive anyway. Only when every freed slot is in a batch being
 * deallocated does a put wait, for that batch (at most RB_DEALLOC_BATCH slots) to end. Adjacent
 * slots merge into one range; the device packs ranges into commands (rb_dev_deallocate).
 *
 * With extents (extent_bytes, rb_slots.h) the unit is the extent: a reusable slot goes back to
 * the allocator at once, and an extent whose every slot is free waits there, out of use, until
 * a run deallocates its whole range (one range, merged with adjacent extents), then becomes
 * clean. A put that finds no free slot makes the waiting extents clean undeallocated.
 *
 * A failed deallocation loses nothing: the slots return to the allocator with their old bytes,
 * the failure is counted and entered in the fault journal. A device or file system that cannot
 * deallocate is detected once (rb_device.h) and the feature then reports itself unsupported.
 * Lock order: dl_mu (one run at a time) before mu; the device call runs with neither held.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A deallocation batch: at most RB_DEALLOC_BATCH slots (its scratch, 20 bytes a slot) in at
 * most RB_DEALLOC_RANGES ranges after merging (a system call each on files and block devices,
 * one NVMe command). A put that finds no free slot cannot take a batch's slots while it runs;
 * the rest stay pending, where it can. */
#define RB_DEALLOC_BATCH 8192u
#define RB_DEALLOC_RANGES 256u
#define RB_DEALLOC_RUN_BATCHES 16u /* per rb_core_dealloc_run call: 4,096 ranges */

void rb_core_dealloc_init(rb_core *c)
{
    pthread_mutex_init(&c->dl_mu, NULL);
    pthread_cond_init(&c->dl_cv, NULL);
    int mode = c->cfg.deallocate_freed;
    int dev_kind_wants = c->dev->is_blk || c->dev->uring_cmd;
    c->dl_on = mode == RB_DEALLOC_ON || (mode == RB_DEALLOC_AUTO && dev_kind_wants);
    if (c->dl_on && rb_dev_dealloc_support(c->dev, NULL) == RB_DEALLOC_NO)
        c->dl_on = 0;
    c->slots.ext.hold = c->dl_on;
}

void rb_core_dealloc_free(rb_core *c)
{
    pthread_mutex_destroy(&c->dl_mu);
    pthread_cond_destroy(&c->dl_cv);
    free(c->dl_pend);
    c->dl_pend = NULL;
    c->dl_npend = c->dl_cap = 0;
    free(c->dl_log);
    c->dl_log = NULL;
    c->dl_nlog = c->dl_caplog = 0;
}

void rb_core_release_slot_locked(rb_core *c, uint32_t slot)
{
    if (c->dl_on && !c->slots.ext.per) {
        if (rb_slot_list_push(&c->dl_pend, &c->dl_npend, &c->dl_cap, slot) == 0)
            return;
        c->dl_skipped++; /* out of memory: the slot is reused without its deallocation */
    }
    rb_slots_release(&c->slots, slot);
}

size_t rb_core_dealloc_take_locked(rb_core *c)
{
    if (c->slots.ext.per) {
        size_t m = rb_ext_skip_pending(&c->slots);
        c->dl_skipped += m;
        return m;
    }
    size_t n = c->dl_npend;
    for (size_t i = 0; i < n; i++)
        rb_slots_release(&c->slots, c->dl_pend[i]);
    c->dl_npend = 0;
    c->dl_skipped += n;
    return n;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorted slots as byte ranges, adjacent slots merged. Strided (rb_slot_offset): slots of
 * different extents are never adjacent on the device, and a whole extent is one range of
 * extent_bytes (its unused tail included, so the range covers the reclaim unit); a range's
 * length / slot_bytes is still its slot count. Returns the number of ranges. */
static size_t slots_to_ranges(const rb_core *c, const uint32_t *s, size_t n, rb_dev_range *r)
{
    size_t k = 0;
    uint64_t sb = c->cfg.slot_bytes, whole = (uint64_t)c->ext_per * sb;
    if (c->n_sc > 1) /* size classes: a wholly free extent's ids tile it in its smallest slots */
        whole = (uint64_t)c->ext_per * (sb = c->sc_bytes[c->n_sc - 1]);
    for (size_t i = 0; i < n; i++) {
        uint64_t off = rb_slot_offset(c, s[i]);
        if (k > 0 && r[k - 1].off + r[k - 1].len == off) {
            r[k - 1].len += sb;
            continue;
        }
        if (k > 0 && c->ext_stride && r[k - 1].len == whole)
            r[k - 1].len = c->ext_stride;
        r[k].off = off;
        r[k].len = sb;
        k++;
    }
    if (k > 0 && c->ext_stride && r[k - 1].len == whole)
        r[k - 1].len = c->ext_stride;
    return k;
}

/* The journal a test or `waf replay` reads (rb_core_dealloc_log_take). mu held. */
static void log_ranges_locked(rb_core *c, const rb_dev_range *r, size_t n)
{
    if (!c->dl_log_on)
        return;
    if (c->dl_nlog + n > c->dl_caplog) {
        size_t nc = c->dl_caplog ? c->dl_caplog : 256;
        while (nc < c->dl_nlog + n)
            nc *= 2;
        rb_dev_range *np = realloc(c->dl_log, nc * sizeof(*np));
        if (!np)
            return; /* a statistic hook: its caller sees fewer ranges than were deallocated */
        c->dl_log = np;
        c->dl_caplog = nc;
    }
    memcpy(c->dl_log + c->dl_nlog, r, n * sizeof(*r));
    c->dl_nlog += n;
}

void rb_core_dealloc_reset_locked(rb_core *c)
{
    c->dl_npend = 0;
}

/* ref_unknown bit 0x4: a log on the device that this core did not read or replaced without
 * journaling (a state applied at run time, a start told to ignore the device) may list any slot
 * until the first base is durable; puts reuse no slot meanwhile (rb_core_put.c). No slot is
 * deallocated either: after a crash that log is what recovery reads, and its keys must find
 * their bytes. The slots wait; the run after that base deallocates them. (Format v1's bits for
 * a container not read at open do not stop deallocation: recovery reads that container only
 * when the newer one is unreadable, which a crash alone does not cause.) mu held. */
static int dealloc_allowed_locked(const rb_core *c)
{
    return !(c->ref_unknown & 0x4u);
}

/* With extents: a batch of whole extents waiting for their deallocation (at most
 * RB_DEALLOC_BATCH slots, at least one extent, at most RB_DEALLOC_RANGES extents), their slots
 * in order into *s. mu held; as batch_take. */
static int batch_take_extents_locked(rb_core *c, uint32_t **s, size_t *n)
{
    rb_slots *sl = &c->slots;
    uint32_t per = sl->ext.per, want = RB_DEALLOC_BATCH / per;
    want = want == 0 ? 1 : want > RB_DEALLOC_RANGES ? RB_DEALLOC_RANGES : want;
    if (want > sl->ext.n_pending)
        want = sl->ext.n_pending;
    if (want == 0 || !dealloc_allowed_locked(c))
        return 0;
    *s = malloc((size_t)want * per * sizeof(**s));
    if (!*s)
        return -ENOMEM;
    *n = 0;
    for (uint32_t k = 0; k < want; k++) {
        uint32_t e = rb_ext_take_pending(sl);
        for (uint32_t i = 0; i < per; i++)
            (*s)[(*n)++] = sl->ext.first + e * per + i;
    }
    c->dl_inflight = *n;
    return 1;
}

/* Take a batch of at most RB_DEALLOC_BATCH pending slots (the newest) into *s (*n of them,
 * counted in dl_inflight, the caller frees *s): 1 taken, 0 nothing may be deallocated now,
 * -ENOMEM. */
static int batch_take(rb_core *c, uint32_t **s, size_t *n)
{
    pthread_mutex_lock(&c->mu);
    if (c->slots.ext.per) {
        int rc = batch_take_extents_locked(c, s, n);
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    if (c->dl_npend == 0 || !dealloc_allowed_locked(c)) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    *n = c->dl_npend < RB_DEALLOC_BATCH ? c->dl_npend : RB_DEALLOC_BATCH;
    *s = malloc(*n * sizeof(**s));
    if (!*s) {
        pthread_mutex_unlock(&c->mu);
        return -ENOMEM;
    }
    c->dl_npend -= *n;
    memcpy(*s, c->dl_pend + c->dl_npend, *n * sizeof(**s));
    c->dl_inflight = *n;
    pthread_mutex_unlock(&c->mu);
    return 1;
}

/* The cost is per range (a system call each on files and block devices): the slots of the
 * batch s[0..n) past its first RB_DEALLOC_RANGES ranges r go back to the pending list, where a
 * put can take them (out of memory: to the allocator undeallocated). Returns the slots kept. */
static size_t batch_trim(rb_core *c, const uint32_t *s, size_t n, const rb_dev_range *r)
{
    size_t m = 0;
    for (size_t i = 0; i < RB_DEALLOC_RANGES; i++)
        m += (size_t)(r[i].len / c->cfg.slot_bytes);
    pthread_mutex_lock(&c->mu);
    for (size_t i = m; i < n; i++)
        if (rb_slot_list_push(&c->dl_pend, &c->dl_npend, &c->dl_cap, s[i]) < 0) {
            rb_slots_release(&c->slots, s[i]); /* out of memory: reused undeallocated */
            c->dl_skipped++;
        }
    c->dl_inflight = m;
    pthread_cond_broadcast(&c->dl_cv);
    pthread_mutex_unlock(&c->mu);
    return m;
}

/* After the device call (rc, cmds commands, dt ns) over the k ranges r of the batch's n slots
 * s: the slots back in use, the statistics and the journal; a device that reports itself
 * unable to deallocate turns the feature off. Takes mu. */
static void batch_settle(rb_core *c, const uint32_t *s, size_t n, const rb_dev_range *r, size_t k, int rc,
                         uint64_t cmds, uint64_t dt)
{
    pthread_mutex_lock(&c->mu);
    if (c->slots.ext.per) /* whole extents, in order: clean now */
        for (size_t i = 0; i < n; i += c->slots.ext.per)
            rb_ext_clean(&c->slots, rb_ext_of(&c->slots, s[i]), rc == 0);
    else
        for (size_t i = 0; i < n; i++)
            rb_core_slot_back_locked(c, s[i]);
    c->dl_inflight = 0;
    pthread_cond_broadcast(&c->dl_cv);
    c->dl_cmds += cmds;
    c->dl_ns += dt;
    if (rc == 0) {
        c->dl_slots += n;
        c->dl_ranges += k;
        for (size_t i = 0; i < k; i++)
            c->dl_bytes += r[i].len;
        log_ranges_locked(c, r, k);
    } else {
        c->dl_failures++;
        if (rc != -ENOMEM && rb_dev_dealloc_support(c->dev, NULL) == RB_DEALLOC_NO) {
            c->dl_on = 0; /* detected once: the feature reports itself unsupported */
            c->slots.ext.hold = 0;
            rb_core_dealloc_take_locked(c);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* One batch of at most RB_DEALLOC_BATCH pending slots (the newest): 1 done, 0 nothing pending,
 * <0 the device call failed. dl_mu held. */
static int run_batch(rb_core *c)
{
    uint32_t *s;
    size_t n;
    int got = batch_take(c, &s, &n);
    if (got <= 0)
        return got;
    uint64_t t0 = rb_now_ns();
    qsort(s, n, sizeof(*s), cmp_u32);
    rb_dev_range *r = malloc(n * sizeof(*r));
    size_t k = r ? slots_to_ranges(c, s, n, r) : 0;
    if (k > RB_DEALLOC_RANGES) {
        n = batch_trim(c, s, n, r);
        k = RB_DEALLOC_RANGES;
    }
    uint64_t cmds = 0;
    rb_err err;
    rb_err_clear(&err);
    int rc = r ? rb_dev_deallocate(c->dev, r, k, &cmds, &err) : -ENOMEM;
    batch_settle(c, s, n, r, k, rc, cmds, rb_now_ns() - t0);
    if (rc < 0 && rc != -ENOMEM)
        rb_core_note_fault(c, "deallocate", k ? r[0].off : UINT64_MAX, &err);
    free(r);
    free(s);
    return rc < 0 ? rc : 1;
}

int rb_core_dealloc_pending(rb_core *c)
{
    pthread_mutex_lock(&c->mu);
    /* slots (extents) a run would deallocate now */
    int n = (c->dl_npend > 0 || c->slots.ext.n_pending > 0) && dealloc_allowed_locked(c);
    pthread_mutex_unlock(&c->mu);
    return n;
}

int rb_core_dealloc_run(rb_core *c)
{
    /* A run in progress goes on while slots are pending, this caller's included: a checkpoint
     * does not wait for it. A run that ends looks once more after letting go, for slots that
     * came after its last look. At most RB_DEALLOC_RUN_BATCHES batches a call: a backlog (a
     * restart's free slots on a device with slow discards) is worked off over the periodic
     * thread's next rounds, between its checkpoints, and what close leaves is deallocated after
     * the next open. */
    unsigned done = 0;
    for (;;) {
        if (pthread_mutex_trylock(&c->dl_mu) != 0)
            return 0;
        int rc = 0;
        unsigned was = done;
        uint64_t t0 = rb_obs_t0(&c->obs);
        while (done < RB_DEALLOC_RUN_BATCHES && (rc = run_batch(c)) > 0)
            done++;
        pthread_mutex_unlock(&c->dl_mu);
        if (done != was || rc < 0)
            rb_obs_done(&c->obs, RB_H_DEALLOC, t0);
        if (rc < 0)
            return rc;
        if (done >= RB_DEALLOC_RUN_BATCHES || !rb_core_dealloc_pending(c))
            return 0;
    }
}

void rb_core_dealloc_status_locked(const rb_core *c, rb_core_status *st)
{
    const char *why = "";
    int sup = c->dev ? rb_dev_dealloc_support(c->dev, &why) : RB_DEALLOC_UNKNOWN;
    st->dealloc_state = c->dl_on ? "on" : sup == RB_DEALLOC_NO ? "unsupported" : "off";
    st->dealloc_kind = c->dev ? rb_dev_dealloc_kind(c->dev) : "";
    st->dealloc_discard_path = c->dev ? rb_dev_discard_path(c->dev) : "";
    snprintf(st->dealloc_why, sizeof(st->dealloc_why), "%s", sup == RB_DEALLOC_NO ? why : "");
    st->dealloc_slots = c->dl_slots;
    st->dealloc_ranges = c->dl_ranges;
    st->dealloc_cmds = c->dl_cmds;
    st->dealloc_bytes = c->dl_bytes;
    st->dealloc_failures = c->dl_failures;
    st->dealloc_skipped = c->dl_skipped;
    st->dealloc_pending = c->dl_npend + c->dl_inflight + (uint64_t)c->slots.ext.n_pending * c->slots.ext.per;
    st->dealloc_ns = c->dl_ns;
}

void rb_core_discard_force_ioctl(rb_core *c)
{
    if (c->dev)
        rb_dev_discard_force_ioctl(c->dev);
}

void rb_core_dealloc_log_set(rb_core *c, int on)
{
    pthread_mutex_lock(&c->mu);
    c->dl_log_on = on;
    c->dl_nlog = 0;
    pthread_mutex_unlock(&c->mu);
}

size_t rb_core_dealloc_log_take(rb_core *c, uint64_t **out)
{
    _Static_assert(sizeof(rb_dev_range) == 2 * sizeof(uint64_t), "rb_dev_range is an (offset, length) pair");
    pthread_mutex_lock(&c->mu);
    *out = (uint64_t *)c->dl_log;
    size_t n = c->dl_nlog;
    c->dl_log = NULL;
    c->dl_nlog = c->dl_caplog = 0;
    pthread_mutex_unlock(&c->mu);
    return n;
}
