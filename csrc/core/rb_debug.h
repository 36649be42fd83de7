/*
 * rb_debug.h - invariants checked in debug builds: the core's lock order and the slot state
 * machine (rb_slots.h). Compiled in with RB_DEBUG_INVARIANTS, which the sanitizer build
 * (RB_SANITIZE=1) and RB_DEBUG=1 define (setup.py); a release build has none of it. A broken
 * invariant prints what broke, where, and aborts.
 *
 * Lock order: every file that includes rb_core_int.h takes and releases its mutexes through
 * the wrappers below (the pthread names are macros for them there). A mutex given a rank with
 * rb_lk_rank (rb_core.c, at open) is recorded per thread while held; taking one whose rank is
 * not above every ranked lock the thread holds is a violation. Trylock records without
 * checking (it cannot wait); a condition wait keeps its mutex recorded (it holds it again
 * before returning). Destroying a mutex forgets its rank.
 */
#ifndef RB_DEBUG_H
#define RB_DEBUG_H

#include <pthread.h>

/* Ranks in lock order (rb_core_int.h, struct rb_core); fault_mu is a leaf. */
enum {
    RB_LK_NONE = 0,
    RB_LK_RECLAIM, /* reclaim_mu: rb_core_reclaim */
    RB_LK_CMP,     /* ml.cmp_mu: the log format's compaction */
    RB_LK_CKPT,    /* ckpt_mu: the checkpoint writer */
    RB_LK_DL,      /* dl_mu: a deallocation run */
    RB_LK_MU,      /* mu: the core mutex */
    RB_LK_THR,     /* thr_mu: the periodic thread */
    RB_LK_FAULT,   /* fault_mu: the fault journal */
};

#ifdef RB_DEBUG_INVARIANTS
void rb_lk_rank(pthread_mutex_t *m, int rank);
int rb_lk_lock(pthread_mutex_t *m, const char *file, int line);
int rb_lk_trylock(pthread_mutex_t *m);
int rb_lk_unlock(pthread_mutex_t *m);
int rb_lk_destroy(pthread_mutex_t *m);
/* Debug builds: a violated invariant. Prints "rb invariant: <what>" with file and line, aborts. */
void rb_invariant_failed(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#ifndef RB_DEBUG_IMPL
#define pthread_mutex_lock(m) rb_lk_lock((m), __FILE__, __LINE__)
#define pthread_mutex_trylock(m) rb_lk_trylock(m)
#define pthread_mutex_unlock(m) rb_lk_unlock(m)
#define pthread_mutex_destroy(m) rb_lk_destroy(m)
#endif
#else
static inline void rb_lk_rank(pthread_mutex_t *m, int rank)
{
    (void)m;
    (void)rank;
}
#endif

#endif /* RB_DEBUG_H */
