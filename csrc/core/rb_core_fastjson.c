/*
 * rb_core_fastjson.c - single-pass reader of checkpoint documents (state v1) in the plain
 * form every writer produces (ours, LMCache's json.dumps), used by recovery before json-c.
 *
 * Why: opening a device with 100,000 entries spent ~80% of its time (no header validation:
 * 0.52 s) in json-c building, walking and freeing a tree of ~700,000 objects for a 14 MB
 * checkpoint (json_tokener_parse_ex 11%, malloc/free/consolidate ~35%, lh_table insert/lookup
 * and the strcmp/strlen behind them ~20%, perf record -e cpu-clock). json-c stays the JSON
 * library and the reference: this reader accepts only a strict subset of what json-c's strict
 * mode accepts, and any document outside that subset (escapes, non-ASCII, floats, booleans,
 * string numbers, unknown or repeated fields, repeated keys, very long integers...) makes it
 * return 0, after which the caller parses the document with json-c as before. For a document
 * inside the subset the two readers yield the same values in the same (insertion) order:
 * rb_core_apply.c reads json-c's tree into this same plain form and applies both with one
 * applier.
 */
#include "rb_core_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct fj {
    const char *p, *end;
    rb_fstate *st;
} fj;

static void ws(fj *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
        j->p++;
}

static int lit(fj *j, char ch)
{
    ws(j);
    if (j->p < j->end && *j->p == ch) {
        j->p++;
        return 1;
    }
    return 0;
}

/* A string without escapes, control or non-ASCII bytes; 0 otherwise (fall back). */
static int str(fj *j, const char **s, size_t *n)
{
    ws(j);
    if (j->p >= j->end || *j->p != '"')
        return 0;
    const char *b = ++j->p;
    for (;;) {
        if (j->p >= j->end)
            return 0;
        unsigned char ch = (unsigned char)*j->p;
        if (ch == '"')
            break;
        if (ch == '\\' || ch < 0x20 || ch >= 0x80)
            return 0;
        j->p++;
    }
    *s = b;
    *n = (size_t)(j->p - b);
    j->p++;
    return 1;
}

/* -?(0|[1-9][0-9]{0,17}) not followed by a fraction or exponent; 0 otherwise. */
static int num(fj *j, int64_t *v)
{
    ws(j);
    int neg = 0;
    if (j->p < j->end && *j->p == '-') {
        neg = 1;
        j->p++;
    }
    const char *b = j->p;
    uint64_t x = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        x = x * 10 + (uint64_t)(*j->p - '0');
        j->p++;
    }
    size_t nd = (size_t)(j->p - b);
    if (nd == 0 || nd > 18 || (nd > 1 && *b == '0'))
        return 0;
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        return 0;
    *v = neg ? -(int64_t)x : (int64_t)x;
    return 1;
}

static int is_null(fj *j)
{
    ws(j);
    if (j->end - j->p >= 4 && memcmp(j->p, "null", 4) == 0) {
        j->p += 4;
        return 1;
    }
    return 0;
}

static int key_is(const char *s, size_t n, const char *want)
{
    return strlen(want) == n && memcmp(s, want, n) == 0;
}

/* null -> *cnt = -1; [ints] -> appended to the pool, *at = start, *cnt = count. */
static int int_list(fj *j, int64_t *cnt, uint32_t *at)
{
    rb_fstate *st = j->st;
    if (is_null(j)) {
        *cnt = -1;
        *at = 0;
        return 1;
    }
    if (!lit(j, '['))
        return 0;
    *at = (uint32_t)st->npool;
    *cnt = 0;
    if (lit(j, ']'))
        return 1;
    do {
        int64_t v;
        if (!num(j, &v))
            return 0;
        if (st->npool == st->cap_pool) {
            size_t nc = st->cap_pool ? st->cap_pool * 2 : 1024;
            if (nc > UINT32_MAX)
                return 0;
            int64_t *np = realloc(st->pool, nc * sizeof(int64_t));
            if (!np)
                return -ENOMEM;
            st->pool = np;
            st->cap_pool = nc;
        }
        st->pool[st->npool++] = v;
        (*cnt)++;
    } while (lit(j, ','));
    return lit(j, ']');
}

static int opt_str(fj *j, const char **s, uint32_t *n)
{
    if (is_null(j)) {
        *s = NULL;
        *n = 0;
        return 1;
    }
    size_t len;
    if (!str(j, s, &len) || len > UINT32_MAX)
        return 0;
    *n = (uint32_t)len;
    return 1;
}

/* The field named k (kn bytes) of entry e: its value read, *bit set to the field's bit in the
 * seen mask. 1 read, 0 outside the plain form (an unknown field too), -ENOMEM. */
static int entry_field(fj *j, const char *k, size_t kn, rb_fent *e, unsigned *bit)
{
    if (key_is(k, kn, "offset")) {
        *bit = 1;
        e->has_off = 1;
        return num(j, &e->off);
    }
    if (key_is(k, kn, "size")) {
        *bit = 2;
        e->has_size = 1;
        return num(j, &e->size);
    }
    if (key_is(k, kn, "shape")) {
        *bit = 4;
        return int_list(j, &e->ndim, &e->dims_at);
    }
    if (key_is(k, kn, "dtype")) {
        *bit = 8;
        return opt_str(j, &e->dtype, &e->dtype_len);
    }
    if (key_is(k, kn, "fmt")) {
        *bit = 16;
        return opt_str(j, &e->fmt, &e->fmt_len);
    }
    if (key_is(k, kn, "cached_positions")) {
        *bit = 32;
        return int_list(j, &e->npos, &e->pos_at);
    }
    if (key_is(k, kn, RB_ENT_SUM_FIELD)) {
        const char *hs;
        size_t hn;
        *bit = 64;
        e->has_sum = 1;
        return str(j, &hs, &hn) && rb_sum_parse_hex(hs, hn, &e->sum) == 0;
    }
    return 0;
}

/* One entry object into e (each field at most once). 1, 0 outside the plain form, -ENOMEM. */
static int entry(fj *j, rb_fent *e)
{
    memset(e, 0, sizeof(*e));
    e->ndim = -1;
    e->npos = -1;
    if (!lit(j, '{'))
        return 0;
    if (lit(j, '}'))
        return 1;
    unsigned seen = 0;
    do {
        const char *k;
        size_t kn;
        if (!str(j, &k, &kn) || !lit(j, ':'))
            return 0;
        unsigned bit = 0;
        int rc = entry_field(j, k, kn, e, &bit);
        if (rc <= 0)
            return rc;
        if (seen & bit)
            return 0;
        seen |= bit;
    } while (lit(j, ','));
    return lit(j, '}');
}

static int entries(fj *j)
{
    rb_fstate *st = j->st;
    if (!lit(j, '{'))
        return 0;
    if (lit(j, '}'))
        return 1;
    do {
        const char *k;
        size_t kn;
        if (!str(j, &k, &kn) || kn > UINT32_MAX || !lit(j, ':'))
            return 0;
        if (st->n == st->cap) {
            size_t nc = st->cap ? st->cap * 2 : 4096;
            rb_fent *ne = realloc(st->ents, nc * sizeof(*ne));
            if (!ne)
                return -ENOMEM;
            st->ents = ne;
            st->cap = nc;
        }
        rb_fent *e = &st->ents[st->n];
        int rc = entry(j, e);
        if (rc <= 0)
            return rc;
        e->key = k;
        e->klen = (uint32_t)kn;
        e->hash = rb_idx_hash(k, kn);
        st->n++;
    } while (lit(j, ','));
    return lit(j, '}');
}

/* 1 when no key repeats, 0 otherwise (json-c keeps the first position with the last value). */
static int keys_unique(rb_fstate *st)
{
    if (st->n < 2)
        return 1;
    size_t size = 16;
    while (size < st->n * 2)
        size <<= 1;
    uint32_t *t = calloc(size, sizeof(uint32_t));
    if (!t)
        return -ENOMEM;
    size_t mask = size - 1;
    int ok = 1;
    for (size_t i = 0; i < st->n && ok; i++) {
        const rb_fent *e = &st->ents[i];
        for (size_t s = e->hash & mask;; s = (s + 1) & mask) {
            if (!t[s]) {
                t[s] = (uint32_t)i + 1;
                break;
            }
            const rb_fent *o = &st->ents[t[s] - 1];
            if (o->hash == e->hash && o->klen == e->klen && memcmp(o->key, e->key, e->klen) == 0) {
                ok = 0;
                break;
            }
        }
    }
    free(t);
    return ok;
}

static int document(fj *j)
{
    rb_fstate *st = j->st;
    if (!lit(j, '{'))
        return 0;
    if (lit(j, '}'))
        return 1;
    unsigned seen = 0;
    do {
        const char *k;
        size_t kn;
        if (!str(j, &k, &kn) || !lit(j, ':'))
            return 0;
        int rc = 0, f = -1;
        for (int i = 0; i < RB_FTOP_N; i++) {
            if (key_is(k, kn, rb_ftop_names[i])) {
                f = i;
                break;
            }
        }
        if (f < 0)
            return 0;
        if (seen & (1u << f))
            return 0;
        seen |= 1u << f;
        if (f == RB_FTOP_ENTRIES) {
            rc = entries(j);
        } else if (f == RB_FTOP_DEVICE_PATH || f == RB_FTOP_META_MAGIC) {
            rc = str(j, &st->str[f], &st->str_len[f]);
        } else {
            rc = num(j, &st->num[f]);
        }
        if (rc <= 0)
            return rc;
        st->has[f] = 1;
    } while (lit(j, ','));
    if (!lit(j, '}'))
        return 0;
    ws(j);
    return j->p == j->end;
}

const char *const rb_ftop_names[RB_FTOP_N] = {"version",      "device_path",      "capacity_bytes",   "block_align",
                                              "header_bytes", "slot_bytes",       "meta_total_bytes", "meta_magic",
                                              "meta_version", "data_base_offset", "next_slot",        "entries"};

int rb_fstate_parse(const char *buf, size_t len, rb_fstate *st)
{
    memset(st, 0, sizeof(*st));
    fj j = {buf, buf + len, st};
    int rc = document(&j);
    if (rc > 0)
        rc = keys_unique(st);
    if (rc <= 0) {
        rb_fstate_free(st);
        memset(st, 0, sizeof(*st));
    }
    return rc;
}

void rb_fstate_free(rb_fstate *st)
{
    free(st->ents);
    free(st->pool);
    st->ents = NULL;
    st->pool = NULL;
}
