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

/* d[key] = PyLong(v); 0 or -1. */
static int put_u64(PyObject *d, const char *key, unsigned long long v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    if (!o)
        return -1;
    int rc = PyDict_SetItemString(d, key, o);
    Py_DECREF(o);
    return rc;
}

static PyObject *report_dict(const rb_nvme_ns *ns, const rb_nvme_fdp *fi, const rb_nvme_ruh *ruh, size_t nruh,
                             int have_ruh)
{
    PyObject *d = PyDict_New(), *config = NULL, *stats = NULL, *ruhs = NULL;
    if (!d)
        return NULL;
    if (put_u64(d, "nsid", ns->nsid) < 0 || put_u64(d, "lba_size", ns->lba_size) < 0 ||
        put_u64(d, "size_bytes", ns->nsze << ns->lba_shift) < 0 || put_u64(d, "endgid", ns->endgid) < 0 ||
        PyDict_SetItemString(d, "fdp_enabled", fi->enabled ? Py_True : Py_False) < 0)
        goto fail;
    if (fi->have_config) {
        if (!(config = PyDict_New()) || put_u64(config, "index", fi->config_index) < 0 ||
            put_u64(config, "fdpa", fi->fdpa) < 0 || put_u64(config, "nrg", fi->nrg) < 0 ||
            put_u64(config, "nruh", fi->nruh) < 0 || put_u64(config, "maxpids", fi->maxpids) < 0 ||
            put_u64(config, "nnss", fi->nnss) < 0 || put_u64(config, "runs", fi->runs) < 0)
            goto fail;
    }
    if (PyDict_SetItemString(d, "config", config ? config : Py_None) < 0)
        goto fail;
    if (fi->have_stats) {
        if (!(stats = PyDict_New()) || put_u64(stats, "hbmw", fi->hbmw) < 0 || put_u64(stats, "mbmw", fi->mbmw) < 0 ||
            put_u64(stats, "mbe", fi->mbe) < 0)
            goto fail;
    }
    if (PyDict_SetItemString(d, "stats", stats ? stats : Py_None) < 0)
        goto fail;
    if (!(ruhs = PyList_New(0)))
        goto fail;
    for (size_t i = 0; have_ruh && i < nruh; i++) {
        PyObject *e = PyDict_New();
        if (!e)
            goto fail;
        int bad = put_u64(e, "pid", ruh[i].pid) < 0 || put_u64(e, "ruhid", ruh[i].ruhid) < 0 ||
                  put_u64(e, "earutr", ruh[i].earutr) < 0 || put_u64(e, "ruamw", ruh[i].ruamw) < 0 ||
                  PyList_Append(ruhs, e) < 0;
        Py_DECREF(e);
        if (bad)
            goto fail;
    }
    if (PyDict_SetItemString(d, "ruhs", ruhs) < 0)
        goto fail;
    Py_XDECREF(config);
    Py_XDECREF(stats);
    Py_DECREF(ruhs);
    return d;
fail:
    Py_XDECREF(config);
    Py_XDECREF(stats);
    Py_XDECREF(ruhs);
    Py_DECREF(d);
    return NULL;
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
    Py_BEGIN_ALLOW_THREADS fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        rc = rb_err_set(&err, RB_ERR_OS, errno, "open failed");
    } else {
        rc = fn(fd, ctx, &err);
        close(fd);
    }
    Py_END_ALLOW_THREADS if (rc < 0)
    {
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

/* _native.nvme_wear_counters(path): the SMART / FDP wear counters (see rb_nvme_wear). */
static PyObject *wear_dict(const rb_nvme_wear *w)
{
    PyObject *d = PyDict_New(), *smart = NULL, *stats = NULL, *events = NULL, *types = NULL;
    if (!d)
        return NULL;
    if (put_u64(d, "nsid", w->nsid) < 0 || put_u64(d, "endgid", w->endgid) < 0 ||
        PyDict_SetItemString(d, "fdp_enabled", w->fdp_enabled ? Py_True : Py_False) < 0)
        goto fail;
    if (!(smart = PyDict_New()) || put_u64(smart, "data_units_written", w->data_units_written) < 0 ||
        put_u64(smart, "data_units_read", w->data_units_read) < 0 ||
        put_u64(smart, "host_write_commands", w->host_write_commands) < 0 ||
        put_u64(smart, "host_read_commands", w->host_read_commands) < 0 || PyDict_SetItemString(d, "smart", smart) < 0)
        goto fail;
    if (w->have_fdp_stats) {
        if (!(stats = PyDict_New()) || put_u64(stats, "hbmw", w->hbmw) < 0 || put_u64(stats, "mbmw", w->mbmw) < 0 ||
            put_u64(stats, "mbe", w->mbe) < 0)
            goto fail;
    }
    if (PyDict_SetItemString(d, "fdp_stats", stats ? stats : Py_None) < 0)
        goto fail;
    if (w->have_fdp_events) {
        if (!(events = PyDict_New()) || put_u64(events, "host", w->events_host) < 0 ||
            put_u64(events, "controller", w->events_controller) < 0 || !(types = PyDict_New()))
            goto fail;
        for (int t = 0; t < 256; t++) {
            if (!w->event_types[t])
                continue;
            PyObject *k = PyLong_FromLong(t), *v = PyLong_FromUnsignedLong(w->event_types[t]);
            int bad = !k || !v || PyDict_SetItem(types, k, v) < 0;
            Py_XDECREF(k);
            Py_XDECREF(v);
            if (bad)
                goto fail;
        }
        if (PyDict_SetItemString(events, "by_type", types) < 0)
            goto fail;
    }
    if (PyDict_SetItemString(d, "fdp_events", events ? events : Py_None) < 0)
        goto fail;
    Py_DECREF(smart);
    Py_XDECREF(stats);
    Py_XDECREF(events);
    Py_XDECREF(types);
    return d;
fail:
    Py_XDECREF(smart);
    Py_XDECREF(stats);
    Py_XDECREF(events);
    Py_XDECREF(types);
    Py_DECREF(d);
    return NULL;
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
