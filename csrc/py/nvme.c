/*
 * nvme.c - _native.nvme_fdp_report(path): what an operator needs to see of an NVMe namespace
 * before pointing the cache at it with FDP placement (the data of `fdp-status`).
 */
#include "rbpy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "../core/rb_nvme.h"

/* d[keys[i]] = PyLong(v[i]) for i < n; 0 or -1. */
static int put_u64s(PyObject *d, const char *const *keys, const unsigned long long *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        PyObject *o = PyLong_FromUnsignedLongLong(v[i]);
        int rc = o ? PyDict_SetItemString(d, keys[i], o) : -1;
        Py_XDECREF(o);
        if (rc < 0)
            return -1;
    }
    return 0;
}

#define NKEYS(keys) (sizeof(keys) / sizeof((keys)[0]))

/* A new dict {keys[i]: v[i]}, or NULL with an exception set. */
static PyObject *u64_dict(const char *const *keys, const unsigned long long *v, size_t n)
{
    PyObject *d = PyDict_New();
    if (d && put_u64s(d, keys, v, n) < 0)
        Py_CLEAR(d);
    return d;
}

/* d[key] = o (a new reference, stolen; NULL fails); 0 or -1. */
static int put_new(PyObject *d, const char *key, PyObject *o)
{
    int rc = o ? PyDict_SetItemString(d, key, o) : -1;
    Py_XDECREF(o);
    return rc;
}

/* fdp-status's FDP configuration: index, fdpa, nrg, nruh, maxpids, nnss, runs; None without. */
static PyObject *fdp_config_dict(const rb_nvme_fdp *fi)
{
    static const char *const keys[] = {"index", "fdpa", "nrg", "nruh", "maxpids", "nnss", "runs"};
    if (!fi->have_config)
        Py_RETURN_NONE;
    const unsigned long long v[] = {fi->config_index, fi->fdpa, fi->nrg, fi->nruh, fi->maxpids, fi->nnss, fi->runs};
    return u64_dict(keys, v, NKEYS(keys));
}

/* The FDP statistics (hbmw, mbmw, mbe bytes), or None when the log was not read. */
static PyObject *fdp_stats_dict(int have, uint64_t hbmw, uint64_t mbmw, uint64_t mbe)
{
    static const char *const keys[] = {"hbmw", "mbmw", "mbe"};
    if (!have)
        Py_RETURN_NONE;
    const unsigned long long v[] = {hbmw, mbmw, mbe};
    return u64_dict(keys, v, NKEYS(keys));
}

/* The reclaim unit handles: [{pid, ruhid, earutr, ruamw}, ...] (empty when not read). */
static PyObject *ruh_dicts(const rb_nvme_ruh *ruh, size_t nruh, int have_ruh)
{
    static const char *const keys[] = {"pid", "ruhid", "earutr", "ruamw"};
    PyObject *ruhs = PyList_New(0);
    for (size_t i = 0; ruhs && have_ruh && i < nruh; i++) {
        const unsigned long long v[] = {ruh[i].pid, ruh[i].ruhid, ruh[i].earutr, ruh[i].ruamw};
        PyObject *e = u64_dict(keys, v, NKEYS(keys));
        if (!e || PyList_Append(ruhs, e) < 0)
            Py_CLEAR(ruhs);
        Py_XDECREF(e);
    }
    return ruhs;
}

static PyObject *report_dict(const rb_nvme_ns *ns, const rb_nvme_fdp *fi, const rb_nvme_ruh *ruh, size_t nruh,
                             int have_ruh)
{
    static const char *const keys[] = {"nsid", "lba_size", "size_bytes", "endgid"};
    const unsigned long long v[] = {ns->nsid, ns->lba_size, ns->nsze << ns->lba_shift, ns->endgid};
    PyObject *d = u64_dict(keys, v, NKEYS(keys));
    if (d && (PyDict_SetItemString(d, "fdp_enabled", fi->enabled ? Py_True : Py_False) < 0 ||
              put_new(d, "config", fdp_config_dict(fi)) < 0 ||
              put_new(d, "stats", fdp_stats_dict(fi->have_stats, fi->hbmw, fi->mbmw, fi->mbe)) < 0 ||
              put_new(d, "ruhs", ruh_dicts(ruh, nruh, have_ruh)) < 0))
        Py_CLEAR(d);
    return d;
}

/*
 * Open path read-only and run fn on it with the GIL released; 0, or -1 with the exception set
 * (OSError naming the path; ValueError when the device answers the NVMe ioctls with ENOTTY).
 */
static int run_on_namespace(PyObject *path, int (*fn)(int fd, void *ctx, rb_err *err), void *ctx)
{
    PyObject *bpath = NULL;
    if (!PyUnicode_FSConverter(path, &bpath))
        return -1;
    const char *p = PyBytes_AS_STRING(bpath);
    rb_err err;
    rb_err_clear(&err);
    int rc, fd;
    Py_BEGIN_ALLOW_THREADS
        fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) {
            rc = rb_err_set(&err, RB_ERR_OS, errno, "open failed");
        } else {
            rc = fn(fd, ctx, &err);
            close(fd);
        }
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        if (err.errnum == ENOTTY && (err.kind == RB_ERR_OS || err.kind == RB_ERR_VALUE))
            rb_err_set(&err, RB_ERR_VALUE, ENOTTY, "'%s' is not an NVMe namespace (the NVMe ioctls are not supported)",
                       p);
        rbpy_raise_err_path(&err, bpath);
    }
    Py_DECREF(bpath);
    return rc < 0 ? -1 : 0;
}

typedef struct fdp_report {
    rb_nvme_ns ns;
    rb_nvme_fdp fi;
    rb_nvme_ruh *ruh;
    size_t nruh;
    int have_ruh;
} fdp_report;

static int read_fdp_report(int fd, void *ctx, rb_err *err)
{
    fdp_report *r = ctx;
    int rc = rb_nvme_identify(fd, &r->ns, err);
    if (rc == 0)
        rc = rb_nvme_fdp_info(fd, &r->ns, &r->fi, err);
    if (rc == 0 && r->fi.enabled) {
        rb_err ignore;
        r->have_ruh = rb_nvme_ruh_status(fd, r->ns.nsid, &r->ruh, &r->nruh, &ignore) == 0;
    }
    return rc;
}

PyObject *rbpy_nvme_fdp_report(PyObject *mod, PyObject *path)
{
    (void)mod;
    fdp_report r = {0};
    if (run_on_namespace(path, read_fdp_report, &r) < 0) {
        free(r.ruh);
        return NULL;
    }
    PyObject *d = report_dict(&r.ns, &r.fi, r.ruh, r.nruh, r.have_ruh);
    free(r.ruh);
    return d;
}

/* The FDP events: {host, controller, by_type: {type: count}}, or None when not read. */
static PyObject *fdp_events_dict(const rb_nvme_wear *w)
{
    static const char *const keys[] = {"host", "controller"};
    if (!w->have_fdp_events)
        Py_RETURN_NONE;
    const unsigned long long v[] = {w->events_host, w->events_controller};
    PyObject *events = u64_dict(keys, v, NKEYS(keys)), *types = events ? PyDict_New() : NULL;
    for (int t = 0; types && t < 256; t++) {
        if (!w->event_types[t])
            continue;
        PyObject *k = PyLong_FromLong(t), *n = PyLong_FromUnsignedLong(w->event_types[t]);
        if (!k || !n || PyDict_SetItem(types, k, n) < 0)
            Py_CLEAR(types);
        Py_XDECREF(k);
        Py_XDECREF(n);
    }
    if (events && put_new(events, "by_type", types) < 0)
        Py_CLEAR(events);
    return events;
}

/* _native.nvme_wear_counters(path): the SMART / FDP wear counters (see rb_nvme_wear). */
static PyObject *wear_dict(const rb_nvme_wear *w)
{
    static const char *const keys[] = {"nsid", "endgid"};
    const unsigned long long v[] = {w->nsid, w->endgid};
    static const char *const smart_keys[] = {"data_units_written", "data_units_read", "host_write_commands",
                                             "host_read_commands"};
    const unsigned long long smart[] = {w->data_units_written, w->data_units_read, w->host_write_commands,
                                        w->host_read_commands};
    PyObject *d = u64_dict(keys, v, NKEYS(keys));
    if (d && (PyDict_SetItemString(d, "fdp_enabled", w->fdp_enabled ? Py_True : Py_False) < 0 ||
              put_new(d, "smart", u64_dict(smart_keys, smart, NKEYS(smart_keys))) < 0 ||
              put_new(d, "fdp_stats", fdp_stats_dict(w->have_fdp_stats, w->hbmw, w->mbmw, w->mbe)) < 0 ||
              put_new(d, "fdp_events", fdp_events_dict(w)) < 0))
        Py_CLEAR(d);
    return d;
}

static int read_wear(int fd, void *ctx, rb_err *err)
{
    return rb_nvme_wear_counters(fd, ctx, err);
}

PyObject *rbpy_nvme_wear_counters(PyObject *mod, PyObject *path)
{
    (void)mod;
    rb_nvme_wear *w = malloc(sizeof(*w));
    if (!w)
        return PyErr_NoMemory();
    if (run_on_namespace(path, read_wear, w) < 0) {
        free(w);
        return NULL;
    }
    PyObject *d = wear_dict(w);
    free(w);
    return d;
}
