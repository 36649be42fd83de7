/*
 * core.c - the _native.Core heap type: a thin binding over csrc/core/rb_core.h. Converts
 * arguments to plain C arrays (keys as UTF-8, buffers as Py_buffer), releases the GIL
 * around every call into the core that does I/O or O(N) work, and builds the results.
 * The Python facade lmcache_rawblock.raw_block.core.RawBlockCore gives it LMCache's API.
 */
#include "rbpy.h"

#include <errno.h>
#include <string.h>
#include <structmember.h>

#include "../core/rb_core.h"
#include "../core/rb_core_ident.h"
#include "../core/rb_core_int.h" /* c->dev: the engine state below */
#include "../core/rb_uring.h"

/*
 * put_many's names of a (dtype, fmt) pair, kept by the identities of the two objects: the
 * strings the namer returned for them (LMCache's short dtype name, the format's name, or None)
 * and their UTF-8. Entries are only added (the core reads the strings without the GIL while
 * another thread may convert), each holding its four objects; the pairs of one process are a
 * handful.
 */
#define RBPY_META_NAMES 16
typedef struct {
    PyObject *dtype, *fmt;   /* the keys, compared by identity */
    PyObject *dname, *fname; /* str or None */
    const char *ds, *fs;
    size_t dl, fl;
} meta_names;

typedef struct {
    PyObject_HEAD rb_core *core;
    int closed;
    PyObject *close_result; /* dict returned by the first close() */
    PyObject *weakreflist;
    PyObject *namer; /* the namer the entries of names came from (the first one passed) */
    int n_names;
    meta_names names[RBPY_META_NAMES];
    /* _set_metadata_shortcut: instances of exactly meta_type have their metadata read as the
     * attribute meta_attr while the class's metadata is still meta_descr (see metadata_of). */
    PyObject *meta_type, *meta_descr, *meta_attr;
} CoreObject;

/* Above this many keys exists_many/unlock_many/delete_many release the GIL. */
#define RBPY_NOGIL_KEYS 64

/* ---- argument helpers ------------------------------------------------------------------ */

typedef struct {
    PyObject *tuple; /* owns the key objects (the list or tuple itself when one was passed) */
    const char **keys;
    size_t *lens; /* inside the keys allocation */
    Py_ssize_t n;
} keyvec;

static void keyvec_free(keyvec *kv)
{
    PyMem_Free(kv->keys);
    Py_XDECREF(kv->tuple);
    memset(kv, 0, sizeof(*kv));
}

/* The keys are snapshotted into a tuple (the C side may run without the GIL while another
 * thread mutates the caller's list); ASCII str keys are used in place, without the UTF-8 call. */
static int keyvec_from(PyObject *seq, keyvec *kv)
{
    memset(kv, 0, sizeof(*kv));
    kv->tuple = PySequence_Tuple(seq);
    if (!kv->tuple)
        return -1;
    kv->n = PyTuple_GET_SIZE(kv->tuple);
    size_t n = kv->n ? (size_t)kv->n : 1;
    kv->keys = PyMem_Malloc(n * (sizeof(char *) + sizeof(size_t)));
    if (!kv->keys) {
        keyvec_free(kv);
        PyErr_NoMemory();
        return -1;
    }
    kv->lens = (size_t *)(kv->keys + n);
    PyObject **items = &PyTuple_GET_ITEM(kv->tuple, 0);
    for (Py_ssize_t i = 0; i < kv->n; i++) {
        PyObject *k = items[i];
        if (!PyUnicode_Check(k)) {
            PyErr_Format(PyExc_TypeError, "encoded keys must be str, got %.100s", Py_TYPE(k)->tp_name);
            keyvec_free(kv);
            return -1;
        }
        if (PyUnicode_IS_COMPACT_ASCII(k)) {
            kv->keys[i] = (const char *)PyUnicode_DATA(k);
            kv->lens[i] = (size_t)PyUnicode_GET_LENGTH(k);
            continue;
        }
        Py_ssize_t l;
        kv->keys[i] = PyUnicode_AsUTF8AndSize(k, &l);
        if (!kv->keys[i]) {
            keyvec_free(kv);
            return -1;
        }
        kv->lens[i] = (size_t)l;
    }
    return 0;
}

/* ---- payload buffers ------------------------------------------------------------------- */

/*
 * One payload of put_many / load_many_into: an object with the buffer protocol; a MemoryObj
 * of the class the facade registered (LMCache's TensorMemoryObj): the get_size() bytes at
 * raw_data.data_ptr() (inside the tensor's storage), which is exactly what its byte_array
 * exposes, without building that ctypes memoryview (about 3 us per object, as much as the
 * whole native load of a 64 KiB payload); or any other object with a byte_array.
 */
typedef struct {
    void *buf;
    size_t len;
    Py_buffer view; /* view.obj set: a buffer-protocol view to release */
    PyObject *keep; /* registered MemoryObj: the tensor owning buf, held for the call */
} payload;

/* The registered class, if its byte_array is still the one registered (checked per call). */
static PyTypeObject *memobj_fast_type(rbpy_state *st)
{
    if (!st || !st->memobj_type)
        return NULL;
    PyObject *d = PyObject_GetAttr(st->memobj_type, st->names[RBPY_NAME_BYTE_ARRAY]);
    if (!d) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(d); /* only compared: the class keeps its attribute alive */
    return d == st->memobj_descr ? (PyTypeObject *)st->memobj_type : NULL;
}

/* o.<name>, or o.<name>() when call (name: RBPY_NAME_*). */
static PyObject *attr_value(rbpy_state *st, PyObject *o, int name, int call)
{
    return call ? PyObject_CallMethodNoArgs(o, st->names[name]) : PyObject_GetAttr(o, st->names[name]);
}

static int attr_true(rbpy_state *st, PyObject *o, int name, int call)
{
    PyObject *v = attr_value(st, o, name, call);
    if (!v)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static int attr_u64(rbpy_state *st, PyObject *o, int name, int call, unsigned long long *out)
{
    PyObject *v = attr_value(st, o, name, call);
    if (!v)
        return -1;
    *out = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    return *out == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 0;
}

/* (result of t.<meth>()) as an unsigned 64-bit integer; -1 with an exception on failure. */
static int call_u64(PyObject *t, const char *meth, unsigned long long *out)
{
    PyObject *v = PyObject_CallMethod(t, meth, NULL);
    if (!v)
        return -1;
    *out = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    return *out == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 0;
}

/*
 * get_size() is larger than raw_data's own view. LMCache's allocators hand such objects out:
 * a page of the paged allocator (io_uring) narrowed to a partial chunk keeps get_size() at
 * the whole page, and byte_array exposes that page. Those bytes are LMCache's payload, so they
 * are used as long as they lie inside the memory the tensor's storage owns (the allocator's
 * buffer); anything reaching past it is refused. Only partial chunks take this path.
 */
static int memobj_check_storage(PyObject *raw, Py_ssize_t i, unsigned long long ptr, unsigned long long size,
                                unsigned long long nbytes)
{
    unsigned long long sptr = 0, snbytes = 0;
    PyObject *storage = PyObject_CallMethod(raw, "untyped_storage", NULL);
    if (!storage) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear(); /* no storage to check against: only raw_data's own bytes are known */
        PyErr_Format(PyExc_ValueError, "payload %zd: get_size() = %llu exceeds raw_data's %llu bytes", i, size, nbytes);
        return -1;
    }
    int rc = call_u64(storage, "data_ptr", &sptr);
    if (rc == 0)
        rc = call_u64(storage, "nbytes", &snbytes);
    Py_DECREF(storage);
    if (rc < 0)
        return -1;
    if (ptr < sptr || ptr - sptr > snbytes || size > snbytes - (ptr - sptr)) {
        PyErr_Format(PyExc_ValueError,
                     "payload %zd: get_size() = %llu exceeds raw_data's %llu bytes and reaches past its storage "
                     "(%llu bytes, the view starting %lld bytes into it); byte_array would expose memory the "
                     "tensor does not own",
                     i, size, nbytes, snbytes, (long long)(ptr - sptr));
        return -1;
    }
    return 0;
}

static int memobj_payload(rbpy_state *st, PyObject *o, Py_ssize_t i, payload *p)
{
    PyObject *raw = PyObject_GetAttr(o, st->names[RBPY_NAME_RAW_DATA]);
    unsigned long long ptr, size, nbytes;
    int cpu, contig;
    if (!raw)
        return -1;
    if ((cpu = attr_true(st, raw, RBPY_NAME_IS_CPU, 0)) < 0 ||
        (contig = attr_true(st, raw, RBPY_NAME_IS_CONTIGUOUS, 1)) < 0)
        goto fail;
    if (!cpu || !contig) {
        PyErr_Format(PyExc_ValueError, "payload %zd: raw_data must be a contiguous tensor in host memory", i);
        goto fail;
    }
    if (attr_u64(st, raw, RBPY_NAME_NBYTES, 0, &nbytes) < 0 || attr_u64(st, raw, RBPY_NAME_DATA_PTR, 1, &ptr) < 0 ||
        attr_u64(st, o, RBPY_NAME_GET_SIZE, 1, &size) < 0)
        goto fail;
    if (size > nbytes && memobj_check_storage(raw, i, ptr, size, nbytes) < 0)
        goto fail;
    if (size && !ptr) {
        PyErr_Format(PyExc_ValueError, "payload %zd: raw_data has a null data pointer", i);
        goto fail;
    }
    p->buf = (void *)(uintptr_t)ptr;
    p->len = (size_t)size;
    p->keep = raw;
    return 0;
fail:
    Py_DECREF(raw);
    return -1;
}

static int payload_get(rbpy_state *st, PyTypeObject *fast, PyObject *o, Py_ssize_t i, int writable, payload *p)
{
    memset(p, 0, sizeof(*p));
    if (fast && Py_IS_TYPE(o, fast))
        return memobj_payload(st, o, i, p);
    int flags = writable ? PyBUF_WRITABLE : PyBUF_SIMPLE;
    if (PyObject_CheckBuffer(o)) {
        if (PyObject_GetBuffer(o, &p->view, flags) < 0)
            return -1;
    } else {
        PyObject *ba = PyObject_GetAttr(o, st->names[RBPY_NAME_BYTE_ARRAY]);
        if (!ba) {
            if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "payload %zd: %.100s has neither the buffer protocol nor byte_array", i,
                             Py_TYPE(o)->tp_name);
            }
            return -1;
        }
        int rc = PyObject_GetBuffer(ba, &p->view, flags);
        Py_DECREF(ba); /* the view holds what it needs */
        if (rc < 0)
            return -1;
    }
    p->buf = p->view.buf;
    p->len = (size_t)p->view.len;
    return 0;
}

static void payload_release(payload *p)
{
    if (p->view.obj)
        PyBuffer_Release(&p->view);
    Py_CLEAR(p->keep);
}

static PyObject *bool_list(const uint8_t *r, Py_ssize_t n)
{
    PyObject *l = PyList_New(n);
    if (!l)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(l, i, Py_NewRef(r[i] ? Py_True : Py_False));
    return l;
}

static PyObject *i64_list(const int64_t *v, int64_t n)
{
    if (n < 0)
        Py_RETURN_NONE;
    PyObject *l = PyList_New((Py_ssize_t)n);
    if (!l)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, x);
    }
    return l;
}

/* None or a sequence of ints -> int64 array: inl when it has room for them (cap entries), else
 * a PyMem array; *n = -1 for None. */
static int i64_array(PyObject *o, const char *what, int64_t *inl, Py_ssize_t cap, int64_t **out, int64_t *n)
{
    *out = NULL;
    *n = -1;
    if (!o || o == Py_None)
        return 0;
    PyObject *t = PySequence_Fast(o, what);
    if (!t)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(t);
    int64_t *v = inl && len <= cap ? inl : PyMem_Malloc((len ? len : 1) * sizeof(int64_t));
    if (!v) {
        Py_DECREF(t);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(t, i));
        if (x == -1 && PyErr_Occurred()) {
            if (v != inl)
                PyMem_Free(v);
            Py_DECREF(t);
            return -1;
        }
        v[i] = x;
    }
    Py_DECREF(t);
    *out = v;
    *n = len;
    return 0;
}

static const char *opt_str(PyObject *o, size_t *len)
{
    if (!o || o == Py_None) {
        *len = 0;
        return NULL;
    }
    Py_ssize_t l;
    const char *s = PyUnicode_AsUTF8AndSize(o, &l);
    *len = (size_t)l;
    return s;
}

/* The exception object an rb_err describes (not raised), or NULL with an error set. */
static PyObject *err_object(const rb_err *err)
{
    PyObject *type, *value, *tb;
    rbpy_raise_err(err);
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && tb)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

static rb_core *core_of(PyObject *op)
{
    return ((CoreObject *)op)->core;
}

rb_core *rbpy_core_ptr(PyObject *op)
{
    return core_of(op);
}

/* ---- constructor / lifetime ------------------------------------------------------------ */

/* Core(**settings): keyword-only, one keyword per entry of the settings table (rb_config.c). */
static PyObject *core_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    rb_core_cfg cfg;
    PyObject *path = NULL;
    if (rbpy_core_cfg_from_kwargs("Core", args, kwds, &cfg, &path) < 0) {
        Py_XDECREF(path);
        return NULL;
    }
    rb_core *core = NULL;
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = rb_core_open(&cfg, &core, &err);
    Py_END_ALLOW_THREADS if (rc < 0)
    {
        rbpy_raise_err_path(&err, path);
        Py_DECREF(path);
        return NULL;
    }
    Py_DECREF(path);
    CoreObject *self = (CoreObject *)type->tp_alloc(type, 0);
    if (!self) {
        rb_close_result res;
        Py_BEGIN_ALLOW_THREADS rb_core_close(core, &res);
        rb_core_free(core);
        Py_END_ALLOW_THREADS return NULL;
    }
    self->core = core;
    return (PyObject *)self;
}

static PyObject *do_close(CoreObject *self)
{
    rb_close_result res;
    Py_BEGIN_ALLOW_THREADS rb_core_close(self->core, &res);
    Py_END_ALLOW_THREADS self->closed = 1;
    if (res.repeat) {
        PyObject *d = self->close_result ? PyDict_Copy(self->close_result) : PyDict_New();
        if (d && PyDict_SetItemString(d, "repeat", Py_True) < 0)
            Py_CLEAR(d);
        return d;
    }
    PyObject *d = Py_BuildValue("{s:O,s:O,s:z,s:z}", "repeat", Py_False, "final_checkpoint_written",
                                res.final_written ? Py_True : Py_False, "checkpoint_error",
                                res.ckpt_failed ? res.ckpt_err.msg : NULL, "device_close_error",
                                res.dev_close_failed ? res.dev_err.msg : NULL);
    if (d && !self->close_result)
        self->close_result = Py_NewRef(d);
    return d;
}

/* Drop put_many's cached metadata names and the metadata shortcut (dealloc, or the collector
 * breaking a cycle through the namer: no call of this core is running then). */
static void core_clear_names(CoreObject *self)
{
    int n = self->n_names;
    self->n_names = 0;
    for (int j = 0; j < n; j++) {
        meta_names *e = &self->names[j];
        Py_CLEAR(e->dtype);
        Py_CLEAR(e->fmt);
        Py_CLEAR(e->dname);
        Py_CLEAR(e->fname);
    }
    Py_CLEAR(self->namer);
    Py_CLEAR(self->meta_type);
    Py_CLEAR(self->meta_descr);
    Py_CLEAR(self->meta_attr);
}

static void core_dealloc(PyObject *op)
{
    CoreObject *self = (CoreObject *)op;
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    if (self->weakreflist)
        PyObject_ClearWeakRefs(op);
    if (self->core) {
        rb_core *core = self->core;
        self->core = NULL;
        rb_close_result res;
        Py_BEGIN_ALLOW_THREADS rb_core_close(core, &res);
        rb_core_free(core);
        Py_END_ALLOW_THREADS
    }
    Py_CLEAR(self->close_result);
    core_clear_names(self);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static int core_traverse(PyObject *op, visitproc visit, void *arg)
{
    CoreObject *self = (CoreObject *)op;
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->close_result);
    Py_VISIT(self->namer);
    Py_VISIT(self->meta_type);
    Py_VISIT(self->meta_descr);
    Py_VISIT(self->meta_attr);
    for (int j = 0; j < self->n_names; j++) {
        Py_VISIT(self->names[j].dtype);
        Py_VISIT(self->names[j].fmt);
        Py_VISIT(self->names[j].dname);
        Py_VISIT(self->names[j].fname);
    }
    return 0;
}

static int core_tp_clear(PyObject *op)
{
    core_clear_names((CoreObject *)op);
    return 0;
}

static PyObject *core_close(PyObject *op, PyObject *unused)
{
    (void)unused;
    return do_close((CoreObject *)op);
}

/* ---- put / load ------------------------------------------------------------------------ */

/* Shapes of up to this many dimensions are kept in the call's own array instead of a PyMem
 * array per key (LMCache's have one to five). */
#define RBPY_INLINE_DIMS 8

/* One put_many call: its arguments as C arrays and everything it holds until it returns (the
 * key snapshot, the argument sequences, the payload views, the names of the metadata). Touched
 * only with the GIL held, except items (read) and results, stored, n_stored (written) by the
 * core without it. */
typedef struct {
    keyvec kv;
    PyObject *ids, *bufs, *pids, *metas; /* tuples (PySequence_Fast results, lists copied); metas
                                          * NULL when the payloads' own metadata is read */
    PyObject *namer;                     /* borrowed: the callable metas argument, or NULL */
    PyObject *holds;                     /* list: namer results not kept on the core, or NULL */
    Py_ssize_t n;                        /* keys */
    Py_ssize_t nviews;                   /* views[0..nviews) are held */
    rb_put_item *items;
    int64_t (*dims)[RBPY_INLINE_DIMS]; /* items[i].meta.dims is dims[i] for a short shape */
    payload *views;
    uint8_t *results;
    uint32_t *stored;
    size_t n_stored;
    rb_err fail; /* why the first key that failed did (kind RB_ERR_NONE: none did) */
} put_call;

/* GIL held: allocate the per-key arrays of pc (zeroed, but for dims). -1 with MemoryError on
 * failure. */
static int put_call_alloc(put_call *pc)
{
    Py_ssize_t n = pc->n;
    pc->items = PyMem_Calloc(n ? n : 1, sizeof(*pc->items));
    pc->dims = PyMem_Malloc((n ? n : 1) * sizeof(*pc->dims));
    pc->views = PyMem_Calloc(n ? n : 1, sizeof(*pc->views));
    pc->results = PyMem_Calloc(n ? n : 1, 1);
    pc->stored = PyMem_Calloc(n ? n : 1, sizeof(uint32_t));
    if (!pc->items || !pc->dims || !pc->views || !pc->results || !pc->stored) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* PySequence_Fast(o, what) as a tuple: a list is copied, so the items stay alive and in place
 * while conversions run Python code (which may change a caller's list) and while the core
 * reads borrowed data without the GIL. */
static PyObject *fast_tuple(PyObject *o, const char *what)
{
    PyObject *t = PySequence_Fast(o, what);
    if (t && PyList_Check(t))
        Py_SETREF(t, PyList_AsTuple(t));
    return t;
}

/* GIL held: take the per-key argument sequences (a[1..4]), check their lengths against the
 * keys already in pc->kv, and allocate the arrays. A callable a[4] is the namer of the
 * payloads' own metadata (put_meta_read). -1 with an exception set on failure. */
static int put_call_open(put_call *pc, PyObject *const *a)
{
    Py_ssize_t n = pc->n;
    pc->ids = fast_tuple(a[1], "identities must be a sequence");
    pc->bufs = pc->ids ? fast_tuple(a[2], "buffers must be a sequence") : NULL;
    pc->pids = pc->bufs ? fast_tuple(a[3], "placement_ids must be a sequence") : NULL;
    if (!pc->pids)
        return -1;
    if (PyCallable_Check(a[4]))
        pc->namer = a[4];
    else if (!(pc->metas = fast_tuple(a[4], "metas must be a sequence or a callable")))
        return -1;
    if (PyTuple_GET_SIZE(pc->ids) != n || PyTuple_GET_SIZE(pc->bufs) != n || PyTuple_GET_SIZE(pc->pids) != n ||
        (pc->metas && PyTuple_GET_SIZE(pc->metas) != n)) {
        PyErr_SetString(PyExc_ValueError, "put_many arguments must have equal lengths");
        return -1;
    }
    return put_call_alloc(pc);
}

/* GIL held: a placement id (None, or 1..65535) into it->pid; None leaves it 0. */
static int put_pid_from(PyObject *pid, rb_put_item *it)
{
    if (pid == Py_None)
        return 0;
    long v = PyLong_AsLong(pid);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 1 || v > 65535) {
        PyErr_SetString(PyExc_ValueError,
                        "placement_ids must contain placement identifiers in range 1..=65535 or None");
        return -1;
    }
    it->pid = (uint16_t)v;
    return 0;
}

/* GIL held: a (dtype, fmt, shape, cached_positions) tuple into it->meta. dtype and fmt are
 * borrowed from the tuple; shape goes to inl when it fits, else (and positions always) to PyMem
 * arrays that put_call_close frees. */
static int put_meta_from(PyObject *m, rb_put_item *it, int64_t *inl)
{
    if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 4) {
        PyErr_SetString(PyExc_TypeError, "metas items must be (dtype, fmt, shape, cached_positions) tuples");
        return -1;
    }
    it->meta.dtype = opt_str(PyTuple_GET_ITEM(m, 0), &it->meta.dtype_len);
    it->meta.fmt = opt_str(PyTuple_GET_ITEM(m, 1), &it->meta.fmt_len);
    if (PyErr_Occurred())
        return -1;
    int64_t *dims, *pos;
    if (i64_array(PyTuple_GET_ITEM(m, 2), "shape must be a sequence of ints", inl, RBPY_INLINE_DIMS, &dims,
                  &it->meta.ndim) < 0)
        return -1;
    it->meta.dims = dims;
    if (i64_array(PyTuple_GET_ITEM(m, 3), "cached_positions must be a sequence of ints", NULL, 0, &pos,
                  &it->meta.npos) < 0)
        return -1;
    it->meta.pos = pos;
    return 0;
}

/* ---- metadata read from the payload objects ---- */

#if PY_VERSION_HEX >= 0x030D0000
#define lookup_attr PyObject_GetOptionalAttr
#else
#define lookup_attr _PyObject_LookupAttr
#endif

/* getattr(o, name, None) as a new reference; NULL with an exception for any failure other
 * than a missing attribute. None has none of the names read here. */
static PyObject *attr_or_none(PyObject *o, PyObject *name)
{
    PyObject *v = NULL;
    if (o == Py_None)
        return Py_NewRef(Py_None);
    int rc = lookup_attr(o, name, &v);
    if (rc < 0)
        return NULL;
    return rc ? v : Py_NewRef(Py_None);
}

/* [int(x) for x in o] as int64: into inl while it has room (cap entries), else a PyMem array
 * (*out is inl or that array). -1 with an exception set (int()'s, the iteration's, or
 * OverflowError past 64 bits). */
static int i64_from_iter(PyObject *o, int64_t *inl, Py_ssize_t cap, int64_t **out, int64_t *n)
{
    PyObject *iter = PyObject_GetIter(o), *x;
    if (!iter)
        return -1;
    int64_t *v = inl;
    Py_ssize_t len = 0;
    while ((x = PyIter_Next(iter)) != NULL) {
        long long y;
        if (PyLong_CheckExact(x)) {
            y = PyLong_AsLongLong(x);
        } else {
            PyObject *l = PyNumber_Long(x);
            y = l ? PyLong_AsLongLong(l) : -1;
            Py_XDECREF(l);
        }
        Py_DECREF(x);
        if (y == -1 && PyErr_Occurred())
            goto fail;
        if (len == cap) {
            Py_ssize_t ncap = cap < 8 ? 16 : cap * 2;
            int64_t *nv =
                ncap <= PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(int64_t) ? PyMem_Malloc(ncap * sizeof(int64_t)) : NULL;
            if (!nv) {
                PyErr_NoMemory();
                goto fail;
            }
            if (len)
                memcpy(nv, v, len * sizeof(int64_t));
            if (v != inl)
                PyMem_Free(v);
            v = nv;
            cap = ncap;
        }
        v[len++] = y;
    }
    if (PyErr_Occurred())
        goto fail;
    if (!v && !(v = PyMem_Malloc(sizeof(int64_t)))) { /* none, and no inl: never a NULL array */
        PyErr_NoMemory();
        goto fail;
    }
    Py_DECREF(iter);
    *out = v;
    *n = len;
    return 0;
fail:
    if (v != inl)
        PyMem_Free(v);
    Py_DECREF(iter);
    return -1;
}

/* The class whose instances' metadata is read directly (metadata_of), if its metadata attribute
 * is still the property given to _set_metadata_shortcut (checked once per call); else NULL. */
static PyTypeObject *metadata_direct_type(rbpy_state *st, CoreObject *self)
{
    if (!self->meta_type)
        return NULL;
    PyObject *d = PyObject_GetAttr(self->meta_type, st->names[RBPY_NAME_METADATA]);
    if (!d) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(d); /* only compared: the class keeps its attribute alive */
    return d == self->meta_descr ? (PyTypeObject *)self->meta_type : NULL;
}

/* getattr(o, "metadata", None), or for an instance of exactly direct (metadata_direct_type) the
 * attribute that property returns, read without calling it (the property only takes the
 * object's lock around that read; the fields are read after it returns either way). A missing
 * attribute falls back to the property. New reference, NULL with an exception. */
static PyObject *metadata_of(rbpy_state *st, CoreObject *self, PyTypeObject *direct, PyObject *o)
{
    if (direct && Py_IS_TYPE(o, direct)) {
        PyObject *m = NULL;
        int rc = lookup_attr(o, self->meta_attr, &m);
        if (rc != 0)
            return rc > 0 ? m : NULL;
    }
    return attr_or_none(o, st->names[RBPY_NAME_METADATA]);
}

/* GIL held: the checkpoint names of (dtype, fmt) into mi: from the core's entries when the pair
 * is there (by identity), else namer(dtype, fmt) -> (dtype name, format name, cacheable), kept
 * on the core when cacheable and there is room, else held by the call. */
static int meta_names_of(CoreObject *self, put_call *pc, PyObject *dtype, PyObject *fmt, rb_meta_in *mi)
{
    if (pc->namer == self->namer) {
        for (int j = 0; j < self->n_names; j++) {
            const meta_names *e = &self->names[j];
            if (e->dtype == dtype && e->fmt == fmt) {
                mi->dtype = e->ds;
                mi->dtype_len = e->dl;
                mi->fmt = e->fs;
                mi->fmt_len = e->fl;
                return 0;
            }
        }
    }
    PyObject *r = PyObject_CallFunctionObjArgs(pc->namer, dtype, fmt, NULL);
    if (!r)
        return -1;
    int cache = -1;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 3) {
        PyErr_SetString(PyExc_TypeError, "the metas namer must return (dtype name, format name, cacheable)");
        goto done;
    }
    PyObject *dn = PyTuple_GET_ITEM(r, 0), *fn = PyTuple_GET_ITEM(r, 1);
    mi->dtype = opt_str(dn, &mi->dtype_len);
    mi->fmt = mi->dtype || dn == Py_None ? opt_str(fn, &mi->fmt_len) : NULL;
    if (PyErr_Occurred() || (cache = PyObject_IsTrue(PyTuple_GET_ITEM(r, 2))) < 0)
        goto done;
    /* The namer ran Python code: another thread may have added entries meanwhile. */
    if (cache && self->n_names < RBPY_META_NAMES && (!self->namer || self->namer == pc->namer)) {
        if (!self->namer)
            self->namer = Py_NewRef(pc->namer);
        meta_names *e = &self->names[self->n_names++];
        e->dtype = Py_NewRef(dtype);
        e->fmt = Py_NewRef(fmt);
        e->dname = Py_NewRef(dn);
        e->fname = Py_NewRef(fn);
        e->ds = mi->dtype;
        e->dl = mi->dtype_len;
        e->fs = mi->fmt;
        e->fl = mi->fmt_len;
    } else if ((!pc->holds && !(pc->holds = PyList_New(0))) || PyList_Append(pc->holds, r) < 0) {
        cache = -1;
    }
done:
    Py_DECREF(r);
    return cache < 0 ? -1 : 0;
}

/*
 * GIL held: key i's metadata from its payload object, as the facade's _meta_of read it:
 * m = getattr(obj, "metadata", None); the names of (getattr(m, "dtype", None), getattr(m,
 * "fmt", None)); shape = getattr(m, "shape", None) as ints (int() of each dimension; up to
 * RBPY_INLINE_DIMS of them in the call's array); cached_positions through tolist() when it has
 * one, then int() of each. The payloads' metadata is read for every key before any payload.
 */
static int put_meta_read(rbpy_state *st, CoreObject *self, PyTypeObject *direct, put_call *pc, Py_ssize_t i)
{
    rb_put_item *it = &pc->items[i];
    PyObject *const *names = st->names;
    PyObject *dtype = NULL, *fmt = NULL, *shape = NULL, *pos = NULL;
    int rc = -1;
    it->meta.ndim = it->meta.npos = -1;
    PyObject *m = metadata_of(st, self, direct, PyTuple_GET_ITEM(pc->bufs, i));
    if (!m || !(dtype = attr_or_none(m, names[RBPY_NAME_DTYPE])) || !(fmt = attr_or_none(m, names[RBPY_NAME_FMT])))
        goto done;
    if (meta_names_of(self, pc, dtype, fmt, &it->meta) < 0 || !(shape = attr_or_none(m, names[RBPY_NAME_SHAPE])))
        goto done;
    if (shape != Py_None) {
        int64_t *dims;
        if (i64_from_iter(shape, pc->dims[i], RBPY_INLINE_DIMS, &dims, &it->meta.ndim) < 0)
            goto done;
        it->meta.dims = dims;
    }
    if (!(pos = attr_or_none(m, names[RBPY_NAME_CACHED_POSITIONS])))
        goto done;
    if (pos != Py_None) {
        PyObject *tolist = attr_or_none(pos, names[RBPY_NAME_TOLIST]);
        if (!tolist)
            goto done;
        if (tolist != Py_None) {
            Py_SETREF(pos, PyObject_CallNoArgs(tolist));
            Py_DECREF(tolist);
            if (!pos)
                goto done;
        } else {
            Py_DECREF(tolist);
        }
        int64_t *p;
        if (i64_from_iter(pos, NULL, 0, &p, &it->meta.npos) < 0)
            goto done;
        it->meta.pos = p;
    }
    rc = 0;
done:
    Py_XDECREF(m);
    Py_XDECREF(dtype);
    Py_XDECREF(fmt);
    Py_XDECREF(shape);
    Py_XDECREF(pos);
    return rc;
}

/* GIL held: every key's identity, placement id, meta and payload view into pc->items (the
 * views taken are counted in pc->nviews). -1 with an exception set on the first failure. */
static int put_items_from(PyObject *op, put_call *pc)
{
    rbpy_state *st = rbpy_state_of_type(Py_TYPE(op));
    PyTypeObject *fast = memobj_fast_type(st);
    const Py_ssize_t n = pc->n;
    const char **keys = pc->kv.keys;
    const size_t *lens = pc->kv.lens;
    PyObject *ids = pc->ids, *pids = pc->pids, *metas = pc->metas, *bufs = pc->bufs;
    rb_put_item *items = pc->items;
    payload *views = pc->views;
    if (!metas) {
        CoreObject *self = (CoreObject *)op;
        PyTypeObject *direct = metadata_direct_type(st, self);
        for (Py_ssize_t i = 0; i < n; i++)
            if (put_meta_read(st, self, direct, pc, i) < 0)
                return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        rb_put_item *it = &items[i];
        it->key = keys[i];
        it->key_len = lens[i];
        if (rbpy_as_u64(PyTuple_GET_ITEM(ids, i), "slot_identity", &it->identity) < 0)
            return -1;
        if (put_pid_from(PyTuple_GET_ITEM(pids, i), it) < 0)
            return -1;
        if (metas) {
            it->meta.ndim = it->meta.npos = -1;
            if (put_meta_from(PyTuple_GET_ITEM(metas, i), it, pc->dims[i]) < 0)
                return -1;
        }
        if (payload_get(st, fast, PyTuple_GET_ITEM(bufs, i), i, 0, &views[i]) < 0)
            return -1;
        pc->nviews = i + 1;
        it->buf = views[i].buf;
        it->len = views[i].len;
    }
    return 0;
}

/* Called with the GIL, which it releases around rb_core_put_many: store pc->items, filling
 * pc->results, pc->stored and pc->n_stored. -1 with the core's error raised on failure. */
static int put_call_run(PyObject *op, put_call *pc)
{
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = rb_core_put_many(core_of(op), pc->items, (size_t)pc->n, pc->results, pc->stored,
                                                 &pc->n_stored, &pc->fail, &err);
    Py_END_ALLOW_THREADS if (rc < 0)
    {
        rbpy_raise_err(&err);
        return -1;
    }
    return 0;
}

/* GIL held: (results as bools, indexes of the keys stored, the first failure as an exception
 * instance or None), or NULL with an exception set. */
static PyObject *put_call_result(const put_call *pc)
{
    PyObject *ret = NULL;
    PyObject *rl = bool_list(pc->results, pc->n);
    PyObject *sl = rl ? PyList_New((Py_ssize_t)pc->n_stored) : NULL;
    for (size_t i = 0; sl && i < pc->n_stored; i++) {
        PyObject *x = PyLong_FromUnsignedLong(pc->stored[i]);
        if (!x)
            Py_CLEAR(sl); /* a list with NULL items is never handed out */
        else
            PyList_SET_ITEM(sl, (Py_ssize_t)i, x);
    }
    PyObject *fl = NULL;
    if (rl && sl)
        fl = pc->fail.kind == RB_ERR_NONE ? Py_NewRef(Py_None) : rbpy_err_object(&pc->fail);
    if (fl)
        ret = PyTuple_Pack(3, rl, sl, fl);
    Py_XDECREF(rl);
    Py_XDECREF(sl);
    Py_XDECREF(fl);
    return ret;
}

/* GIL held: release everything the call holds, whichever stage it reached. */
static void put_call_close(put_call *pc)
{
    rb_put_item *items = pc->items;
    payload *views = pc->views;
    const Py_ssize_t n = pc->n, nviews = pc->nviews;
    if (items) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!pc->dims || items[i].meta.dims != pc->dims[i])
                PyMem_Free((void *)items[i].meta.dims);
            PyMem_Free((void *)items[i].meta.pos);
        }
    }
    for (Py_ssize_t i = 0; i < nviews; i++)
        payload_release(&views[i]);
    PyMem_Free(pc->items);
    PyMem_Free(pc->dims);
    PyMem_Free(pc->views);
    PyMem_Free(pc->results);
    PyMem_Free(pc->stored);
    Py_XDECREF(pc->ids);
    Py_XDECREF(pc->bufs);
    Py_XDECREF(pc->pids);
    Py_XDECREF(pc->metas);
    Py_XDECREF(pc->holds);
    keyvec_free(&pc->kv);
}

/* Stages: snapshot the keys, take and check the arguments, convert each key, run the core
 * without the GIL, build the result; put_call_close releases whatever the stages took. */
static PyObject *core_put_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"keys", "identities", "buffers", "placement_ids", "metas"};
    PyObject *a[5];
    if (rbpy_unpack("put_many", names, 5, 5, args, nargs, kwnames, a) < 0)
        return NULL;
    put_call pc;
    memset(&pc, 0, sizeof(pc));
    if (keyvec_from(a[0], &pc.kv) < 0)
        return NULL;
    pc.n = pc.kv.n;
    PyObject *ret = NULL;
    if (put_call_open(&pc, a) == 0 && put_items_from(op, &pc) == 0 && put_call_run(op, &pc) == 0)
        ret = put_call_result(&pc);
    put_call_close(&pc);
    return ret;
}

/*
 * GIL held, after the reads: obj.metadata.cached_positions = the key's stored positions for
 * every key that loaded and whose object has metadata (getattr(obj, "metadata", None) not
 * None): None as it is, a list of ints through conv (the facade's positions_from_list). -1
 * with an exception set on the first failure.
 */
static int load_set_positions(rbpy_state *st, CoreObject *self, PyObject *bufs, const rb_load_item *items, Py_ssize_t n,
                              PyObject *conv)
{
    PyTypeObject *direct = metadata_direct_type(st, self);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!items[i].ok)
            continue;
        PyObject *m = metadata_of(st, self, direct, PyTuple_GET_ITEM(bufs, i));
        if (!m)
            return -1;
        if (m == Py_None) {
            Py_DECREF(m);
            continue;
        }
        PyObject *v = Py_NewRef(Py_None);
        if (items[i].npos >= 0) {
            PyObject *l = i64_list(items[i].pos, items[i].npos);
            Py_SETREF(v, l ? PyObject_CallOneArg(conv, l) : NULL);
            Py_XDECREF(l);
        }
        int rc = v ? PyObject_SetAttr(m, st->names[RBPY_NAME_CACHED_POSITIONS], v) : -1;
        Py_XDECREF(v);
        Py_DECREF(m);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* GIL held: the per-key errors (an exception object or None), or None when no key failed. */
static PyObject *load_errors(const rb_load_item *items, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && items[i].status >= 0)
        i++;
    if (i == n)
        return Py_NewRef(Py_None);
    PyObject *el = PyList_New(n);
    for (i = 0; el && i < n; i++) {
        PyObject *e = items[i].status < 0 ? err_object(&items[i].err) : Py_NewRef(Py_None);
        if (!e)
            Py_CLEAR(el);
        else
            PyList_SET_ITEM(el, i, e);
    }
    return el;
}

/* GIL held: load_many_into's result without a positions converter: (results, positions, errors)
 * with a list of each. */
static PyObject *load_result_lists(const rb_load_item *items, Py_ssize_t n)
{
    PyObject *ret = NULL;
    PyObject *rl = PyList_New(n), *pl = PyList_New(n), *el = PyList_New(n);
    for (Py_ssize_t i = 0; rl && pl && el && i < n; i++) {
        PyList_SET_ITEM(rl, i, Py_NewRef(items[i].ok ? Py_True : Py_False));
        PyObject *p = items[i].ok ? i64_list(items[i].pos, items[i].npos) : Py_NewRef(Py_None);
        PyObject *e = items[i].status < 0 ? err_object(&items[i].err) : Py_NewRef(Py_None);
        if (!p || !e) {
            Py_XDECREF(p);
            Py_XDECREF(e);
            Py_CLEAR(rl);
            break;
        }
        PyList_SET_ITEM(pl, i, p);
        PyList_SET_ITEM(el, i, e);
    }
    if (rl && pl && el)
        ret = PyTuple_Pack(3, rl, pl, el);
    Py_XDECREF(rl);
    Py_XDECREF(pl);
    Py_XDECREF(el);
    return ret;
}

/*
 * load_many_into(keys, buffers, set_positions=None). Without set_positions: (results,
 * positions, errors), a list each. With it (a callable taking a list of ints): each loaded
 * key's cached positions are set on its object's metadata here (load_set_positions), and the
 * result is (results, errors), errors None when no key failed.
 */
static PyObject *core_load_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"keys", "buffers", "set_positions"};
    PyObject *a[3];
    if (rbpy_unpack("load_many_into", names, 3, 2, args, nargs, kwnames, a) < 0)
        return NULL;
    PyObject *conv = a[2] && a[2] != Py_None ? a[2] : NULL;
    if (conv && !PyCallable_Check(conv)) {
        PyErr_SetString(PyExc_TypeError, "set_positions must be callable or None");
        return NULL;
    }
    keyvec kv;
    if (keyvec_from(a[0], &kv) < 0)
        return NULL;
    Py_ssize_t n = kv.n, nviews = 0;
    PyObject *bufs = fast_tuple(a[1], "buffers must be a sequence"), *ret = NULL;
    rb_load_item *items = NULL;
    payload *views = NULL;
    if (!bufs)
        goto done;
    if (PyTuple_GET_SIZE(bufs) != n) {
        PyErr_SetString(PyExc_ValueError, "keys and buffers must have equal lengths");
        goto done;
    }
    items = PyMem_Calloc(n ? n : 1, sizeof(*items));
    views = PyMem_Calloc(n ? n : 1, sizeof(*views));
    if (!items || !views) {
        PyErr_NoMemory();
        goto done;
    }
    rbpy_state *st = rbpy_state_of_type(Py_TYPE(op));
    PyTypeObject *fast = memobj_fast_type(st);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (payload_get(st, fast, PyTuple_GET_ITEM(bufs, i), i, 1, &views[i]) < 0)
            goto done;
        nviews = i + 1;
        items[i].key = kv.keys[i];
        items[i].key_len = kv.lens[i];
        items[i].buf = views[i].buf;
        items[i].buf_len = views[i].len;
    }
    {
        rb_err err;
        rb_err_clear(&err);
        int rc;
        Py_BEGIN_ALLOW_THREADS rc = rb_core_load_many(core_of(op), items, (size_t)n, &err);
        Py_END_ALLOW_THREADS if (rc < 0)
        {
            rbpy_raise_err(&err);
            goto done;
        }
    }
    if (!conv) {
        ret = load_result_lists(items, n);
    } else if (load_set_positions(st, (CoreObject *)op, bufs, items, n, conv) == 0) {
        PyObject *rl = PyList_New(n), *el = rl ? load_errors(items, n) : NULL;
        for (Py_ssize_t i = 0; el && i < n; i++)
            PyList_SET_ITEM(rl, i, Py_NewRef(items[i].ok ? Py_True : Py_False));
        if (el)
            ret = PyTuple_Pack(2, rl, el);
        Py_XDECREF(rl);
        Py_XDECREF(el);
    }
done:
    for (Py_ssize_t i = 0; items && i < n; i++)
        free(items[i].pos); /* the core's (NULL unless a key loaded with positions) */
    for (Py_ssize_t i = 0; i < nviews; i++)
        payload_release(&views[i]);
    PyMem_Free(items);
    PyMem_Free(views);
    Py_XDECREF(bufs);
    keyvec_free(&kv);
    return ret;
}

/* ---- index queries --------------------------------------------------------------------- */

/* exists_many(keys, lock=False) and delete_many(keys, force=False): a key list and one flag
 * in, one bool per key out; the GIL is released for more than RBPY_NOGIL_KEYS keys. */
typedef void (*keys_flag_fn)(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int flag,
                             uint8_t *results);

static PyObject *keys_flag_call(PyObject *op, const char *fname, const char *const names[2], keys_flag_fn fn,
                                PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    if (rbpy_unpack(fname, names, 2, 1, args, nargs, kwnames, a) < 0)
        return NULL;
    int flag = a[1] ? PyObject_IsTrue(a[1]) : 0;
    if (flag < 0)
        return NULL;
    keyvec kv;
    if (keyvec_from(a[0], &kv) < 0)
        return NULL;
    uint8_t *r = PyMem_Calloc(kv.n ? kv.n : 1, 1);
    PyObject *ret = NULL;
    if (!r) {
        PyErr_NoMemory();
    } else {
        if (kv.n > RBPY_NOGIL_KEYS) {
            Py_BEGIN_ALLOW_THREADS fn(core_of(op), kv.keys, kv.lens, (size_t)kv.n, flag, r);
            Py_END_ALLOW_THREADS
        } else {
            fn(core_of(op), kv.keys, kv.lens, (size_t)kv.n, flag, r);
        }
        ret = bool_list(r, kv.n);
    }
    PyMem_Free(r);
    keyvec_free(&kv);
    return ret;
}

static PyObject *core_exists_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"keys", "lock"};
    return keys_flag_call(op, "exists_many", names, rb_core_exists_many, args, nargs, kwnames);
}

static PyObject *core_delete_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"keys", "force"};
    PyObject *r = keys_flag_call(op, "delete_many", names, rb_core_delete_many, args, nargs, kwnames);
    /* Format v1 makes a slot no container lists reusable at its delete: deallocate it now. */
    rb_core *c = r ? core_of(op) : NULL;
    if (c && rb_core_dealloc_pending(c)) {
        Py_BEGIN_ALLOW_THREADS(void) rb_core_dealloc_run(c);
        Py_END_ALLOW_THREADS
    }
    return r;
}

static PyObject *core_unlock_many(PyObject *op, PyObject *keys)
{
    keyvec kv;
    if (keyvec_from(keys, &kv) < 0)
        return NULL;
    if (kv.n > RBPY_NOGIL_KEYS) {
        Py_BEGIN_ALLOW_THREADS rb_core_unlock_many(core_of(op), kv.keys, kv.lens, (size_t)kv.n);
        Py_END_ALLOW_THREADS
    } else {
        rb_core_unlock_many(core_of(op), kv.keys, kv.lens, (size_t)kv.n);
    }
    keyvec_free(&kv);
    Py_RETURN_NONE;
}

static PyObject *meta_tuple(const rb_meta_out *m)
{
    PyObject *shape;
    if (m->ndim < 0) {
        shape = Py_NewRef(Py_None);
    } else {
        shape = PyTuple_New((Py_ssize_t)m->ndim);
        for (int64_t i = 0; shape && i < m->ndim; i++) {
            PyObject *x = PyLong_FromLongLong(m->dims[i]);
            if (!x) {
                Py_CLEAR(shape);
                break;
            }
            PyTuple_SET_ITEM(shape, (Py_ssize_t)i, x);
        }
    }
    PyObject *pos = shape ? i64_list(m->pos, m->npos) : NULL;
    PyObject *t = NULL;
    if (shape && pos)
        t = Py_BuildValue("(KKOzzO)", (unsigned long long)m->offset, (unsigned long long)m->size, shape, m->dtype,
                          m->fmt, pos);
    Py_XDECREF(shape);
    Py_XDECREF(pos);
    return t;
}

static PyObject *meta_list(rb_meta_out *out, Py_ssize_t n, Py_ssize_t upto, int none_for_missing)
{
    PyObject *l = PyList_New(none_for_missing ? n : upto);
    for (Py_ssize_t i = 0; l && i < (none_for_missing ? n : upto); i++) {
        PyObject *t = out[i].found ? meta_tuple(&out[i]) : Py_NewRef(Py_None);
        if (!t) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, t);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        free(out[i].pos);
    return l;
}

static PyObject *core_get_metadata_many(PyObject *op, PyObject *keys)
{
    keyvec kv;
    if (keyvec_from(keys, &kv) < 0)
        return NULL;
    rb_meta_out *out = PyMem_Calloc(kv.n ? kv.n : 1, sizeof(*out));
    PyObject *ret = NULL;
    if (!out) {
        PyErr_NoMemory();
    } else {
        Py_BEGIN_ALLOW_THREADS rb_core_get_metadata_many(core_of(op), kv.keys, kv.lens, (size_t)kv.n, out);
        Py_END_ALLOW_THREADS ret = meta_list(out, kv.n, kv.n, 1);
    }
    PyMem_Free(out);
    keyvec_free(&kv);
    return ret;
}

static PyObject *core_get_metadata_prefix(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"keys", "lock", "skip"};
    PyObject *a[3];
    if (rbpy_unpack("get_metadata_prefix", names, 3, 1, args, nargs, kwnames, a) < 0)
        return NULL;
    int lock = a[1] ? PyObject_IsTrue(a[1]) : 0;
    if (lock < 0)
        return NULL;
    keyvec kv;
    if (keyvec_from(a[0], &kv) < 0)
        return NULL;
    PyObject *ret = NULL;
    rb_meta_out *out = PyMem_Calloc(kv.n ? kv.n : 1, sizeof(*out));
    uint8_t *skip = PyMem_Calloc(kv.n ? kv.n : 1, 1);
    if (!out || !skip) {
        PyErr_NoMemory();
        goto done;
    }
    if (a[2] && a[2] != Py_None) {
        for (Py_ssize_t i = 0; i < kv.n; i++) {
            int r = PySequence_Contains(a[2], PyTuple_GET_ITEM(kv.tuple, i));
            if (r < 0)
                goto done;
            skip[i] = (uint8_t)r;
        }
    }
    size_t m;
    Py_BEGIN_ALLOW_THREADS m =
        rb_core_get_metadata_prefix(core_of(op), kv.keys, kv.lens, (size_t)kv.n, lock, skip, out);
    Py_END_ALLOW_THREADS ret = meta_list(out, (Py_ssize_t)m, (Py_ssize_t)m, 0);
done:
    PyMem_Free(out);
    PyMem_Free(skip);
    keyvec_free(&kv);
    return ret;
}

static int one_key(PyObject *k, const char **s, size_t *len)
{
    if (!PyUnicode_Check(k)) {
        PyErr_Format(PyExc_TypeError, "encoded key must be str, got %.100s", Py_TYPE(k)->tp_name);
        return -1;
    }
    Py_ssize_t l;
    *s = PyUnicode_AsUTF8AndSize(k, &l);
    *len = (size_t)l;
    return *s ? 0 : -1;
}

static PyObject *core_exists_inflight(PyObject *op, PyObject *key)
{
    const char *s;
    size_t l;
    if (one_key(key, &s, &l) < 0)
        return NULL;
    return PyBool_FromLong(rb_core_exists_inflight(core_of(op), s, l));
}

static PyObject *core_entry_offset(PyObject *op, PyObject *key)
{
    const char *s;
    size_t l;
    if (one_key(key, &s, &l) < 0)
        return NULL;
    int64_t off = rb_core_entry_offset(core_of(op), s, l);
    if (off < 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(off);
}

static PyObject *core_lock_refcount(PyObject *op, PyObject *key)
{
    const char *s;
    size_t l;
    if (one_key(key, &s, &l) < 0)
        return NULL;
    return PyLong_FromUnsignedLong(rb_core_lock_refcount(core_of(op), s, l));
}

static PyObject *core_snapshot_keys(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"limit"};
    PyObject *a[1];
    if (rbpy_unpack("snapshot_keys", names, 1, 0, args, nargs, kwnames, a) < 0)
        return NULL;
    size_t limit = SIZE_MAX;
    int present;
    if (rbpy_as_opt_size(a[0], "limit", &limit, &present) < 0)
        return NULL;
    if (!present)
        limit = SIZE_MAX;
    char **keys = NULL;
    size_t *lens = NULL;
    int64_t n;
    Py_BEGIN_ALLOW_THREADS n = rb_core_snapshot_keys(core_of(op), limit, &keys, &lens);
    Py_END_ALLOW_THREADS if (n < 0) return PyErr_NoMemory();
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; i < n; i++) {
        if (l) {
            PyObject *s = PyUnicode_DecodeUTF8(keys[i], (Py_ssize_t)lens[i], "surrogatepass");
            if (!s)
                Py_CLEAR(l);
            else
                PyList_SET_ITEM(l, (Py_ssize_t)i, s);
        }
        free(keys[i]);
    }
    free(keys);
    free(lens);
    return l;
}

/* ---- checkpoint / state ---------------------------------------------------------------- */

static PyObject *core_checkpoint_now(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"force"};
    PyObject *a[1];
    if (rbpy_unpack("checkpoint_now", names, 1, 0, args, nargs, kwnames, a) < 0)
        return NULL;
    int force = a[0] ? PyObject_IsTrue(a[0]) : 1;
    if (force < 0)
        return NULL;
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = rb_core_checkpoint(core_of(op), force, &err);
    Py_END_ALLOW_THREADS if (rc < 0) return rbpy_raise_err(&err);
    return PyBool_FromLong(rc > 0);
}

static PyObject *core_compact_metadata(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = rb_core_compact(core_of(op), &err);
    Py_END_ALLOW_THREADS if (rc < 0) return rbpy_raise_err(&err);
    return PyBool_FromLong(rc > 0);
}

/* A hook that takes one truth value: fn(core, bool(arg)). */
static PyObject *set_flag(PyObject *op, PyObject *arg, void (*fn)(rb_core *, int))
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    fn(core_of(op), on);
    Py_RETURN_NONE;
}

static PyObject *core_set_dealloc_log(PyObject *op, PyObject *arg)
{
    return set_flag(op, arg, rb_core_dealloc_log_set);
}

static PyObject *core_take_dealloc_log(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    uint64_t *r = NULL;
    size_t n = rb_core_dealloc_log_take(core_of(op), &r);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)r[2 * i], (unsigned long long)r[2 * i + 1]);
        if (!t)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    free(r);
    return l;
}

static PyObject *apply_state_json(PyObject *op, PyObject *arg, int generic)
{
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = rb_core_apply_state_json_ex(core_of(op), b.buf, (size_t)b.len, generic, &err);
    Py_END_ALLOW_THREADS PyBuffer_Release(&b);
    if (rc < 0)
        return rbpy_raise_err(&err);
    return Py_BuildValue("(Os)", rc > 0 ? Py_True : Py_False, rc > 0 ? "" : err.msg);
}

static PyObject *core_apply_state_json(PyObject *op, PyObject *arg)
{
    return apply_state_json(op, arg, 0);
}

static PyObject *core_apply_state_json_generic(PyObject *op, PyObject *arg)
{
    return apply_state_json(op, arg, 1);
}

static int status_add_trust(PyObject *d, const rb_core_status *st);

/* GIL held: the metadata format and, for the log format, its figures. 0, or -1 with an
 * exception set. */
/* GIL held: deallocation of freed slots, flat keys dealloc_*. 0, or -1 with an exception set. */
static int status_add_dealloc(PyObject *d, const rb_core_status *st)
{
    PyObject *t = Py_BuildValue(
        "{s:s,s:s,s:N,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d}", "dealloc_state", st->dealloc_state, "dealloc_kind",
        st->dealloc_kind, "dealloc_unsupported_reason", rbpy_text(st->dealloc_why), "dealloc_slots",
        (unsigned long long)st->dealloc_slots, "dealloc_ranges", (unsigned long long)st->dealloc_ranges,
        "dealloc_commands", (unsigned long long)st->dealloc_cmds, "dealloc_bytes",
        (unsigned long long)st->dealloc_bytes, "dealloc_failures", (unsigned long long)st->dealloc_failures,
        "dealloc_skipped", (unsigned long long)st->dealloc_skipped, "dealloc_pending_slots",
        (unsigned long long)st->dealloc_pending, "dealloc_seconds", (double)st->dealloc_ns / 1e9);
    int rc = t ? PyDict_Update(d, t) : -1;
    Py_XDECREF(t);
    return rc;
}

static int status_add_log(PyObject *d, const rb_core_status *st)
{
    static const char *const states[] = {"fresh", "v1-to-move", "live"};
    PyObject *fmt = PyUnicode_FromString(st->meta_format == RB_META_LOG ? "log" : "v1");
    int rc = fmt ? PyDict_SetItemString(d, "meta_format", fmt) : -1;
    Py_XDECREF(fmt);
    PyObject *secs = rc == 0 ? PyFloat_FromDouble((double)st->recovery_ns / 1e9) : NULL;
    rc = secs ? PyDict_SetItemString(d, "recovery_seconds", secs) : -1;
    Py_XDECREF(secs);
    if (rc < 0 || st->meta_format != RB_META_LOG)
        return rc;
    PyObject *l = Py_BuildValue(
        "{s:s,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:K,s:K,s:K,s:K,s:K,s:K}", "state",
        st->log_state >= 0 && st->log_state < 3 ? states[st->log_state] : "?", "ring_bytes",
        (unsigned long long)st->log_ring_bytes, "live_bytes", (unsigned long long)st->log_live_bytes, "seq",
        (unsigned long long)st->log_seq, "groups_written", (unsigned long long)st->log_groups_written, "bytes_written",
        (unsigned long long)st->log_bytes_written, "last_group_bytes", (unsigned long long)st->log_last_group_bytes,
        "last_group_records", (unsigned long long)st->log_last_group_records, "pending_pages",
        (unsigned long long)st->log_pending_pages, "bases_written", (unsigned long long)st->bases_written,
        "base_last_bytes", (unsigned long long)st->base_last_bytes, "base_last_entries",
        (unsigned long long)st->base_last_entries, "base_too_large", (unsigned long long)st->base_too_large,
        "compactions", (unsigned long long)st->compactions, "base_last_seconds", (double)st->base_last_ns / 1e9,
        "journal_lost", (unsigned long long)st->log_journal_lost, "ring_full", (unsigned long long)st->log_ring_full,
        "recovered_groups", (unsigned long long)st->log_recovered_groups, "recovered_records",
        (unsigned long long)st->log_recovered_records, "base_area_bytes", (unsigned long long)st->base_area_bytes,
        "generation", (unsigned long long)st->log_generation);
    if (l) {
        PyObject *rs = PyFloat_FromDouble((double)st->recovery_read_ns / 1e9);
        if (!rs || PyDict_SetItemString(l, "recovery_read_seconds", rs) < 0)
            Py_CLEAR(l);
        Py_XDECREF(rs);
    }
    rc = l ? PyDict_SetItemString(d, "metadata_log", l) : -1;
    Py_XDECREF(l);
    return rc;
}

static PyObject *core_status(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_core_status st;
    rb_core_status_get(core_of(op), &st);
    PyObject *io = PyDict_New();
    if (!io)
        return NULL;
#define RBPY_IO(name)                                                                                                  \
    do {                                                                                                               \
        PyObject *v = PyLong_FromUnsignedLongLong(st.io.name);                                                         \
        if (!v || PyDict_SetItemString(io, #name, v) < 0) {                                                            \
            Py_XDECREF(v);                                                                                             \
            Py_DECREF(io);                                                                                             \
            return NULL;                                                                                               \
        }                                                                                                              \
        Py_DECREF(v);                                                                                                  \
    } while (0);
    RB_STATS_FIELDS(RBPY_IO)
#undef RBPY_IO
    static const char *const outcomes[] = {"blank", "skipped", "loaded", "fallback", "rejected", "unreadable"};
    const char *outcome = st.recovery_outcome >= 0 && st.recovery_outcome < 6 ? outcomes[st.recovery_outcome] : "?";
    PyObject *d = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O,s:O,s:N,"
        "s:s,s:K,s:K,s:L,s:K,s:K,s:K,s:K,s:K,s:K,s:N}",
        "capacity_bytes", st.capacity_bytes, "data_base_offset", st.data_base, "container_bytes", st.container_bytes,
        "max_slots", st.max_slots, "next_slot", st.next_slot, "free_slot_count", st.free_slots, "indexed_key_count",
        st.indexed, "inflight_key_count", st.inflight_keys, "locked_key_count", st.locked_keys, "inflight_io_count",
        st.inflight_io, "metadata_seq", st.meta_seq, "metadata_dirty_total", st.dirty_total, "metadata_persisted",
        st.persisted, "fdp_slot_affinity_hit_count", st.affinity_hits, "fdp_slot_affinity_fallback_count",
        st.affinity_fallbacks, "checkpoints_written", st.ckpt_written, "checkpoint_failures", st.ckpt_failures,
        "checkpoint_too_large_count", st.ckpt_too_large, "payload_checksum_failures", st.checksum_failures,
        "recovery_dropped_entries", st.recovery_dropped, "recovery_loaded_entries", st.recovery_entries_loaded,
        "unverified_entry_count", st.unverified, "load_verified_entries", st.deferred_verified, "load_dropped_entries",
        st.deferred_dropped, "recovery_loaded", st.recovery_loaded ? Py_True : Py_False, "closed",
        st.closed ? Py_True : Py_False, "checkpoint_last_error", rbpy_text(st.ckpt_error), "recovery_outcome", outcome,
        "recovery_seq", st.recovery_seq, "recovery_rejected_seq", st.recovery_rejected_seq, "recovery_lost_entries",
        (long long)st.recovery_lost, "checkpoint_held_slots", st.held_slots, "checkpoint_held_slots_total",
        st.held_total, "checkpoints_for_room", st.room_ckpts, "payload_checksum_dropped_entries", st.checksum_dropped,
        "device_flushes", st.flushes, "recovery_skipped_entries", st.skipped, "io", io);
    if (!d || status_add_trust(d, &st) < 0 || status_add_log(d, &st) < 0 || status_add_dealloc(d, &st) < 0)
        Py_CLEAR(d);
    /* The device's lock: "exclusive", "unsupported" (no flock on its file system), "released". */
    rb_core *c = core_of(op);
    PyObject *lock = d ? PyUnicode_FromString(c && c->dev ? rb_dev_lock_name(c->dev) : "released") : NULL;
    if (d && (!lock || PyDict_SetItemString(d, "device_lock", lock) < 0))
        Py_CLEAR(d);
    Py_XDECREF(lock);
    return d;
}

/* GIL held: the trust fields of a status dict: header refusals at load, write-back failures,
 * device shrink, and the fault journal (faults: oldest first; fault_counts: errno -> count,
 * 0 for any errno past the table). 0, or -1 with an exception set. */
static int status_add_trust(PyObject *d, const rb_core_status *st)
{
    PyObject *faults = PyList_New(0), *counts = PyDict_New();
    int rc = faults && counts ? 0 : -1;
    for (uint32_t k = 0; rc == 0 && k < st->n_faults_kept; k++) {
        const rb_fault *f = &st->faults[k];
        PyObject *off = f->offset == UINT64_MAX ? Py_NewRef(Py_None) : PyLong_FromUnsignedLongLong(f->offset);
        PyObject *fd = Py_BuildValue("{s:K,s:d,s:s,s:N,s:i,s:N}", "seq", (unsigned long long)f->seq, "time",
                                     (double)f->time_ns / 1e9, "op", f->op, "offset", off, "errno", f->errnum, "text",
                                     rbpy_text(f->text));
        rc = fd ? PyList_Append(faults, fd) : -1;
        Py_XDECREF(fd);
    }
    for (int e = 0; rc == 0 && e < RB_ERRNO_SLOTS; e++) {
        if (!st->fault_by_errno[e])
            continue;
        PyObject *k = PyLong_FromLong(e), *v = PyLong_FromUnsignedLongLong(st->fault_by_errno[e]);
        rc = k && v ? PyDict_SetItem(counts, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    PyObject *t = rc == 0 ? Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O,s:O}", "load_rejected_entries",
                                          st->load_rejected, "writeback_failures", st->writeback_failures,
                                          "writeback_dropped_entries", st->writeback_dropped, "shrink_dropped_entries",
                                          st->shrink_dropped, "retired_slots", st->retired_slots, "undurable_writes",
                                          st->undurable_writes, "usable_slots", st->usable_slots, "device_size_bytes",
                                          st->device_size, "faults_total", st->faults_total, "faults", faults,
                                          "fault_counts", counts)
                          : NULL;
    rc = t ? PyDict_Update(d, t) : -1;
    Py_XDECREF(t);
    Py_XDECREF(faults);
    Py_XDECREF(counts);
    return rc;
}

/* trust_counters() -> (faults_total, load_rejected_entries, writeback_dropped_entries,
 * shrink_dropped_entries): what the facade watches after a call with failures, cheaply. */
static PyObject *core_trust_counters(PyObject *op, PyObject *unused)
{
    (void)unused;
    uint64_t v[4];
    rb_core_trust_counts(core_of(op), v);
    return Py_BuildValue("(KKKK)", (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2],
                         (unsigned long long)v[3]);
}

/* fetch_fdp_status() -> [(placement_id, ruh_id), ...] of the core's passthrough device. */
static PyObject *core_fetch_fdp_status(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_core *c = core_of(op);
    if (!c || !c->dev) {
        PyErr_SetString(PyExc_RuntimeError, "RawBlockCore is closed");
        return NULL;
    }
    return rbpy_fdp_status(c->dev, "fetch_fdp_status requires io_engine='io_uring' with use_uring_cmd=true");
}

/* nvme_info() -> dict(nsid, lba_shift, lba_size, max_data_transfer_size, size_bytes) of a
 * passthrough core, or None. */
static PyObject *core_nvme_info(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_core *c = core_of(op);
    rb_nvme_ns ns;
    if (!c || !c->dev || !rb_dev_nvme_ns(c->dev, &ns))
        Py_RETURN_NONE;
    /* Dataset Management as the controller describes it (zeros on the three when it did not). */
    static const char *const reads[] = {"not reported", "zeros", "ones"};
    rb_nvme_dsm dsm;
    rb_dev_nvme_dsm(c->dev, &dsm);
    return Py_BuildValue("{s:I,s:I,s:I,s:n,s:K,s:O,s:I,s:I,s:s}", "nsid", ns.nsid, "lba_shift", ns.lba_shift,
                         "lba_size", ns.lba_size, "max_data_transfer_size", (Py_ssize_t)rb_dev_max_transfer(c->dev),
                         "size_bytes", (unsigned long long)rb_dev_size(c->dev), "dsm_supported",
                         dsm.supported ? Py_True : Py_False, "dsm_max_ranges", dsm.max_ranges, "dsm_max_range_blocks",
                         dsm.max_range_lbas, "deallocated_reads",
                         dsm.dlfeat_read < 3 ? reads[dsm.dlfeat_read] : "reserved");
}

/*
 * engine_state() -> (fixed_buffers_registered, fixed_buffer_registered_bytes, worker_error):
 * the io_uring engine's registration and its fatal error (None while it runs; "stopped" text
 * when it refuses work without one while the core is open). A closed device reports
 * (False, 0, None), as LMCache's core does once its device is gone.
 */
static PyObject *core_engine_state(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_core *c = core_of(op);
    int reg = 0, has_err = 0, stopped = 0;
    uint64_t bytes = 0;
    char msg[256];
    msg[0] = 0;
    if (c && c->dev && rb_dev_enter(c->dev) == 0) {
        if (c->dev->uring) {
            rb_uring_fixed_status(c->dev->uring, &reg, &bytes);
            has_err = rb_uring_worker_error(c->dev->uring, msg, sizeof msg);
            stopped = rb_uring_stopped(c->dev->uring);
        }
        rb_dev_leave(c->dev);
    }
    PyObject *err;
    if (has_err)
        err = PyUnicode_FromString(msg);
    else if (stopped)
        err = PyUnicode_FromString("io_uring worker stopped");
    else
        err = Py_NewRef(Py_None);
    if (!err)
        return NULL;
    return Py_BuildValue("(OKN)", reg ? Py_True : Py_False, (unsigned long long)bytes, err);
}

/* _inject_engine_fault(kinds): test hook, RB_URING_FAULT_* bits (1 submit, 2 reap). */
static PyObject *core_inject_engine_fault(PyObject *op, PyObject *arg)
{
    long kinds = PyLong_AsLong(arg);
    if (kinds == -1 && PyErr_Occurred())
        return NULL;
    rb_core *c = core_of(op);
    if (!c || !c->dev || rb_dev_enter(c->dev) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "device is closed");
        return NULL;
    }
    int ok = c->dev->uring != NULL;
    if (ok)
        rb_uring_inject_fault(c->dev->uring, (int)kinds);
    rb_dev_leave(c->dev);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "_inject_engine_fault needs io_engine='io_uring'");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *core_register_buffers(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"ptrs", "sizes"};
    PyObject *a[2];
    if (rbpy_unpack("register_buffers", names, 2, 2, args, nargs, kwnames, a) < 0)
        return NULL;
    PyObject *pl = PySequence_Fast(a[0], "ptrs must be a sequence");
    PyObject *sl = pl ? PySequence_Fast(a[1], "sizes must be a sequence") : NULL;
    uint64_t *ptrs = NULL, *sizes = NULL;
    PyObject *ret = NULL;
    if (!pl || !sl)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(pl);
    if (PySequence_Fast_GET_SIZE(sl) != n) {
        PyErr_SetString(PyExc_ValueError, "ptrs and sizes must have the same length");
        goto done;
    }
    ptrs = PyMem_Calloc(n ? n : 1, sizeof(uint64_t));
    sizes = PyMem_Calloc(n ? n : 1, sizeof(uint64_t));
    if (!ptrs || !sizes) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (rbpy_as_u64(PySequence_Fast_GET_ITEM(pl, i), "ptr", &ptrs[i]) < 0 ||
            rbpy_as_u64(PySequence_Fast_GET_ITEM(sl, i), "size", &sizes[i]) < 0)
            goto done;
    }
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = rb_core_register_buffers(core_of(op), ptrs, sizes, (size_t)n, &err);
    Py_END_ALLOW_THREADS if (rc < 0) rbpy_raise_err(&err);
    else ret = Py_NewRef(Py_None);
done:
    PyMem_Free(ptrs);
    PyMem_Free(sizes);
    Py_XDECREF(pl);
    Py_XDECREF(sl);
    return ret;
}

/* _set_metadata_shortcut(cls, descr, attr) or (None, None, None): see metadata_of. The facade
 * passes LMCache's TensorMemoryObj, its metadata property and "meta" only after checking that
 * the property's code is `with self.lock: return self.meta`. */
static PyObject *core_set_metadata_shortcut(PyObject *op, PyObject *const *args, Py_ssize_t nargs)
{
    CoreObject *self = (CoreObject *)op;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_set_metadata_shortcut(cls, descr, attr) takes 3 arguments");
        return NULL;
    }
    if (args[0] == Py_None) {
        Py_CLEAR(self->meta_type);
        Py_CLEAR(self->meta_descr);
        Py_CLEAR(self->meta_attr);
        Py_RETURN_NONE;
    }
    if (!PyType_Check(args[0]) || !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "_set_metadata_shortcut expects a class, a descriptor and a str");
        return NULL;
    }
    Py_XSETREF(self->meta_type, Py_NewRef(args[0]));
    Py_XSETREF(self->meta_descr, Py_NewRef(args[1]));
    Py_XSETREF(self->meta_attr, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

static PyObject *core_revalidate(PyObject *op, PyObject *arg)
{
    int seq = PyObject_IsTrue(arg);
    if (seq < 0)
        return NULL;
    uint64_t dropped = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = rb_core_revalidate(core_of(op), seq, &dropped);
    Py_END_ALLOW_THREADS if (rc < 0) return PyErr_NoMemory();
    return PyLong_FromUnsignedLongLong(dropped);
}

static PyObject *core_mem_bytes(PyObject *op, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSize_t(rb_core_mem_bytes(core_of(op)));
}

static PyObject *core_inject_fault(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"kind", "countdown"};
    PyObject *a[2];
    if (rbpy_unpack("_inject_fault", names, 2, 2, args, nargs, kwnames, a) < 0)
        return NULL;
    const char *kind = PyUnicode_Check(a[0]) ? PyUnicode_AsUTF8(a[0]) : NULL;
    static const char *const kinds[] = {"write", "read", "submit", "prep", "flush"};
    int k = -1;
    for (int i = 0; kind && i < 5; i++)
        if (strcmp(kind, kinds[i]) == 0)
            k = i;
    if (k < 0) {
        PyErr_SetString(PyExc_ValueError, "kind must be 'write', 'read', 'submit', 'prep' or 'flush'");
        return NULL;
    }
    long long n = PyLong_AsLongLong(a[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    rb_core_inject_fault(core_of(op), k, n);
    Py_RETURN_NONE;
}

/* Test hooks that pause a core operation for arg milliseconds. */
static PyObject *set_delay(PyObject *op, PyObject *arg, void (*set)(rb_core *, uint32_t))
{
    unsigned long ms = PyLong_AsUnsignedLong(arg);
    if (ms == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    set(core_of(op), (uint32_t)ms);
    Py_RETURN_NONE;
}

static PyObject *core_set_ckpt_delay(PyObject *op, PyObject *arg)
{
    return set_delay(op, arg, rb_core_set_ckpt_delay_ms);
}

/* _set_load_check_off(bool): benchmark hook, loads of verified records skip the header check. */
static PyObject *core_set_load_check_off(PyObject *op, PyObject *arg)
{
    return set_flag(op, arg, rb_core_set_load_check_off);
}

static PyObject *core_set_ckpt_no_flush(PyObject *op, PyObject *arg)
{
    return set_flag(op, arg, rb_core_set_ckpt_no_flush);
}

static PyObject *core_set_load_delay(PyObject *op, PyObject *arg)
{
    return set_delay(op, arg, rb_core_set_load_delay_ms);
}

static PyObject *core_identity(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)mod;
    static const char *const names[] = {"key", "namespace"};
    PyObject *a[2];
    if (rbpy_unpack("_key_identity", names, 2, 2, args, nargs, kwnames, a) < 0)
        return NULL;
    const char *s;
    size_t l;
    if (one_key(a[0], &s, &l) < 0)
        return NULL;
    const char *ns = PyUnicode_Check(a[1]) ? PyUnicode_AsUTF8(a[1]) : "";
    uint64_t v;
    if (rb_key_identity(strcmp(ns, "legacy") == 0 ? RB_NS_LEGACY : RB_NS_OBJECT, s, l, &v) < 0) {
        PyErr_SetString(PyExc_ValueError, "key does not parse as a legacy key");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(v);
}

static PyMethodDef core_methods[] = {
    {"put_many", (PyCFunction)(void (*)(void))core_put_many, METH_FASTCALL | METH_KEYWORDS,
     "put_many(keys, identities, payloads, placement_ids, metas) -> (results, stored_indices); a payload is "
     "a buffer-protocol object, a MemoryObj of the _set_memobj_type class, or anything with byte_array; metas "
     "is one (dtype name, format name, shape, cached_positions) tuple per key, or a callable "
     "namer(dtype, fmt) -> (dtype name, format name, cacheable) with which each payload's own metadata "
     "(its metadata attribute) is read"},
    {"load_many_into", (PyCFunction)(void (*)(void))core_load_many, METH_FASTCALL | METH_KEYWORDS,
     "load_many_into(keys, payloads, set_positions=None) -> (results, cached_positions, errors: exception or "
     "None per key); with set_positions (list of ints -> value), each loaded key's positions are set on its "
     "payload's metadata instead and the result is (results, errors or None when no key failed); "
     "payloads as for put_many, writable"},
    {"exists_many", (PyCFunction)(void (*)(void))core_exists_many, METH_FASTCALL | METH_KEYWORDS,
     "exists_many(keys, lock=False) -> list[bool]"},
    {"delete_many", (PyCFunction)(void (*)(void))core_delete_many, METH_FASTCALL | METH_KEYWORDS,
     "delete_many(keys, force=False) -> list[bool]"},
    {"unlock_many", core_unlock_many, METH_O, "unlock_many(keys)"},
    {"get_metadata_many", core_get_metadata_many, METH_O,
     "get_metadata_many(keys) -> list[(offset, size, shape, dtype, fmt, cached_positions) | None]"},
    {"get_metadata_prefix", (PyCFunction)(void (*)(void))core_get_metadata_prefix, METH_FASTCALL | METH_KEYWORDS,
     "get_metadata_prefix(keys, lock=False, skip=None) -> list[tuple]"},
    {"exists_inflight", core_exists_inflight, METH_O, "exists_inflight(key) -> bool"},
    {"entry_offset", core_entry_offset, METH_O, "entry_offset(key) -> int | None"},
    {"lock_refcount", core_lock_refcount, METH_O, "lock_refcount(key) -> int"},
    {"snapshot_keys", (PyCFunction)(void (*)(void))core_snapshot_keys, METH_FASTCALL | METH_KEYWORDS,
     "snapshot_keys(limit=None) -> list[str] in insertion order"},
    {"checkpoint_now", (PyCFunction)(void (*)(void))core_checkpoint_now, METH_FASTCALL | METH_KEYWORDS,
     "checkpoint_now(force=True) -> bool (written)"},
    {"compact_metadata", core_compact_metadata, METH_NOARGS,
     "compact_metadata() -> bool: log format, write a new base and switch to it now (False: nothing to do)"},
    {"set_dealloc_log", core_set_dealloc_log, METH_O,
     "set_dealloc_log(on): start (cleared) or stop the journal of deallocated ranges"},
    {"take_dealloc_log", core_take_dealloc_log, METH_NOARGS,
     "take_dealloc_log() -> list[(offset, length)]: ranges deallocated since the last call"},
    {"apply_state_json", core_apply_state_json, METH_O, "apply_state_json(bytes) -> (applied, reason)"},
    {"_apply_state_json_generic", core_apply_state_json_generic, METH_O,
     "test hook: apply_state_json through json-c only (no plain-form reader)"},
    {"status", core_status, METH_NOARGS, "status() -> dict"},
    {"trust_counters", core_trust_counters, METH_NOARGS,
     "trust_counters() -> (faults_total, load_rejected_entries, writeback_dropped_entries, shrink_dropped_entries)"},
    {"register_buffers", (PyCFunction)(void (*)(void))core_register_buffers, METH_FASTCALL | METH_KEYWORDS,
     "register_buffers(ptrs, sizes): io_uring fixed buffers (memory must outlive the core)"},
    {"fetch_fdp_status", core_fetch_fdp_status, METH_NOARGS,
     "fetch_fdp_status() -> [(placement_id, ruh_id), ...]: the FDP reclaim unit handles of the passthrough "
     "device."},
    {"nvme_info", core_nvme_info, METH_NOARGS,
     "nvme_info() -> dict | None: namespace id, LBA shift and size, bytes per NVMe command and the "
     "controller's Dataset Management limits of a passthrough core."},
    {"engine_state", core_engine_state, METH_NOARGS,
     "engine_state() -> (fixed_buffers_registered, fixed_buffer_registered_bytes, worker_error or None)"},
    {"_inject_engine_fault", core_inject_engine_fault, METH_O,
     "test hook: _inject_engine_fault(kinds), io_uring worker faults (1 submit, 2 reap)"},
    {"_set_metadata_shortcut", (PyCFunction)(void (*)(void))core_set_metadata_shortcut, METH_FASTCALL,
     "_set_metadata_shortcut(cls, descr, attr): instances of exactly cls have their metadata read as "
     "obj.<attr> while cls.metadata is descr (a property returning that attribute); (None, None, None) "
     "turns it off"},
    {"_revalidate", core_revalidate, METH_O,
     "benchmark hook: _revalidate(sequential) -> dropped; re-read and check every slot header"},
    {"mem_bytes", core_mem_bytes, METH_NOARGS, "bytes allocated by the index and slot allocator"},
    {"close", core_close, METH_NOARGS, "close() -> dict"},
    {"_inject_fault", (PyCFunction)(void (*)(void))core_inject_fault, METH_FASTCALL | METH_KEYWORDS,
     "test hook: _inject_fault('write'|'read'|'submit'|'prep', countdown)"},
    {"_set_checkpoint_delay_ms", core_set_ckpt_delay, METH_O, "test hook: delay each checkpoint writer"},
    {"_set_load_check_off", core_set_load_check_off, METH_O,
     "benchmark hook: loads of verified records skip the slot-header check (never in service)"},
    {"_set_checkpoint_no_flush", core_set_ckpt_no_flush, METH_O,
     "benchmark hook: checkpoints skip their device flushes (measures what the flushes cost)"},
    {"_set_load_delay_ms", core_set_load_delay, METH_O,
     "test hook: pause each load between its index snapshot and its reads"},
    {"_key_identity", (PyCFunction)(void (*)(void))core_identity, METH_FASTCALL | METH_KEYWORDS | METH_STATIC,
     "test hook: the C slot identity of an encoded key"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef core_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(CoreObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot core_slots[] = {
    {Py_tp_new, core_new},
    {Py_tp_dealloc, core_dealloc},
    {Py_tp_traverse, core_traverse},
    {Py_tp_clear, core_tp_clear},
    {Py_tp_methods, core_methods},
    {Py_tp_members, core_members},
    {Py_tp_doc, "Native raw-block core (index, slots, checkpoints, I/O). Use lmcache_rawblock.RawBlockCore."},
    {0, NULL},
};

PyType_Spec rbpy_core_spec = {
    .name = "lmcache_rawblock._native.Core",
    .basicsize = sizeof(CoreObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = core_slots,
};
