/*
 * mlog.c - _native.read_metadata_log(path, block_align, meta_total_bytes=0): the region of a
 * log-format device read back (the core's reader, rb_mlog_read) as plain Python objects, for
 * `inspect` and `verify`. The device is only read. The GIL is held (a command-line tool's
 * call; the callbacks build Python objects).
 */
#include "rbpy.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "../core/rb_config.h"
#include "../core/rb_mlog.h"
#include "../core/rb_mlog_read.h"

typedef struct {
    int fd;
    rb_mlog_sb geom;   /* the superblock: slot offsets (rb_mlog_sb_slot_offset) */
    PyObject *entries; /* key (str) -> dict */
    PyObject *by_slot; /* slot (int) -> key */
    PyObject *classes; /* id -> fragment (str) */
    PyObject *damage;  /* list of dicts */
    PyObject *sb;
    uint64_t puts, frees;
} rd_ctx;

static int rd_pread(void *ctx, uint64_t off, void *buf, size_t len, rb_err *err)
{
    rd_ctx *r = ctx;
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(r->fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return rb_err_set(err, RB_ERR_OS, n < 0 ? errno : EIO, "read of %zu bytes at offset %llu failed", len,
                              (unsigned long long)off);
        done += (size_t)n;
    }
    return 0;
}

static PyObject *sb_dict(const rb_mlog_sb *sb)
{
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:I,s:K,s:I,s:((K,K),(K,K)),s:{s:I,s:I,s:K,s:K,s:K,s:I},s:{s:K,s:K,s:K,s:"
        "K}}",
        "sb_seq", (unsigned long long)sb->sb_seq, "generation", (unsigned long long)sb->generation, "block_align",
        (unsigned long long)sb->block_align, "header_bytes", (unsigned long long)sb->header_bytes, "slot_bytes",
        (unsigned long long)sb->slot_bytes, "data_base_offset", (unsigned long long)sb->data_base, "capacity_bytes",
        (unsigned long long)sb->capacity, "meta_total_bytes", (unsigned long long)sb->meta_total_bytes,
        "container_bytes", (unsigned long long)sb->container_bytes, "max_slots", (unsigned)sb->max_slots,
        "extent_stride", (unsigned long long)sb->extent_stride, "size_classes",
        (unsigned)(sb->size_classes > 1 ? sb->size_classes : 1), "base_areas", (unsigned long long)sb->areas[0].off,
        (unsigned long long)sb->areas[0].len, (unsigned long long)sb->areas[1].off,
        (unsigned long long)sb->areas[1].len, "base", "area", (unsigned)sb->base.area, "chunks",
        (unsigned)sb->base.n_chunks, "bytes", (unsigned long long)sb->base.len, "entries",
        (unsigned long long)sb->base.n_entries, "log_seq", (unsigned long long)sb->base.log_seq, "next_slot",
        (unsigned)sb->base.next_slot, "ring", "offset", (unsigned long long)sb->ring.off, "bytes",
        (unsigned long long)sb->ring.len, "start", (unsigned long long)sb->ring.start, "start_seq",
        (unsigned long long)sb->ring.start_seq);
}

static int cb_sb(void *ctx, const rb_mlog_sb *sb)
{
    rd_ctx *r = ctx;
    r->geom = *sb;
    r->sb = sb_dict(sb);
    return r->sb ? 0 : -1;
}

static int cb_cls(void *ctx, const rb_mlog_class *k)
{
    rd_ctx *r = ctx;
    PyObject *id = PyLong_FromUnsignedLong(k->id);
    PyObject *frag = PyUnicode_DecodeUTF8(k->frag, k->frag_len, "backslashreplace");
    int rc = id && frag ? PyDict_SetItem(r->classes, id, frag) : -1;
    Py_XDECREF(id);
    Py_XDECREF(frag);
    return rc;
}

/* Whatever slot holds leaves the state. */
static int vacate(rd_ctx *r, PyObject *slot)
{
    PyObject *old = PyDict_GetItemWithError(r->by_slot, slot); /* borrowed */
    if (!old)
        return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(old);
    int rc = PyDict_DelItem(r->entries, old) < 0 && !PyErr_ExceptionMatches(PyExc_KeyError) ? -1 : 0;
    if (rc == 0)
        PyErr_Clear();
    Py_DECREF(old);
    return rc == 0 ? PyDict_DelItem(r->by_slot, slot) : -1;
}

/* The entry's cached positions as a list of ints, or None. */
static PyObject *ent_positions(const rb_mlog_ent *e)
{
    if (e->npos < 0)
        Py_RETURN_NONE;
    PyObject *pos = PyList_New((Py_ssize_t)e->npos);
    for (int64_t i = 0; pos && i < e->npos; i++) {
        PyObject *x = PyLong_FromLongLong(e->pos[i]);
        if (!x)
            Py_CLEAR(pos);
        else
            PyList_SET_ITEM(pos, (Py_ssize_t)i, x);
    }
    return pos;
}

/* The dict entries[key] holds: slot, offset, size, class, checksum (or None), positions. */
static PyObject *ent_dict(const rd_ctx *r, const rb_mlog_ent *e)
{
    PyObject *pos = ent_positions(e);
    PyObject *sum = !pos                           ? NULL
                    : (e->flags & RB_MLOG_ENT_SUM) ? PyLong_FromUnsignedLongLong(e->checksum)
                                                   : Py_NewRef(Py_None);
    PyObject *d = sum ? Py_BuildValue("{s:I,s:K,s:K,s:I,s:N,s:O}", "slot", (unsigned)e->slot, "offset",
                                      (unsigned long long)rb_mlog_sb_slot_offset(&r->geom, e->slot, e->size), "size",
                                      (unsigned long long)e->size, "class", (unsigned)e->cls, "checksum", sum,
                                      "cached_positions", pos)
                      : NULL;
    Py_XDECREF(pos);
    return d;
}

/* A key that moves to another slot leaves its old one: by_slot forgets that slot. */
static int forget_old_slot(rd_ctx *r, PyObject *key)
{
    PyObject *prev = PyDict_GetItemWithError(r->entries, key); /* borrowed */
    if (!prev)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *ps = PyDict_GetItemString(prev, "slot");
    if (ps && PyDict_DelItem(r->by_slot, ps) < 0)
        PyErr_Clear();
    return 0;
}

/* A PUT (or a base entry): whatever held its slot and the key's old slot leave the state, the
 * key's dict goes in. */
static int put_ent(rd_ctx *r, const rb_mlog_ent *e)
{
    PyObject *slot = PyLong_FromUnsignedLong(e->slot);
    PyObject *key = PyUnicode_DecodeUTF8(e->key, e->key_len, "surrogateescape");
    PyObject *d = NULL;
    int rc = -1;
    if (slot && key && vacate(r, slot) == 0 && forget_old_slot(r, key) == 0 && (d = ent_dict(r, e)) &&
        PyDict_SetItem(r->entries, key, d) == 0 && PyDict_SetItem(r->by_slot, slot, key) == 0)
        rc = 0;
    Py_XDECREF(slot);
    Py_XDECREF(key);
    Py_XDECREF(d);
    return rc;
}

static int cb_ent(void *ctx, const rb_mlog_ent *e)
{
    return put_ent(ctx, e);
}

static int cb_rec(void *ctx, uint64_t seq, const rb_mlog_rec *x)
{
    (void)seq;
    rd_ctx *r = ctx;
    if (x->type == RB_MLOG_PUT) {
        r->puts++;
        return put_ent(r, &x->ent);
    }
    if (x->type == RB_MLOG_FREE) {
        r->frees++;
        PyObject *slot = PyLong_FromUnsignedLong(x->slot);
        int rc = slot ? vacate(r, slot) : -1;
        Py_XDECREF(slot);
        return rc;
    }
    return 0;
}

static int cb_damage(void *ctx, const rb_mlog_damage *d)
{
    rd_ctx *r = ctx;
    PyObject *o =
        Py_BuildValue("{s:I,s:I,s:L,s:K,s:K,s:N}", "chunk", (unsigned)d->index, "chunks", (unsigned)d->n_chunks,
                      "entries_lost", (long long)d->n_entries, "offset", (unsigned long long)d->off, "bytes",
                      (unsigned long long)d->len, "why", rbpy_text(d->why.msg));
    int rc = o ? PyList_Append(r->damage, o) : -1;
    Py_XDECREF(o);
    return rc;
}

/* The arguments: block_align (0: discover), meta_total_bytes (None or 0: discover), threads
 * (default 2). 0, or -1 with an exception. */
static int read_args(PyObject *const *a, uint64_t *ba, uint64_t *meta, uint64_t *threads)
{
    if (rbpy_as_u64(a[1], "block_align", ba) < 0 ||
        (a[2] && a[2] != Py_None && rbpy_as_u64(a[2], "meta_total_bytes", meta) < 0) ||
        (a[3] && rbpy_as_u64(a[3], "threads", threads) < 0))
        return -1;
    if (*ba != 0 && ((*ba & (*ba - 1)) || *ba > (1u << 30))) {
        PyErr_Format(PyExc_ValueError, "block_align must be 0 (discover) or a power of two up to 2**30, got %llu",
                     (unsigned long long)*ba);
        return -1;
    }
    return 0;
}

/* The region and block size when one is not given: what a superblock at offset 0, or at
 * LMCache's default container_bytes, records (and agrees with what was given). *meta = 0 when
 * no such superblock is there. */
static void discover_region(rd_ctx *r, uint64_t *ba, uint64_t *meta)
{
    const uint64_t span = 4096;
    uint8_t *blk = PyMem_Malloc(span);
    const uint64_t offs[2] = {0, rb_container_bytes(128ull << 20, *ba ? *ba : 4096)};
    int found = 0;
    for (int k = 0; blk && k < 2 && !found; k++) {
        rb_err e;
        rb_mlog_sb sb;
        if (rd_pread(r, offs[k], blk, span, &e) == 0 && rb_mlog_sb_decode(blk, span, &sb, &e) == 0 &&
            (*ba == 0 || sb.block_align == *ba) && (*meta == 0 || sb.meta_total_bytes == *meta)) {
            *meta = sb.meta_total_bytes;
            *ba = sb.block_align;
            found = 1;
        }
    }
    PyMem_Free(blk);
    if (!found)
        *meta = 0;
}

/* A superblock state's name. */
static const char *sb_state_name(int s)
{
    switch (s) {
    case RB_MLOG_SB_VALID:
        return "valid";
    case RB_MLOG_SB_ABSENT:
        return "absent";
    case RB_MLOG_SB_DAMAGED:
        return "damaged";
    case RB_MLOG_SB_NOBASE:
        return "no-base";
    default:
        return "io-error";
    }
}

/* read_metadata_log's "log" dict: the walk, and the damage it went on past. */
static PyObject *log_dict(const rb_mlog_read_result *res, const rd_ctx *r)
{
    static const char *const ends[] = {"end", "torn", "full", "io-error"};
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:s,s:N,s:K,s:K,s:K,s:K,s:L,s:K,s:K,s:N}", "groups", (unsigned long long)res->groups,
        "records", (unsigned long long)res->records, "last_seq", (unsigned long long)res->last_seq, "head",
        (unsigned long long)res->head, "live_bytes", (unsigned long long)res->used, "end",
        res->log_end >= 0 && res->log_end < 4 ? ends[res->log_end] : "?", "why", rbpy_text(res->log_why.msg), "puts",
        (unsigned long long)r->puts, "frees", (unsigned long long)r->frees, "gaps", (unsigned long long)res->gaps,
        "groups_lost", (unsigned long long)res->groups_lost, "records_lost", (long long)res->records_lost, "gap_at",
        (unsigned long long)res->gap_at, "gap_seq", (unsigned long long)res->gap_seq, "gap_why",
        rbpy_text(res->gap_why.msg));
}

/* read_metadata_log's dict of a region that was read (r holds what the callbacks built). */
static PyObject *result_dict(const rb_mlog_read_result *res, const rd_ctx *r)
{
    PyObject *log = log_dict(res, r);
    if (!log)
        return NULL;
    return Py_BuildValue(
        "{s:O,s:i,s:O,s:(ss),s:(NN),s:O,s:{s:K,s:I,s:I,s:L,s:O},s:N,s:O,s:O,s:O,s:K}", "found",
        res->found ? Py_True : Py_False, "superblock_used", res->which, "fallback", res->fallback ? Py_True : Py_False,
        "superblock_states", sb_state_name(res->sb_state[0]), sb_state_name(res->sb_state[1]), "superblock_errors",
        rbpy_text(res->sb_why[0].msg), rbpy_text(res->sb_why[1].msg), "superblock", r->sb ? r->sb : Py_None, "base",
        "entries", (unsigned long long)res->base.entries, "chunks_ok", (unsigned)res->base.chunks_ok, "chunks_bad",
        (unsigned)res->base.chunks_bad, "entries_lost", (long long)res->base.entries_lost, "complete",
        res->base.complete ? Py_True : Py_False, "log", log, "classes", r->classes, "entries", r->entries, "damage",
        r->damage, "bytes_read", (unsigned long long)res->bytes_read);
}

/* Read the region of r->fd (the GIL held: the callbacks build Python objects) into the dict, or
 * NULL with an exception. */
static PyObject *read_region(rd_ctx *r, uint64_t ba, uint64_t meta, uint64_t threads)
{
    r->entries = PyDict_New();
    r->by_slot = PyDict_New();
    r->classes = PyDict_New();
    r->damage = PyList_New(0);
    if (!r->entries || !r->by_slot || !r->classes || !r->damage)
        return NULL;
    if (meta == 0)
        return Py_BuildValue("{s:O}", "found", Py_False);
    rb_mlog_read_opts o = {.block_align = ba, .meta_total_bytes = meta, .threads = (uint32_t)(threads ? threads : 1)};
    rb_mlog_read_cb cb = {.ctx = r, .sb = cb_sb, .cls = cb_cls, .ent = cb_ent, .rec = cb_rec, .damage = cb_damage};
    rb_mlog_read_result res;
    memset(&res, 0, sizeof res);
    rb_err err;
    rb_err_clear(&err);
    if (rb_mlog_read(&o, rd_pread, r, &cb, &res, &err) != 0) {
        if (!PyErr_Occurred())
            rbpy_raise_err(&err);
        return NULL;
    }
    return result_dict(&res, r);
}

PyObject *rbpy_read_metadata_log(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)mod;
    static const char *const names[] = {"path", "block_align", "meta_total_bytes", "threads"};
    PyObject *a[4];
    uint64_t ba, meta = 0, threads = 2;
    if (rbpy_unpack("read_metadata_log", names, 4, 2, args, nargs, kwnames, a) < 0 ||
        read_args(a, &ba, &meta, &threads) < 0)
        return NULL;
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(a[0], &path))
        return NULL;
    rd_ctx r = {.fd = open(PyBytes_AS_STRING(path), O_RDONLY | O_CLOEXEC)};
    if (r.fd < 0)
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, a[0]);
    Py_DECREF(path);
    if (r.fd < 0)
        return NULL;
    if (meta == 0 || ba == 0)
        discover_region(&r, &ba, &meta);
    PyObject *out = read_region(&r, ba, meta, threads);
    close(r.fd);
    Py_XDECREF(r.entries);
    Py_XDECREF(r.by_slot);
    Py_XDECREF(r.classes);
    Py_XDECREF(r.damage);
    Py_XDECREF(r.sb);
    return out;
}
