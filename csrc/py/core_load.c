/*
 * core_load.c - Core.load_many_into: payload views, the reads without the GIL, and the result
 * (per-key success, cached positions set on the objects or returned, per-key errors).
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

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
        PyObject *p = items[i].ok ? rbpy_i64_list(items[i].pos, items[i].npos) : Py_NewRef(Py_None);
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
PyObject *rbpy_core_load_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
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
    if (rbpy_keyvec_from(a[0], &kv) < 0)
        return NULL;
    Py_ssize_t n = kv.n, nviews = 0;
    PyObject *bufs = rbpy_fast_tuple(a[1], "buffers must be a sequence"), *ret = NULL;
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
    PyTypeObject *fast = rbpy_memobj_fast_type(st);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (rbpy_payload_get(st, fast, PyTuple_GET_ITEM(bufs, i), i, 1, &views[i]) < 0)
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
        Py_BEGIN_ALLOW_THREADS rc = rb_core_load_many(rbpy_core_of(op), items, (size_t)n, &err);
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
        rbpy_payload_release(&views[i]);
    PyMem_Free(items);
    PyMem_Free(views);
    Py_XDECREF(bufs);
    rbpy_keyvec_free(&kv);
    return ret;
}
