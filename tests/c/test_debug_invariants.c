/*
 * test_debug_invariants.c - the checks of debug builds (RB_DEBUG_INVARIANTS, csrc/core/rb_debug.h)
 * fire: each broken invariant, run in a child process, must end it with SIGABRT, and the legal
 * moves next to it must not. Slot states: a double release, a release of an indexed slot, a
 * commit of a slot no put reserved. Lock order: mu then ckpt_mu, a leaf then mu, the same rank
 * twice, reclaim_mu under mu, each report naming the two locks; and the orders rb_core_int.h
 * documents run clean.
 * Build/run: `make test-c`; exit 0 = pass.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rb_debug.h"
#include "rb_slots.h"
#include "check.h"

#ifndef RB_DEBUG_INVARIANTS
#error "build with -DRB_DEBUG_INVARIANTS"
#endif

/* Run fn in a child; its end: 0 clean exit, else the signal that ended it (or -1). */
static int run_child(void (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* the child's report is expected: keep it out of the test's output */
        if (!freopen("/dev/null", "w", stderr))
            _exit(3);
        fn();
        _exit(0);
    }
    int st;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    if (WIFEXITED(st))
        return WEXITSTATUS(st) == 0 ? 0 : -1;
    return WIFSIGNALED(st) ? WTERMSIG(st) : -1;
}

/* run_child, the child's report kept in out (cap bytes, NUL-terminated) */
static int run_child_report(void (*fn)(void), char *out, size_t cap)
{
    char path[] = "/tmp/rb_invariant_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (dup2(fd, 2) < 0)
            _exit(3);
        fn();
        _exit(0);
    }
    int st;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    ssize_t n = pread(fd, out, cap - 1, 0);
    out[n > 0 ? n : 0] = 0;
    close(fd);
    if (WIFEXITED(st))
        return WEXITSTATUS(st) == 0 ? 0 : -1;
    return WIFSIGNALED(st) ? WTERMSIG(st) : -1;
}

/* fn breaks the lock order: the child aborts with a report saying want */
static void check_order_report(void (*fn)(void), const char *want)
{
    char rep[4096];
    int end = run_child_report(fn, rep, sizeof rep);
    if (end != SIGABRT || !strstr(rep, want)) {
        fprintf(stderr, "want SIGABRT and \"%s\", got end %d and: %s\n", want, end, rep);
        CHECK(0);
    }
}

static rb_slots sl;

static uint32_t fresh(void)
{
    CHECK(rb_slots_init(&sl, 8, 0) == 0);
    return rb_slots_alloc(&sl, 0);
}

static void slot_lifecycle(void) /* FREE -> RESERVED -> LIVE -> FREEING -> FREE, twice */
{
    for (int i = 0; i < 2; i++) {
        uint32_t x = i ? rb_slots_alloc(&sl, 0) : fresh();
        rb_slots_move(&sl, x, RB_SLOT_IN(RB_SLOT_RESERVED), RB_SLOT_LIVE, "commit");
        rb_slots_move(&sl, x, RB_SLOT_IN(RB_SLOT_LIVE), RB_SLOT_FREEING, "free");
        rb_slots_release(&sl, x);
    }
    uint32_t y = rb_slots_alloc(&sl, 0);
    rb_slots_release(&sl, y); /* a failed put gives its slot back */
    CHECK(rb_slots_reset(&sl, 4) == 0);
    rb_slots_release(&sl, 2); /* recovery frees what its state does not list */
}

static void double_release(void)
{
    uint32_t x = fresh();
    rb_slots_release(&sl, x);
    rb_slots_release(&sl, x);
}

static void release_live(void)
{
    uint32_t x = fresh();
    rb_slots_move(&sl, x, RB_SLOT_IN(RB_SLOT_RESERVED), RB_SLOT_LIVE, "commit");
    rb_slots_release(&sl, x);
}

static void commit_unreserved(void)
{
    uint32_t x = fresh();
    rb_slots_release(&sl, x);
    rb_slots_move(&sl, x, RB_SLOT_IN(RB_SLOT_RESERVED), RB_SLOT_LIVE, "commit");
}

static pthread_mutex_t reclaim = PTHREAD_MUTEX_INITIALIZER, cmp = PTHREAD_MUTEX_INITIALIZER,
                       ckpt = PTHREAD_MUTEX_INITIALIZER, dl = PTHREAD_MUTEX_INITIALIZER, mu = PTHREAD_MUTEX_INITIALIZER,
                       thr = PTHREAD_MUTEX_INITIALIZER, fault = PTHREAD_MUTEX_INITIALIZER,
                       mu2 = PTHREAD_MUTEX_INITIALIZER;

static void rank_all(void)
{
    rb_lk_rank(&reclaim, RB_LK_RECLAIM);
    rb_lk_rank(&cmp, RB_LK_CMP);
    rb_lk_rank(&ckpt, RB_LK_CKPT);
    rb_lk_rank(&dl, RB_LK_DL);
    rb_lk_rank(&mu, RB_LK_MU);
    rb_lk_rank(&thr, RB_LK_THR);
    rb_lk_rank(&fault, RB_LK_FAULT);
    rb_lk_rank(&mu2, RB_LK_MU);
}

static void documented_order(void)
{
    rank_all();
    pthread_mutex_t *order[] = {&reclaim, &cmp, &ckpt, &dl, &mu, &thr, &fault};
    for (int i = 0; i < 7; i++)
        CHECK(rb_lk_lock(order[i], __FILE__, __LINE__) == 0);
    for (int i = 0; i < 7; i++) /* released in any order */
        CHECK(rb_lk_unlock(order[i]) == 0);
    CHECK(rb_lk_lock(&mu, __FILE__, __LINE__) == 0); /* a leaf under mu, then mu alone again */
    CHECK(rb_lk_lock(&fault, __FILE__, __LINE__) == 0);
    CHECK(rb_lk_unlock(&fault) == 0 && rb_lk_unlock(&mu) == 0);
    CHECK(rb_lk_lock(&ckpt, __FILE__, __LINE__) == 0 && rb_lk_unlock(&ckpt) == 0);
    CHECK(rb_lk_destroy(&mu2) == 0); /* forgotten: no rank any more */
}

static void mu_then_ckpt(void)
{
    rank_all();
    rb_lk_lock(&mu, __FILE__, __LINE__);
    rb_lk_lock(&ckpt, __FILE__, __LINE__);
}

static void leaf_then_mu(void)
{
    rank_all();
    rb_lk_lock(&fault, __FILE__, __LINE__);
    rb_lk_lock(&mu, __FILE__, __LINE__);
}

static void mu_then_reclaim(void)
{
    rank_all();
    rb_lk_lock(&mu, __FILE__, __LINE__);
    rb_lk_lock(&reclaim, __FILE__, __LINE__);
}

static void same_rank_twice(void)
{
    rank_all();
    rb_lk_lock(&mu, __FILE__, __LINE__);
    rb_lk_lock(&mu2, __FILE__, __LINE__);
}

int main(void)
{
    CHECK(run_child(slot_lifecycle) == 0);
    CHECK(run_child(double_release) == SIGABRT);
    CHECK(run_child(release_live) == SIGABRT);
    CHECK(run_child(commit_unreserved) == SIGABRT);
    CHECK(run_child(documented_order) == 0);
    check_order_report(mu_then_ckpt, "lock order: ckpt_mu taken while holding mu ");
    check_order_report(leaf_then_mu, "lock order: mu taken while holding fault_mu ");
    check_order_report(mu_then_reclaim, "lock order: reclaim_mu taken while holding mu ");
    check_order_report(same_rank_twice, "lock order: mu taken while holding mu ");
    printf("test_debug_invariants: ok\n");
    return 0;
}
