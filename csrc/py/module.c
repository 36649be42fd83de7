/*
 * module.c - the lmcache_rawblock._native module: multi-phase init, module state, the one
 * place where core errors become Python exceptions, and small argument helpers.
 */
#include "rbpy.h"

#include <errno.h>
#include <string.h>
#include <xxhash.h>

#include "../core/rb_probe.h"
#include "../core/rb_wlog.h"

static struct PyModuleDef rbpy_module;

rbpy_state *rbpy_state_of_type(PyTypeObject *tp)
{
    PyObject *mod = PyType_GetModuleByDef(tp, &rbpy_module);
    return mod ? (rbpy_state *)PyModule_GetState(mod) : NULL;
}

PyObject *rbpy_text(const char *s)
{
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "backslashreplace");
}

PyObject *rbpy_err_object(const rb_err *err)
{
    PyObject *msg = rbpy_text(err->kind == RB_ERR_RUNTIME && !err->msg[0] ? "internal error" : err->msg);
    if (!msg)
        return NULL;
    PyObject *exc;
    switch (err->kind) {
    case RB_ERR_OS:
        exc = PyObject_CallFunction(PyExc_OSError, "iO", err->errnum, msg);
        break;
    case RB_ERR_VALUE:
        exc = PyObject_CallOneArg(PyExc_ValueError, msg);
        break;
    case RB_ERR_NOMEM:
        exc = PyObject_CallNoArgs(PyExc_MemoryError);
        break;
    case RB_ERR_RUNTIME:
    default:
        exc = PyObject_CallOneArg(PyExc_RuntimeError, msg);
        /* its errno as an attribute: callers tell no free slot (ENOSPC) or a key being stored
         * (EBUSY) from a device's fault (EIO, ESHUTDOWN) */
        if (exc && err->errnum) {
            PyObject *no = PyLong_FromLong(err->errnum);
            if (!no || PyObject_SetAttrString(exc, "errno", no) < 0)
                Py_CLEAR(exc);
            Py_XDECREF(no);
        }
        break;
    }
    Py_DECREF(msg);
    return exc;
}

PyObject *rbpy_raise_err(const rb_err *err)
{
    if (err->kind == RB_ERR_NOMEM)
        return PyErr_NoMemory();
    /* OSError(errno, msg): CPython picks the errno subclass (FileNotFoundError, ...). The text
     * is decoded leniently: a message cut inside a path's multibyte character must not turn
     * into a UnicodeDecodeError. */
    PyObject *exc = rbpy_err_object(err);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

PyObject *rbpy_raise_err_path(const rb_err *err, PyObject *path)
{
    if (err->kind != RB_ERR_OS || !path)
        return rbpy_raise_err(err);
    /* OSError(errno, msg, filename): str() shows the path, strerror stays the message. */
    PyObject *name = PyBytes_Check(path)
                         ? PyUnicode_DecodeFSDefaultAndSize(PyBytes_AS_STRING(path), PyBytes_GET_SIZE(path))
                         : Py_NewRef(path);
    if (!name)
        return NULL;
    PyObject *msg = rbpy_text(err->msg);
    if (!msg) {
        Py_DECREF(name);
        return NULL;
    }
    PyObject *args = Py_BuildValue("(iNN)", err->errnum, msg, name);
    if (args) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
    return NULL;
}

int rbpy_unpack(const char *fname, const char *const *names, int nnames, int required, PyObject *const *args,
                Py_ssize_t nargs, PyObject *kwnames, PyObject **out)
{
    for (int i = 0; i < nnames; i++)
        out[i] = NULL;
    if (nargs > nnames) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)", fname, nnames, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, k);
        const char *s = PyUnicode_AsUTF8(kw);
        if (!s)
            return -1;
        int found = -1;
        for (int i = 0; i < nnames; i++) {
            if (strcmp(s, names[i]) == 0) {
                found = i;
                break;
            }
        }
        if (found < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%s'", fname, s);
            return -1;
        }
        if (out[found]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, s);
            return -1;
        }
        out[found] = args[nargs + k];
    }
    for (int i = 0; i < required; i++) {
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", fname, names[i], i + 1);
            return -1;
        }
    }
    return 0;
}

int rbpy_as_u64(PyObject *o, const char *name, uint64_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.100s", name, Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_OverflowError, "%s must be a non-negative int below 2**64, got %R", name, o);
        return -1;
    }
    *out = v;
    return 0;
}

int rbpy_as_size(PyObject *o, const char *name, size_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.100s", name, Py_TYPE(o)->tp_name);
        return -1;
    }
    size_t v = PyLong_AsSize_t(o);
    if (v == (size_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_OverflowError, "%s must be a non-negative int that fits in size_t, got %R", name, o);
        return -1;
    }
    *out = v;
    return 0;
}

int rbpy_as_opt_size(PyObject *o, const char *name, size_t *out, int *present)
{
    if (!o || o == Py_None) {
        *present = 0;
        return 0;
    }
    *present = 1;
    return rbpy_as_size(o, name, out);
}

/* ---- bounded integers ------------------------------------------------------------------ */

/* o (an int) against [lo, hi] (ints; NULL when making them failed): 0 inside, 1 below, 2
 * above, -1 with an exception set. Compared as Python ints, so any size is placed right. */
static int int_side(PyObject *o, PyObject *lo, PyObject *hi)
{
    if (!lo || !hi)
        return -1;
    int below = PyObject_RichCompareBool(o, lo, Py_LT);
    int above = below == 0 ? PyObject_RichCompareBool(o, hi, Py_GT) : 0;
    if (below < 0 || above < 0)
        return -1;
    return below ? 1 : above ? 2 : 0;
}

/* o as an int, new reference: o itself when it is one (a bool only with index_ok); with
 * index_ok also o.__index__() (PyNumber_Index's TypeError otherwise). NULL with TypeError
 * "<name> must be <kind>, got <type> <repr>" for anything else. */
static PyObject *int_of(PyObject *o, const char *name, const char *kind, int index_ok)
{
    if (index_ok)
        return PyNumber_Index(o);
    if (PyLong_Check(o) && !PyBool_Check(o))
        return Py_NewRef(o);
    PyErr_Format(PyExc_TypeError, "%s must be %s, got %.80s %.200R", name, kind ? kind : "an int", Py_TYPE(o)->tp_name,
                 o);
    return NULL;
}

int rbpy_int_refused(PyObject *o, const char *name, const char *words)
{
    PyErr_Format(PyExc_ValueError, "%s %s, got %.200R", name, words, o);
    return -1;
}

/* The ValueError of a value v outside r, on side 1 (below) or 2 (above); returns -1. */
static int range_error(PyObject *v, const rbpy_int_range *r, int side)
{
    const char *words = side == 1 ? r->below : r->above;
    if (words)
        return rbpy_int_refused(v, r->name, words);
    PyErr_Format(PyExc_ValueError, "%s must be in %lld..%lld, got %.200R", r->name, (long long)r->lo, (long long)r->hi,
                 v);
    return -1;
}

int rbpy_bounded_i64(PyObject *o, const rbpy_int_range *r, int64_t *out)
{
    PyObject *v = int_of(o, r->name, r->kind, r->index_ok);
    if (!v)
        return -1;
    PyObject *lo = PyLong_FromLongLong(r->lo), *hi = lo ? PyLong_FromLongLong(r->hi) : NULL;
    int side = int_side(v, lo, hi), rc = 0;
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    if (side == 0)
        *out = PyLong_AsLongLong(v); /* in range: cannot fail */
    else if (side == 1 && r->clamp_low)
        *out = r->lo;
    else
        rc = side < 0 ? -1 : range_error(v, r, side);
    Py_DECREF(v);
    return rc;
}

int rbpy_bounded_u64(PyObject *o, const char *name, uint64_t lo, uint64_t hi, uint64_t *out)
{
    PyObject *v = int_of(o, name, NULL, 0);
    if (!v)
        return -1;
    PyObject *l = PyLong_FromUnsignedLongLong(lo), *h = l ? PyLong_FromUnsignedLongLong(hi) : NULL;
    int side = int_side(v, l, h);
    Py_XDECREF(l);
    Py_XDECREF(h);
    if (side == 0)
        *out = PyLong_AsUnsignedLongLong(v); /* in range: cannot fail */
    else if (side > 0)
        PyErr_Format(PyExc_ValueError, "%s must be in %llu..%llu, got %.200R", name, (unsigned long long)lo,
                     (unsigned long long)hi, v);
    Py_DECREF(v);
    return side == 0 ? 0 : -1;
}

/* xxh3_64(data) -> int: the payload checksum stored in slot headers (for offline verify). */
static PyObject *rbpy_xxh3_64(PyObject *mod, PyObject *arg)
{
    (void)mod;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    XXH64_hash_t h;
    if (view.len >= 65536) {
        Py_BEGIN_ALLOW_THREADS
            h = XXH3_64bits(view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        h = XXH3_64bits(view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

/* probe_foreign(path) -> str | None: what libblkid finds on path (file system, partition table). */
static PyObject *rbpy_probe_foreign(PyObject *mod, PyObject *arg)
{
    (void)mod;
    PyObject *bytes = NULL;
    if (!PyUnicode_FSConverter(arg, &bytes))
        return NULL;
    char what[128];
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = rb_probe_foreign(PyBytes_AS_STRING(bytes), what, sizeof(what), &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(bytes);
    if (rc < 0)
        return rbpy_raise_err(&err);
    if (rc == 0)
        Py_RETURN_NONE;
    return PyUnicode_FromString(what);
}

/* _set_memobj_type(cls): payload objects of exactly this class (LMCache's TensorMemoryObj)
 * are read as raw_data.data_ptr() / get_size() bytes, which is what its byte_array exposes,
 * without building the ctypes memoryview (about 3 us per object). The class's byte_array
 * property is remembered: if it is replaced later, objects go through byte_array again. */
static PyObject *rbpy_set_memobj_type(PyObject *mod, PyObject *cls)
{
    rbpy_state *st = PyModule_GetState(mod);
    if (cls == Py_None) {
        Py_CLEAR(st->memobj_type);
        Py_CLEAR(st->memobj_descr);
        Py_RETURN_NONE;
    }
    if (!PyType_Check(cls)) {
        PyErr_Format(PyExc_TypeError, "_set_memobj_type expects a class or None, got %.100s", Py_TYPE(cls)->tp_name);
        return NULL;
    }
    PyObject *descr = PyObject_GetAttr(cls, st->names[RBPY_NAME_BYTE_ARRAY]);
    if (!descr)
        return NULL;
    Py_XSETREF(st->memobj_type, Py_NewRef(cls));
    Py_XSETREF(st->memobj_descr, descr);
    Py_RETURN_NONE;
}

/* Start (path) or stop (None) the process's write log with set (rb_wlog.h). */
static PyObject *start_write_log(PyObject *arg, int (*set)(const char *))
{
    PyObject *bytes = NULL;
    if (arg != Py_None && !PyUnicode_FSConverter(arg, &bytes))
        return NULL;
    int rc = set(bytes ? PyBytes_AS_STRING(bytes) : NULL);
    Py_XDECREF(bytes);
    if (rc < 0) {
        errno = -rc;
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, arg);
    }
    Py_RETURN_NONE;
}

/* _set_write_log(path | None): test hook, record every device write and flush of the process
 * to path (rb_wlog.h), or stop recording. */
static PyObject *rbpy_set_write_log(PyObject *mod, PyObject *arg)
{
    (void)mod;
    return start_write_log(arg, rb_wlog_set);
}

/* _set_write_journal(path | None): the write log without the written bytes (offsets, lengths,
 * deallocations, flushes), for `waf replay --record`; or stop recording. */
static PyObject *rbpy_set_write_journal(PyObject *mod, PyObject *arg)
{
    (void)mod;
    return start_write_log(arg, rb_wlog_set_journal);
}

/* _inject_lock_errno(errnum): test hook, the next flock(2) a device makes fails with errnum
 * (0 clears), e.g. ENOLCK for a file system without locks. */
static PyObject *rbpy_inject_lock_errno(PyObject *mod, PyObject *arg)
{
    (void)mod;
    static const rbpy_int_range range = {.name = "_inject_lock_errno: errnum",
                                         .lo = 0,
                                         .hi = 4095,
                                         .below = "must be in [0, 4095]",
                                         .above = "must be in [0, 4095]",
                                         .index_ok = 1};
    int64_t e;
    if (rbpy_bounded_i64(arg, &range, &e) < 0)
        return NULL;
    rb_dev_inject_lock_errno((int)e);
    Py_RETURN_NONE;
}

static PyMethodDef rbpy_functions[] = {
    {"_set_memobj_type", rbpy_set_memobj_type, METH_O,
     "_set_memobj_type($module, cls, /)\n--\n\n"
     "cls (a class or None) -> None: read payloads of exactly this MemoryObj class through "
     "raw_data.data_ptr() and get_size() (what its byte_array exposes) instead of byte_array."},
    {"encode_legacy_keys", rbpy_encode_legacy_keys, METH_O,
     "encode_legacy_keys($module, keys, /)\n--\n\n"
     "-> list[str]: `k if isinstance(k, str) else k.to_string()` for every key, "
     "LMCache's CacheEngineKey / LayerCacheEngineKey encoded in C (anything else through to_string())."},
    {"delete_legacy_keys", (PyCFunction)(void (*)(void))rbpy_delete_legacy_keys, METH_FASTCALL | METH_KEYWORDS,
     "delete_legacy_keys($module, core, keys, force=False)\n--\n\n"
     "-> int: core.delete_many(encode_legacy_keys(keys), force)"
     ".count(True), without creating the encoded str objects."},
    {"_forget_key_plans", rbpy_forget_key_plans, METH_NOARGS,
     "_forget_key_plans($module, /)\n--\n\n"
     "-> None: drop the cached key-encoding plans, so the next call checks "
     "each key shape against to_string() again (for tests)."},
    {"nvme_fdp_report", rbpy_nvme_fdp_report, METH_O,
     "nvme_fdp_report($module, path, /)\n--\n\n"
     "-> dict: an NVMe namespace (ngXnY or nvmeXnY) and its FDP state: nsid, lba_size, "
     "size_bytes, endgid, fdp_enabled, config (nrg, nruh, maxpids, runs, ...) or None, ruhs (pid, ruhid, "
     "earutr, ruamw per reclaim unit handle), stats (hbmw, mbmw, mbe bytes) or None."},
    {"nvme_wear_counters", rbpy_nvme_wear_counters, METH_O,
     "nvme_wear_counters($module, path, /)\n--\n\n"
     "-> dict: wear counters of an NVMe namespace: nsid, endgid, fdp_enabled, smart "
     "(data_units_written/read in 512,000-byte units, host_write/read_commands), fdp_stats (hbmw, mbmw, mbe) "
     "or None, fdp_events (host, controller, by_type) or None."},
    {"settings", rbpy_settings, METH_NOARGS,
     "settings($module, /)\n--\n\n"
     "-> tuple[dict, ...]: every setting of the core (name, type, min, max, default, choices, "
     "flags, help), in RawBlockCoreConfig's order; the keywords of Core()."},
    {"container_bytes", (PyCFunction)(void (*)(void))rbpy_container_bytes, METH_FASTCALL,
     "container_bytes($module, meta_total_bytes, block_align, /)\n--\n\n"
     "-> int: bytes of one of the two checkpoint copies "
     "(container 1 starts there)."},
    {"probe_foreign", rbpy_probe_foreign, METH_O,
     "probe_foreign($module, path, /)\n--\n\n"
     "-> str | None: a description of the file system or partition table that "
     "libblkid finds on path, or None."},
    {"_set_write_log", rbpy_set_write_log, METH_O,
     "_set_write_log($module, path, /)\n--\n\n"
     "test hook: path (or None) records every device write and flush to path"},
    {"_set_write_journal", rbpy_set_write_journal, METH_O,
     "_set_write_journal($module, path, /)\n--\n\n"
     "path (or None) records every device write's offset and length, deallocation and flush to "
     "path"},
    {"_inject_lock_errno", rbpy_inject_lock_errno, METH_O,
     "_inject_lock_errno($module, errnum, /)\n--\n\n"
     "test hook: makes the next flock(2) of a device fail with errnum (0 clears)"},
    {"xxh3_64", rbpy_xxh3_64, METH_O,
     "xxh3_64($module, data, /)\n--\n\n-> int: XXH3 64-bit hash (seed 0) of a buffer."},
    {"read_metadata_log", (PyCFunction)(void (*)(void))rbpy_read_metadata_log, METH_FASTCALL | METH_KEYWORDS,
     "read_metadata_log($module, path, block_align, meta_total_bytes=0, threads=2)\n--\n\n"
     "-> dict: the log-format metadata "
     "region of a device read back (superblocks, base, log, the entries they replay to); found=False when "
     "no superblock of ours is there. Only reads."},
    {NULL, NULL, 0, NULL},
};

static int rbpy_exec(PyObject *mod)
{
    rbpy_state *st = PyModule_GetState(mod);
    static const char *const names[RBPY_N_NAMES] = {
        "raw_data", "is_cpu", "is_contiguous", "nbytes", "data_ptr",         "get_size", "byte_array",
        "metadata", "dtype",  "fmt",           "shape",  "cached_positions", "tolist"};
    for (int i = 0; i < RBPY_N_NAMES; i++)
        if (!(st->names[i] = PyUnicode_InternFromString(names[i])))
            return -1;
    st->device_type = (PyTypeObject *)PyType_FromModuleAndSpec(mod, &rbpy_device_spec, NULL);
    if (!st->device_type)
        return -1;
    if (PyModule_AddType(mod, st->device_type) < 0)
        return -1;
    st->core_type = (PyTypeObject *)PyType_FromModuleAndSpec(mod, &rbpy_core_spec, NULL);
    if (!st->core_type)
        return -1;
    if (PyModule_AddType(mod, st->core_type) < 0)
        return -1;
    PyObject *order = PyType_FromModuleAndSpec(mod, &rbpy_prefix_order_spec, NULL);
    if (!order)
        return -1;
    int added = PyModule_AddType(mod, (PyTypeObject *)order);
    Py_DECREF(order);
    if (added < 0)
        return -1;
    if (PyModule_AddStringConstant(mod, "__version__", RB_VERSION) < 0)
        return -1;
    return 0;
}

static int rbpy_traverse(PyObject *mod, visitproc visit, void *arg)
{
    rbpy_state *st = PyModule_GetState(mod);
    Py_VISIT(st->device_type);
    Py_VISIT(st->core_type);
    Py_VISIT(st->memobj_type);
    Py_VISIT(st->memobj_descr);
    for (int i = 0; i < RBPY_N_NAMES; i++)
        Py_VISIT(st->names[i]);
    return rbpy_keyplans_traverse(st, visit, arg);
}

static int rbpy_clear(PyObject *mod)
{
    rbpy_state *st = PyModule_GetState(mod);
    Py_CLEAR(st->device_type);
    Py_CLEAR(st->core_type);
    Py_CLEAR(st->memobj_type);
    Py_CLEAR(st->memobj_descr);
    for (int i = 0; i < RBPY_N_NAMES; i++)
        Py_CLEAR(st->names[i]);
    rbpy_keyplans_clear(st);
    return 0;
}

static void rbpy_free(void *mod)
{
    rbpy_clear((PyObject *)mod);
}

static PyModuleDef_Slot rbpy_slots[] = {
    {Py_mod_exec, rbpy_exec},
    {0, NULL},
};

static struct PyModuleDef rbpy_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "lmcache_rawblock._native",
    .m_doc = "C core of lmcache_rawblock: raw block device I/O for LMCache's raw-block tier.",
    .m_size = sizeof(rbpy_state),
    .m_slots = rbpy_slots,
    .m_methods = rbpy_functions,
    .m_traverse = rbpy_traverse,
    .m_clear = rbpy_clear,
    .m_free = rbpy_free,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModuleDef_Init(&rbpy_module);
}
