/*
 * core_obs.c - a _native.Core's histograms and miss counters (csrc/core/rb_hist.h) as a
 * snapshot dict, and the switch that turns their recording off and on.
 */
#include "core.h"

#include "../core/rb_hist.h"

/* GIL held: one histogram as {"count", "sum", "buckets": [(upper, count), ...]}, the buckets
 * that hold samples only, upper exclusive. A new dict, or NULL with an exception set. */
static PyObject *hist_dict(rb_obs *o, int id)
{
    rb_hist_snap s;
    rb_obs_read_hist(o, id, &s);
    PyObject *bl = PyList_New(0);
    for (unsigned i = 0; bl && i < RB_HIST_N; i++) {
        if (!s.b[i])
            continue;
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)rb_hist_upper(i), (unsigned long long)s.b[i]);
        if (!t || PyList_Append(bl, t) < 0)
            Py_CLEAR(bl);
        Py_XDECREF(t);
    }
    if (!bl)
        return NULL;
    return Py_BuildValue("{s:K,s:K,s:N}", "count", (unsigned long long)s.count, "sum", (unsigned long long)s.sum,
                         "buckets", bl);
}

/* GIL held: name -> count of the n counters of o from 0 into a new dict, or NULL with an
 * exception set. */
static PyObject *counts_dict(rb_obs *o, const char *const *names, int n)
{
    PyObject *d = PyDict_New();
    for (int k = 0; d && k < n; k++) {
        PyObject *x = PyLong_FromUnsignedLongLong(rb_obs_read_count(o, k));
        if (!x || PyDict_SetItemString(d, names[k], x) < 0)
            Py_CLEAR(d);
        Py_XDECREF(x);
    }
    return d;
}

/* histograms() -> {"enabled", "histograms": {name: hist_dict}, "misses": {reason: n}, "hits",
 * "deleted", "inflight_bytes", "peak_inflight_bytes"}. */
PyObject *rbpy_core_histograms(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_obs *o = rb_core_obs(rbpy_core_of(op));
    if (!o) {
        PyErr_SetString(PyExc_RuntimeError, "RawBlockCore is closed");
        return NULL;
    }
    PyObject *hs = PyDict_New();
    for (int k = 0; hs && k < RB_H_COUNT; k++) {
        PyObject *h = hist_dict(o, k);
        if (!h || PyDict_SetItemString(hs, rb_hist_names[k], h) < 0)
            Py_CLEAR(hs);
        Py_XDECREF(h);
    }
    PyObject *ms = hs ? counts_dict(o, rb_miss_names, RB_MISS_COUNT) : NULL;
    if (!ms) {
        Py_XDECREF(hs);
        return NULL;
    }
#define RD(f) (unsigned long long)atomic_load_explicit(&o->f, memory_order_relaxed)
    return Py_BuildValue("{s:O,s:N,s:N,s:K,s:K,s:K,s:K}", "enabled", atomic_load(&o->off) ? Py_False : Py_True,
                         "histograms", hs, "misses", ms, "hits", (unsigned long long)rb_obs_read_count(o, RB_OBS_HITS),
                         "deleted", (unsigned long long)rb_obs_read_count(o, RB_OBS_DELETED), "inflight_bytes",
                         RD(inflight_bytes), "peak_inflight_bytes", RD(peak_inflight_bytes));
#undef RD
}

/* load_queue() -> (read_pending_bytes, write_pending_bytes, inflight_bytes, read_completed_bytes,
 * write_completed_bytes): the bytes of reads and writes submitted to the io_uring scheduler and not
 * finished (0 under posix), the bytes of loads and puts in this core's calls now (every engine),
 * and the device's lifetime completed bytes per direction. Lock-free: a load estimate reads it
 * per lookup. */
PyObject *rbpy_core_load_queue(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_core *c = rbpy_core_of(op);
    rb_dev *dev = rb_core_device(c);
    rb_obs *o = rb_core_obs(c);
    if (!dev || !o) {
        PyErr_SetString(PyExc_RuntimeError, "RawBlockCore is closed");
        return NULL;
    }
    rb_stats_snapshot s;
    rb_dev_stats_read(dev, &s);
    return Py_BuildValue("(KKKKK)", (unsigned long long)s.read_pending_bytes, (unsigned long long)s.write_pending_bytes,
                         (unsigned long long)atomic_load_explicit(&o->inflight_bytes, memory_order_relaxed),
                         (unsigned long long)s.read_completed_bytes, (unsigned long long)s.write_completed_bytes);
}

/* set_histograms(on): record (True, the default) or not. */
PyObject *rbpy_core_set_histograms(PyObject *op, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    rb_obs *o = rb_core_obs(rbpy_core_of(op));
    if (!o) {
        PyErr_SetString(PyExc_RuntimeError, "RawBlockCore is closed");
        return NULL;
    }
    atomic_store(&o->off, !on);
    Py_RETURN_NONE;
}

/* _recording_cost_ns(iterations, keys, uring=True) -> ns: what recording costs one load call of
 * keys keys (rb_hist_recording_cost; uring: with an io_uring batch's stamps), timed over
 * iterations calls without the GIL. */
PyObject *rbpy_core_recording_cost(PyObject *op, PyObject *args)
{
    (void)op;
    unsigned iters, keys;
    int uring = 1;
    if (!PyArg_ParseTuple(args, "II|p:_recording_cost_ns", &iters, &keys, &uring))
        return NULL;
    if (iters == 0 || keys == 0 || keys > 1u << 20) {
        PyErr_Format(PyExc_ValueError, "_recording_cost_ns: iterations and keys must be >= 1 (keys <= %u), got %u, %u",
                     1u << 20, iters, keys);
        return NULL;
    }
    uint64_t ns = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = rb_hist_recording_cost(iters, keys, uring, &ns);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return PyErr_Format(PyExc_RuntimeError, "_recording_cost_ns failed: errno %d", -rc);
    return PyLong_FromUnsignedLongLong(ns);
}
