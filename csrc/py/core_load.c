/*
 * core_load.c - Core.load_many_into: payload views, the reads without the GIL, and the result
 * (per-key success, cached positions set on the objects or returned, per-key errors).
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

/*
 * GIL held, after the reads: obj.metadata.cached_positions = the key's stored positions for
 * every key that loaded and whose object has metadata (getattr(obj, "metadata", None) not
 * None): None as it is, a list of ints through conv (the facade's positions_from_list). -1
 * with an exception set on the first failure.
 */
static int load_set_positions(rbpy_state *st, CoreObject *self, PyObject *bufs, const rb_load_item *items, Py_ssize_t n,
                              PyObject *conv)
{
    PyTypeObject *direct = rbpy_metadata_direct_type(st, self);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!items[i].ok)
            continue;
        PyObject *m = rbpy_metadata_of(st, self, direct, PyTuple_GET_ITEM(bufs, i));
        if (!m)
            return -1;
        if (m == Py_None) {
            Py_DECREF(m);
            continue;
        }
        PyObject *v = Py_NewRef(Py_None);
        if (items[i].npos >= 0) {
            PyObject *l = rbpy_i64_list(items[i].pos, items[i].npos);
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
        PyObject *e = items[i].status < 0 ? rbpy_err_object(&items[i].err) : Py_NewRef(Py_None);
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
        PyObject *p = items[i].ok ? rbpy_i64_list(items[i].pos, items[i].npos) : Py_NewRef(Py_None);
        PyObject *e = items[i].status < 0 ? rbpy_err_object(&items[i].err) : Py_NewRef(Py_None);
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

/* One load_many_into call: the key snapshot, the buffers (a tuple), and the items and payload
 * views it holds until it returns. The core fills items (ok, status, err, positions) without
 * the GIL. */
typedef struct {
    keyvec kv;
    PyObject *bufs;
    Py_ssize_t n, nviews; /* keys; views[0..nviews) are held */
    rb_load_item *items;
    payload *views;
} load_call;

/* GIL held: the buffers (as many as keys) and a writable view of each into lc->items. 0, or -1
 * with an exception set. */
static int load_call_open(rbpy_state *st, load_call *lc, PyObject *buffers)
{
    Py_ssize_t n = lc->n;
    if (!(lc->bufs = rbpy_fast_tuple(buffers, "buffers must be a sequence")))
        return -1;
    if (PyTuple_GET_SIZE(lc->bufs) != n) {
        PyErr_SetString(PyExc_ValueError, "keys and buffers must have equal lengths");
        return -1;
    }
    lc->items = PyMem_Calloc(n ? n : 1, sizeof(*lc->items));
    lc->views = PyMem_Calloc(n ? n : 1, sizeof(*lc->views));
    if (!lc->items || !lc->views) {
        PyErr_NoMemory();
        return -1;
    }
    PyTypeObject *fast = rbpy_memobj_fast_type(st);
    for (Py_ssize_t i = 0; i < n; i++) {
        payload *v = &lc->views[i];
        if (rbpy_payload_get(st, fast, PyTuple_GET_ITEM(lc->bufs, i), i, 1, v) < 0)
            return -1;
        lc->nviews = i + 1;
        lc->items[i] =
            (rb_load_item){.key = lc->kv.keys[i], .key_len = lc->kv.lens[i], .buf = v->buf, .buf_len = v->len};
    }
    return 0;
}

/* Called with the GIL, which it releases around rb_core_load_many. 0, or -1 with the core's
 * error raised. */
static int load_call_run(PyObject *op, load_call *lc)
{
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = rb_core_load_many(rbpy_core_of(op), lc->items, (size_t)lc->n, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        rbpy_raise_err(&err);
        return -1;
    }
    return 0;
}

/* GIL held: with a positions converter, the positions go onto the objects and the result is
 * (results, errors or None); without, (results, positions, errors). */
static PyObject *load_call_result(rbpy_state *st, PyObject *op, const load_call *lc, PyObject *conv)
{
    const rb_load_item *items = lc->items;
    Py_ssize_t n = lc->n;
    if (!conv)
        return load_result_lists(items, n);
    if (load_set_positions(st, (CoreObject *)op, lc->bufs, items, n, conv) < 0)
        return NULL;
    PyObject *ret = NULL, *rl = PyList_New(n), *el = rl ? load_errors(items, n) : NULL;
    for (Py_ssize_t i = 0; el && i < n; i++)
        PyList_SET_ITEM(rl, i, Py_NewRef(items[i].ok ? Py_True : Py_False));
    if (el)
        ret = PyTuple_Pack(2, rl, el);
    Py_XDECREF(rl);
    Py_XDECREF(el);
    return ret;
}

/* GIL held: release everything the call holds, whichever stage it reached. */
static void load_call_close(load_call *lc)
{
    for (Py_ssize_t i = 0; lc->items && i < lc->n; i++)
        free(lc->items[i].pos); /* the core's (NULL unless a key loaded with positions) */
    for (Py_ssize_t i = 0; i < lc->nviews; i++)
        rbpy_payload_release(&lc->views[i]);
    PyMem_Free(lc->items);
    PyMem_Free(lc->views);
    Py_XDECREF(lc->bufs);
    rbpy_keyvec_free(&lc->kv);
}

/*
 * load_many_into(keys, payloads, set_positions=None). Without set_positions: (results,
 * positions, errors), a list each. With it (a callable taking a list of ints): each loaded
 * key's cached positions are set on its object's metadata here (load_set_positions), and the
 * result is (results, errors), errors None when no key failed.
 */
PyObject *rbpy_core_load_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"keys", "payloads", "set_positions"};
    PyObject *a[3];
    if (rbpy_unpack("load_many_into", names, 3, 2, args, nargs, kwnames, a) < 0)
        return NULL;
    PyObject *conv = a[2] && a[2] != Py_None ? a[2] : NULL;
    if (conv && !PyCallable_Check(conv)) {
        PyErr_SetString(PyExc_TypeError, "set_positions must be callable or None");
        return NULL;
    }
    load_call lc;
    memset(&lc, 0, sizeof(lc));
    if (rbpy_keyvec_from(a[0], &lc.kv) < 0)
        return NULL;
    lc.n = lc.kv.n;
    rbpy_state *st = rbpy_state_of_type(Py_TYPE(op));
    PyObject *ret = NULL;
    if (load_call_open(st, &lc, a[1]) == 0 && load_call_run(op, &lc) == 0)
        ret = load_call_result(st, op, &lc, conv);
    load_call_close(&lc);
    return ret;
}
