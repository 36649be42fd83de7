/*
 * keys.c - legacy key encoding in C: _native.encode_legacy_keys(keys) returns, for every key,
 * what the raw-block tier indexes it under, i.e. `key if isinstance(key, str) else
 * key.to_string()`, without running to_string() for LMCache's own key classes.
 *
 * Fast path (all conditions, checked per key type and per key; anything else calls
 * key.to_string() and takes its result as is, errors included):
 *   - type(key) is exactly lmcache.utils.CacheEngineKey or lmcache.utils.LayerCacheEngineKey,
 *     and the to_string found on it is the function defined in that class;
 *   - model_name and _dtype_str are exact str (encodable as UTF-8), world_size, worker_id and
 *     (layer keys) layer_id are exact ints that fit in 64 bits, chunk_hash is an exact int (any
 *     size, any sign) or exact bytes, and tags is None or an exact tuple of exact 2-tuples of
 *     exact str.
 * Then the key is `model@world@worker@<hash hex>@<dtype>[@layer][@k%v...]` with the hash as
 * `bytes.hex()` or `format(int, "x")` - the layout of LMCache 0.5.x's to_string().
 * The first fast-encoded key of each (type, hash kind, tags or not) combination is also encoded
 * by to_string() and compared: on a mismatch (a future LMCache that changed the layout) that
 * type uses to_string() from then on and a RuntimeWarning is issued.
 * Slots dataclass fields are read through their member offsets.
 *
 * Plans (the per-type decision, member offsets and verified combinations) are kept in the
 * module state across calls, keyed by the type, its version tag (which changes whenever the
 * class or a base is modified, e.g. to_string reassigned) and the identity of to_string's code
 * object. Building and verifying a plan costs a few microseconds warm but tens of them when the
 * interpreter comes in cold (e.g. right after a full garbage collection), which was a fifth of
 * a 1000-key batch_remove; with the cache a call only pays for that once per class.
 */
#include "rbpy.h"

#include <string.h>
#include <structmember.h>

#include "../core/rb_core.h"

enum { F_MODEL, F_WORLD, F_WORKER, F_HASH, F_DTYPE, F_TAGS, F_LAYER, F_COUNT };
static const char *const field_names[F_COUNT] = {"model_name", "world_size", "worker_id", "chunk_hash",
                                                 "_dtype_str", "tags",       "layer_id"};

#define PLAN_SLOTS 4

typedef struct {
    PyTypeObject *tp;        /* borrowed: the keys being encoded keep it alive */
    int fast;                /* 0: to_string() for this type */
    int layer;               /* LayerCacheEngineKey: layer_id after the dtype */
    int verified;            /* bit (hash is bytes) * 2 + (has tags): checked against to_string() */
    int direct;              /* every field is a slot member: encode_direct() may be tried */
    Py_ssize_t off[F_COUNT]; /* member offset, or -1: generic getattr */
} key_plan;

typedef struct {
    char *p;
    size_t len, cap;
    int ascii;
    char stack[512];
} kbuf;

static void kbuf_init(kbuf *b)
{
    b->p = b->stack;
    b->len = 0;
    b->cap = sizeof(b->stack);
    b->ascii = 1;
}

static void kbuf_free(kbuf *b)
{
    if (b->p != b->stack)
        PyMem_Free(b->p);
    kbuf_init(b);
}

static int kbuf_grow(kbuf *b, size_t extra)
{
    size_t cap = b->cap;
    while (cap < b->len + extra)
        cap *= 2;
    char *np;
    if (b->p == b->stack) {
        np = PyMem_Malloc(cap);
        if (np)
            memcpy(np, b->stack, b->len);
    } else {
        np = PyMem_Realloc(b->p, cap);
    }
    if (!np) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = np;
    b->cap = cap;
    return 0;
}

static inline int kbuf_reserve(kbuf *b, size_t extra)
{
    return b->len + extra <= b->cap ? 0 : kbuf_grow(b, extra);
}

/* memcpy for the short pieces of a key, without the variable-length call (rep movsb). */
static inline void copy_short(char *d, const char *s, size_t n)
{
    if (n >= 8 && n <= 16) {
        uint64_t x, y;
        memcpy(&x, s, 8);
        memcpy(&y, s + n - 8, 8);
        memcpy(d, &x, 8);
        memcpy(d + n - 8, &y, 8);
    } else if (n >= 4 && n < 8) {
        uint32_t x, y;
        memcpy(&x, s, 4);
        memcpy(&y, s + n - 4, 4);
        memcpy(d, &x, 4);
        memcpy(d + n - 4, &y, 4);
    } else if (n < 4) {
        for (size_t i = 0; i < n; i++)
            d[i] = s[i];
    } else {
        memcpy(d, s, n);
    }
}

static inline int kbuf_put(kbuf *b, const char *s, size_t n)
{
    if (kbuf_reserve(b, n) < 0)
        return -1;
    copy_short(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static inline int kbuf_putc(kbuf *b, char ch)
{
    if (kbuf_reserve(b, 1) < 0)
        return -1;
    b->p[b->len++] = ch;
    return 0;
}

/* Exact int -> *v when it fits in a long long: 1 fits, 0 does not (or not an exact int), -1 error. */
static inline int small_int(PyObject *o, long long *v)
{
    if (!PyLong_CheckExact(o))
        return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        *v = (long long)PyUnstable_Long_CompactValue((PyLongObject *)o);
        return 1;
    }
#else
    Py_ssize_t size = Py_SIZE(o);
    if (size >= -1 && size <= 1) {
        *v = (long long)size * (long long)((PyLongObject *)o)->ob_digit[0];
        return 1;
    }
#endif
    int overflow;
    *v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (*v == -1 && PyErr_Occurred())
        return -1;
    return overflow ? 0 : 1;
}

/* Exact str -> UTF-8 bytes. 1 appended, 0 not representable (lone surrogates: to_string()
 * decides), -1 error. */
static int kbuf_put_str(kbuf *b, PyObject *s)
{
    if (!PyUnicode_CheckExact(s))
        return 0;
    if (PyUnicode_IS_COMPACT_ASCII(s))
        return kbuf_put(b, (const char *)PyUnicode_DATA(s), (size_t)PyUnicode_GET_LENGTH(s)) < 0 ? -1 : 1;
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (!u) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    b->ascii = 0;
    return kbuf_put(b, u, (size_t)n) < 0 ? -1 : 1;
}

/* Decimal digits of v at d; returns the end. */
static inline char *put_dec(char *d, long long v)
{
    if (v >= 0 && v < 10) {
        *d = (char)('0' + v);
        return d + 1;
    }
    char tmp[24];
    char *e = tmp + sizeof(tmp), *q = e;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--q = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--q = '-';
    memcpy(d, q, (size_t)(e - q));
    return d + (e - q);
}

/* Exact int in int64 range -> decimal. 1 / 0 (not handled here) / -1. */
static int kbuf_put_dec(kbuf *b, PyObject *o)
{
    long long v;
    int rc = small_int(o, &v);
    if (rc <= 0)
        return rc;
    if (kbuf_reserve(b, 21) < 0)
        return -1;
    b->len = (size_t)(put_dec(b->p + b->len, v) - b->p);
    return 1;
}

static const char hexdig[] = "0123456789abcdef";

/* Eight nibbles (most significant first) as ASCII lower-case hex, in one 64-bit word. */
static inline uint64_t hex8(uint32_t v)
{
    uint64_t x = v;
    /* spread: nibble k of v -> byte k of x */
    x = ((x & 0xFFFF0000ULL) << 16) | (x & 0xFFFFULL);
    x = ((x & 0x0000FF000000FF00ULL) << 8) | (x & 0x000000FF000000FFULL);
    x = ((x & 0x00F000F000F000F0ULL) << 4) | (x & 0x000F000F000F000FULL);
    uint64_t ge10 = ((x + 0x0606060606060606ULL) >> 4) & 0x0101010101010101ULL;
    x += 0x3030303030303030ULL + ge10 * ('a' - '0' - 10);
    /* byte 0 must hold the most significant nibble */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return __builtin_bswap64(x);
#else
    return x;
#endif
}

/* u as 16 hex digits (leading zeros included). */
static inline void hex16(char *dst, uint64_t u)
{
    uint64_t hi = hex8((uint32_t)(u >> 32)), lo = hex8((uint32_t)u);
    memcpy(dst, &hi, 8);
    memcpy(dst + 8, &lo, 8);
}

/* v as format(v, "x") at d (at most 17 bytes); returns the end. */
/* Exact int o whose magnitude fits in 64 bits -> *neg, *mag: 1; 0 when it does not fit (or is
 * not an exact int); -1 on error. Covers the unsigned 64-bit chunk hashes vLLM's
 * sha256_cbor_64bit produces, half of which do not fit a long long. */
static int int_mag64(PyObject *o, int *neg, uint64_t *mag)
{
    long long v;
    int rc = small_int(o, &v);
    if (rc < 0)
        return -1;
    if (rc > 0) {
        *neg = v < 0;
        *mag = v < 0 ? 0ULL - (uint64_t)v : (uint64_t)v;
        return 1;
    }
    if (!PyLong_CheckExact(o))
        return 0;
    unsigned long long u = PyLong_AsUnsignedLongLong(o); /* non-negative, < 2**64, else raises */
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear(); /* negative below -2**63, or 2**64 and up: the general path */
        return 0;
    }
    *neg = 0;
    *mag = u;
    return 1;
}

/* neg/mag as format(v, "x") at d (at most 17 bytes); returns the end. */
static inline char *put_hex(char *d, int neg, uint64_t u)
{
    if (neg)
        *d++ = '-';
    char tmp[16];
    hex16(tmp, u);
    size_t nd = u ? (size_t)(67 - __builtin_clzll(u)) / 4 : 1;
    copy_short(d, tmp + 16 - nd, nd);
    return d + nd;
}

/* Exact bytes -> bytes.hex(). 1, or -1 on error. */
static int kbuf_put_bytes_hex(kbuf *b, PyObject *o)
{
    size_t n = (size_t)PyBytes_GET_SIZE(o);
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(o);
    if (kbuf_reserve(b, 2 * n) < 0)
        return -1;
    char *d = b->p + b->len;
    for (size_t i = 0; i < n; i++) {
        d[2 * i] = hexdig[s[i] >> 4];
        d[2 * i + 1] = hexdig[s[i] & 15];
    }
    b->len += 2 * n;
    return 1;
}

/* An int beyond 64 bits -> format(v, "x"), from hex()'s "0x..." or "-0x..." (lower case).
 * 1 appended, 0 an unexpected form (to_string() decides), -1 error. */
static int kbuf_put_big_hex(kbuf *b, PyObject *o)
{
    PyObject *h = PyNumber_ToBase(o, 16);
    if (!h)
        return -1;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(h, &n);
    int rc = -1;
    if (s) {
        int minus = s[0] == '-';
        if (n >= 2 + minus && s[minus] == '0' && s[minus + 1] == 'x') {
            rc = minus ? kbuf_put(b, "-", 1) : 0;
            if (rc == 0)
                rc = kbuf_put(b, s + minus + 2, (size_t)(n - minus - 2));
            rc = rc < 0 ? -1 : 1;
        } else {
            rc = 0;
        }
    }
    Py_DECREF(h);
    return rc;
}

/* chunk_hash: exact bytes -> bytes.hex(); exact int -> format(h, "x"). Sets *is_bytes.
 * 1 appended, 0 not a fast-path hash, -1 error. */
static int kbuf_put_hash(kbuf *b, PyObject *o, int *is_bytes)
{
    if (PyBytes_CheckExact(o)) {
        *is_bytes = 1;
        return kbuf_put_bytes_hex(b, o);
    }
    if (!PyLong_CheckExact(o))
        return 0;
    *is_bytes = 0;
    int neg;
    uint64_t mag;
    int fits = int_mag64(o, &neg, &mag);
    if (fits < 0)
        return -1;
    if (!fits)
        return kbuf_put_big_hex(b, o);
    if (kbuf_reserve(b, 17) < 0)
        return -1;
    b->len = (size_t)(put_hex(b->p + b->len, neg, mag) - b->p);
    return 1;
}

/* 1 when o is a str equal to the C string s. */
static int str_is(PyObject *o, const char *s)
{
    if (!o || !PyUnicode_Check(o))
        return 0;
    const char *u = PyUnicode_AsUTF8(o);
    if (!u) {
        PyErr_Clear();
        return 0;
    }
    return strcmp(u, s) == 0;
}

/* LMCache's key class tp is, by its module (lmcache.utils) and qualified name: *cls =
 * "CacheEngineKey" or "LayerCacheEngineKey", or NULL for any other class. 0, or -1 with an
 * exception. */
static int key_class_of(PyTypeObject *tp, const char **cls)
{
    *cls = NULL;
    if (!(tp->tp_flags & Py_TPFLAGS_HEAPTYPE))
        return 0;
    PyObject *mod = PyObject_GetAttrString((PyObject *)tp, "__module__");
    if (!mod) {
        PyErr_Clear();
        return 0;
    }
    int in_utils = str_is(mod, "lmcache.utils");
    Py_DECREF(mod);
    if (!in_utils)
        return 0;
    PyObject *qual = PyType_GetQualName(tp);
    if (!qual)
        return -1;
    if (str_is(qual, "CacheEngineKey"))
        *cls = "CacheEngineKey";
    else if (str_is(qual, "LayerCacheEngineKey"))
        *cls = "LayerCacheEngineKey";
    Py_DECREF(qual);
    return 0;
}

/* tp's to_string when it is the class's own function (<cls>.to_string of lmcache.utils, not a
 * subclass's or a patched one), as a new reference; else NULL, no exception. */
static PyObject *own_to_string(PyTypeObject *tp, const char *cls)
{
    PyObject *fn = PyObject_GetAttrString((PyObject *)tp, "to_string");
    if (!fn) {
        PyErr_Clear();
        return NULL;
    }
    int own = 0;
    if (PyFunction_Check(fn)) {
        PyObject *fq = ((PyFunctionObject *)fn)->func_qualname;
        PyObject *fm = ((PyFunctionObject *)fn)->func_module;
        char want[64];
        snprintf(want, sizeof(want), "%s.to_string", cls);
        own = str_is(fq, want) && str_is(fm, "lmcache.utils");
    }
    if (!own)
        Py_CLEAR(fn);
    return fn;
}

/* The member offsets of tp's key fields into pl->off (slots members; -1 stays for instance
 * attributes). 1, or 0 when a field is a descriptor we do not know (a property): keys of tp
 * then stay on to_string(). */
static int plan_offsets(key_plan *pl, PyTypeObject *tp)
{
    int nfields = pl->layer ? F_COUNT : F_LAYER;
    for (int i = 0; i < nfields; i++) {
        PyObject *d = PyObject_GetAttrString((PyObject *)tp, field_names[i]);
        if (!d) {
            PyErr_Clear(); /* not a slots class: instance attributes */
            continue;
        }
        int known = 1;
        if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX && !(m->flags & READ_RESTRICTED) &&
                PyType_IsSubtype(tp, ((PyDescrObject *)d)->d_type))
                pl->off[i] = m->offset;
        } else {
            known = !PyObject_HasAttrString(d, "__get__");
        }
        Py_DECREF(d);
        if (!known)
            return 0;
    }
    return 1;
}

/* Decide how keys of type tp are encoded. *fn_out: the class's own to_string function (new
 * reference) when the plan is fast, else NULL. Returns 0 or -1 (error set). */
static int plan_build(key_plan *pl, PyTypeObject *tp, PyObject **fn_out)
{
    *fn_out = NULL;
    memset(pl, 0, sizeof(*pl));
    pl->tp = tp;
    for (int i = 0; i < F_COUNT; i++)
        pl->off[i] = -1;
    const char *cls;
    if (key_class_of(tp, &cls) < 0)
        return -1;
    PyObject *fn = cls ? own_to_string(tp, cls) : NULL;
    if (!fn)
        return 0;
    pl->layer = cls[0] == 'L';
    if (!plan_offsets(pl, tp)) {
        Py_DECREF(fn);
        return 0;
    }
    *fn_out = fn;
    pl->fast = 1;
    pl->direct = 1;
    for (int i = 0; i < (pl->layer ? F_COUNT : F_LAYER); i++)
        if (pl->off[i] < 0)
            pl->direct = 0;
    return 0;
}

/* New reference to field i of key, NULL with no error when missing, NULL + error on failure. */
static PyObject *plan_field(const key_plan *pl, PyObject *key, int i)
{
    if (pl->off[i] >= 0) {
        PyObject *v = *(PyObject **)((char *)key + pl->off[i]);
        return Py_XNewRef(v);
    }
    PyObject *v = PyObject_GetAttrString(key, field_names[i]);
    if (!v && PyErr_ExceptionMatches(PyExc_AttributeError))
        PyErr_Clear();
    return v;
}

/* kbuf_putc as a step of the encoders: 1 appended, -1 error. */
static inline int kbuf_sep(kbuf *b, char ch)
{
    return kbuf_putc(b, ch) < 0 ? -1 : 1;
}

/* A step of the encoders: its result (1 done, 0 not a fast-path shape, -1 error) ends the
 * function unless it is 1. */
#define STEP(expr)                                                                                                     \
    do {                                                                                                               \
        int step_rc_ = (expr);                                                                                         \
        if (step_rc_ <= 0)                                                                                             \
            return step_rc_;                                                                                           \
    } while (0)

/* model@world@worker@<hash hex>@<dtype>[@layer] from the fields f. 1 / 0 / -1 as STEP. */
static int put_fields(const key_plan *pl, PyObject *const *f, kbuf *b, int *is_bytes)
{
    STEP(kbuf_put_str(b, f[F_MODEL]));
    STEP(kbuf_sep(b, '@'));
    STEP(kbuf_put_dec(b, f[F_WORLD]));
    STEP(kbuf_sep(b, '@'));
    STEP(kbuf_put_dec(b, f[F_WORKER]));
    STEP(kbuf_sep(b, '@'));
    STEP(kbuf_put_hash(b, f[F_HASH], is_bytes));
    STEP(kbuf_sep(b, '@'));
    STEP(kbuf_put_str(b, f[F_DTYPE]));
    if (pl->layer) {
        STEP(kbuf_sep(b, '@'));
        STEP(kbuf_put_dec(b, f[F_LAYER]));
    }
    return 1;
}

/* @k%v for every (k, v) of the tags tuple (exact 2-tuples of exact str). 1 / 0 / -1 as STEP. */
static int put_tags(PyObject *tags, kbuf *b)
{
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(tags); t++) {
        PyObject *kv = PyTuple_GET_ITEM(tags, t);
        if (!PyTuple_CheckExact(kv) || PyTuple_GET_SIZE(kv) != 2)
            return 0;
        STEP(kbuf_sep(b, '@'));
        STEP(kbuf_put_str(b, PyTuple_GET_ITEM(kv, 0)));
        STEP(kbuf_sep(b, '%'));
        STEP(kbuf_put_str(b, PyTuple_GET_ITEM(kv, 1)));
    }
    return 1;
}

#undef STEP

/*
 * Fast encoding of key appended to b (b->ascii reset first). Returns 1 encoded (*combo =
 * verification bit), 0 not a fast-path shape, -1 error; b->len is unchanged unless 1.
 */
static int encode_fast(const key_plan *pl, PyObject *key, kbuf *b, int *combo)
{
    PyObject *f[F_COUNT] = {NULL};
    int nfields = pl->layer ? F_COUNT : F_LAYER;
    int rc = 0, is_bytes = 0, has_tags = 0;
    size_t start = b->len;
    b->ascii = 1;
    for (int i = 0; i < nfields; i++) {
        f[i] = plan_field(pl, key, i);
        if (!f[i]) {
            rc = PyErr_Occurred() ? -1 : 0;
            goto out;
        }
    }
    PyObject *tags = f[F_TAGS];
    if (tags != Py_None) {
        if (!PyTuple_CheckExact(tags))
            goto out;
        has_tags = PyTuple_GET_SIZE(tags) != 0;
    }
    rc = put_fields(pl, f, b, &is_bytes);
    if (rc == 1 && has_tags)
        rc = put_tags(tags, b);
    if (rc == 1)
        *combo = 1 << (is_bytes * 2 + has_tags);
out:
    if (rc != 1)
        b->len = start;
    for (int i = 0; i < F_COUNT; i++)
        Py_XDECREF(f[i]);
    return rc;
}

/* An exact str of ASCII characters only. */
static inline int ascii_str(PyObject *o)
{
    return PyUnicode_CheckExact(o) && PyUnicode_IS_COMPACT_ASCII(o);
}

/* The fields of the common shape, borrowed (f[F_LAYER] NULL for a key without a layer): 1 when
 * every one is set, tags are None or (), and model and dtype are ASCII str; else 0. */
static inline int direct_fields(const key_plan *pl, PyObject *key, PyObject **f)
{
    int nfields = pl->layer ? F_COUNT : F_LAYER;
    f[F_LAYER] = NULL;
    for (int i = 0; i < nfields; i++)
        if (!(f[i] = *(PyObject *const *)((const char *)key + pl->off[i])))
            return 0;
    PyObject *tags = f[F_TAGS];
    if (tags != Py_None && !(PyTuple_CheckExact(tags) && PyTuple_GET_SIZE(tags) == 0))
        return 0;
    return ascii_str(f[F_MODEL]) && ascii_str(f[F_DTYPE]);
}

/*
 * The common shape in one pass: every field a slot, ASCII model and dtype, int fields within
 * 64 bits, an int chunk_hash, no tags (None or ()). Fields are read borrowed - nothing here
 * can run Python code - and the key is written after a single reservation. Returns 1 encoded
 * (*combo set), 0 for any other shape (nothing appended; encode_fast() decides), -1 error.
 */
static int encode_direct(const key_plan *pl, PyObject *key, kbuf *b, int *combo)
{
    PyObject *f[F_COUNT];
    if (!direct_fields(pl, key, f))
        return 0;
    PyObject *model = f[F_MODEL], *dtype = f[F_DTYPE], *layer = f[F_LAYER];
    long long w, k, l = 0;
    uint64_t h;
    int rc, hneg;
    if ((rc = small_int(f[F_WORLD], &w)) <= 0 || (rc = small_int(f[F_WORKER], &k)) <= 0 ||
        (rc = int_mag64(f[F_HASH], &hneg, &h)) <= 0 || (layer && (rc = small_int(layer, &l)) <= 0))
        return rc;
    size_t ml = (size_t)PyUnicode_GET_LENGTH(model), dl = (size_t)PyUnicode_GET_LENGTH(dtype);
    /* model @ int @ int @ -hex16 @ dtype [@ int] */
    if (kbuf_reserve(b, ml + dl + 3 * 21 + 17 + 5) < 0)
        return -1;
    char *d = b->p + b->len;
    copy_short(d, (const char *)PyUnicode_DATA(model), ml);
    d += ml;
    *d++ = '@';
    d = put_dec(d, w);
    *d++ = '@';
    d = put_dec(d, k);
    *d++ = '@';
    d = put_hex(d, hneg, h);
    *d++ = '@';
    copy_short(d, (const char *)PyUnicode_DATA(dtype), dl);
    d += dl;
    if (layer) {
        *d++ = '@';
        d = put_dec(d, l);
    }
    b->len = (size_t)(d - b->p);
    b->ascii = 1;
    *combo = 1; /* int hash, no tags */
    return 1;
}

/* str of the UTF-8 bytes b->p[start:] (b->ascii: they are ASCII). */
static PyObject *kbuf_to_str(const kbuf *b, size_t start)
{
    size_t n = b->len - start;
    if (!b->ascii)
        return PyUnicode_DecodeUTF8(b->p + start, (Py_ssize_t)n, "strict");
    PyObject *s = PyUnicode_New((Py_ssize_t)n, 127);
    if (s)
        memcpy(PyUnicode_DATA(s), b->p + start, n);
    return s;
}

/* ---- plans kept across calls (module state) -------------------------------------------- */

typedef struct {
    PyTypeObject *tp; /* strong reference, NULL = free entry */
    PyObject *fn;     /* strong: the to_string function the plan was built against, or NULL */
    PyObject *code;   /* fn's code object when built (identity only) */
    unsigned int version;
    key_plan plan;
} cached_plan;

struct rbpy_keyplans {
    cached_plan ent[PLAN_SLOTS];
    int next; /* round-robin victim */
};

/* The type's current version tag, or 0 when it has none (then nothing is cached).
 * 3.12+: PyUnstable_Type_AssignVersionTag() gives the type a tag if it has none and says whether
 * tp_version_tag is valid; Python 3.13 no longer sets Py_TPFLAGS_VALID_VERSION_TAG (a nonzero
 * tp_version_tag is what marks it valid), so testing the flag there disabled the cache. */
static unsigned int type_version(PyTypeObject *tp)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Type_AssignVersionTag(tp))
        return tp->tp_version_tag;
#elif defined(Py_TPFLAGS_VALID_VERSION_TAG)
    if (PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG))
        return tp->tp_version_tag;
#endif
    (void)tp;
    return 0;
}

static PyObject *fn_code(PyObject *fn)
{
    return fn && PyFunction_Check(fn) ? PyFunction_GET_CODE(fn) : NULL;
}

static void cached_plan_clear(cached_plan *e)
{
    Py_CLEAR(e->tp);
    Py_CLEAR(e->fn);
    e->code = NULL;
}

int rbpy_keyplans_traverse(rbpy_state *st, visitproc visit, void *arg)
{
    if (!st->keyplans)
        return 0;
    for (int i = 0; i < PLAN_SLOTS; i++) {
        Py_VISIT(st->keyplans->ent[i].tp);
        Py_VISIT(st->keyplans->ent[i].fn);
    }
    return 0;
}

void rbpy_keyplans_clear(rbpy_state *st)
{
    rbpy_keyplans *kp = st->keyplans;
    if (!kp)
        return;
    st->keyplans = NULL;
    for (int i = 0; i < PLAN_SLOTS; i++)
        cached_plan_clear(&kp->ent[i]);
    PyMem_Free(kp);
}

PyObject *rbpy_forget_key_plans(PyObject *mod, PyObject *unused)
{
    (void)unused;
    rbpy_keyplans_clear(PyModule_GetState(mod));
    Py_RETURN_NONE;
}

/* The cached plan for tp if it is still valid, else NULL (stale entries are dropped). */
static cached_plan *cache_find(rbpy_state *st, PyTypeObject *tp)
{
    if (!st || !st->keyplans)
        return NULL;
    for (int i = 0; i < PLAN_SLOTS; i++) {
        cached_plan *e = &st->keyplans->ent[i];
        if (e->tp != tp)
            continue;
        unsigned int v = type_version(tp);
        if (v && v == e->version && fn_code(e->fn) == e->code)
            return e;
        cached_plan_clear(e);
        return NULL;
    }
    return NULL;
}

/* Remember pl (built against fn, borrowed) for later calls; failures just skip the cache. */
static void cache_store(rbpy_state *st, const key_plan *pl, PyObject *fn)
{
    unsigned int v = type_version(pl->tp);
    if (!st || !v)
        return;
    if (!st->keyplans) {
        st->keyplans = PyMem_Calloc(1, sizeof(rbpy_keyplans));
        if (!st->keyplans)
            return;
    }
    cached_plan *e = cache_find(st, pl->tp);
    if (!e) {
        rbpy_keyplans *kp = st->keyplans;
        for (int i = 0; i < PLAN_SLOTS && !e; i++)
            if (!kp->ent[i].tp)
                e = &kp->ent[i];
        if (!e) {
            e = &kp->ent[kp->next];
            kp->next = (kp->next + 1) % PLAN_SLOTS;
        }
        cached_plan_clear(e);
        e->tp = (PyTypeObject *)Py_NewRef((PyObject *)pl->tp);
        e->fn = Py_XNewRef(fn);
        e->code = fn_code(fn);
        e->version = v;
    }
    e->plan = *pl;
}

/* ---- per-call encoding context ------------------------------------------------------------ */

typedef struct {
    key_plan plans[PLAN_SLOTS]; /* private copies: Python code run meanwhile cannot touch them */
    int nplans;
    int last;
    rbpy_state *st;
    PyObject *to_string; /* the method name, made on first use */
    kbuf buf;
} enc_ctx;

static void enc_ctx_init(enc_ctx *c, rbpy_state *st)
{
    c->nplans = 0;
    c->last = -1;
    c->st = st;
    c->to_string = NULL;
    kbuf_init(&c->buf);
}

/*
 * Prefetch what encoding items[i + PF_FAR] and items[i + PF_NEAR] will read: the key objects
 * far ahead, the chunk_hash int / bytes of the nearer ones (their slots are cached by then).
 */
#define PF_FAR 8
#define PF_NEAR 4
static inline void enc_prefetch(const enc_ctx *c, PyObject *const *items, Py_ssize_t i, Py_ssize_t n)
{
    if (i + PF_FAR < n) {
        const char *o = (const char *)items[i + PF_FAR];
        __builtin_prefetch(o);
        __builtin_prefetch(o + 64);
    }
    if (i + PF_NEAR < n && c->last >= 0) {
        const key_plan *pl = &c->plans[c->last];
        PyObject *k = items[i + PF_NEAR];
        if (pl->fast && Py_TYPE(k) == pl->tp && pl->off[F_HASH] >= 0) {
            PyObject *h = *(PyObject **)((char *)k + pl->off[F_HASH]);
            if (h)
                __builtin_prefetch(h);
        }
    }
}

static void enc_ctx_free(enc_ctx *c)
{
    Py_CLEAR(c->to_string);
    kbuf_free(&c->buf);
}

static PyObject *call_to_string(enc_ctx *c, PyObject *key)
{
    if (!c->to_string && !(c->to_string = PyUnicode_InternFromString("to_string")))
        return NULL;
    return PyObject_CallMethodNoArgs(key, c->to_string);
}

static key_plan *enc_plan(enc_ctx *c, PyTypeObject *tp)
{
    if (c->last >= 0 && c->plans[c->last].tp == tp)
        return &c->plans[c->last];
    for (int i = 0; i < c->nplans; i++) {
        if (c->plans[i].tp == tp) {
            c->last = i;
            return &c->plans[i];
        }
    }
    int i = c->nplans < PLAN_SLOTS ? c->nplans++ : PLAN_SLOTS - 1;
    cached_plan *e = cache_find(c->st, tp);
    if (e) {
        c->plans[i] = e->plan;
    } else {
        PyObject *fn;
        if (plan_build(&c->plans[i], tp, &fn) < 0) {
            c->plans[i].tp = NULL;
            return NULL;
        }
        cache_store(c->st, &c->plans[i], fn);
        Py_XDECREF(fn);
    }
    c->last = i;
    return &c->plans[i];
}

/* A verification changed pl: record it for later calls too (only while the cached plan is the
 * same one, i.e. the class did not change while to_string() ran). */
static void enc_plan_update(enc_ctx *c, const key_plan *pl)
{
    cached_plan *e = cache_find(c->st, pl->tp);
    if (e && e->plan.fast && e->plan.direct == pl->direct)
        e->plan = *pl;
}

/*
 * Encode one key. Returns 1 with the UTF-8 form appended to c->buf (fast path, *str_out =
 * NULL), or 1 with *str_out = a new reference (str keys, to_string() results; nothing
 * appended), or -1 on error.
 */
static int enc_one(enc_ctx *c, PyObject *key, PyObject **str_out)
{
    *str_out = NULL;
    if (PyUnicode_Check(key)) {
        *str_out = Py_NewRef(key);
        return 1;
    }
    key_plan *pl = enc_plan(c, Py_TYPE(key));
    if (!pl)
        return -1;
    if (pl->fast) {
        int combo = 0;
        size_t start = c->buf.len;
        int rc = pl->direct ? encode_direct(pl, key, &c->buf, &combo) : 0;
        if (rc == 0)
            rc = encode_fast(pl, key, &c->buf, &combo);
        if (rc < 0)
            return -1;
        if (rc > 0) {
            if (pl->verified & combo)
                return 1;
            PyObject *slow = call_to_string(c, key);
            if (!slow)
                return -1;
            PyObject *fast = kbuf_to_str(&c->buf, start);
            c->buf.len = start;
            if (!fast) {
                Py_DECREF(slow);
                return -1;
            }
            int same = PyUnicode_CheckExact(slow) && PyUnicode_Compare(fast, slow) == 0;
            Py_DECREF(fast);
            if (same) {
                pl->verified |= combo;
                enc_plan_update(c, pl);
            } else {
                pl->fast = 0;
                enc_plan_update(c, pl);
                if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                                     "encode_legacy_keys: %.100s.to_string() gave %R, the native "
                                     "encoding differs; using to_string() for this type",
                                     pl->tp->tp_name, slow) < 0) {
                    Py_DECREF(slow);
                    return -1;
                }
            }
            *str_out = slow;
            return 1;
        }
    }
    *str_out = call_to_string(c, key);
    return *str_out ? 1 : -1;
}

PyObject *rbpy_encode_legacy_keys(PyObject *mod, PyObject *keys)
{
    /* A tuple snapshot: to_string() may run Python code that mutates a caller's list. */
    PyObject *t = PySequence_Tuple(keys);
    if (!t)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    PyObject *out = PyList_New(n);
    if (!out) {
        Py_DECREF(t);
        return NULL;
    }
    enc_ctx c;
    enc_ctx_init(&c, PyModule_GetState(mod));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s;
        c.buf.len = 0;
        enc_prefetch(&c, &PyTuple_GET_ITEM(t, 0), i, n);
        if (enc_one(&c, PyTuple_GET_ITEM(t, i), &s) < 0 || (!s && !(s = kbuf_to_str(&c.buf, 0)))) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, s);
    }
    enc_ctx_free(&c);
    Py_DECREF(t);
    return out;
}

/* Append key's encoded form (UTF-8) to c->buf: the fast path's bytes, or a str's (a str key,
 * to_string()'s result). 0, or -1 with an exception. */
static int enc_append(enc_ctx *c, PyObject *key)
{
    PyObject *s;
    if (enc_one(c, key, &s) < 0)
        return -1;
    if (!s)
        return 0;
    int rc = -1;
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "encoded keys must be str, got %.100s", Py_TYPE(s)->tp_name);
    } else {
        Py_ssize_t l;
        const char *u = PyUnicode_AsUTF8AndSize(s, &l);
        rc = u ? kbuf_put(&c->buf, u, (size_t)l) : -1;
    }
    Py_DECREF(s);
    return rc;
}

/* Delete the n keys encoded back to back in c->buf (key i at offs[i]..offs[i + 1]) with one
 * rbpy_core_delete call (as Core.delete_many deletes). kp, lens and res have room for n.
 * Returns how many were removed. */
static Py_ssize_t delete_encoded(rb_core *core, const enc_ctx *c, const size_t *offs, Py_ssize_t n, int force,
                                 const char **kp, size_t *lens, uint8_t *res)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        kp[i] = c->buf.p + offs[i];
        lens[i] = offs[i + 1] - offs[i];
    }
    rbpy_core_delete(core, kp, lens, (size_t)n, force, res);
    Py_ssize_t removed = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        removed += res[i];
    return removed;
}

/*
 * delete_legacy_keys(core, keys, force=False) -> int: Core.delete_many(encode_legacy_keys(keys),
 * force).count(True) without the intermediate str objects: the keys are encoded into one
 * buffer and deleted with one rbpy_core_delete call, deallocation included.
 */
PyObject *rbpy_delete_legacy_keys(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"core", "keys", "force"};
    PyObject *a[3];
    if (rbpy_unpack("delete_legacy_keys", names, 3, 2, args, nargs, kwnames, a) < 0)
        return NULL;
    rbpy_state *st = PyModule_GetState(mod);
    if (!PyObject_TypeCheck(a[0], st->core_type)) {
        PyErr_Format(PyExc_TypeError, "core must be a _native.Core, got %.100s", Py_TYPE(a[0])->tp_name);
        return NULL;
    }
    int force = a[2] ? PyObject_IsTrue(a[2]) : 0;
    if (force < 0)
        return NULL;
    PyObject *t = PySequence_Tuple(a[1]);
    if (!t)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    size_t nn = n ? (size_t)n : 1;
    /* offsets[i]..offsets[i+1] in the buffer, then key pointers, lengths and results */
    size_t *offs = PyMem_Malloc((nn + 1) * sizeof(size_t) + nn * (sizeof(char *) + sizeof(size_t) + 1));
    if (!offs) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    const char **kp = (const char **)(offs + nn + 1);
    size_t *lens = (size_t *)(kp + nn);
    PyObject *ret = NULL;
    enc_ctx c;
    enc_ctx_init(&c, st);
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        offs[i] = c.buf.len;
        enc_prefetch(&c, &PyTuple_GET_ITEM(t, 0), i, n);
        if (enc_append(&c, PyTuple_GET_ITEM(t, i)) < 0)
            break;
    }
    if (i == n) {
        offs[n] = c.buf.len;
        ret = PyLong_FromSsize_t(
            delete_encoded(rbpy_core_ptr(a[0]), &c, offs, n, force, kp, lens, (uint8_t *)(lens + nn)));
    }
    enc_ctx_free(&c);
    PyMem_Free(offs);
    Py_DECREF(t);
    return ret;
}
