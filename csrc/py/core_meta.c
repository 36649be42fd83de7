/*
 * core_meta.c - put_many's metadata read from the payload objects themselves: the metadata
 * attribute (or its direct shortcut), the checkpoint names of (dtype, fmt) through the namer
 * and the names the core keeps, shape and cached positions as int64 arrays.
 */
#include "core.h"

#include <string.h>

#if PY_VERSION_HEX >= 0x030D0000
#define lookup_attr PyObject_GetOptionalAttr
#else
#define lookup_attr _PyObject_LookupAttr
#endif

/* getattr(o, name, None) as a new reference; NULL with an exception for any failure other
 * than a missing attribute. None has none of the names read here. */
static PyObject *attr_or_none(PyObject *o, PyObject *name)
{
    PyObject *v = NULL;
    if (o == Py_None)
        return Py_NewRef(Py_None);
    int rc = lookup_attr(o, name, &v);
    if (rc < 0)
        return NULL;
    return rc ? v : Py_NewRef(Py_None);
}

/* int(x) as int64 into *y: 0, or -1 with an exception (int()'s, or OverflowError past 64
 * bits). Exact ints are read without int(). */
static int as_i64(PyObject *x, int64_t *y)
{
    long long v;
    if (PyLong_CheckExact(x)) {
        v = PyLong_AsLongLong(x);
    } else {
        PyObject *l = PyNumber_Long(x);
        v = l ? PyLong_AsLongLong(l) : -1;
        Py_XDECREF(l);
    }
    *y = v;
    return v == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Room for one more entry in *v (len of *cap used; inl is the caller's array): a PyMem array
 * twice as large (at least 16) with the entries copied, freeing the old one unless it is inl.
 * 0, or -1 with MemoryError (*v unchanged). */
static int i64_grow(int64_t **v, Py_ssize_t len, Py_ssize_t *cap, const int64_t *inl)
{
    Py_ssize_t ncap = *cap < 8 ? 16 : *cap * 2;
    int64_t *nv = ncap <= PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(int64_t) ? PyMem_Malloc(ncap * sizeof(int64_t)) : NULL;
    if (!nv) {
        PyErr_NoMemory();
        return -1;
    }
    if (len)
        memcpy(nv, *v, len * sizeof(int64_t));
    if (*v != inl)
        PyMem_Free(*v);
    *v = nv;
    *cap = ncap;
    return 0;
}

/* [int(x) for x in o] as int64: into inl while it has room (cap entries), else a PyMem array
 * (*out is inl or that array, never NULL). -1 with an exception set (int()'s, the iteration's,
 * or OverflowError past 64 bits). */
static int i64_from_iter(PyObject *o, int64_t *inl, Py_ssize_t cap, int64_t **out, int64_t *n)
{
    PyObject *iter = PyObject_GetIter(o), *x;
    if (!iter)
        return -1;
    int64_t *v = inl, y;
    Py_ssize_t len = 0;
    int rc = 0;
    while (rc == 0 && (x = PyIter_Next(iter)) != NULL) {
        rc = as_i64(x, &y);
        Py_DECREF(x);
        if (rc == 0 && len == cap)
            rc = i64_grow(&v, len, &cap, inl);
        if (rc == 0)
            v[len++] = y;
    }
    if (rc == 0 && PyErr_Occurred())
        rc = -1;
    if (rc == 0 && !v && !(v = PyMem_Malloc(sizeof(int64_t)))) { /* none, and no inl: never a NULL array */
        PyErr_NoMemory();
        rc = -1;
    }
    Py_DECREF(iter);
    if (rc < 0) {
        if (v != inl)
            PyMem_Free(v);
        return -1;
    }
    *out = v;
    *n = len;
    return 0;
}

/* The class whose instances' metadata is read directly (rbpy_metadata_of), if its metadata attribute
 * is still the property given to _set_metadata_shortcut (checked once per call); else NULL. */
PyTypeObject *rbpy_metadata_direct_type(rbpy_state *st, CoreObject *self)
{
    if (!self->meta_type)
        return NULL;
    PyObject *d = PyObject_GetAttr(self->meta_type, st->names[RBPY_NAME_METADATA]);
    if (!d) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(d); /* only compared: the class keeps its attribute alive */
    return d == self->meta_descr ? (PyTypeObject *)self->meta_type : NULL;
}

/* getattr(o, "metadata", None), or for an instance of exactly direct (rbpy_metadata_direct_type) the
 * attribute that property returns, read without calling it (the property only takes the
 * object's lock around that read; the fields are read after it returns either way). A missing
 * attribute falls back to the property. New reference, NULL with an exception. */
PyObject *rbpy_metadata_of(rbpy_state *st, CoreObject *self, PyTypeObject *direct, PyObject *o)
{
    if (direct && Py_IS_TYPE(o, direct)) {
        PyObject *m = NULL;
        int rc = lookup_attr(o, self->meta_attr, &m);
        if (rc != 0)
            return rc > 0 ? m : NULL;
    }
    return attr_or_none(o, st->names[RBPY_NAME_METADATA]);
}

/* The names the core keeps for (dtype, fmt) into mi, when they came from pc's namer: 1 found,
 * 0 not there. */
static int meta_names_kept(const CoreObject *self, const put_call *pc, PyObject *dtype, PyObject *fmt, rb_meta_in *mi)
{
    if (pc->namer != self->namer)
        return 0;
    for (int j = 0; j < self->n_names; j++) {
        const meta_names *e = &self->names[j];
        if (e->dtype == dtype && e->fmt == fmt) {
            mi->dtype = e->ds;
            mi->dtype_len = e->dl;
            mi->fmt = e->fs;
            mi->fmt_len = e->fl;
            return 1;
        }
    }
    return 0;
}

/* Keep the namer's answer r for (dtype, fmt) (names already in mi) on the core. The namer ran
 * Python code: another thread may have added entries meanwhile, so there must still be room
 * and the entries must still be this namer's. 1 kept, 0 not (the call holds r instead). */
static int meta_names_keep(CoreObject *self, const put_call *pc, PyObject *dtype, PyObject *fmt, PyObject *r,
                           const rb_meta_in *mi)
{
    if (self->n_names >= RBPY_META_NAMES || (self->namer && self->namer != pc->namer))
        return 0;
    if (!self->namer)
        self->namer = Py_NewRef(pc->namer);
    meta_names *e = &self->names[self->n_names++];
    e->dtype = Py_NewRef(dtype);
    e->fmt = Py_NewRef(fmt);
    e->dname = Py_NewRef(PyTuple_GET_ITEM(r, 0));
    e->fname = Py_NewRef(PyTuple_GET_ITEM(r, 1));
    e->ds = mi->dtype;
    e->dl = mi->dtype_len;
    e->fs = mi->fmt;
    e->fl = mi->fmt_len;
    return 1;
}

/* GIL held: the checkpoint names of (dtype, fmt) into mi: from the core's entries when the pair
 * is there (by identity), else namer(dtype, fmt) -> (dtype name, format name, cacheable), kept
 * on the core when cacheable and there is room, else held by the call. */
static int meta_names_of(CoreObject *self, put_call *pc, PyObject *dtype, PyObject *fmt, rb_meta_in *mi)
{
    if (meta_names_kept(self, pc, dtype, fmt, mi))
        return 0;
    PyObject *r = PyObject_CallFunctionObjArgs(pc->namer, dtype, fmt, NULL);
    if (!r)
        return -1;
    int cache = -1;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 3) {
        PyErr_SetString(PyExc_TypeError, "the metas namer must return (dtype name, format name, cacheable)");
        goto done;
    }
    PyObject *dn = PyTuple_GET_ITEM(r, 0), *fn = PyTuple_GET_ITEM(r, 1);
    mi->dtype = rbpy_opt_str(dn, &mi->dtype_len);
    mi->fmt = mi->dtype || dn == Py_None ? rbpy_opt_str(fn, &mi->fmt_len) : NULL;
    if (PyErr_Occurred() || (cache = PyObject_IsTrue(PyTuple_GET_ITEM(r, 2))) < 0)
        goto done;
    if (!(cache && meta_names_keep(self, pc, dtype, fmt, r, mi)) &&
        ((!pc->holds && !(pc->holds = PyList_New(0))) || PyList_Append(pc->holds, r) < 0))
        cache = -1;
done:
    Py_DECREF(r);
    return cache < 0 ? -1 : 0;
}

/*
 * GIL held: key i's metadata from its payload object, as the facade's _meta_of read it:
 * m = getattr(obj, "metadata", None); the names of (getattr(m, "dtype", None), getattr(m,
 * "fmt", None)); shape = getattr(m, "shape", None) as ints (int() of each dimension; up to
 * RBPY_INLINE_DIMS of them in the call's array); cached_positions through tolist() when it has
 * one, then int() of each. The payloads' metadata is read for every key before any payload.
 */
int rbpy_put_meta_read(rbpy_state *st, CoreObject *self, PyTypeObject *direct, put_call *pc, Py_ssize_t i)
{
    rb_put_item *it = &pc->items[i];
    PyObject *const *names = st->names;
    PyObject *dtype = NULL, *fmt = NULL, *shape = NULL, *pos = NULL;
    int rc = -1;
    it->meta.ndim = it->meta.npos = -1;
    PyObject *m = rbpy_metadata_of(st, self, direct, PyTuple_GET_ITEM(pc->bufs, i));
    if (!m || !(dtype = attr_or_none(m, names[RBPY_NAME_DTYPE])) || !(fmt = attr_or_none(m, names[RBPY_NAME_FMT])))
        goto done;
    if (meta_names_of(self, pc, dtype, fmt, &it->meta) < 0 || !(shape = attr_or_none(m, names[RBPY_NAME_SHAPE])))
        goto done;
    if (shape != Py_None) {
        int64_t *dims;
        if (i64_from_iter(shape, pc->dims[i], RBPY_INLINE_DIMS, &dims, &it->meta.ndim) < 0)
            goto done;
        it->meta.dims = dims;
    }
    if (!(pos = attr_or_none(m, names[RBPY_NAME_CACHED_POSITIONS])))
        goto done;
    if (pos != Py_None) {
        PyObject *tolist = attr_or_none(pos, names[RBPY_NAME_TOLIST]);
        if (!tolist)
            goto done;
        if (tolist != Py_None) {
            Py_SETREF(pos, PyObject_CallNoArgs(tolist));
            Py_DECREF(tolist);
            if (!pos)
                goto done;
        } else {
            Py_DECREF(tolist);
        }
        int64_t *p;
        if (i64_from_iter(pos, NULL, 0, &p, &it->meta.npos) < 0)
            goto done;
        it->meta.pos = p;
    }
    rc = 0;
done:
    Py_XDECREF(m);
    Py_XDECREF(dtype);
    Py_XDECREF(fmt);
    Py_XDECREF(shape);
    Py_XDECREF(pos);
    return rc;
}
