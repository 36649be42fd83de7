/*
 * core_status.c - what a _native.Core reports: status() and its sub-dicts (trust, the log
 * format, deallocation), trust_counters(), and its device's engine, NVMe and FDP state.
 */
#include "core.h"

#include "../core/rb_uring.h"

/* GIL held: deallocation of freed slots, flat keys dealloc_*. 0, or -1 with an exception set. */
static int status_add_dealloc(PyObject *d, const rb_core_status *st)
{
    PyObject *t = Py_BuildValue(
        "{s:s,s:s,s:s,s:N,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d}", "dealloc_state", st->dealloc_state, "dealloc_kind",
        st->dealloc_kind, "dealloc_discard_path", st->dealloc_discard_path, "dealloc_unsupported_reason",
        rbpy_text(st->dealloc_why), "dealloc_slots", (unsigned long long)st->dealloc_slots, "dealloc_ranges",
        (unsigned long long)st->dealloc_ranges, "dealloc_commands", (unsigned long long)st->dealloc_cmds,
        "dealloc_bytes", (unsigned long long)st->dealloc_bytes, "dealloc_failures",
        (unsigned long long)st->dealloc_failures, "dealloc_skipped", (unsigned long long)st->dealloc_skipped,
        "dealloc_pending_slots", (unsigned long long)st->dealloc_pending, "dealloc_seconds",
        (double)st->dealloc_ns / 1e9);
    int rc = t ? PyDict_Update(d, t) : -1;
    Py_XDECREF(t);
    return rc;
}

/* GIL held: a list of the n values v, or NULL with an exception set. */
static PyObject *u64_list(const uint64_t *v, size_t n)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t k = 0; l && k < n; k++) {
        PyObject *x = PyLong_FromUnsignedLongLong(v[k]);
        if (!x)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, (Py_ssize_t)k, x);
    }
    return l;
}

/* GIL held: extents (extent_bytes), flat keys extent_* / extents_*: zeros when off. 0, or -1 with
 * an exception set. */
static int status_add_extents(PyObject *d, const rb_core_status *st)
{
    PyObject *t = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "extent_slots", (unsigned long long)st->extent_slots,
        "extents_total", (unsigned long long)st->extents_total, "extents_clean", (unsigned long long)st->extents_clean,
        "extents_open", (unsigned long long)st->extents_open, "extents_pending_dealloc",
        (unsigned long long)st->extents_pending, "extents_opened", (unsigned long long)st->extents_opened,
        "extent_fallbacks", (unsigned long long)st->extent_fallbacks, "extents_evicted",
        (unsigned long long)st->extents_evicted, "extent_deallocs", (unsigned long long)st->extent_deallocs,
        "extent_dealloc_skipped", (unsigned long long)st->extent_dealloc_skipped, "extent_base_offset",
        (unsigned long long)st->extent_base, "extent_stride", (unsigned long long)st->extent_stride,
        "extent_tail_bytes", (unsigned long long)st->extent_tail_bytes);
    if (t) {
        PyObject *a = Py_BuildValue("{s:K,s:s,s:K}", "extent_bytes", (unsigned long long)st->extent_bytes,
                                    "extent_bytes_source", st->extent_source ? st->extent_source : "setting",
                                    "extent_reclaim_unit_bytes", (unsigned long long)st->extent_reclaim_unit);
        if (!a || PyDict_Update(t, a) < 0)
            Py_CLEAR(t);
        Py_XDECREF(a);
    }
    int rc = t ? PyDict_Update(d, t) : -1;
    Py_XDECREF(t);
    if (rc < 0)
        return rc;
    /* size classes: how many, each class's slot bytes and extents now (empty lists when off) */
    size_t n = st->size_classes > 1 ? (size_t)st->size_classes : 0;
    PyObject *bytes = u64_list(st->class_slot_bytes, n), *exts = u64_list(st->class_extents, n);
    t = bytes && exts ? Py_BuildValue("{s:K,s:O,s:O,s:K}", "size_classes",
                                      (unsigned long long)(st->size_classes ? st->size_classes : 1),
                                      "size_class_slot_bytes", bytes, "size_class_extents", exts, "size_class_dropped",
                                      (unsigned long long)st->size_class_dropped)
                      : NULL;
    Py_XDECREF(bytes);
    Py_XDECREF(exts);
    rc = t ? PyDict_Update(d, t) : -1;
    Py_XDECREF(t);
    return rc;
}

/* GIL held: into the metadata_log dict l, the damage the recovery's log walk went on past
 * (docs/metadata-log.md, "What damage costs"). 0, or -1 with an exception set. */
static int log_add_damage(PyObject *l, const rb_core_status *st)
{
    PyObject *g = Py_BuildValue("{s:K,s:K,s:L}", "recovered_gaps", (unsigned long long)st->log_recovered_gaps,
                                "recovered_groups_lost", (unsigned long long)st->log_recovered_groups_lost,
                                "recovered_records_lost", (long long)st->log_recovered_records_lost);
    int rc = g ? PyDict_Update(l, g) : -1;
    Py_XDECREF(g);
    return rc;
}

/* GIL held: the metadata format and, for the log format, its figures. 0, or -1 with an
 * exception set. */
/* The deletes' lane: FREE groups written ahead of the waiting pages, and their records. */
static int log_add_lane(PyObject *l, const rb_core_status *st)
{
    PyObject *v =
        Py_BuildValue("{s:K,s:K,s:K}", "groups", (unsigned long long)st->log_lane_groups, "records",
                      (unsigned long long)st->log_lane_records, "in_flush", (unsigned long long)st->log_lane_in_flush);
    int rc = v ? PyDict_SetItemString(l, "free_lane", v) : -1;
    Py_XDECREF(v);
    return rc;
}

static int log_add_extras(PyObject *l, const rb_core_status *st)
{
    return log_add_damage(l, st) < 0 ? -1 : log_add_lane(l, st);
}

static int status_add_log(PyObject *d, const rb_core_status *st)
{
    static const char *const states[] = {"fresh", "v1-to-move", "live"};
    PyObject *fmt = PyUnicode_FromString(st->meta_format == RB_META_LOG ? "log" : "v1");
    int rc = fmt ? PyDict_SetItemString(d, "meta_format", fmt) : -1;
    Py_XDECREF(fmt);
    PyObject *secs = rc == 0 ? PyFloat_FromDouble((double)st->recovery_ns / 1e9) : NULL;
    rc = secs ? PyDict_SetItemString(d, "recovery_seconds", secs) : -1;
    Py_XDECREF(secs);
    if (rc < 0 || st->meta_format != RB_META_LOG)
        return rc;
    PyObject *l = Py_BuildValue(
        "{s:s,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:K,s:K,s:K,s:K,s:K,s:K}", "state",
        st->log_state >= 0 && st->log_state < 3 ? states[st->log_state] : "?", "ring_bytes",
        (unsigned long long)st->log_ring_bytes, "live_bytes", (unsigned long long)st->log_live_bytes, "seq",
        (unsigned long long)st->log_seq, "groups_written", (unsigned long long)st->log_groups_written, "bytes_written",
        (unsigned long long)st->log_bytes_written, "last_group_bytes", (unsigned long long)st->log_last_group_bytes,
        "last_group_records", (unsigned long long)st->log_last_group_records, "pending_pages",
        (unsigned long long)st->log_pending_pages, "pending_records", (unsigned long long)st->log_pending_records,
        "journal_bytes", (unsigned long long)st->log_journal_bytes, "bases_written",
        (unsigned long long)st->bases_written, "base_last_bytes", (unsigned long long)st->base_last_bytes,
        "base_last_entries", (unsigned long long)st->base_last_entries, "base_too_large",
        (unsigned long long)st->base_too_large, "compactions", (unsigned long long)st->compactions, "base_last_seconds",
        (double)st->base_last_ns / 1e9, "journal_lost", (unsigned long long)st->log_journal_lost, "ring_full",
        (unsigned long long)st->log_ring_full, "recovered_groups", (unsigned long long)st->log_recovered_groups,
        "recovered_records", (unsigned long long)st->log_recovered_records, "base_area_bytes",
        (unsigned long long)st->base_area_bytes, "generation", (unsigned long long)st->log_generation);
    if (l) {
        PyObject *rs = PyFloat_FromDouble((double)st->recovery_read_ns / 1e9);
        if (!rs || PyDict_SetItemString(l, "recovery_read_seconds", rs) < 0)
            Py_CLEAR(l);
        Py_XDECREF(rs);
    }
    if (l && log_add_extras(l, st) < 0)
        Py_CLEAR(l);
    rc = l ? PyDict_SetItemString(d, "metadata_log", l) : -1;
    Py_XDECREF(l);
    return rc;
}

/* GIL held: the trust fields of a status dict: header refusals at load, write-back failures,
 * device shrink, and the fault journal (faults: oldest first; fault_counts: errno -> count,
 * 0 for any errno past the table). 0, or -1 with an exception set. */
static int status_add_trust(PyObject *d, const rb_core_status *st)
{
    PyObject *faults = PyList_New(0), *counts = PyDict_New();
    int rc = faults && counts ? 0 : -1;
    for (uint32_t k = 0; rc == 0 && k < st->n_faults_kept; k++) {
        const rb_fault *f = &st->faults[k];
        PyObject *off = f->offset == UINT64_MAX ? Py_NewRef(Py_None) : PyLong_FromUnsignedLongLong(f->offset);
        PyObject *fd = Py_BuildValue("{s:K,s:d,s:s,s:N,s:i,s:N}", "seq", (unsigned long long)f->seq, "time",
                                     (double)f->time_ns / 1e9, "op", f->op, "offset", off, "errno", f->errnum, "text",
                                     rbpy_text(f->text));
        rc = fd ? PyList_Append(faults, fd) : -1;
        Py_XDECREF(fd);
    }
    for (int e = 0; rc == 0 && e < RB_ERRNO_SLOTS; e++) {
        if (!st->fault_by_errno[e])
            continue;
        PyObject *k = PyLong_FromLong(e), *v = PyLong_FromUnsignedLongLong(st->fault_by_errno[e]);
        rc = k && v ? PyDict_SetItem(counts, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    PyObject *t = rc == 0 ? Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O,s:O}", "load_rejected_entries",
                                          st->load_rejected, "writeback_failures", st->writeback_failures,
                                          "writeback_dropped_entries", st->writeback_dropped, "shrink_dropped_entries",
                                          st->shrink_dropped, "retired_slots", st->retired_slots, "undurable_writes",
                                          st->undurable_writes, "usable_slots", st->usable_slots, "device_size_bytes",
                                          st->device_size, "faults_total", st->faults_total, "faults", faults,
                                          "fault_counts", counts)
                          : NULL;
    rc = t ? PyDict_Update(d, t) : -1;
    Py_XDECREF(t);
    Py_XDECREF(faults);
    Py_XDECREF(counts);
    return rc;
}

/* GIL held: status()'s core-wide figures, io (the device's counters, stolen) among them. A new
 * dict, or NULL with an exception set. */
static PyObject *status_base(const rb_core_status *st, PyObject *io)
{
    static const char *const outcomes[] = {"blank",    "skipped",    "loaded", "fallback",
                                           "rejected", "unreadable", "damaged"};
    const char *outcome = st->recovery_outcome >= 0 && st->recovery_outcome < 7 ? outcomes[st->recovery_outcome] : "?";
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O,s:O,s:N,"
        "s:s,s:K,s:K,s:L,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:N}",
        "capacity_bytes", st->capacity_bytes, "data_base_offset", st->data_base, "container_bytes", st->container_bytes,
        "max_slots", st->max_slots, "next_slot", st->next_slot, "free_slot_count", st->free_slots, "indexed_key_count",
        st->indexed, "inflight_key_count", st->inflight_keys, "locked_key_count", st->locked_keys, "inflight_io_count",
        st->inflight_io, "metadata_seq", st->meta_seq, "metadata_dirty_total", st->dirty_total, "metadata_persisted",
        st->persisted, "fdp_slot_affinity_hit_count", st->affinity_hits, "fdp_slot_affinity_fallback_count",
        st->affinity_fallbacks, "checkpoints_written", st->ckpt_written, "checkpoint_failures", st->ckpt_failures,
        "checkpoint_too_large_count", st->ckpt_too_large, "payload_checksum_failures", st->checksum_failures,
        "recovery_dropped_entries", st->recovery_dropped, "recovery_loaded_entries", st->recovery_entries_loaded,
        "unverified_entry_count", st->unverified, "load_verified_entries", st->deferred_verified,
        "load_dropped_entries", st->deferred_dropped, "recovery_loaded", st->recovery_loaded ? Py_True : Py_False,
        "closed", st->closed ? Py_True : Py_False, "checkpoint_last_error", rbpy_text(st->ckpt_error),
        "recovery_outcome", outcome, "recovery_seq", st->recovery_seq, "recovery_rejected_seq",
        st->recovery_rejected_seq, "recovery_lost_entries", (long long)st->recovery_lost, "checkpoint_held_slots",
        st->held_slots, "checkpoint_held_slots_total", st->held_total, "checkpoints_for_room", st->room_ckpts,
        "payload_checksum_dropped_entries", st->checksum_dropped, "device_flushes", st->flushes, "device_write_behinds",
        st->write_behinds, "recovery_skipped_entries", st->skipped, "io", io);
}

/* GIL held: d["device_lock"], the device's lock: "exclusive", "unsupported" (no flock on its
 * file system), "released". 0, or -1 with an exception set. */
static int status_add_lock(PyObject *d, rb_core *c)
{
    rb_dev *dev = rb_core_device(c);
    PyObject *lock = PyUnicode_FromString(dev ? rb_dev_lock_name(dev) : "released");
    int rc = lock ? PyDict_SetItemString(d, "device_lock", lock) : -1;
    Py_XDECREF(lock);
    return rc;
}

PyObject *rbpy_core_status(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_core_status st;
    /* without the GIL: the core's mutex may be held for milliseconds (a checkpoint, a
     * compaction), and the evictor reads the status between puts */
    Py_BEGIN_ALLOW_THREADS
        rb_core_status_get(rbpy_core_of(op), &st);
    Py_END_ALLOW_THREADS
    PyObject *io = rbpy_io_stats_dict(&st.io);
    PyObject *d = io ? status_base(&st, io) : NULL;
    if (d && (status_add_trust(d, &st) < 0 || status_add_log(d, &st) < 0 || status_add_dealloc(d, &st) < 0 ||
              status_add_extents(d, &st) < 0 || status_add_lock(d, rbpy_core_of(op)) < 0))
        Py_CLEAR(d);
    return d;
}

/*
 * counts() -> (usable_slots, indexed, inflight, free, next_slot, held, locked, room_checkpoints,
 * closed, extent_slots, extents_total, extents_clean, extents_open, extents_pending_dealloc,
 * extents_opened, extent_fallbacks, extents_evicted, extent_deallocs, extent_dealloc_skipped,
 * extent_base_offset, extent_stride, extent_tail_bytes, extent_bytes, extent_reclaim_unit_bytes):
 * the figures of status() under those names (the first nine its usable_slots, indexed_key_count,
 * inflight_key_count, free_slot_count, next_slot, checkpoint_held_slots, locked_key_count,
 * checkpoints_for_room, closed as 0 or 1) from one hold of the core mutex, without building the status.
 */
PyObject *rbpy_core_counts(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_core_status st;
    /* without the GIL while waiting for the core's mutex, as status() */
    Py_BEGIN_ALLOW_THREADS
        rb_core_counts_get(rbpy_core_of(op), &st);
    Py_END_ALLOW_THREADS
    return rbpy_counts_tuple(&st);
}

PyObject *rbpy_counts_tuple(const rb_core_status *st)
{
    return Py_BuildValue("(KKKKKKKKiKKKKKKKKKKKKKKK)", (unsigned long long)st->usable_slots,
                         (unsigned long long)st->indexed, (unsigned long long)st->inflight_keys,
                         (unsigned long long)st->free_slots, (unsigned long long)st->next_slot,
                         (unsigned long long)st->held_slots, (unsigned long long)st->locked_keys,
                         (unsigned long long)st->room_ckpts, st->closed ? 1 : 0, (unsigned long long)st->extent_slots,
                         (unsigned long long)st->extents_total, (unsigned long long)st->extents_clean,
                         (unsigned long long)st->extents_open, (unsigned long long)st->extents_pending,
                         (unsigned long long)st->extents_opened, (unsigned long long)st->extent_fallbacks,
                         (unsigned long long)st->extents_evicted, (unsigned long long)st->extent_deallocs,
                         (unsigned long long)st->extent_dealloc_skipped, (unsigned long long)st->extent_base,
                         (unsigned long long)st->extent_stride, (unsigned long long)st->extent_tail_bytes,
                         (unsigned long long)st->extent_bytes, (unsigned long long)st->extent_reclaim_unit);
}

/* trust_counters() -> (faults_total, load_rejected_entries, writeback_dropped_entries,
 * shrink_dropped_entries): what the facade watches after a call with failures, cheaply. */
PyObject *rbpy_core_trust_counters(PyObject *op, PyObject *unused)
{
    (void)unused;
    uint64_t v[4];
    rb_core_trust_counts(rbpy_core_of(op), v);
    return Py_BuildValue("(KKKK)", (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2],
                         (unsigned long long)v[3]);
}

/* fetch_fdp_status() -> [(placement_id, ruh_id), ...] of the core's passthrough device. */
PyObject *rbpy_core_fetch_fdp_status(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_dev *dev = rb_core_device(rbpy_core_of(op));
    if (!dev) {
        PyErr_SetString(PyExc_RuntimeError, "RawBlockCore is closed");
        return NULL;
    }
    return rbpy_fdp_status(dev, "fetch_fdp_status requires io_engine='io_uring' with use_uring_cmd=true");
}

/* nvme_info() -> dict(nsid, lba_shift, lba_size, max_data_transfer_size, size_bytes) of a
 * passthrough core, or None. */
PyObject *rbpy_core_nvme_info(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_dev *dev = rb_core_device(rbpy_core_of(op));
    rb_nvme_ns ns;
    if (!dev || !rb_dev_nvme_ns(dev, &ns))
        Py_RETURN_NONE;
    /* Dataset Management as the controller describes it (zeros on the three when it did not). */
    static const char *const reads[] = {"not reported", "zeros", "ones"};
    rb_nvme_dsm dsm;
    rb_dev_nvme_dsm(dev, &dsm);
    return Py_BuildValue("{s:I,s:I,s:I,s:n,s:K,s:O,s:I,s:I,s:s}", "nsid", ns.nsid, "lba_shift", ns.lba_shift,
                         "lba_size", ns.lba_size, "max_data_transfer_size", (Py_ssize_t)rb_dev_max_transfer(dev),
                         "size_bytes", (unsigned long long)rb_dev_size(dev), "dsm_supported",
                         dsm.supported ? Py_True : Py_False, "dsm_max_ranges", dsm.max_ranges, "dsm_max_range_blocks",
                         dsm.max_range_lbas, "deallocated_reads",
                         dsm.dlfeat_read < 3 ? reads[dsm.dlfeat_read] : "reserved");
}

/*
 * engine_state() -> (fixed_buffers_registered, fixed_buffer_registered_bytes, worker_error):
 * the io_uring engine's registration and its fatal error (None while it runs; "stopped" text
 * when it refuses work without one while the core is open). A closed device reports
 * (False, 0, None), as LMCache's core does once its device is gone.
 */
PyObject *rbpy_core_engine_state(PyObject *op, PyObject *unused)
{
    (void)unused;
    rb_dev *dev = rb_core_device(rbpy_core_of(op));
    int reg = 0, has_err = 0, stopped = 0;
    uint64_t bytes = 0;
    char msg[256];
    msg[0] = 0;
    if (dev && rb_dev_enter(dev) == 0) {
        struct rb_uring *u = rb_dev_uring(dev);
        if (u) {
            rb_uring_fixed_status(u, &reg, &bytes);
            has_err = rb_uring_worker_error(u, msg, sizeof msg);
            stopped = rb_uring_stopped(u);
        }
        rb_dev_leave(dev);
    }
    PyObject *err;
    if (has_err)
        err = PyUnicode_FromString(msg);
    else if (stopped)
        err = PyUnicode_FromString("io_uring worker stopped");
    else
        err = Py_NewRef(Py_None);
    if (!err)
        return NULL;
    return Py_BuildValue("(OKN)", reg ? Py_True : Py_False, (unsigned long long)bytes, err);
}
