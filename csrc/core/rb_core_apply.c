/*
 * rb_core_apply.c - a state v1 document applied to the index (recovery of format v1, and
 * apply_state_json at run time): the top-level checks, then the index and the allocator rebuilt
 * from the entries, then slot-header validation when configured.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

static int64_t *json_int_list(struct json_object *o, int64_t *n, int *bad)
{
    *bad = 0;
    *n = -1;
    if (!o || json_object_get_type(o) == json_type_null)
        return NULL;
    if (json_object_get_type(o) != json_type_array) {
        *bad = 1;
        return NULL;
    }
    size_t len = json_object_array_length(o);
    int64_t *v = malloc((len ? len : 1) * sizeof(int64_t));
    if (!v) {
        *bad = 1;
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        if (rb_json_as_i64(json_object_array_get_idx(o, i), &v[i]) < 0) {
            free(v);
            *bad = 1;
            return NULL;
        }
    }
    *n = (int64_t)len;
    return v;
}

static const char *json_opt_str(struct json_object *o, size_t *len)
{
    if (!o || json_object_get_type(o) != json_type_string)
        return NULL; /* null (or a non-string, stored as null) */
    *len = (size_t)json_object_get_string_len(o);
    return json_object_get_string(o);
}

/*
 * A checkpoint's top-level fields, from either reader. Integer fields: st 0 absent, 1 an
 * integer (val), 2 present but not convertible. Strings: str_st 0 absent, 1 a string, 2 other.
 */
typedef struct top_view {
    uint8_t st[RB_FTOP_N];
    int64_t val[RB_FTOP_N];
    uint8_t str_st[RB_FTOP_N];
    const char *str[RB_FTOP_N];
    size_t str_len[RB_FTOP_N];
} top_view;

static int top_matches(const top_view *t, int f, uint64_t want)
{
    return t->st[f] == 0 || (t->st[f] == 1 && t->val[f] >= 0 && (uint64_t)t->val[f] == want);
}

/* 1 acceptable (next_slot set), 0 rejected (err says why). */
static int check_top(rb_core *c, const top_view *t, int64_t *next_slot, rb_err *err)
{
    if (t->st[RB_FTOP_VERSION] != 1 || t->val[RB_FTOP_VERSION] != 1) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata version unsupported; ignoring metadata");
        return 0;
    }
    if (t->str_st[RB_FTOP_DEVICE_PATH] == 1 && t->str_len[RB_FTOP_DEVICE_PATH] > 0 &&
        strcmp(t->str[RB_FTOP_DEVICE_PATH], c->path) != 0) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata device_path mismatch; ignoring metadata");
        return 0;
    }
    static const int fields[] = {RB_FTOP_BLOCK_ALIGN, RB_FTOP_HEADER_BYTES, RB_FTOP_SLOT_BYTES, RB_FTOP_META_TOTAL};
    const uint64_t want[] = {c->cfg.block_align, c->cfg.header_bytes, c->cfg.slot_bytes, c->cfg.meta_total_bytes};
    for (int i = 0; i < 4; i++) {
        if (!top_matches(t, fields[i], want[i])) {
            rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata %s mismatch; ignoring metadata",
                       rb_ftop_names[fields[i]]);
            return 0;
        }
    }
    if (t->str_st[RB_FTOP_META_MAGIC] && (t->str_st[RB_FTOP_META_MAGIC] != 1 || t->str_len[RB_FTOP_META_MAGIC] != 8 ||
                                          memcmp(t->str[RB_FTOP_META_MAGIC], c->cfg.meta_magic, 8) != 0)) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata meta_magic mismatch; ignoring metadata");
        return 0;
    }
    if (!top_matches(t, RB_FTOP_META_VERSION, c->cfg.meta_version)) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata meta_version mismatch; ignoring metadata");
        return 0;
    }
    int64_t ns = t->val[RB_FTOP_NEXT_SLOT];
    if (t->st[RB_FTOP_NEXT_SLOT] != 1 || ns < 0 || (uint64_t)ns > c->max_slots) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata next_slot invalid; ignoring metadata");
        return 0;
    }
    *next_slot = ns;
    return 1;
}

/* Clear the index and slots for a new state (takes mu; returns with it held on success). */
static int apply_begin(rb_core *c, int64_t next_slot, uint8_t **used_out, rb_err *err)
{
    /* A deallocation in progress ends first: its slots must not take keys of the new state. */
    pthread_mutex_lock(&c->dl_mu);
    pthread_mutex_lock(&c->mu);
    pthread_mutex_unlock(&c->dl_mu);
    /* Slots reserved by puts in flight stay reserved, also those at or beyond the state's
     * next_slot: the allocator's next_slot moves past them, or it would hand them out again
     * while the put still commits its key there. */
    int64_t top = next_slot;
    for (uint32_t p = 0; p < c->inflight.n_ents; p++)
        if (!(c->inflight.ents[p].flags & RB_ENT_DEAD) && c->inflight.ents[p].slot >= (uint64_t)top)
            top = (int64_t)c->inflight.ents[p].slot + 1;
    uint8_t *used = calloc((size_t)top + 1, 1);
    if (!used) {
        pthread_mutex_unlock(&c->mu);
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    }
    rb_idx_clear(&c->index);
    c->locked_keys = 0;
    c->n_unverified = 0;
    /* The allocator is rebuilt from the new state: a quarantined slot is either claimed by it or
     * freed again by apply_end (and quarantined anew if readers are still in flight). */
    rb_core_quarantine_reset_locked(c);
    rb_core_dealloc_reset_locked(c);
    if (rb_slots_reset(&c->slots, (uint32_t)top) < 0) {
        pthread_mutex_unlock(&c->mu);
        free(used);
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    }
    for (uint32_t p = 0; p < c->inflight.n_ents; p++)
        if (!(c->inflight.ents[p].flags & RB_ENT_DEAD))
            used[c->inflight.ents[p].slot] = 1;
    *used_out = used;
    return 0;
}

/* The slot an entry takes, or -1 when it is skipped: LMCache's offset/size rules, plus ours
 * (a slot never handed out, or one already claimed). mu held. */
static int64_t entry_slot(const rb_core *c, const uint8_t *used, int64_t next_slot, int has_off, int64_t off,
                          int has_size, int64_t size)
{
    if (!has_off || !has_size)
        return -1;
    if (off < 0 || (uint64_t)off < c->data_base || ((uint64_t)off - c->data_base) % c->cfg.slot_bytes)
        return -1;
    uint64_t slot = ((uint64_t)off - c->data_base) / c->cfg.slot_bytes;
    if (slot >= c->max_slots || size <= 0 || (uint64_t)size > c->slot_cap)
        return -1;
    if (slot >= (uint64_t)next_slot || used[slot])
        return -1;
    return (int64_t)slot;
}

/* Add one entry (mu held). 0, or -1 when out of memory. */
static int insert_entry(rb_core *c, uint8_t *used, const char *key, size_t klen, uint32_t h, uint32_t slot,
                        int64_t size, uint32_t cls, const int64_t *pos, int64_t npos, int has_sum, uint64_t sum)
{
    uint32_t p = cls == UINT32_MAX ? UINT32_MAX : rb_idx_insert(&c->index, key, klen, h, pos, npos);
    if (p == UINT32_MAX)
        return -1;
    rb_ent *e = &c->index.ents[p];
    e->slot = slot;
    e->size = (uint64_t)size;
    e->cls = cls;
    if (has_sum) {
        e->checksum = sum;
        e->flags |= RB_ENT_HAS_SUM;
    }
    /* Judged by validate_entries right after (verify_on_load), else by its first load. */
    e->flags |= RB_ENT_UNVERIFIED;
    c->n_unverified++;
    used[slot] = 1;
    return 0;
}

/* Free the unclaimed slots, reset the dirty state, drop mu; then validate if configured. */
static int apply_end(rb_core *c, uint8_t *used, uint64_t loaded, uint64_t skipped, int oom, rb_err *err)
{
    c->apply_skipped = skipped; /* entries the state lists that its checks refused */
    if (c->apply_container >= 0) {
        /* Recovery: what the container lists, exactly, before validation drops anything (a
         * dropped entry's slot stays listed on the device until a checkpoint replaces it). */
        const uint8_t bit = (uint8_t)(1u << c->apply_container);
        if (rb_core_ref_reserve_locked(c, c->slots.next_slot) < 0) {
            oom = 1;
            c->ref_unknown |= bit; /* keeps every slot out of use until it is rewritten */
        } else {
            for (uint32_t s = 0; s < c->slots.next_slot; s++)
                if (used[s])
                    c->ref[s] |= bit;
            c->ref_unknown &= (uint8_t)~bit;
        }
    }
    for (uint32_t s = 0; s < c->slots.next_slot; s++) /* the state's, or past the in-flight slots */
        if (!used[s])
            rb_core_free_slot_locked(c, s); /* quarantined while readers of the old state run */
    c->dirty_total = 0;
    c->persisted = 0;
    c->recovery_entries_loaded = loaded;
    if (c->ml.on && c->apply_container < 0) {
        /* A state applied at run time replaced the index without journaling it: the next
         * checkpoint writes a whole base, and until it is durable no slot is reused (the log on
         * the device may list any). */
        c->ml.need_base++;
        c->ref_unknown |= 0x4u;
        c->dirty_total = 1;
    }
    pthread_mutex_unlock(&c->mu);
    free(used);
    if (oom)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory applying metadata");
    if (c->cfg.meta_verify_on_load || c->cfg.verify_payload_checksum) {
        if (rb_core_validate_entries(c, 0) < 0)
            return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory validating slot headers");
    }
    return 1;
}

static void json_top_view(struct json_object *st, top_view *t)
{
    memset(t, 0, sizeof(*t));
    for (int f = 0; f < RB_FTOP_N; f++) {
        struct json_object *o;
        if (f == RB_FTOP_ENTRIES || !json_object_object_get_ex(st, rb_ftop_names[f], &o))
            continue;
        t->st[f] = rb_json_as_i64(o, &t->val[f]) == 0 ? 1 : 2;
        if (json_object_get_type(o) == json_type_string) {
            t->str_st[f] = 1;
            t->str[f] = json_object_get_string(o);
            t->str_len[f] = (size_t)json_object_get_string_len(o);
        } else {
            t->str_st[f] = 2;
        }
    }
}

/* 1 applied, 0 rejected (reason in err->msg), <0 error. Runs without any core lock held. */
static int apply_state(rb_core *c, struct json_object *st, rb_err *err)
{
    if (!st || json_object_get_type(st) != json_type_object) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "metadata is not an object");
        return 0;
    }
    top_view t;
    json_top_view(st, &t);
    int64_t next_slot;
    if (!check_top(c, &t, &next_slot, err))
        return 0;
    struct json_object *entries = NULL;
    json_object_object_get_ex(st, "entries", &entries);
    struct json_object *entries_raw = entries;
    int bad_entries = entries && json_object_get_type(entries) != json_type_object;
    if (bad_entries)
        entries = NULL;

    uint8_t *used;
    int rc = apply_begin(c, next_slot, &used, err);
    if (rc < 0)
        return rc;
    uint64_t loaded = 0, skipped = 0;
    int oom = 0;
    if (bad_entries) /* an "entries" that is not an object: whatever it held is lost */
        skipped +=
            json_object_get_type(entries_raw) == json_type_array ? (uint64_t)json_object_array_length(entries_raw) : 1;
    if (entries) {
        json_object_object_foreach(entries, key, val)
        {
            if (!val || json_object_get_type(val) != json_type_object) {
                skipped++;
                continue;
            }
            struct json_object *fo, *fs;
            int64_t off = 0, size = 0;
            int has_off = json_object_object_get_ex(val, "offset", &fo) && rb_json_as_i64(fo, &off) == 0;
            int has_size = json_object_object_get_ex(val, "size", &fs) && rb_json_as_i64(fs, &size) == 0;
            int64_t slot = entry_slot(c, used, next_slot, has_off, off, has_size, size);
            if (slot < 0) {
                skipped++;
                continue;
            }
            uint64_t sum = 0;
            int has_sum = json_object_object_get_ex(val, RB_ENT_SUM_FIELD, &fo);
            if (has_sum &&
                (json_object_get_type(fo) != json_type_string ||
                 rb_sum_parse_hex(json_object_get_string(fo), (size_t)json_object_get_string_len(fo), &sum) < 0)) {
                skipped++;
                continue; /* a checksum we cannot read: the entry cannot be trusted */
            }
            size_t klen = strlen(key);
            uint32_t h = rb_idx_hash(key, klen);
            if (rb_idx_find(&c->index, key, klen, h) != UINT32_MAX) {
                skipped++;
                continue;
            }
            struct json_object *jo;
            int bad_shape, bad_pos;
            int64_t ndim, npos;
            int64_t *dims = json_int_list(json_object_object_get_ex(val, "shape", &jo) ? jo : NULL, &ndim, &bad_shape);
            int64_t *pos =
                json_int_list(json_object_object_get_ex(val, "cached_positions", &jo) ? jo : NULL, &npos, &bad_pos);
            rb_meta_in m = {0};
            m.ndim = bad_shape ? -1 : ndim;
            m.dims = dims;
            m.npos = bad_pos ? -1 : npos;
            m.pos = pos;
            m.dtype = json_opt_str(json_object_object_get_ex(val, "dtype", &jo) ? jo : NULL, &m.dtype_len);
            m.fmt = json_opt_str(json_object_object_get_ex(val, "fmt", &jo) ? jo : NULL, &m.fmt_len);
            uint32_t cls = rb_core_intern_class(c, &m);
            int r = insert_entry(c, used, key, klen, h, (uint32_t)slot, size, cls, m.pos, m.npos, has_sum, sum);
            free(dims);
            free(pos);
            if (r < 0) {
                oom = 1;
                break;
            }
            loaded++;
        }
    }
    return apply_end(c, used, loaded, skipped, oom, err);
}

static int same_class(const rb_fstate *fs, const rb_fent *a, const rb_fent *b)
{
    return a->ndim == b->ndim &&
           (a->ndim <= 0 || memcmp(fs->pool + a->dims_at, fs->pool + b->dims_at, (size_t)a->ndim * 8) == 0) &&
           !a->dtype == !b->dtype && a->dtype_len == b->dtype_len &&
           (!a->dtype || memcmp(a->dtype, b->dtype, a->dtype_len) == 0) && !a->fmt == !b->fmt &&
           a->fmt_len == b->fmt_len && (!a->fmt || memcmp(a->fmt, b->fmt, a->fmt_len) == 0);
}

/* apply_state for a document read by rb_fstate_parse: same checks, same rules, same order. */
static int apply_fstate(rb_core *c, const rb_fstate *fs, rb_err *err)
{
    top_view t;
    memset(&t, 0, sizeof(t));
    char path_buf[4096];
    for (int f = 0; f < RB_FTOP_N; f++) {
        if (f == RB_FTOP_ENTRIES || !fs->has[f])
            continue;
        if (f == RB_FTOP_DEVICE_PATH || f == RB_FTOP_META_MAGIC) {
            t.str_st[f] = 1;
            t.str[f] = fs->str[f];
            t.str_len[f] = fs->str_len[f];
        } else {
            t.st[f] = 1;
            t.val[f] = fs->num[f];
            t.str_st[f] = 2;
        }
    }
    /* check_top compares the device path as a C string. */
    if (t.str_st[RB_FTOP_DEVICE_PATH] == 1) {
        size_t n = t.str_len[RB_FTOP_DEVICE_PATH];
        if (n >= sizeof path_buf)
            n = sizeof path_buf - 1; /* longer than PATH_MAX: cannot equal c->path either */
        memcpy(path_buf, t.str[RB_FTOP_DEVICE_PATH], n);
        path_buf[n] = 0;
        t.str[RB_FTOP_DEVICE_PATH] = path_buf;
    }
    int64_t next_slot;
    if (!check_top(c, &t, &next_slot, err))
        return 0;
    uint8_t *used;
    int rc = apply_begin(c, next_slot, &used, err);
    if (rc < 0)
        return rc;
    uint64_t loaded = 0, skipped = 0;
    int oom = 0;
    const rb_fent *prev = NULL; /* last interned entry: consecutive entries mostly share a class */
    uint32_t prev_cls = UINT32_MAX;
    for (size_t i = 0; i < fs->n; i++) {
        const rb_fent *e = &fs->ents[i];
        int64_t slot = entry_slot(c, used, next_slot, e->has_off, e->off, e->has_size, e->size);
        if (slot < 0) {
            skipped++;
            continue; /* keys are distinct (rb_fstate_parse): no index lookup needed */
        }
        uint32_t cls;
        if (prev && same_class(fs, prev, e)) {
            cls = prev_cls;
        } else {
            rb_meta_in m = {0};
            m.ndim = e->ndim;
            m.dims = e->ndim > 0 ? fs->pool + e->dims_at : NULL;
            m.dtype = e->dtype;
            m.dtype_len = e->dtype_len;
            m.fmt = e->fmt;
            m.fmt_len = e->fmt_len;
            m.npos = e->npos;
            cls = rb_core_intern_class(c, &m);
            prev = cls == UINT32_MAX ? NULL : e;
            prev_cls = cls;
        }
        if (insert_entry(c, used, e->key, e->klen, e->hash, (uint32_t)slot, e->size, cls,
                         e->npos > 0 ? fs->pool + e->pos_at : NULL, e->npos, e->has_sum, e->sum) < 0) {
            oom = 1;
            break;
        }
        loaded++;
    }
    return apply_end(c, used, loaded, skipped, oom, err);
}

int rb_core_apply_state_json_ex(rb_core *c, const char *json, size_t len, int generic, rb_err *err)
{
    if (!generic) {
        rb_fstate fs;
        int rc = rb_fstate_parse(json, len, &fs);
        if (rc < 0)
            return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory reading metadata");
        if (rc > 0) {
            rc = apply_fstate(c, &fs, err);
            rb_fstate_free(&fs);
            return rc;
        }
    }
    struct json_object *st = rb_json_parse(json, len);
    if (!st) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "metadata payload is not valid JSON");
        return 0;
    }
    int rc = apply_state(c, st, err);
    json_object_put(st);
    return rc;
}

int rb_core_apply_state_json(rb_core *c, const char *json, size_t len, rb_err *err)
{
    return rb_core_apply_state_json_ex(c, json, len, 0, err);
}
