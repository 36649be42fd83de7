/*
 * rb_uring.h - the io_uring engine of a device: one ring, one worker thread.
 * (Placeholder contract; the engine itself lands with the io_uring issue.)
 */
#ifndef RB_URING_H
#define RB_URING_H

#include "rb_err.h"

struct rb_dev;
struct rb_uring;

/* Create the ring (depth entries) and start the worker for dev->fd. */
int rb_uring_create(struct rb_dev *dev, unsigned depth, struct rb_uring **out, rb_err *err);

/* Stop admission, finish or cancel in-flight requests, join the worker, free. */
void rb_uring_destroy(struct rb_uring *u);

#endif /* RB_URING_H */
