/*
 * core_payload.c - payload objects of put_many / load_many_into as plain buffers: the buffer
 * protocol, byte_array, or a registered MemoryObj read through raw_data (its storage checked).
 */
#include "core.h"

#include <string.h>

/* The registered class, if its byte_array is still the one registered (checked per call). */
PyTypeObject *rbpy_memobj_fast_type(rbpy_state *st)
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

int rbpy_payload_get(rbpy_state *st, PyTypeObject *fast, PyObject *o, Py_ssize_t i, int writable, payload *p)
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

void rbpy_payload_release(payload *p)
{
    if (p->view.obj)
        PyBuffer_Release(&p->view);
    Py_CLEAR(p->keep);
}
