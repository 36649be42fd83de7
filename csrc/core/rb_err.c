/* rb_err.c - filling rb_err records (see rb_err.h). */
#include "rb_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

int rb_err_set(rb_err *err, int kind, int errnum, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->kind = kind;
        err->errnum = errnum;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return errnum > 0 ? -errnum : -EINVAL;
}
