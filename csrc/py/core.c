/*
 * core.c - the _native.Core heap type: a thin binding over csrc/core/rb_core.h. Converts
 * arguments to plain C arrays (keys as UTF-8, buffers as Py_buffer), releases the GIL
 * around every call into the core that does I/O or O(N) work, and builds the results.
 * The Python facade lmcache_rawblock.raw_block.core.RawBlockCore gives it LMCache's API.
 * This file holds the type: its lifecycle and its method table; the methods live in
 * core_put.c, core_load.c, core_index.c, core_status.c and core_admin.c (core.h).
 */
#include "core.h"

#include <structmember.h>

rb_core *rbpy_core_ptr(PyObject *op)
{
    return rbpy_core_of(op);
}

/* ---- constructor / lifetime ------------------------------------------------------------ */

/* Core(**settings): keyword-only, one keyword per entry of the settings table (rb_config.c). */
static PyObject *core_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    rb_core_cfg cfg;
    PyObject *path = NULL;
    if (rbpy_core_cfg_from_kwargs("Core", args, kwds, &cfg, &path) < 0) {
        Py_XDECREF(path);
        return NULL;
    }
    rb_core *core = NULL;
    rb_err err;
    rb_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = rb_core_open(&cfg, &core, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        rbpy_raise_err_path(&err, path);
        Py_DECREF(path);
        return NULL;
    }
    Py_DECREF(path);
    CoreObject *self = (CoreObject *)type->tp_alloc(type, 0);
    if (!self) {
        rb_close_result res;
        Py_BEGIN_ALLOW_THREADS
            rb_core_close(core, &res);
            rb_core_free(core);
        Py_END_ALLOW_THREADS
        return NULL;
    }
    self->core = core;
    return (PyObject *)self;
}

static PyObject *do_close(CoreObject *self)
{
    rb_close_result res;
    Py_BEGIN_ALLOW_THREADS
        rb_core_close(self->core, &res);
    Py_END_ALLOW_THREADS
    self->closed = 1;
    if (res.repeat) {
        PyObject *d = self->close_result ? PyDict_Copy(self->close_result) : PyDict_New();
        if (d && PyDict_SetItemString(d, "repeat", Py_True) < 0)
            Py_CLEAR(d);
        return d;
    }
    PyObject *d = Py_BuildValue("{s:O,s:O,s:z,s:z}", "repeat", Py_False, "final_checkpoint_written",
                                res.final_written ? Py_True : Py_False, "checkpoint_error",
                                res.ckpt_failed ? res.ckpt_err.msg : NULL, "device_close_error",
                                res.dev_close_failed ? res.dev_err.msg : NULL);
    if (d && !self->close_result)
        self->close_result = Py_NewRef(d);
    return d;
}

/* Drop put_many's cached metadata names and the metadata shortcut (dealloc, or the collector
 * breaking a cycle through the namer: no call of this core is running then). */
static void core_clear_names(CoreObject *self)
{
    int n = self->n_names;
    self->n_names = 0;
    for (int j = 0; j < n; j++) {
        meta_names *e = &self->names[j];
        Py_CLEAR(e->dtype);
        Py_CLEAR(e->fmt);
        Py_CLEAR(e->dname);
        Py_CLEAR(e->fname);
    }
    Py_CLEAR(self->namer);
    Py_CLEAR(self->meta_type);
    Py_CLEAR(self->meta_descr);
    Py_CLEAR(self->meta_attr);
}

static void core_dealloc(PyObject *op)
{
    CoreObject *self = (CoreObject *)op;
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    if (self->weakreflist)
        PyObject_ClearWeakRefs(op);
    if (self->core) {
        rb_core *core = self->core;
        self->core = NULL;
        rb_close_result res;
        Py_BEGIN_ALLOW_THREADS
            rb_core_close(core, &res);
            rb_core_free(core);
        Py_END_ALLOW_THREADS
    }
    Py_CLEAR(self->close_result);
    core_clear_names(self);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static int core_traverse(PyObject *op, visitproc visit, void *arg)
{
    CoreObject *self = (CoreObject *)op;
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->close_result);
    Py_VISIT(self->namer);
    Py_VISIT(self->meta_type);
    Py_VISIT(self->meta_descr);
    Py_VISIT(self->meta_attr);
    for (int j = 0; j < self->n_names; j++) {
        Py_VISIT(self->names[j].dtype);
        Py_VISIT(self->names[j].fmt);
        Py_VISIT(self->names[j].dname);
        Py_VISIT(self->names[j].fname);
    }
    return 0;
}

static int core_tp_clear(PyObject *op)
{
    core_clear_names((CoreObject *)op);
    return 0;
}

static PyObject *core_close(PyObject *op, PyObject *unused)
{
    (void)unused;
    return do_close((CoreObject *)op);
}

/* Each docstring starts with the method's text signature ("name($self, ...)\n--\n\n"), which
 * inspect.signature and stubtest read: the names are those rbpy_unpack takes as keywords. */
static PyMethodDef core_methods[] = {
    {"put_many", (PyCFunction)(void (*)(void))rbpy_core_put_many, METH_FASTCALL | METH_KEYWORDS,
     "put_many($self, keys, identities, payloads, placement_ids, metas)\n--\n\n"
     "Store payloads[i] under keys[i] (slot identity identities[i], FDP placement id placement_ids[i] or "
     "None for none). -> (results, indices of the keys stored by this call in commit "
     "order, why the first refused key failed or None). A payload is a buffer-protocol object, a MemoryObj "
     "of the _set_memobj_type class, or anything with byte_array; metas is one (dtype name, format name, "
     "shape, cached_positions) tuple per key, or a callable namer(dtype, fmt) -> (dtype name, format name, "
     "cacheable) with which each payload's own metadata (its metadata attribute) is read."},
    {"load_many_into", (PyCFunction)(void (*)(void))rbpy_core_load_many, METH_FASTCALL | METH_KEYWORDS,
     "load_many_into($self, keys, payloads, set_positions=None)\n--\n\n"
     "Read each indexed key's payload into payloads[i] (writable; the kinds put_many takes); a miss is "
     "False. -> (results, cached_positions, errors: an exception or None per key); with set_positions (a "
     "callable taking a list of ints), each loaded key's positions are set on its payload's metadata "
     "instead and the result is (results, errors or None when no key failed)."},
    {"exists_many", (PyCFunction)(void (*)(void))rbpy_core_exists_many, METH_FASTCALL | METH_KEYWORDS,
     "exists_many($self, keys, lock=False)\n--\n\n-> list[bool]; with lock, each key found is pinned"},
    {"delete_many", (PyCFunction)(void (*)(void))rbpy_core_delete_many, METH_FASTCALL | METH_KEYWORDS,
     "delete_many($self, keys, force=False)\n--\n\n"
     "-> list[bool]; with deallocate_freed on, then deallocates the slots it made reusable"},
    {"unlock_many", rbpy_core_unlock_many, METH_O, "unlock_many($self, keys, /)\n--\n\nunpin each key once"},
    {"get_metadata_many", rbpy_core_get_metadata_many, METH_O,
     "get_metadata_many($self, keys, /)\n--\n\n"
     "-> list[(offset, size, shape, dtype, fmt, cached_positions) | None]"},
    {"get_metadata_prefix", (PyCFunction)(void (*)(void))rbpy_core_get_metadata_prefix, METH_FASTCALL | METH_KEYWORDS,
     "get_metadata_prefix($self, keys, lock=False, skip=None)\n--\n\n"
     "-> list[tuple], the metadata of the keys up to the first missing one (or one in skip)"},
    {"exists_inflight", rbpy_core_exists_inflight, METH_O, "exists_inflight($self, key, /)\n--\n\n-> bool"},
    {"entry_offset", rbpy_core_entry_offset, METH_O, "entry_offset($self, key, /)\n--\n\n-> int | None"},
    {"lock_refcount", rbpy_core_lock_refcount, METH_O, "lock_refcount($self, key, /)\n--\n\n-> int"},
    {"snapshot_keys", (PyCFunction)(void (*)(void))rbpy_core_snapshot_keys, METH_FASTCALL | METH_KEYWORDS,
     "snapshot_keys($self, limit=None)\n--\n\n-> list[str] in insertion order"},
    {"checkpoint_now", (PyCFunction)(void (*)(void))rbpy_core_checkpoint_now, METH_FASTCALL | METH_KEYWORDS,
     "checkpoint_now($self, force=True)\n--\n\n-> bool (written)"},
    {"release_held_slots", rbpy_core_release_held_slots, METH_NOARGS,
     "release_held_slots($self, /)\n--\n\n"
     "-> bool: make the slots deletes freed reusable (log format: a group of their FREE records alone when "
     "that is enough, no flush of pending payloads); True when something was written"},
    {"reclaim_held_slots", rbpy_core_reclaim_held_slots, METH_NOARGS,
     "reclaim_held_slots($self, /)\n--\n\n"
     "-> int: release_held_slots again while freed slots wait for a checkpoint and the last call wrote, at most "
     "3 times, one caller at a time; the checkpoints written"},
    {"compact_metadata", rbpy_core_compact_metadata, METH_NOARGS,
     "compact_metadata($self, /)\n--\n\n"
     "-> bool: log format, write a new base and switch to it now (False: nothing to do)"},
    {"set_dealloc_log", rbpy_core_set_dealloc_log, METH_O,
     "set_dealloc_log($self, on, /)\n--\n\nstart (cleared) or stop the journal of deallocated ranges"},
    {"extent_victim", rbpy_core_extent_victim, METH_NOARGS,
     "extent_victim($self, /)\n--\n\n-> (extent, list[str], list[bool]) | None: the keys of the closed extent "
     "used least recently (put or loaded), without those a load or pin holds, and for each whether it was loaded "
     "since it was put; None when no closed extent holds a key. The extent then counts as just used. Needs "
     "extent_bytes"},
    {"extent_peek", rbpy_core_extent_peek, METH_O,
     "extent_peek($self, count, /)\n--\n\n-> list[(extent, list[str], list[bool])]: as extent_victim for up to "
     "count (1 to 64) closed extents holding a key, in victim order (the first is the one extent_victim takes), "
     "without counting them as used; fewer when there are fewer. One pass over the extents. Needs extent_bytes"},
    {"extent_take", rbpy_core_extent_take, METH_O,
     "extent_take($self, extent, /)\n--\n\n-> (extent, list[str], list[bool]) | None: as extent_victim for "
     "the given extent (counted as just used and as a victim); None when it is not a closed extent holding a "
     "key. Needs extent_bytes"},
    {"extent_evict", (PyCFunction)(void (*)(void))rbpy_core_extent_evict, METH_FASTCALL | METH_KEYWORDS,
     "extent_evict($self, reserve, batch=1, keep_hot=False, keys=False, reclaim=False)\n--\n\n"
     "-> (extents, deleted, gone, hot, opened, reclaimed, counts, error): the extent evictor's pass in one call "
     "without the GIL. When fewer than reserve extents are clean or waiting for their deallocation, the keys of "
     "as many victim extents as are missing, at least batch (as extent_victim, each extent once), are deleted as "
     "delete_many deletes them; with "
     "keep_hot its hot keys (the first in slot order, at most half) are kept and listed in hot; with keys the "
     "deleted keys are listed in gone (else None); with reclaim, when no hot key was kept, reclaim_held_slots "
     "follows (reclaimed: the checkpoints it wrote, -1 when it did not run). opened: extents the puts opened "
     "meanwhile; counts: as counts() after it; error: the exception the reclaim failed with, or None. Needs "
     "extent_bytes"},
    {"free_lane_off", rbpy_core_free_lane_off, METH_NOARGS,
     "free_lane_off($self, /)\n--\n\nfor tests and benchmarks: every FREE record goes in line behind pending "
     "puts' records from now on"},
    {"discard_force_ioctl", rbpy_core_discard_force_ioctl, METH_NOARGS,
     "discard_force_ioctl($self, /)\n--\n\nfor tests: a block device's discards take BLKDISCARD from now on"},
    {"take_dealloc_log", rbpy_core_take_dealloc_log, METH_NOARGS,
     "take_dealloc_log($self, /)\n--\n\n-> list[(offset, length)]: ranges deallocated since the last call"},
    {"apply_state_json", rbpy_core_apply_state_json, METH_O,
     "apply_state_json($self, state, /)\n--\n\n-> (applied, reason)"},
    {"_apply_state_json_generic", rbpy_core_apply_state_json_generic, METH_O,
     "_apply_state_json_generic($self, state, /)\n--\n\n"
     "test hook: apply_state_json through json-c only (no plain-form reader)"},
    {"status", rbpy_core_status, METH_NOARGS, "status($self, /)\n--\n\n-> dict"},
    {"counts", rbpy_core_counts, METH_NOARGS,
     "counts($self, /)\n--\n\n"
     "-> (usable_slots, indexed, inflight, free, next_slot, held, locked, room_checkpoints, closed, extent_slots, "
     "extents_total, extents_clean, extents_open, extents_pending_dealloc, extents_opened, extent_fallbacks, "
     "extents_evicted, extent_deallocs, extent_dealloc_skipped, extent_base_offset, extent_stride, "
     "extent_tail_bytes, extent_bytes, extent_reclaim_unit_bytes): the slot and extent figures of status() (closed "
     "0 or 1) from "
     "one hold of the core mutex, without building the status"},
    {"trust_counters", rbpy_core_trust_counters, METH_NOARGS,
     "trust_counters($self, /)\n--\n\n"
     "-> (faults_total, load_rejected_entries, writeback_dropped_entries, shrink_dropped_entries)"},
    {"histograms", rbpy_core_histograms, METH_NOARGS,
     "histograms($self, /)\n--\n\n"
     "-> dict: latency (ns) and size (bytes) histograms of the operations, load misses by reason, hits, "
     "deletes and bytes in flight (a snapshot; each figure exact, the set best effort)"},
    {"load_queue", rbpy_core_load_queue, METH_NOARGS,
     "load_queue($self, /)\n--\n\n"
     "-> (read_pending_bytes, write_pending_bytes, inflight_bytes, read_completed_bytes, write_completed_bytes): "
     "reads and writes submitted to the io_uring scheduler and not finished (0 under posix); bytes of this core's "
     "loads and puts in flight; the device's completed bytes per direction"},
    {"set_histograms", rbpy_core_set_histograms, METH_O,
     "set_histograms($self, on, /)\n--\n\nrecord the histograms (on, the default) or not"},
    {"_recording_cost_ns", rbpy_core_recording_cost, METH_VARARGS,
     "_recording_cost_ns($self, iterations, keys, uring=True, /)\n--\n\n"
     "benchmark hook: ns the histograms' recording costs one load call of keys keys (a C loop; uring: "
     "with an io_uring batch's stamps)"},
    {"register_buffers", (PyCFunction)(void (*)(void))rbpy_core_register_buffers, METH_FASTCALL | METH_KEYWORDS,
     "register_buffers($self, ptrs, sizes)\n--\n\nio_uring fixed buffers (memory must outlive the core)"},
    {"fetch_fdp_status", rbpy_core_fetch_fdp_status, METH_NOARGS,
     "fetch_fdp_status($self, /)\n--\n\n"
     "-> [(placement_id, ruh_id), ...]: the FDP reclaim unit handles of the passthrough device."},
    {"nvme_info", rbpy_core_nvme_info, METH_NOARGS,
     "nvme_info($self, /)\n--\n\n"
     "-> dict | None: namespace id, LBA shift and size, bytes per NVMe command and the controller's Dataset "
     "Management limits of a passthrough core."},
    {"engine_state", rbpy_core_engine_state, METH_NOARGS,
     "engine_state($self, /)\n--\n\n"
     "-> (fixed_buffers_registered, fixed_buffer_registered_bytes, worker_error or None)"},
    {"io_scheduler", rbpy_core_io_scheduler, METH_NOARGS,
     "io_scheduler($self, /)\n--\n\n-> dict | None: the io_uring scheduler in effect"},
    {"_hold_engine", rbpy_core_hold_engine, METH_O,
     "_hold_engine($self, on, /)\n--\n\ntest hook: leave new requests queued while on"},
    {"_fail_engine_write", rbpy_core_fail_engine_write, METH_O,
     "_fail_engine_write($self, nth, /)\n--\n\ntest hook: the nth write attempt to complete reports EIO"},
    {"_trace_engine", rbpy_core_trace_engine, METH_O,
     "_trace_engine($self, n, /)\n--\n\ntest hook: the attempt completions recorded so far, then record n more"},
    {"_inject_engine_fault", rbpy_core_inject_engine_fault, METH_O,
     "_inject_engine_fault($self, kinds, /)\n--\n\ntest hook: io_uring worker faults (1 submit, 2 reap)"},
    {"_set_metadata_shortcut", (PyCFunction)(void (*)(void))rbpy_core_set_metadata_shortcut, METH_FASTCALL,
     "_set_metadata_shortcut($self, cls, descr, attr, /)\n--\n\n"
     "instances of exactly cls have their metadata read as obj.<attr> while cls.metadata is descr (a "
     "property returning that attribute); (None, None, None) turns it off"},
    {"_revalidate", rbpy_core_revalidate, METH_O,
     "_revalidate($self, sequential, /)\n--\n\n"
     "benchmark hook: -> dropped; re-read and check every slot header"},
    {"mem_bytes", rbpy_core_mem_bytes, METH_NOARGS,
     "mem_bytes($self, /)\n--\n\nbytes allocated by the index, the slot allocator and the metadata journal"},
    {"close", core_close, METH_NOARGS, "close($self, /)\n--\n\n-> dict"},
    {"_inject_fault", (PyCFunction)(void (*)(void))rbpy_core_inject_fault, METH_FASTCALL | METH_KEYWORDS,
     "_inject_fault($self, kind, countdown)\n--\n\n"
     "test hook: kind 'write', 'read', 'submit', 'prep' or 'flush' fails after countdown more"},
    {"_set_checkpoint_delay_ms", rbpy_core_set_ckpt_delay, METH_O,
     "_set_checkpoint_delay_ms($self, ms, /)\n--\n\ntest hook: delay each checkpoint writer"},
    {"_set_load_check_off", rbpy_core_set_load_check_off, METH_O,
     "_set_load_check_off($self, off, /)\n--\n\n"
     "benchmark hook: loads of verified records skip the slot-header check (never in service)"},
    {"_set_checkpoint_no_flush", rbpy_core_set_ckpt_no_flush, METH_O,
     "_set_checkpoint_no_flush($self, on, /)\n--\n\n"
     "benchmark hook: checkpoints skip their device flushes (measures what the flushes cost)"},
    {"_set_load_delay_ms", rbpy_core_set_load_delay, METH_O,
     "_set_load_delay_ms($self, ms, /)\n--\n\ntest hook: pause each load between its index snapshot and its reads"},
    {"_key_identity", (PyCFunction)(void (*)(void))rbpy_core_identity, METH_FASTCALL | METH_KEYWORDS | METH_STATIC,
     "_key_identity(key, namespace)\n--\n\ntest hook: the C slot identity of an encoded key"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef core_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(CoreObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot core_slots[] = {
    {Py_tp_new, core_new},
    {Py_tp_dealloc, core_dealloc},
    {Py_tp_traverse, core_traverse},
    {Py_tp_clear, core_tp_clear},
    {Py_tp_methods, core_methods},
    {Py_tp_members, core_members},
    {Py_tp_doc, "Native raw-block core (index, slots, checkpoints, I/O). Use lmcache_rawblock.RawBlockCore."},
    {0, NULL},
};

PyType_Spec rbpy_core_spec = {
    .name = "lmcache_rawblock._native.Core",
    .basicsize = sizeof(CoreObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = core_slots,
};
