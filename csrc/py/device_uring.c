/*
 * device_uring.c - io_uring-only methods of RawBlockDevice: batched_write, batched_read,
 * wait_iouring, read_uring, write_uring, register_fixed_buffers, worker_error,
 * fixed_buffer_status; and the per-device table of batches not yet waited on.
 *
 * Buffer lifetime: every Py_buffer view of a batch is held (in the batch's trailing space)
 * until wait_iouring collects the batch or close()/dealloc frees the table, always with the
 * GIL held. The core engine (csrc/core/rb_uring.c) sees only raw pointers.
 *
 * Concurrency: the batch table and the id counter are touched only with the GIL held.
 * Every call that uses the engine without the GIL holds a device user reference
 * (rb_dev_enter/leave), so close() waits for it and the engine outlives it.
 */
#include "rbpy.h"

#include <errno.h>
#include <string.h>

#include "../core/rb_uring.h"

struct rbpy_slot {
    uint64_t id; /* 0 = empty */
    rb_batch *b;
};

struct rbpy_uring_batches {
    uint64_t next_id;
    size_t cap; /* power of two */
    size_t count;
    size_t reserved; /* slots promised by table_reserve to callers not yet in table_put_raw */
    struct rbpy_slot *slots;
};

/* Binding data in the batch's trailing space. */
typedef struct {
    Py_ssize_t nviews;
    Py_buffer views[];
} batch_ext;

static const char DEPRECATED_READ_URING[] =
    "RawBlockDevice.read_uring() is deprecated; use batched_read() followed by wait_iouring() instead.";

/* ------------------------------------------------------------------ batch table */

static size_t slot_of(uint64_t id, size_t cap)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdULL;
    id ^= id >> 33;
    return (size_t)id & (cap - 1);
}

static rbpy_uring_batches *table_get(RawBlockDeviceObject *self)
{
    if (!self->batches) {
        self->batches = PyMem_Calloc(1, sizeof(rbpy_uring_batches));
        if (!self->batches) {
            PyErr_NoMemory();
            return NULL;
        }
        self->batches->next_id = 1;
    }
    return self->batches;
}

static void table_put_raw(rbpy_uring_batches *t, uint64_t id, rb_batch *b)
{
    size_t i = slot_of(id, t->cap);
    while (t->slots[i].id)
        i = (i + 1) & (t->cap - 1);
    t->slots[i].id = id;
    t->slots[i].b = b;
    t->count++;
}

/* Insert an entry whose slot table_reserve promised (the GIL may have been released since). */
static void table_put_reserved(rbpy_uring_batches *t, uint64_t id, rb_batch *b)
{
    t->reserved--;
    table_put_raw(t, id, b);
}

/* Make room for one more entry (load factor <= 1/2), counting the entries other callers
 * reserved and will insert after releasing and re-taking the GIL. */
static int table_reserve(rbpy_uring_batches *t)
{
    if (t->cap && (t->count + t->reserved + 1) * 2 <= t->cap) {
        t->reserved++;
        return 0;
    }
    size_t ncap = t->cap ? t->cap * 2 : 16;
    struct rbpy_slot *old = t->slots;
    size_t ocap = t->cap;
    struct rbpy_slot *ns = PyMem_Calloc(ncap, sizeof(*ns));
    if (!ns) {
        PyErr_NoMemory();
        return -1;
    }
    t->slots = ns;
    t->cap = ncap;
    t->count = 0;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].id)
            table_put_raw(t, old[i].id, old[i].b);
    PyMem_Free(old);
    t->reserved++;
    return 0;
}

static rb_batch *table_take(rbpy_uring_batches *t, uint64_t id)
{
    if (!t || !t->cap || id == 0)
        return NULL;
    size_t i = slot_of(id, t->cap);
    while (t->slots[i].id && t->slots[i].id != id)
        i = (i + 1) & (t->cap - 1);
    if (!t->slots[i].id)
        return NULL;
    rb_batch *b = t->slots[i].b;
    /* Backward-shift deletion keeps probe sequences intact without tombstones. */
    size_t hole = i;
    for (size_t j = (i + 1) & (t->cap - 1); t->slots[j].id; j = (j + 1) & (t->cap - 1)) {
        size_t home = slot_of(t->slots[j].id, t->cap);
        /* j may move to hole if home is not cyclically within (hole, j]. */
        int in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!in_range) {
            t->slots[hole] = t->slots[j];
            hole = j;
        }
    }
    t->slots[hole].id = 0;
    t->slots[hole].b = NULL;
    t->count--;
    return b;
}

/* Release the views a batch holds and free it. GIL held; the batch must be complete. */
static void batch_release(rb_batch *b)
{
    if (!b)
        return;
    batch_ext *ext = b->user;
    if (ext)
        for (Py_ssize_t i = 0; i < ext->nviews; i++)
            PyBuffer_Release(&ext->views[i]);
    rb_batch_free(b);
}

void rbpy_uring_batches_free(RawBlockDeviceObject *self)
{
    rbpy_uring_batches *t = self->batches;
    if (!t)
        return;
    self->batches = NULL;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].id)
            batch_release(t->slots[i].b);
    PyMem_Free(t->slots);
    PyMem_Free(t);
}

/* ------------------------------------------------------------------ argument helpers */

static PyObject *not_enabled(void)
{
    PyErr_SetString(PyExc_RuntimeError, "io_uring not enabled");
    return NULL;
}

static PyObject *closed_error(void)
{
    PyErr_SetString(PyExc_RuntimeError, "device is closed");
    return NULL;
}

/* A list/tuple/sequence as a PySequence_Fast object (new reference). */
static PyObject *as_seq(PyObject *o, const char *name)
{
    if (PyUnicode_Check(o) || PyBytes_Check(o) || PyByteArray_Check(o) || !PySequence_Check(o)) {
        PyErr_Format(PyExc_TypeError, "argument '%s': '%.100s' object cannot be converted to 'Sequence'", name,
                     Py_TYPE(o)->tp_name);
        return NULL;
    }
    return PySequence_Fast(o, "expected a sequence");
}

/* One unsigned integer item: PyO3-style TypeError text, CPython's OverflowError texts. */
static int item_u64(PyObject *o, const char *name, uint64_t *out)
{
    PyObject *idx;
    if (PyLong_Check(o)) {
        idx = Py_NewRef(o);
    } else if (PyIndex_Check(o)) {
        idx = PyNumber_Index(o);
        if (!idx)
            return -1;
    } else {
        PyErr_Format(PyExc_TypeError, "argument '%s': '%.100s' object cannot be interpreted as an integer", name,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(idx);
    Py_DECREF(idx);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

static int item_size(PyObject *o, const char *name, size_t *out)
{
    uint64_t v;
    if (item_u64(o, name, &v) < 0)
        return -1;
    if (v > SIZE_MAX) {
        PyErr_SetString(PyExc_OverflowError, "int too big to convert");
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

/* placement id: None (*out = 0: no directive) or 1..=65535. Only a passthrough device turns
 * it into an FDP directive; the other engines validate it and ignore it, as LMCache's do. */
static int check_placement(PyObject *o, const char *argname, uint16_t *out)
{
    *out = 0;
    if (o == Py_None)
        return 0;
    if (!PyLong_Check(o) && !PyIndex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "argument '%s': '%.100s' object cannot be interpreted as an integer", argname,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *idx = PyNumber_Index(o);
    if (!idx)
        return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
    Py_DECREF(idx);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (!overflow && v == 0) {
        PyErr_SetString(PyExc_ValueError, "placement_id must not be 0; use None to omit the FDP directive");
        return -1;
    }
    if (overflow || v < 1 || v > 65535) {
        PyErr_SetString(PyExc_ValueError, "placement_id must be in range 1..=65535");
        return -1;
    }
    *out = (uint16_t)v;
    return 0;
}

/* "<ExcType>: <str(exc)>" of the exception an rb_err describes. */
static PyObject *err_text(const rb_err *err)
{
    if (err->kind == RB_ERR_OS) {
        PyObject *exc = PyObject_CallFunction(PyExc_OSError, "is", err->errnum, err->msg);
        if (!exc)
            return NULL;
        PyObject *s = PyUnicode_FromFormat("%s: %S", Py_TYPE(exc)->tp_name, exc);
        Py_DECREF(exc);
        return s;
    }
    const char *tn = err->kind == RB_ERR_VALUE   ? "ValueError"
                     : err->kind == RB_ERR_NOMEM ? "MemoryError"
                                                 : "RuntimeError";
    return PyUnicode_FromFormat("%s: %s", tn, err->msg);
}

static rb_batch *new_batch(Py_ssize_t n)
{
    if ((size_t)n > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "too many operations in one batch");
        return NULL;
    }
    rb_batch *b = rb_batch_new((uint32_t)n, sizeof(batch_ext) + (size_t)n * sizeof(Py_buffer));
    if (!b)
        PyErr_NoMemory();
    return b;
}

/* ------------------------------------------------------------------ batched I/O */

/*
 * Shared tail of batched_write/batched_read: prepare (bounce copies) and queue without the
 * GIL, then record the batch under a fresh id. Takes ownership of b (and of the device user
 * reference the caller took). Returns the id as a Python int or NULL.
 */
static PyObject *queue_batch(RawBlockDeviceObject *self, rb_batch *b)
{
    rb_dev *dev = self->dev;
    struct rb_uring *u = rb_dev_uring(dev);
    rbpy_uring_batches *t = table_get(self);
    if (!t || table_reserve(t) < 0) {
        batch_release(b);
        rb_dev_leave(dev);
        return NULL;
    }
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = rb_batch_prepare(u, b, &err);
        if (rc == 0)
            (void)rb_uring_submit(u, b); /* refused: every entry reports "io_uring worker stopped" */
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        t->reserved--;
        batch_release(b);
        rb_dev_leave(dev);
        return rbpy_raise_err(&err);
    }
    uint64_t id = t->next_id++;
    table_put_reserved(t, id, b);
    rb_dev_leave(dev);
    return PyLong_FromUnsignedLongLong(id);
}

/* Common entry checks; on success the caller holds a device user reference. */
static int enter_uring(RawBlockDeviceObject *self)
{
    if (rbpy_device_check_open(self) < 0)
        return -1;
    if (!self->use_iouring) {
        not_enabled();
        return -1;
    }
    if (rb_dev_enter(self->dev) < 0) {
        closed_error();
        return -1;
    }
    if (rb_uring_stopped(rb_dev_uring(self->dev))) {
        rb_dev_leave(self->dev);
        PyErr_SetString(PyExc_RuntimeError, "io_uring worker stopped");
        return -1;
    }
    return 0;
}

static PyObject *fresh_id(RawBlockDeviceObject *self)
{
    rbpy_uring_batches *t = table_get(self);
    if (!t)
        return NULL;
    return PyLong_FromUnsignedLongLong(t->next_id++);
}

/* Offsets, total lengths and (writes) payload lengths of every request, in entry order:
 * payload_len defaults to total_len. */
static int batch_numbers(rb_batch *b, PyObject *offs, PyObject *tots, PyObject *pays)
{
    for (size_t i = 0; i < b->n; i++) {
        rb_req *r = &b->reqs[i];
        if (item_u64(PySequence_Fast_GET_ITEM(offs, i), "offsets", &r->cur_off) < 0 ||
            item_size(PySequence_Fast_GET_ITEM(tots, i), "total_lens", &r->total_len) < 0)
            return -1;
        r->payload_len = r->total_len;
        if (pays && item_size(PySequence_Fast_GET_ITEM(pays, i), "payload_lens", &r->payload_len) < 0)
            return -1;
    }
    return 0;
}

/*
 * Take the n buffers of a batch (writable ones for reads), then the user reference. Buffers come
 * first: from Python 3.12 a buffer can be a Python class (__buffer__), whose code could close the
 * device, and close() waits for every admitted call. Returns 0 entered, -1 with an exception
 * (views taken so far stay in the batch for its release).
 */
static int take_views(RawBlockDeviceObject *self, rb_batch *b, PyObject *bufs, Py_ssize_t n, int writable)
{
    batch_ext *ext = b->user;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer *v = &ext->views[i];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(bufs, i), v,
                               (writable ? PyBUF_WRITABLE : 0) | PyBUF_ANY_CONTIGUOUS) < 0)
            return -1;
        ext->nviews++;
        if (writable && v->readonly) {
            PyErr_SetString(PyExc_ValueError, "output buffer is readonly");
            return -1;
        }
        if (v->buf == NULL && v->len > 0) {
            PyErr_SetString(PyExc_ValueError, "null buffer pointer");
            return -1;
        }
    }
    return enter_uring(self);
}

/* The sequences of a batched call (PySequence_Fast objects; pids and pays NULL when not given,
 * and always for reads) and their common length. */
typedef struct {
    PyObject *offs, *bufs, *tots, *pids, *pays;
    Py_ssize_t n;
} batch_args;

static void batch_args_clear(batch_args *ba)
{
    Py_XDECREF(ba->offs);
    Py_XDECREF(ba->bufs);
    Py_XDECREF(ba->tots);
    Py_XDECREF(ba->pids);
    Py_XDECREF(ba->pays);
}

/* The lengths of the sequences, and every placement id (checked before payload_lens' length,
 * as LMCache does). 0, or -1 with ValueError. */
static int batch_lengths(batch_args *ba)
{
    Py_ssize_t n = ba->n = PySequence_Fast_GET_SIZE(ba->offs);
    if (PySequence_Fast_GET_SIZE(ba->bufs) != n || PySequence_Fast_GET_SIZE(ba->tots) != n) {
        PyErr_SetString(PyExc_ValueError, "All vectors must have same length");
        return -1;
    }
    if (ba->pids) {
        if (PySequence_Fast_GET_SIZE(ba->pids) != n) {
            PyErr_SetString(PyExc_ValueError, "placement_ids must have same length as offsets");
            return -1;
        }
        uint16_t pid;
        for (Py_ssize_t i = 0; i < n; i++)
            if (check_placement(PySequence_Fast_GET_ITEM(ba->pids, i), "placement_ids", &pid) < 0)
                return -1;
    }
    if (ba->pays && PySequence_Fast_GET_SIZE(ba->pays) != n) {
        PyErr_SetString(PyExc_ValueError, "payload_lens must have same length as offsets");
        return -1;
    }
    return 0;
}

/* The arguments of batched_write (write) or batched_read: the sequences, then the entry checks
 * (their errors come after the sequences' and before the lengths'), then the lengths. The user
 * reference is taken again only once no more Python code (__index__) runs: code there that
 * closes the device would wait for it. 0, or -1 with an exception. */
static int batch_args_from(RawBlockDeviceObject *self, PyObject *const *a, int write, batch_args *ba)
{
    if (!(ba->offs = as_seq(a[0], "offsets")) || !(ba->bufs = as_seq(a[1], "buffers")) ||
        !(ba->tots = as_seq(a[2], "total_lens")))
        return -1;
    if (write && a[3] && a[3] != Py_None && !(ba->pids = as_seq(a[3], "placement_ids")))
        return -1;
    if (write && a[4] && a[4] != Py_None && !(ba->pays = as_seq(a[4], "payload_lens")))
        return -1;
    if (enter_uring(self) < 0)
        return -1;
    rb_dev_leave(self->dev);
    return batch_lengths(ba);
}

/* Writes: every request's lengths and range, before any buffer is touched. A write past the end
 * of the device is refused for the whole batch (a file would grow; see rb_dev_check_range). */
static int write_ranges_check(RawBlockDeviceObject *self, rb_batch *b)
{
    rb_err err;
    for (uint32_t i = 0; i < b->n; i++) {
        rb_req *r = &b->reqs[i];
        if (r->payload_len > r->total_len) {
            PyErr_SetString(PyExc_ValueError, "total_len must be >= payload_len");
            return -1;
        }
        if (rb_dev_check_direct(self->dev, r->cur_off, r->total_len, &err) < 0 ||
            rb_dev_check_range(self->dev, 1, r->cur_off, r->total_len, &err) < 0) {
            rbpy_raise_err(&err);
            return -1;
        }
    }
    return 0;
}

/* Writes: each request set on its view, with its placement id (validated by batch_lengths). */
static int write_reqs_set(RawBlockDeviceObject *self, rb_batch *b, PyObject *pids)
{
    batch_ext *ext = b->user;
    rb_err err;
    for (uint32_t i = 0; i < b->n; i++) {
        rb_req *r = &b->reqs[i];
        Py_buffer *v = &ext->views[i];
        if (rb_batch_set(rb_dev_uring(self->dev), b, i, RB_REQ_WRITE, r->cur_off, v->buf, (size_t)v->len,
                         r->payload_len, r->total_len, 0, &err) < 0) {
            rbpy_raise_err(&err);
            return -1;
        }
        if (pids)
            (void)check_placement(PySequence_Fast_GET_ITEM(pids, i), "placement_ids", &r->pid);
    }
    return 0;
}

/* Reads: each request checked and set on its (writable) view. */
static int read_reqs_set(RawBlockDeviceObject *self, rb_batch *b)
{
    batch_ext *ext = b->user;
    rb_err err;
    for (uint32_t i = 0; i < b->n; i++) {
        rb_req *r = &b->reqs[i];
        Py_buffer *v = &ext->views[i];
        if (rb_dev_check_direct(self->dev, r->cur_off, r->total_len, &err) < 0) {
            rbpy_raise_err(&err);
            return -1;
        }
        if (v->len == 0 && r->total_len > 0) {
            PyErr_Format(PyExc_ValueError, "output buffer too small: cap=0 need=%zu", r->total_len);
            return -1;
        }
        if (rb_batch_set(rb_dev_uring(self->dev), b, i, RB_REQ_READ, r->cur_off, v->buf, (size_t)v->len, r->total_len,
                         r->total_len, (size_t)-1, &err) < 0) {
            rbpy_raise_err(&err);
            return -1;
        }
    }
    return 0;
}

/* The batch of batched_write (write) or batched_read once its arguments are in: a fresh id for
 * no entries; else the numbers (checked before any buffer is touched, as LMCache does), the
 * write ranges, the views and the user reference, each request, and the queue. The batch id,
 * or NULL with an exception. */
static PyObject *batch_run(RawBlockDeviceObject *self, const batch_args *ba, int write)
{
    if (ba->n == 0)
        return fresh_id(self);
    rb_batch *b = new_batch(ba->n);
    if (!b)
        return NULL;
    if (batch_numbers(b, ba->offs, ba->tots, ba->pays) < 0 || (write && write_ranges_check(self, b) < 0) ||
        take_views(self, b, ba->bufs, ba->n, !write) < 0) {
        batch_release(b);
        return NULL;
    }
    if ((write ? write_reqs_set(self, b, ba->pids) : read_reqs_set(self, b)) < 0) {
        batch_release(b);
        rb_dev_leave(self->dev);
        return NULL;
    }
    return queue_batch(self, b); /* owns b and the user reference */
}

PyObject *rbpy_dev_batched_write(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"offsets", "buffers", "total_lens", "placement_ids", "payload_lens"};
    PyObject *a[5];
    if (rbpy_unpack("batched_write", names, 5, 3, args, nargs, kwnames, a) < 0)
        return NULL;
    batch_args ba = {0};
    PyObject *ret = NULL;
    if (batch_args_from((RawBlockDeviceObject *)op, a, 1, &ba) == 0)
        ret = batch_run((RawBlockDeviceObject *)op, &ba, 1);
    batch_args_clear(&ba);
    return ret;
}

PyObject *rbpy_dev_batched_read(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"offsets", "buffers", "total_lens"};
    PyObject *a[3];
    if (rbpy_unpack("batched_read", names, 3, 3, args, nargs, kwnames, a) < 0)
        return NULL;
    batch_args ba = {0};
    PyObject *ret = NULL;
    if (batch_args_from((RawBlockDeviceObject *)op, a, 0, &ba) == 0)
        ret = batch_run((RawBlockDeviceObject *)op, &ba, 0);
    batch_args_clear(&ba);
    return ret;
}

/* wait_iouring's answer for a completed batch: ([success per entry], [(index, "<ExcType>:
 * <text>"), ...] for the entries that failed). */
static PyObject *batch_results(rb_batch *b)
{
    PyObject *ok = PyList_New(b->n), *errs = PyList_New(0), *ret = NULL;
    if (!ok || !errs)
        goto done;
    for (uint32_t i = 0; i < b->n; i++) {
        rb_err err;
        int rc = rb_batch_result(b, i, &err);
        PyList_SET_ITEM(ok, i, Py_NewRef(rc == 0 ? Py_True : Py_False));
        if (rc == 0)
            continue;
        PyObject *msg = err_text(&err);
        PyObject *item = msg ? Py_BuildValue("(IN)", i, msg) : NULL;
        if (!item || PyList_Append(errs, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    ret = PyTuple_Pack(2, ok, errs);
done:
    Py_XDECREF(ok);
    Py_XDECREF(errs);
    return ret;
}

PyObject *rbpy_dev_wait_iouring(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"batch_id"};
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    PyObject *a[1];
    if (rbpy_unpack("wait_iouring", names, 1, 1, args, nargs, kwnames, a) < 0)
        return NULL;
    uint64_t id;
    if (item_u64(a[0], "batch_id", &id) < 0)
        return NULL;
    rb_dev *dev = self->dev;
    if (!self->use_iouring || !self->batches || rb_dev_enter(dev) < 0)
        return Py_BuildValue("([][])");
    rb_batch *b = table_take(self->batches, id);
    if (!b) {
        rb_dev_leave(dev);
        return Py_BuildValue("([][])");
    }
    if (!rb_batch_done(b)) {
        Py_BEGIN_ALLOW_THREADS
            rb_uring_wait(rb_dev_uring(dev), b);
        Py_END_ALLOW_THREADS
    }
    rb_dev_leave(dev);
    PyObject *ret = batch_results(b);
    batch_release(b);
    return ret;
}

/* ------------------------------------------------------------------ single synchronous ops */

/* Run a one-request batch through the worker; GIL released only while waiting. */
static PyObject *run_single(RawBlockDeviceObject *self, int opcode, uint64_t offset, Py_buffer *v, size_t payload,
                            size_t total, uint16_t pid)
{
    struct rb_uring *u = rb_dev_uring(self->dev);
    rb_err err;
    rb_err_clear(&err);
    rb_batch *b = rb_batch_new(1, 0);
    if (!b)
        return PyErr_NoMemory();
    int rc = rb_batch_set(u, b, 0, opcode, offset, v->buf, (size_t)v->len, payload, total, payload, &err);
    b->reqs[0].pid = pid;
    if (rc == 0)
        rc = rb_batch_prepare(u, b, &err);
    if (rc < 0) {
        rb_batch_free(b);
        return rbpy_raise_err(&err);
    }
    if (rb_uring_submit(u, b) == 0 && !rb_batch_done(b)) {
        Py_BEGIN_ALLOW_THREADS
            rb_uring_wait(u, b);
        Py_END_ALLOW_THREADS
    }
    rc = rb_batch_result(b, 0, &err);
    rb_batch_free(b);
    if (rc < 0)
        return rbpy_raise_err(&err);
    Py_RETURN_NONE;
}

/*
 * read_uring / write_uring: offset, payload_len and total_len (default payload_len) from
 * args[0], [2], [3]; then the entry checks (their errors come first), the buffer args[1], and
 * the user reference last, as in take_views. Returns 0 with *v held and the call entered, or
 * -1 with an exception.
 */
static int single_begin(RawBlockDeviceObject *self, PyObject *const *a, int flags, uint64_t *offset, size_t *payload,
                        size_t *total, Py_buffer *v)
{
    if (item_u64(a[0], "offset", offset) < 0 || item_size(a[2], "payload_len", payload) < 0)
        return -1;
    *total = *payload;
    if (a[3] && a[3] != Py_None && item_size(a[3], "total_len", total) < 0)
        return -1;
    if (enter_uring(self) < 0)
        return -1;
    rb_dev_leave(self->dev);
    if (PyObject_GetBuffer(a[1], v, flags | PyBUF_ANY_CONTIGUOUS) < 0)
        return -1;
    if (enter_uring(self) < 0) {
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

PyObject *rbpy_dev_read_uring(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"offset", "data", "payload_len", "total_len"};
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    PyObject *a[4];
    if (rbpy_unpack("read_uring", names, 4, 3, args, nargs, kwnames, a) < 0)
        return NULL;
    if (PyErr_WarnEx(PyExc_DeprecationWarning, DEPRECATED_READ_URING, 1) < 0)
        return NULL;
    uint64_t offset;
    size_t payload, total;
    Py_buffer v;
    if (single_begin(self, a, PyBUF_WRITABLE, &offset, &payload, &total, &v) < 0)
        return NULL;
    PyObject *ret = NULL;
    rb_err err;
    if (v.readonly)
        PyErr_SetString(PyExc_ValueError, "output buffer is readonly");
    else if (v.buf == NULL && v.len > 0)
        PyErr_SetString(PyExc_ValueError, "null buffer pointer");
    else if ((size_t)v.len < payload)
        PyErr_Format(PyExc_ValueError, "output buffer too small: cap=%zd need=%zu", v.len, payload);
    else if (total < payload)
        PyErr_SetString(PyExc_ValueError, "total_len must be >= payload_len");
    else if (rb_dev_check_direct(self->dev, offset, total, &err) < 0)
        rbpy_raise_err(&err);
    else
        ret = run_single(self, RB_REQ_READ, offset, &v, payload, total, 0);
    PyBuffer_Release(&v);
    rb_dev_leave(self->dev);
    return ret;
}

PyObject *rbpy_dev_write_uring(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"offset", "data", "payload_len", "total_len", "placement_id"};
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    PyObject *a[5];
    if (rbpy_unpack("write_uring", names, 5, 3, args, nargs, kwnames, a) < 0)
        return NULL;
    uint64_t offset;
    size_t payload, total;
    Py_buffer v;
    if (single_begin(self, a, 0, &offset, &payload, &total, &v) < 0)
        return NULL;
    PyObject *ret = NULL;
    rb_err err;
    uint16_t pid = 0;
    if (v.buf == NULL && v.len > 0)
        PyErr_SetString(PyExc_ValueError, "null buffer pointer");
    else if ((size_t)v.len < payload)
        PyErr_Format(PyExc_ValueError, "input buffer too small: cap=%zd need=%zu", v.len, payload);
    else if (total < payload)
        PyErr_SetString(PyExc_ValueError, "total_len must be >= payload_len");
    else if (a[4] && check_placement(a[4], "placement_id", &pid) < 0)
        ;
    else if (rb_dev_check_direct(self->dev, offset, total, &err) < 0)
        rbpy_raise_err(&err);
    else
        ret = run_single(self, RB_REQ_WRITE, offset, &v, payload, total, pid);
    PyBuffer_Release(&v);
    rb_dev_leave(self->dev);
    return ret;
}

/* ------------------------------------------------------------------ fixed buffers, status */

/* The n unsigned ints of seq (a PySequence_Fast object) as a PyMem array, or NULL with an
 * exception naming the argument. */
static uint64_t *u64_items(PyObject *seq, const char *name)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint64_t *v = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (!v)
        return (uint64_t *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        if (item_u64(PySequence_Fast_GET_ITEM(seq, i), name, &v[i]) < 0) {
            PyMem_Free(v);
            return NULL;
        }
    }
    return v;
}

/* Register n fixed buffers with the engine (entered here, the GIL released). 0 or -1. */
static int register_buffers(RawBlockDeviceObject *self, const uint64_t *ptrs, const uint64_t *sizes, size_t n)
{
    if (enter_uring(self) < 0)
        return -1;
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = rb_uring_register_buffers(rb_dev_uring(self->dev), ptrs, sizes, n, &err);
    Py_END_ALLOW_THREADS
    rb_dev_leave(self->dev);
    if (rc < 0)
        rbpy_raise_err(&err);
    return rc < 0 ? -1 : 0;
}

PyObject *rbpy_dev_register_fixed_buffers(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"buffer_ptrs", "buffer_sizes"};
    PyObject *a[2];
    if (rbpy_unpack("register_fixed_buffers", names, 2, 2, args, nargs, kwnames, a) < 0)
        return NULL;
    PyObject *ps = NULL, *ss = NULL, *ret = NULL;
    uint64_t *ptrs = NULL, *sizes = NULL;
    if (!(ps = as_seq(a[0], "buffer_ptrs")) || !(ss = as_seq(a[1], "buffer_sizes")) ||
        !(ptrs = u64_items(ps, "buffer_ptrs")) || !(sizes = u64_items(ss, "buffer_sizes")))
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ps);
    if (PySequence_Fast_GET_SIZE(ss) != n)
        PyErr_SetString(PyExc_ValueError, "buffer_ptrs and buffer_sizes must have same length");
    else if (n == 0)
        PyErr_SetString(PyExc_ValueError, "at least one buffer must be provided");
    else if (register_buffers((RawBlockDeviceObject *)op, ptrs, sizes, (size_t)n) == 0)
        ret = Py_NewRef(Py_None);
done:
    PyMem_Free(ptrs);
    PyMem_Free(sizes);
    Py_XDECREF(ps);
    Py_XDECREF(ss);
    return ret;
}

PyObject *rbpy_dev_worker_error(PyObject *op, PyObject *unused)
{
    (void)unused;
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    if (!self->use_iouring || rb_dev_enter(self->dev) < 0)
        Py_RETURN_NONE;
    char msg[256];
    struct rb_uring *u = rb_dev_uring(self->dev);
    int has = u && rb_uring_worker_error(u, msg, sizeof(msg));
    rb_dev_leave(self->dev);
    if (!has)
        Py_RETURN_NONE;
    return PyUnicode_FromString(msg);
}

PyObject *rbpy_dev_fixed_buffer_status(PyObject *op, PyObject *unused)
{
    (void)unused;
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    int reg = 0;
    uint64_t bytes = 0;
    if (self->use_iouring && rb_dev_enter(self->dev) == 0) {
        struct rb_uring *u = rb_dev_uring(self->dev);
        if (u)
            rb_uring_fixed_status(u, &reg, &bytes);
        rb_dev_leave(self->dev);
    }
    return Py_BuildValue("(OK)", reg ? Py_True : Py_False, (unsigned long long)bytes);
}

/* _inject_engine_fault(kinds): test hook, RB_URING_FAULT_* bits (1 submit, 2 reap). */
PyObject *rbpy_dev_inject_engine_fault(PyObject *op, PyObject *arg)
{
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    long kinds = PyLong_AsLong(arg);
    if (kinds == -1 && PyErr_Occurred())
        return NULL;
    if (enter_uring(self) < 0)
        return NULL;
    rb_uring_inject_fault(rb_dev_uring(self->dev), (int)kinds);
    rb_dev_leave(self->dev);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the scheduler, test hooks */

/* dev's engine, entered (the caller leaves dev), for the method called name. NULL with
 * RuntimeError when dev is closed or has no io_uring engine. */
static struct rb_uring *engine_enter(rb_dev *dev, const char *name)
{
    if (!dev || rb_dev_enter(dev) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "device is closed");
        return NULL;
    }
    struct rb_uring *u = rb_dev_uring(dev);
    if (!u) {
        rb_dev_leave(dev);
        PyErr_Format(PyExc_RuntimeError, "%s needs io_engine='io_uring'", name);
    }
    return u;
}

PyObject *rbpy_engine_sched(rb_dev *dev)
{
    if (!dev || rb_dev_enter(dev) < 0)
        Py_RETURN_NONE;
    struct rb_uring *u = rb_dev_uring(dev);
    rb_sched_cfg sc = {0};
    if (u)
        rb_uring_sched(u, &sc);
    rb_dev_leave(dev);
    if (!u)
        Py_RETURN_NONE;
    return Py_BuildValue("{s:s,s:K,s:K,s:K}", "io_scheduler", sc.mode == RB_SCHED_FIFO ? "fifo" : "loads_first",
                         "read_max_bytes_in_flight", (unsigned long long)sc.read_max_bytes, "write_max_bytes_in_flight",
                         (unsigned long long)sc.write_max_bytes, "write_piece_bytes",
                         (unsigned long long)sc.write_piece_bytes);
}

PyObject *rbpy_engine_hold(rb_dev *dev, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    struct rb_uring *u = engine_enter(dev, "_hold_engine");
    if (!u)
        return NULL;
    rb_uring_hold(u, on);
    rb_dev_leave(dev);
    Py_RETURN_NONE;
}

PyObject *rbpy_engine_fail_write(rb_dev *dev, PyObject *arg)
{
    long long nth = PyLong_AsLongLong(arg);
    if (nth == -1 && PyErr_Occurred())
        return NULL;
    struct rb_uring *u = engine_enter(dev, "_fail_engine_write");
    if (!u)
        return NULL;
    rb_uring_fail_write(u, (int64_t)nth);
    rb_dev_leave(dev);
    Py_RETURN_NONE;
}

/* The recorded completions as [(op, offset, length, last), ...]; op "read" or "write", last
 * whether the attempt ended its request. */
static PyObject *trace_list(const rb_trace_ent *t, size_t n)
{
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *e =
            Py_BuildValue("(sKIO)", t[i].op == RB_REQ_READ ? "read" : "write", (unsigned long long)t[i].offset,
                          (unsigned)t[i].len, t[i].last ? Py_True : Py_False);
        if (!e)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, (Py_ssize_t)i, e);
    }
    return out;
}

PyObject *rbpy_engine_trace(rb_dev *dev, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0 || n > (1 << 24)) {
        PyErr_Format(PyExc_ValueError, "_trace_engine: n must be in 0..%d, got %zd", 1 << 24, n);
        return NULL;
    }
    struct rb_uring *u = engine_enter(dev, "_trace_engine");
    if (!u)
        return NULL;
    size_t cap = 1 << 16, got = 0;
    rb_trace_ent *t = malloc(cap * sizeof(*t));
    int rc = -ENOMEM;
    if (t) {
        got = rb_uring_trace_read(u, t, cap);
        rc = rb_uring_trace(u, (size_t)n);
    }
    rb_dev_leave(dev);
    PyObject *out = rc == 0 ? trace_list(t, got) : PyErr_NoMemory();
    free(t);
    return out;
}
