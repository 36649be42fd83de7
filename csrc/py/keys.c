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
 * In every call, the first fast-encoded key of each (type, hash kind, tags or not) combination
 * is also encoded by to_string() and compared: on a mismatch (a future LMCache that changed the
 * layout) the rest of the call uses to_string() for that type and a RuntimeWarning is issued.
 * Slots dataclass fields are read through their member offsets (validated per call).
 */
#include "rbpy.h"

#include <string.h>
#include <structmember.h>

#include "../core/rb_core.h"

enum { F_MODEL, F_WORLD, F_WORKER, F_HASH, F_DTYPE, F_TAGS, F_LAYER, F_COUNT };
static const char *const field_names[F_COUNT] = {"model_name", "world_size", "worker_id", "chunk_hash",
                                                 "_dtype_str", "tags", "layer_id"};

#define PLAN_SLOTS 4

typedef struct {
    PyTypeObject *tp;          /* borrowed: the keys being encoded keep it alive */
    int fast;                  /* 0: to_string() for this type */
    int layer;                 /* LayerCacheEngineKey: layer_id after the dtype */
    int verified;              /* bit (hash is bytes) * 2 + (has tags): checked against to_string() */
    Py_ssize_t off[F_COUNT];   /* member offset, or -1: generic getattr */
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

/* Exact int in int64 range -> decimal. 1 / 0 (not handled here) / -1. */
static int kbuf_put_dec(kbuf *b, PyObject *o)
{
    long long v;
    int rc = small_int(o, &v);
    if (rc <= 0)
        return rc;
    if (v >= 0 && v < 10)
        return kbuf_putc(b, (char)('0' + v)) < 0 ? -1 : 1;
    char tmp[24];
    char *e = tmp + sizeof(tmp), *q = e;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--q = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--q = '-';
    return kbuf_put(b, q, (size_t)(e - q)) < 0 ? -1 : 1;
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

/* chunk_hash: exact bytes -> bytes.hex(); exact int -> format(h, "x"). Sets *is_bytes. */
static int kbuf_put_hash(kbuf *b, PyObject *o, int *is_bytes)
{
    if (PyBytes_CheckExact(o)) {
        *is_bytes = 1;
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
    if (!PyLong_CheckExact(o))
        return 0;
    *is_bytes = 0;
    long long v;
    int fits = small_int(o, &v);
    if (fits < 0)
        return -1;
    if (!fits) {
        /* Beyond 64 bits: hex() gives "0x..." or "-0x...", lower case. */
        PyObject *h = PyNumber_ToBase(o, 16);
        if (!h)
            return -1;
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(h, &n);
        int rc = -1;
        if (s) {
            int neg = s[0] == '-';
            if (n >= 2 + neg && s[neg] == '0' && s[neg + 1] == 'x') {
                rc = 0;
                if (neg)
                    rc = kbuf_put(b, "-", 1);
                if (rc == 0)
                    rc = kbuf_put(b, s + neg + 2, (size_t)(n - neg - 2));
                rc = rc < 0 ? -1 : 1;
            } else {
                rc = 0; /* unexpected form: let to_string() decide */
            }
        }
        Py_DECREF(h);
        return rc;
    }
    uint64_t u = v < 0 ? 0ULL - (uint64_t)v : (uint64_t)v;
    if (kbuf_reserve(b, 17) < 0)
        return -1;
    char *d = b->p + b->len;
    if (v < 0)
        *d++ = '-';
    char tmp[16];
    hex16(tmp, u);
    size_t nd = u ? (size_t)(67 - __builtin_clzll(u)) / 4 : 1;
    copy_short(d, tmp + 16 - nd, nd);
    b->len = (size_t)(d + nd - b->p);
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

/* Decide how keys of type tp are encoded in this call. Returns 0 or -1 (error set). */
static int plan_build(key_plan *pl, PyTypeObject *tp)
{
    memset(pl, 0, sizeof(*pl));
    pl->tp = tp;
    for (int i = 0; i < F_COUNT; i++)
        pl->off[i] = -1;
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
    const char *cls = NULL;
    if (str_is(qual, "CacheEngineKey"))
        cls = "CacheEngineKey";
    else if (str_is(qual, "LayerCacheEngineKey"))
        cls = "LayerCacheEngineKey";
    Py_DECREF(qual);
    if (!cls)
        return 0;
    /* to_string must be the class's own function (not a subclass's or a patched one). */
    PyObject *fn = PyObject_GetAttrString((PyObject *)tp, "to_string");
    if (!fn) {
        PyErr_Clear();
        return 0;
    }
    int own = 0;
    if (PyFunction_Check(fn)) {
        PyObject *fq = ((PyFunctionObject *)fn)->func_qualname;
        PyObject *fm = ((PyFunctionObject *)fn)->func_module;
        char want[64];
        snprintf(want, sizeof(want), "%s.to_string", cls);
        own = str_is(fq, want) && str_is(fm, "lmcache.utils");
    }
    Py_DECREF(fn);
    if (!own)
        return 0;
    pl->layer = cls[0] == 'L';
    int nfields = pl->layer ? F_COUNT : F_LAYER;
    for (int i = 0; i < nfields; i++) {
        PyObject *d = PyObject_GetAttrString((PyObject *)tp, field_names[i]);
        if (!d) {
            PyErr_Clear(); /* not a slots class: instance attributes */
            continue;
        }
        if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX && !(m->flags & READ_RESTRICTED) &&
                PyType_IsSubtype(tp, ((PyDescrObject *)d)->d_type))
                pl->off[i] = m->offset;
        } else if (PyObject_HasAttrString(d, "__get__")) {
            /* A property or other descriptor we do not know: stay on to_string(). */
            Py_DECREF(d);
            return 0;
        }
        Py_DECREF(d);
    }
    pl->fast = 1;
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
#define STEP(expr)                  \
    do {                            \
        rc = (expr);                \
        if (rc <= 0)                \
            goto out;               \
    } while (0)
    STEP(kbuf_put_str(b, f[F_MODEL]));
    STEP(kbuf_putc(b, '@') < 0 ? -1 : 1);
    STEP(kbuf_put_dec(b, f[F_WORLD]));
    STEP(kbuf_putc(b, '@') < 0 ? -1 : 1);
    STEP(kbuf_put_dec(b, f[F_WORKER]));
    STEP(kbuf_putc(b, '@') < 0 ? -1 : 1);
    STEP(kbuf_put_hash(b, f[F_HASH], &is_bytes));
    STEP(kbuf_putc(b, '@') < 0 ? -1 : 1);
    STEP(kbuf_put_str(b, f[F_DTYPE]));
    if (pl->layer) {
        STEP(kbuf_putc(b, '@') < 0 ? -1 : 1);
        STEP(kbuf_put_dec(b, f[F_LAYER]));
    }
    if (has_tags) {
        for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(tags); t++) {
            PyObject *kv = PyTuple_GET_ITEM(tags, t);
            if (!PyTuple_CheckExact(kv) || PyTuple_GET_SIZE(kv) != 2) {
                rc = 0;
                goto out;
            }
            STEP(kbuf_putc(b, '@') < 0 ? -1 : 1);
            STEP(kbuf_put_str(b, PyTuple_GET_ITEM(kv, 0)));
            STEP(kbuf_putc(b, '%') < 0 ? -1 : 1);
            STEP(kbuf_put_str(b, PyTuple_GET_ITEM(kv, 1)));
        }
    }
#undef STEP
    *combo = 1 << (is_bytes * 2 + has_tags);
    rc = 1;
out:
    if (rc != 1)
        b->len = start;
    for (int i = 0; i < F_COUNT; i++)
        Py_XDECREF(f[i]);
    return rc;
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

typedef struct {
    key_plan plans[PLAN_SLOTS];
    int nplans;
    int last;
    PyObject *to_string; /* the method name, made on first use */
    kbuf buf;
} enc_ctx;

static void enc_ctx_init(enc_ctx *c)
{
    c->nplans = 0;
    c->last = -1;
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
    if (plan_build(&c->plans[i], tp) < 0) {
        c->plans[i].tp = NULL;
        return NULL;
    }
    c->last = i;
    return &c->plans[i];
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
        int rc = encode_fast(pl, key, &c->buf, &combo);
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
            } else {
                pl->fast = 0;
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
    (void)mod;
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
    enc_ctx_init(&c);
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

/*
 * delete_legacy_keys(core, keys, force=False) -> int: Core.delete_many(encode_legacy_keys(keys),
 * force).count(True) without the intermediate str objects: the keys are encoded into one
 * buffer and deleted with one rb_core_delete_many call (without the GIL above 64 keys).
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
    uint8_t *res = (uint8_t *)(lens + nn);
    PyObject *ret = NULL;
    enc_ctx c;
    enc_ctx_init(&c);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s;
        offs[i] = c.buf.len;
        enc_prefetch(&c, &PyTuple_GET_ITEM(t, 0), i, n);
        if (enc_one(&c, PyTuple_GET_ITEM(t, i), &s) < 0)
            goto done;
        if (s) {
            int rc = -1;
            if (!PyUnicode_Check(s)) {
                PyErr_Format(PyExc_TypeError, "encoded keys must be str, got %.100s", Py_TYPE(s)->tp_name);
            } else {
                Py_ssize_t l;
                const char *u = PyUnicode_AsUTF8AndSize(s, &l);
                rc = u ? kbuf_put(&c.buf, u, (size_t)l) : -1;
            }
            Py_DECREF(s);
            if (rc < 0)
                goto done;
        }
    }
    offs[n] = c.buf.len;
    for (Py_ssize_t i = 0; i < n; i++) {
        kp[i] = c.buf.p + offs[i];
        lens[i] = offs[i + 1] - offs[i];
    }
    rb_core *core = rbpy_core_ptr(a[0]);
    if (n > 64) {
        Py_BEGIN_ALLOW_THREADS
        rb_core_delete_many(core, kp, lens, (size_t)n, force, res);
        Py_END_ALLOW_THREADS
    } else {
        rb_core_delete_many(core, kp, lens, (size_t)n, force, res);
    }
    Py_ssize_t removed = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        removed += res[i];
    ret = PyLong_FromSsize_t(removed);
done:
    enc_ctx_free(&c);
    PyMem_Free(offs);
    Py_DECREF(t);
    return ret;
}
