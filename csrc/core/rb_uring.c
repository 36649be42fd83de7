/*
 * rb_uring.c - the io_uring engine: worker thread, submission queue and scheduler, batches,
 * fixed buffers.
 * Contract, lifetimes and lock order: rb_uring.h.
 *
 * The worker owns the ring outright (it creates it, is its only submitter and reaper, and
 * tears it down), so the ring can be SINGLE_ISSUER + DEFER_TASKRUN where the kernel allows.
 * It sleeps only inside io_uring_enter(GETEVENTS): producers wake it through an eventfd that
 * a multishot POLL_ADD on the ring watches, so new work and I/O completions arrive as CQEs
 * in one place. Each round the worker takes every queued request into its lanes (loads and
 * stores under loads_first; one lane under fifo) and sends attempts from them, resubmissions
 * first, within the ring's depth (attempts, not requests) and the lanes' byte budgets; what does
 * not fit waits in its lane (counted as queue-full events, or budget waits).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "rb_uring.h"
#include "rb_hist.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>
#include <linux/nvme_ioctl.h>

#include "rb_device_int.h"
#include "rb_stats.h"
#include "rb_wlog.h"

/* The write_stream byte of Linux >= 6.16 shares the slot of splice_fd_in / file_index. */
_Static_assert(offsetof(struct io_uring_sqe, splice_fd_in) == 44, "write_stream is SQE byte 44");

#define POLL_TAG ((uint64_t)1)        /* user_data of the eventfd poll; requests use pointers */
#define MAX_ATTEMPT ((size_t)1 << 30) /* one SQE moves at most 1 GiB (sqe->len is 32 bits) */
#define MAX_FIXED 65536u
#define MAX_FIXED_SIZE ((uint64_t)1 << 30)

struct fixed_region {
    uintptr_t start, end;
    unsigned idx;
};

/* A request to the worker to do something with the ring on the caller's behalf. */
struct rb_ctl {
    const struct iovec *iov;
    unsigned n;
    struct fixed_region *regions; /* sorted; ownership passes to the worker on success */
    int rc;
    _Atomic int done;
};

/* One SQE's worth of a request (worker only): a piece of it in the kernel, or waiting to be
 * sent again (a short transfer's remainder). A request has at most one attempt at a time under
 * the fifo scheduler, any number under loads_first. */
typedef struct rb_att {
    struct rb_att *next;          /* free list / retry list */
    struct rb_att *kprev, *knext; /* accepted by the kernel, completion not reaped yet */
    rb_req *req;
    uint64_t off;   /* device offset */
    uint8_t *buf;   /* memory */
    size_t len;     /* bytes of the attempt (what is left of it after a short transfer) */
    size_t counted; /* of them, bytes counted in the lane's bytes in flight */
    uint8_t fixed;  /* sent with a registered (fixed) buffer */
    uint8_t in_kern;
} rb_att;

struct rb_uring {
    struct rb_dev *dev;
    int fd;
    unsigned depth;
    /* NVMe passthrough (copied from the device at create; read-only afterwards). */
    int nvme;
    uint32_t nsid, lba_shift, lba_size;
    size_t max_xfer;
    int nvme_no_fixed; /* worker: the kernel refused a fixed-buffer NVMe command (EINVAL) */
    int streams;       /* the device places writes through write streams (rb_dev_write_streams) */
    int efd;
    pthread_t thread;
    /* Scheduler (rb_sched_cfg, defaults filled in; read-only after create). fifo: caps and
     * pieces 0 (none), one lane, one attempt per request at a time. */
    int sched;
    size_t rd_cap, wr_cap;     /* bytes in flight per lane */
    size_t rd_piece, wr_piece; /* bytes per attempt */
    unsigned wr_slots;         /* ring entries writes may hold */

    /* start-up handshake: 0 pending, 1 ok, -1 failed (init_err says why) */
    _Atomic uint32_t init_state;
    rb_err init_err;

    /* q_mu protects: */
    pthread_mutex_t q_mu;
    rb_req *qhead, *qtail;
    size_t qcount;
    int stopping;
    struct rb_ctl *ctl;

    _Atomic int stopped;       /* mirror of stopping for lock-free checks */
    _Atomic uint32_t done_gen; /* futex: bumped after completions that finished a batch/ctl */
    _Atomic int waiters;
    _Atomic int hold;              /* test hook: leave new requests queued */
    _Atomic int64_t fail_write_in; /* test hook: the n-th write attempt to complete reports EIO */

    pthread_mutex_t reg_mu;
    _Atomic int fixed_registered;
    _Atomic uint64_t fixed_bytes;

    pthread_mutex_t err_mu;
    char fatal[256];
    _Atomic int has_fatal;

    /* Test hook: attempt completions recorded (tr_mu, a leaf lock, guards the array). */
    pthread_mutex_t tr_mu;
    _Atomic int tr_on;
    rb_trace_ent *tr;
    size_t tr_cap, tr_n;

    /* Worker-private from here on. */
    struct io_uring ring;
    int poll_armed;
    int no_submit;     /* fatal submit error: only reap from now on */
    unsigned inflight; /* attempts with an SQE prepared and no CQE yet */
    rb_att **sq_fifo;  /* prepared, not yet accepted by the kernel (for stats) */
    unsigned sq_cap, sq_head, sq_count;
    rb_att *atts, *att_free;             /* the attempts (depth + 1), and the unused ones */
    rb_att *retry_head, *retry_tail;     /* remainders of short transfers, next attempts: sent first */
    rb_att *kern;                        /* accepted by the kernel, CQE not reaped (kprev/knext list) */
    rb_req *lane_head[2], *lane_tail[2]; /* taken from the queue, not wholly sent: [op] (fifo: [0]) */
    size_t bytes_in[2];                  /* [op]: bytes of attempts in flight */
    unsigned att_in[2];                  /* [op]: attempts with an SQE prepared and no CQE yet */
    _Atomic int fault;                   /* RB_URING_FAULT_* test hooks, consumed by the worker */
    struct fixed_region *regions;
    unsigned nregions;
    int batch_finished; /* this round finished a batch or a ctl: wake waiters */
};

/* ------------------------------------------------------------------ small helpers */

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void wake_worker(struct rb_uring *u)
{
    uint64_t one = 1;
    ssize_t r;
    do {
        r = write(u->efd, &one, sizeof(one));
    } while (r < 0 && errno == EINTR);
    /* EAGAIN means the counter is saturated: the worker is being woken anyway. */
}

/* Publish "something finished" to waiters (worker side). */
static void publish_done(struct rb_uring *u)
{
    atomic_fetch_add(&u->done_gen, 1);
    if (atomic_load(&u->waiters) > 0)
        futex_wake_all(&u->done_gen);
}

static int is_aligned_ptr(const void *p, size_t a)
{
    return a == 0 || ((uintptr_t)p % a) == 0;
}

static int all_zero(const uint8_t *p, size_t n)
{
    if (n == 0)
        return 1;
    return p[0] == 0 && memcmp(p, p + 1, n - 1) == 0;
}

static void fmt_os_error(char *buf, size_t len, const char *what, int e)
{
    char tmp[128];
    const char *s = strerror_r(e, tmp, sizeof(tmp)); /* GNU variant */
    snprintf(buf, len, "%s: %s (os error %d)", what, s, e);
}

/* ------------------------------------------------------------------ batches */

rb_batch *rb_batch_new(uint32_t n, size_t user_bytes)
{
    size_t head = sizeof(rb_batch) + (size_t)n * sizeof(rb_req);
    head = (head + 15) & ~(size_t)15;
    rb_batch *b = calloc(1, head + user_bytes);
    if (!b)
        return NULL;
    b->n = n;
    b->user = user_bytes ? (uint8_t *)b + head : NULL;
    for (uint32_t i = 0; i < n; i++)
        b->reqs[i].batch = b;
    return b;
}

void rb_batch_free(rb_batch *b)
{
    if (!b)
        return;
    free(b->arena);
    free(b);
}

int rb_batch_set(struct rb_uring *u, rb_batch *b, uint32_t i, int op, uint64_t offset, void *buf, size_t buf_len,
                 size_t payload_len, size_t total_len, size_t read_copy_len, rb_err *err)
{
    rb_req *r = &b->reqs[i];
    if (op == RB_REQ_WRITE) {
        if (total_len < payload_len)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "total_len must be >= payload_len");
        if (buf_len < payload_len)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "input buffer too small: cap=%zu need=%zu", buf_len,
                              payload_len);
    }
    if (offset > (uint64_t)INT64_MAX || total_len > (uint64_t)INT64_MAX - offset)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "offset + total_len overflows: offset=%llu total_len=%zu",
                          (unsigned long long)offset, total_len);
    int rc = rb_dev_check_direct(u->dev, offset, total_len, err);
    if (rc < 0)
        return rc;
    /* Writes past the end of the device are refused (a file would grow). Reads keep
     * LMCache's per-entry result: a short read at the end fails that entry alone. */
    if (op == RB_REQ_WRITE && (rc = rb_dev_check_range(u->dev, 1, offset, total_len, err)) < 0)
        return rc;
    r->op = (uint8_t)op;
    r->ubuf = buf;
    r->ubuf_len = buf_len;
    r->payload_len = op == RB_REQ_WRITE ? payload_len : total_len;
    r->total_len = total_len;
    r->offset = offset;
    r->cur_off = offset;
    if (op == RB_REQ_READ)
        r->copy_len = read_copy_len == (size_t)-1 ? (buf_len < total_len ? buf_len : total_len) : read_copy_len;
    return 0;
}

/* r goes through a bounce: its memory is too short for the transfer, unaligned where the device
 * DMAs to it (direct), or (a write) its padding is not already zeros. */
static int req_needs_bounce(const rb_dev *dev, int direct, const rb_req *r)
{
    if (r->total_len == 0)
        return 0;
    if ((direct && !is_aligned_ptr(r->ubuf, dev->alignment)) || r->ubuf_len < r->total_len)
        return 1;
    return r->op == RB_REQ_WRITE && r->total_len > r->payload_len &&
           !all_zero(r->ubuf + r->payload_len, r->total_len - r->payload_len);
}

/* Set up r's first attempt: its bounce (offset + 1 in the arena until now) becomes a pointer
 * and takes a write's payload and zero padding. */
static void req_first_attempt(rb_batch *b, rb_req *r)
{
    if (r->bounce) {
        r->bounce = b->arena + ((uintptr_t)r->bounce - 1);
        if (r->op == RB_REQ_WRITE) {
            memcpy(r->bounce, r->ubuf, r->payload_len);
            memset(r->bounce + r->payload_len, 0, r->total_len - r->payload_len);
        }
        r->cur_buf = r->bounce;
    } else {
        r->cur_buf = r->ubuf;
    }
    r->cur_len = r->total_len;
    r->left = r->total_len;
    r->natt = 0;
    r->fail = r->started = r->in_lane = 0;
    r->status = RB_REQ_PENDING;
}

int rb_batch_prepare(struct rb_uring *u, rb_batch *b, rb_err *err)
{
    const rb_dev *dev = u->dev;
    size_t a = dev->alignment ? dev->alignment : 64;
    size_t arena = 0;
    /* The device DMAs to or from the buffer itself: O_DIRECT, and every passthrough command. */
    const int direct = dev->odirect || u->nvme;
    /* Pass 1: which requests bounce, and where their slice starts (stored as an offset). */
    for (uint32_t i = 0; i < b->n; i++) {
        rb_req *r = &b->reqs[i];
        if (!req_needs_bounce(dev, direct, r)) {
            r->bounce = NULL;
            continue;
        }
        r->bounce = (uint8_t *)(uintptr_t)(arena + 1); /* offset + 1; 0 means "no bounce" */
        size_t slice = (r->total_len + a - 1) / a * a;
        if (slice < r->total_len || arena + slice < arena)
            return rb_err_set(err, RB_ERR_RUNTIME, ENOMEM, "bounce buffer size overflows");
        arena += slice;
    }
    if (arena) {
        b->arena = rb_alloc_aligned(a, arena, err);
        if (!b->arena)
            return -ENOMEM;
        b->arena_len = arena;
    }
    /* Pass 2: fill the bounces, set up the first attempt. */
    for (uint32_t i = 0; i < b->n; i++)
        req_first_attempt(b, &b->reqs[i]);
    return 0;
}

int rb_batch_result(const rb_batch *b, uint32_t i, rb_err *err)
{
    const rb_req *r = &b->reqs[i];
    switch (r->status) {
    case RB_REQ_OK:
        return 0;
    case RB_REQ_EIO:
        return rb_err_set(err, RB_ERR_OS, r->errnum, "io_uring I/O error");
    case RB_REQ_EOF:
        return rb_err_set(err, RB_ERR_RUNTIME, EIO, "Unexpected short I/O: internal error");
    case RB_REQ_SHUTDOWN:
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "io_uring worker shutting down");
    case RB_REQ_REFUSED:
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "io_uring worker stopped");
    case RB_REQ_NOT_SUBMITTED:
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "io_uring worker stopped before submission");
    case RB_REQ_SHORT_SHUTDOWN:
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "io_uring worker shutting down: short I/O during shutdown");
    case RB_REQ_NVME_STATUS:
        return rb_err_set(err, RB_ERR_OS, r->errnum, "io_uring_cmd NVMe error");
    case RB_REQ_LBA_OFFSET:
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "offset must be aligned to LBA size (%d bytes), got offset=%llu",
                          r->errnum, (unsigned long long)r->offset);
    case RB_REQ_LBA_LENGTH:
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "length must be aligned to LBA size (%d bytes), got len=%zu",
                          r->errnum, r->total_len);
    case RB_REQ_ZERO_LENGTH:
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "length must be non-zero");
    default:
        return rb_err_set(err, RB_ERR_RUNTIME, EINVAL, "io_uring request not completed");
    }
}

/* ------------------------------------------------------------------ producer side */

int rb_uring_submit(struct rb_uring *u, rb_batch *b)
{
    uint32_t n = b->n;
    if (n == 0)
        return 0;
    for (uint32_t i = 0; i + 1 < n; i++)
        b->reqs[i].next = &b->reqs[i + 1];
    b->reqs[n - 1].next = NULL;
    atomic_store_explicit(&b->pending, n, memory_order_relaxed);

    uint64_t pend[2] = {0, 0}; /* bytes by rb_req_op */
    for (uint32_t i = 0; i < n; i++)
        pend[b->reqs[i].op == RB_REQ_WRITE] += b->reqs[i].total_len;
    rb_stats *st = &u->dev->stats;
    pthread_mutex_lock(&u->q_mu);
    if (u->stopping) {
        pthread_mutex_unlock(&u->q_mu);
        for (uint32_t i = 0; i < n; i++)
            b->reqs[i].status = RB_REQ_REFUSED;
        atomic_store_explicit(&b->pending, 0, memory_order_release);
        return -ESHUTDOWN;
    }
    int was_empty = u->qcount == 0;
    if (u->qtail)
        u->qtail->next = &b->reqs[0];
    else
        u->qhead = &b->reqs[0];
    u->qtail = &b->reqs[n - 1];
    u->qcount += n;
    /* Counters move under q_mu so the worker can never take them below zero. */
    uint64_t out = RB_STAT_ADD(st, outstanding_requests, n) + n;
    uint64_t q = RB_STAT_ADD(st, queued_requests, n) + n;
    RB_STAT_ADD(st, read_pending_bytes, pend[RB_REQ_READ]);
    RB_STAT_ADD(st, write_pending_bytes, pend[RB_REQ_WRITE]);
    pthread_mutex_unlock(&u->q_mu);

    rb_stat_max(&st->peak_outstanding_requests, out);
    rb_stat_max(&st->peak_queued_requests, q);
    rb_stat_max(&st->max_batch_size, n);
    RB_STAT_ADD(st, batches_submitted, 1);
    /* A non-empty queue means the worker has work it could not place yet (ring full), so it
     * will look again after its next completion: no wake-up needed. */
    if (was_empty)
        wake_worker(u);
    return 0;
}

typedef int (*rb_pred)(void *);

static void wait_until(struct rb_uring *u, rb_pred pred, void *arg)
{
    if (pred(arg))
        return;
    atomic_fetch_add(&u->waiters, 1);
    for (;;) {
        uint32_t g = atomic_load(&u->done_gen);
        if (pred(arg))
            break;
        futex_wait(&u->done_gen, g);
    }
    atomic_fetch_sub(&u->waiters, 1);
}

static int batch_pred(void *arg)
{
    return rb_batch_done(arg);
}

void rb_uring_wait(struct rb_uring *u, rb_batch *b)
{
    wait_until(u, batch_pred, b);
}

int rb_uring_sync(struct rb_uring *u, int op, uint64_t offset, void *buf, size_t buf_len, size_t payload_len,
                  size_t total_len, uint16_t pid, rb_err *err)
{
    rb_batch *b = rb_batch_new(1, 0);
    if (!b)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    int rc = rb_batch_set(u, b, 0, op, offset, buf, buf_len, payload_len, total_len,
                          op == RB_REQ_READ ? payload_len : 0, err);
    b->reqs[0].pid = pid;
    if (rc == 0)
        rc = rb_batch_prepare(u, b, err);
    if (rc == 0) {
        if (rb_uring_submit(u, b) < 0)
            rc = rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "io_uring worker stopped");
        else
            rb_uring_wait(u, b);
    }
    if (rc == 0)
        rc = rb_batch_result(b, 0, err);
    rb_batch_free(b);
    return rc;
}

int rb_uring_stopped(struct rb_uring *u)
{
    return atomic_load(&u->stopped);
}

int rb_uring_worker_error(struct rb_uring *u, char *buf, size_t len)
{
    if (!atomic_load(&u->has_fatal))
        return 0;
    pthread_mutex_lock(&u->err_mu);
    snprintf(buf, len, "%s", u->fatal);
    pthread_mutex_unlock(&u->err_mu);
    return 1;
}

void rb_uring_fixed_status(struct rb_uring *u, int *registered, uint64_t *bytes)
{
    *registered = atomic_load(&u->fixed_registered);
    *bytes = *registered ? atomic_load(&u->fixed_bytes) : 0;
}

static int cmp_region(const void *pa, const void *pb)
{
    const struct fixed_region *a = pa, *b = pb;
    return a->start < b->start ? -1 : a->start > b->start ? 1 : 0;
}

static int ctl_pred(void *arg)
{
    return atomic_load(&((struct rb_ctl *)arg)->done);
}

/* The n buffers can be registered: non-null, non-empty, at most 1 GiB each, inside the address
 * space; their total size in *total. 0, or <0 with err set. */
static int fixed_check(const uint64_t *ptrs, const uint64_t *sizes, size_t n, uint64_t *total, rb_err *err)
{
    if (n == 0)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "at least one buffer must be provided");
    if (n > MAX_FIXED)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "too many fixed buffers: %zu exceeds the u16 index space", n);
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ptrs[i] == 0)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "fixed buffer %zu has a null pointer", i);
        if (sizes[i] == 0)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "fixed buffer %zu has zero size", i);
        if (sizes[i] > MAX_FIXED_SIZE)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "fixed buffer %zu size %llu exceeds the 1 GiB limit", i,
                              (unsigned long long)sizes[i]);
        if (ptrs[i] > UINTPTR_MAX - sizes[i])
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "fixed buffer %zu range overflows the address space", i);
        *total += sizes[i];
    }
    return 0;
}

/* The n buffers as iovecs (*iov_out) and as regions sorted by start (*regs_out), both
 * malloc'ed, checked not to overlap. 0, or <0 with err set (nothing left allocated). */
static int fixed_tables(const uint64_t *ptrs, const uint64_t *sizes, size_t n, struct fixed_region **regs_out,
                        struct iovec **iov_out, rb_err *err)
{
    struct fixed_region *regs = malloc(n * sizeof(*regs));
    struct iovec *iov = malloc(n * sizeof(*iov));
    if (!regs || !iov) {
        free(regs);
        free(iov);
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        regs[i].start = (uintptr_t)ptrs[i];
        regs[i].end = (uintptr_t)(ptrs[i] + sizes[i]);
        regs[i].idx = (unsigned)i;
        iov[i].iov_base = (void *)(uintptr_t)ptrs[i];
        iov[i].iov_len = (size_t)sizes[i];
    }
    qsort(regs, n, sizeof(*regs), cmp_region);
    for (size_t i = 1; i < n; i++) {
        if (regs[i].start < regs[i - 1].end) {
            rb_err_set(err, RB_ERR_VALUE, EINVAL, "fixed buffer regions overlap: [0x%lx, 0x%lx) and [0x%lx, 0x%lx)",
                       (unsigned long)regs[i - 1].start, (unsigned long)regs[i - 1].end, (unsigned long)regs[i].start,
                       (unsigned long)regs[i].end);
            free(regs);
            free(iov);
            return -EINVAL;
        }
    }
    *regs_out = regs;
    *iov_out = iov;
    return 0;
}

/* Have the worker register the buffers (the caller holds reg_mu): 0 (the worker owns regs
 * now), or <0 with err set. */
static int fixed_register(struct rb_uring *u, struct iovec *iov, struct fixed_region *regs, size_t n, rb_err *err)
{
    struct rb_ctl ctl = {.iov = iov, .n = (unsigned)n, .regions = regs};
    atomic_init(&ctl.done, 0);
    pthread_mutex_lock(&u->q_mu);
    if (u->stopping) {
        pthread_mutex_unlock(&u->q_mu);
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "io_uring worker stopped");
    }
    u->ctl = &ctl;
    pthread_mutex_unlock(&u->q_mu);
    wake_worker(u);
    wait_until(u, ctl_pred, &ctl);
    if (ctl.rc < 0) {
        char msg[200];
        fmt_os_error(msg, sizeof(msg), "register_buffers failed", -ctl.rc);
        return rb_err_set(err, RB_ERR_RUNTIME, -ctl.rc, "%s", msg);
    }
    return 0;
}

int rb_uring_register_buffers(struct rb_uring *u, const uint64_t *ptrs, const uint64_t *sizes, size_t n, rb_err *err)
{
    uint64_t total = 0;
    struct fixed_region *regs = NULL;
    struct iovec *iov = NULL;
    int rc = fixed_check(ptrs, sizes, n, &total, err);
    if (rc < 0 || (rc = fixed_tables(ptrs, sizes, n, &regs, &iov, err)) < 0)
        return rc;
    pthread_mutex_lock(&u->reg_mu);
    if (atomic_load(&u->fixed_registered))
        rc = rb_err_set(err, RB_ERR_RUNTIME, EBUSY, "fixed buffers are already registered");
    else
        rc = fixed_register(u, iov, regs, n, err);
    if (rc == 0) {
        regs = NULL; /* the worker owns them now */
        atomic_store(&u->fixed_bytes, total);
        atomic_store(&u->fixed_registered, 1);
    }
    pthread_mutex_unlock(&u->reg_mu);
    free(regs);
    free(iov);
    return rc;
}

/* ------------------------------------------------------------------ worker */

/* Terminal state for r. Nothing of r or its batch may be touched after this returns. */
static void finish(struct rb_uring *u, rb_req *r, int status, int errnum)
{
    rb_batch *b = r->batch;
    r->status = (uint8_t)status;
    r->errnum = errnum;
    RB_STAT_SUB(&u->dev->stats, outstanding_requests, 1);
    if (r->op == RB_REQ_WRITE)
        RB_STAT_SUB(&u->dev->stats, write_pending_bytes, r->total_len);
    else
        RB_STAT_SUB(&u->dev->stats, read_pending_bytes, r->total_len);
    if (atomic_fetch_sub_explicit(&b->pending, 1, memory_order_acq_rel) == 1)
        u->batch_finished = 1;
}

static void fail_list(struct rb_uring *u, rb_req *r, int status)
{
    while (r) {
        rb_req *next = r->next;
        finish(u, r, status, 0);
        r = next;
    }
}

static int lookup_fixed(const struct rb_uring *u, const uint8_t *p, size_t len)
{
    unsigned lo = 0, hi = u->nregions;
    uintptr_t s = (uintptr_t)p;
    while (lo < hi) { /* first region with start > s */
        unsigned mid = (lo + hi) / 2;
        if (u->regions[mid].start <= s)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    const struct fixed_region *r = &u->regions[lo - 1];
    if (s + len < s || s + len > r->end)
        return -1;
    return (int)r->idx;
}

/* The checks LMCache's device makes while building an NVMe command: 0, or the failure status
 * (the request is finished with it, per request, never failing the batch). */
static int nvme_check(const struct rb_uring *u, const rb_req *r)
{
    if (r->offset & (u->lba_size - 1))
        return RB_REQ_LBA_OFFSET;
    if (r->total_len == 0)
        return RB_REQ_ZERO_LENGTH;
    if (r->total_len & (u->lba_size - 1))
        return RB_REQ_LBA_LENGTH;
    return 0;
}

/* An NVMe Read or Write of attempt a (a->len bytes at a->off from/to a->buf), in a 128-byte
 * SQE. idx >= 0: the buffer lies in registered buffer idx. */
static void prep_nvme(struct rb_uring *u, struct io_uring_sqe *sqe, const rb_att *a, int idx)
{
    const rb_req *r = a->req;
    memset(sqe, 0, 2 * sizeof(*sqe)); /* the command area is the second half of a big SQE */
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = u->fd;
    sqe->cmd_op = NVME_URING_CMD_IO;
    if (idx >= 0) {
        sqe->uring_cmd_flags = IORING_URING_CMD_FIXED;
        sqe->buf_index = (uint16_t)idx;
    }
    struct nvme_uring_cmd *cmd = (struct nvme_uring_cmd *)sqe->cmd;
    uint64_t slba = a->off >> u->lba_shift;
    uint32_t nlb = (uint32_t)(a->len >> u->lba_shift) - 1; /* 0-based; len <= 65536 blocks */
    cmd->opcode = r->op == RB_REQ_WRITE ? 0x01 : 0x02;
    cmd->nsid = u->nsid;
    cmd->addr = (uint64_t)(uintptr_t)a->buf;
    cmd->data_len = (uint32_t)a->len;
    cmd->cdw10 = (uint32_t)slba;
    cmd->cdw11 = (uint32_t)(slba >> 32);
    cmd->cdw12 = nlb & 0xffff;
    if (r->op == RB_REQ_WRITE && r->pid) {
        cmd->cdw12 |= 2u << 20;              /* DTYPE 2: Data Placement */
        cmd->cdw13 = (uint32_t)r->pid << 16; /* DSPEC: the placement id */
    }
}

/* The length of r's next attempt: what is left to send, at most MAX_ATTEMPT, a passthrough
 * command's limit and the scheduler's piece for its lane. */
static size_t attempt_len(const struct rb_uring *u, const rb_req *r)
{
    size_t len = r->cur_len < MAX_ATTEMPT ? r->cur_len : MAX_ATTEMPT;
    if (u->nvme && len > u->max_xfer)
        len = u->max_xfer;
    size_t piece = r->op == RB_REQ_WRITE ? u->wr_piece : u->rd_piece;
    if (piece && len > piece)
        len = piece;
    return len;
}

/* A read or write of attempt a on the device file (registered buffer idx when idx >= 0). */
static void prep_rw(struct rb_uring *u, struct io_uring_sqe *sqe, const rb_att *a, int idx)
{
    int fd = u->fd;
    unsigned len = (unsigned)a->len;
    if (a->req->op == RB_REQ_READ) {
        if (idx >= 0)
            io_uring_prep_read_fixed(sqe, fd, a->buf, len, a->off, idx);
        else
            io_uring_prep_read(sqe, fd, a->buf, len, a->off);
    } else {
        if (idx >= 0)
            io_uring_prep_write_fixed(sqe, fd, a->buf, len, a->off, idx);
        else
            io_uring_prep_write(sqe, fd, a->buf, len, a->off);
    }
}

/* A placed write through the block device's write streams: Linux >= 6.16 takes the SQE's
 * write_stream byte (offset 44, after personality; liburing 2.3 has no name for it). The NVMe
 * driver turns stream s into the Data Placement directive for the s-th placement id. An id the
 * device does not list is not placed. */
static void set_write_stream(struct rb_uring *u, struct io_uring_sqe *sqe, const rb_req *r)
{
    if (!u->streams || !r->pid || r->op != RB_REQ_WRITE)
        return;
    uint8_t s = rb_dev_stream_of(u->dev, r->pid);
    if (s)
        ((uint8_t *)sqe)[44] = s;
}

/* The lane's bytes in flight moved by delta (worker): the counters follow. */
static void bytes_in_add(struct rb_uring *u, int op, size_t add, size_t sub)
{
    rb_stats *st = &u->dev->stats;
    u->bytes_in[op] = u->bytes_in[op] + add - sub;
    if (op == RB_REQ_READ) {
        atomic_store_explicit(&st->read_inflight_bytes, u->bytes_in[op], memory_order_relaxed);
        if (add)
            rb_stat_max(&st->peak_read_inflight_bytes, u->bytes_in[op]);
    } else {
        atomic_store_explicit(&st->write_inflight_bytes, u->bytes_in[op], memory_order_relaxed);
        if (add)
            rb_stat_max(&st->peak_write_inflight_bytes, u->bytes_in[op]);
    }
    if (add)
        rb_stat_max(&st->peak_inflight_bytes, u->bytes_in[0] + u->bytes_in[1]);
}

/* Prepare the SQE of attempt a (room is guaranteed by the caller). */
static void prep_att(struct rb_uring *u, rb_att *a)
{
    rb_req *r = a->req;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    int idx = (!r->bounce && u->nregions && a->len && !u->nvme_no_fixed) ? lookup_fixed(u, a->buf, a->len) : -1;
    if (u->nvme)
        prep_nvme(u, sqe, a, idx);
    else
        prep_rw(u, sqe, a, idx);
    set_write_stream(u, sqe, r);
    io_uring_sqe_set_data(sqe, a);
    a->fixed = idx >= 0;
    if (!a->counted) {
        a->counted = a->len;
        bytes_in_add(u, r->op, a->len, 0);
    }
    u->sq_fifo[(u->sq_head + u->sq_count) % u->sq_cap] = a;
    u->sq_count++;
    u->inflight++;
    u->att_in[r->op]++;
}

/* An attempt's SQE is no longer the kernel's to complete (its CQE came, or it was never
 * accepted). */
static void att_left_ring(struct rb_uring *u, rb_att *a)
{
    u->inflight--;
    u->att_in[a->req->op]--;
}

/* A new attempt of len bytes from the start of what r has not sent yet. NULL when every
 * attempt is in use (the room the caller checked rules that out). */
static rb_att *att_new(struct rb_uring *u, rb_req *r, size_t len)
{
    rb_att *a = u->att_free;
    if (!a)
        return NULL;
    u->att_free = a->next;
    memset(a, 0, sizeof(*a));
    a->req = r;
    a->off = r->cur_off;
    a->buf = r->cur_buf;
    a->len = len;
    r->cur_off += len;
    r->cur_buf += len;
    r->cur_len -= len;
    r->natt++;
    if (!r->started) {
        r->started = 1;
        RB_STAT_SUB(&u->dev->stats, queued_requests, 1);
        if (r->cur_len)
            RB_STAT_ADD(&u->dev->stats, split_requests, 1);
    }
    return a;
}

/* Queue attempt a to be sent before anything else. */
static void retry_push(struct rb_uring *u, rb_att *a)
{
    a->next = NULL;
    if (u->retry_tail)
        u->retry_tail->next = a;
    else
        u->retry_head = a;
    u->retry_tail = a;
}

/* Append r to lane l (worker). */
static void lane_push(struct rb_uring *u, int l, rb_req *r)
{
    r->next = NULL;
    r->in_lane = 1;
    if (u->lane_tail[l])
        u->lane_tail[l]->next = r;
    else
        u->lane_head[l] = r;
    u->lane_tail[l] = r;
}

/* Take r out of its lane (worker; r is in lane l). */
static void lane_remove(struct rb_uring *u, int l, rb_req *r)
{
    rb_req *prev = NULL;
    for (rb_req *x = u->lane_head[l]; x && x != r; x = x->next)
        prev = x;
    if (prev)
        prev->next = r->next;
    else
        u->lane_head[l] = r->next;
    if (u->lane_tail[l] == r)
        u->lane_tail[l] = prev;
    r->next = NULL;
    r->in_lane = 0;
}

static int lane_of(const struct rb_uring *u, const rb_req *r)
{
    return u->sched == RB_SCHED_FIFO ? 0 : r->op;
}

/* Record attempt a's completion (test hook). */
static void trace_add(struct rb_uring *u, const rb_att *a, int last)
{
    if (!atomic_load_explicit(&u->tr_on, memory_order_relaxed))
        return;
    pthread_mutex_lock(&u->tr_mu);
    if (u->tr && u->tr_n < u->tr_cap)
        u->tr[u->tr_n++] =
            (rb_trace_ent){.offset = a->off, .len = (uint32_t)a->len, .op = a->req->op, .last = (uint8_t)last};
    pthread_mutex_unlock(&u->tr_mu);
}

/* r has no attempt left in the kernel or waiting (worker): finish it when it failed or moved
 * every byte; under fifo, send its next part (first, as a resubmission). A request still in
 * its lane (loads_first, not wholly sent) waits there for its next attempts. */
static void req_settle(struct rb_uring *u, rb_req *r)
{
    if (r->natt)
        return;
    if (!r->fail && r->left && u->no_submit)
        r->fail = RB_REQ_SHORT_SHUTDOWN;
    if (r->fail) {
        if (r->in_lane)
            lane_remove(u, lane_of(u, r), r);
        finish(u, r, r->fail, r->fail_errnum);
        return;
    }
    if (r->left == 0) {
        if (r->op == RB_REQ_READ && r->bounce && r->copy_len)
            memcpy(r->ubuf, r->bounce, r->copy_len);
        finish(u, r, RB_REQ_OK, 0);
        return;
    }
    if (!r->in_lane) {
        rb_att *a = att_new(u, r, attempt_len(u, r));
        if (a)
            retry_push(u, a);
    }
}

/* Attempt a has ended (worker): with status (RB_REQ_OK, or the failure that fails its
 * request); its bytes leave the budget, and its request is settled. */
static void att_end(struct rb_uring *u, rb_att *a, int status, int errnum)
{
    rb_req *r = a->req;
    if (a->counted)
        bytes_in_add(u, r->op, 0, a->counted);
    if (status != RB_REQ_OK && !r->fail) {
        r->fail = (uint8_t)status;
        r->fail_errnum = errnum;
    }
    r->natt--;
    trace_add(u, a, r->natt == 0 && (r->fail || r->left == 0));
    a->next = u->att_free;
    u->att_free = a;
    req_settle(u, r);
}

/* Fail every attempt on the list with status (worker). */
static void att_fail_list(struct rb_uring *u, rb_att *a, int status)
{
    while (a) {
        rb_att *next = a->next;
        att_end(u, a, status, 0);
        a = next;
    }
}

/* The kernel accepted the first n prepared SQEs: they are attempts now. */
static void account_accepted(struct rb_uring *u, unsigned n)
{
    rb_stats *st = &u->dev->stats;
    uint64_t rd = 0, rdb = 0, wr = 0, wrb = 0, bo = 0, bob = 0, fx = 0, fxb = 0;
    for (unsigned i = 0; i < n && u->sq_count; i++) {
        rb_att *a = u->sq_fifo[u->sq_head];
        u->sq_head = (u->sq_head + 1) % u->sq_cap;
        u->sq_count--;
        a->kprev = NULL;
        a->knext = u->kern;
        if (u->kern)
            u->kern->kprev = a;
        u->kern = a;
        a->in_kern = 1;
        if (a->req->batch->t_given_ns && !a->req->batch->t_kern_ns)
            a->req->batch->t_kern_ns = rb_hist_now_ns();
        if (a->req->op == RB_REQ_READ) {
            rd++;
            rdb += a->len;
        } else {
            wr++;
            wrb += a->len;
        }
        if (a->req->bounce) {
            bo++;
            bob += a->len;
        }
        if (a->fixed) {
            fx++;
            fxb += a->len;
        }
    }
    if (rd) {
        RB_STAT_ADD(st, read_attempts, rd);
        RB_STAT_ADD(st, read_submitted_bytes, rdb);
    }
    if (wr) {
        RB_STAT_ADD(st, write_attempts, wr);
        RB_STAT_ADD(st, write_submitted_bytes, wrb);
    }
    if (bo) {
        RB_STAT_ADD(st, bounce_attempts, bo);
        RB_STAT_ADD(st, bounce_submitted_bytes, bob);
    }
    if (fx) {
        RB_STAT_ADD(st, fixed_buffer_attempts, fx);
        RB_STAT_ADD(st, fixed_buffer_submitted_bytes, fxb);
    }
}

static void arm_poll(struct rb_uring *u)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe)
        return;
    io_uring_prep_poll_multishot(sqe, u->efd, POLLIN);
    io_uring_sqe_set_data64(sqe, POLL_TAG);
    u->poll_armed = 1;
}

/* The eventfd poll completed: drain the eventfd; the poll is re-armed when it ended. */
static void handle_poll(struct rb_uring *u, const struct io_uring_cqe *cqe)
{
    uint64_t v;
    while (read(u->efd, &v, sizeof(v)) < 0 && errno == EINTR)
        ;
    if (!(cqe->flags & IORING_CQE_F_MORE))
        u->poll_armed = 0;
}

/* Take a off the list of attempts in the kernel. */
static void kern_unlink(struct rb_uring *u, rb_att *a)
{
    if (!a->in_kern)
        return;
    if (a->kprev)
        a->kprev->knext = a->knext;
    else
        u->kern = a->knext;
    if (a->knext)
        a->knext->kprev = a->kprev;
    a->in_kern = 0;
}

/* Count attempt a that ended with *res in cnt (completed, failed, bytes read, written). An
 * NVMe command moves all of a->len or fails with its status: res is 0 or the status, never a
 * byte count, so a success becomes a->len in *res. 1 when a ended (an NVMe status). */
static int count_attempt(struct rb_uring *u, rb_att *a, int *res, uint64_t *cnt)
{
    int op = a->req->op;
    if (u->nvme && *res >= 0) {
        if (*res > 0) {
            cnt[1]++;
            att_end(u, a, RB_REQ_NVME_STATUS, *res);
            return 1;
        }
        cnt[0]++;
        cnt[op == RB_REQ_READ ? 2 : 3] += a->len;
        *res = (int)a->len;
    } else if (*res > 0 || (*res == 0 && a->len == 0)) {
        cnt[0]++; /* completed */
        cnt[op == RB_REQ_READ ? 2 : 3] += (uint64_t)*res;
    } else {
        cnt[1]++; /* failed */
    }
    return 0;
}

/* res bytes of attempt a moved (res >= 0, 0 only for an empty attempt): a ends when nothing of
 * it is left, else its remainder is sent again first (unless its request failed meanwhile or
 * nothing can be submitted any more). */
static void advance(struct rb_uring *u, rb_att *a, int res, uint64_t *cnt)
{
    rb_req *r = a->req;
    if (RB_WLOG_ENABLED() && r->op == RB_REQ_WRITE && res > 0)
        rb_wlog_write(u->fd, a->off, a->buf, (size_t)res);
    r->left -= (size_t)res;
    if ((size_t)res == a->len) {
        att_end(u, a, RB_REQ_OK, 0);
        return;
    }
    cnt[4]++; /* short transfer (a passthrough request's next command is not one) */
    bytes_in_add(u, r->op, 0, (size_t)res);
    a->counted -= (size_t)res;
    a->off += (uint64_t)res;
    a->buf += res;
    a->len -= (size_t)res;
    if (u->no_submit)
        att_end(u, a, RB_REQ_SHORT_SHUTDOWN, 0);
    else if (r->fail)
        att_end(u, a, RB_REQ_OK, 0); /* the request failed: the rest is not sent */
    else
        retry_push(u, a);
}

static void handle_cqe(struct rb_uring *u, const struct io_uring_cqe *cqe, uint64_t *cnt)
{
    uint64_t ud = io_uring_cqe_get_data64(cqe);
    if (ud == POLL_TAG) {
        handle_poll(u, cqe);
        return;
    }
    rb_att *a = (rb_att *)(uintptr_t)ud;
    int res = cqe->res;
    att_left_ring(u, a);
    kern_unlink(u, a);
    if (u->nvme && res == -EINVAL && a->fixed && !u->no_submit) {
        /* Some kernels (Debian 12's 6.1) take registered buffers for io_uring but refuse them in
         * NVMe passthrough commands. Stop using them for passthrough and send this command
         * again from the same memory: nothing was transferred. */
        u->nvme_no_fixed = 1;
        RB_STAT_ADD(&u->dev->stats, fixed_buffer_fallbacks, 1);
        retry_push(u, a);
        return;
    }
    if (a->req->op == RB_REQ_WRITE && atomic_load_explicit(&u->fail_write_in, memory_order_relaxed) > 0 &&
        atomic_fetch_sub(&u->fail_write_in, 1) == 1)
        res = -EIO; /* test hook: the device did the write; this attempt reports it failed */
    if (count_attempt(u, a, &res, cnt))
        return;
    if (res < 0)
        att_end(u, a, RB_REQ_EIO, -res);
    else if (res == 0 && a->len > 0)
        att_end(u, a, RB_REQ_EOF, EIO);
    else
        advance(u, a, res, cnt);
}

static void reap(struct rb_uring *u)
{
    if (u->no_submit && (atomic_load(&u->fault) & RB_URING_FAULT_REAP))
        return; /* test hook: completions cannot be reaped */
    unsigned head, seen = 0;
    struct io_uring_cqe *cqe;
    uint64_t cnt[5] = {0, 0, 0, 0, 0};
    io_uring_for_each_cqe(&u->ring, head, cqe)
    {
        handle_cqe(u, cqe, cnt);
        seen++;
    }
    if (!seen)
        return;
    io_uring_cq_advance(&u->ring, seen);
    rb_stats *st = &u->dev->stats;
    if (cnt[0])
        RB_STAT_ADD(st, completed_attempts, cnt[0]);
    if (cnt[1])
        RB_STAT_ADD(st, failed_attempts, cnt[1]);
    if (cnt[2])
        RB_STAT_ADD(st, read_completed_bytes, cnt[2]);
    if (cnt[3])
        RB_STAT_ADD(st, write_completed_bytes, cnt[3]);
    if (cnt[4])
        RB_STAT_ADD(st, short_io_resubmits, cnt[4]);
}

static void do_ctl(struct rb_uring *u, struct rb_ctl *c)
{
    int rc;
    if (u->no_submit)
        rc = -ESHUTDOWN;
    else
        rc = io_uring_register_buffers(&u->ring, c->iov, c->n);
    if (rc == 0) {
        free(u->regions);
        u->regions = c->regions;
        u->nregions = c->n;
    }
    c->rc = rc;
    atomic_store(&c->done, 1);
    u->batch_finished = 1;
}

static void set_fatal(struct rb_uring *u, int e)
{
    pthread_mutex_lock(&u->err_mu);
    fmt_os_error(u->fatal, sizeof(u->fatal), "io_uring submit failed", e);
    pthread_mutex_unlock(&u->err_mu);
    atomic_store(&u->has_fatal, 1);
    pthread_mutex_lock(&u->q_mu);
    u->stopping = 1;
    atomic_store(&u->stopped, 1);
    pthread_mutex_unlock(&u->q_mu);
    u->no_submit = 1;
    /* Prepared SQEs the kernel did not take will never run. */
    while (u->sq_count) {
        rb_att *a = u->sq_fifo[u->sq_head];
        u->sq_head = (u->sq_head + 1) % u->sq_cap;
        u->sq_count--;
        att_left_ring(u, a);
        att_end(u, a, RB_REQ_NOT_SUBMITTED, 0);
    }
}

static int setup_ring(struct rb_uring *u, rb_err *err)
{
    static const unsigned flag_sets[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SUBMIT_ALL,
        IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL,
        0,
    };
    const char *env = getenv("RB_URING_SETUP");
    size_t first = 0;
    if (env && env[0] >= '0' && env[0] <= '2')
        first = (size_t)(env[0] - '0'); /* benchmark/debug knob: start lower in the list */
    int rc = -EINVAL;
    /* Passthrough: NVMe commands need 128-byte SQEs and return 32-byte CQEs. */
    const unsigned big = u->nvme ? IORING_SETUP_SQE128 | IORING_SETUP_CQE32 : 0;
    for (size_t i = first; i < sizeof(flag_sets) / sizeof(flag_sets[0]); i++) {
        struct io_uring_params p;
        memset(&p, 0, sizeof(p));
        p.flags = flag_sets[i] | big;
        rc = io_uring_queue_init_params(u->depth + 1, &u->ring, &p);
        if (rc == 0)
            break;
        if (rc != -EINVAL)
            break; /* ENOMEM, EPERM, ENOSYS...: fewer flags will not help */
    }
    if (rc < 0 && big && rc == -EINVAL)
        return rb_err_set(err, RB_ERR_RUNTIME, EINVAL,
                          "io_uring_cmd requires kernel 5.19 or later (big SQE/CQE entries not supported)");
    if (rc < 0) {
        char msg[200];
        fmt_os_error(msg, sizeof(msg), "io_uring init failed", -rc);
        return rb_err_set(err, RB_ERR_RUNTIME, -rc, "%s", msg);
    }
    /* The device's descriptor is not registered with the ring (no fixed file): each request
     * holds the file only while it is in flight, so a killed writer's open file description
     * (and its drain mark, rb_device_int.h) goes when its last write completes, not when the
     * kernel gets round to tearing the ring down. */
    (void)io_uring_register_ring_fd(&u->ring);
    return 0;
}

/* Empty the submission queue (q_mu held): its list, and *n = how many it held. */
static rb_req *take_all_queued_locked(struct rb_uring *u, size_t *n)
{
    rb_req *all = u->qhead;
    *n = u->qcount;
    u->qhead = u->qtail = NULL;
    u->qcount = 0;
    return all;
}

/* What one worker round took from the producers' side under q_mu. */
struct worker_round {
    rb_req *take;       /* queued requests, for the lanes */
    rb_req *shutdown;   /* stopping: everything that was queued, to fail */
    struct rb_ctl *ctl; /* a pending control request (buffer registration), or NULL */
    size_t nshutdown;
    int stopping;
};

/* Worker thread: create the ring and report the outcome to rb_uring_create through the
 * init_state futex. 0 when the ring is up. */
static int worker_start(struct rb_uring *u)
{
    pthread_setname_np(pthread_self(), "rb-uring");
    rb_err_clear(&u->init_err);
    if (setup_ring(u, &u->init_err) < 0) {
        atomic_store(&u->init_state, (uint32_t)-1);
        futex_wake_all(&u->init_state);
        return -1;
    }
    atomic_store(&u->init_state, 1);
    futex_wake_all(&u->init_state);
    return 0;
}

/* Worker thread, no lock: send attempts waiting to be sent again first, while *room lasts. */
static void worker_prep_retries(struct rb_uring *u, unsigned *room)
{
    while (*room && u->retry_head && !u->no_submit) {
        rb_att *a = u->retry_head;
        u->retry_head = a->next;
        if (!u->retry_head)
            u->retry_tail = NULL;
        prep_att(u, a);
        (*room)--;
    }
}

/* Worker thread; takes and drops q_mu: read the stop flag, take the control request, and take
 * every queued request into *rd (none while the test hold is on, unless stopping). */
static void worker_collect(struct rb_uring *u, struct worker_round *rd)
{
    size_t n = 0;
    rd->take = rd->shutdown = NULL;
    rd->nshutdown = 0;
    pthread_mutex_lock(&u->q_mu);
    rd->stopping = u->stopping;
    rd->ctl = u->ctl;
    u->ctl = NULL;
    if (rd->stopping) {
        rd->shutdown = take_all_queued_locked(u, &rd->nshutdown);
    } else if (u->qcount && !atomic_load(&u->hold)) {
        rd->take = take_all_queued_locked(u, &n);
    }
    pthread_mutex_unlock(&u->q_mu);
    if (rd->nshutdown)
        RB_STAT_SUB(&u->dev->stats, queued_requests, rd->nshutdown);
}

/* The first attempt of r is due: the passthrough checks LMCache's device makes while building
 * the command. 0, or 1 when r failed them (r is marked failed and counted as started). */
static int start_refused(struct rb_uring *u, rb_req *r)
{
    int bad = u->nvme ? nvme_check(u, r) : 0;
    if (!bad)
        return 0;
    r->fail = (uint8_t)bad;
    r->fail_errnum = (int)u->lba_size;
    r->started = 1;
    RB_STAT_SUB(&u->dev->stats, queued_requests, 1);
    return 1;
}

/* Whether an attempt of len bytes from lane l would pass its budget (loads_first only): the
 * lane's bytes in flight (at least one attempt always goes), or for stores their share of the
 * ring's entries. */
static int lane_over_budget(const struct rb_uring *u, int l, size_t len)
{
    if (u->sched == RB_SCHED_FIFO)
        return 0;
    size_t cap = l == RB_REQ_WRITE ? u->wr_cap : u->rd_cap;
    if (u->bytes_in[l] && u->bytes_in[l] + len > cap)
        return 1;
    return l == RB_REQ_WRITE && u->att_in[l] >= u->wr_slots;
}

/* Send attempts of lane l's requests in order while *room, the lane's byte budget and (writes
 * under loads_first) its share of the ring's entries last. A request leaves the lane when it is
 * wholly sent (fifo: after its first attempt, its next parts following as resubmissions). 1
 * when the lane still holds requests (for want of room or budget). */
static int issue_lane(struct rb_uring *u, int l, unsigned *room, int *budget_wait)
{
    rb_req *r;
    while ((r = u->lane_head[l]) != NULL) {
        if (r->fail || (!r->started && start_refused(u, r))) {
            lane_remove(u, l, r);
            req_settle(u, r);
            continue;
        }
        if (!*room)
            return 1;
        size_t len = attempt_len(u, r);
        if (lane_over_budget(u, l, len)) {
            *budget_wait = 1;
            return 1;
        }
        rb_att *a = att_new(u, r, len);
        if (!a)
            return 1;
        prep_att(u, a);
        (*room)--;
        if (u->sched == RB_SCHED_FIFO || r->cur_len == 0)
            lane_remove(u, l, r);
    }
    return 0;
}

/* Under stopping, the lanes' requests that sent nothing yet end with RB_REQ_SHUTDOWN; once
 * nothing can be submitted, the ones partly sent fail too (when their last attempt ends). */
static void lanes_stop(struct rb_uring *u)
{
    for (int l = 0; l < 2; l++) {
        rb_req *r = u->lane_head[l];
        while (r) {
            rb_req *next = r->next;
            if (!r->started) {
                lane_remove(u, l, r);
                RB_STAT_SUB(&u->dev->stats, queued_requests, 1);
                finish(u, r, RB_REQ_SHUTDOWN, 0);
            } else if (u->no_submit) {
                if (!r->fail)
                    r->fail = RB_REQ_SHORT_SHUTDOWN;
                lane_remove(u, l, r);
                req_settle(u, r);
            }
            r = next;
        }
    }
}

/* Worker thread, no lock: act on what the round took (run the control request, fail the queue
 * on shutdown and what can no longer be submitted, put new requests in their lanes and send
 * from the lanes: loads, then stores), then wake the waiters if a batch or a control request
 * finished. */
static void worker_dispatch(struct rb_uring *u, const struct worker_round *rd, unsigned room)
{
    if (rd->ctl)
        do_ctl(u, rd->ctl);
    if (rd->shutdown)
        fail_list(u, rd->shutdown, RB_REQ_SHUTDOWN);
    if (rd->stopping && u->retry_head && u->no_submit) {
        rb_att *list = u->retry_head;
        u->retry_head = u->retry_tail = NULL;
        att_fail_list(u, list, RB_REQ_SHORT_SHUTDOWN);
    }
    for (rb_req *r = rd->take; r;) {
        rb_req *next = r->next;
        lane_push(u, lane_of(u, r), r);
        r = next;
    }
    if (rd->stopping)
        lanes_stop(u);
    int budget_wait = 0, starved = 0;
    if (!u->no_submit) {
        starved |= issue_lane(u, 0, &room, &budget_wait);
        starved |= issue_lane(u, 1, &room, &budget_wait);
    }
    if (starved && !budget_wait)
        RB_STAT_ADD(&u->dev->stats, queue_full_events, 1);
    if (budget_wait)
        RB_STAT_ADD(&u->dev->stats, budget_waits, 1);
    if (u->batch_finished) {
        u->batch_finished = 0;
        publish_done(u);
    }
}

/* Worker thread after a fatal submit error (nothing can be submitted): wait for a completion.
 * 0 to go on, or the errno that makes completions unreapable. */
static int worker_wait_reap_only(struct rb_uring *u)
{
    struct io_uring_cqe *cqe;
    int rc = io_uring_wait_cqe(&u->ring, &cqe);
    if (atomic_load(&u->fault) & RB_URING_FAULT_REAP)
        rc = -EFAULT;
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN) {
        /* Cannot even reap: nothing more can be learned from the kernel. Closing the ring
         * (worker_main) waits for the kernel to let go of the buffers; then every request it
         * held is failed, so no waiter is left hanging. */
        return -rc;
    }
    return 0;
}

/* Worker thread: the kernel refused the submission for now (EAGAIN/EBUSY). Count a queue-full
 * event, then wait for a completion when a request is in the kernel, else for a millisecond. */
static void worker_back_off(struct rb_uring *u)
{
    RB_STAT_ADD(&u->dev->stats, queue_full_events, 1);
    if (u->inflight > u->sq_count) {
        struct io_uring_cqe *cqe;
        io_uring_wait_cqe(&u->ring, &cqe);
    } else {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Worker thread: submit the prepared SQEs and sleep until a completion (the eventfd poll
 * brings new work as one); account what the kernel accepted, back off when it is busy, and
 * make any other submit error fatal. */
static void worker_submit_and_wait(struct rb_uring *u, int stopping)
{
    if (!u->poll_armed && !stopping)
        arm_poll(u);
    unsigned had_reqs = u->sq_count;
    int rc = io_uring_submit_and_wait(&u->ring, 1);
    if (rc >= 0 && had_reqs && (atomic_fetch_and(&u->fault, ~RB_URING_FAULT_SUBMIT) & RB_URING_FAULT_SUBMIT)) {
        account_accepted(u, (unsigned)rc); /* the kernel has them; we pretend not to know */
        rc = -EFAULT;
    }
    if (rc >= 0)
        account_accepted(u, (unsigned)rc);
    else if (rc == -EAGAIN || rc == -EBUSY)
        worker_back_off(u);
    else if (rc != -EINTR)
        set_fatal(u, -rc);
}

/* Worker thread: reap, take work, submit, sleep, until stopping with nothing in flight. 0, or
 * the errno with which it left completions it could not reap. */
static int worker_loop(struct rb_uring *u)
{
    for (;;) {
        reap(u);
        /* Take work: resubmissions first, then the lanes, up to depth in flight. */
        unsigned room = u->depth - u->inflight;
        worker_prep_retries(u, &room);
        struct worker_round rd;
        worker_collect(u, &rd);
        worker_dispatch(u, &rd, room);
        if (rd.stopping && u->inflight == 0 && !u->retry_head && !u->lane_head[0] && !u->lane_head[1])
            return 0;
        if (u->no_submit) {
            int lost = worker_wait_reap_only(u);
            if (lost)
                return lost;
            continue;
        }
        worker_submit_and_wait(u, rd.stopping);
    }
}

/* Worker thread, ring still open, requests left without their completions: before anything
 * may end, the kernel must be done with their buffers (a read in flight could still write into
 * memory its owner frees once told the request failed). Cancel everything synchronously, which
 * returns once no request is left; closing the ring alone would not wait. Returns lost, or 0
 * when that cannot be proven (the requests then stay unfinished rather than risk the memory). */
static int worker_cancel_all(struct rb_uring *u, int lost)
{
    struct io_uring_sync_cancel_reg reg;
    memset(&reg, 0, sizeof(reg));
    reg.flags = IORING_ASYNC_CANCEL_ANY | IORING_ASYNC_CANCEL_ALL;
    reg.timeout.tv_sec = 30;
    int crc = io_uring_register_sync_cancel(&u->ring, &reg);
    if (crc < 0 && crc != -ENOENT)
        return 0;
    return lost;
}

/* Worker thread, ring closed (the kernel holds nothing any more); takes q_mu for the queue:
 * fail what the kernel had (with errno lost), what waited for a resubmission, what the lanes
 * held and what was still queued, so every batch ends. */
static void worker_fail_lost(struct rb_uring *u, int lost)
{
    for (rb_att *a = u->kern; a;) {
        rb_att *next = a->knext;
        a->in_kern = 0;
        att_left_ring(u, a);
        att_end(u, a, RB_REQ_EIO, lost);
        a = next;
    }
    u->kern = NULL;
    rb_att *retry = u->retry_head;
    u->retry_head = u->retry_tail = NULL;
    att_fail_list(u, retry, RB_REQ_SHORT_SHUTDOWN);
    lanes_stop(u);
    size_t nq;
    pthread_mutex_lock(&u->q_mu);
    rb_req *queued = take_all_queued_locked(u, &nq);
    pthread_mutex_unlock(&u->q_mu);
    if (nq)
        RB_STAT_SUB(&u->dev->stats, queued_requests, nq);
    fail_list(u, queued, RB_REQ_SHUTDOWN);
}

/* The worker thread: start the ring, run the loop, then close the ring, settling whatever the
 * loop left unreaped, and publish the last completions. */
static void *worker_main(void *arg)
{
    struct rb_uring *u = arg;
    if (worker_start(u) < 0)
        return NULL;
    int lost_errno = worker_loop(u); /* set when the loop ends with completions it could not reap */
    if (lost_errno)
        lost_errno = worker_cancel_all(u, lost_errno);
    io_uring_queue_exit(&u->ring);
    if (lost_errno)
        worker_fail_lost(u, lost_errno);
    /* Any batch finished before the last round has been published in the loop. */
    publish_done(u);
    return NULL;
}

void rb_uring_inject_fault(struct rb_uring *u, int kinds)
{
    atomic_fetch_or(&u->fault, kinds);
}

/* ------------------------------------------------------------------ create / destroy */

static int init_pred(void *arg)
{
    return atomic_load((_Atomic uint32_t *)arg) != 0;
}

/* The smallest unit an attempt may be cut at: the LBA size on passthrough, the alignment under
 * O_DIRECT, else a page. */
static size_t cut_unit(const struct rb_uring *u)
{
    if (u->nvme)
        return u->lba_size;
    if (u->dev->odirect && u->dev->alignment > 1)
        return u->dev->alignment;
    return 4096;
}

/* bytes rounded down to a multiple of unit, at least one unit. */
static size_t round_piece(uint64_t bytes, size_t unit)
{
    uint64_t p = bytes / unit * unit;
    if (p == 0)
        p = unit;
    return p > MAX_ATTEMPT ? MAX_ATTEMPT : (size_t)p;
}

/* The scheduler's parameters from sc (NULL: the defaults). */
static void sched_setup(struct rb_uring *u, const rb_sched_cfg *sc)
{
    rb_sched_cfg d = {0};
    if (!sc)
        sc = &d;
    u->sched = sc->mode == RB_SCHED_FIFO ? RB_SCHED_FIFO : RB_SCHED_LOADS_FIRST;
    if (u->sched == RB_SCHED_FIFO) {
        u->wr_slots = u->depth;
        return;
    }
    size_t unit = cut_unit(u);
    uint64_t rd = sc->read_max_bytes ? sc->read_max_bytes : RB_SCHED_READ_BYTES_DEFAULT;
    uint64_t wr = sc->write_max_bytes ? sc->write_max_bytes : RB_SCHED_WRITE_BYTES_DEFAULT;
    uint64_t piece = sc->write_piece_bytes ? sc->write_piece_bytes : RB_SCHED_PIECE_BYTES_DEFAULT;
    u->rd_piece = round_piece(rd, unit);
    u->wr_piece = round_piece(piece < wr ? piece : wr, unit);
    u->rd_cap = rd < u->rd_piece ? u->rd_piece : (size_t)rd;
    u->wr_cap = wr < u->wr_piece ? u->wr_piece : (size_t)wr;
    /* Writes leave a quarter of the ring's entries to reads (all of a ring of one). */
    u->wr_slots = u->depth > 1 ? u->depth - (u->depth + 3) / 4 : 1;
}

void rb_uring_sched(const struct rb_uring *u, rb_sched_cfg *out)
{
    out->mode = u->sched;
    out->read_max_bytes = u->rd_cap;
    out->write_max_bytes = u->wr_cap;
    out->write_piece_bytes = u->wr_piece;
}

/* Free what create allocated and initialised (the worker is not running). */
static void uring_free(struct rb_uring *u)
{
    if (u->efd >= 0)
        close(u->efd);
    pthread_mutex_destroy(&u->q_mu);
    pthread_mutex_destroy(&u->reg_mu);
    pthread_mutex_destroy(&u->err_mu);
    pthread_mutex_destroy(&u->tr_mu);
    free(u->tr);
    free(u->regions);
    free(u->atts);
    free(u->sq_fifo);
    free(u);
}

/* The engine's memory, the eventfd and the locks, before its worker starts. 0 or <0 (err). */
static int uring_alloc(struct rb_dev *dev, unsigned depth, const rb_sched_cfg *sched, struct rb_uring **out,
                       rb_err *err)
{
    struct rb_uring *u = calloc(1, sizeof(*u));
    if (!u)
        return rb_err_set(err, RB_ERR_RUNTIME, ENOMEM, "io_uring init failed: out of memory");
    u->dev = dev;
    u->fd = dev->fd;
    u->efd = -1;
    u->depth = depth ? depth : 1;
    if (dev->uring_cmd) {
        u->nvme = 1;
        u->nsid = dev->ns.nsid;
        u->lba_shift = dev->ns.lba_shift;
        u->lba_size = dev->ns.lba_size;
        u->max_xfer = dev->max_transfer;
    }
    u->streams = dev->nstreams > 0;
    if (u->depth > 32767)
        u->depth = 32767; /* the ring gets depth + 1 entries (one for the wake-up poll) */
    sched_setup(u, sched);
    pthread_mutex_init(&u->q_mu, NULL);
    pthread_mutex_init(&u->reg_mu, NULL);
    pthread_mutex_init(&u->err_mu, NULL);
    pthread_mutex_init(&u->tr_mu, NULL);
    u->sq_cap = u->depth;
    u->sq_fifo = calloc(u->sq_cap, sizeof(*u->sq_fifo));
    u->atts = calloc(u->depth + 1, sizeof(*u->atts));
    if (!u->sq_fifo || !u->atts) {
        uring_free(u);
        return rb_err_set(err, RB_ERR_RUNTIME, ENOMEM, "io_uring init failed: out of memory");
    }
    for (unsigned i = 0; i < u->depth + 1; i++) {
        u->atts[i].next = u->att_free;
        u->att_free = &u->atts[i];
    }
    u->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (u->efd < 0) {
        int e = errno;
        uring_free(u);
        char msg[200];
        fmt_os_error(msg, sizeof(msg), "io_uring init failed: eventfd", e);
        return rb_err_set(err, RB_ERR_RUNTIME, e, "%s", msg);
    }
    *out = u;
    return 0;
}

int rb_uring_create(struct rb_dev *dev, unsigned depth, const rb_sched_cfg *sched, struct rb_uring **out, rb_err *err)
{
    struct rb_uring *u = NULL;
    int rc = uring_alloc(dev, depth, sched, &u, err);
    if (rc < 0)
        return rc;
    /* The worker never handles signals: Python's handlers run on the main thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    rc = pthread_create(&u->thread, NULL, worker_main, u);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        uring_free(u);
        char msg[200];
        fmt_os_error(msg, sizeof(msg), "io_uring init failed: worker thread", rc);
        return rb_err_set(err, RB_ERR_RUNTIME, rc, "%s", msg);
    }
    while (!init_pred(&u->init_state))
        futex_wait(&u->init_state, 0);
    if (atomic_load(&u->init_state) != 1) {
        pthread_join(u->thread, NULL);
        if (err)
            *err = u->init_err;
        int e = u->init_err.errnum ? u->init_err.errnum : EINVAL;
        uring_free(u);
        return -e;
    }
    *out = u;
    return 0;
}

void rb_uring_destroy(struct rb_uring *u)
{
    if (!u)
        return;
    pthread_mutex_lock(&u->q_mu);
    u->stopping = 1;
    atomic_store(&u->stopped, 1);
    pthread_mutex_unlock(&u->q_mu);
    wake_worker(u);
    pthread_join(u->thread, NULL);
    uring_free(u);
}

/* ------------------------------------------------------------------ test hooks */

void rb_uring_hold(struct rb_uring *u, int on)
{
    atomic_store(&u->hold, on ? 1 : 0);
    if (!on)
        wake_worker(u);
}

void rb_uring_fail_write(struct rb_uring *u, int64_t nth)
{
    atomic_store(&u->fail_write_in, nth > 0 ? nth : 0);
}

int rb_uring_trace(struct rb_uring *u, size_t n)
{
    rb_trace_ent *t = n ? calloc(n, sizeof(*t)) : NULL;
    if (n && !t)
        return -ENOMEM;
    pthread_mutex_lock(&u->tr_mu);
    free(u->tr);
    u->tr = t;
    u->tr_cap = n;
    u->tr_n = 0;
    atomic_store(&u->tr_on, n > 0);
    pthread_mutex_unlock(&u->tr_mu);
    return 0;
}

size_t rb_uring_trace_read(struct rb_uring *u, rb_trace_ent *out, size_t max)
{
    pthread_mutex_lock(&u->tr_mu);
    size_t n = u->tr_n < max ? u->tr_n : max;
    if (n)
        memcpy(out, u->tr, n * sizeof(*out));
    pthread_mutex_unlock(&u->tr_mu);
    return n;
}
