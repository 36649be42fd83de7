/*
 * prefix_order.c - _native.PrefixOrder: the prefix-aware eviction order
 * (lmcache_rawblock/prefix_evict.py has what it does and why; this file has how).
 *
 * One node per key string the order knows (stored, holding a pending link, named as a
 * predecessor or a pending link's predecessor), in an array linked by index; a free list
 * reuses slots. An open-addressing table (linear probing, backward-shift deletion) maps a
 * key to its node by the str's cached hash, identity first and then the characters. The
 * leaves, the unreachable keys (orphans), the stored keys (in the order they were stored) and
 * the pending links (oldest first) are intrusive doubly-linked lists; a node's children
 * are an intrusive list in the node (a stored key is in its predecessor's list only).
 *
 * A node that is not stored, has no pending link, no children and is named by no other node
 * means nothing: it is freed at the end of the method that left it so (nodes are referred to
 * by index within a method, so none is freed midway). Every allocation of a method comes
 * before the state changes it would feed, so a MemoryError leaves the order consistent. A
 * method refuses a key that is not a str before it changes anything (it checks its whole
 * input first), so a TypeError leaves the order as it was.
 *
 * Keys are exact str objects (a str subclass is copied to one): they refer to nothing, so the
 * order holds no reference cycle and is not tracked by the cyclic GC. The GIL is held
 * throughout; a predicate passed to victims() runs Python code, so the methods refuse to run
 * inside one (the order is not re-entrant).
 */
#include "rbpy.h"

#include <stdint.h>
#include <string.h>

#define PO_HINT_CAPACITY (1 << 16)
#define PO_MAX_NODES (INT32_MAX / 4)

enum { PO_LEAVES, PO_ORPHANS, PO_STORED, PO_HINTS, PO_NLISTS };

enum {
    F_IN_LEAVES = 1 << PO_LEAVES,
    F_IN_ORPHANS = 1 << PO_ORPHANS,
    F_STORED = 1 << PO_STORED,
    F_HINT = 1 << PO_HINTS,
    F_HEAD = 1 << 4,   /* stored without a known predecessor */
    F_CHOSEN = 1 << 5, /* victims(): picked in this call */
    F_GOING = 1 << 6,  /* remove_many(): in this batch */
    F_SEEN = 1 << 7,   /* reachable_loss(): counted or leaving */
    F_CAND = 1 << 8,   /* queued for the end-of-method free check */
};

typedef struct {
    int32_t prev, next;
} po_link;

typedef struct {
    int32_t head, tail, n;
} po_list;

typedef struct {
    PyObject *key; /* exact str, owned; NULL: a free node (link[0].next: the next free one) */
    Py_hash_t hash;
    int32_t pred;    /* stored: the predecessor's node, or -1 (a head) */
    int32_t hint;    /* F_HINT: the pending link's predecessor */
    int32_t refs;    /* pred and hint fields of nodes naming this one */
    int32_t scratch; /* per call: children chosen (victims), reachability memo (reachable_loss) */
    uint32_t flags;
    po_list kids;
    po_link sib; /* in the predecessor's kids */
    po_link link[PO_NLISTS];
} po_node;

typedef struct {
    int32_t *v;
    Py_ssize_t n, cap;
} po_vec;

typedef struct {
    PyObject_HEAD
    po_node *nodes;
    int32_t ncap, nused, free_head;
    int32_t *slots; /* node index or -1; mask + 1 of them */
    size_t mask;
    Py_ssize_t nlive;
    po_list lists[PO_NLISTS];
    Py_ssize_t nheads;
    Py_ssize_t hint_cap;
    po_vec cand; /* nodes to check at the end of the method */
    int busy;
} PrefixOrderObject;

#define N(o, i) ((o)->nodes[(i)])

/* ---- small vectors ---------------------------------------------------------------------- */

/* Append ``x``; -1 (no exception set) when there is no memory. */
static int vec_push_raw(po_vec *v, int32_t x)
{
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? 2 * v->cap : 64;
        int32_t *p = PyMem_Realloc(v->v, (size_t)cap * sizeof(int32_t));
        if (!p)
            return -1;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}

static int vec_push(po_vec *v, int32_t x)
{
    if (vec_push_raw(v, x) == 0)
        return 0;
    PyErr_NoMemory();
    return -1;
}

static void vec_free(po_vec *v)
{
    PyMem_Free(v->v);
    v->v = NULL;
    v->n = v->cap = 0;
}

/* ---- intrusive lists -------------------------------------------------------------------- */

static po_link *lnk(PrefixOrderObject *o, int which, int32_t i)
{
    return which < 0 ? &N(o, i).sib : &N(o, i).link[which];
}

static void list_insert(PrefixOrderObject *o, po_list *l, int which, int32_t i, int front)
{
    po_link *k = lnk(o, which, i);
    if (front) {
        k->prev = -1;
        k->next = l->head;
        if (l->head >= 0)
            lnk(o, which, l->head)->prev = i;
        else
            l->tail = i;
        l->head = i;
    } else {
        k->next = -1;
        k->prev = l->tail;
        if (l->tail >= 0)
            lnk(o, which, l->tail)->next = i;
        else
            l->head = i;
        l->tail = i;
    }
    l->n++;
    if (which >= 0)
        N(o, i).flags |= 1u << which;
}

static void list_unlink(PrefixOrderObject *o, po_list *l, int which, int32_t i)
{
    po_link *k = lnk(o, which, i);
    if (k->prev >= 0)
        lnk(o, which, k->prev)->next = k->next;
    else
        l->head = k->next;
    if (k->next >= 0)
        lnk(o, which, k->next)->prev = k->prev;
    else
        l->tail = k->prev;
    k->prev = k->next = -1;
    l->n--;
    if (which >= 0)
        N(o, i).flags &= ~(1u << which);
}

static int in_list(PrefixOrderObject *o, int which, int32_t i)
{
    return (N(o, i).flags >> which) & 1u;
}

/* OrderedDict's d[k] = None: appended when absent, left in place when present. */
static void list_add(PrefixOrderObject *o, int which, int32_t i)
{
    if (!in_list(o, which, i))
        list_insert(o, &o->lists[which], which, i, 0);
}

static void list_remove(PrefixOrderObject *o, int which, int32_t i)
{
    if (in_list(o, which, i))
        list_unlink(o, &o->lists[which], which, i);
}

/* d[k] = None; d.move_to_end(k, last=not front) */
static void list_move(PrefixOrderObject *o, int which, int32_t i, int front)
{
    list_remove(o, which, i);
    list_insert(o, &o->lists[which], which, i, front);
}

/* ---- keys and the table ----------------------------------------------------------------- */

static int key_eq(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    Py_ssize_t len = PyUnicode_GET_LENGTH(a);
    if (len != PyUnicode_GET_LENGTH(b) || PyUnicode_KIND(a) != PyUnicode_KIND(b))
        return 0;
    return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)len * PyUnicode_KIND(a)) == 0;
}

static PyObject *not_str(PyObject *obj, const char *what)
{
    PyErr_Format(PyExc_TypeError, "PrefixOrder: %s must be str; got %.100s", what, Py_TYPE(obj)->tp_name);
    return NULL;
}

/* 0 when each of the ``n`` items is a str; else -1 with key_of's TypeError for the first that
 * is not. A method that changes the order checks its whole input with it first, so a refusal
 * changes nothing. */
static int all_str(PyObject *const *items, Py_ssize_t n, const char *what)
{
    for (Py_ssize_t j = 0; j < n; j++)
        if (!PyUnicode_Check(items[j])) {
            not_str(items[j], what);
            return -1;
        }
    return 0;
}

/* The exact str ``obj`` is (a new reference; a subclass copied) and its hash, or NULL with
 * TypeError naming ``what``. */
static PyObject *key_of(PyObject *obj, Py_hash_t *hash, const char *what)
{
    PyObject *key;
    if (PyUnicode_CheckExact(obj)) {
        key = Py_NewRef(obj);
    } else if (PyUnicode_Check(obj)) {
        key = PyUnicode_FromObject(obj);
        if (!key)
            return NULL;
    } else {
        return not_str(obj, what);
    }
    if ((*hash = PyObject_Hash(key)) == -1) {
        Py_DECREF(key);
        return NULL;
    }
    return key;
}

static size_t table_slot(PrefixOrderObject *o, PyObject *key, Py_hash_t hash, int32_t *found)
{
    size_t s = (size_t)hash & o->mask;
    for (;;) {
        int32_t i = o->slots[s];
        if (i < 0 || (N(o, i).hash == hash && key_eq(N(o, i).key, key))) {
            *found = i;
            return s;
        }
        s = (s + 1) & o->mask;
    }
}

static int32_t find_key(PrefixOrderObject *o, PyObject *key, Py_hash_t hash)
{
    int32_t found = -1;
    if (o->slots)
        table_slot(o, key, hash, &found);
    return found;
}

/* The node of ``obj`` or -1 (not known); -2 with an exception when it is not a str. */
static int32_t find_obj(PrefixOrderObject *o, PyObject *obj, const char *what)
{
    Py_hash_t hash;
    PyObject *key = key_of(obj, &hash, what);
    if (!key)
        return -2;
    int32_t i = find_key(o, key, hash);
    Py_DECREF(key);
    return i;
}

static int table_grow(PrefixOrderObject *o)
{
    size_t size = o->slots ? 2 * (o->mask + 1) : 64;
    int32_t *slots = PyMem_Malloc(size * sizeof(int32_t));
    if (!slots) {
        PyErr_NoMemory();
        return -1;
    }
    memset(slots, 0xff, size * sizeof(int32_t));
    int32_t *old = o->slots;
    size_t oldsize = old ? o->mask + 1 : 0;
    o->slots = slots;
    o->mask = size - 1;
    for (size_t s = 0; s < oldsize; s++) {
        if (old[s] >= 0) {
            int32_t unused;
            slots[table_slot(o, N(o, old[s]).key, N(o, old[s]).hash, &unused)] = old[s];
        }
    }
    PyMem_Free(old);
    return 0;
}

static int nodes_grow(PrefixOrderObject *o)
{
    if (o->ncap >= PO_MAX_NODES) {
        PyErr_SetString(PyExc_MemoryError, "PrefixOrder: too many keys");
        return -1;
    }
    int32_t cap = o->ncap ? 2 * o->ncap : 64;
    po_node *p = PyMem_Realloc(o->nodes, (size_t)cap * sizeof(po_node));
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    o->nodes = p;
    o->ncap = cap;
    return 0;
}

static void node_init(po_node *n, PyObject *key, Py_hash_t hash)
{
    memset(n, 0, sizeof(*n));
    n->key = key;
    n->hash = hash;
    n->pred = n->hint = -1;
    n->kids.head = n->kids.tail = -1;
    n->sib.prev = n->sib.next = -1;
    for (int w = 0; w < PO_NLISTS; w++)
        n->link[w].prev = n->link[w].next = -1;
}

static void cand(PrefixOrderObject *o, int32_t i)
{
    /* With no room to queue it the node stays, meaning nothing, until it is used again. */
    if (!(N(o, i).flags & F_CAND) && vec_push_raw(&o->cand, i) == 0)
        N(o, i).flags |= F_CAND;
}

static int32_t intern_key(PrefixOrderObject *o, PyObject *key, Py_hash_t hash)
{
    int32_t i = find_key(o, key, hash);
    if (i >= 0)
        return i;
    if ((size_t)(o->nlive + 1) * 2 > (o->slots ? o->mask + 1 : 0) && table_grow(o) < 0)
        return -1;
    if (o->free_head < 0 && o->nused == o->ncap && nodes_grow(o) < 0)
        return -1;
    if (o->free_head >= 0) {
        i = o->free_head;
        o->free_head = N(o, i).link[0].next;
    } else {
        i = o->nused++;
    }
    node_init(&N(o, i), Py_NewRef(key), hash);
    size_t s = table_slot(o, key, hash, &(int32_t){0});
    o->slots[s] = i;
    o->nlive++;
    cand(o, i); /* freed at the end of the method if nothing came to name it (an error after) */
    return i;
}

/* The node of ``obj``, made when new; -1 with an exception (not a str, no memory). */
static int32_t intern_obj(PrefixOrderObject *o, PyObject *obj, const char *what)
{
    Py_hash_t hash;
    PyObject *key = key_of(obj, &hash, what);
    if (!key)
        return -1;
    int32_t i = intern_key(o, key, hash);
    Py_DECREF(key);
    return i;
}

/* Backward-shift deletion: the slots after the freed one move up when their probe allows. */
static void table_delete(PrefixOrderObject *o, size_t s)
{
    size_t j = s;
    for (;;) {
        j = (j + 1) & o->mask;
        int32_t i = o->slots[j];
        if (i < 0)
            break;
        size_t home = (size_t)N(o, i).hash & o->mask;
        if (((j - home) & o->mask) >= ((j - s) & o->mask)) {
            o->slots[s] = i;
            s = j;
        }
    }
    o->slots[s] = -1;
}

static int node_empty(po_node *n)
{
    return !(n->flags & (F_STORED | F_HINT)) && n->refs == 0 && n->kids.n == 0;
}

/* Free the queued nodes that mean nothing now (see the file comment). */
static void collect(PrefixOrderObject *o)
{
    po_vec *v = &o->cand;
    for (Py_ssize_t k = 0; k < v->n; k++) {
        int32_t i = v->v[k];
        po_node *n = &N(o, i);
        n->flags &= ~(uint32_t)F_CAND;
        if (!n->key || !node_empty(n))
            continue;
        int32_t unused;
        table_delete(o, table_slot(o, n->key, n->hash, &unused));
        PyObject *key = n->key;
        n->key = NULL;
        n->link[0].next = o->free_head;
        o->free_head = i;
        o->nlive--;
        Py_DECREF(key); /* an exact str: runs no Python code */
    }
    v->n = 0;
    if (v->cap > 4096) {
        vec_free(v);
    }
}

static void unref(PrefixOrderObject *o, int32_t i)
{
    N(o, i).refs--;
    cand(o, i);
}

/* ---- pending links ---------------------------------------------------------------------- */

/* hints[k] = p (a key keeps its place when it has one). */
static void hint_set(PrefixOrderObject *o, int32_t k, int32_t p)
{
    po_node *n = &N(o, k);
    if (n->flags & F_HINT) {
        if (n->hint == p)
            return;
        unref(o, n->hint);
    } else {
        list_insert(o, &o->lists[PO_HINTS], PO_HINTS, k, 0);
    }
    N(o, k).hint = p;
    N(o, p).refs++;
}

/* hints.pop(k): its predecessor, whose reference passes to the caller; -1 when none. */
static int32_t hint_take(PrefixOrderObject *o, int32_t k)
{
    if (!(N(o, k).flags & F_HINT))
        return -1;
    list_unlink(o, &o->lists[PO_HINTS], PO_HINTS, k);
    int32_t p = N(o, k).hint;
    N(o, k).hint = -1;
    cand(o, k);
    return p;
}

static void trim_hints(PrefixOrderObject *o)
{
    if (o->lists[PO_HINTS].n <= 2 * o->hint_cap)
        return;
    while (o->lists[PO_HINTS].n > o->hint_cap) {
        int32_t p = hint_take(o, o->lists[PO_HINTS].head);
        unref(o, p);
    }
}

/* ---- stored keys ------------------------------------------------------------------------ */

static void store(PrefixOrderObject *o, int32_t i, int32_t pred)
{
    N(o, i).pred = pred;
    list_insert(o, &o->lists[PO_STORED], PO_STORED, i, 0);
    if (pred < 0) {
        N(o, i).flags |= F_HEAD;
        o->nheads++;
    }
}

static void kid_add(PrefixOrderObject *o, int32_t pred, int32_t key)
{
    list_insert(o, &N(o, pred).kids, -1, key, 0);
}

/* The stored ``key``'s children its leaving made unreachable are reachable again. */
static void adopt(PrefixOrderObject *o, int32_t key)
{
    for (int32_t c = N(o, key).kids.head; c >= 0; c = N(o, c).sib.next) {
        if (in_list(o, PO_ORPHANS, c)) {
            list_unlink(o, &o->lists[PO_ORPHANS], PO_ORPHANS, c);
            if (N(o, c).kids.n == 0)
                list_add(o, PO_LEAVES, c);
        }
    }
}

static void place(PrefixOrderObject *o, int32_t key)
{
    if (N(o, key).kids.n == 0)
        list_add(o, PO_LEAVES, key);
    else if (o->lists[PO_ORPHANS].n)
        adopt(o, key);
}

/* Whether walking predecessors from ``start`` meets ``target`` (bounded by the keys stored). */
static int reaches(PrefixOrderObject *o, int32_t start, int32_t target)
{
    Py_ssize_t seen = 0;
    for (int32_t n = start; n >= 0 && seen <= o->lists[PO_STORED].n; seen++) {
        if (n == target)
            return 1;
        n = (N(o, n).flags & F_STORED) ? N(o, n).pred : -1;
    }
    return 0;
}

/* The stored head ``key`` gets the predecessor ``pred`` (when stored and no cycle comes of it). */
static void relink(PrefixOrderObject *o, int32_t key, int32_t pred)
{
    if (!(N(o, pred).flags & F_STORED) || reaches(o, pred, key))
        return;
    N(o, key).pred = pred;
    N(o, pred).refs++;
    N(o, key).flags &= ~(uint32_t)F_HEAD;
    o->nheads--;
    kid_add(o, pred, key);
    list_remove(o, PO_LEAVES, pred);
    if (in_list(o, PO_ORPHANS, pred) && in_list(o, PO_LEAVES, key)) {
        list_unlink(o, &o->lists[PO_LEAVES], PO_LEAVES, key);
        list_add(o, PO_ORPHANS, key);
    }
}

/* A key newly stored: its predecessor from a pending link, its place among the children. */
static int32_t store_new(PrefixOrderObject *o, int32_t key, int32_t last)
{
    int32_t pred = hint_take(o, key);
    if (pred == key) {
        unref(o, pred);
        pred = -1;
    }
    store(o, key, pred);
    if (pred >= 0) {
        int32_t had = N(o, pred).kids.n;
        kid_add(o, pred, key);
        if (had == 0 && pred != last) /* the key before in the batch never entered the leaves */
            list_remove(o, PO_LEAVES, pred);
    }
    return pred;
}

static int add_keys(PrefixOrderObject *o, PyObject *const *items, Py_ssize_t n)
{
    if (all_str(items, n, "a key") < 0)
        return -1;
    int32_t last = -1; /* stored just before, not placed yet: a leaf unless this key follows it */
    for (Py_ssize_t j = 0; j < n; j++) {
        int32_t key = intern_obj(o, items[j], "a key");
        if (key < 0) {
            if (last >= 0)
                place(o, last);
            return -1;
        }
        if (N(o, key).flags & F_STORED) {
            if (in_list(o, PO_LEAVES, key))
                list_move(o, PO_LEAVES, key, 0);
            continue;
        }
        int32_t pred = store_new(o, key, last);
        if (last >= 0 && (pred != last || o->lists[PO_ORPHANS].n))
            place(o, last);
        if (o->lists[PO_ORPHANS].n && pred >= 0 && in_list(o, PO_ORPHANS, pred)) {
            list_add(o, PO_ORPHANS, key);
            last = -1;
        } else {
            last = key;
        }
    }
    if (last >= 0)
        place(o, last);
    return 0;
}

/* ``key`` left: its stored children become unreachable (they stay listed under it). */
static void orphan_children(PrefixOrderObject *o, int32_t key)
{
    for (int32_t c = N(o, key).kids.head; c >= 0; c = N(o, c).sib.next) {
        if (N(o, c).flags & F_STORED) {
            list_remove(o, PO_LEAVES, c);
            list_add(o, PO_ORPHANS, c);
        }
    }
}

static void remove_one(PrefixOrderObject *o, int32_t key)
{
    po_node *n = &N(o, key);
    if (!(n->flags & F_STORED)) {
        int32_t p = hint_take(o, key);
        if (p >= 0)
            unref(o, p);
        return;
    }
    int32_t pred = n->pred;
    list_unlink(o, &o->lists[PO_STORED], PO_STORED, key);
    if (n->flags & F_HEAD) {
        n->flags &= ~(uint32_t)F_HEAD;
        o->nheads--;
    }
    if (in_list(o, PO_LEAVES, key))
        list_unlink(o, &o->lists[PO_LEAVES], PO_LEAVES, key);
    else
        list_remove(o, PO_ORPHANS, key);
    if (n->kids.n)
        orphan_children(o, key);
    cand(o, key);
    if (pred < 0)
        return;
    n->pred = -1;
    po_node *p = &N(o, pred);
    list_unlink(o, &p->kids, -1, key);
    if (p->kids.n == 0 && (p->flags & F_STORED) && !(p->flags & (F_GOING | F_IN_ORPHANS)))
        list_move(o, PO_LEAVES, pred, 1);
    unref(o, pred);
}

/* ---- eviction --------------------------------------------------------------------------- */

typedef struct {
    PyObject *skip; /* a predicate (call), a set or another container (membership), or NULL */
    int call, set;
    int32_t *out;
    Py_ssize_t n, want;
} po_pick;

/* Whether ``skip`` names the node; -1 with an exception. */
static int kept(PrefixOrderObject *o, po_pick *pk, int32_t i)
{
    if (!pk->skip)
        return 0;
    PyObject *key = N(o, i).key;
    if (pk->set)
        return PySet_Contains(pk->skip, key);
    if (!pk->call)
        return PySequence_Contains(pk->skip, key);
    PyObject *r = PyObject_CallOneArg(pk->skip, key);
    if (!r)
        return -1;
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

/* Take the node; 1 when the batch is full. */
static int take(PrefixOrderObject *o, po_pick *pk, int32_t i)
{
    pk->out[pk->n++] = i;
    N(o, i).flags |= F_CHOSEN;
    return pk->n >= pk->want;
}

/* Unreachable keys oldest first, then what hangs below them. 1: full, 0: not, -1: error. */
static int pick_unreachable(PrefixOrderObject *o, po_pick *pk)
{
    for (int32_t i = o->lists[PO_ORPHANS].head; i >= 0; i = N(o, i).link[PO_ORPHANS].next) {
        int k = kept(o, pk, i);
        if (k < 0)
            return -1;
        if (!k && take(o, pk, i))
            return 1;
    }
    for (Py_ssize_t j = 0; j < pk->n; j++) {
        for (int32_t c = N(o, pk->out[j]).kids.head; c >= 0; c = N(o, c).sib.next) {
            if (!(N(o, c).flags & F_STORED) || (N(o, c).flags & F_CHOSEN))
                continue;
            int k = kept(o, pk, c);
            if (k < 0)
                return -1;
            if (!k && take(o, pk, c))
                return 1;
        }
    }
    return 0;
}

/* The predecessor taking ``node``'s leaf turns into a leaf to take next, or -1 (or -2 on
 * an error). */
static int32_t next_up(PrefixOrderObject *o, po_pick *pk, int32_t node)
{
    int32_t pred = N(o, node).pred;
    if (pred < 0)
        return -1;
    po_node *p = &N(o, pred);
    if (!(p->flags & F_STORED) || (p->flags & (F_CHOSEN | F_IN_ORPHANS)))
        return -1;
    if (p->kids.n != 1 && ++p->scratch < p->kids.n)
        return -1; /* not all its children chosen yet: a count, so a shared head costs nothing */
    int k = kept(o, pk, pred);
    return k < 0 ? -2 : k ? -1 : pred;
}

/* Leaves oldest first, each followed by the predecessors its eviction turns into leaves. */
static int pick_leaves(PrefixOrderObject *o, po_pick *pk)
{
    for (int32_t leaf = o->lists[PO_LEAVES].head; leaf >= 0; leaf = N(o, leaf).link[PO_LEAVES].next) {
        if (N(o, leaf).flags & F_CHOSEN)
            continue;
        int k = kept(o, pk, leaf);
        if (k < 0)
            return -1;
        if (k)
            continue;
        for (int32_t node = leaf; node >= 0;) {
            if (take(o, pk, node))
                return 1;
            node = next_up(o, pk, node);
            if (node == -2)
                return -1;
        }
    }
    return 0;
}

/* Every leaf kept: keys below them, newest stored first. */
static int pick_any(PrefixOrderObject *o, po_pick *pk)
{
    for (int32_t i = o->lists[PO_STORED].tail; i >= 0; i = N(o, i).link[PO_STORED].prev) {
        if (N(o, i).flags & F_CHOSEN)
            continue;
        int k = kept(o, pk, i);
        if (k < 0)
            return -1;
        if (!k && take(o, pk, i))
            return 1;
    }
    return 0;
}

static PyObject *pick_result(PrefixOrderObject *o, po_pick *pk, int rc)
{
    PyObject *list = rc < 0 ? NULL : PyList_New(pk->n);
    for (Py_ssize_t j = 0; j < pk->n; j++) {
        po_node *n = &N(o, pk->out[j]);
        n->flags &= ~(uint32_t)F_CHOSEN;
        if (n->pred >= 0)
            N(o, n->pred).scratch = 0;
        if (list)
            PyList_SET_ITEM(list, j, Py_NewRef(n->key));
    }
    PyMem_Free(pk->out);
    return list;
}

static int pick_start(PrefixOrderObject *o, po_pick *pk, PyObject *skip, Py_ssize_t want)
{
    memset(pk, 0, sizeof(*pk));
    pk->want = want;
    if (PyCallable_Check(skip)) {
        pk->skip = skip;
        pk->call = 1;
    } else if (PyAnySet_CheckExact(skip)) {
        pk->skip = PySet_GET_SIZE(skip) ? skip : NULL;
        pk->set = 1;
    } else if (!PyTuple_Check(skip) || PyTuple_GET_SIZE(skip)) {
        pk->skip = skip;
    }
    Py_ssize_t cap = want < o->lists[PO_STORED].n ? want : o->lists[PO_STORED].n;
    pk->out = PyMem_Malloc((size_t)(cap > 0 ? cap : 1) * sizeof(int32_t));
    if (!pk->out) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* ---- reachable_loss --------------------------------------------------------------------- */

enum { MEMO_NONE, MEMO_YES, MEMO_NO };

/* Whether every predecessor of the stored ``key`` is stored; memo in scratch. -1: no memory. */
static int reachable(PrefixOrderObject *o, int32_t key, po_vec *path, po_vec *touched)
{
    int result = 1;
    path->n = 0;
    for (int32_t n = key; n >= 0; n = N(o, n).pred) {
        if (N(o, n).scratch != MEMO_NONE) {
            result = N(o, n).scratch == MEMO_YES;
            break;
        }
        if (!(N(o, n).flags & F_STORED) || in_list(o, PO_ORPHANS, n) || path->n > o->lists[PO_STORED].n) {
            result = 0;
            break;
        }
        if (vec_push(path, n) < 0 || vec_push(touched, n) < 0)
            return -1;
        N(o, n).scratch = MEMO_NO; /* provisional; a cycle meets it and is unreachable */
    }
    for (Py_ssize_t j = 0; j < path->n; j++)
        N(o, path->v[j]).scratch = result ? MEMO_YES : MEMO_NO;
    return result;
}

/* Count into ``lost`` the stored keys below the ``front`` keys not counted yet, up to ``limit``. */
static int loss_below(PrefixOrderObject *o, po_vec *front, po_vec *touched, Py_ssize_t *lost, Py_ssize_t limit)
{
    while (front->n && *lost < limit) {
        int32_t i = front->v[--front->n];
        for (int32_t c = N(o, i).kids.head; c >= 0 && *lost < limit; c = N(o, c).sib.next) {
            if ((N(o, c).flags & (F_SEEN | F_STORED)) != F_STORED)
                continue;
            N(o, c).flags |= F_SEEN;
            ++*lost;
            if (vec_push(touched, c) < 0 || vec_push(front, c) < 0)
                return -1;
        }
    }
    return 0;
}

/* Count into ``lost`` the reachable ``going`` keys and the stored keys below them, stopping at
 * ``limit`` (a shared head's whole subtree need not be walked to know it loses more). */
static int loss_walk(PrefixOrderObject *o, po_vec *going, po_vec *touched, Py_ssize_t *lost, Py_ssize_t limit)
{
    po_vec path = {0}, front = {0};
    int rc = 0;
    for (Py_ssize_t j = 0; j < going->n && rc == 0 && *lost < limit; j++) {
        int32_t i = going->v[j];
        int r = (N(o, i).flags & F_STORED) ? reachable(o, i, &path, touched) : 0;
        if (r < 0 || (r && vec_push(&front, i) < 0))
            rc = -1;
        *lost += r > 0;
    }
    if (rc == 0)
        rc = loss_below(o, &front, touched, lost, limit);
    vec_free(&path);
    vec_free(&front);
    return rc;
}

/* ---- methods ---------------------------------------------------------------------------- */

static int enter(PrefixOrderObject *o)
{
    if (o->busy) {
        PyErr_SetString(PyExc_RuntimeError, "PrefixOrder: called again from inside one of its calls");
        return -1;
    }
    o->busy = 1;
    return 0;
}

static PyObject *leave(PrefixOrderObject *o, PyObject *result)
{
    collect(o);
    o->busy = 0;
    return result;
}

/* The items of a list or tuple argument (PySequence_Fast for other iterables). */
static PyObject *items_of(PyObject *arg, const char *what)
{
    return PySequence_Fast(arg, what);
}

typedef int (*keys_fn)(PrefixOrderObject *o, PyObject *const *items, Py_ssize_t n);

/* A method taking a sequence of keys and returning None: ``fn`` over its items, inside one
 * enter/leave; ``what`` is the TypeError's text for an argument that is not iterable. */
static PyObject *keys_call(PrefixOrderObject *o, PyObject *keys, const char *what, keys_fn fn)
{
    PyObject *seq = items_of(keys, what);
    if (!seq)
        return NULL;
    if (enter(o) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    int rc = fn(o, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq));
    Py_DECREF(seq);
    return leave(o, rc < 0 ? NULL : Py_NewRef(Py_None));
}

/* A method taking one key and returning None: ``fn`` over that key alone. */
static PyObject *key_call(PrefixOrderObject *o, PyObject *key, keys_fn fn)
{
    if (enter(o) < 0)
        return NULL;
    int rc = fn(o, &key, 1);
    return leave(o, rc < 0 ? NULL : Py_NewRef(Py_None));
}

static PyObject *po_add_many(PrefixOrderObject *o, PyObject *keys)
{
    return keys_call(o, keys, "PrefixOrder.add_many: keys must be iterable", add_keys);
}

static PyObject *po_add(PrefixOrderObject *o, PyObject *key)
{
    return key_call(o, key, add_keys);
}

static int remove_keys(PrefixOrderObject *o, PyObject *const *items, Py_ssize_t n)
{
    int32_t stack[64], *idx = n <= 64 ? stack : PyMem_Malloc((size_t)n * sizeof(int32_t));
    if (!idx) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        idx[j] = find_obj(o, items[j], "a key");
        if (idx[j] == -2) {
            while (j-- > 0) /* nothing removed: the keys marked before stay as they were */
                if (idx[j] >= 0)
                    N(o, idx[j]).flags &= ~(uint32_t)F_GOING;
            if (idx != stack)
                PyMem_Free(idx);
            return -1;
        }
        if (idx[j] >= 0 && n > 1)
            N(o, idx[j]).flags |= F_GOING;
    }
    for (Py_ssize_t j = 0; j < n; j++)
        if (idx[j] >= 0)
            remove_one(o, idx[j]);
    for (Py_ssize_t j = 0; j < n; j++)
        if (idx[j] >= 0)
            N(o, idx[j]).flags &= ~(uint32_t)F_GOING;
    if (idx != stack)
        PyMem_Free(idx);
    return 0;
}

static PyObject *po_remove_many(PrefixOrderObject *o, PyObject *keys)
{
    return keys_call(o, keys, "PrefixOrder.remove_many: keys must be iterable", remove_keys);
}

static PyObject *po_remove(PrefixOrderObject *o, PyObject *key)
{
    return key_call(o, key, remove_keys);
}

/* The nodes of ``n`` keys, made when new, into ``idx``; -1 with an exception. */
static int intern_all(PrefixOrderObject *o, PyObject *const *items, Py_ssize_t n, int32_t *idx)
{
    for (Py_ssize_t j = 0; j < n; j++)
        if ((idx[j] = intern_obj(o, items[j], "a key")) < 0)
            return -1;
    return 0;
}

static int32_t *idx_buf(int32_t *stack, Py_ssize_t n)
{
    int32_t *idx = n <= 64 ? stack : PyMem_Malloc((size_t)n * sizeof(int32_t));
    if (!idx)
        PyErr_NoMemory();
    return idx;
}

static int note_call_keys(PrefixOrderObject *o, PyObject *const *items, Py_ssize_t n)
{
    int32_t stack[64], *idx = idx_buf(stack, n);
    if (!idx || intern_all(o, items, n, idx) < 0) {
        if (idx != stack)
            PyMem_Free(idx);
        return -1;
    }
    for (Py_ssize_t j = 1; j < n; j++)
        hint_set(o, idx[j], idx[j - 1]);
    for (Py_ssize_t j = 1; j < n && o->nheads; j++)
        if ((N(o, idx[j]).flags & F_HEAD) && idx[j] != idx[j - 1])
            relink(o, idx[j], idx[j - 1]);
    trim_hints(o);
    if (idx != stack)
        PyMem_Free(idx);
    return 0;
}

static PyObject *po_note_call(PrefixOrderObject *o, PyObject *encoded)
{
    PyObject *seq = items_of(encoded, "PrefixOrder.note_call: encoded must be a sequence");
    if (!seq)
        return NULL;
    if (enter(o) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int rc = all_str(PySequence_Fast_ITEMS(seq), n, "a key");
    if (rc == 0 && n >= 2)
        rc = note_call_keys(o, PySequence_Fast_ITEMS(seq), n);
    Py_DECREF(seq);
    return leave(o, rc < 0 ? NULL : Py_NewRef(Py_None));
}

static int lookup_relink(PrefixOrderObject *o, PyObject *const *items, Py_ssize_t hits)
{
    for (Py_ssize_t i = 1; i < hits && o->nheads; i++) {
        int32_t key = find_obj(o, items[i], "a key");
        if (key == -2)
            return -1;
        if (key < 0 || !(N(o, key).flags & F_HEAD))
            continue;
        int32_t prev = find_obj(o, items[i - 1], "a key");
        if (prev == -2)
            return -1;
        if (prev >= 0 && prev != key)
            relink(o, key, prev);
    }
    return 0;
}

static int lookup_keys(PrefixOrderObject *o, PyObject *const *items, Py_ssize_t n, Py_ssize_t hits)
{
    if (all_str(items, n, "a key") < 0)
        return -1;
    if (hits > n)
        hits = n;
    if (hits > 1 && lookup_relink(o, items, hits) < 0)
        return -1;
    if (hits <= 0 || hits >= n)
        return 0;
    int32_t miss = find_obj(o, items[hits], "a key");
    if (miss == -2)
        return -1;
    if (miss >= 0 && (N(o, miss).flags & F_STORED))
        return 0;
    miss = intern_obj(o, items[hits], "a key");
    int32_t last = miss < 0 ? -1 : intern_obj(o, items[hits - 1], "a key");
    if (last < 0)
        return -1;
    hint_set(o, miss, last);
    trim_hints(o);
    return 0;
}

static PyObject *po_note_lookup(PrefixOrderObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "PrefixOrder.note_lookup takes encoded and hits; got %zd arguments", nargs);
        return NULL;
    }
    Py_ssize_t hits = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (hits == -1 && PyErr_Occurred())
        return NULL;
    PyObject *seq = items_of(args[0], "PrefixOrder.note_lookup: encoded must be a sequence");
    if (!seq)
        return NULL;
    if (enter(o) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    int rc = lookup_keys(o, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq), hits);
    Py_DECREF(seq);
    return leave(o, rc < 0 ? NULL : Py_NewRef(Py_None));
}

/* The link ``pair`` as a sequence of two str (a new reference), or NULL with the exception
 * that refuses it. */
static PyObject *link_of(PyObject *pair)
{
    PyObject *seq = PySequence_Fast(pair, "PrefixOrder.note_links: each link must be a (key, predecessor) pair");
    if (!seq)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != 2) {
        PyErr_Format(PyExc_ValueError,
                     "PrefixOrder.note_links: a link must be a (key, predecessor) pair; got %zd items",
                     PySequence_Fast_GET_SIZE(seq));
        Py_DECREF(seq);
        return NULL;
    }
    if (all_str(PySequence_Fast_ITEMS(seq), 2, "a key") < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    return seq;
}

/* The links of ``links``, each checked (link_of), as a list; NULL with the first refusal. */
static PyObject *links_of(PyObject *links)
{
    PyObject *it = PyObject_GetIter(links);
    if (!it)
        return NULL;
    PyObject *out = PyList_New(0), *pair;
    while (out && (pair = PyIter_Next(it))) {
        PyObject *seq = link_of(pair);
        Py_DECREF(pair);
        if (!seq || PyList_Append(out, seq) < 0)
            Py_CLEAR(out);
        Py_XDECREF(seq);
    }
    Py_DECREF(it);
    if (out && PyErr_Occurred())
        Py_CLEAR(out);
    return out;
}

static PyObject *po_note_links(PrefixOrderObject *o, PyObject *links)
{
    PyObject *checked = links_of(links);
    if (!checked)
        return NULL;
    if (enter(o) < 0) {
        Py_DECREF(checked);
        return NULL;
    }
    int rc = 0;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(checked) && rc == 0; j++) {
        int32_t idx[2];
        rc = intern_all(o, PySequence_Fast_ITEMS(PyList_GET_ITEM(checked, j)), 2, idx);
        if (rc == 0)
            hint_set(o, idx[0], idx[1]);
    }
    Py_DECREF(checked);
    if (rc == 0)
        trim_hints(o);
    return leave(o, rc < 0 ? NULL : Py_NewRef(Py_None));
}

static void recover(PrefixOrderObject *o, int32_t key)
{
    if (!(N(o, key).flags & F_STORED))
        store(o, key, -1);
    if (N(o, key).kids.n)
        adopt(o, key);
    else
        list_move(o, PO_LEAVES, key, 1);
}

static int recover_keys(PrefixOrderObject *o, PyObject *const *items, Py_ssize_t n)
{
    int32_t stack[64], *idx = idx_buf(stack, n);
    int rc = !idx || intern_all(o, items, n, idx) < 0 ? -1 : 0;
    Py_ssize_t m = 0;
    for (Py_ssize_t j = 0; j < n && rc == 0; j++) /* the keys not known yet */
        if (!(N(o, idx[j]).flags & F_STORED))
            idx[m++] = idx[j];
    while (m > 0 && rc == 0)
        recover(o, idx[--m]);
    if (idx && idx != stack)
        PyMem_Free(idx);
    return rc;
}

static PyObject *po_add_recovered(PrefixOrderObject *o, PyObject *keys)
{
    return keys_call(o, keys, "PrefixOrder.add_recovered: keys must be iterable", recover_keys);
}

static PyObject *po_touch(PrefixOrderObject *o, PyObject *key)
{
    int32_t i = find_obj(o, key, "key");
    if (i == -2 || enter(o) < 0)
        return NULL;
    if (i >= 0 && in_list(o, PO_LEAVES, i))
        list_move(o, PO_LEAVES, i, 0);
    return leave(o, Py_NewRef(Py_None));
}

static PyObject *po_victims(PrefixOrderObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "PrefixOrder.victims takes want and skip; got %zd arguments", nargs);
        return NULL;
    }
    Py_ssize_t want = PyNumber_AsSsize_t(args[0], PyExc_OverflowError);
    if (want == -1 && PyErr_Occurred())
        return NULL;
    if (want <= 0)
        return PyList_New(0);
    po_pick pk;
    if (enter(o) < 0)
        return NULL;
    if (pick_start(o, &pk, args[1], want) < 0)
        return leave(o, NULL);
    int rc = pick_unreachable(o, &pk);
    if (rc == 0)
        rc = pick_leaves(o, &pk);
    if (rc == 0)
        rc = pick_any(o, &pk);
    return leave(o, pick_result(o, &pk, rc));
}

static PyObject *po_unreachable(PrefixOrderObject *o, PyObject *skip)
{
    po_pick pk;
    if (enter(o) < 0)
        return NULL;
    if (pick_start(o, &pk, skip, o->lists[PO_STORED].n) < 0)
        return leave(o, NULL);
    int rc = pk.want > 0 ? pick_unreachable(o, &pk) : 0;
    return leave(o, pick_result(o, &pk, rc));
}

static PyObject *po_probe_bound(PrefixOrderObject *o, PyObject *encoded)
{
    PyObject *seq = items_of(encoded, "PrefixOrder.probe_bound: encoded must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), bound = n;
    PyObject *const *items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n && o->lists[PO_ORPHANS].n; i++) {
        int32_t k = find_obj(o, items[i], "a key");
        if (k == -2) {
            bound = -1;
            break;
        }
        if (k < 0 || !in_list(o, PO_ORPHANS, k))
            continue;
        int32_t p = N(o, k).pred;
        bound = i && p >= 0 && PyUnicode_Check(items[i - 1]) && key_eq(N(o, p).key, items[i - 1]) ? i - 1 : i;
        break;
    }
    Py_DECREF(seq);
    return bound < 0 ? NULL : PyLong_FromSsize_t(bound);
}

static int loss_limit(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t *limit)
{
    *limit = PY_SSIZE_T_MAX;
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "PrefixOrder.reachable_loss takes keys and limit=None; got %zd arguments", nargs);
        return -1;
    }
    if (nargs < 2 || args[1] == Py_None)
        return 0;
    *limit = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (*limit == -1 && PyErr_Occurred())
        return -1;
    if (*limit < 0) {
        PyErr_Format(PyExc_ValueError, "PrefixOrder.reachable_loss: limit must be >= 0 or None; got %zd", *limit);
        return -1;
    }
    return 0;
}

static PyObject *po_reachable_loss(PrefixOrderObject *o, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t limit;
    if (loss_limit(args, nargs, &limit) < 0)
        return NULL;
    PyObject *seq = items_of(args[0], "PrefixOrder.reachable_loss: keys must be iterable");
    if (!seq)
        return NULL;
    if (enter(o) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    po_vec going = {0}, touched = {0};
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), lost = 0;
    int rc = 0;
    for (Py_ssize_t j = 0; j < n && rc == 0; j++) {
        int32_t i = find_obj(o, PySequence_Fast_ITEMS(seq)[j], "a key");
        if (i == -2 || (i >= 0 && !(N(o, i).flags & F_SEEN) && (vec_push(&touched, i) < 0 || vec_push(&going, i) < 0)))
            rc = -1;
        else if (i >= 0)
            N(o, i).flags |= F_SEEN;
    }
    if (rc == 0)
        rc = loss_walk(o, &going, &touched, &lost, limit);
    for (Py_ssize_t j = 0; j < touched.n; j++) {
        N(o, touched.v[j]).flags &= ~(uint32_t)F_SEEN;
        N(o, touched.v[j]).scratch = MEMO_NONE;
    }
    vec_free(&going);
    vec_free(&touched);
    Py_DECREF(seq);
    return leave(o, rc < 0 ? NULL : PyLong_FromSsize_t(lost));
}

static PyObject *po_predecessor(PrefixOrderObject *o, PyObject *key)
{
    int32_t i = find_obj(o, key, "key");
    if (i == -2)
        return NULL;
    if (i >= 0 && (N(o, i).flags & F_STORED) && N(o, i).pred >= 0)
        return Py_NewRef(N(o, N(o, i).pred).key);
    Py_RETURN_NONE;
}

static PyObject *po_is_unreachable(PrefixOrderObject *o, PyObject *key)
{
    int32_t i = find_obj(o, key, "key");
    if (i == -2)
        return NULL;
    return PyBool_FromLong(i >= 0 && in_list(o, PO_ORPHANS, i));
}

static PyObject *po_counts(PrefixOrderObject *o, PyObject *Py_UNUSED(arg))
{
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "prefix_keys", o->lists[PO_STORED].n, "prefix_leaves",
                         o->lists[PO_LEAVES].n, "prefix_unreachable", o->lists[PO_ORPHANS].n, "prefix_pending_links",
                         o->lists[PO_HINTS].n);
}

/* ---- the type --------------------------------------------------------------------------- */

static void po_reset(PrefixOrderObject *o)
{
    po_node *nodes = o->nodes;
    int32_t used = o->nused;
    int32_t *slots = o->slots;
    vec_free(&o->cand);
    o->nodes = NULL;
    o->slots = NULL;
    o->ncap = o->nused = 0;
    o->free_head = -1;
    o->mask = 0;
    o->nlive = o->nheads = 0;
    for (int w = 0; w < PO_NLISTS; w++)
        o->lists[w] = (po_list){-1, -1, 0};
    for (int32_t i = 0; i < used; i++)
        Py_XDECREF(nodes[i].key);
    PyMem_Free(nodes);
    PyMem_Free(slots);
}

static PyObject *po_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kw))
{
    PrefixOrderObject *o = (PrefixOrderObject *)type->tp_alloc(type, 0);
    if (!o)
        return NULL;
    po_reset(o);
    o->hint_cap = PO_HINT_CAPACITY;
    return (PyObject *)o;
}

static int po_init(PrefixOrderObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"hint_capacity", NULL};
    PyObject *cap = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:PrefixOrder", kwlist, &cap))
        return -1;
    Py_ssize_t n = PO_HINT_CAPACITY;
    if (cap) {
        PyObject *as_int = PyNumber_Long(cap);
        if (!as_int)
            return -1;
        n = PyLong_AsSsize_t(as_int);
        Py_DECREF(as_int);
        if (n == -1 && PyErr_Occurred())
            return -1;
    }
    if (o->busy) {
        PyErr_SetString(PyExc_RuntimeError, "PrefixOrder: called again from inside one of its calls");
        return -1;
    }
    po_reset(o);
    o->hint_cap = n < 1 ? 1 : n > PO_MAX_NODES ? PO_MAX_NODES : n;
    return 0;
}

static void po_dealloc(PrefixOrderObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    po_reset(o);
    tp->tp_free((PyObject *)o);
    Py_DECREF(tp);
}

static Py_ssize_t po_len(PrefixOrderObject *o)
{
    return o->lists[PO_STORED].n;
}

static int po_contains(PrefixOrderObject *o, PyObject *key)
{
    if (!PyUnicode_Check(key))
        return 0;
    int32_t i = find_obj(o, key, "key");
    return i == -2 ? -1 : i >= 0 && (N(o, i).flags & F_STORED);
}

#define METH(name, flags, sig, doc) {#name, (PyCFunction)(void (*)(void))po_##name, flags, #name sig "\n--\n\n" doc}

static PyMethodDef po_methods[] = {
    METH(note_call, METH_O, "($self, encoded, /)",
         "The keys of one store call, in prompt order: each one's predecessor is the key before it."),
    METH(note_lookup, METH_FASTCALL, "($self, encoded, hits, /)",
         "A lookup of encoded that found the first hits keys: the first missing key follows the last hit."),
    METH(note_links, METH_O, "($self, links, /)", "(key, predecessor) pairs known for keys not stored now."),
    METH(add, METH_O, "($self, key, /)", "key was stored (or used again)."),
    METH(add_many, METH_O, "($self, keys, /)", "keys were stored (those stored already were used again)."),
    METH(add_recovered, METH_O, "($self, keys, /)", "Keys found on the device (oldest first): heads, evicted first."),
    METH(touch, METH_O, "($self, key, /)", "key was loaded: the most recently used of the leaves."),
    METH(remove, METH_O, "($self, key, /)", "key left the tier."),
    METH(remove_many, METH_O, "($self, keys, /)", "keys left the tier: their stored children become unreachable."),
    METH(victims, METH_FASTCALL, "($self, want, skip, /)",
         "Up to want keys to evict, in order; skip (a predicate or a container) names keys that stay."),
    METH(unreachable, METH_O, "($self, skip, /)", "Every stored key a lookup can no longer reach, none skip names."),
    METH(probe_bound, METH_O, "($self, encoded, /)", "How many of a prompt's keys a lookup needs to probe."),
    METH(reachable_loss, METH_FASTCALL, "($self, keys, limit=None, /)",
         "How many stored keys a lookup reaches now would be lost if keys left (at most limit)."),
    METH(predecessor, METH_O, "($self, key, /)", "The stored key's predecessor, or None."),
    METH(is_unreachable, METH_O, "($self, key, /)", "Whether key is stored and its predecessor left."),
    METH(counts, METH_NOARGS, "($self, /)", "Keys known, leaves, unreachable keys and pending links."),
    {NULL, NULL, 0, NULL},
};

static PyType_Slot po_slots[] = {
    {Py_tp_new, po_new},
    {Py_tp_init, po_init},
    {Py_tp_dealloc, po_dealloc},
    {Py_tp_methods, po_methods},
    {Py_sq_length, po_len},
    {Py_sq_contains, po_contains},
    {Py_tp_doc, "PrefixOrder(hint_capacity=65536)\n--\n\n"
                "Chains of stored keys and their eviction order (lmcache_rawblock.prefix_evict)."},
    {0, NULL},
};

PyType_Spec rbpy_prefix_order_spec = {
    .name = "lmcache_rawblock._native.PrefixOrder",
    .basicsize = sizeof(PrefixOrderObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = po_slots,
};
