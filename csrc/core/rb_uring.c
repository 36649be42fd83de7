/* rb_uring.c - placeholder until the io_uring engine lands. */
#include "rb_uring.h"

#include <errno.h>

int rb_uring_create(struct rb_dev *dev, unsigned depth, struct rb_uring **out, rb_err *err)
{
    (void)dev;
    (void)depth;
    (void)out;
    return rb_err_set(err, RB_ERR_RUNTIME, ENOSYS, "io_uring init failed: engine not supported in this build");
}

void rb_uring_destroy(struct rb_uring *u)
{
    (void)u;
}
