/*
 * core.h - what the files of the _native.Core binding share (core.c and core_*.c): the object
 * layout, the argument and payload converters, one put_many call, and the methods each file
 * contributes to the type's method table (core.c). Only csrc/py includes it.
 */
#ifndef RBPY_CORE_H
#define RBPY_CORE_H

#include "rbpy.h"

#include "../core/rb_core.h"

/*
 * put_many's names of a (dtype, fmt) pair, kept by the identities of the two objects: the
 * strings the namer returned for them (LMCache's short dtype name, the format's name, or None)
 * and their UTF-8. Entries are only added (the core reads the strings without the GIL while
 * another thread may convert), each holding its four objects; the pairs of one process are a
 * handful.
 */
#define RBPY_META_NAMES 16
typedef struct {
    PyObject *dtype, *fmt;   /* the keys, compared by identity */
    PyObject *dname, *fname; /* str or None */
    const char *ds, *fs;
    size_t dl, fl;
} meta_names;

typedef struct {
    PyObject_HEAD
    rb_core *core;
    int closed;
    PyObject *close_result; /* dict returned by the first close() */
    PyObject *weakreflist;
    PyObject *namer; /* the namer the entries of names came from (the first one passed) */
    int n_names;
    meta_names names[RBPY_META_NAMES];
    /* _set_metadata_shortcut: instances of exactly meta_type have their metadata read as the
     * attribute meta_attr while the class's metadata is still meta_descr (see rbpy_metadata_of). */
    PyObject *meta_type, *meta_descr, *meta_attr;
} CoreObject;

/* The rb_core of a Core object (NULL once dealloc has begun). */
static inline rb_core *rbpy_core_of(PyObject *op)
{
    return ((CoreObject *)op)->core;
}

/* ---- argument converters (core_args.c) ------------------------------------------------- */

/* ---- argument helpers ------------------------------------------------------------------ */

typedef struct {
    PyObject *tuple; /* owns the key objects (the list or tuple itself when one was passed) */
    const char **keys;
    size_t *lens; /* inside the keys allocation */
    Py_ssize_t n;
} keyvec;

/* The keys are snapshotted into a tuple (the C side may run without the GIL while another
 * thread mutates the caller's list); ASCII str keys are used in place, without the UTF-8 call.
 * 0, or -1 with an exception set (kv then holds nothing). */
int rbpy_keyvec_from(PyObject *seq, keyvec *kv);
void rbpy_keyvec_free(keyvec *kv);
/* One encoded key (a str) as UTF-8, borrowed from the str. 0, or -1 with TypeError. */
int rbpy_one_key(PyObject *k, const char **s, size_t *len);
/* PySequence_Fast(o, what) as a tuple: a list is copied, so the items stay alive and in place
 * while conversions run Python code (which may change a caller's list) and while the core
 * reads borrowed data without the GIL. */
PyObject *rbpy_fast_tuple(PyObject *o, const char *what);
/* [bool(r[i]) for i in range(n)]. */
PyObject *rbpy_bool_list(const uint8_t *r, Py_ssize_t n);
/* A list of the n ints at v, or None for n < 0. */
PyObject *rbpy_i64_list(const int64_t *v, int64_t n);
/* None (NULL, *len 0) or a str's UTF-8, borrowed from it; NULL with an exception set too. */
const char *rbpy_opt_str(PyObject *o, size_t *len);

/* ---- payload objects as buffers (core_payload.c) --------------------------------------- */

/*
 * One payload of put_many / load_many_into: an object with the buffer protocol; a MemoryObj
 * of the class the facade registered (LMCache's TensorMemoryObj): the get_size() bytes at
 * raw_data.data_ptr() (inside the tensor's storage), which is exactly what its byte_array
 * exposes, without building that ctypes memoryview (about 3 us per object, as much as the
 * whole native load of a 64 KiB payload); or any other object with a byte_array.
 */
typedef struct {
    void *buf;
    size_t len;
    Py_buffer view; /* view.obj set: a buffer-protocol view to release */
    PyObject *keep; /* registered MemoryObj: the tensor owning buf, held for the call */
} payload;

/* The registered MemoryObj class (_set_memobj_type), if its byte_array is still the one
 * registered (checked once per call), else NULL. */
PyTypeObject *rbpy_memobj_fast_type(rbpy_state *st);
/* Payload i (o) as a buffer, writable for loads: a registered MemoryObj (fast is
 * rbpy_memobj_fast_type's answer) through raw_data, else the buffer protocol or byte_array.
 * 0, or -1 with an exception naming payload i (nothing held). */
int rbpy_payload_get(rbpy_state *st, PyTypeObject *fast, PyObject *o, Py_ssize_t i, int writable, payload *p);
void rbpy_payload_release(payload *p);

/* ---- one put_many call (core_put.c) and the payloads' metadata (core_meta.c) ----------- */

/* Shapes of up to this many dimensions are kept in the call's own array instead of a PyMem
 * array per key (LMCache's have one to five). */
#define RBPY_INLINE_DIMS 8

/* One put_many call: its arguments as C arrays and everything it holds until it returns (the
 * key snapshot, the argument sequences, the payload views, the names of the metadata). Touched
 * only with the GIL held, except items (read) and results, stored, n_stored (written) by the
 * core without it. */
typedef struct {
    keyvec kv;
    PyObject *ids, *bufs, *pids, *metas; /* tuples (PySequence_Fast results, lists copied); metas
                                          * NULL when the payloads' own metadata is read */
    PyObject *namer;                     /* borrowed: the callable metas argument, or NULL */
    PyObject *holds;                     /* list: namer results not kept on the core, or NULL */
    Py_ssize_t n;                        /* keys */
    Py_ssize_t nviews;                   /* views[0..nviews) are held */
    rb_put_item *items;
    int64_t (*dims)[RBPY_INLINE_DIMS]; /* items[i].meta.dims is dims[i] for a short shape */
    payload *views;
    uint8_t *results;
    uint32_t *stored;
    size_t n_stored;
    rb_err fail; /* why the first key that failed did (kind RB_ERR_NONE: none did) */
} put_call;

/* The class whose instances' metadata is read directly (rbpy_metadata_of), if its metadata
 * attribute is still the property given to _set_metadata_shortcut (checked once per call). */
PyTypeObject *rbpy_metadata_direct_type(rbpy_state *st, CoreObject *self);
/* getattr(o, "metadata", None), directly for an instance of exactly direct. New reference, or
 * NULL with an exception. */
PyObject *rbpy_metadata_of(rbpy_state *st, CoreObject *self, PyTypeObject *direct, PyObject *o);
/* GIL held: key i's metadata from its payload object into pc->items[i].meta. 0 or -1. */
int rbpy_put_meta_read(rbpy_state *st, CoreObject *self, PyTypeObject *direct, put_call *pc, Py_ssize_t i);

/* ---- the methods, by file (the table is in core.c) ------------------------------------- */

/* Methods with keywords take (op, args, nargs, kwnames); the others (op, arg), arg unused by
 * METH_NOARGS ones. */
/* core_put.c, core_load.c */
PyObject *rbpy_core_put_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_core_load_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
/* core_index.c */
PyObject *rbpy_core_exists_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_core_delete_many(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_core_unlock_many(PyObject *op, PyObject *arg);
PyObject *rbpy_core_get_metadata_many(PyObject *op, PyObject *arg);
PyObject *rbpy_core_get_metadata_prefix(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_core_exists_inflight(PyObject *op, PyObject *arg);
PyObject *rbpy_core_entry_offset(PyObject *op, PyObject *arg);
PyObject *rbpy_core_lock_refcount(PyObject *op, PyObject *arg);
PyObject *rbpy_core_snapshot_keys(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_core_extent_victim(PyObject *op, PyObject *ignored);
PyObject *rbpy_core_extent_peek(PyObject *op, PyObject *arg);
PyObject *rbpy_core_extent_take(PyObject *op, PyObject *arg);
PyObject *rbpy_core_extent_evict(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
/* core_status.c */
PyObject *rbpy_core_status(PyObject *op, PyObject *arg);
PyObject *rbpy_core_trust_counters(PyObject *op, PyObject *arg);
PyObject *rbpy_core_counts(PyObject *op, PyObject *arg);
/* The tuple counts() returns, of counters rb_core_counts_get filled. */
PyObject *rbpy_counts_tuple(const rb_core_status *st);
PyObject *rbpy_core_fetch_fdp_status(PyObject *op, PyObject *arg);
PyObject *rbpy_core_nvme_info(PyObject *op, PyObject *arg);
PyObject *rbpy_core_engine_state(PyObject *op, PyObject *arg);
/* core_obs.c */
PyObject *rbpy_core_histograms(PyObject *op, PyObject *arg);
PyObject *rbpy_core_set_histograms(PyObject *op, PyObject *arg);
PyObject *rbpy_core_load_queue(PyObject *op, PyObject *arg);
PyObject *rbpy_core_recording_cost(PyObject *op, PyObject *args);
/* core_admin.c */
PyObject *rbpy_core_checkpoint_now(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_core_release_held_slots(PyObject *op, PyObject *Py_UNUSED(ignored));
PyObject *rbpy_core_reclaim_held_slots(PyObject *op, PyObject *Py_UNUSED(ignored));
PyObject *rbpy_core_free_lane_off(PyObject *op, PyObject *Py_UNUSED(ignored));
PyObject *rbpy_core_compact_metadata(PyObject *op, PyObject *arg);
PyObject *rbpy_core_set_dealloc_log(PyObject *op, PyObject *arg);
PyObject *rbpy_core_take_dealloc_log(PyObject *op, PyObject *arg);
PyObject *rbpy_core_discard_force_ioctl(PyObject *op, PyObject *arg);
PyObject *rbpy_core_apply_state_json(PyObject *op, PyObject *arg);
PyObject *rbpy_core_apply_state_json_generic(PyObject *op, PyObject *arg);
PyObject *rbpy_core_register_buffers(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_core_set_metadata_shortcut(PyObject *op, PyObject *const *args, Py_ssize_t nargs);
PyObject *rbpy_core_revalidate(PyObject *op, PyObject *arg);
PyObject *rbpy_core_mem_bytes(PyObject *op, PyObject *arg);
PyObject *rbpy_core_inject_fault(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rbpy_core_inject_engine_fault(PyObject *op, PyObject *arg);
PyObject *rbpy_core_io_scheduler(PyObject *op, PyObject *unused);
PyObject *rbpy_core_hold_engine(PyObject *op, PyObject *arg);
PyObject *rbpy_core_trace_engine(PyObject *op, PyObject *arg);
PyObject *rbpy_core_fail_engine_write(PyObject *op, PyObject *arg);
PyObject *rbpy_core_set_ckpt_delay(PyObject *op, PyObject *arg);
PyObject *rbpy_core_set_load_check_off(PyObject *op, PyObject *arg);
PyObject *rbpy_core_set_ckpt_no_flush(PyObject *op, PyObject *arg);
PyObject *rbpy_core_set_load_delay(PyObject *op, PyObject *arg);
PyObject *rbpy_core_identity(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

#endif /* RBPY_CORE_H */
