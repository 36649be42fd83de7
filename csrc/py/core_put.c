/*
 * core_put.c - Core.put_many: one put_call from the arguments (keys, identities, placement
 * ids, metadata, payload views), the store without the GIL, the (results, stored, failure)
 * result.
 */
#include "core.h"

#include <string.h>

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

/* GIL held: take the per-key argument sequences (a[1..4]), check their lengths against the
 * keys already in pc->kv, and allocate the arrays. A callable a[4] is the namer of the
 * payloads' own metadata (rbpy_put_meta_read). -1 with an exception set on failure. */
static int put_call_open(put_call *pc, PyObject *const *a)
{
    Py_ssize_t n = pc->n;
    pc->ids = rbpy_fast_tuple(a[1], "identities must be a sequence");
    pc->bufs = pc->ids ? rbpy_fast_tuple(a[2], "buffers must be a sequence") : NULL;
    pc->pids = pc->bufs ? rbpy_fast_tuple(a[3], "placement_ids must be a sequence") : NULL;
    if (!pc->pids)
        return -1;
    if (PyCallable_Check(a[4]))
        pc->namer = a[4];
    else if (!(pc->metas = rbpy_fast_tuple(a[4], "metas must be a sequence or a callable")))
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

/* GIL held: a (dtype, fmt, shape, cached_positions) tuple into it->meta. dtype and fmt are
 * borrowed from the tuple; shape goes to inl when it fits, else (and positions always) to PyMem
 * arrays that put_call_close frees. */
static int put_meta_from(PyObject *m, rb_put_item *it, int64_t *inl)
{
    if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 4) {
        PyErr_SetString(PyExc_TypeError, "metas items must be (dtype, fmt, shape, cached_positions) tuples");
        return -1;
    }
    it->meta.dtype = rbpy_opt_str(PyTuple_GET_ITEM(m, 0), &it->meta.dtype_len);
    it->meta.fmt = rbpy_opt_str(PyTuple_GET_ITEM(m, 1), &it->meta.fmt_len);
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

/* GIL held: every key's identity, placement id, meta and payload view into pc->items (the
 * views taken are counted in pc->nviews). -1 with an exception set on the first failure. */
static int put_items_from(PyObject *op, put_call *pc)
{
    rbpy_state *st = rbpy_state_of_type(Py_TYPE(op));
    PyTypeObject *fast = rbpy_memobj_fast_type(st);
    const Py_ssize_t n = pc->n;
    const char **keys = pc->kv.keys;
    const size_t *lens = pc->kv.lens;
    PyObject *ids = pc->ids, *pids = pc->pids, *metas = pc->metas, *bufs = pc->bufs;
    rb_put_item *items = pc->items;
    payload *views = pc->views;
    if (!metas) {
        CoreObject *self = (CoreObject *)op;
        PyTypeObject *direct = rbpy_metadata_direct_type(st, self);
        for (Py_ssize_t i = 0; i < n; i++)
            if (rbpy_put_meta_read(st, self, direct, pc, i) < 0)
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
        if (rbpy_payload_get(st, fast, PyTuple_GET_ITEM(bufs, i), i, 0, &views[i]) < 0)
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
    Py_BEGIN_ALLOW_THREADS
        rc = rb_core_put_many(rbpy_core_of(op), pc->items, (size_t)pc->n, pc->results, pc->stored, &pc->n_stored,
                              &pc->fail, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
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
    PyObject *rl = rbpy_bool_list(pc->results, pc->n);
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
        rbpy_payload_release(&views[i]);
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
    rbpy_keyvec_free(&pc->kv);
}

/* Stages: snapshot the keys, take and check the arguments, convert each key, run the core
 * without the GIL, build the result; put_call_close releases whatever the stages took. */
PyObject *rbpy_core_put_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"keys", "identities", "payloads", "placement_ids", "metas"};
    PyObject *a[5];
    if (rbpy_unpack("put_many", names, 5, 5, args, nargs, kwnames, a) < 0)
        return NULL;
    put_call pc;
    memset(&pc, 0, sizeof(pc));
    if (rbpy_keyvec_from(a[0], &pc.kv) < 0)
        return NULL;
    pc.n = pc.kv.n;
    PyObject *ret = NULL;
    if (put_call_open(&pc, a) == 0 && put_items_from(op, &pc) == 0 && put_call_run(op, &pc) == 0)
        ret = put_call_result(&pc);
    put_call_close(&pc);
    return ret;
}
