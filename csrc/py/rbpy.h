/*
 * rbpy.h - shared declarations of the CPython binding (module state, object layouts,
 * argument helpers, error mapping). Only csrc/py/ includes Python.h.
 */
#ifndef RBPY_H
#define RBPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../core/rb_device.h"
#include "../core/rb_err.h"

typedef struct rbpy_keyplans rbpy_keyplans;

/* Attribute names looked up per payload object, interned once per module (module.c): the
 * payload's, then its metadata's (read by put_many / load_many_into, core.c). */
enum {
    RBPY_NAME_RAW_DATA,
    RBPY_NAME_IS_CPU,
    RBPY_NAME_IS_CONTIGUOUS,
    RBPY_NAME_NBYTES,
    RBPY_NAME_DATA_PTR,
    RBPY_NAME_GET_SIZE,
    RBPY_NAME_BYTE_ARRAY,
    RBPY_NAME_METADATA,
    RBPY_NAME_DTYPE,
    RBPY_NAME_FMT,
    RBPY_NAME_SHAPE,
    RBPY_NAME_CACHED_POSITIONS,
    RBPY_NAME_TOLIST,
    RBPY_N_NAMES
};

typedef struct {
    PyTypeObject *device_type;
    PyTypeObject *core_type; /* _native.Core (core.c) */
    rbpy_keyplans *keyplans; /* key encoding plans kept across calls (keys.c), or NULL */
    /* LMCache's TensorMemoryObj and its byte_array property as registered by the facade
     * (_native._set_memobj_type), or NULL: payload objects of exactly this type are read
     * through raw_data.data_ptr() and get_size() instead of byte_array (core.c). */
    PyObject *memobj_type;
    PyObject *memobj_descr;
    PyObject *names[RBPY_N_NAMES]; /* interned attribute names, indexed by RBPY_NAME_* */
} rbpy_state;

typedef struct rbpy_uring_batches rbpy_uring_batches;

typedef struct {
    PyObject_HEAD
    rb_dev *dev; /* owned; freed in dealloc */
    int use_iouring;
    int use_uring_cmd;
    rbpy_uring_batches *batches; /* io_uring batch tracking (device_uring.c), or NULL */
    PyObject *weakreflist;
} RawBlockDeviceObject;

/* module.c */
rbpy_state *rbpy_state_of_type(PyTypeObject *tp);
/* Raise the Python exception an rb_err describes; returns NULL. */
PyObject *rbpy_raise_err(const rb_err *err);
/* The exception rbpy_raise_err would raise, as a new instance (not raised), or NULL with an
 * exception set. */
PyObject *rbpy_err_object(const rb_err *err);
/* A message of the core as str, decoded leniently (backslashreplace): the core cuts messages
 * at a byte count, which may split a path's multibyte character. */
PyObject *rbpy_text(const char *s);
/* The same, with path (bytes from PyUnicode_FSConverter, or str) as the OSError's filename. */
PyObject *rbpy_raise_err_path(const rb_err *err, PyObject *path);

/*
 * Fast-call argument unpacking: fills out[0..nnames) from positional args and keywords.
 * Slots not given stay NULL. Raises TypeError like CPython for unknown, duplicate or
 * missing (first `required` names) arguments. Returns 0 or -1.
 */
int rbpy_unpack(const char *fname, const char *const *names, int nnames, int required, PyObject *const *args,
                Py_ssize_t nargs, PyObject *kwnames, PyObject **out);

/* Integer conversions naming the parameter in their errors. NULL / None -> dflt / *present=0. */
int rbpy_as_u64(PyObject *o, const char *name, uint64_t *out);
int rbpy_as_size(PyObject *o, const char *name, size_t *out);
int rbpy_as_opt_size(PyObject *o, const char *name, size_t *out, int *present);

/*
 * Bounded integer arguments, one rule for the binding: a Python int that must lie in [lo, hi],
 * its errors naming the parameter and the value. A TypeError "<name> must be <kind>, got <type>
 * <repr>" refuses anything that is not an int (bools too); a ValueError "<name> <words>, got
 * <repr>" a value outside the range (of any size), words being "must be in <lo>..<hi>" unless
 * the range gives its own.
 */
typedef struct {
    const char *name;  /* the parameter: the first words of every error */
    int64_t lo, hi;    /* the accepted range */
    const char *below; /* the ValueError's words for a value below lo (NULL: "must be in lo..hi") */
    const char *above; /* the same for a value above hi */
    const char *kind;  /* the TypeError's words after "must be" (NULL: "an int") */
    int clamp_low;     /* a value below lo is taken as lo instead of refused */
    int index_ok;      /* anything with __index__ is an int, bools included (PyNumber_Index's
                        * TypeError otherwise), as PyLong_AsLong reads its argument */
} rbpy_int_range;
int rbpy_bounded_i64(PyObject *o, const rbpy_int_range *r, int64_t *out);
/* The same over unsigned 64-bit bounds, with the plain words. */
int rbpy_bounded_u64(PyObject *o, const char *name, uint64_t lo, uint64_t hi, uint64_t *out);
/* ValueError "<name> <words>, got <repr of o>" (a check past the range, e.g. a power of two);
 * returns -1. */
int rbpy_int_refused(PyObject *o, const char *name, const char *words);

/* config.c: rb_core_cfg from _native.Core's keywords (keyword-only, the settings table's
 * names; defaults from the table); *path_out receives the converted device path, which the
 * caller keeps alive while cfg is used and then releases. Returns 0 or -1 with an exception
 * naming the keyword and its value. */
struct rb_core_cfg;
int rbpy_core_cfg_from_kwargs(const char *fname, PyObject *args, PyObject *kwds, struct rb_core_cfg *cfg,
                              PyObject **path_out);
/* A strict boolean: True/False or the ints 0/1; anything else is a TypeError naming it. */
int rbpy_as_bool(PyObject *v, const char *name, int *out);
/* _native.settings(): the settings table as a tuple of dicts. */
PyObject *rbpy_settings(PyObject *mod, PyObject *unused);
/* _native.container_bytes(meta_total_bytes, block_align): one checkpoint copy's bytes. */
PyObject *rbpy_container_bytes(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

/* mlog.c: _native.read_metadata_log(path, block_align, meta_total_bytes=0, threads=2) -> dict. */
PyObject *rbpy_read_metadata_log(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* device.c */
extern PyType_Spec rbpy_device_spec;

/* prefix_order.c: _native.PrefixOrder, the prefix-aware eviction order (prefix_evict.py). */
extern PyType_Spec rbpy_prefix_order_spec;
/* A device's lifetime I/O counters as a dict, one key per RB_STATS_FIELDS name. */
struct rb_stats_snapshot;
PyObject *rbpy_io_stats_dict(const struct rb_stats_snapshot *s);
/* fetch_fdp_status() of a device, without the GIL: [(placement_id, ruh_id), ...]. A device
 * that can place no writes raises its RuntimeError, with not_enabled as the text if given. */
PyObject *rbpy_fdp_status(rb_dev *dev, const char *not_enabled);

/* nvme.c: _native.nvme_fdp_report(path) -> dict (the fdp-status command's data). */
PyObject *rbpy_nvme_fdp_report(PyObject *mod, PyObject *path);
/* nvme.c: _native.nvme_wear_counters(path) -> dict (SMART and FDP wear counters). */
PyObject *rbpy_nvme_wear_counters(PyObject *mod, PyObject *path);
/* Guard for every device method: RuntimeError("device is closed") once closing. */
int rbpy_device_check_open(RawBlockDeviceObject *self);

/* device_uring.c: io_uring-only methods of RawBlockDevice. */
PyObject *rbpy_dev_batched_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_dev_batched_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_dev_wait_iouring(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_dev_read_uring(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_dev_write_uring(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_dev_register_fixed_buffers(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_dev_worker_error(PyObject *self, PyObject *unused);
PyObject *rbpy_dev_fixed_buffer_status(PyObject *self, PyObject *unused);
PyObject *rbpy_dev_inject_engine_fault(PyObject *self, PyObject *arg);
/* The io_uring scheduler of dev, for the device's and the core's methods: io_scheduler() (a
 * dict of the settings in effect, or None without an io_uring engine), and the test hooks
 * _hold_engine(on) (rb_uring_hold) and _trace_engine(n) (the completions recorded so far, as
 * [(op, offset, length, last)], then record the next n). */
PyObject *rbpy_engine_sched(rb_dev *dev);
PyObject *rbpy_engine_hold(rb_dev *dev, PyObject *arg);
PyObject *rbpy_engine_trace(rb_dev *dev, PyObject *arg);
/* _fail_engine_write(nth): rb_uring_fail_write. */
PyObject *rbpy_engine_fail_write(rb_dev *dev, PyObject *arg);
/* Called by close() and dealloc with the GIL held, after the engine has stopped:
 * releases every buffer the batches still hold. */
void rbpy_uring_batches_free(RawBlockDeviceObject *self);

/* core.c: the native raw-block core type (_native.Core). */
extern PyType_Spec rbpy_core_spec;

/* The rb_core of a _native.Core (the caller has checked the type). */
struct rb_core *rbpy_core_ptr(PyObject *core);

/* core_index.c: above this many keys the index calls (exists, unlock, delete) release the GIL. */
#define RBPY_NOGIL_KEYS 64
/* The binding's one delete (Core.delete_many, delete_legacy_keys): rb_core_delete_many, which
 * also deallocates what the delete made reusable; without the GIL above RBPY_NOGIL_KEYS keys
 * or when that deallocation may reach the device. */
void rbpy_core_delete(struct rb_core *c, const char *const *keys, const size_t *lens, size_t n, int force,
                      uint8_t *results);

/* keys.c: encode_legacy_keys(keys) -> list[str], LMCache's CacheEngineKey.to_string() in C;
 * delete_legacy_keys(core, keys, force=False) -> int, the same keys deleted without str objects. */
PyObject *rbpy_encode_legacy_keys(PyObject *mod, PyObject *keys);
PyObject *rbpy_delete_legacy_keys(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_forget_key_plans(PyObject *mod, PyObject *unused);
/* Module traverse / clear of the plan cache. */
int rbpy_keyplans_traverse(rbpy_state *st, visitproc visit, void *arg);
void rbpy_keyplans_clear(rbpy_state *st);

#endif /* RBPY_H */
