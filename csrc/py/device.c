/*
 * device.c - the RawBlockDevice heap type: constructor (LMCache's validation order and
 * messages), synchronous pwrite_from_buffer / pread_into with the GIL released, close,
 * context manager, stats. io_uring-only methods live in device_uring.c.
 */
#include "rbpy.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <structmember.h>

#include "../core/rb_stats.h"

int rbpy_device_check_open(RawBlockDeviceObject *self)
{
    if (rb_dev_closing(self->dev)) {
        PyErr_SetString(PyExc_RuntimeError, "device is closed");
        return -1;
    }
    return 0;
}

/* Encode a path (str or os.PathLike) for open(2), rejecting NUL like LMCache's device. */
static PyObject *encode_path(PyObject *path)
{
    PyObject *fs = PyOS_FSPath(path);
    if (!fs)
        return NULL;
    PyObject *bytes;
    if (PyUnicode_Check(fs)) {
        bytes = PyUnicode_EncodeFSDefault(fs);
        Py_DECREF(fs);
    } else {
        bytes = fs; /* already bytes */
    }
    if (!bytes)
        return NULL;
    if ((size_t)PyBytes_GET_SIZE(bytes) != strlen(PyBytes_AS_STRING(bytes))) {
        Py_DECREF(bytes);
        PyErr_SetString(PyExc_ValueError, "path contains NUL");
        return NULL;
    }
    return bytes;
}

/* The lock= keyword of RawBlockDevice: absent or None is "check" (a device another process's
 * writer holds is refused, nothing is held); "shared", "exclusive" or "none". 0, or -1 with
 * an exception set. */
static int lock_mode_of(PyObject *o, int *mode)
{
    *mode = RB_LOCK_CHECK;
    if (!o || o == Py_None)
        return 0;
    static const struct {
        const char *name;
        int mode;
    } modes[] = {
        {"check", RB_LOCK_CHECK}, {"shared", RB_LOCK_SHARED}, {"exclusive", RB_LOCK_EXCLUSIVE}, {"none", RB_LOCK_NONE}};
    const char *s = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
    if (PyUnicode_Check(o) && !s)
        return -1;
    for (size_t i = 0; s && i < sizeof(modes) / sizeof(modes[0]); i++) {
        if (strcmp(s, modes[i].name) == 0) {
            *mode = modes[i].mode;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "lock must be one of 'check', 'shared', 'exclusive', 'none' or None, got %.200R", o);
    return -1;
}

/* RawBlockDevice's arguments as given (NULL: not given). */
typedef struct {
    PyObject *path, *writable, *odirect, *iouring, *uring_cmd, *alignment, *engine, *depth, *mdts, *lock;
} dev_args;

/* The integer keywords. As LMCache's device: alignment 0 or a power of two up to 2^30, a queue
 * depth below 1 taken as 1 and above the kernel's limit refused. Ours: max_data_transfer_size,
 * the bytes per NVMe command on a passthrough device (None or 0: the kernel's limit from sysfs;
 * LMCache splits transfers in Python, ours splits them here). */
#define ALIGNMENT_WORDS "must be 0 or a power of two up to 2^30"
static const rbpy_int_range alignment_range = {
    .name = "alignment", .lo = 0, .hi = 1 << 30, .below = "must be >= 0", .above = ALIGNMENT_WORDS};
static const rbpy_int_range depth_range = {.name = "iouring_queue_depth",
                                           .lo = 1,
                                           .hi = 32768,
                                           .above = "must be <= 32768 (the kernel's limit)",
                                           .clamp_low = 1};
#define MDTS_WORDS "must be 0 (from sysfs) or at most 2^30 bytes"
static const rbpy_int_range mdts_range = {.name = "max_data_transfer_size",
                                          .lo = 0,
                                          .hi = 1 << 30,
                                          .below = MDTS_WORDS,
                                          .above = MDTS_WORDS,
                                          .kind = "an int or None"};

/* The boolean keywords (strict: "false" is not true) into cfg. 0, or -1 with TypeError. */
static int dev_bools_from(const dev_args *a, rb_dev_config *cfg, int *use_iouring)
{
    if (rbpy_as_bool(a->writable, "writable", &cfg->writable) < 0 ||
        (a->odirect && rbpy_as_bool(a->odirect, "use_odirect", &cfg->odirect) < 0) ||
        (a->iouring && rbpy_as_bool(a->iouring, "use_iouring", use_iouring) < 0) ||
        (a->uring_cmd && rbpy_as_bool(a->uring_cmd, "use_uring_cmd", &cfg->uring_cmd) < 0))
        return -1;
    return 0;
}

/* The integer keywords into cfg (defaults: alignment 4096, depth 256, transfer size 0). 0, or
 * -1 with an exception naming the keyword and its value. */
static int dev_ints_from(const dev_args *a, rb_dev_config *cfg)
{
    int64_t alignment = 4096, depth = 256, mdts = 0;
    if (a->alignment && rbpy_bounded_i64(a->alignment, &alignment_range, &alignment) < 0)
        return -1;
    if (alignment & (alignment - 1))
        return rbpy_int_refused(a->alignment, "alignment", ALIGNMENT_WORDS);
    if (a->depth && a->depth != Py_None && rbpy_bounded_i64(a->depth, &depth_range, &depth) < 0)
        return -1;
    if (a->mdts && a->mdts != Py_None && rbpy_bounded_i64(a->mdts, &mdts_range, &mdts) < 0)
        return -1;
    cfg->alignment = (size_t)alignment;
    cfg->queue_depth = (unsigned)depth;
    cfg->max_transfer = (uint64_t)mdts;
    return 0;
}

/* The engine: a non-empty io_engine ("posix" or "io_uring") wins over use_iouring. *iouring
 * comes in as use_iouring. 0, or -1 with an exception. */
static int dev_engine_of(PyObject *io_engine, int *iouring)
{
    if (!io_engine || io_engine == Py_None)
        return 0;
    if (!PyUnicode_Check(io_engine)) {
        PyErr_Format(PyExc_TypeError, "io_engine must be a str or None, got %.80s %.200R", Py_TYPE(io_engine)->tp_name,
                     io_engine);
        return -1;
    }
    const char *eng = PyUnicode_AsUTF8(io_engine);
    if (!eng)
        return -1;
    if (strcmp(eng, "posix") == 0) {
        *iouring = 0;
    } else if (strcmp(eng, "io_uring") == 0) {
        *iouring = 1;
    } else if (eng[0] != '\0') {
        PyErr_Format(PyExc_ValueError, "io_engine must be one of posix, io_uring; got %s", eng);
        return -1;
    }
    return 0;
}

/* Every keyword but the path into cfg, checked in LMCache's order (our lock first). 0, or -1
 * with an exception. */
static int dev_config_from(const dev_args *a, rb_dev_config *cfg)
{
    int use_iouring = 0;
    /* Our keyword-only extension: how the device is locked (LMCache's device takes no lock). */
    if (lock_mode_of(a->lock, &cfg->lock) < 0 || dev_bools_from(a, cfg, &use_iouring) < 0 || dev_ints_from(a, cfg) < 0)
        return -1;
    /* 1. engine selection; 2. passthrough needs io_uring. */
    if (dev_engine_of(a->engine, &use_iouring) < 0)
        return -1;
    cfg->engine = use_iouring ? RB_ENGINE_IOURING : RB_ENGINE_POSIX;
    if (cfg->uring_cmd && !use_iouring) {
        PyErr_SetString(PyExc_ValueError, "use_uring_cmd requires use_iouring to be enabled");
        return -1;
    }
    return 0;
}

/* use_uring_cmd: the path must be a character device (an NVMe namespace, e.g. /dev/ng0n1); a
 * missing path is reported as opening it would, as LMCache's device does. stat(2) runs without
 * the GIL. 0, or -1 with an exception. */
static int dev_check_uring_cmd_path(const char *path)
{
    struct stat st;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = stat(path, &st);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        int e = errno;
        rb_err err;
        rb_err_set(&err, RB_ERR_OS, e, e == ENOENT ? "open failed" : "stat failed");
        rbpy_raise_err(&err);
        return -1;
    }
    if (!S_ISCHR(st.st_mode)) {
        PyErr_SetString(PyExc_ValueError,
                        "use_uring_cmd requires an NVMe namespace character device (e.g., /dev/ng0n1)");
        return -1;
    }
    return 0;
}

/* 3. the path: encoded, checked for passthrough, opened without the GIL. The device, or NULL
 * with an exception (an OSError names the path). */
static rb_dev *dev_open_path(PyObject *path, rb_dev_config *cfg)
{
    PyObject *bpath = encode_path(path);
    if (!bpath)
        return NULL;
    cfg->path = PyBytes_AS_STRING(bpath);
    rb_dev *dev = NULL;
    if (cfg->uring_cmd && dev_check_uring_cmd_path(cfg->path) < 0) {
        Py_DECREF(bpath);
        return NULL;
    }
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = rb_dev_open(cfg, &dev, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        rbpy_raise_err_path(&err, bpath); /* OSError's filename is the path */
    Py_DECREF(bpath);
    cfg->path = NULL;
    return rc < 0 ? NULL : dev;
}

static PyObject *device_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path",
                             "writable",
                             "use_odirect",
                             "use_iouring",
                             "use_uring_cmd",
                             "alignment",
                             "io_engine",
                             "iouring_queue_depth",
                             "max_data_transfer_size",
                             "lock",
                             NULL};
    dev_args a = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|OOOOOOO$O:RawBlockDevice", kwlist, &a.path, &a.writable,
                                     &a.odirect, &a.iouring, &a.uring_cmd, &a.alignment, &a.engine, &a.depth, &a.mdts,
                                     &a.lock))
        return NULL;
    rb_dev_config cfg = {0};
    if (dev_config_from(&a, &cfg) < 0)
        return NULL;
    rb_dev *dev = dev_open_path(a.path, &cfg);
    if (!dev)
        return NULL;
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)type->tp_alloc(type, 0);
    if (!self) {
        Py_BEGIN_ALLOW_THREADS
            rb_dev_free(dev);
        Py_END_ALLOW_THREADS
        return NULL;
    }
    self->dev = dev;
    self->use_iouring = cfg.engine == RB_ENGINE_IOURING;
    self->use_uring_cmd = cfg.uring_cmd;
    return (PyObject *)self;
}

static void device_close_locked_gil(RawBlockDeviceObject *self, rb_err *err, int *rc)
{
    rb_dev *dev = self->dev;
    Py_BEGIN_ALLOW_THREADS
        *rc = rb_dev_close(dev, err);
    Py_END_ALLOW_THREADS
    /* The engine has stopped: nothing references the caller's buffers any more. */
    rbpy_uring_batches_free(self);
}

static void device_dealloc(PyObject *op)
{
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->weakreflist)
        PyObject_ClearWeakRefs(op);
    if (self->dev) {
        rb_err err;
        int rc;
        device_close_locked_gil(self, &err, &rc);
        rb_dev_free(self->dev);
        self->dev = NULL;
    }
    tp->tp_free(op);
    Py_DECREF(tp);
}

static PyObject *device_close(PyObject *op, PyObject *unused)
{
    (void)unused;
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    rb_err err;
    rb_err_clear(&err);
    int rc;
    device_close_locked_gil(self, &err, &rc);
    if (rc < 0)
        return rbpy_raise_err(&err);
    Py_RETURN_NONE;
}

static PyObject *device_enter(PyObject *op, PyObject *unused)
{
    (void)unused;
    if (rbpy_device_check_open((RawBlockDeviceObject *)op) < 0)
        return NULL;
    return Py_NewRef(op);
}

static PyObject *device_exit(PyObject *op, PyObject *args)
{
    (void)args;
    PyObject *r = device_close(op, NULL);
    if (!r)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *device_size_bytes(PyObject *op, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(rb_dev_size(((RawBlockDeviceObject *)op)->dev));
}

/*
 * Prepare and run x, the GIL released around anything that may sleep: a small buffered transfer
 * first tries once without sleeping (the page cache usually serves it, which costs less than
 * handing the GIL over twice). EINTR goes back to Python to run signal handlers, then the
 * transfer resumes. 0, -EINTR when a handler raised, or <0 with err filled.
 */
static int xfer_run(rb_dev *dev, rb_xfer *x, size_t total, rb_err *err)
{
    int rc;
    if (!rb_dev_odirect(dev) && total <= RB_NOWAIT_MAX) {
        rc = rb_xfer_prepare(dev, x, err);
        if (rc == 0 && !rb_xfer_try_nowait(dev, x)) {
            Py_BEGIN_ALLOW_THREADS
                rc = rb_xfer_run(dev, x, err);
            Py_END_ALLOW_THREADS
        }
    } else {
        Py_BEGIN_ALLOW_THREADS
            rc = rb_xfer_prepare(dev, x, err);
            if (rc == 0)
                rc = rb_xfer_run(dev, x, err);
        Py_END_ALLOW_THREADS
    }
    while (rc == -EINTR) {
        if (PyErr_CheckSignals() < 0)
            break;
        Py_BEGIN_ALLOW_THREADS
            rc = rb_xfer_run(dev, x, err);
        Py_END_ALLOW_THREADS
    }
    return rc;
}

/* One synchronous transfer of view: payload_len defaults to the view's length, total_len to
 * payload_len. */
static PyObject *run_sync(RawBlockDeviceObject *self, int write, uint64_t offset, Py_buffer *view,
                          PyObject *payload_obj, PyObject *total_obj)
{
    size_t payload, total;
    int has_payload, has_total;
    if (rbpy_as_opt_size(payload_obj, "payload_len", &payload, &has_payload) < 0 ||
        rbpy_as_opt_size(total_obj, "total_len", &total, &has_total) < 0)
        return NULL;
    if (!has_payload)
        payload = (size_t)view->len;
    if (!has_total)
        total = payload;

    rb_dev *dev = self->dev;
    rb_err err;
    rb_xfer x;
    if (rb_xfer_init(dev, &x, write, offset, view->buf, (size_t)view->len, payload, total, &err) < 0)
        return rbpy_raise_err(&err);
    if (rb_dev_enter(dev) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "device is closed");
        return NULL;
    }
    int rc = xfer_run(dev, &x, total, &err);
    rb_xfer_release(&x);
    rb_dev_leave(dev);
    if (rc == -EINTR)
        return NULL; /* a signal handler raised */
    if (rc < 0)
        return rbpy_raise_err(&err);
    Py_RETURN_NONE;
}

/*
 * Shared front end of pwrite_from_buffer (names[1] == "data", payload_len optional) and
 * pread_into (names[1] == "out", payload_len required, writable memory).
 */
static PyObject *sync_method(PyObject *op, int write, const char *fname, const char *const names[4],
                             PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[4];
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    if (rbpy_unpack(fname, names, 4, write ? 2 : 3, args, nargs, kwnames, a) < 0)
        return NULL;
    uint64_t offset;
    if (rbpy_as_u64(a[0], "offset", &offset) < 0)
        return NULL;
    if (rbpy_device_check_open(self) < 0)
        return NULL;
    /* Reads ask for writable memory, as LMCache's device does: a read-only exporter raises
     * its own BufferError. One that hands out a read-only view anyway is refused here. */
    Py_buffer view;
    if (PyObject_GetBuffer(a[1], &view, PyBUF_ANY_CONTIGUOUS | (write ? 0 : PyBUF_WRITABLE)) < 0)
        return NULL;
    if (!write && view.readonly) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "output buffer is readonly");
        return NULL;
    }
    PyObject *r = run_sync(self, write, offset, &view, a[2], a[3]);
    PyBuffer_Release(&view);
    return r;
}

static PyObject *device_pwrite_from_buffer(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"offset", "data", "payload_len", "total_len"};
    return sync_method(op, 1, "pwrite_from_buffer", names, args, nargs, kwnames);
}

static PyObject *device_pread_into(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"offset", "out", "payload_len", "total_len"};
    return sync_method(op, 0, "pread_into", names, args, nargs, kwnames);
}

PyObject *rbpy_io_stats_dict(const rb_stats_snapshot *s)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
#define RBPY_PUT(name)                                                                                                 \
    do {                                                                                                               \
        PyObject *v = PyLong_FromUnsignedLongLong(s->name);                                                            \
        if (!v || PyDict_SetItemString(d, #name, v) < 0) {                                                             \
            Py_XDECREF(v);                                                                                             \
            Py_DECREF(d);                                                                                              \
            return NULL;                                                                                               \
        }                                                                                                              \
        Py_DECREF(v);                                                                                                  \
    } while (0);
    RB_STATS_FIELDS(RBPY_PUT)
#undef RBPY_PUT
    return d;
}

static PyObject *device_io_stats_snapshot(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_stats_snapshot s;
    rb_dev_stats_read(((RawBlockDeviceObject *)op)->dev, &s);
    return rbpy_io_stats_dict(&s);
}

/* The namespace of a passthrough device, or RuntimeError naming what is not available. */
static int nvme_ns_of(PyObject *op, const char *what, rb_nvme_ns *ns)
{
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    if (!rb_dev_nvme_ns(self->dev, ns)) {
        PyErr_Format(PyExc_RuntimeError, "NVMe %s not available (use_uring_cmd not enabled)", what);
        return -1;
    }
    return 0;
}

static PyObject *device_nvme_nsid(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_nvme_ns ns;
    return nvme_ns_of(op, "namespace ID", &ns) < 0 ? NULL : PyLong_FromUnsignedLong(ns.nsid);
}

static PyObject *device_nvme_lba_shift(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_nvme_ns ns;
    return nvme_ns_of(op, "LBA shift", &ns) < 0 ? NULL : PyLong_FromUnsignedLong(ns.lba_shift);
}

static PyObject *device_nvme_lba_size(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_nvme_ns ns;
    return nvme_ns_of(op, "LBA size", &ns) < 0 ? NULL : PyLong_FromUnsignedLong(ns.lba_size);
}

static PyObject *device_write_streams(PyObject *op, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLong(rb_dev_write_streams(((RawBlockDeviceObject *)op)->dev));
}

static PyObject *device_max_data_transfer_size(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_nvme_ns ns;
    if (nvme_ns_of(op, "transfer limit", &ns) < 0)
        return NULL;
    return PyLong_FromSize_t(rb_dev_max_transfer(((RawBlockDeviceObject *)op)->dev));
}

static PyObject *ruh_list(const rb_nvme_ruh *v, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(II)", (unsigned)v[i].pid, (unsigned)v[i].ruhid);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
}

PyObject *rbpy_fdp_status(rb_dev *dev, const char *not_enabled)
{
    rb_nvme_ruh *v = NULL;
    size_t n = 0;
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = rb_dev_fdp_status(dev, &v, &n, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        if (not_enabled && err.kind == RB_ERR_RUNTIME && err.errnum == EINVAL)
            rb_err_set(&err, RB_ERR_RUNTIME, EINVAL, "%s", not_enabled);
        return rbpy_raise_err(&err);
    }
    PyObject *list = ruh_list(v, n);
    free(v);
    return list;
}

static PyObject *device_fetch_fdp_status(PyObject *op, PyObject *unused)
{
    (void)unused;
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    if (rbpy_device_check_open(self) < 0)
        return NULL;
    return rbpy_fdp_status(self->dev, NULL);
}

static PyObject *device_get_closed(PyObject *op, void *closure)
{
    (void)closure;
    return PyBool_FromLong(rb_dev_closing(((RawBlockDeviceObject *)op)->dev));
}

static PyObject *device_get_engine(PyObject *op, void *closure)
{
    (void)closure;
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    return PyUnicode_FromString(self->use_iouring ? "io_uring" : "posix");
}

static PyObject *device_get_odirect(PyObject *op, void *closure)
{
    (void)closure;
    return PyBool_FromLong(rb_dev_odirect(((RawBlockDeviceObject *)op)->dev));
}

static PyObject *device_get_alignment(PyObject *op, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(rb_dev_alignment(((RawBlockDeviceObject *)op)->dev));
}

/* device_lock: the lock the device holds, by name (rb_dev_lock_name). */
static PyObject *device_get_lock(PyObject *op, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(rb_dev_lock_name(((RawBlockDeviceObject *)op)->dev));
}

#define FASTKW(fn) (PyCFunction)(void (*)(void))(fn), METH_FASTCALL | METH_KEYWORDS

/* _inject_nowait_miss(n): test hook, the next n no-wait attempts of small buffered transfers
 * give up as if they would block. */
static PyObject *dev_inject_nowait_miss(PyObject *op, PyObject *arg)
{
    RawBlockDeviceObject *self = (RawBlockDeviceObject *)op;
    static const rbpy_int_range range = {.name = "_inject_nowait_miss: n",
                                         .lo = 0,
                                         .hi = INT_MAX,
                                         .below = "must be in [0, 2147483647]",
                                         .above = "must be in [0, 2147483647]",
                                         .index_ok = 1};
    int64_t n;
    if (rbpy_bounded_i64(arg, &range, &n) < 0)
        return NULL;
    if (rbpy_device_check_open(self) < 0)
        return NULL;
    rb_dev_inject_nowait_miss(self->dev, (int)n);
    Py_RETURN_NONE;
}

static PyMethodDef device_methods[] = {
    {"size_bytes", device_size_bytes, METH_NOARGS,
     "size_bytes($self, /)\n--\n\nDevice or file size in bytes (cached at open)."},
    {"pwrite_from_buffer", FASTKW(device_pwrite_from_buffer),
     "pwrite_from_buffer($self, offset, data, payload_len=None, total_len=None)\n--\n\n"
     "Write payload_len bytes of data at offset, then zeros up to total_len."},
    {"pread_into", FASTKW(device_pread_into),
     "pread_into($self, offset, out, payload_len, total_len=None)\n--\n\n"
     "Read total_len bytes at offset; the first payload_len land in out."},
    {"batched_write", FASTKW(rbpy_dev_batched_write),
     "batched_write($self, offsets, buffers, total_lens, placement_ids=None, payload_lens=None)\n--\n\n"
     "Queue writes on the io_uring worker; returns a batch id for wait_iouring()."},
    {"batched_read", FASTKW(rbpy_dev_batched_read),
     "batched_read($self, offsets, buffers, total_lens)\n--\n\n"
     "Queue reads on the io_uring worker; returns a batch id for wait_iouring()."},
    {"wait_iouring", FASTKW(rbpy_dev_wait_iouring),
     "wait_iouring($self, batch_id)\n--\n\n"
     "Wait for a batch; returns (per-entry success list, [(index, message), ...])."},
    {"read_uring", FASTKW(rbpy_dev_read_uring),
     "read_uring($self, offset, data, payload_len, total_len=None)\n--\n\nDeprecated single read."},
    {"write_uring", FASTKW(rbpy_dev_write_uring),
     "write_uring($self, offset, data, payload_len, total_len=None, placement_id=None)\n--\n\nSingle write."},
    {"register_fixed_buffers", FASTKW(rbpy_dev_register_fixed_buffers),
     "register_fixed_buffers($self, buffer_ptrs, buffer_sizes)\n--\n\nRegister io_uring fixed buffers."},
    {"worker_error", rbpy_dev_worker_error, METH_NOARGS,
     "worker_error($self, /)\n--\n\nTerminal io_uring worker error, or None."},
    {"_inject_engine_fault", rbpy_dev_inject_engine_fault, METH_O,
     "_inject_engine_fault($self, kinds, /)\n--\n\n"
     "Test hook: 1 = the next kernel submission reports a hard failure after the kernel took the "
     "requests, 2 = the worker's next reap fails"},
    {"_inject_nowait_miss", dev_inject_nowait_miss, METH_O,
     "_inject_nowait_miss($self, n, /)\n--\n\n"
     "Test hook: the next n no-wait attempts of small buffered transfers give up as if they "
     "would block"},
    {"fixed_buffer_status", rbpy_dev_fixed_buffer_status, METH_NOARGS,
     "fixed_buffer_status($self, /)\n--\n\n(registered, registered_bytes) of io_uring fixed buffers."},
    {"io_stats_snapshot", device_io_stats_snapshot, METH_NOARGS,
     "io_stats_snapshot($self, /)\n--\n\nLifetime I/O counters as a dict."},
    {"nvme_nsid", device_nvme_nsid, METH_NOARGS, "nvme_nsid($self, /)\n--\n\nNVMe namespace id (use_uring_cmd only)."},
    {"nvme_lba_shift", device_nvme_lba_shift, METH_NOARGS,
     "nvme_lba_shift($self, /)\n--\n\nlog2 of the LBA size (use_uring_cmd only)."},
    {"nvme_lba_size", device_nvme_lba_size, METH_NOARGS,
     "nvme_lba_size($self, /)\n--\n\nLBA size in bytes (use_uring_cmd only)."},
    {"write_streams", device_write_streams, METH_NOARGS,
     "write_streams($self, /)\n--\n\n"
     "Write streams that place writes on FDP handles through the block device (Linux >= 6.16, O_DIRECT, "
     "io_uring); 0 when there are none."},
    {"max_data_transfer_size", device_max_data_transfer_size, METH_NOARGS,
     "max_data_transfer_size($self, /)\n--\n\n"
     "Bytes per NVMe command; longer transfers are split (use_uring_cmd only)."},
    {"fetch_fdp_status", device_fetch_fdp_status, METH_NOARGS,
     "fetch_fdp_status($self, /)\n--\n\n"
     "FDP reclaim unit handle status as [(placement_id, ruh_id)] (use_uring_cmd only)."},
    {"close", device_close, METH_NOARGS, "close($self, /)\n--\n\nStop the engine and close the device. Idempotent."},
    {"__enter__", device_enter, METH_NOARGS, "__enter__($self, /)\n--\n\nThe device itself."},
    {"__exit__", device_exit, METH_VARARGS,
     "__exit__($self, *exc_info)\n--\n\nclose() the device; an exception in the with block propagates."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef device_getset[] = {
    {"closed", device_get_closed, NULL, "True once close() has begun.", NULL},
    {"io_engine", device_get_engine, NULL, "\"posix\" or \"io_uring\".", NULL},
    {"use_odirect", device_get_odirect, NULL, "True when the device was opened with O_DIRECT.", NULL},
    {"alignment", device_get_alignment, NULL, "O_DIRECT alignment in bytes.", NULL},
    {"device_lock", device_get_lock, NULL,
     "The lock held on the device: \"none\" (lock='none' or 'check'), \"shared\", \"exclusive\", "
     "\"unsupported\" (the file system has no flock; opened unlocked), \"released\" after close() (and in "
     "a child forked from the opener, which holds none of its locks).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef device_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(RawBlockDeviceObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot device_slots[] = {
    {Py_tp_new, device_new},
    {Py_tp_dealloc, device_dealloc},
    {Py_tp_methods, device_methods},
    {Py_tp_getset, device_getset},
    {Py_tp_members, device_members},
    {Py_tp_doc,
     "RawBlockDevice(path, writable, use_odirect=False, use_iouring=False, use_uring_cmd=False, "
     "alignment=4096, io_engine=None, iouring_queue_depth=256, max_data_transfer_size=None, *, lock=None)\n--\n\n"
     "A raw block device or pre-sized file, drop-in for lmcache_rust_raw_block_io.RawBlockDevice.\n\n"
     "lock (ours, keyword-only): None or 'check' refuses (OSError EBUSY) a device another process's\n"
     "raw-block writer holds and holds no lock; 'shared' holds flock LOCK_SH (readers); 'exclusive'\n"
     "holds LOCK_EX, plus O_EXCL on a block device (writers outside a core); 'none' neither."},
    {0, NULL},
};

PyType_Spec rbpy_device_spec = {
    .name = "lmcache_rawblock._native.RawBlockDevice",
    .basicsize = sizeof(RawBlockDeviceObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = device_slots,
};
