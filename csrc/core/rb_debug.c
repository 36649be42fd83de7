/*
 * rb_debug.c - the lock-order record of debug builds (see rb_debug.h). Without
 * RB_DEBUG_INVARIANTS this file compiles to nothing.
 */
#define RB_DEBUG_IMPL
#include "rb_debug.h"

#ifdef RB_DEBUG_INVARIANTS

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void rb_invariant_failed(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rb invariant: %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

/* Ranked mutexes: an open-addressed table keyed by address (tombstones reused; rebuilt when
 * they pile up). Guarded by its own (unranked) mutex. */
#define RANKS_CAP 8192u
#define TOMB ((pthread_mutex_t *)1)
static struct {
    pthread_mutex_t *m;
    int rank;
} ranks[RANKS_CAP];
static unsigned n_tomb;
static pthread_mutex_t ranks_mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned slot_of(const pthread_mutex_t *m)
{
    uint64_t h = (uint64_t)(uintptr_t)m * 0x9e3779b97f4a7c15ull;
    return (unsigned)(h >> 51) & (RANKS_CAP - 1);
}

/* The entry of m, or with add, where to put it. -1 when absent (and, with add, full). */
static int find_locked(const pthread_mutex_t *m, int add)
{
    int tomb = -1;
    for (unsigned i = 0, j = slot_of(m); i < RANKS_CAP; i++, j = (j + 1) & (RANKS_CAP - 1)) {
        if (ranks[j].m == m)
            return (int)j;
        if (ranks[j].m == TOMB && tomb < 0)
            tomb = (int)j;
        if (!ranks[j].m)
            return add ? (tomb >= 0 ? tomb : (int)j) : -1;
    }
    return add ? tomb : -1;
}

static void rebuild_locked(void)
{
    for (unsigned j = 0; j < RANKS_CAP; j++)
        if (ranks[j].m == TOMB)
            ranks[j].m = NULL;
    n_tomb = 0;
    /* Re-place every entry that an emptied tombstone may now hide from its probe. */
    for (unsigned j = 0; j < RANKS_CAP; j++) {
        pthread_mutex_t *m = ranks[j].m;
        if (!m)
            continue;
        int r = ranks[j].rank;
        ranks[j].m = NULL;
        int k = find_locked(m, 1);
        ranks[k].m = m;
        ranks[k].rank = r;
    }
}

void rb_lk_rank(pthread_mutex_t *m, int rank)
{
    pthread_mutex_lock(&ranks_mu);
    int j = find_locked(m, 1);
    if (j < 0)
        rb_invariant_failed(__FILE__, __LINE__, "more than %u ranked mutexes", RANKS_CAP);
    if (ranks[j].m == TOMB)
        n_tomb--;
    ranks[j].m = m;
    ranks[j].rank = rank;
    pthread_mutex_unlock(&ranks_mu);
}

static int rank_of(const pthread_mutex_t *m)
{
    pthread_mutex_lock(&ranks_mu);
    int j = find_locked(m, 0);
    int r = j < 0 ? RB_LK_NONE : ranks[j].rank;
    pthread_mutex_unlock(&ranks_mu);
    return r;
}

/* What this thread holds of the ranked mutexes, in the order it took them. */
#define HELD_MAX 16
static _Thread_local struct {
    const pthread_mutex_t *m;
    int rank;
    const char *file;
    int line;
} held[HELD_MAX];
static _Thread_local int n_held;

static const char *rank_name(int r)
{
    static const char *const names[] = {"?", "reclaim_mu", "ml.cmp_mu", "ckpt_mu", "dl_mu", "mu", "thr_mu", "fault_mu"};
    _Static_assert(sizeof(names) / sizeof(names[0]) == RB_LK_FAULT + 1, "a name for each rank (rb_debug.h)");
    return r > 0 && r <= RB_LK_FAULT ? names[r] : "?";
}

static void push(const pthread_mutex_t *m, int rank, const char *file, int line)
{
    if (n_held == HELD_MAX)
        rb_invariant_failed(file, line, "a thread holds more than %d core locks", HELD_MAX);
    held[n_held].m = m;
    held[n_held].rank = rank;
    held[n_held].file = file;
    held[n_held].line = line;
    n_held++;
}

int rb_lk_lock(pthread_mutex_t *m, const char *file, int line)
{
    int rank = rank_of(m);
    for (int i = 0; rank && i < n_held; i++) {
        if (held[i].rank >= rank)
            rb_invariant_failed(file, line, "lock order: %s taken while holding %s (taken at %s:%d)", rank_name(rank),
                                rank_name(held[i].rank), held[i].file, held[i].line);
    }
    int rc = pthread_mutex_lock(m);
    if (rc == 0 && rank)
        push(m, rank, file, line);
    return rc;
}

int rb_lk_trylock(pthread_mutex_t *m)
{
    int rc = pthread_mutex_trylock(m);
    int rank = rc == 0 ? rank_of(m) : RB_LK_NONE;
    if (rank)
        push(m, rank, "(trylock)", 0);
    return rc;
}

int rb_lk_unlock(pthread_mutex_t *m)
{
    for (int i = n_held - 1; i >= 0; i--) {
        if (held[i].m == m) {
            for (int k = i; k + 1 < n_held; k++)
                held[k] = held[k + 1];
            n_held--;
            break;
        }
    }
    return pthread_mutex_unlock(m);
}

int rb_lk_destroy(pthread_mutex_t *m)
{
    pthread_mutex_lock(&ranks_mu);
    int j = find_locked(m, 0);
    if (j >= 0) {
        ranks[j].m = TOMB;
        if (++n_tomb > RANKS_CAP / 4)
            rebuild_locked();
    }
    pthread_mutex_unlock(&ranks_mu);
    return pthread_mutex_destroy(m);
}

#else
typedef int rb_debug_unused; /* ISO C wants a translation unit to declare something */
#endif
