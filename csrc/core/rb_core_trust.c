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
    free(c->wr);
    c->wr = NULL;
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
    if (desc && name)
        snprintf(buf, n, "%s failed%s of %s: %s: %s (%s)", op, where, c->path, err->msg, desc, name);
    else
        snprintf(buf, n, "%s failed%s of %s: %s (errno %d)", op, where, c->path, err->msg, e);
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

/* wr[wr_head..wr_n) is in commit order, so in nondecreasing gen order: a flush's success pops
 * a prefix. Generations wrap; they are compared by their difference. */
static inline int gen_before(uint32_t a, uint32_t b)
{
    return (int32_t)(a - b) < 0;
}

int rb_core_write_committed_locked(rb_core *c, uint32_t slot)
{
    if (c->wr_head == c->wr_n)
        c->wr_head = c->wr_n = 0;
    if (c->wr_n == c->wr_cap) {
        if (c->wr_head > 0 && c->wr_head >= c->wr_cap / 2) {
            /* At least half the array is popped: slide the rest down (amortised O(1)). */
            memmove(c->wr, c->wr + c->wr_head, (c->wr_n - c->wr_head) * sizeof(*c->wr));
            c->wr_n -= c->wr_head;
            c->wr_head = 0;
        } else {
            size_t nc = c->wr_cap ? c->wr_cap * 2 : 256;
            struct rb_wr *p = realloc(c->wr, nc * sizeof(*p));
            if (!p)
                return -ENOMEM;
            c->wr = p;
            c->wr_cap = nc;
        }
    }
    c->wr[c->wr_n].slot = slot;
    c->wr[c->wr_n].gen = c->flush_begun;
    c->wr_n++;
    return 0;
}

uint32_t rb_core_flush_begin_locked(rb_core *c)
{
    return ++c->flush_begun;
}

static int cmp_wr_slot(const void *a, const void *b)
{
    uint32_t x = ((const struct rb_wr *)a)->slot, y = ((const struct rb_wr *)b)->slot;
    return (x > y) - (x < y);
}

/* A flush failed: every entry on a slot written since the last flush that succeeded may have
 * lost its bytes. Drop them (sorting the written slots in place and looking each entry up:
 * O(N log k) on this rare path, no allocation), and open a new epoch so that puts still in
 * flight roll back at commit. mu held. */
static void writes_lost_locked(rb_core *c)
{
    c->wb_epoch++;
    size_t k = c->wr_n - c->wr_head;
    if (k == 0)
        return;
    struct rb_wr *w = c->wr + c->wr_head;
    qsort(w, k, sizeof(*w), cmp_wr_slot);
    uint64_t dropped = 0;
    for (uint32_t p = 0; p < c->index.n_ents; p++) {
        const rb_ent *e = &c->index.ents[p];
        if (e->flags & RB_ENT_DEAD)
            continue;
        struct rb_wr key = {.slot = e->slot};
        if (bsearch(&key, w, k, sizeof(*w), cmp_wr_slot)) {
            rb_core_drop_locked(c, p);
            dropped++;
        }
    }
    c->wr_head = c->wr_n = 0;
    c->wb_dropped += dropped;
    if (dropped) {
        c->dirty_total++;
        rb_idx_maybe_compact(&c->index);
    }
}

void rb_core_flush_done_locked(rb_core *c, uint32_t gen, int ok)
{
    if (!ok) {
        writes_lost_locked(c);
        return;
    }
    while (c->wr_head < c->wr_n && gen_before(c->wr[c->wr_head].gen, gen))
        c->wr_head++;
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
    if (rc == 0) {
        c->dev_size_seen = size;
        uint64_t end = size < c->capacity ? size : c->capacity;
        uint64_t fit = end > c->data_base ? (end - c->data_base) / c->cfg.slot_bytes : 0;
        if (fit < c->usable_slots)
            shrink_locked(c, (uint32_t)fit);
    }
    uint32_t usable = c->usable_slots;
    pthread_mutex_unlock(&c->mu);
    return usable;
}

void rb_core_trust_counts(rb_core *c, uint64_t out[4])
{
    pthread_mutex_lock(&c->mu);
    out[1] = c->load_rejected;
    out[2] = c->wb_dropped;
    out[3] = c->shrink_dropped;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&c->fault_mu);
    out[0] = c->n_faults;
    pthread_mutex_unlock(&c->fault_mu);
}
