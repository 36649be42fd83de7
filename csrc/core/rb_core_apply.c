/*
 * rb_core_apply.c - a state v1 document applied to the index (recovery of format v1, and
 * apply_state_json at run time). Both readers yield one plain form: the one-pass reader of
 * rb_core_fastjson.c (an rb_fstate) for the documents every writer produces, and json-c's tree,
 * read into an rb_fstate here, for any other. One applier takes that form: the top-level
 * checks, then the index and the allocator rebuilt from the entries, then slot-header
 * validation when configured.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

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

/*
 * A document in the plain form the applier takes. An entry the reader refused (a value that is
 * not an object, a checksum that cannot be read) has has_off 0, so the applier skips it.
 */
typedef struct plain_doc {
    top_view top;
    const rb_fstate *fs; /* the entries in document order; shapes and positions in fs->pool */
    uint64_t refused;    /* entries lost before the applier sees them ("entries" not an object) */
    int keys_may_repeat; /* json-c: keys cut short at an embedded NUL may repeat */
} plain_doc;

/* ---- the applier ----------------------------------------------------------------------- */

static int top_matches(const top_view *t, int f, uint64_t want)
{
    return t->st[f] == 0 || (t->st[f] == 1 && t->val[f] >= 0 && (uint64_t)t->val[f] == want);
}

/* 1 when the document's device_path is absent, empty or this core's path, as strcmp compares
 * them (up to an embedded NUL). */
static int path_matches(const rb_core *c, const top_view *t)
{
    if (t->str_st[RB_FTOP_DEVICE_PATH] != 1 || t->str_len[RB_FTOP_DEVICE_PATH] == 0)
        return 1;
    size_t n = strnlen(t->str[RB_FTOP_DEVICE_PATH], t->str_len[RB_FTOP_DEVICE_PATH]);
    return n == strlen(c->path) && memcmp(t->str[RB_FTOP_DEVICE_PATH], c->path, n) == 0;
}

/* 1 when the layout fields (geometry, meta_magic, meta_version) match the core's, else 0 with
 * err naming the first that does not. */
static int layout_matches(const rb_core *c, const top_view *t, rb_err *err)
{
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
    return 1;
}

/* 1 acceptable (next_slot set), 0 rejected (err says why). */
static int check_top(const rb_core *c, const top_view *t, int64_t *next_slot, rb_err *err)
{
    if (t->st[RB_FTOP_VERSION] != 1 || t->val[RB_FTOP_VERSION] != 1) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata version unsupported; ignoring metadata");
        return 0;
    }
    if (!path_matches(c, t)) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata device_path mismatch; ignoring metadata");
        return 0;
    }
    if (!layout_matches(c, t, err))
        return 0;
    int64_t ns = t->val[RB_FTOP_NEXT_SLOT];
    if (t->st[RB_FTOP_NEXT_SLOT] != 1 || ns < 0 || (uint64_t)ns > c->max_slots) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device metadata next_slot invalid; ignoring metadata");
        return 0;
    }
    *next_slot = ns;
    return 1;
}

/* Clear the index and slots for a new state (takes mu; returns with it held on success). *used_out
 * covers the slots below *top_out; the allocator's next_slot may lie past them (extents: the
 * slots after the last extent, never handed out). */
static int apply_begin(rb_core *c, int64_t next_slot, uint8_t **used_out, uint32_t *top_out, rb_err *err)
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
    if (c->ml.on)
        rb_core_ml_forget_frees_locked(c);
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
    *top_out = (uint32_t)top;
    return 0;
}

/* The slot an entry takes, or -1 when it is skipped: LMCache's offset/size rules, plus ours
 * (a slot never handed out, or one already claimed). mu held. */
static int64_t entry_slot(const rb_core *c, const uint8_t *used, int64_t next_slot, const rb_fent *e)
{
    if (!e->has_off || !e->has_size)
        return -1;
    uint64_t slot;
    if (e->off < 0 || rb_offset_slot(c, (uint64_t)e->off, &slot) < 0)
        return -1;
    if (slot >= c->max_slots || e->size <= 0 || (uint64_t)e->size > c->slot_cap)
        return -1;
    if (slot >= (uint64_t)next_slot || used[slot])
        return -1;
    return (int64_t)slot;
}

/* Add entry e on slot with class cls (mu held). 0, or -1 when out of memory. */
static int insert_entry(rb_core *c, uint8_t *used, const rb_fstate *fs, const rb_fent *e, uint32_t slot, uint32_t cls)
{
    const int64_t *pos = e->npos > 0 ? fs->pool + e->pos_at : NULL;
    uint32_t p = cls == UINT32_MAX ? UINT32_MAX : rb_idx_insert(&c->index, e->key, e->klen, e->hash, pos, e->npos);
    if (p == UINT32_MAX)
        return -1;
    rb_ent *x = &c->index.ents[p];
    x->slot = slot;
    x->size = (uint64_t)e->size;
    x->cls = cls;
    if (e->has_sum) {
        x->checksum = e->sum;
        x->flags |= RB_ENT_HAS_SUM;
    }
    /* Judged by validate_entries right after (verify_on_load), else by its first load. */
    x->flags |= RB_ENT_UNVERIFIED;
    c->n_unverified++;
    used[slot] = 1;
    return 0;
}

/* Free the unclaimed slots, reset the dirty state, drop mu; then validate if configured. */
static int apply_end(rb_core *c, uint8_t *used, uint32_t top, uint64_t loaded, uint64_t skipped, int oom, rb_err *err)
{
    /* used covers [0, top); slots from top on were never handed out by this state */
    uint32_t end = c->slots.next_slot < top ? c->slots.next_slot : top;
    c->apply_skipped = skipped; /* entries the state lists that its checks refused */
    if (c->apply_container >= 0) {
        /* Recovery: what the container lists, exactly, before validation drops anything (a
         * dropped entry's slot stays listed on the device until a checkpoint replaces it). */
        const uint8_t bit = (uint8_t)(1u << c->apply_container);
        if (rb_core_ref_reserve_locked(c, c->slots.next_slot) < 0) {
            oom = 1;
            c->ref_unknown |= bit; /* keeps every slot out of use until it is rewritten */
        } else {
            for (uint32_t s = 0; s < end; s++)
                if (used[s])
                    c->ref[s] |= bit;
            c->ref_unknown &= (uint8_t)~bit;
        }
    }
    for (uint32_t s = 0; s < end; s++) /* the state's, or past the in-flight slots */
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

static int same_class(const rb_fstate *fs, const rb_fent *a, const rb_fent *b)
{
    return a->ndim == b->ndim &&
           (a->ndim <= 0 || memcmp(fs->pool + a->dims_at, fs->pool + b->dims_at, (size_t)a->ndim * 8) == 0) &&
           !a->dtype == !b->dtype && a->dtype_len == b->dtype_len &&
           (!a->dtype || memcmp(a->dtype, b->dtype, a->dtype_len) == 0) && !a->fmt == !b->fmt &&
           a->fmt_len == b->fmt_len && (!a->fmt || memcmp(a->fmt, b->fmt, a->fmt_len) == 0);
}

/* The last entry interned: consecutive entries mostly share a class. */
typedef struct class_memo {
    const rb_fent *prev;
    uint32_t cls;
} class_memo;

/* Entry e's class id (interned when new), UINT32_MAX when out of memory. mu held. */
static uint32_t entry_class(rb_core *c, const rb_fstate *fs, const rb_fent *e, class_memo *memo)
{
    if (memo->prev && same_class(fs, memo->prev, e))
        return memo->cls;
    rb_meta_in m = {0};
    m.ndim = e->ndim;
    m.dims = e->ndim > 0 ? fs->pool + e->dims_at : NULL;
    m.dtype = e->dtype;
    m.dtype_len = e->dtype_len;
    m.fmt = e->fmt;
    m.fmt_len = e->fmt_len;
    m.npos = e->npos;
    uint32_t cls = rb_core_intern_class(c, &m);
    memo->prev = cls == UINT32_MAX ? NULL : e;
    memo->cls = cls;
    return cls;
}

/* Index the document's entries in order, counting them into *loaded and *skipped. mu held.
 * 0, or -1 when out of memory (the entries before stay indexed). */
static int apply_entries(rb_core *c, const plain_doc *d, uint8_t *used, int64_t next_slot, uint64_t *loaded,
                         uint64_t *skipped)
{
    const rb_fstate *fs = d->fs;
    class_memo memo = {NULL, UINT32_MAX};
    for (size_t i = 0; i < fs->n; i++) {
        const rb_fent *e = &fs->ents[i];
        int64_t slot = entry_slot(c, used, next_slot, e);
        if (slot < 0 || (d->keys_may_repeat && rb_idx_find(&c->index, e->key, e->klen, e->hash) != UINT32_MAX)) {
            (*skipped)++;
            continue;
        }
        if (insert_entry(c, used, fs, e, (uint32_t)slot, entry_class(c, fs, e, &memo)) < 0)
            return -1;
        (*loaded)++;
    }
    return 0;
}

/* 1 applied, 0 rejected (reason in err->msg), <0 error. Runs without any core lock held. */
static int apply_doc(rb_core *c, const plain_doc *d, rb_err *err)
{
    int64_t next_slot;
    if (!check_top(c, &d->top, &next_slot, err))
        return 0;
    uint8_t *used = NULL;
    uint32_t top = 0;
    int rc = apply_begin(c, next_slot, &used, &top, err);
    if (rc < 0)
        return rc;
    uint64_t loaded = 0, skipped = d->refused;
    int oom = apply_entries(c, d, used, next_slot, &loaded, &skipped) < 0;
    return apply_end(c, used, top, loaded, skipped, oom, err);
}

/* ---- the one-pass reader's document ---------------------------------------------------- */

/* The plain form of a document rb_fstate_parse read (its keys are distinct). */
static void fstate_doc(const rb_fstate *fs, plain_doc *d)
{
    memset(d, 0, sizeof(*d));
    d->fs = fs;
    top_view *t = &d->top;
    for (int f = 0; f < RB_FTOP_N; f++) {
        if (f == RB_FTOP_ENTRIES || !fs->has[f])
            continue;
        if (f == RB_FTOP_DEVICE_PATH || f == RB_FTOP_META_MAGIC) {
            t->str_st[f] = 1;
            t->str[f] = fs->str[f];
            t->str_len[f] = fs->str_len[f];
        } else {
            t->st[f] = 1;
            t->val[f] = fs->num[f];
            t->str_st[f] = 2;
        }
    }
}

/* ---- json-c's document ----------------------------------------------------------------- */

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

/* Field name of object o, or NULL when absent. */
static struct json_object *json_field(struct json_object *o, const char *name)
{
    struct json_object *v;
    return json_object_object_get_ex(o, name, &v) ? v : NULL;
}

/* Room in fs->pool for n more integers (indexed by uint32_t). 0 or -ENOMEM. */
static int pool_room(rb_fstate *fs, size_t n)
{
    if (n <= fs->cap_pool - fs->npool)
        return 0;
    if (n > UINT32_MAX - fs->npool)
        return -ENOMEM;
    size_t nc = fs->cap_pool ? fs->cap_pool : 1024;
    while (nc < fs->npool + n)
        nc *= 2;
    int64_t *np = realloc(fs->pool, nc * sizeof(int64_t));
    if (!np)
        return -ENOMEM;
    fs->pool = np;
    fs->cap_pool = nc;
    return 0;
}

/* A list of integers (as Python's int() reads each) onto fs->pool: *n its length and *at its
 * start; *n = -1 for null, absent, not a list, or a list with an element int() refuses. 0 or
 * -ENOMEM. */
static int json_int_list(rb_fstate *fs, struct json_object *o, int64_t *n, uint32_t *at)
{
    *n = -1;
    *at = 0;
    if (!o || json_object_get_type(o) != json_type_array)
        return 0;
    size_t len = json_object_array_length(o);
    if (pool_room(fs, len) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < len; i++)
        if (rb_json_as_i64(json_object_array_get_idx(o, i), &fs->pool[fs->npool + i]) < 0)
            return 0; /* not kept: the next list overwrites it */
    *at = (uint32_t)fs->npool;
    *n = (int64_t)len;
    fs->npool += len;
    return 0;
}

/* A string, or NULL for null, absent or a value of another type (stored as null). */
static const char *json_opt_str(struct json_object *o, uint32_t *len)
{
    if (!o || json_object_get_type(o) != json_type_string)
        return NULL;
    *len = (uint32_t)json_object_get_string_len(o);
    return json_object_get_string(o);
}

/* 1 when val names no checksum or one that reads (into e), 0 when it names one that does not. */
static int json_sum(struct json_object *val, rb_fent *e)
{
    struct json_object *o;
    /* get_ex, not json_field: a checksum given as null is present and unreadable, not absent */
    if (!json_object_object_get_ex(val, RB_ENT_SUM_FIELD, &o))
        return 1;
    e->has_sum = 1;
    return json_object_get_type(o) == json_type_string &&
           rb_sum_parse_hex(json_object_get_string(o), (size_t)json_object_get_string_len(o), &e->sum) == 0;
}

/* Entry key: val into e, its shape and positions onto fs->pool. 0 or -ENOMEM. */
static int json_entry(rb_fstate *fs, const char *key, struct json_object *val, rb_fent *e)
{
    memset(e, 0, sizeof(*e));
    size_t klen = strlen(key); /* json-c's key: cut short at an embedded NUL */
    e->key = key;
    e->klen = (uint32_t)klen;
    e->hash = rb_idx_hash(key, klen);
    e->ndim = e->npos = -1;
    if (!val || json_object_get_type(val) != json_type_object)
        return 0; /* refused: no offset */
    struct json_object *o;
    e->has_off = (o = json_field(val, "offset")) != NULL && rb_json_as_i64(o, &e->off) == 0;
    e->has_size = (o = json_field(val, "size")) != NULL && rb_json_as_i64(o, &e->size) == 0;
    if (!json_sum(val, e))
        e->has_off = 0; /* a checksum we cannot read: the entry cannot be trusted */
    e->dtype = json_opt_str(json_field(val, "dtype"), &e->dtype_len);
    e->fmt = json_opt_str(json_field(val, "fmt"), &e->fmt_len);
    if (json_int_list(fs, json_field(val, "shape"), &e->ndim, &e->dims_at) < 0 ||
        json_int_list(fs, json_field(val, "cached_positions"), &e->npos, &e->pos_at) < 0)
        return -ENOMEM;
    return 0;
}

/* The plain form of a json-c document (an object), its entries into fs (rb_fstate_free frees
 * them, also on failure). 0 or -ENOMEM. */
static int json_doc(struct json_object *st, plain_doc *d, rb_fstate *fs)
{
    memset(fs, 0, sizeof(*fs));
    memset(d, 0, sizeof(*d));
    json_top_view(st, &d->top);
    d->fs = fs;
    d->keys_may_repeat = 1;
    struct json_object *ents = json_field(st, "entries");
    if (!ents)
        return 0;
    if (json_object_get_type(ents) != json_type_object) {
        /* whatever it held is lost */
        d->refused = json_object_get_type(ents) == json_type_array ? (uint64_t)json_object_array_length(ents) : 1;
        return 0;
    }
    size_t n = (size_t)json_object_object_length(ents);
    fs->ents = malloc((n ? n : 1) * sizeof(*fs->ents));
    if (!fs->ents)
        return -ENOMEM;
    fs->cap = n;
    json_object_object_foreach(ents, key, val)
    {
        if (fs->n == fs->cap || json_entry(fs, key, val, &fs->ents[fs->n]) < 0)
            return -ENOMEM;
        fs->n++;
    }
    return 0;
}

/* rb_core_apply_state_json_ex through json-c: as apply_doc, and 0 for a payload that is not
 * JSON or not an object. */
static int apply_json(rb_core *c, const char *json, size_t len, rb_err *err)
{
    struct json_object *st = rb_json_parse(json, len);
    if (!st) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "metadata payload is not valid JSON");
        return 0;
    }
    int rc = 0;
    if (json_object_get_type(st) != json_type_object) {
        rb_err_set(err, RB_ERR_VALUE, EINVAL, "metadata is not an object");
    } else {
        rb_fstate fs;
        plain_doc d;
        rc = json_doc(st, &d, &fs);
        rc = rc < 0 ? rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory reading metadata") : apply_doc(c, &d, err);
        rb_fstate_free(&fs);
    }
    json_object_put(st);
    return rc;
}

int rb_core_apply_state_json_ex(rb_core *c, const char *json, size_t len, int generic, rb_err *err)
{
    if (c->n_sc > 1) /* the allocator rebuilt under puts in flight would forget their extents' class */
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "apply_state_json is not available with size_classes=%u: a state document records "
                          "offsets, which name no size class",
                          c->n_sc);
    if (!generic) {
        rb_fstate fs;
        int rc = rb_fstate_parse(json, len, &fs);
        if (rc < 0)
            return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory reading metadata");
        if (rc > 0) {
            plain_doc d;
            fstate_doc(&fs, &d);
            rc = apply_doc(c, &d, err);
            rb_fstate_free(&fs);
            return rc;
        }
    }
    return apply_json(c, json, len, err);
}

int rb_core_apply_state_json(rb_core *c, const char *json, size_t len, rb_err *err)
{
    return rb_core_apply_state_json_ex(c, json, len, 0, err);
}
