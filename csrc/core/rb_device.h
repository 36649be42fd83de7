/*
 * rb_device.h - one open raw block device (or pre-sized file) and its synchronous I/O.
 *
 * Owns: the file descriptor, the cached size, O_DIRECT/alignment rules, the LMCache padding
 * semantics of a transfer (payload bytes, then zeros up to total_len), bounce buffers for the
 * synchronous path, the I/O counters, and the admission gate that lets close() wait for calls
 * still running on other threads. The io_uring engine (rb_uring.h) hangs off the device.
 *
 * Lock order: dev->gate_mu is a leaf lock (held only to wait for or signal the last user), as
 * is rb_dev_lock.c's list of lock descriptors (held across an open(2) and by fork(2)).
 *
 * One writer per device: rb_dev_open can take an flock(2) (and, on a block device, an O_EXCL
 * claim) on a descriptor of its own, never the one transfers use, held until rb_dev_close; see
 * enum rb_dev_lock_mode. The rules and the diagnosis of a refusal live in rb_dev_lock.c; a file
 * and the loop devices over it are one device (rb_dev_backing.c).
 */
#ifndef RB_DEVICE_H
#define RB_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "rb_err.h"
#include "rb_nvme.h"
#include "rb_stats.h"
#include "rb_uring.h"

enum rb_engine_kind { RB_ENGINE_POSIX = 0, RB_ENGINE_IOURING = 1 };

/* Write streams a device can address (the SQE field is 8 bits, 0 meaning none). */
#define RB_MAX_WRITE_STREAMS 255

/*
 * How rb_dev_open locks the device. flock(2) locks belong to the open file description, so a
 * second open in the same process conflicts exactly like one in another process; the kernel
 * drops them when the last descriptor of that description closes (close, exit, kill -9). That
 * description is the lock's alone: the engines transfer through another one (an io_uring ring
 * keeps the files registered with it until the kernel tears it down, after the process is
 * gone), and a child forked without exec closes its copy (pthread_atfork). A loop device's
 * backing file is locked too, and the other loop devices over a file are checked: one writer
 * for a file and every loop device over it (rb_dev_lock_backing in rb_device_int.h).
 *   NONE       no lock and no check (LMCache's device).
 *   CHECK      no lock held; refuse (EBUSY) when another process holds an exclusive flock on
 *              the device (a probe LOCK_SH|LOCK_NB, dropped at once). A holder in this process
 *              is allowed: LMCache opens one path twice, and beside a core, in one process.
 *   SHARED     LOCK_SH for the lifetime (read-only tools); refused while a writer holds it.
 *   EXCLUSIVE  LOCK_EX for the lifetime (the core and raw writers): refused while anyone else
 *              holds a lock; shared holders are waited for up to RB_LOCK_WAIT_MS (udev takes
 *              LOCK_SH briefly while it probes a block device), the lock of a process that has
 *              exited up to RB_LOCK_EXIT_WAIT_MS (see there). A block device is also
 *              opened with O_EXCL, so the kernel refuses it when it is mounted or claimed
 *              exclusively (RAID, device-mapper, another O_EXCL opener). On a passthrough
 *              device (uring_cmd, /dev/ngXnY) the namespace's block device /dev/nvmeXnY, when it
 *              exists, is opened with O_EXCL and locked too, for the lifetime: a mounted
 *              namespace, or a core on the block device, is refused.
 * SHARED and CHECK on a passthrough device apply the same lock or probe to /dev/nvmeXnY.
 * Where the file system has no flock (ENOLCK, EOPNOTSUPP, EINVAL, ENOSYS: an NFS mount without
 * a lock manager, some FUSE or 9p mounts) the open goes ahead unlocked and the device says so:
 * rb_dev_lock_state() == RB_LOCKST_UNSUPPORTED.
 * A refusal is RB_ERR_OS with EBUSY and a message that names the holder (its pid from
 * /proc/locks, "this process" when it is ours; the mount point or claiming device for O_EXCL)
 * and ends with the path.
 */
enum rb_dev_lock_mode { RB_LOCK_NONE = 0, RB_LOCK_CHECK, RB_LOCK_SHARED, RB_LOCK_EXCLUSIVE };

/* What an open device holds (rb_dev_lock_state). */
enum rb_dev_lock_state {
    RB_LOCKST_NONE = 0,    /* no lock held (NONE, or CHECK after its probe) */
    RB_LOCKST_SHARED,      /* LOCK_SH */
    RB_LOCKST_EXCLUSIVE,   /* LOCK_EX (and O_EXCL on a block device) */
    RB_LOCKST_UNSUPPORTED, /* a lock or probe was asked for; the file system has no flock */
};

/* How long a lock or probe waits for shared holders (and a holder that let go while it looked)
 * to go away before refusing; and for the lock of a process that is exiting (the kernel drops
 * it as the process's files are released, before the process can be reaped) when no live
 * process still holds it (one it passed the descriptor to: that one is named at once). */
#define RB_LOCK_WAIT_MS 1000
#define RB_LOCK_EXIT_WAIT_MS 5000

typedef struct rb_dev_config {
    const char *path;
    int writable;
    int odirect;
    int engine; /* enum rb_engine_kind */
    int uring_cmd;
    size_t alignment;
    unsigned queue_depth;  /* io_uring ring size, >= 1 */
    uint64_t max_transfer; /* uring_cmd: bytes per NVMe command; 0 = from sysfs */
    int lock;              /* enum rb_dev_lock_mode; 0 (NONE) when not set */
    rb_sched_cfg sched;    /* io_uring: the scheduler; zeros = loads_first, default budgets */
} rb_dev_config;

struct rb_uring;

/* Opaque outside the core; the core's own files see the fields through rb_device_int.h. */
typedef struct rb_dev rb_dev;

/* Open path as configured. O_CLOEXEC always; O_DIRECT when cfg->odirect and not uring_cmd;
 * never O_CREAT. With uring_cmd the path must be an NVMe namespace character device (ngXnY):
 * the namespace is identified (size = blocks x LBA size), alignment must be a multiple of the
 * LBA size, and the per-command transfer limit is cfg->max_transfer or, when 0, the kernel's
 * (sysfs max_hw_sectors_kb capped by max_segments pages; 128 KiB when sysfs does not say). Only a regular file or a block/character device is accepted: the path is
 * checked with stat(2) before open (a FIFO would block open forever) and the descriptor
 * again with fstat(2) after it (the path may have been replaced in between; the open itself
 * uses O_NONBLOCK, cleared afterwards, so that race cannot block either). cfg->lock is applied
 * right after the descriptor is open (see enum rb_dev_lock_mode). On failure *out is
 * untouched, nothing stays open or locked, and err says why. */
int rb_dev_open(const rb_dev_config *cfg, rb_dev **out, rb_err *err);

/* The file-type rule of rb_dev_open on its own: 0 when path is a regular file or a block or
 * character device, or cannot be stat'ed (opening it then reports why); otherwise a
 * RB_ERR_VALUE naming the path and what it is (FIFO, socket, directory). */
int rb_dev_check_path(const char *path, rb_err *err);
int rb_dev_check_mode(const char *path, unsigned mode, rb_err *err);

/* Range rule shared by every path (posix and io_uring): on a device whose size is known
 * (regular file, block device), offset + total_len must not pass its end. Writes beyond it
 * fail with OSError(ENOSPC) - what a block device gives LMCache's device, where a file would
 * silently grow; reads with RuntimeError("unexpected EOF"), LMCache's text for a short read.
 * Checked before any buffer is allocated. The size is cached at open; only when a request
 * passes it is the current size looked up again (a file grown since then takes the I/O). */
int rb_dev_check_range(const rb_dev *dev, int write, uint64_t offset, size_t total_len, rb_err *err);

/* Take / drop a user reference. rb_dev_enter fails with -ESHUTDOWN once close has begun. */
int rb_dev_enter(rb_dev *dev);
void rb_dev_leave(rb_dev *dev);

/* Stop admission, wait for running calls, stop the engine, close the fd. Idempotent.
 * Blocks; call without the GIL. Returns -errno (with err set) if close(2) failed; the
 * device then stays open so the caller can retry. Safe to call from several threads. */
int rb_dev_close(rb_dev *dev, rb_err *err);

/* Make every write that completed before the call durable: fdatasync(2), which on a block
 * device also flushes the drive's volatile write cache (a FLUSH command). Retried on EINTR.
 * On a passthrough device, an NVMe Flush command on the namespace instead (fsync does not
 * reach it through the character device). Returns 0 or -errno with err set ("fdatasync
 * failed"). Blocks; call without the GIL. */
int rb_dev_flush(rb_dev *dev, rb_err *err);
/* Start the write-back of the file's dirty pages, without waiting for it (sync_file_range(2)
 * with SYNC_FILE_RANGE_WRITE over the whole file): 1 started, 0 not buffered (O_DIRECT,
 * passthrough) or refused. Durability still needs rb_dev_flush; this only spreads the
 * write-back, so a later flush finds little left to write. Errors are left to that flush, which
 * reports write-back errors of the file whatever started it. */
int rb_dev_write_behind(rb_dev *dev);

/* Close if still open, then free. */
void rb_dev_free(rb_dev *dev);

/* What the binding may read of an open device (no lock; valid until rb_dev_free):
 * the size cached at open, whether it uses O_DIRECT, the O_DIRECT alignment, whether close
 * has begun, the io_uring engine (NULL unless the engine is io_uring), and a snapshot of the
 * I/O counters. */
uint64_t rb_dev_size(const rb_dev *dev);
/* The device's size now (fstat / BLKGETSIZE64: a system call), for a device whose size is
 * known; the size cached at open otherwise (a passthrough namespace). 0 or -errno. */
int rb_dev_current_size(rb_dev *dev, uint64_t *size);
int rb_dev_odirect(const rb_dev *dev);
size_t rb_dev_alignment(const rb_dev *dev);
int rb_dev_closing(const rb_dev *dev);
struct rb_uring *rb_dev_uring(const rb_dev *dev);
void rb_dev_stats_read(rb_dev *dev, rb_stats_snapshot *out);
/* The lock the device holds (enum rb_dev_lock_state), fixed at open. */
int rb_dev_lock_state(const rb_dev *dev);
/* A name for it: "none", "shared", "exclusive", "unsupported"; "released" once close has begun
 * (the lock goes with the descriptor). */
const char *rb_dev_lock_name(const rb_dev *dev);
/* Test hook: the next flock(2) any device makes fails with errnum (0 clears), so the
 * unsupported-file-system path can be tested on a file system that has flock. */
void rb_dev_inject_lock_errno(int errnum);
/* NVMe passthrough: 1 and *ns filled when the device was opened with uring_cmd, else 0. */
int rb_dev_nvme_ns(const rb_dev *dev, rb_nvme_ns *ns);
/* NVMe passthrough: the namespace's Dataset Management description probed at open (all zeros
 * on other devices, or when the controller did not answer). */
void rb_dev_nvme_dsm(const rb_dev *dev, rb_nvme_dsm *out);
/* Bytes per NVMe command on a passthrough device (0 otherwise). */
size_t rb_dev_max_transfer(const rb_dev *dev);
/* Write streams usable for FDP placement through the block device (0: none). Detected at open
 * for an NVMe block device opened with O_DIRECT on the io_uring engine, when the kernel
 * (Linux >= 6.16) reports max_write_streams > 0 for it. */
unsigned rb_dev_write_streams(const rb_dev *dev);
/* The write stream that places writes on placement id pid (0: none maps to it). */
uint8_t rb_dev_stream_of(const rb_dev *dev, uint16_t pid);
/* FDP reclaim unit handle status of a passthrough device or one with write streams (see
 * rb_nvme_ruh_status); any other device gets RuntimeError("fetch_fdp_status requires
 * use_uring_cmd to be enabled"). Blocks (an NVMe command): call without the GIL. */
int rb_dev_fdp_status(rb_dev *dev, rb_nvme_ruh **out, size_t *n, rb_err *err);
/* The FDP state of the device's NVMe namespace (rb_nvme_fdp_info: enabled, the configuration in
 * use with its reclaim unit nominal size), asked through the namespace's own descriptor: the
 * passthrough character device, or an NVMe block device's admin ioctl. 1 with *out filled, 0
 * when the device is no NVMe namespace (a regular file, another kind of block device), <0 with
 * err (the namespace did not answer). At open, before any I/O (rb_dev_fdp.c). */
int rb_dev_fdp_info(rb_dev *dev, rb_nvme_fdp *out, rb_err *err);
/* 1 when the device is a regular file (neither a block device nor a passthrough namespace). */
int rb_dev_is_file(const rb_dev *dev);

/*
 * Deallocation: telling the device that byte ranges hold nothing any more, so an SSD stops
 * copying them during garbage collection and a sparse file gives the blocks back. A regular
 * file gets holes punched (fallocate PUNCH_HOLE | KEEP_SIZE), a block device discards
 * (BLKDISCARD), an NVMe namespace through passthrough NVMe Dataset Management with the
 * Deallocate attribute, as many ranges per command as the controller takes. A deallocated
 * range reads back as zeros (or, on NVMe, the pattern Identify Namespace DLFEAT names).
 */
enum rb_dealloc_support { RB_DEALLOC_UNKNOWN = 0, RB_DEALLOC_YES = 1, RB_DEALLOC_NO = 2 };
typedef struct rb_dev_range {
    uint64_t off, len;
} rb_dev_range;
/* What the device is known to support: probed at open (NVMe: Identify Controller ONCS; a block
 * device: its queue's discard_max_bytes), else unknown until the first attempt. *why (may be
 * NULL) is the reason for RB_DEALLOC_NO, "" otherwise. */
int rb_dev_dealloc_support(const rb_dev *dev, const char **why);
/* "punch_hole", "discard" or "nvme_dsm": what rb_dev_deallocate issues on this device. */
const char *rb_dev_dealloc_kind(const rb_dev *dev);
/* A block device's discards: "io_uring" (Linux 6.12+: the page cache's range dropped without
 * the device's inode lock, which every buffered write takes), "ioctl" (BLKDISCARD), "" not
 * yet tried or not a block device. */
const char *rb_dev_discard_path(const rb_dev *dev);
/* For tests: discards take BLKDISCARD from now on. */
void rb_dev_discard_force_ioctl(rb_dev *dev);
/* Deallocate n ranges (whole blocks on block devices and NVMe), in order; *cmds counts the
 * commands issued (system calls, or NVMe commands). Stops at the first failure: -errno with
 * err set. A failure that says the device or file system cannot deallocate (EOPNOTSUPP,
 * ENOTTY, ENOSYS; an NVMe controller refusing the command) before any command succeeded marks
 * the device RB_DEALLOC_NO; later calls then fail at once with EOPNOTSUPP. Blocking: call
 * without the GIL and without core locks. */
int rb_dev_deallocate(rb_dev *dev, const rb_dev_range *r, size_t n, uint64_t *cmds, rb_err *err);

/*
 * One synchronous transfer with LMCache's semantics:
 *   write: payload_len bytes from buf, then zeros up to total_len, at offset.
 *   read:  total_len bytes are read at offset (EOF before that is an error); the first
 *          payload_len of them land in buf. Bytes of buf beyond payload_len may be
 *          overwritten only when the read goes straight into an O_DIRECT-aligned buffer
 *          that holds total_len bytes (as LMCache's device does).
 * The plan is at most two iovecs (direct part + bounce) issued with one preadv/pwritev per
 * attempt, plus, for a read with a head (rb_xfer_set_head), the head_len bytes just before
 * offset read into a separate buffer by the same call. Usage: rb_xfer_init (validates, cheap, needs nothing else) ->
 * rb_xfer_prepare (allocates/copies; no GIL needed) -> rb_xfer_run until it returns
 * something other than -EINTR (on -EINTR the caller checks for signals and calls again)
 * -> rb_xfer_release (always).
 * On a passthrough device (uring_cmd) the character device takes no read(2)/write(2): the
 * transfer runs as one request on the io_uring engine (NVMe commands, split at the transfer
 * limit, bounced when unaligned) and rb_xfer_run waits for it.
 */
typedef struct rb_xfer {
    uint64_t offset;
    uint8_t *buf;
    size_t buf_len;
    size_t payload_len;
    size_t total_len;
    int write;

    struct iovec iov[3];
    int iovcnt;
    size_t done;          /* bytes of the plan already transferred */
    size_t want;          /* total bytes of the plan (== total_len) */
    uint8_t *bounce;      /* owned; freed by rb_xfer_release */
    size_t copy_back_off; /* reads: copy bounce[0..copy_back_len) to buf + copy_back_off */
    size_t copy_back_len;
    uint16_t pid;  /* writes on a passthrough device: FDP placement id, 0 = none (set after init) */
    int dsync;     /* writes (not passthrough), set after init: each attempt is pwritev2(RWF_DSYNC), so the
                    * bytes are durable once it returns (only their range is synced, then the drive's
                    * cache flushed); the write log records them as written and flushed */
    uint8_t *head; /* reads: the head_len bytes before offset land here (rb_xfer_set_head) */
    size_t head_len;
} rb_xfer;

int rb_xfer_init(const rb_dev *dev, rb_xfer *x, int write, uint64_t offset, void *buf, size_t buf_len,
                 size_t payload_len, size_t total_len, rb_err *err);
/* Reads on a device with read(2) (not passthrough), between init and prepare: also read the
 * head_len bytes that precede the transfer into head, in the same system call (a slot header
 * read with its payload). The transfer then starts head_len bytes earlier; with O_DIRECT, head
 * and head_len must be aligned. 0, or -EINVAL with err set when the device or the arguments
 * cannot take a head. */
int rb_xfer_set_head(const rb_dev *dev, rb_xfer *x, void *head, size_t head_len, rb_err *err);
int rb_xfer_prepare(rb_dev *dev, rb_xfer *x, rb_err *err);
int rb_xfer_run(rb_dev *dev, rb_xfer *x, rb_err *err);
/* Buffered devices only: one non-blocking attempt (RWF_NOWAIT) that the page cache serves
 * without sleeping. Returns 1 when the transfer is complete, 0 otherwise (progress kept;
 * finish with rb_xfer_run). Never reports an error: the blocking path does. Cheap enough to
 * run while holding the GIL for small transfers (see RB_NOWAIT_MAX). */
int rb_xfer_try_nowait(rb_dev *dev, rb_xfer *x);

/* Test hook: the next n no-wait attempts give up as if the page cache would block, so the
 * blocking fallback can be tested without racing the kernel's readahead. */
void rb_dev_inject_nowait_miss(rb_dev *dev, int n);

/* Largest transfer the binding tries with RWF_NOWAIT before releasing the GIL: a page-cache
 * copy of this size takes about a microsecond, far below the interpreter's switch interval. */
#define RB_NOWAIT_MAX (16u * 1024u)
void rb_xfer_release(rb_xfer *x);

/* O_DIRECT checks shared by every path: offset and total_len multiples of alignment. */
int rb_dev_check_direct(const rb_dev *dev, uint64_t offset, size_t total_len, rb_err *err);

/* Aligned allocation used for every bounce buffer (RuntimeError text on failure). */
void *rb_alloc_aligned(size_t alignment, size_t len, rb_err *err);

#endif /* RB_DEVICE_H */
