/*
 * core_index.c - the index queries of _native.Core: exists / delete / unlock, metadata
 * lookups, one-key queries and the key snapshot.
 */
#include "core.h"

#include <stdlib.h>

/* ---- index queries --------------------------------------------------------------------- */

/* exists_many(keys, lock=False) and delete_many(keys, force=False): a key list and one flag
 * in, one bool per key out; fn runs the call, releasing the GIL as it decides. */
typedef void (*keys_flag_fn)(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int flag,
                             uint8_t *results);

/* fn(c, keys, lens, n, flag, results), without the GIL when nogil. */
static void call_keys(keys_flag_fn fn, rb_core *c, const char *const *keys, const size_t *lens, size_t n, int flag,
                      uint8_t *results, int nogil)
{
    if (nogil) {
        Py_BEGIN_ALLOW_THREADS
            fn(c, keys, lens, n, flag, results);
        Py_END_ALLOW_THREADS
    } else {
        fn(c, keys, lens, n, flag, results);
    }
}

static void exists_keys(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int lock, uint8_t *results)
{
    call_keys(rb_core_exists_many, c, keys, lens, n, lock, results, n > RBPY_NOGIL_KEYS);
}

/* Always without the GIL: a delete takes the core's mutex, which a checkpoint, a compaction
 * or a deallocation run may hold for milliseconds, and may block on the device itself;
 * waiting there with the GIL would stall every Python thread (a put whose write is done
 * could not get back into Python). */
void rbpy_core_delete(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int force, uint8_t *results)
{
    call_keys(rb_core_delete_many, c, keys, lens, n, force, results, 1);
}

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
    if (rbpy_keyvec_from(a[0], &kv) < 0)
        return NULL;
    uint8_t *r = PyMem_Calloc(kv.n ? kv.n : 1, 1);
    PyObject *ret = NULL;
    if (!r) {
        PyErr_NoMemory();
    } else {
        fn(rbpy_core_of(op), kv.keys, kv.lens, (size_t)kv.n, flag, r);
        ret = rbpy_bool_list(r, kv.n);
    }
    PyMem_Free(r);
    rbpy_keyvec_free(&kv);
    return ret;
}

PyObject *rbpy_core_exists_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"keys", "lock"};
    return keys_flag_call(op, "exists_many", names, exists_keys, args, nargs, kwnames);
}

PyObject *rbpy_core_delete_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"keys", "force"};
    return keys_flag_call(op, "delete_many", names, rbpy_core_delete, args, nargs, kwnames);
}

PyObject *rbpy_core_unlock_many(PyObject *op, PyObject *keys)
{
    keyvec kv;
    if (rbpy_keyvec_from(keys, &kv) < 0)
        return NULL;
    if (kv.n > RBPY_NOGIL_KEYS) {
        Py_BEGIN_ALLOW_THREADS
            rb_core_unlock_many(rbpy_core_of(op), kv.keys, kv.lens, (size_t)kv.n);
        Py_END_ALLOW_THREADS
    } else {
        rb_core_unlock_many(rbpy_core_of(op), kv.keys, kv.lens, (size_t)kv.n);
    }
    rbpy_keyvec_free(&kv);
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
    PyObject *pos = shape ? rbpy_i64_list(m->pos, m->npos) : NULL;
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

PyObject *rbpy_core_get_metadata_many(PyObject *op, PyObject *keys)
{
    keyvec kv;
    if (rbpy_keyvec_from(keys, &kv) < 0)
        return NULL;
    rb_meta_out *out = PyMem_Calloc(kv.n ? kv.n : 1, sizeof(*out));
    PyObject *ret = NULL;
    if (!out) {
        PyErr_NoMemory();
    } else {
        Py_BEGIN_ALLOW_THREADS
            rb_core_get_metadata_many(rbpy_core_of(op), kv.keys, kv.lens, (size_t)kv.n, out);
        Py_END_ALLOW_THREADS
        ret = meta_list(out, kv.n, kv.n, 1);
    }
    PyMem_Free(out);
    rbpy_keyvec_free(&kv);
    return ret;
}

PyObject *rbpy_core_get_metadata_prefix(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"keys", "lock", "skip"};
    PyObject *a[3];
    if (rbpy_unpack("get_metadata_prefix", names, 3, 1, args, nargs, kwnames, a) < 0)
        return NULL;
    int lock = a[1] ? PyObject_IsTrue(a[1]) : 0;
    if (lock < 0)
        return NULL;
    keyvec kv;
    if (rbpy_keyvec_from(a[0], &kv) < 0)
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
    Py_BEGIN_ALLOW_THREADS
        m = rb_core_get_metadata_prefix(rbpy_core_of(op), kv.keys, kv.lens, (size_t)kv.n, lock, skip, out);
    Py_END_ALLOW_THREADS
    ret = meta_list(out, (Py_ssize_t)m, (Py_ssize_t)m, 0);
done:
    PyMem_Free(out);
    PyMem_Free(skip);
    rbpy_keyvec_free(&kv);
    return ret;
}

PyObject *rbpy_core_exists_inflight(PyObject *op, PyObject *key)
{
    const char *s;
    size_t l;
    if (rbpy_one_key(key, &s, &l) < 0)
        return NULL;
    return PyBool_FromLong(rb_core_exists_inflight(rbpy_core_of(op), s, l));
}

PyObject *rbpy_core_entry_offset(PyObject *op, PyObject *key)
{
    const char *s;
    size_t l;
    if (rbpy_one_key(key, &s, &l) < 0)
        return NULL;
    int64_t off = rb_core_entry_offset(rbpy_core_of(op), s, l);
    if (off < 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(off);
}

PyObject *rbpy_core_lock_refcount(PyObject *op, PyObject *key)
{
    const char *s;
    size_t l;
    if (rbpy_one_key(key, &s, &l) < 0)
        return NULL;
    return PyLong_FromUnsignedLong(rb_core_lock_refcount(rbpy_core_of(op), s, l));
}

PyObject *rbpy_core_snapshot_keys(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
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
    Py_BEGIN_ALLOW_THREADS
        n = rb_core_snapshot_keys(rbpy_core_of(op), limit, &keys, &lens);
    Py_END_ALLOW_THREADS
    if (n < 0)
        return PyErr_NoMemory();
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

/* (extent, keys, hot) of n keys of extent ext, or None when ext is UINT32_MAX; frees each key
 * (not the arrays). */
static PyObject *extent_tuple(int64_t n, char **keys, const size_t *lens, const uint8_t *hot, uint32_t ext)
{
    PyObject *l = PyList_New((Py_ssize_t)n), *h = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; i < n; i++) {
        if (l && h) {
            PyObject *s = PyUnicode_DecodeUTF8(keys[i], (Py_ssize_t)lens[i], "surrogatepass");
            if (!s)
                Py_CLEAR(l);
            else
                PyList_SET_ITEM(l, (Py_ssize_t)i, s);
            PyList_SET_ITEM(h, (Py_ssize_t)i, PyBool_FromLong(hot[i]));
        }
        free(keys[i]);
    }
    if (!l || !h || ext == UINT32_MAX) {
        Py_XDECREF(l);
        Py_XDECREF(h);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(INN)", (unsigned)ext, l, h);
}

/* (extent, keys, hot) of what an extent look returned, or None; frees the C arrays. */
static PyObject *extent_result(int64_t n, char **keys, size_t *lens, uint8_t *hot, uint32_t ext, const char *what)
{
    if (n == -EINVAL) {
        PyErr_Format(PyExc_RuntimeError, "%s needs extents: extent_bytes is 0 (off)", what);
        return NULL;
    }
    if (n < 0)
        return PyErr_NoMemory();
    PyObject *out = extent_tuple(n, keys, lens, hot, ext);
    free(keys);
    free(lens);
    free(hot);
    return out;
}

PyObject *rbpy_core_extent_victim(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    char **keys = NULL;
    size_t *lens = NULL;
    uint8_t *hot = NULL;
    uint32_t ext;
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
        n = rb_core_extent_victim(rbpy_core_of(op), &keys, &lens, &hot, &ext);
    Py_END_ALLOW_THREADS
    return extent_result(n, keys, lens, hot, ext, "extent_victim");
}

/* extent_peek(rank) / extent_take(extent): the argument, a uint32, or -1 with an error set. */
static int64_t extent_arg(PyObject *arg, const char *what)
{
    unsigned long v = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred() || v > UINT32_MAX - 1) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s takes an integer in [0, %u), got %R", what, UINT32_MAX - 1, arg);
        return -1;
    }
    return (int64_t)v;
}

/* The most candidates one extent_peek hands (the evictor weighs a few). */
#define EXTENT_PEEK_MAX 64

/* [(extent, keys, hot), ...] of what rb_core_extent_peek returned (n extents); frees the C
 * arrays. */
static PyObject *peek_result(int64_t n, const uint32_t *exts, const uint32_t *counts, char **keys, size_t *lens,
                             uint8_t *hot)
{
    if (n == -EINVAL) {
        PyErr_SetString(PyExc_RuntimeError, "extent_peek needs extents: extent_bytes is 0 (off)");
        return NULL;
    }
    if (n < 0)
        return PyErr_NoMemory();
    PyObject *out = PyList_New((Py_ssize_t)n);
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t m = counts[i];
        if (out) {
            PyObject *one = extent_tuple(m, keys + at, lens + at, hot + at, exts[i]);
            if (!one)
                Py_CLEAR(out);
            else
                PyList_SET_ITEM(out, (Py_ssize_t)i, one);
        } else {
            for (uint32_t j = 0; j < m; j++)
                free(keys[at + j]);
        }
        at += m;
    }
    free(keys);
    free(lens);
    free(hot);
    return out;
}

PyObject *rbpy_core_extent_peek(PyObject *op, PyObject *arg)
{
    unsigned long want = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred() || want < 1 || want > EXTENT_PEEK_MAX) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "extent_peek takes a count of candidates in [1, %d], got %R", EXTENT_PEEK_MAX,
                     arg);
        return NULL;
    }
    uint32_t exts[EXTENT_PEEK_MAX], counts[EXTENT_PEEK_MAX];
    char **keys = NULL;
    size_t *lens = NULL;
    uint8_t *hot = NULL;
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
        n = rb_core_extent_peek(rbpy_core_of(op), (uint32_t)want, exts, counts, &keys, &lens, &hot);
    Py_END_ALLOW_THREADS
    return peek_result(n, exts, counts, keys, lens, hot);
}

PyObject *rbpy_core_extent_take(PyObject *op, PyObject *arg)
{
    int64_t which = extent_arg(arg, "extent_take");
    if (which < 0)
        return NULL;
    char **keys = NULL;
    size_t *lens = NULL;
    uint8_t *hot = NULL;
    uint32_t ext;
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
        n = rb_core_extent_take(rbpy_core_of(op), (uint32_t)which, &keys, &lens, &hot, &ext);
    Py_END_ALLOW_THREADS
    return extent_result(n, keys, lens, hot, ext, "extent_take");
}

/* A list of the str of each key in k (None when list is 0); frees k's keys. */
static PyObject *keys_list(rb_keys *k, int list)
{
    PyObject *l = list ? PyList_New((Py_ssize_t)k->n) : Py_NewRef(Py_None);
    for (size_t i = 0; list && l && i < k->n; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(k->keys[i], (Py_ssize_t)k->lens[i], "surrogatepass");
        if (!s)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, (Py_ssize_t)i, s);
    }
    rb_keys_free(k);
    return l;
}

/* extent_evict's arguments (a: reserve, batch, keep_hot, keys, reclaim; NULL when not given)
 * into n (reserve, batch) and *flags: 0, or -1 with an error set. */
static int evict_args(PyObject *const *a, const char *const *names, unsigned long n[2], int *flags)
{
    static const int bits[] = {0, 0, RB_EVICT_KEEP_HOT, RB_EVICT_KEYS, RB_EVICT_RECLAIM};
    n[0] = 0;
    n[1] = 1;
    for (int i = 0; i < 2; i++) {
        if (!a[i])
            continue;
        n[i] = PyLong_AsUnsignedLong(a[i]);
        if (PyErr_Occurred() || n[i] > UINT32_MAX) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "extent_evict takes a %s in [0, %u], got %R", names[i], UINT32_MAX, a[i]);
            return -1;
        }
    }
    *flags = 0;
    for (int i = 2; i < 5; i++) {
        int on = a[i] ? PyObject_IsTrue(a[i]) : 0;
        if (on < 0)
            return -1;
        *flags |= on ? bits[i] : 0;
    }
    return 0;
}

PyObject *rbpy_core_extent_evict(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"reserve", "batch", "keep_hot", "keys", "reclaim"};
    PyObject *a[5];
    unsigned long n[2];
    int flags;
    if (rbpy_unpack("extent_evict", names, 5, 1, args, nargs, kwnames, a) < 0 || evict_args(a, names, n, &flags) < 0)
        return NULL;
    rb_evict_pass out;
    rb_core_status st;
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = rb_core_extent_evict(rbpy_core_of(op), (uint32_t)n[0], (uint32_t)n[1], flags, &out, &err);
        rb_core_counts_get(rbpy_core_of(op), &st);
    Py_END_ALLOW_THREADS
    PyObject *gone = keys_list(&out.gone, flags & RB_EVICT_KEYS);
    PyObject *hot = keys_list(&out.hot, 1);
    if (rc < 0 && out.extents == 0 && out.deleted == 0) { /* nothing deleted a caller must hear of */
        Py_XDECREF(gone);
        Py_XDECREF(hot);
        return rbpy_raise_err(&err);
    }
    PyObject *error = rc < 0 ? rbpy_err_object(&err) : Py_NewRef(Py_None);
    PyObject *counts = rbpy_counts_tuple(&st);
    if (!gone || !hot || !error || !counts) {
        Py_XDECREF(gone);
        Py_XDECREF(hot);
        Py_XDECREF(error);
        Py_XDECREF(counts);
        return NULL;
    }
    return Py_BuildValue("(IKNNKiNN)", (unsigned)out.extents, (unsigned long long)out.deleted, gone, hot,
                         (unsigned long long)out.opened, out.reclaimed, counts, error);
}
