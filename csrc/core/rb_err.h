/*
 * rb_err.h - the error record every core function fills on failure.
 *
 * Core functions return 0 on success or a negative errno, and describe the failure in an
 * rb_err: what kind of Python exception the binding should raise, the errno (for OSError),
 * and the message text. The binding turns an rb_err into an exception in exactly one place
 * (rbpy_raise_err in csrc/py/module.c); nothing in the core knows about Python.
 */
#ifndef RB_ERR_H
#define RB_ERR_H

#include <stddef.h>

enum rb_err_kind {
    RB_ERR_NONE = 0,
    RB_ERR_OS,      /* OSError(errnum, msg): mapped by CPython to the errno subclass */
    RB_ERR_VALUE,   /* ValueError(msg): bad argument */
    RB_ERR_RUNTIME, /* RuntimeError(msg): state errors, EOF, worker stopped */
    RB_ERR_NOMEM,   /* MemoryError */
};

typedef struct rb_err {
    int kind;   /* enum rb_err_kind */
    int errnum; /* positive errno for RB_ERR_OS (and informative otherwise), 0 if none */
    char msg[256];
} rb_err;

/* Fill *err (which may be NULL) and return -errnum, or -EINVAL when errnum is 0. */
int rb_err_set(rb_err *err, int kind, int errnum, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static inline void rb_err_clear(rb_err *err)
{
    if (err) {
        err->kind = RB_ERR_NONE;
        err->errnum = 0;
        err->msg[0] = '\0';
    }
}

#endif /* RB_ERR_H */
