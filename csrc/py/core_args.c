/*
 * core_args.c - the argument converters the _native.Core methods share: the key list
 * snapshot (keyvec), one key, sequences as tuples, and the small lists results are built of.
 */
#include "core.h"

#include <string.h>

void rbpy_keyvec_free(keyvec *kv)
{
    PyMem_Free(kv->keys);
    Py_XDECREF(kv->tuple);
    memset(kv, 0, sizeof(*kv));
}

/* The keys are snapshotted into a tuple (the C side may run without the GIL while another
 * thread mutates the caller's list); ASCII str keys are used in place, without the UTF-8 call. */
int rbpy_keyvec_from(PyObject *seq, keyvec *kv)
{
    memset(kv, 0, sizeof(*kv));
    kv->tuple = PySequence_Tuple(seq);
    if (!kv->tuple)
        return -1;
    kv->n = PyTuple_GET_SIZE(kv->tuple);
    size_t n = kv->n ? (size_t)kv->n : 1;
    kv->keys = PyMem_Malloc(n * (sizeof(char *) + sizeof(size_t)));
    if (!kv->keys) {
        rbpy_keyvec_free(kv);
        PyErr_NoMemory();
        return -1;
    }
    kv->lens = (size_t *)(kv->keys + n);
    PyObject **items = &PyTuple_GET_ITEM(kv->tuple, 0);
    for (Py_ssize_t i = 0; i < kv->n; i++) {
        PyObject *k = items[i];
        if (!PyUnicode_Check(k)) {
            PyErr_Format(PyExc_TypeError, "encoded keys must be str, got %.100s", Py_TYPE(k)->tp_name);
            rbpy_keyvec_free(kv);
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
            rbpy_keyvec_free(kv);
            return -1;
        }
        kv->lens[i] = (size_t)l;
    }
    return 0;
}

PyObject *rbpy_bool_list(const uint8_t *r, Py_ssize_t n)
{
    PyObject *l = PyList_New(n);
    if (!l)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(l, i, Py_NewRef(r[i] ? Py_True : Py_False));
    return l;
}

PyObject *rbpy_i64_list(const int64_t *v, int64_t n)
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

const char *rbpy_opt_str(PyObject *o, size_t *len)
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

int rbpy_one_key(PyObject *k, const char **s, size_t *len)
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

/* PySequence_Fast(o, what) as a tuple: a list is copied, so the items stay alive and in place
 * while conversions run Python code (which may change a caller's list) and while the core
 * reads borrowed data without the GIL. */
PyObject *rbpy_fast_tuple(PyObject *o, const char *what)
{
    PyObject *t = PySequence_Fast(o, what);
    if (t && PyList_Check(t))
        Py_SETREF(t, PyList_AsTuple(t));
    return t;
}
