/*
 * core_admin.c - _native.Core's checkpoint and state calls (checkpoint_now, compact_metadata,
 * apply_state_json, fixed buffers, the deallocation journal) and its test and benchmark hooks.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

#include "../core/rb_core_ident.h"
#include "../core/rb_uring.h"

/* ---- checkpoint / state ---------------------------------------------------------------- */

PyObject *rbpy_core_checkpoint_now(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
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
    Py_BEGIN_ALLOW_THREADS
        rc = rb_core_checkpoint(rbpy_core_of(op), force, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return rbpy_raise_err(&err);
    return PyBool_FromLong(rc > 0);
}

/* fn(core, &err) without the GIL: its result as result() makes it (PyBool_FromLong: True when
 * it wrote something), its error raised. */
static PyObject *metadata_call(PyObject *op, int (*fn)(rb_core *, rb_err *), PyObject *(*result)(long))
{
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fn(rbpy_core_of(op), &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return rbpy_raise_err(&err);
    return result(rc);
}

PyObject *rbpy_core_release_held_slots(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    return metadata_call(op, rb_core_release_held, PyBool_FromLong);
}

PyObject *rbpy_core_reclaim_held_slots(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    return metadata_call(op, rb_core_reclaim, PyLong_FromLong);
}

PyObject *rbpy_core_compact_metadata(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    return metadata_call(op, rb_core_compact, PyBool_FromLong);
}

/* A hook that takes one truth value: fn(core, bool(arg)). */
static PyObject *set_flag(PyObject *op, PyObject *arg, void (*fn)(rb_core *, int))
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    fn(rbpy_core_of(op), on);
    Py_RETURN_NONE;
}

PyObject *rbpy_core_set_dealloc_log(PyObject *op, PyObject *arg)
{
    return set_flag(op, arg, rb_core_dealloc_log_set);
}

PyObject *rbpy_core_discard_force_ioctl(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    rb_core_discard_force_ioctl(rbpy_core_of(op));
    Py_RETURN_NONE;
}

PyObject *rbpy_core_free_lane_off(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    rb_core_free_lane_off(rbpy_core_of(op));
    Py_RETURN_NONE;
}

PyObject *rbpy_core_take_dealloc_log(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    uint64_t *r = NULL;
    size_t n = rb_core_dealloc_log_take(rbpy_core_of(op), &r);
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
    Py_BEGIN_ALLOW_THREADS
        rc = rb_core_apply_state_json_ex(rbpy_core_of(op), b.buf, (size_t)b.len, generic, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (rc < 0)
        return rbpy_raise_err(&err);
    return Py_BuildValue("(Os)", rc > 0 ? Py_True : Py_False, rc > 0 ? "" : err.msg);
}

PyObject *rbpy_core_apply_state_json(PyObject *op, PyObject *arg)
{
    return apply_state_json(op, arg, 0);
}

PyObject *rbpy_core_apply_state_json_generic(PyObject *op, PyObject *arg)
{
    return apply_state_json(op, arg, 1);
}

/* _inject_engine_fault(kinds): test hook, RB_URING_FAULT_* bits (1 submit, 2 reap). */
PyObject *rbpy_core_inject_engine_fault(PyObject *op, PyObject *arg)
{
    long kinds = PyLong_AsLong(arg);
    if (kinds == -1 && PyErr_Occurred())
        return NULL;
    rb_dev *dev = rb_core_device(rbpy_core_of(op));
    if (!dev || rb_dev_enter(dev) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "device is closed");
        return NULL;
    }
    struct rb_uring *u = rb_dev_uring(dev);
    if (u)
        rb_uring_inject_fault(u, (int)kinds);
    rb_dev_leave(dev);
    int ok = u != NULL;
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "_inject_engine_fault needs io_engine='io_uring'");
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *rbpy_core_io_scheduler(PyObject *op, PyObject *unused)
{
    (void)unused;
    return rbpy_engine_sched(rb_core_device(rbpy_core_of(op)));
}

PyObject *rbpy_core_hold_engine(PyObject *op, PyObject *arg)
{
    return rbpy_engine_hold(rb_core_device(rbpy_core_of(op)), arg);
}

PyObject *rbpy_core_fail_engine_write(PyObject *op, PyObject *arg)
{
    return rbpy_engine_fail_write(rb_core_device(rbpy_core_of(op)), arg);
}

PyObject *rbpy_core_trace_engine(PyObject *op, PyObject *arg)
{
    return rbpy_engine_trace(rb_core_device(rbpy_core_of(op)), arg);
}

PyObject *rbpy_core_register_buffers(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
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
    Py_BEGIN_ALLOW_THREADS
        rc = rb_core_register_buffers(rbpy_core_of(op), ptrs, sizes, (size_t)n, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        rbpy_raise_err(&err);
    else
        ret = Py_NewRef(Py_None);
done:
    PyMem_Free(ptrs);
    PyMem_Free(sizes);
    Py_XDECREF(pl);
    Py_XDECREF(sl);
    return ret;
}

/* _set_metadata_shortcut(cls, descr, attr) or (None, None, None): see rbpy_metadata_of. The facade
 * passes LMCache's TensorMemoryObj, its metadata property and "meta" only after checking that
 * the property's code is `with self.lock: return self.meta`. */
PyObject *rbpy_core_set_metadata_shortcut(PyObject *op, PyObject *const *args, Py_ssize_t nargs)
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

PyObject *rbpy_core_revalidate(PyObject *op, PyObject *arg)
{
    int seq = PyObject_IsTrue(arg);
    if (seq < 0)
        return NULL;
    uint64_t dropped = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = rb_core_revalidate(rbpy_core_of(op), seq, &dropped);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return PyErr_NoMemory();
    return PyLong_FromUnsignedLongLong(dropped);
}

PyObject *rbpy_core_mem_bytes(PyObject *op, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSize_t(rb_core_mem_bytes(rbpy_core_of(op)));
}

PyObject *rbpy_core_inject_fault(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
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
    rb_core_inject_fault(rbpy_core_of(op), k, n);
    Py_RETURN_NONE;
}

/* Test hooks that pause a core operation for arg milliseconds. */
static PyObject *set_delay(PyObject *op, PyObject *arg, void (*set)(rb_core *, uint32_t))
{
    unsigned long ms = PyLong_AsUnsignedLong(arg);
    if (ms == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    set(rbpy_core_of(op), (uint32_t)ms);
    Py_RETURN_NONE;
}

PyObject *rbpy_core_set_ckpt_delay(PyObject *op, PyObject *arg)
{
    return set_delay(op, arg, rb_core_set_ckpt_delay_ms);
}

/* _set_load_check_off(bool): benchmark hook, loads of verified records skip the header check. */
PyObject *rbpy_core_set_load_check_off(PyObject *op, PyObject *arg)
{
    return set_flag(op, arg, rb_core_set_load_check_off);
}

PyObject *rbpy_core_set_ckpt_no_flush(PyObject *op, PyObject *arg)
{
    return set_flag(op, arg, rb_core_set_ckpt_no_flush);
}

PyObject *rbpy_core_set_load_delay(PyObject *op, PyObject *arg)
{
    return set_delay(op, arg, rb_core_set_load_delay_ms);
}

PyObject *rbpy_core_identity(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)mod;
    static const char *const names[] = {"key", "namespace"};
    PyObject *a[2];
    if (rbpy_unpack("_key_identity", names, 2, 2, args, nargs, kwnames, a) < 0)
        return NULL;
    const char *s;
    size_t l;
    if (rbpy_one_key(a[0], &s, &l) < 0)
        return NULL;
    const char *ns = PyUnicode_Check(a[1]) ? PyUnicode_AsUTF8(a[1]) : "";
    uint64_t v;
    if (rb_key_identity(strcmp(ns, "legacy") == 0 ? RB_NS_LEGACY : RB_NS_OBJECT, s, l, &v) < 0) {
        PyErr_SetString(PyExc_ValueError, "key does not parse as a legacy key");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(v);
}
