/*
 * rb_core_uring.c - the core's io_uring batch runner: a list of transfers (rb_uop) cut into
 * batches, submitted (rb_core_uring_ops_begin) and waited for (rb_core_uring_ops_finish), each
 * transfer's outcome in its op and the failures in the fault journal; and the registration of
 * the caller's fixed buffers.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <string.h>

#include "rb_uring.h"

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

/* A fresh run of ops (nothing allocated, nothing sent) and every op's outcome cleared. */
static void uops_reset(rb_uops_run *r, rb_core *c, rb_uop *ops, size_t n, int data)
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
}

/* Describe ops [lo, hi) as the requests of batch b (their indexes into r->map from lo on); an
 * op failed by a fault hook or refused by the engine gets its rc and no request. Returns how
 * many requests b holds. */
static uint32_t uops_describe(rb_uops_run *r, rb_batch *b, size_t lo, size_t hi)
{
    rb_core *c = r->c;
    struct rb_uring *u = c->dev->uring;
    uint32_t j = 0;
    for (size_t i = lo; i < hi; i++) {
        rb_uop *o = &r->ops[i];
        if (r->data && rb_core_take_fault(o->write ? &c->fault_write : &c->fault_read)) {
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
        r->map[lo + j++] = (uint32_t)i;
    }
    /* Requests that never reach the engine are left out of the batch: shrink it to the ones
     * described (the tail entries were never set). */
    b->n = j;
    return j;
}

/* Build batch k (into r->bs[k]) and submit it when it holds a request: 0, or <0 (err). */
static int uops_submit_one(rb_uops_run *r, size_t k, rb_err *err)
{
    rb_core *c = r->c;
    struct rb_uring *u = c->dev->uring;
    size_t lo = k * r->per, hi = lo + r->per < r->n ? lo + r->per : r->n;
    rb_batch *b = rb_batch_new((uint32_t)(hi - lo), 0);
    if (!b)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    uint32_t j = uops_describe(r, b, lo, hi);
    r->bs[k] = b;
    int rc = 0;
    if (j && r->data && rb_core_take_fault(&c->fault_submit))
        rc = rb_err_set(err, RB_ERR_RUNTIME, EIO, "io_uring batch submission failed (injected)");
    if (rc == 0 && j)
        rc = rb_batch_prepare(u, b, err);
    if (rc == 0 && j) {
        b->t_given_ns = rb_obs_t0(&c->obs);
        if (rb_uring_submit(u, b) < 0)
            rc = rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "io_uring worker stopped");
    }
    return rc;
}

/* Batch k could not be submitted (rc, err): it is dropped, and every op from its first on
 * that has no outcome yet gets that failure. */
static void uops_unsent(rb_uops_run *r, size_t k, int rc, const rb_err *err)
{
    size_t lo = k * r->per;
    for (size_t i = lo; i < r->n; i++) {
        if (r->ops[i].rc == 0) {
            r->ops[i].rc = rc;
            r->ops[i].err = *err;
        }
    }
    r->unsent_from = lo;
    r->unsent_rc = rc;
    rb_batch_free(r->bs[k]);
    r->bs[k] = NULL;
}

/* Device entered, bs and map set: submit the nb batches in order, stopping at the first that
 * fails. 0, or that failure. */
static int uops_submit_all(rb_uops_run *r, size_t nb, rb_err *err)
{
    for (size_t k = 0; k < nb; k++) {
        int rc = uops_submit_one(r, k, err);
        if (rc < 0) {
            uops_unsent(r, k, rc, err);
            return rc;
        }
        r->submitted = k + 1;
    }
    return 0;
}

int rb_core_uring_ops_begin(rb_core *c, rb_uops_run *r, rb_uop *ops, size_t n, size_t per, int data, rb_err *err)
{
    uops_reset(r, c, ops, n, data);
    if (n == 0)
        return 0;
    if (per == 0 || per > n)
        per = n;
    r->per = per;
    size_t nb = (n + per - 1) / per;
    rb_batch **bs = calloc(nb, sizeof(*bs));
    uint32_t *map = malloc(n * sizeof(uint32_t)); /* request (lo + j) of batch k -> op index */
    int ret;
    if (!bs || !map) {
        ret = rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    } else if (rb_dev_enter(c->dev) < 0) {
        ret = rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "device is closed");
    } else {
        r->entered = 1;
        r->bs = bs;
        r->map = map;
        return uops_submit_all(r, nb, err);
    }
    for (size_t i = 0; i < n; i++) {
        ops[i].rc = ret;
        ops[i].err = *err;
    }
    free(bs);
    free(map);
    return ret;
}

/* A finished batch's time handed to the engine before its first request reached the kernel,
 * and in the kernel until its last completion (when it was timed). */
static void uops_observe(rb_core *c, const rb_batch *b)
{
    uint64_t k = b->t_kern_ns;
    if (!b->t_given_ns || !k || k < b->t_given_ns)
        return;
    uint64_t end = rb_hist_now_ns();
    rb_obs_w w = rb_obs_take(&c->obs);
    rb_obs_w_add(w, RB_H_QUEUE_WAIT, k - b->t_given_ns);
    rb_obs_w_add(w, RB_H_DEVICE, end > k ? end - k : 0);
    rb_obs_give(w);
}

/* Wait for every submitted batch and give each of its ops the request's result; free them. */
static void uops_wait_all(rb_uops_run *r)
{
    struct rb_uring *u = r->c->dev->uring;
    for (size_t k = 0; k < r->submitted; k++) {
        rb_batch *b = r->bs[k];
        if (!b->n) {
            rb_batch_free(b);
            continue;
        }
        rb_uring_wait(u, b);
        uops_observe(r->c, b);
        for (uint32_t j = 0; j < b->n; j++) {
            rb_uop *o = &r->ops[r->map[k * r->per + j]];
            int rr = rb_batch_result(b, j, &o->err);
            if (rr < 0)
                o->rc = rr;
        }
        rb_batch_free(b);
    }
}

/* Whether op o's failure belongs in the fault journal: a data transfer or a write that the
 * device (not a closed core, a bad argument or memory) failed. */
static int uop_fault_noted(const rb_uops_run *r, const rb_uop *o)
{
    return o->rc < 0 && (r->data || o->write) && o->rc != -ESHUTDOWN && o->err.kind != RB_ERR_VALUE &&
           o->err.kind != RB_ERR_NOMEM;
}

void rb_core_uring_ops_finish(rb_uops_run *r)
{
    if (!r->entered)
        return;
    uops_wait_all(r);
    rb_dev_leave(r->c->dev);
    free(r->bs);
    free(r->map);
    r->entered = 0;
    /* Into the fault journal: each request that failed, and a failed submission once (not once
     * per request it left unsent). */
    int unsent_noted = 0;
    for (size_t i = 0; i < r->n; i++) {
        const rb_uop *o = &r->ops[i];
        if (!uop_fault_noted(r, o))
            continue;
        if (i >= r->unsent_from && o->rc == r->unsent_rc) {
            if (unsent_noted++)
                continue;
        }
        rb_core_note_fault(r->c, o->write ? "write" : "read", o->off, &o->err);
    }
}
