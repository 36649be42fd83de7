/*
 * config.c - _native.Core's keywords and _native.settings(), both read off the core's
 * settings table (rb_config.c), so a setting has the same name, type and range here as in C.
 */
#include "rbpy.h"

#include <string.h>

#include "../core/rb_config.h"

int rbpy_as_bool(PyObject *v, const char *name, int *out)
{
    /* True/False, or the ints 0 and 1 (what C callers and LMCache's tests pass); a string such
     * as "false" is refused rather than taken as true. */
    long b = -1;
    if (PyBool_Check(v))
        b = v == Py_True;
    else if (PyLong_Check(v)) {
        b = PyLong_AsLong(v);
        if (b == -1 && PyErr_Occurred())
            PyErr_Clear();
    }
    if (b != 0 && b != 1) {
        PyErr_Format(PyExc_TypeError, "%s must be a bool, got %.80s %.200R", name, Py_TYPE(v)->tp_name, v);
        return -1;
    }
    *out = (int)b;
    return 0;
}

static int set_err(const rb_err *err)
{
    rbpy_raise_err(err);
    return -1;
}

/* An int for an RB_SET_UINT setting (None is 0 where the setting says so): a ValueError names
 * the setting, the value and the range. */
static int set_uint_from(rb_core_cfg *cfg, const rb_setting *s, PyObject *v)
{
    uint64_t u = 0;
    if ((s->flags & RB_SET_AUTO) && PyUnicode_Check(v) && PyUnicode_CompareWithASCIIString(v, "auto") == 0)
        u = UINT64_MAX; /* resolved by the core at open */
    else if (!(v == Py_None && (s->flags & RB_SET_NONE_IS_ZERO)) &&
             rbpy_bounded_u64(v, s->name, s->min, s->max, &u) < 0)
        return -1;
    rb_err err;
    rb_err_clear(&err);
    return rb_setting_set_uint(cfg, s, u, &err) < 0 ? set_err(&err) : 0;
}

/* A path: str, bytes or os.PathLike, converted into *path_out (a new bytes object the caller
 * keeps alive while cfg is used). */
static int set_path_from(rb_core_cfg *cfg, const rb_setting *s, PyObject *v, PyObject **path_out, rb_err *err)
{
    PyObject *b = NULL;
    if (!PyUnicode_Check(v) && !PyBytes_Check(v) && !PyObject_HasAttrString(v, "__fspath__")) {
        PyErr_Format(PyExc_TypeError, "%s must be a path (str, bytes or os.PathLike), got %.80s %.200R", s->name,
                     Py_TYPE(v)->tp_name, v);
        return -1;
    }
    if (!PyUnicode_FSConverter(v, &b))
        return -1;
    Py_XSETREF(*path_out, b);
    if (rb_setting_set_text(cfg, s, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b), err) < 0)
        return set_err(err);
    return 0;
}

/* A choice: the str naming it. */
static int set_choice_from(rb_core_cfg *cfg, const rb_setting *s, PyObject *v, rb_err *err)
{
    if (!PyUnicode_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str, got %.80s %.200R", s->name, Py_TYPE(v)->tp_name, v);
        return -1;
    }
    Py_ssize_t n;
    const char *t = PyUnicode_AsUTF8AndSize(v, &n);
    if (!t)
        return -1;
    return rb_setting_set_text(cfg, s, t, (size_t)n, err) < 0 ? set_err(err) : 0;
}

/* The checkpoint magic: bytes or a bytearray. */
static int set_magic_from(rb_core_cfg *cfg, const rb_setting *s, PyObject *v, rb_err *err)
{
    if (!PyBytes_Check(v) && !PyByteArray_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be bytes, got %.80s %.200R", s->name, Py_TYPE(v)->tp_name, v);
        return -1;
    }
    const char *t = PyBytes_Check(v) ? PyBytes_AS_STRING(v) : PyByteArray_AS_STRING(v);
    Py_ssize_t n = PyBytes_Check(v) ? PyBytes_GET_SIZE(v) : PyByteArray_GET_SIZE(v);
    return rb_setting_set_text(cfg, s, t, (size_t)n, err) < 0 ? set_err(err) : 0;
}

/* One keyword's value into cfg, by the setting's type. A path is converted into *path_out (a
 * new bytes object the caller keeps alive while cfg is used). */
static int set_from(rb_core_cfg *cfg, const rb_setting *s, PyObject *v, PyObject **path_out)
{
    rb_err err;
    rb_err_clear(&err);
    int b;
    switch (s->type) {
    case RB_SET_PATH:
        return set_path_from(cfg, s, v, path_out, &err);
    case RB_SET_UINT:
        return set_uint_from(cfg, s, v);
    case RB_SET_BOOL:
        if (rbpy_as_bool(v, s->name, &b) < 0)
            return -1;
        return rb_setting_set_uint(cfg, s, (uint64_t)b, &err) < 0 ? set_err(&err) : 0;
    case RB_SET_CHOICE:
        return set_choice_from(cfg, s, v, &err);
    case RB_SET_MAGIC:
        return set_magic_from(cfg, s, v, &err);
    default:
        PyErr_Format(PyExc_SystemError, "setting %s has an unknown type", s->name);
        return -1;
    }
}

int rbpy_core_cfg_from_kwargs(const char *fname, PyObject *args, PyObject *kwds, rb_core_cfg *cfg, PyObject **path_out)
{
    *path_out = NULL;
    if (args && PyTuple_GET_SIZE(args) > 0) {
        PyErr_Format(PyExc_TypeError, "%s() takes keyword arguments only (%zd positional given)", fname,
                     PyTuple_GET_SIZE(args));
        return -1;
    }
    rb_core_cfg_init(cfg);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (kwds && PyDict_Next(kwds, &pos, &key, &value)) {
        const char *name = PyUnicode_AsUTF8(key);
        if (!name)
            return -1;
        const rb_setting *s = rb_core_setting_find(name);
        if (!s) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%s'", fname, name);
            return -1;
        }
        if (set_from(cfg, s, value, path_out) < 0)
            return -1;
    }
    for (size_t i = 0; i < rb_core_nsettings; i++) {
        const rb_setting *s = &rb_core_settings[i];
        if (s->deflt || (s->flags & (RB_SET_NONE_IS_ZERO | RB_SET_POLICY)))
            continue;
        if (!kwds || !PyDict_GetItemString(kwds, s->name)) {
            PyErr_Format(PyExc_TypeError, "%s() missing required keyword argument: '%s'", fname, s->name);
            return -1;
        }
    }
    return 0;
}

static const char *type_name(int type)
{
    switch (type) {
    case RB_SET_PATH:
        return "path";
    case RB_SET_UINT:
        return "int";
    case RB_SET_BOOL:
        return "bool";
    case RB_SET_CHOICE:
        return "choice";
    case RB_SET_ID_LIST:
        return "id_list";
    default:
        return "bytes";
    }
}

/* The default of s as a Python value (None when it has none). */
static PyObject *default_of(const rb_setting *s, const rb_core_cfg *defaults)
{
    if (!s->deflt)
        Py_RETURN_NONE;
    if (s->flags & RB_SET_POLICY) {
        /* No member to read the parsed default from: a policy default is a word. */
        if (s->type == RB_SET_BOOL)
            return PyBool_FromLong(strcmp(s->deflt, "true") == 0);
        return PyUnicode_FromString(s->deflt);
    }
    switch (s->type) {
    case RB_SET_UINT:
        return PyLong_FromUnsignedLongLong(rb_setting_get_uint(defaults, s));
    case RB_SET_BOOL:
        return PyBool_FromLong((long)rb_setting_get_uint(defaults, s));
    case RB_SET_MAGIC:
        return PyBytes_FromString(s->deflt);
    default:
        return PyUnicode_FromString(s->deflt);
    }
}

/* The choices of s as a tuple of str, or None when it has none. */
static PyObject *choices_of(const rb_setting *s)
{
    if (!s->choices)
        Py_RETURN_NONE;
    Py_ssize_t n = 0;
    while (s->choices[n])
        n++;
    PyObject *choices = PyTuple_New(n);
    for (Py_ssize_t i = 0; choices && i < n; i++) {
        PyObject *c = PyUnicode_FromString(s->choices[i]);
        if (!c)
            Py_CLEAR(choices);
        else
            PyTuple_SET_ITEM(choices, i, c);
    }
    return choices;
}

/* The flags a settings() dict shows, as bools, in its key order. */
static const struct {
    const char *key;
    unsigned bit;
} setting_flags[] = {
    {"lmcache", RB_SET_LMCACHE},
    {"required", RB_SET_REQUIRED},
    {"config", RB_SET_CONFIG},
    {"plugin", RB_SET_PLUGIN},
    {"nonpositive_is_zero", RB_SET_NONPOSITIVE_IS_ZERO},
    {"clamp_to_min", RB_SET_CLAMP_TO_MIN},
    {"power_of_two", RB_SET_POWER_OF_TWO},
    {"none_is_zero", RB_SET_NONE_IS_ZERO},
    {"policy", RB_SET_POLICY},
    {"lmcache_mp", RB_SET_LMCACHE_MP},
    {"auto", RB_SET_AUTO},
};

/* One entry of settings(): name, type, min, max, default, choices, the flags, help. */
static PyObject *setting_dict(const rb_setting *s, const rb_core_cfg *defaults)
{
    PyObject *deflt = default_of(s, defaults);
    PyObject *choices = deflt ? choices_of(s) : NULL;
    PyObject *d = choices ? Py_BuildValue("{s:s,s:s,s:K,s:K,s:O,s:O}", "name", s->name, "type", type_name(s->type),
                                          "min", (unsigned long long)s->min, "max", (unsigned long long)s->max,
                                          "default", deflt, "choices", choices)
                          : NULL;
    Py_XDECREF(deflt);
    Py_XDECREF(choices);
    for (size_t i = 0; d && i < sizeof(setting_flags) / sizeof(setting_flags[0]); i++)
        if (PyDict_SetItemString(d, setting_flags[i].key, (s->flags & setting_flags[i].bit) ? Py_True : Py_False) < 0)
            Py_CLEAR(d);
    PyObject *help = !d ? NULL : s->help ? PyUnicode_FromString(s->help) : Py_NewRef(Py_None);
    if (d && (!help || PyDict_SetItemString(d, "help", help) < 0))
        Py_CLEAR(d);
    Py_XDECREF(help);
    return d;
}

PyObject *rbpy_settings(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    rb_core_cfg defaults;
    rb_core_cfg_init(&defaults);
    PyObject *out = PyTuple_New((Py_ssize_t)rb_core_nsettings);
    for (size_t i = 0; out && i < rb_core_nsettings; i++) {
        PyObject *d = setting_dict(&rb_core_settings[i], &defaults);
        if (!d)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, (Py_ssize_t)i, d);
    }
    return out;
}

/* container_bytes(meta_total_bytes, block_align) -> int: bytes of one checkpoint copy. */
PyObject *rbpy_container_bytes(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    uint64_t mt, ba;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "container_bytes() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (rbpy_as_u64(args[0], "meta_total_bytes", &mt) < 0 || rbpy_as_u64(args[1], "block_align", &ba) < 0)
        return NULL;
    if (ba == 0) {
        PyErr_SetString(PyExc_ValueError, "block_align must be a power of two > 0, got 0");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(rb_container_bytes(mt, ba));
}
