/*
 * rb_uring.h - the io_uring engine of a device: one ring, one worker thread ("rb-uring").
 *
 * Owns: the ring (created, driven and torn down by the worker thread only, so it can use
 * IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN), the software submission FIFO, short-I/O
 * resubmission, fixed-buffer registration and lookup, batch completion and waking of
 * waiters, and the engine's share of the device counters (rb_stats).
 *
 * NVMe passthrough (the device opened with uring_cmd): the ring has 128-byte SQEs and 32-byte
 * CQEs, every transfer is an NVMe Read or Write built by hand in an IORING_OP_URING_CMD SQE
 * (SLBA, 0-based NLB, and for writes with a placement id the Data Placement directive: DTYPE 2
 * in CDW12, the id in DSPEC, CDW13[31:16]), requests longer than the device's transfer limit
 * run as consecutive commands, and unaligned or short caller buffers go through an aligned
 * bounce in both directions. There are no short transfers: a CQE's res is 0 (done), the NVMe
 * status (> 0) or -errno.
 *
 * Nothing here knows about Python. A batch is one allocation: the rb_batch header, its
 * request array and `user_bytes` of caller-owned trailing space (the binding keeps its
 * Py_buffer views there). Life of a batch:
 *
 *   b = rb_batch_new(n, user_bytes)              any thread
 *   rb_batch_set(u, b, i, ...) for each i        validation only, cheap
 *   rb_batch_prepare(u, b, err)                  bounce arena + copies; no GIL needed
 *   rb_uring_submit(u, b)                        one lock, at most one eventfd write
 *   rb_uring_wait(u, b)                          blocks (futex) until every request ended
 *   rb_batch_result(b, i, err) for each i
 *   rb_batch_free(b)
 *
 * The caller must keep the engine alive (dev admission gate) from rb_uring_submit until
 * rb_uring_wait returns, or until rb_uring_destroy has returned: destroy finishes every
 * request it was given (submitted ones run to completion, queued ones fail with
 * "io_uring worker shutting down"), so afterwards every batch may be freed.
 *
 * Threads and locks:
 *   q_mu   - guards the FIFO (head/tail/count), the stopping flag, the pending control
 *            request. Leaf lock: nothing else is taken while it is held; no syscalls
 *            except the eventfd write done after unlocking.
 *   reg_mu - serialises register_fixed_buffers callers; taken before q_mu.
 *   Lock order: dev->gate_mu (rb_device) -> reg_mu -> q_mu. The worker takes only q_mu.
 *   Waiters sleep on a futex (u->done_gen), bumped by the worker after a round of
 *   completions in which some batch finished; no polling anywhere.
 */
#ifndef RB_URING_H
#define RB_URING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "rb_err.h"

struct rb_dev;
struct rb_uring;

enum rb_req_op { RB_REQ_READ = 0, RB_REQ_WRITE = 1 };

/* Terminal state of one request (see rb_batch_result for the texts). */
enum rb_req_status {
    RB_REQ_PENDING = 0,
    RB_REQ_OK,
    RB_REQ_EIO,            /* OSError(errnum, "io_uring I/O error") */
    RB_REQ_EOF,            /* RuntimeError("Unexpected short I/O: internal error") */
    RB_REQ_SHUTDOWN,       /* RuntimeError("io_uring worker shutting down") */
    RB_REQ_REFUSED,        /* RuntimeError("io_uring worker stopped") */
    RB_REQ_NOT_SUBMITTED,  /* RuntimeError("io_uring worker stopped before submission") */
    RB_REQ_SHORT_SHUTDOWN, /* RuntimeError("io_uring worker shutting down: short I/O during shutdown") */
    /* NVMe passthrough (errnum holds the NVMe status, or the LBA size for the build errors,
     * which are reported per request as LMCache's device does, never for the whole batch): */
    RB_REQ_NVME_STATUS, /* OSError(status, "io_uring_cmd NVMe error") */
    RB_REQ_LBA_OFFSET,  /* ValueError("offset must be aligned to LBA size (<n> bytes), got offset=<o>") */
    RB_REQ_LBA_LENGTH,  /* ValueError("length must be aligned to LBA size (<n> bytes), got len=<l>") */
    RB_REQ_ZERO_LENGTH  /* ValueError("length must be non-zero") */
};

typedef struct rb_req {
    struct rb_req *next;          /* FIFO / worker retry list link */
    struct rb_req *kprev, *knext; /* worker: accepted by the kernel, completion not reaped yet */
    struct rb_batch *batch;
    uint8_t *ubuf; /* caller memory */
    size_t ubuf_len;
    size_t payload_len; /* writes: bytes taken from ubuf; the rest up to total_len is zeros */
    size_t total_len;   /* device bytes transferred */
    uint8_t *bounce;    /* slice of the batch's bounce arena, or NULL */
    size_t copy_len;    /* reads through a bounce: bytes copied back to ubuf on success */
    /* Progress (worker only): the next attempt transfers cur_len bytes at cur_off from/to cur_buf. */
    uint64_t cur_off;
    uint8_t *cur_buf;
    size_t cur_len;
    size_t att_len; /* length of the attempt in flight (for stats and short-I/O detection) */
    int32_t errnum;
    uint8_t op;        /* enum rb_req_op */
    uint8_t status;    /* enum rb_req_status; written by the worker before the batch count drops */
    uint8_t att_fixed; /* the attempt in flight uses a registered (fixed) buffer */
    uint8_t in_kern;   /* linked on the worker's kprev/knext list */
    uint16_t pid;      /* writes on a passthrough device: FDP placement id (DSPEC), 0 = none.
                        * Set by the caller after rb_batch_set; ignored elsewhere. */
} rb_req;

typedef struct rb_batch {
    _Atomic uint32_t pending; /* requests not yet terminal; 0 = done */
    uint32_t n;
    uint8_t *arena; /* bounce arena (one aligned allocation), or NULL */
    size_t arena_len;
    void *user;          /* user_bytes of trailing space, zeroed */
    uint64_t t_given_ns; /* caller: when it was submitted (0 = not timed) */
    uint64_t t_kern_ns;  /* worker: when the kernel accepted its first request (timed batches) */
    rb_req reqs[];
} rb_batch;

/* Create the ring (depth entries, worker in-flight cap = depth) and start the worker on
 * dev->fd. Errors: RuntimeError("io_uring init failed: ...") and the like. */
int rb_uring_create(struct rb_dev *dev, unsigned depth, struct rb_uring **out, rb_err *err);

/* Stop admission, fail the queue, let submitted requests finish, join the worker, free.
 * Blocks: call without the GIL. Every request ever submitted is terminal afterwards. */
void rb_uring_destroy(struct rb_uring *u);

/* NULL on allocation failure. n may be 0. */
rb_batch *rb_batch_new(uint32_t n, size_t user_bytes);
void rb_batch_free(rb_batch *b);

/*
 * Describe request i. Writes: payload_len bytes of buf then zeros up to total_len; reads:
 * total_len device bytes, of which min(copy_len, ...) reach buf when a bounce is used.
 * Validates LMCache's rules (O_DIRECT offset/total_len alignment, sizes) with its messages:
 * writes need buf_len >= payload_len ("input buffer too small: cap=.. need=..").
 * read_copy_len: bytes copied back after a bounced read; pass (size_t)-1 for
 * min(buf_len, total_len) (batched_read) or payload_len (read_uring).
 */
int rb_batch_set(struct rb_uring *u, rb_batch *b, uint32_t i, int op, uint64_t offset, void *buf, size_t buf_len,
                 size_t payload_len, size_t total_len, size_t read_copy_len, rb_err *err);

/* Decide bounce vs direct per request, allocate the batch's bounce arena, copy write payloads
 * and zero padding. No GIL needed (touches caller memory, which the caller keeps pinned). */
int rb_batch_prepare(struct rb_uring *u, rb_batch *b, rb_err *err);

/*
 * Queue every request of b (n > 0). Returns 0, or -ESHUTDOWN when the engine stopped
 * admitting: then every request is already terminal with RB_REQ_REFUSED.
 */
int rb_uring_submit(struct rb_uring *u, rb_batch *b);

/* Block until b->pending is 0. No locks held by the caller; call without the GIL. */
void rb_uring_wait(struct rb_uring *u, rb_batch *b);

/* One request, submitted and waited for (the synchronous path of a passthrough device, which
 * takes no read(2)/write(2)): rb_batch_set's rules, pid as rb_req.pid. 0 or -errno with err. */
int rb_uring_sync(struct rb_uring *u, int op, uint64_t offset, void *buf, size_t buf_len, size_t payload_len,
                  size_t total_len, uint16_t pid, rb_err *err);

static inline int rb_batch_done(rb_batch *b)
{
    return atomic_load_explicit(&b->pending, memory_order_acquire) == 0;
}

/* 0 if request i succeeded, else -errno with err filled (kind, errno and message text of
 * the exception LMCache's worker would have created). */
int rb_batch_result(const rb_batch *b, uint32_t i, rb_err *err);

/*
 * Register fixed buffers (IORING_REGISTER_BUFFERS, index = position) through the worker.
 * Validates first (count <= 65535, non-null, non-zero, <= 1 GiB each, no overlaps,
 * not already registered) and touches no state on failure. Blocks until the worker did it.
 */
int rb_uring_register_buffers(struct rb_uring *u, const uint64_t *ptrs, const uint64_t *sizes, size_t n, rb_err *err);

/* (registered, total registered bytes). */
void rb_uring_fixed_status(struct rb_uring *u, int *registered, uint64_t *bytes);

/* 1 once the engine refuses new work (close started or the worker hit a fatal error). */
int rb_uring_stopped(struct rb_uring *u);
/* Test hooks: make the worker's next kernel submission report a hard failure after the kernel
 * took the SQEs (RB_URING_FAULT_SUBMIT), and, once submissions have failed, every attempt to
 * reap completions fail too (RB_URING_FAULT_REAP). */
enum { RB_URING_FAULT_SUBMIT = 1, RB_URING_FAULT_REAP = 2 };
void rb_uring_inject_fault(struct rb_uring *u, int kinds);

/* Copy the worker's fatal error message into buf; returns 1 if there is one, else 0. */
int rb_uring_worker_error(struct rb_uring *u, char *buf, size_t len);

#endif /* RB_URING_H */
