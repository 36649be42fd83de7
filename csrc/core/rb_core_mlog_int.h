/*
 * rb_core_mlog_int.h - what the log format's writer (rb_core_mlog.c) and its recovery
 * (rb_core_mlog_rec.c) share inside the core: the generation's class ids and a growable
 * uint32_t table.
 */
#ifndef RB_CORE_MLOG_INT_H
#define RB_CORE_MLOG_INT_H

#include "rb_core_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* cls_disk[k]: class k's id in this generation (stable once given), and ML_CLS_LOGGED while
 * the base or a live group defines it (a CLASS record since the base began, or its table). */
#define ML_CLS_LOGGED 0x80000000u
#define ML_CLS_ID(v) ((v) & ~ML_CLS_LOGGED)

/* Make v[i] exist: grow *v (capacity *cap, doubling from `first`) and fill the new elements
 * with the byte `fill`. 0, or -ENOMEM with *v unchanged. */
static inline int ml_u32_room(uint32_t **v, uint32_t *cap, uint32_t i, uint32_t first, int fill)
{
    if (i < *cap)
        return 0;
    uint32_t nc = *cap ? *cap : first;
    while (nc <= i)
        nc = nc > UINT32_MAX / 2 ? i + 1 : nc * 2;
    uint32_t *np = realloc(*v, (size_t)nc * sizeof(*np));
    if (!np)
        return -ENOMEM;
    memset(np + *cap, fill, (size_t)(nc - *cap) * sizeof(*np));
    *v = np;
    *cap = nc;
    return 0;
}

#endif /* RB_CORE_MLOG_INT_H */
