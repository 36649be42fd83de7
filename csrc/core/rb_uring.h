/*
 * rb_uring.h - the io_uring engine of a device: one ring, one worker thread ("rb-uring").
 *
 * Owns: the ring (created, driven and torn down by the worker thread only, so it can use
 * IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN), the software submission queue and the scheduler
 * that sends from it (rb_sched_cfg below: loads first, or one FIFO), short-I/O
 * resubmission, fixed-buffer registration and lookup, batch completion and waking of
 * waiters, and the engine's share of the device counters (rb_stats).
 *
 * NVMe passthrough (the device opened with uring_cmd): the ring has 128-byte SQEs and 32-byte
 * CQEs, every transfer is an NVMe Read or Write built by hand in an IORING_OP_URING_CMD SQE
 * (SLBA, 0-based NLB, and for writes with a placement id the Data Placement directive: DTYPE 2
 * in CDW12, the id in DSPEC, CDW13[31:16]), requests longer than the device's transfer limit
 * run as several commands (in flight together under loads_first, one after another under
 * fifo), and unaligned or short caller buffers go through an aligned
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
 *   tr_mu  - guards the completion trace (a test hook); leaf lock, taken by the worker and by
 *            rb_uring_trace / rb_uring_trace_read.
 *   Lock order: dev->gate_mu (rb_device) -> reg_mu -> q_mu. The worker takes only q_mu and
 *   tr_mu, never both at once.
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
    struct rb_req *next; /* submission queue / worker lane link */
    struct rb_batch *batch;
    uint8_t *ubuf; /* caller memory */
    size_t ubuf_len;
    size_t payload_len; /* writes: bytes taken from ubuf; the rest up to total_len is zeros */
    size_t total_len;   /* device bytes transferred */
    uint8_t *bounce;    /* slice of the batch's bounce arena, or NULL */
    size_t copy_len;    /* reads through a bounce: bytes copied back to ubuf on success */
    uint64_t offset;    /* device offset of the first byte */
    /* Progress (worker only): the part not handed to an attempt yet starts at cur_off (device)
     * and cur_buf (memory) and is cur_len bytes long; left bytes are not transferred yet. */
    uint64_t cur_off;
    uint8_t *cur_buf;
    size_t cur_len;
    size_t left;
    uint32_t natt; /* attempts of this request in the kernel or waiting to be resubmitted */
    int32_t errnum;
    uint8_t op;          /* enum rb_req_op */
    uint8_t status;      /* enum rb_req_status; written by the worker before the batch count drops */
    uint8_t fail;        /* worker: the first failure of one of its attempts (a status), else 0 */
    uint8_t started;     /* worker: an attempt was prepared (it has left the queue) */
    uint8_t in_lane;     /* worker: linked in a lane (taken from the queue, not wholly sent) */
    uint16_t pid;        /* writes on a passthrough device: FDP placement id (DSPEC), 0 = none.
                          * Set by the caller after rb_batch_set; ignored elsewhere. */
    int32_t fail_errnum; /* worker: errnum of fail */
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

/*
 * The worker's scheduler (the io_scheduler setting and its byte budgets).
 *
 * RB_SCHED_FIFO: one queue in submission order, depth counted in requests: each request is one
 * attempt at a time (a passthrough request past the transfer limit, or a short transfer's
 * remainder, runs as consecutive commands); no byte budget.
 *
 * RB_SCHED_LOADS_FIRST: two lanes, loads (reads) before stores (writes), each in submission
 * order. A request is cut into attempts: writes into pieces of write_piece_bytes, reads into
 * pieces of at most read_max_bytes (both rounded down to the device's alignment or LBA size,
 * and on passthrough to the transfer limit), and every attempt of a request may be in flight
 * at once. Reads are sent first each round while the reads' bytes in flight stay within
 * read_max_bytes; writes then, while theirs stay within write_max_bytes and they hold at most
 * three quarters of the ring's entries (the rest stays free for reads). So a read waits in the
 * engine for no write, and in the device behind at most write_max_bytes of writes. A request
 * completes when its last attempt did; a failed attempt fails it, once every attempt of it in
 * the kernel has ended (no memory is let go while the kernel may use it).
 */
enum rb_sched_mode { RB_SCHED_LOADS_FIRST = 0, RB_SCHED_FIFO = 1 };

#define RB_SCHED_READ_BYTES_DEFAULT ((uint64_t)96 << 20)
#define RB_SCHED_WRITE_BYTES_DEFAULT ((uint64_t)16 << 20)
#define RB_SCHED_PIECE_BYTES_DEFAULT ((uint64_t)1 << 20)

typedef struct rb_sched_cfg {
    int mode;                   /* enum rb_sched_mode */
    uint64_t read_max_bytes;    /* reads' bytes in flight; 0 = RB_SCHED_READ_BYTES_DEFAULT */
    uint64_t write_max_bytes;   /* writes' bytes in flight; 0 = RB_SCHED_WRITE_BYTES_DEFAULT */
    uint64_t write_piece_bytes; /* bytes per write attempt; 0 = default; at most write_max_bytes */
} rb_sched_cfg;

/* Create the ring (depth entries, worker in-flight cap = depth) and start the worker on
 * dev->fd, scheduling as sched says (NULL: loads_first with the default budgets). Errors:
 * RuntimeError("io_uring init failed: ...") and the like. */
int rb_uring_create(struct rb_dev *dev, unsigned depth, const rb_sched_cfg *sched, struct rb_uring **out, rb_err *err);

/* The scheduler in effect (defaults filled in, piece rounded). */
void rb_uring_sched(const struct rb_uring *u, rb_sched_cfg *out);

/* Test hooks. rb_uring_hold(u, 1): the worker leaves new requests in the submission queue until
 * rb_uring_hold(u, 0), so that requests submitted from several threads meet in one round.
 * rb_uring_trace(u, n): record the next n attempt completions (n = 0 stops and frees); then
 * rb_uring_trace_read copies up to max of them, in completion order, and returns how many. */
void rb_uring_hold(struct rb_uring *u, int on);
/* Test hook: the nth write attempt to complete from now on (1 = the next; 0 clears) reports an
 * I/O error (EIO), whatever the device did. */
void rb_uring_fail_write(struct rb_uring *u, int64_t nth);
typedef struct rb_trace_ent {
    uint64_t offset; /* device offset of the attempt */
    uint32_t len;    /* its bytes */
    uint8_t op;      /* enum rb_req_op */
    uint8_t last;    /* it ended its request */
} rb_trace_ent;
int rb_uring_trace(struct rb_uring *u, size_t n);
size_t rb_uring_trace_read(struct rb_uring *u, rb_trace_ent *out, size_t max);

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
