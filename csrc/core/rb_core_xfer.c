/*
 * rb_core_xfer.c - the core's synchronous device transfers (data and metadata, EINTR retried,
 * a failed one entered in the fault journal) and the test fault hooks they and the io_uring
 * batches (rb_core_uring.c) honour.
 */
#include "rb_core_int.h"

#include <errno.h>

/* Device entered: set up, run (EINTR retried) and release one transfer; the caller leaves. */
static int xfer_entered(rb_core *c, int write, uint64_t off, void *buf, size_t buf_len, size_t payload_len,
                        size_t total_len, void *head, size_t head_len, rb_err *err)
{
    rb_xfer x;
    int rc = rb_xfer_init(c->dev, &x, write, off, buf, buf_len, payload_len, total_len, err);
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
    return rc;
}

/* One synchronous transfer; a data read may take the slot header before it (head). A failed
 * data transfer or metadata write goes into the fault journal. */
static int dev_xfer(rb_core *c, int write, uint64_t off, void *buf, size_t buf_len, size_t payload_len,
                    size_t total_len, int data, void *head, size_t head_len, rb_err *err)
{
    int rc;
    if (data && rb_core_take_fault(write ? &c->fault_write : &c->fault_read)) {
        rc = rb_err_set(err, RB_ERR_OS, EIO, write ? "pwrite failed (injected)" : "pread failed (injected)");
    } else {
        if (rb_dev_enter(c->dev) < 0)
            return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "device is closed");
        rc = xfer_entered(c, write, off, buf, buf_len, payload_len, total_len, head, head_len, err);
        rb_dev_leave(c->dev);
    }
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
    return rb_core_take_fault(&c->fault_flush);
}
