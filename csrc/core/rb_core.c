/*
 * rb_core.c - core lifecycle (open, layout, close) and the index operations: put, load,
 * exists, metadata queries, locks, delete. Checkpoint/recovery live in rb_core_ckpt.c.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "rb_config.h"
#include "rb_core_ident.h"
#include "rb_probe.h"
#include "rb_uring.h"

uint64_t rb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- device transfers ------------------------------------------------------------------ */

static int take_fault(_Atomic int64_t *ctr)
{
    int64_t v = atomic_load(ctr);
    while (v > 0) {
        if (atomic_compare_exchange_weak(ctr, &v, v - 1))
            return v == 1;
    }
    return 0;
}

/* One synchronous transfer; a data read may take the slot header before it (head). A failed
 * data transfer or metadata write goes into the fault journal. */
static int dev_xfer(rb_core *c, int write, uint64_t off, void *buf, size_t buf_len, size_t payload_len,
                    size_t total_len, int data, void *head, size_t head_len, rb_err *err)
{
    int rc;
    if (data && take_fault(write ? &c->fault_write : &c->fault_read)) {
        rc = rb_err_set(err, RB_ERR_OS, EIO, write ? "pwrite failed (injected)" : "pread failed (injected)");
        goto out;
    }
    if (rb_dev_enter(c->dev) < 0)
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "device is closed");
    rb_xfer x;
    rc = rb_xfer_init(c->dev, &x, write, off, buf, buf_len, payload_len, total_len, err);
    if (rc == 0 && head_len)
        rc = rb_xfer_set_head(c->dev, &x, head, head_len, err);
    if (rc == 0)
        rc = rb_xfer_prepare(c->dev, &x, err);
    if (rc == 0) {
        do {
            rc = rb_xfer_run(c->dev, &x, err);
        } while (rc == -EINTR);
    }
    rb_xfer_release(&x);
    rb_dev_leave(c->dev);
out:
    if (rc < 0 && (data || write) && err->kind != RB_ERR_VALUE && err->kind != RB_ERR_NOMEM)
        rb_core_note_fault(c, write ? "write" : "read", off - head_len, err);
    return rc;
}

int rb_core_dev_write(rb_core *c, uint64_t off, const void *buf, size_t buf_len, size_t payload_len, size_t total_len,
                      int data, rb_err *err)
{
    return dev_xfer(c, 1, off, (void *)buf, buf_len, payload_len, total_len, data, NULL, 0, err);
}

int rb_core_dev_read(rb_core *c, uint64_t off, void *buf, size_t buf_len, size_t payload_len, size_t total_len,
                     int data, rb_err *err)
{
    return dev_xfer(c, 0, off, buf, buf_len, payload_len, total_len, data, NULL, 0, err);
}

int rb_core_dev_read_headed(rb_core *c, uint64_t off, void *head, size_t head_len, void *buf, size_t buf_len,
                            size_t payload_len, size_t total_len, rb_err *err)
{
    return dev_xfer(c, 0, off, buf, buf_len, payload_len, total_len, 1, head, head_len, err);
}

void rb_core_inject_fault(rb_core *c, int kind, int64_t countdown)
{
    _Atomic int64_t *ctr = kind == RB_FAULT_WRITE    ? &c->fault_write
                           : kind == RB_FAULT_READ   ? &c->fault_read
                           : kind == RB_FAULT_SUBMIT ? &c->fault_submit
                           : kind == RB_FAULT_FLUSH  ? &c->fault_flush
                                                     : &c->fault_prep;
    atomic_store(ctr, countdown);
}

int rb_core_take_flush_fault(rb_core *c)
{
    return take_fault(&c->fault_flush);
}

/* ---- io_uring batches ------------------------------------------------------------------ */

int rb_core_register_buffers(rb_core *c, const uint64_t *ptrs, const uint64_t *sizes, size_t n, rb_err *err)
{
    if (!rb_core_uses_uring(c))
        return rb_err_set(err, RB_ERR_RUNTIME, EINVAL, "fixed buffers require io_engine='io_uring'");
    if (rb_dev_enter(c->dev) < 0)
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "RawBlockCore is closed");
    int rc = rb_uring_register_buffers(c->dev->uring, ptrs, sizes, n, err);
    rb_dev_leave(c->dev);
    return rc;
}

int rb_core_uring_ops(rb_core *c, rb_uop *ops, size_t n, size_t per, int data, rb_err *err)
{
    rb_uops_run r;
    int ret = rb_core_uring_ops_begin(c, &r, ops, n, per, data, err);
    rb_core_uring_ops_finish(&r);
    return ret;
}

int rb_core_uring_ops_begin(rb_core *c, rb_uops_run *r, rb_uop *ops, size_t n, size_t per, int data, rb_err *err)
{
    memset(r, 0, sizeof(*r));
    r->c = c;
    r->ops = ops;
    r->n = n;
    r->data = data;
    r->unsent_from = n;
    for (size_t i = 0; i < n; i++) {
        ops[i].rc = 0;
        rb_err_clear(&ops[i].err);
    }
    if (n == 0)
        return 0;
    if (per == 0 || per > n)
        per = n;
    r->per = per;
    size_t nb = (n + per - 1) / per;
    rb_batch **bs = calloc(nb, sizeof(*bs));
    uint32_t *map = malloc(n * sizeof(uint32_t)); /* request (lo + j) of batch k -> op index */
    int ret = 0;
    if (!bs || !map) {
        ret = rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
        goto fail_all;
    }
    if (rb_dev_enter(c->dev) < 0) {
        ret = rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "device is closed");
        goto fail_all;
    }
    r->entered = 1;
    r->bs = bs;
    r->map = map;
    struct rb_uring *u = c->dev->uring;
    for (size_t k = 0; k < nb; k++) {
        size_t lo = k * per, hi = lo + per < n ? lo + per : n;
        rb_batch *b = rb_batch_new((uint32_t)(hi - lo), 0);
        int rc = 0;
        if (!b) {
            rc = rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
        } else {
            uint32_t j = 0;
            for (size_t i = lo; i < hi; i++) {
                rb_uop *o = &ops[i];
                if (data && take_fault(o->write ? &c->fault_write : &c->fault_read)) {
                    o->rc = rb_err_set(&o->err, RB_ERR_OS, EIO, "io_uring I/O error (injected)");
                    continue;
                }
                int rr = rb_batch_set(u, b, j, o->write ? RB_REQ_WRITE : RB_REQ_READ, o->off, o->buf, o->buf_len,
                                      o->payload_len, o->total_len, o->copy_len, &o->err);
                if (rr < 0) {
                    o->rc = rr;
                    continue;
                }
                b->reqs[j].pid = o->write ? o->pid : 0;
                map[lo + j++] = (uint32_t)i;
            }
            /* Requests that never reach the engine are left out of the batch: shrink it to
             * the ones described (the tail entries were never set). */
            b->n = j;
            bs[k] = b;
            if (j && data && take_fault(&c->fault_submit))
                rc = rb_err_set(err, RB_ERR_RUNTIME, EIO, "io_uring batch submission failed (injected)");
            if (rc == 0 && j)
                rc = rb_batch_prepare(u, b, err);
            if (rc == 0 && j && rb_uring_submit(u, b) < 0)
                rc = rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "io_uring worker stopped");
        }
        if (rc < 0) {
            for (size_t i = lo; i < n; i++) {
                if (ops[i].rc == 0) {
                    ops[i].rc = rc;
                    ops[i].err = *err;
                }
            }
            r->unsent_from = lo;
            r->unsent_rc = rc;
            rb_batch_free(b);
            bs[k] = NULL;
            ret = rc;
            break;
        }
        r->submitted = k + 1;
    }
    return ret;
fail_all:
    for (size_t i = 0; i < n; i++) {
        ops[i].rc = ret;
        ops[i].err = *err;
    }
    free(bs);
    free(map);
    return ret;
}

void rb_core_uring_ops_finish(rb_uops_run *r)
{
    if (!r->entered)
        return;
    struct rb_uring *u = r->c->dev->uring;
    for (size_t k = 0; k < r->submitted; k++) {
        rb_batch *b = r->bs[k];
        if (!b->n) {
            rb_batch_free(b);
            continue;
        }
        rb_uring_wait(u, b);
        for (uint32_t j = 0; j < b->n; j++) {
            rb_uop *o = &r->ops[r->map[k * r->per + j]];
            int rr = rb_batch_result(b, j, &o->err);
            if (rr < 0)
                o->rc = rr;
        }
        rb_batch_free(b);
    }
    rb_dev_leave(r->c->dev);
    free(r->bs);
    free(r->map);
    r->entered = 0;
    /* Into the fault journal: each request that failed, and a failed submission once (not once
     * per request it left unsent). */
    int unsent_noted = 0;
    for (size_t i = 0; i < r->n; i++) {
        const rb_uop *o = &r->ops[i];
        if (o->rc >= 0 || !(r->data || o->write) || o->rc == -ESHUTDOWN || o->err.kind == RB_ERR_VALUE ||
            o->err.kind == RB_ERR_NOMEM)
            continue;
        if (i >= r->unsent_from && o->rc == r->unsent_rc) {
            if (unsent_noted++)
                continue;
        }
        rb_core_note_fault(r->c, o->write ? "write" : "read", o->off, &o->err);
    }
}

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

/* ---- metadata classes ------------------------------------------------------------------ */

static void class_free(rb_class *k)
{
    if (!k)
        return;
    free(k->dtype);
    free(k->fmt);
    free(k->dims);
    free(k->json);
    free(k);
}

static char *dupn(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static uint32_t intern_class_slow(rb_core *c, const rb_meta_in *m);

/* Does class k describe m? (NUL-terminated copies in k: a name with a NUL inside never
 * matches, and is interned the long way.) */
static int class_is(const rb_class *k, const rb_meta_in *m)
{
    if (k->ndim != m->ndim || (m->ndim > 0 && memcmp(k->dims, m->dims, (size_t)m->ndim * sizeof(int64_t)) != 0))
        return 0;
    if (!k->dtype != !m->dtype ||
        (m->dtype && (strlen(k->dtype) != m->dtype_len || memcmp(k->dtype, m->dtype, m->dtype_len) != 0)))
        return 0;
    return !k->fmt == !m->fmt && (!m->fmt || (strlen(k->fmt) == m->fmt_len && memcmp(k->fmt, m->fmt, m->fmt_len) == 0));
}

uint32_t rb_core_intern_class(rb_core *c, const rb_meta_in *m)
{
    /* A batch's keys nearly always share one class: check the last one before building the
     * class's JSON key and probing the table (about 2,300 instructions a key). */
    if (c->last_cls < c->n_cls && class_is(c->cls[c->last_cls], m))
        return c->last_cls;
    uint32_t id = intern_class_slow(c, m);
    if (id != UINT32_MAX)
        c->last_cls = id;
    return id;
}

static uint32_t intern_class_slow(rb_core *c, const rb_meta_in *m)
{
    rb_buf b = {0};
    rb_buf_puts(&b, "\"shape\":");
    if (m->ndim < 0) {
        rb_buf_puts(&b, "null");
    } else {
        rb_buf_puts(&b, "[");
        for (int64_t i = 0; i < m->ndim; i++) {
            if (i)
                rb_buf_puts(&b, ",");
            rb_buf_i64(&b, m->dims[i]);
        }
        rb_buf_puts(&b, "]");
    }
    rb_buf_puts(&b, ",\"dtype\":");
    if (m->dtype)
        rb_buf_json_str(&b, m->dtype, m->dtype_len);
    else
        rb_buf_puts(&b, "null");
    rb_buf_puts(&b, ",\"fmt\":");
    if (m->fmt)
        rb_buf_json_str(&b, m->fmt, m->fmt_len);
    else
        rb_buf_puts(&b, "null");
    if (b.oom) {
        rb_buf_free(&b);
        return UINT32_MAX;
    }
    uint32_t h = rb_idx_hash(b.data, b.len);
    uint32_t p = rb_idx_find(&c->classes, b.data, b.len, h);
    if (p != UINT32_MAX) {
        rb_buf_free(&b);
        return c->classes.ents[p].slot;
    }
    if (c->n_cls == c->cap_cls) {
        uint32_t nc = c->cap_cls ? c->cap_cls * 2 : 16;
        rb_class **n = realloc(c->cls, (size_t)nc * sizeof(*n));
        if (!n) {
            rb_buf_free(&b);
            return UINT32_MAX;
        }
        c->cls = n;
        c->cap_cls = nc;
    }
    rb_class *k = calloc(1, sizeof(*k));
    if (!k)
        goto oom;
    k->ndim = m->ndim;
    if (m->dtype && !(k->dtype = dupn(m->dtype, m->dtype_len)))
        goto oom;
    if (m->fmt && !(k->fmt = dupn(m->fmt, m->fmt_len)))
        goto oom;
    if (m->ndim > 0) {
        k->dims = malloc((size_t)m->ndim * sizeof(int64_t));
        if (!k->dims)
            goto oom;
        memcpy(k->dims, m->dims, (size_t)m->ndim * sizeof(int64_t));
    }
    k->json = dupn(b.data, b.len);
    if (!k->json)
        goto oom;
    k->json_len = b.len;
    p = rb_idx_insert(&c->classes, b.data, b.len, h, NULL, -1);
    if (p == UINT32_MAX)
        goto oom;
    c->classes.ents[p].slot = c->n_cls;
    c->cls[c->n_cls] = k;
    rb_buf_free(&b);
    return c->n_cls++;
oom:
    class_free(k);
    rb_buf_free(&b);
    return UINT32_MAX;
}

/* ---- lifecycle ------------------------------------------------------------------------- */

static void quarantine_advance_locked(rb_core *c);

void rb_core_quarantine_slot_locked(rb_core *c, uint32_t slot)
{
    unsigned g = (unsigned)(c->rd_gen & 1);
    if (rb_slot_list_push(&c->rd_pend[g], &c->rd_npend[g], &c->rd_cap[g], slot) < 0)
        return; /* kept out of use (see rb_core_int.h) */
    c->rd_quarantined++;
    /* Start a new generation now if the previous one has no readers left, so readers that
     * begin after this free do not hold the slot back. */
    quarantine_advance_locked(c);
}

uint64_t rb_core_reader_begin_locked(rb_core *c)
{
    c->rd_active[c->rd_gen & 1]++;
    return c->rd_gen;
}

/* Release what no reader can hold any more, advancing the generation as far as possible. */
static void quarantine_advance_locked(rb_core *c)
{
    for (;;) {
        unsigned cur = (unsigned)(c->rd_gen & 1), prev = cur ^ 1u;
        if (c->rd_active[prev])
            return; /* readers of the previous generation may hold any slot freed since */
        for (size_t i = 0; i < c->rd_npend[prev]; i++)
            rb_core_release_slot_locked(c, c->rd_pend[prev][i]);
        c->rd_npend[prev] = 0;
        if (c->rd_npend[cur] == 0)
            return;
        /* Age the current generation: new readers start in the next one, and the slots freed
         * so far are released once the current readers are gone. */
        c->rd_gen++;
    }
}

void rb_core_reader_end_locked(rb_core *c, uint64_t gen)
{
    c->rd_active[gen & 1]--;
    quarantine_advance_locked(c);
}

void rb_core_quarantine_reset_locked(rb_core *c)
{
    c->rd_npend[0] = c->rd_npend[1] = 0;
    c->n_held = 0;
}

void rb_core_hold_slot_locked(rb_core *c, uint32_t slot)
{
    if (rb_slot_list_push(&c->held, &c->n_held, &c->cap_held, slot) < 0)
        return; /* kept out of use until the next recovery: never reused unsafely */
    c->held_total++;
}

int rb_core_ref_reserve_locked(rb_core *c, uint32_t n)
{
    if (n <= c->ref_cap)
        return 0;
    uint32_t nc = c->ref_cap ? c->ref_cap : 1024;
    while (nc < n)
        nc = nc > UINT32_MAX / 2 ? n : nc * 2;
    uint8_t *np = realloc(c->ref, nc);
    if (!np)
        return -ENOMEM;
    memset(np + c->ref_cap, 0, nc - c->ref_cap);
    c->ref = np;
    c->ref_cap = nc;
    return 0;
}

int rb_core_room_needed_locked(const rb_core *c, size_t n)
{
    if (c->ref_unknown)
        return 1;
    /* never-used slots count only while they lie inside the device (it may have shrunk) */
    uint32_t fresh = c->usable_slots > c->slots.next_slot ? c->usable_slots - c->slots.next_slot : 0;
    uint64_t avail = (uint64_t)c->slots.n_free + fresh + c->dl_npend;
    return (c->n_held > 0 || rb_core_ml_held_locked(c) > 0) && avail < n;
}

/* Account for the record at p leaving the index and free its slot (the caller removes it). */
static inline void drop_accounting_locked(rb_core *c, uint32_t p)
{
    rb_ent *e = &c->index.ents[p];
    if (e->refcnt > 0)
        c->locked_keys--;
    if (e->flags & RB_ENT_UNVERIFIED)
        c->n_unverified--;
    if (c->ml.on)
        rb_core_ml_free_locked(c, e->slot); /* journaled; reusable once the FREE is durable */
    else
        rb_core_free_slot_locked(c, e->slot);
}

void rb_core_drop_locked(rb_core *c, uint32_t p)
{
    drop_accounting_locked(c, p);
    rb_idx_remove_at(&c->index, p);
}

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

int rb_core_open(const rb_core_cfg *cfg, rb_core **out, rb_err *err)
{
    int rc0 = rb_core_cfg_check(cfg, err);
    if (rc0 < 0)
        return rc0;
    rb_core *c = calloc(1, sizeof(*c));
    if (!c)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    c->cfg = *cfg;
    c->path = strdup(cfg->device_path);
    if (!c->path) {
        free(c);
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    }
    c->cfg.device_path = c->path;
    c->good_container = -1;
    c->apply_container = -1;
    c->rec_lost = -1;
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
    };
    int rc = rb_dev_open(&dc, &c->dev, err);
    if (rc < 0)
        goto fail;
    /* The read-only foreign-device probe runs once the lock is held: a device another writer
     * holds, or a mounted one, is reported as such rather than by what its bytes look like. */
    if (!cfg->allow_foreign_device && !looks_ours(c)) {
        rc = refuse_foreign_device(cfg->device_path, cfg->use_uring_cmd, err);
        if (rc < 0)
            goto fail;
    }

    /* Layout (LMCache's geometry, no superblock). */
    uint64_t size = c->dev->size;
    c->capacity = (cfg->capacity_bytes > 0 && cfg->capacity_bytes < size) ? cfg->capacity_bytes : size;
    /* The log format at LMCache's default region size: the device's own size, or one sized from
     * the slot count on a blank device (rb_core_ml_region_bytes). */
    if (c->cfg.meta_format == RB_META_LOG && c->cfg.meta_total_bytes == RB_META_TOTAL_LMCACHE)
        c->cfg.meta_total_bytes = rb_core_ml_region_bytes(c);
    if (c->cfg.meta_total_bytes >= c->capacity) {
        rc = rb_err_set(err, RB_ERR_RUNTIME, ENOSPC,
                        "metadata region exceeds usable device capacity: meta_total_bytes=%llu, usable "
                        "capacity %llu bytes (capacity_bytes=%llu, device %llu bytes)",
                        (unsigned long long)c->cfg.meta_total_bytes, (unsigned long long)c->capacity,
                        (unsigned long long)cfg->capacity_bytes, (unsigned long long)size);
        goto fail;
    }
    c->data_base = c->cfg.meta_total_bytes;
    uint64_t ms = (c->capacity - c->data_base) / cfg->slot_bytes;
    if (ms == 0) {
        rc = rb_err_set(err, RB_ERR_RUNTIME, ENOSPC,
                        "raw block capacity too small for slot size after metadata: slot_bytes=%llu, %llu "
                        "bytes left after meta_total_bytes=%llu",
                        (unsigned long long)cfg->slot_bytes, (unsigned long long)(c->capacity - c->data_base),
                        (unsigned long long)c->cfg.meta_total_bytes);
        goto fail;
    }
    if (ms > UINT32_MAX - 1) {
        rc = rb_err_set(err, RB_ERR_VALUE, EINVAL, "too many slots (%llu); use a larger slot_bytes",
                        (unsigned long long)ms);
        goto fail;
    }
    c->max_slots = (uint32_t)ms;
    c->usable_slots = c->max_slots;
    c->dev_size_seen = size;
    c->container_bytes = rb_container_bytes(c->cfg.meta_total_bytes, cfg->block_align);
    c->payload_cap = c->container_bytes - cfg->block_align;
    c->slot_cap = cfg->slot_bytes - cfg->header_bytes;
    rc = rb_slots_init(&c->slots, c->max_slots, cfg->fdp_slot_affinity_enabled);
    if (rc < 0) {
        rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
        goto fail;
    }
    rb_core_dealloc_init(c);
    rc = rb_core_ml_init(c, err);
    if (rc < 0)
        goto fail;
    uint64_t t_rec = rb_now_ns();
    rc = rb_core_recover(c, err);
    c->rec_ns = rb_now_ns() - t_rec;
    if (rc < 0)
        goto fail;
    if (cfg->meta_enable_periodic) {
        rc = rb_core_start_thread(c, err);
        if (rc < 0)
            goto fail;
    }
    *out = c;
    return 0;
fail:
    rb_core_free(c);
    return rc;
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
    rb_idx_free(&c->classes);
    for (uint32_t i = 0; i < c->n_cls; i++)
        class_free(c->cls[i]);
    free(c->cls);
    rb_slots_free(&c->slots);
    free(c->rd_pend[0]);
    free(c->rd_pend[1]);
    free(c->ref);
    free(c->held);
    rb_core_ml_free(c);
    rb_core_dealloc_free(c);
    pthread_mutex_destroy(&c->ckpt_mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->idle_cv);
    pthread_mutex_destroy(&c->thr_mu);
    pthread_cond_destroy(&c->thr_cv);
    rb_core_trust_free(c);
    free(c->path);
    free(c);
}

/* ---- put ------------------------------------------------------------------------------- */

static void io_begin_locked(rb_core *c, uint64_t n)
{
    c->inflight_io += n;
}

static void io_end_locked(rb_core *c, uint64_t n)
{
    c->inflight_io -= n;
    c->last_io_ns = rb_now_ns();
    if (c->inflight_io == 0)
        pthread_cond_broadcast(&c->idle_cv);
}

/* The first failure of a put_many call, for its caller (kept when one is already there). */
#define PUT_FAIL(fail, ...)                                                                                            \
    do {                                                                                                               \
        if ((fail) && (fail)->kind == RB_ERR_NONE)                                                                     \
            rb_err_set((fail), __VA_ARGS__);                                                                           \
    } while (0)

/* Reserve a slot for item under mu. Returns 1 (already indexed: result True), 0 (failed:
 * result False, why in *fail) or 2 (reserved: *slot set, in-flight record inserted). */
static int reserve_locked(rb_core *c, const rb_put_item *it, uint32_t *slot, rb_err *fail, int *nospace)
{
    uint32_t h = rb_idx_hash(it->key, it->key_len);
    if (rb_idx_find(&c->index, it->key, it->key_len, h) != UINT32_MAX)
        return 1;
    if (rb_idx_find(&c->inflight, it->key, it->key_len, h) != UINT32_MAX) {
        PUT_FAIL(fail, RB_ERR_RUNTIME, EBUSY, "the key is being stored by another call");
        return 0;
    }
    uint64_t named;
    if (c->cfg.key_namespace == RB_NS_LEGACY &&
        (rb_key_identity(RB_NS_LEGACY, it->key, it->key_len, &named) < 0 || named != it->identity)) {
        /* Loads and recovery judge a slot header by the identity the encoded key names (a
         * parse: cheap); one stored under another could never be vouched for. Object keys'
         * identity is their BLAKE2b, which the key codec computes: not hashed again here. */
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
    uint32_t cls = rb_core_intern_class(c, &it->meta);
    if (cls == UINT32_MAX) {
        PUT_FAIL(fail, RB_ERR_NOMEM, ENOMEM, "out of memory");
        return 0;
    }
    uint32_t s;
    for (;;) {
        s = rb_slots_alloc(&c->slots, it->pid);
        if (s == RB_SLOT_NONE && rb_core_dealloc_take_locked(c) > 0)
            s = rb_slots_alloc(&c->slots, it->pid); /* reusable slots still waiting for deallocation */
        if (s == RB_SLOT_NONE) {
            *nospace = 1;
            PUT_FAIL(fail, RB_ERR_RUNTIME, ENOSPC,
                     "no free slot: %u slots, %u indexed, %u being written, %llu waiting for a checkpoint",
                     c->usable_slots, c->index.n_live, c->inflight.n_live,
                     (unsigned long long)(c->n_held + rb_core_ml_held_locked(c)));
            return 0;
        }
        if (s >= c->usable_slots) {
            c->retired_slots++; /* past the end of a device that shrank: never used again */
            continue;
        }
        if (s >= c->ref_cap || !c->ref[s])
            break;
        /* A container lists it (a state applied at run time can put next_slot below slots a
         * container lists): it waits like any other freed slot. */
        rb_core_hold_slot_locked(c, s);
    }
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

static void make_room(rb_core *c, size_t n);

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
        if (rb_idx_find(&c->index, it->key, it->key_len, h) != UINT32_MAX) {
            /* A state applied meanwhile already holds this key: keep that entry. */
            rb_core_slot_back_locked(c, r.slot);
            result = 1;
        } else if (rb_core_write_committed_locked(c, r.slot) < 0) {
            rb_core_slot_back_locked(c, r.slot);
            PUT_FAIL(fail, RB_ERR_NOMEM, ENOMEM, "out of memory");
        } else {
            uint32_t q = rb_idx_insert(&c->index, it->key, it->key_len, h, rb_ent_pos(&r), rb_ent_npos(&r));
            if (q != UINT32_MAX) {
                rb_ent *e = &c->index.ents[q];
                e->slot = r.slot;
                e->size = r.size;
                e->cls = r.cls;
                if (c->cfg.verify_payload_checksum) {
                    e->checksum = sum;
                    e->flags |= RB_ENT_HAS_SUM;
                }
                if (c->ml.on)
                    rb_core_ml_put_locked(c, e);
                result = 2;
            } else {
                rb_core_slot_back_locked(c, r.slot);
                PUT_FAIL(fail, RB_ERR_NOMEM, ENOMEM, "out of memory");
            }
        }
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

/* posix put of one key: header, then payload. *woff: the offset of a write that failed. */
static int write_slot(rb_core *c, const rb_put_item *it, uint32_t slot, uint8_t *hdr, uint64_t *sum, uint64_t *woff,
                      rb_err *err)
{
    uint64_t off = rb_slot_offset(c, slot);
    int has_sum = c->cfg.verify_payload_checksum;
    *sum = has_sum ? XXH3_64bits(it->buf, it->len) : 0;
    rb_slot_header_encode(hdr, c->cfg.header_bytes, it->identity, it->len, has_sum, *sum);
    *woff = off;
    int rc = rb_core_dev_write(c, off, hdr, c->cfg.header_bytes, c->cfg.header_bytes, c->cfg.header_bytes, 1, err);
    if (rc < 0)
        return rc;
    *woff = off + c->cfg.header_bytes;
    return rb_core_dev_write(c, *woff, it->buf, it->len, it->len, rb_xfer_len(c, it->len), 1, err);
}

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

static int put_chunk_uring(rb_core *c, const rb_put_item *items, const uint32_t *uniq, size_t m, uint8_t *results,
                           uint32_t *stored, size_t *n_stored, put_scratch *w, rb_err *fail)
{
    const uint64_t hb = c->cfg.header_bytes;
    size_t np = 0;
    int closed = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t q = 0; q < m; q++) {
        const rb_put_item *it = &items[uniq[q]];
        if (c->closed) {
            closed = 1;
            break;
        }
        uint32_t slot;
        int r = reserve_room_locked(c, it, m - q, &slot, fail);
        if (r != 2) {
            results[uniq[q]] = (uint8_t)r;
            continue;
        }
        w->plan[np] = uniq[q];
        w->slot[np++] = slot;
    }
    if (np)
        io_begin_locked(c, np);
    pthread_mutex_unlock(&c->mu);
    if (!np)
        return closed;

    size_t nops = 0;
    for (size_t p = 0; p < np; p++) {
        const rb_put_item *it = &items[w->plan[p]];
        w->prepared[p] = 0;
        w->sum[p] = 0;
        if (take_fault(&c->fault_prep)) {
            /* batch buffer preparation failed: nothing queued for this key */
            PUT_FAIL(fail, RB_ERR_RUNTIME, EIO, "preparing the write failed (injected)");
            continue;
        }
        int has_sum = c->cfg.verify_payload_checksum;
        w->sum[p] = has_sum ? XXH3_64bits(it->buf, it->len) : 0;
        rb_slot_header_encode(w->hdrs + p * hb, hb, it->identity, it->len, has_sum, w->sum[p]);
        w->prepared[p] = 1;
        rb_uop *o = &w->ops[nops++];
        o->off = rb_slot_offset(c, w->slot[p]) + hb;
        o->buf = (void *)it->buf;
        o->buf_len = it->len;
        o->payload_len = it->len;
        o->total_len = rb_xfer_len(c, it->len);
        o->copy_len = (size_t)-1;
        o->write = 1;
        o->pid = it->pid; /* header and payload of a key go to the same reclaim unit handle */
    }
    size_t npay = nops;
    for (size_t p = 0; p < np; p++) {
        if (!w->prepared[p])
            continue;
        rb_uop *o = &w->ops[nops++];
        o->off = rb_slot_offset(c, w->slot[p]);
        o->buf = w->hdrs + p * hb;
        o->buf_len = o->payload_len = o->total_len = hb;
        o->copy_len = (size_t)-1;
        o->write = 1;
        o->pid = items[w->plan[p]].pid;
    }
    int ok = 1;
    if (npay) {
        rb_err berr;
        (void)rb_core_uring_ops(c, w->ops, nops, 0, 1, &berr); /* every op's rc says how it ended */
        for (size_t i = 0; ok && i < nops; i++) {
            ok = w->ops[i].rc == 0;
            if (!ok)
                put_write_failed(c, w->ops[i].off, &w->ops[i].err, fail);
        }
    }

    pthread_mutex_lock(&c->mu);
    io_end_locked(c, np);
    for (size_t p = 0; p < np; p++) {
        uint32_t i = w->plan[p];
        int res = commit_locked(c, &items[i], ok && w->prepared[p], w->sum[p], fail);
        results[i] = res != 0;
        if (res == 2)
            stored[(*n_stored)++] = i;
    }
    pthread_mutex_unlock(&c->mu);
    return closed;
}

static int put_many_uring(rb_core *c, const rb_put_item *items, size_t n, uint8_t *results, uint32_t *stored,
                          size_t *n_stored, rb_err *fail, rb_err *err)
{
    /* Not zeroed: every field of a chunk's entries is written before it is read (zeroing the
     * ~40 KiB of op records, error texts included, was a visible share of a put's CPU). */
    put_scratch *w = malloc(sizeof(*w));
    uint32_t *uniq = malloc(n * sizeof(uint32_t));
    uint32_t *first = malloc(n * sizeof(uint32_t)); /* item -> index of its first occurrence */
    rb_idx seen;
    rb_idx_init(&seen);
    int rc = 0;
    if (w)
        w->hdrs = rb_alloc_aligned(c->cfg.block_align, RB_PUT_CHUNK * c->cfg.header_bytes, err);
    if (!w || !w->hdrs || !uniq || !first) {
        rc = rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
        goto out;
    }
    size_t m = 0;
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
                goto out;
            }
            seen.ents[p].slot = (uint32_t)i;
        }
        first[i] = (uint32_t)i;
        uniq[m++] = (uint32_t)i;
    }
    for (size_t lo = 0; lo < m; lo += RB_PUT_CHUNK) {
        size_t cnt = m - lo < RB_PUT_CHUNK ? m - lo : RB_PUT_CHUNK;
        if (put_chunk_uring(c, items, uniq + lo, cnt, results, stored, n_stored, w, fail))
            break; /* closed: the remaining keys stay False */
    }
    for (size_t i = 0; i < n; i++)
        if (first[i] != i)
            results[i] = results[first[i]];
out:
    rb_idx_free(&seen);
    if (w)
        free(w->hdrs);
    free(w);
    free(uniq);
    free(first);
    return rc;
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

int rb_core_put_many(rb_core *c, const rb_put_item *items, size_t n, uint8_t *results, uint32_t *stored,
                     size_t *n_stored, rb_err *fail, rb_err *err)
{
    *n_stored = 0;
    memset(results, 0, n);
    rb_err_clear(fail);
    make_room(c, n);
    if (rb_core_uses_uring(c)) {
        int rc = put_many_uring(c, items, n, results, stored, n_stored, fail, err);
        put_closed_reason(c, results, n, fail);
        return rc;
    }
    uint8_t *hdr = rb_alloc_aligned(c->cfg.block_align, c->cfg.header_bytes, err);
    if (!hdr)
        return -ENOMEM;
    /* posix path (LMCache's sequential path): reserve, write header then payload, commit. */
    for (size_t i = 0; i < n; i++) {
        const rb_put_item *it = &items[i];
        uint32_t slot;
        pthread_mutex_lock(&c->mu);
        if (c->closed) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        int r = reserve_room_locked(c, it, n - i, &slot, fail);
        if (r != 2) {
            pthread_mutex_unlock(&c->mu);
            results[i] = (uint8_t)r;
            continue;
        }
        io_begin_locked(c, 1);
        pthread_mutex_unlock(&c->mu);

        rb_err werr;
        uint64_t sum = 0, woff = 0;
        int ok = write_slot(c, it, slot, hdr, &sum, &woff, &werr) == 0;
        if (!ok)
            put_write_failed(c, woff, &werr, fail);

        pthread_mutex_lock(&c->mu);
        io_end_locked(c, 1);
        int res = commit_locked(c, it, ok, sum, fail);
        pthread_mutex_unlock(&c->mu);
        results[i] = res != 0;
        if (res == 2)
            stored[(*n_stored)++] = (uint32_t)i;
    }
    free(hdr);
    put_closed_reason(c, results, n, fail);
    return 0;
}

/* ---- load ------------------------------------------------------------------------------ */

/*
 * Every load reads the key's slot header with its payload and serves the payload only when
 * the header vouches for it:
 *   posix:    one preadv of the whole header (into a scratch block) and the payload (straight
 *             into the caller's buffer), the header being the bytes just before the payload;
 *   io_uring: a header read (rb_header_read_len bytes) queued next to the payload read in
 *             the same batch (passthrough too: both are NVMe commands of one submission).
 * The verdict is recovery's rule (magic, identity of the key in its namespace, payload
 * length), plus, when the record has a checksum, the header's checksum record equal to it.
 * Any other header is a miss (no error): the caller's buffer is zeroed, since what landed
 * there is not this key's, and the record is dropped. That closes the cases start-up
 * validation cannot see: another writer in the slot, a device that shrank and grew back
 * (zeros), a slot reused under a stale index. A failed read is a failed key and keeps the
 * record, unless the device shrank below the slot (a miss; rb_core_check_size drops it).
 *
 * A record recovered without slot-header validation (RB_ENT_UNVERIFIED,
 * meta_verify_on_load=False) is judged the same way, and its payload is also checked against
 * the header's checksum record when there is one; a good verdict clears the mark.
 */
enum { LV_NONE = 0, LV_GOOD, LV_BAD, LV_SUMBAD };

/* The caller's buffer a data read of a size-byte payload may reach: the whole padded transfer
 * when it goes straight into a buffer that holds it, else the payload. */
static inline size_t read_target_len(const rb_core *c, size_t buf_len, uint64_t size)
{
    size_t blen = c->cfg.enable_zero_copy ? buf_len : size;
    size_t xl = rb_xfer_len(c, size);
    return blen >= xl ? xl : size;
}

/* Erase what a rejected read left in the caller's buffer: it is not this key's. */
static inline void erase_read(const rb_core *c, rb_load_item *it, uint64_t size)
{
    memset(it->buf, 0, read_target_len(c, it->buf_len, size));
}

/* The verdict on a slot header read for a record (see above): want is the identity the key's
 * header must carry (want_ok 0: the key has none, so no header is its). payload: also check it
 * against the header's checksum record (records not yet verified), else NULL. */
static int judge_slot(uint64_t want, int want_ok, uint64_t size, int rec_has_sum, uint64_t rec_sum, const uint8_t *hdr,
                      size_t hdr_len, const uint8_t *payload, uint64_t *sum_fail)
{
    uint64_t ident, len, sum;
    int has_sum;
    if (!want_ok || rb_slot_header_decode(hdr, hdr_len, &ident, &len, &has_sum, &sum) < 0 || ident != want ||
        len != size)
        return LV_BAD;
    if (rec_has_sum && (!has_sum || sum != rec_sum))
        return LV_BAD; /* the record's checksum is not the one this slot was written with */
    if (payload && has_sum && XXH3_64bits(payload, size) != sum) {
        (*sum_fail)++;
        return LV_BAD;
    }
    return LV_GOOD;
}

/* One key of a rb_core_load_many call: its record as the snapshot under c->mu saw it, and
 * what the load decided about it. */
struct load_snap {
    uint32_t slot;
    uint32_t pop, hop; /* io_uring: op index of the payload / header read */
    uint64_t size, sum;
    uint64_t want; /* the identity the key's slot header must carry */
    uint8_t has_sum, unverified, verdict;
    uint8_t judged;  /* the header is read and judged (always, but for the benchmark hook) */
    uint8_t want_ok; /* want is set (a legacy key that does not parse has no identity) */
};

/* One rb_core_load_many call between its two c->mu sections: the snapshot, the read plan and
 * what the settle stage publishes. Read and written without any lock (only this call sees it). */
struct load_run {
    rb_core *c;
    rb_load_item *items;
    struct load_snap *s;
    size_t n, n_found, n_unv;
    int no_check;  /* the benchmark hook: verified records are not judged */
    int uring;     /* reads go through the io_uring batch (else posix, one at a time) */
    size_t hl;     /* bytes of one header read */
    rb_uop *ops;   /* io_uring: the batch, nops used */
    uint8_t *hdrs; /* header buffers: io_uring one per found key (hl each), posix one */
    size_t nops, nhdr;
    uint64_t sum_fail; /* payload checksum failures seen */
    size_t n_sumbad;   /* keys failed by verify_payload_checksum */
    size_t n_bad;      /* keys whose slot header was refused */
    size_t n_failed;   /* keys whose read failed */
};

/* No lock: reset every item's outputs (the items are the caller's). */
static void load_reset_items(rb_load_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        items[i].ok = 0;
        items[i].status = 0;
        rb_err_clear(&items[i].err);
        items[i].npos = -1;
        items[i].pos = NULL;
    }
}

/* c->mu held: read each key's record from the index into r->s and copy its cached positions
 * out to the item (npos -2 when out of memory); counts the found and the unverified records. */
static void load_snapshot_locked(struct load_run *r)
{
    rb_core *c = r->c;
    rb_load_item *items = r->items;
    struct load_snap *s = r->s;
    for (size_t i = 0; i < r->n; i++) {
        uint32_t p =
            rb_idx_find(&c->index, items[i].key, items[i].key_len, rb_idx_hash(items[i].key, items[i].key_len));
        if (p == UINT32_MAX) {
            s[i].slot = RB_SLOT_NONE;
            continue;
        }
        const rb_ent *e = &c->index.ents[p];
        s[i].slot = e->slot;
        s[i].size = e->size;
        s[i].sum = e->checksum;
        s[i].has_sum = (e->flags & RB_ENT_HAS_SUM) != 0;
        s[i].unverified = (e->flags & RB_ENT_UNVERIFIED) != 0;
        s[i].judged = s[i].unverified || !r->no_check;
        r->n_unv += s[i].unverified;
        r->n_found++;
        int64_t np = rb_ent_npos(e);
        items[i].npos = np;
        if (np > 0) {
            items[i].pos = malloc((size_t)np * sizeof(int64_t));
            if (items[i].pos)
                memcpy(items[i].pos, rb_ent_pos(e), (size_t)np * sizeof(int64_t));
            else
                items[i].npos = -2; /* out of memory: reported as a failed key */
        }
    }
}

/* No lock: the test hook's pause between the snapshot and the reads (load_delay_ms). */
static void load_test_delay(rb_core *c)
{
    uint32_t delay = atomic_load(&c->load_delay_ms);
    if (delay) {
        struct timespec ts = {(time_t)(delay / 1000), (long)(delay % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* No lock: choose the engine and allocate the header buffers (and the io_uring batch: a
 * header and a payload read per found key). Out of memory for the batch falls back to posix
 * reads, one at a time; 0, or -ENOMEM when not even one header buffer can be had. */
static int load_plan(struct load_run *r, rb_err *err)
{
    rb_core *c = r->c;
    const size_t nf = r->n_found ? r->n_found : 1;
    r->uring = rb_core_uses_uring(c);
    if (r->uring) {
        r->hl = rb_header_read_len(c);
        /* Not zeroed: load_queue_uring writes every field an op's run reads. */
        r->ops = malloc(2 * nf * sizeof(*r->ops));
        r->hdrs = rb_alloc_aligned(c->cfg.block_align, nf * r->hl, err);
        if (r->ops && r->hdrs)
            return 0;
        free(r->ops);
        free(r->hdrs);
        r->ops = NULL;
        r->hdrs = NULL;
        r->uring = 0;
    }
    r->hl = c->cfg.header_bytes;
    r->hdrs = rb_alloc_aligned(c->cfg.block_align, r->hl, err);
    return r->hdrs ? 0 : -ENOMEM;
}

/* No lock: whether a key is to be read (found, positions copied, a buffer that holds the
 * payload); a key that cannot be gets its status and error here. */
static int load_item_readable(const struct load_snap *sn, rb_load_item *it)
{
    if (sn->slot == RB_SLOT_NONE)
        return 0;
    if (it->npos == -2) {
        it->status = rb_err_set(&it->err, RB_ERR_NOMEM, ENOMEM, "out of memory");
        return 0;
    }
    size_t len = sn->size;
    if (it->buf_len < len) {
        it->status =
            rb_err_set(&it->err, RB_ERR_VALUE, EINVAL, "output buffer too small: cap=%zu need=%zu", it->buf_len, len);
        return 0;
    }
    return 1;
}

/* No lock: the identity each judged key's header must carry, object keys hashed several per
 * pass (rb_blake2b64_many: the BLAKE2b is most of a judgement's CPU). */
static void load_identities(struct load_run *r)
{
    enum { GROUP = 64 };
    const uint8_t *msg[GROUP];
    size_t len[GROUP];
    struct load_snap *who[GROUP];
    uint64_t dig[GROUP];
    const int object = r->c->cfg.key_namespace == RB_NS_OBJECT;
    size_t k = 0;
    for (size_t i = 0; i <= r->n; i++) {
        if (i < r->n) {
            struct load_snap *sn = &r->s[i];
            const rb_load_item *it = &r->items[i];
            if (sn->slot == RB_SLOT_NONE || !sn->judged)
                continue;
            if (!object) {
                sn->want_ok = rb_key_identity(r->c->cfg.key_namespace, it->key, it->key_len, &sn->want) == 0;
                continue;
            }
            msg[k] = (const uint8_t *)it->key;
            len[k] = it->key_len;
            who[k++] = sn;
            if (k < GROUP)
                continue;
        }
        if (k) {
            rb_blake2b64_many(msg, len, k, dig);
            for (size_t j = 0; j < k; j++) {
                who[j]->want = dig[j];
                who[j]->want_ok = 1;
            }
            k = 0;
        }
    }
}

/* No lock: judge a key whose reads completed from the header bytes read for it; a refused
 * payload is erased from the caller's buffer. */
static void load_judge(struct load_run *r, rb_load_item *it, struct load_snap *sn, const uint8_t *hdr)
{
    sn->verdict = (uint8_t)judge_slot(sn->want, sn->want_ok, sn->size, sn->has_sum, sn->sum, hdr, r->hl,
                                      sn->unverified ? it->buf : NULL, &r->sum_fail);
    if (sn->verdict == LV_BAD) {
        erase_read(r->c, it, sn->size);
        r->n_bad++;
    } else {
        it->ok = 1;
    }
}

/* No lock: append a key's header and payload reads to the io_uring batch (writes r->ops,
 * r->nops, r->nhdr and the key's op indexes in *sn). */
static void load_queue_uring(struct load_run *r, rb_load_item *it, struct load_snap *sn)
{
    rb_core *c = r->c;
    size_t len = sn->size;
    uint64_t soff = rb_slot_offset(c, sn->slot);
    /* Batched: reads of at most queue-depth requests per batch, bounced by the engine when
     * the destination is unaligned for O_DIRECT or shorter than the transfer. */
    if (sn->judged) {
        rb_uop *h = &r->ops[r->nops];
        h->off = soff;
        h->buf = r->hdrs + r->nhdr++ * r->hl;
        h->buf_len = h->payload_len = h->total_len = h->copy_len = r->hl;
        h->write = 0;
        sn->hop = (uint32_t)r->nops++;
    }
    rb_uop *o = &r->ops[r->nops];
    o->off = soff + c->cfg.header_bytes;
    o->buf = it->buf;
    o->buf_len = c->cfg.enable_zero_copy ? it->buf_len : len;
    o->payload_len = len;
    o->total_len = rb_xfer_len(c, len);
    o->copy_len = len;
    o->write = 0;
    sn->pop = (uint32_t)r->nops++;
}

/* No lock: posix read of a key's header (into the scratch block) and payload (into the
 * caller's buffer) in one system call, then its verdict. */
static void load_read_posix(struct load_run *r, rb_load_item *it, struct load_snap *sn)
{
    rb_core *c = r->c;
    size_t len = sn->size;
    size_t blen = c->cfg.enable_zero_copy ? it->buf_len : len;
    uint64_t off = rb_slot_offset(c, sn->slot) + c->cfg.header_bytes;
    int rc = rb_core_dev_read_headed(c, off, r->hdrs, sn->judged ? r->hl : 0, it->buf, blen, len, rb_xfer_len(c, len),
                                     &it->err);
    if (rc < 0) {
        it->status = rc;
        r->n_failed++;
        erase_read(c, it, sn->size); /* whatever landed is not vouched for */
        return;
    }
    if (sn->judged)
        load_judge(r, it, sn, r->hdrs);
    else
        it->ok = 1;
}

/* No lock: issue every readable key's reads: queued in the io_uring batch, or done now
 * through posix. */
static void load_issue(struct load_run *r)
{
    for (size_t i = 0; i < r->n; i++) {
        if (!load_item_readable(&r->s[i], &r->items[i]))
            continue;
        if (r->uring)
            load_queue_uring(r, &r->items[i], &r->s[i]);
        else
            load_read_posix(r, &r->items[i], &r->s[i]);
    }
}

/* No lock: run the io_uring batch, then turn each key's two op results into its outcome. */
static void load_run_uring(struct load_run *r)
{
    rb_core *c = r->c;
    if (!r->nops)
        return;
    rb_err berr;
    (void)rb_core_uring_ops(c, r->ops, r->nops, c->cfg.iouring_queue_depth, 1, &berr); /* per-op results */
    const rb_uop *ops = r->ops;
    for (size_t i = 0; i < r->n; i++) {
        rb_load_item *it = &r->items[i];
        struct load_snap *sn = &r->s[i];
        if (sn->slot == RB_SLOT_NONE || it->status < 0)
            continue;
        const rb_uop *h = sn->judged ? &ops[sn->hop] : NULL, *o = &ops[sn->pop];
        const rb_uop *bad = h && h->rc < 0 ? h : o->rc < 0 ? o : NULL;
        if (bad) {
            it->status = bad->rc;
            it->err = bad->err;
            r->n_failed++;
            erase_read(c, it, sn->size); /* the other read may have landed: not vouched for */
        } else if (h) {
            load_judge(r, it, sn, h->buf);
        } else {
            it->ok = 1;
        }
    }
}

/* No lock: after failed reads, whether the device shrank below their slots: such a key is a
 * miss, not a failure (rb_core_check_size has dropped its record). */
static void load_check_shrink(struct load_run *r)
{
    if (!r->n_failed)
        return;
    uint32_t usable = rb_core_check_size(r->c);
    for (size_t i = 0; i < r->n; i++) {
        rb_load_item *it = &r->items[i];
        const struct load_snap *sn = &r->s[i];
        if (it->status < 0 && sn->slot != RB_SLOT_NONE && sn->slot >= usable && it->buf_len >= sn->size) {
            it->status = 0; /* the destination was erased when the read failed */
            rb_err_clear(&it->err);
        }
    }
}

/* No lock: with verify_payload_checksum, fail each loaded key whose payload does not match
 * its record's checksum (buffer erased, verdict LV_SUMBAD); then free the positions of every
 * key that did not load. */
static void load_check_sums(struct load_run *r)
{
    rb_core *c = r->c;
    const size_t n = r->n;
    rb_load_item *items = r->items;
    struct load_snap *s = r->s;
    for (size_t i = 0; i < n && c->cfg.verify_payload_checksum; i++) {
        rb_load_item *it = &items[i];
        struct load_snap *sn = &s[i];
        if (!it->ok || !sn->has_sum || XXH3_64bits(it->buf, sn->size) == sn->sum)
            continue;
        r->sum_fail++;
        r->n_sumbad++;
        it->ok = 0;
        it->status = rb_err_set(&it->err, RB_ERR_OS, EBADMSG, "payload checksum mismatch at offset %llu",
                                (unsigned long long)(rb_slot_offset(c, sn->slot) + c->cfg.header_bytes));
        erase_read(c, it, sn->size);
        sn->verdict = LV_SUMBAD;
    }
    for (size_t i = 0; i < n; i++) {
        if (!items[i].ok) {
            free(items[i].pos);
            items[i].pos = NULL;
            items[i].npos = -1;
        }
    }
}

/* c->mu held: apply one judged key's verdict to its record, unless the record changed since
 * the snapshot (deleted, re-put on another slot). Counts what it removes from the index. */
static void load_settle_one_locked(rb_core *c, const rb_load_item *it, const struct load_snap *sn, uint64_t *dropped,
                                   uint64_t *unv_dropped, uint64_t *sum_dropped)
{
    uint32_t p = rb_idx_find(&c->index, it->key, it->key_len, rb_idx_hash(it->key, it->key_len));
    if (p == UINT32_MAX)
        return;
    rb_ent *e = &c->index.ents[p];
    if (e->slot != sn->slot)
        return;
    if (sn->verdict == LV_SUMBAD) {
        if ((e->flags & RB_ENT_HAS_SUM) && e->checksum == sn->sum) {
            rb_core_drop_locked(c, p);
            (*sum_dropped)++;
        }
        return;
    }
    int unverified = (e->flags & RB_ENT_UNVERIFIED) != 0;
    if (sn->verdict == LV_BAD) {
        rb_core_drop_locked(c, p);
        (*dropped)++;
        *unv_dropped += (uint64_t)unverified;
    } else if (unverified) {
        e->flags &= (uint16_t)~RB_ENT_UNVERIFIED;
        c->n_unverified--;
        c->deferred_verified++;
    }
}

/* c->mu held: publish the call's checksum failures and settle the judged records in the index
 * and the counters. A record whose payload failed its checksum leaves the index like one
 * whose header was refused: it would fail every load, and every checkpoint would carry it on. */
static void load_settle_locked(struct load_run *r)
{
    rb_core *c = r->c;
    c->checksum_failures += r->sum_fail;
    if (!r->n_unv && !r->n_sumbad && !r->n_bad)
        return;
    uint64_t dropped = 0, unv_dropped = 0, sum_dropped = 0;
    for (size_t i = 0; i < r->n; i++) {
        if (r->s[i].verdict != LV_NONE && (r->s[i].verdict != LV_GOOD || r->s[i].unverified))
            load_settle_one_locked(c, &r->items[i], &r->s[i], &dropped, &unv_dropped, &sum_dropped);
    }
    c->load_rejected += dropped;
    if (unv_dropped) {
        c->recovery_dropped += unv_dropped;
        c->deferred_dropped += unv_dropped;
    }
    c->sum_dropped += sum_dropped;
    if (dropped || sum_dropped) {
        c->dirty_total++;
        rb_idx_maybe_compact(&c->index);
    }
}

/*
 * Stages: snapshot the records under c->mu (and enter the I/O and reader accounting), plan the
 * reads, run them without the lock (posix one at a time, or one io_uring batch), look at the
 * device size after failed reads, check payload checksums, then settle verdicts and leave the
 * accounting under c->mu again.
 */
int rb_core_load_many(rb_core *c, rb_load_item *items, size_t n, rb_err *err)
{
    struct load_run r = {.c = c, .items = items, .n = n, .no_check = atomic_load(&c->no_load_check)};
    r.s = calloc(n ? n : 1, sizeof(*r.s));
    if (!r.s)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    load_reset_items(items, n);
    pthread_mutex_lock(&c->mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->mu);
        free(r.s);
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "RawBlockCore cannot admit reads after shutdown");
    }
    load_snapshot_locked(&r);
    io_begin_locked(c, 1);
    uint64_t rd_gen = rb_core_reader_begin_locked(c);
    pthread_mutex_unlock(&c->mu);
    load_test_delay(c);

    int rc = load_plan(&r, err);
    if (rc == 0) {
        load_identities(&r);
        load_issue(&r);
        load_run_uring(&r);
        load_check_shrink(&r);
        load_check_sums(&r);
    } else {
        for (size_t i = 0; i < n; i++)
            free(items[i].pos);
        load_reset_items(items, n);
    }
    free(r.ops);
    free(r.hdrs);

    pthread_mutex_lock(&c->mu);
    load_settle_locked(&r);
    rb_core_reader_end_locked(c, rd_gen);
    io_end_locked(c, 1);
    pthread_mutex_unlock(&c->mu);
    free(r.s);
    return rc < 0 ? rc : (int)(r.n_bad > INT32_MAX ? INT32_MAX : r.n_bad);
}

/* ---- queries and locks ----------------------------------------------------------------- */

static uint32_t find_locked(rb_core *c, const char *k, size_t l)
{
    return rb_idx_find(&c->index, k, l, rb_idx_hash(k, l));
}

static void lock_ent_locked(rb_core *c, rb_ent *e)
{
    if (e->refcnt++ == 0)
        c->locked_keys++;
}

/*
 * Batched lookups and deletes hash every key before taking the mutex (no shared state
 * involved), so the lock is held only for the index work itself. Without memory for the
 * hashes they hash inline.
 */
#define HASH_STACK 256

static uint32_t *batch_hashes(const char *const *keys, const size_t *lens, size_t n, uint32_t *stack)
{
    uint32_t *h = n <= HASH_STACK ? stack : malloc(n * sizeof(uint32_t));
    if (h)
        for (size_t i = 0; i < n; i++)
            h[i] = rb_idx_hash(keys[i], lens[i]);
    return h;
}

void rb_core_exists_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int lock, uint8_t *results)
{
    uint32_t stack[HASH_STACK];
    uint32_t *hs = batch_hashes(keys, lens, n, stack);
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        uint32_t h = hs ? hs[i] : rb_idx_hash(keys[i], lens[i]);
        uint32_t p = rb_idx_find(&c->index, keys[i], lens[i], h);
        results[i] = p != UINT32_MAX;
        if (lock && results[i])
            lock_ent_locked(c, &c->index.ents[p]);
    }
    pthread_mutex_unlock(&c->mu);
    if (hs != stack)
        free(hs);
}

int rb_core_exists_inflight(rb_core *c, const char *key, size_t len)
{
    pthread_mutex_lock(&c->mu);
    int r = rb_idx_find(&c->inflight, key, len, rb_idx_hash(key, len)) != UINT32_MAX;
    pthread_mutex_unlock(&c->mu);
    return r;
}

static void fill_meta_locked(rb_core *c, const rb_ent *e, rb_meta_out *o)
{
    const rb_class *k = c->cls[e->cls];
    o->found = 1;
    o->offset = rb_slot_offset(c, e->slot);
    o->size = e->size;
    o->dtype = k->dtype;
    o->fmt = k->fmt;
    o->ndim = k->ndim;
    o->dims = k->dims;
    o->npos = rb_ent_npos(e);
    o->pos = NULL;
    if (o->npos > 0) {
        o->pos = malloc((size_t)o->npos * sizeof(int64_t));
        if (o->pos)
            memcpy(o->pos, rb_ent_pos(e), (size_t)o->npos * sizeof(int64_t));
        else
            o->npos = -1;
    }
}

void rb_core_get_metadata_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n, rb_meta_out *out)
{
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        uint32_t p = find_locked(c, keys[i], lens[i]);
        if (p != UINT32_MAX)
            fill_meta_locked(c, &c->index.ents[p], &out[i]);
    }
    pthread_mutex_unlock(&c->mu);
}

size_t rb_core_get_metadata_prefix(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int lock,
                                   const uint8_t *skip, rb_meta_out *out)
{
    size_t i;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        uint32_t p = find_locked(c, keys[i], lens[i]);
        if (p == UINT32_MAX)
            break;
        fill_meta_locked(c, &c->index.ents[p], &out[i]);
        if (lock && !(skip && skip[i]))
            lock_ent_locked(c, &c->index.ents[p]);
    }
    pthread_mutex_unlock(&c->mu);
    return i;
}

void rb_core_unlock_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n)
{
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        uint32_t p = find_locked(c, keys[i], lens[i]);
        if (p == UINT32_MAX)
            continue;
        rb_ent *e = &c->index.ents[p];
        if (e->refcnt > 0 && --e->refcnt == 0)
            c->locked_keys--;
    }
    pthread_mutex_unlock(&c->mu);
}

void rb_core_delete_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int force, uint8_t *results)
{
    uint32_t stack[HASH_STACK];
    uint32_t *hs = batch_hashes(keys, lens, n, stack);
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        uint32_t h = hs ? hs[i] : rb_idx_hash(keys[i], lens[i]);
        uint32_t tslot;
        uint32_t p = rb_idx_find_slot(&c->index, keys[i], lens[i], h, &tslot);
        if (p != UINT32_MAX && c->index.ents[p].refcnt > 0 && !force) {
            results[i] = 0;
            continue;
        }
        int was = 0;
        if (p != UINT32_MAX) {
            drop_accounting_locked(c, p);
            rb_idx_remove_slot(&c->index, tslot);
            c->dirty_total++;
            was = 1;
        }
        uint32_t q = c->inflight.n_live ? rb_idx_find(&c->inflight, keys[i], lens[i], h) : UINT32_MAX;
        if (q != UINT32_MAX) {
            c->inflight.ents[q].flags |= RB_ENT_CANCELED;
            was = 1;
        }
        results[i] = (uint8_t)was;
    }
    rb_idx_maybe_compact(&c->index);
    int kick = c->ml.on && c->ml.n_held > 0;
    pthread_mutex_unlock(&c->mu);
    if (kick)
        rb_core_ml_kick(c);
    if (hs != stack)
        free(hs);
}

int64_t rb_core_entry_offset(rb_core *c, const char *key, size_t len)
{
    pthread_mutex_lock(&c->mu);
    uint32_t p = find_locked(c, key, len);
    int64_t r = p == UINT32_MAX ? -1 : (int64_t)rb_slot_offset(c, c->index.ents[p].slot);
    pthread_mutex_unlock(&c->mu);
    return r;
}

uint32_t rb_core_lock_refcount(rb_core *c, const char *key, size_t len)
{
    pthread_mutex_lock(&c->mu);
    uint32_t p = find_locked(c, key, len);
    uint32_t r = p == UINT32_MAX ? 0 : c->index.ents[p].refcnt;
    pthread_mutex_unlock(&c->mu);
    return r;
}

int64_t rb_core_snapshot_keys(rb_core *c, size_t max, char ***keys_out, size_t **lens_out)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->index.n_live < max ? c->index.n_live : max;
    char **keys = calloc(n ? n : 1, sizeof(char *));
    size_t *lens = calloc(n ? n : 1, sizeof(size_t));
    size_t k = 0;
    if (!keys || !lens)
        goto oom;
    for (uint32_t p = c->index.first_live; p < c->index.n_ents && k < n; p++) {
        const rb_ent *e = &c->index.ents[p];
        if (e->flags & RB_ENT_DEAD) {
            if (k == 0)
                c->index.first_live = p + 1;
            continue;
        }
        keys[k] = dupn(rb_ent_key(e), e->key_len);
        if (!keys[k])
            goto oom;
        lens[k++] = e->key_len;
    }
    pthread_mutex_unlock(&c->mu);
    *keys_out = keys;
    *lens_out = lens;
    return (int64_t)k;
oom:
    pthread_mutex_unlock(&c->mu);
    if (keys)
        for (size_t i = 0; i < k; i++)
            free(keys[i]);
    free(keys);
    free(lens);
    return -ENOMEM;
}

void rb_core_status_get(rb_core *c, rb_core_status *st)
{
    memset(st, 0, sizeof(*st));
    pthread_mutex_lock(&c->mu);
    st->capacity_bytes = c->capacity;
    st->data_base = c->data_base;
    st->container_bytes = c->container_bytes;
    st->max_slots = c->max_slots;
    st->next_slot = c->slots.next_slot;
    st->free_slots = c->slots.n_free + c->dl_npend + c->dl_inflight;
    rb_core_dealloc_status_locked(c, st);
    st->indexed = c->index.n_live;
    st->inflight_keys = c->inflight.n_live;
    st->locked_keys = c->locked_keys;
    st->inflight_io = c->inflight_io;
    st->meta_seq = c->meta_seq;
    st->dirty_total = c->dirty_total;
    st->persisted = c->persisted;
    st->affinity_hits = c->slots.affinity_hits;
    st->affinity_fallbacks = c->slots.affinity_fallbacks;
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
    st->closed = c->closed;
    st->recovery_outcome = c->rec_outcome;
    st->recovery_seq = c->rec_seq;
    st->recovery_ns = c->rec_ns;
    st->recovery_read_ns = c->ml.rec_read_ns;
    st->recovery_rejected_seq = c->rec_rejected_seq;
    st->recovery_lost = c->rec_lost;
    st->held_slots = c->n_held + rb_core_ml_held_locked(c);
    st->held_total = c->held_total;
    st->meta_format = c->cfg.meta_format;
    if (c->ml.on) {
        const rb_mlw *m = &c->ml;
        st->log_state = m->state;
        st->log_ring_bytes = m->lay.ring.len;
        st->log_live_bytes = m->lhead - m->lstart;
        st->log_seq = m->last_seq;
        st->log_groups_written = m->groups_written;
        st->log_bytes_written = m->group_bytes;
        st->log_last_group_bytes = m->last_group_bytes;
        st->log_last_group_records = m->last_group_records;
        st->log_pending_pages = m->n_pg;
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
        st->base_area_bytes = m->lay.areas[0].len;
        st->log_generation = m->generation;
    }
    st->room_ckpts = c->room_ckpts;
    st->checksum_dropped = c->sum_dropped;
    st->flushes = atomic_load(&c->flushes);
    st->skipped = c->apply_skipped;
    st->load_rejected = c->load_rejected;
    st->writeback_failures = c->wb_epoch;
    st->writeback_dropped = c->wb_dropped;
    st->shrink_dropped = c->shrink_dropped;
    st->retired_slots = c->retired_slots;
    st->undurable_writes = c->commits - c->commits_proven;
    st->usable_slots = c->usable_slots;
    st->device_size = c->dev_size_seen;
    memcpy(st->ckpt_error, c->ckpt_error, sizeof st->ckpt_error);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&c->fault_mu);
    st->faults_total = c->n_faults;
    memcpy(st->fault_by_errno, c->fault_by_errno, sizeof st->fault_by_errno);
    uint64_t kept = c->n_faults < RB_FAULTS_KEPT ? c->n_faults : RB_FAULTS_KEPT;
    for (uint64_t k = 0; k < kept; k++) /* oldest first */
        st->faults[k] = c->faults[(c->n_faults - kept + k) % RB_FAULTS_KEPT];
    st->n_faults_kept = (uint32_t)kept;
    pthread_mutex_unlock(&c->fault_mu);
    if (c->dev)
        rb_stats_read(&c->dev->stats, &st->io);
}

size_t rb_core_mem_bytes(rb_core *c)
{
    pthread_mutex_lock(&c->mu);
    size_t b = rb_idx_mem_bytes(&c->index) + rb_idx_mem_bytes(&c->inflight) + rb_slots_mem_bytes(&c->slots) +
               rb_core_trust_mem_bytes(c);
    pthread_mutex_unlock(&c->mu);
    return b;
}
