/*
 * rb_hist.c - the names of the core's histograms and miss reasons (rb_hist.h).
 */
#include "rb_hist.h"

const char *const rb_hist_names[RB_H_COUNT] = {
#define RB_HIST_NAME(id, name) name,
    RB_HIST_IDS(RB_HIST_NAME)
#undef RB_HIST_NAME
};

const char *const rb_miss_names[RB_MISS_COUNT] = {
#define RB_MISS_NAME(id, name) name,
    RB_MISS_IDS(RB_MISS_NAME)
#undef RB_MISS_NAME
};
