/*
 * rb_core_trust.c - what the core does when its device fails or changes under it:
 *   - the fault journal: the last RB_FAULTS_KEPT failed transfers and flushes (operation,
 *     offset, errno, time) and per-errno counts, kept until the core is freed: a later
 *     success clears nothing;
 *   - write durability: the slots written since the last flush that succeeded, and what a
 *     failed flush does to their entries (Linux reports a write-back error to one fsync of a
 *     file description, so the next flush succeeds without the lost bytes);
 *   - device shrink: the entries a smaller device no longer holds, and the slots past its end.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void rb_core_trust_init(rb_core *c)
{
    pthread_mutex_init(&c->fault_mu, NULL);
}

void rb_core_trust_free(rb_core *c)
{
    free(c->slot_gen);
    c->slot_gen = NULL;
    pthread_mutex_destroy(&c->fault_mu);
}

/* ---- fault journal --------------------------------------------------------------------- */

void rb_core_fault_text(const rb_core *c, const char *op, uint64_t off, const rb_err *err, char *buf, size_t n)
{
    char where[48] = "";
    if (off != UINT64_MAX)
        snprintf(where, sizeof where, " at offset %llu", (unsigned long long)off);
    int e = err->errnum;
    const char *desc = e > 0 ? strerrordesc_np(e) : NULL;
    const char *name = e > 0 ? strerrorname_np(e) : NULL;
    /* The path last: a long one is what the length limit cuts, not the errno's name. */
    if (desc && name)
        snprintf(buf, n, "%s failed%s: %s: %s (%s); device_path='%s'", op, where, err->msg, desc, name, c->path);
    else
        snprintf(buf, n, "%s failed%s: %s (errno %d); device_path='%s'", op, where, err->msg, e, c->path);
}

void rb_core_note_fault(rb_core *c, const char *op, uint64_t off, const rb_err *err)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&c->fault_mu);
    uint64_t seq = ++c->n_faults;
    rb_fault *f = &c->faults[(seq - 1) % RB_FAULTS_KEPT];
    f->seq = seq;
    f->time_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    f->offset = off;
    f->errnum = err->errnum;
    snprintf(f->op, sizeof f->op, "%s", op);
    rb_core_fault_text(c, op, off, err, f->text, sizeof f->text);
    int e = err->errnum;
    c->fault_by_errno[e > 0 && e < RB_ERRNO_SLOTS ? e : 0]++;
    pthread_mutex_unlock(&c->fault_mu);
}

/* ---- write durability ------------------------------------------------------------------ */

int rb_core_write_committed_locked(rb_core *c, uint32_t slot)
{
    if (slot >= c->slot_gen_cap) {
        uint64_t nc = c->slot_gen_cap ? c->slot_gen_cap : 1024;
        while (nc <= slot)
            nc *= 2;
        if (nc > c->max_slots)
            nc = c->max_slots;
        uint64_t *p = realloc(c->slot_gen, nc * sizeof(*p));
        if (!p)
            return -ENOMEM;
        memset(p + c->slot_gen_cap, 0, (nc - c->slot_gen_cap) * sizeof(*p));
        c->slot_gen = p;
        c->slot_gen_cap = (uint32_t)nc;
    }
    c->slot_gen[slot] = c->flush_begun + 1; /* the next flush to begin proves it */
    c->commits++;
    return 0;
}

uint64_t rb_core_flush_begin_locked(rb_core *c)
{
    c->commits_at_begin = c->commits;
    return ++c->flush_begun;
}

/* A flush failed: every entry on a slot written since the last flush that succeeded may have
 * lost its bytes. Drop them (one pass over the index: O(N) on this rare path, bounded memory
 * whatever the put rate), and open a new epoch so that puts still in flight roll back at
 * commit. mu held. */
static void writes_lost_locked(rb_core *c)
{
    c->wb_epoch++;
    uint64_t dropped = 0;
    for (uint32_t p = 0; p < c->index.n_ents; p++) {
        const rb_ent *e = &c->index.ents[p];
        if (e->flags & RB_ENT_DEAD || e->slot >= c->slot_gen_cap || c->slot_gen[e->slot] <= c->durable_gen)
            continue;
        rb_core_drop_locked(c, p);
        dropped++;
    }
    c->commits_proven = c->commits;
    atomic_fetch_add(&c->wb_dropped, dropped);
    if (dropped) {
        c->dirty_total++;
        rb_idx_maybe_compact(&c->index);
        /* The log format journals their FREE records in a page after the one holding their PUT
         * records, and two groups are not atomic together: the next checkpoint writes a whole
         * base before any group (rb_core_mlog.c's write_groups). */
        if (c->ml.on)
            c->ml.need_base++;
    }
}

void rb_core_flush_done_locked(rb_core *c, uint64_t gen, int ok)
{
    if (!ok) {
        writes_lost_locked(c);
        return;
    }
    if (gen > c->durable_gen) {
        c->durable_gen = gen;
        c->commits_proven = c->commits_at_begin;
    }
}

size_t rb_core_trust_mem_bytes(const rb_core *c)
{
    return (size_t)c->slot_gen_cap * sizeof(*c->slot_gen);
}

/* ---- device shrink --------------------------------------------------------------------- */

/* The device now holds only slots [0, fit): drop the entries beyond and keep those slots out
 * of use (reserve_locked retires them as the allocator hands them out). mu held. */
static void shrink_locked(rb_core *c, uint32_t fit)
{
    c->usable_slots = fit;
    uint64_t dropped = 0;
    for (uint32_t p = 0; p < c->index.n_ents; p++) {
        const rb_ent *e = &c->index.ents[p];
        if (!(e->flags & RB_ENT_DEAD) && e->slot >= fit) {
            rb_core_drop_locked(c, p);
            dropped++;
        }
    }
    c->shrink_dropped += dropped;
    if (dropped) {
        c->dirty_total++;
        rb_idx_maybe_compact(&c->index);
    }
}

uint32_t rb_core_check_size(rb_core *c)
{
    uint64_t size = 0;
    int rc = -ESHUTDOWN;
    if (c->dev && rb_dev_enter(c->dev) == 0) {
        rc = rb_dev_current_size(c->dev, &size);
        rb_dev_leave(c->dev);
    }
    pthread_mutex_lock(&c->mu);
    if (rc == 0 && size > 0) { /* a size of 0 is a device failing to answer, not a shrink to 0 */
        c->dev_size_seen = size;
        uint64_t end = size < c->capacity ? size : c->capacity;
        uint64_t fit = rb_slots_below(c, end);
        if (fit < c->usable_slots)
            shrink_locked(c, (uint32_t)fit);
    }
    uint32_t usable = c->usable_slots;
    pthread_mutex_unlock(&c->mu);
    return usable;
}

void rb_core_trust_counts(rb_core *c, uint64_t out[4])
{
    /* atomics: no lock, so a caller holding the GIL never waits behind a checkpoint's encode */
    out[0] = atomic_load_explicit(&c->n_faults, memory_order_relaxed);
    out[1] = atomic_load_explicit(&c->load_rejected, memory_order_relaxed);
    out[2] = atomic_load_explicit(&c->wb_dropped, memory_order_relaxed);
    out[3] = atomic_load_explicit(&c->shrink_dropped, memory_order_relaxed);
}
