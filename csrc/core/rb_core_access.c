/*
 * rb_core_access.c - read accessors of struct rb_core for callers outside the core (the
 * CPython binding), so that rb_core_int.h stays the core's own header.
 */
#include "rb_core_int.h"

/* The device the core opened (rb_core_open), valid until rb_core_free. */
struct rb_dev *rb_core_device(rb_core *c)
{
    return c ? c->dev : NULL;
}

struct rb_obs *rb_core_obs(rb_core *c)
{
    return c ? &c->obs : NULL;
}
