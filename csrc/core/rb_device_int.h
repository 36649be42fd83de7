/*
 * rb_device_int.h - the rb_dev structure, private to the core: included only by the .c files
 * of csrc/core (through rb_core_int.h for the rb_core ones). The binding sees an opaque rb_dev
 * and reaches it through the accessors in rb_device.h.
 *
 * Field rules: everything but the gate is set by rb_dev_open and read-only until
 * rb_dev_close; users is counted by rb_dev_enter/leave; closed is touched only by the thread
 * running rb_dev_close; gate_mu is a leaf lock (see rb_device.h).
 */
#ifndef RB_DEVICE_INT_H
#define RB_DEVICE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "rb_device.h"
#include "rb_nvme.h"

struct rb_dev {
    int fd;
    int writable;
    int odirect;
    int engine;
    size_t alignment;
    uint64_t size;
    int size_known;         /* regular file or block device: I/O beyond size is refused */
    int is_blk;             /* block device (size from BLKGETSIZE64) */
    int lock_state;         /* enum rb_dev_lock_state */
    int lock_fd;            /* the lock's own descriptor (flock, O_EXCL claim); never the engine's; -1 none */
    int lock_fd2;           /* passthrough: /dev/nvmeXnY held open (O_EXCL, locked) for the lifetime; -1 none */
    int backing_fd;         /* loop device: its backing file, locked too; -1 none */
    int fd_listed;          /* fd is listed for forks (rb_dev_lock_list): an exclusive writer's */
    long lock_pid;          /* the process that took the locks (a forked child holds none of them) */
    struct rb_uring *uring; /* NULL unless engine == RB_ENGINE_IOURING */
    int uring_cmd;          /* NVMe passthrough: every transfer is an NVMe command on the ring */
    rb_nvme_ns ns;          /* uring_cmd: the namespace (id, LBA format, size) */
    size_t max_transfer;    /* uring_cmd: bytes per NVMe command; longer requests are split */
    /* FDP through the block device (Linux >= 6.16 write streams, O_DIRECT): write stream s
     * (1-based) places data on placement id stream_pid[s - 1], in the order the namespace's
     * reclaim unit handle status lists them (the order the kernel's NVMe driver uses). */
    unsigned nstreams;
    uint16_t stream_pid[RB_MAX_WRITE_STREAMS];
    /* Deallocation (rb_dev_dealloc.c): enum rb_dealloc_support, probed at open and settled by
     * the first attempt where the probe could not tell; the reason when it is RB_DEALLOC_NO
     * (written once, before the store that publishes NO); a namespace's DSM limits. */
    _Atomic int dealloc;
    char dealloc_why[200];
    /* A block device's discards through io_uring (rb_dev_dealloc.c): 0 untried, 1 they work,
     * -1 not here (BLKDISCARD then). */
    _Atomic int discard_uring;
    rb_nvme_dsm dsm;
    rb_stats stats;
    _Atomic int nowait_unsupported[2]; /* [write]: RWF_NOWAIT gave EOPNOTSUPP once */
    _Atomic int nowait_fault;          /* test hook: this many no-wait attempts give up */

    /* Admission gate: calls running without the GIL hold a "user" reference. */
    _Atomic long users;
    _Atomic int closing; /* set once close() has begun; no new users after that */
    int closed;          /* fd closed; only read/written by the thread that runs close */
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;
};

/* rb_dev_dealloc.c, for rb_dev_open: what the device says of deallocation (st: its fstat). */
void rb_dev_dealloc_probe(rb_dev *dev, const struct stat *st);

/* rb_dev_lock.c, for rb_dev_open. */

/* open(path, flags | O_CLOEXEC) of a descriptor that will carry a lock, retried on EINTR: the
 * descriptor, or -errno. It is listed until rb_dev_lock_close: a child forked without exec
 * closes every listed descriptor (pthread_atfork), so it never keeps its parent's lock. Such a
 * descriptor must never be given to an io_uring ring (the ring would keep the lock alive until
 * the kernel tears it down, after the writer's death). */
int rb_dev_lock_open(const char *path, int flags);

/* Close fd if this process listed it with rb_dev_lock_open (a forked child has none listed);
 * fd < 0 is ignored. */
void rb_dev_lock_close(int fd);

/* List (rb_dev_lock_list: 0, or -ENOMEM) or unlist (rb_dev_lock_unlist: 1 when it was listed)
 * a descriptor opened otherwise, the writer's data descriptor: a child forked without exec
 * closes it too, so it never keeps the writer's drain mark (rb_dev_drain_mark). The caller
 * unlists before it closes. */
int rb_dev_lock_list(int fd);
int rb_dev_lock_unlist(int fd);

/* The drain mark: an OFD write lock on one byte far past any data (RB_DRAIN_MARK_OFF), taken
 * by an exclusive writer on its data descriptor, the one its engine transfers through. An OFD
 * lock lives as long as its open file description, so a writer that died keeps its mark while
 * any of its writes are still in flight (each holds a reference to that description) or an
 * io_uring ring still has it registered. The next writer, its writer lock already held, waits
 * here for the mark (up to RB_DRAIN_WAIT_MS) so that no write of a dead writer can land after
 * its own. 0 (taken, or the file system has no OFD locks), or -EBUSY with err set. */
#define RB_DRAIN_MARK_OFF ((off_t)1 << 62)
#define RB_DRAIN_WAIT_MS 10000
int rb_dev_drain_mark(int fd, const char *path, rb_err *err);

/* Apply mode (enum rb_dev_lock_mode) to the open descriptor fd of path (st: its fstat). 0 with
 * *state set (enum rb_dev_lock_state) when the open may go on, the lock (if any) then held by
 * fd; -EBUSY when refused, -errno when flock failed otherwise, with err set. on: NULL when fd is
 * path itself, else what fd is to path, named in a refusal ("its backing file /x.img"). */
int rb_dev_lock_fd(int fd, const struct stat *st, const char *path, const char *on, int mode, int *state, rb_err *err);

/* Without taking a lock: refuse (-EBUSY, err set as rb_dev_lock_fd would) when a writer holds
 * the inode st describes (an exclusive flock; for CHECK, one of another process); 0 when none
 * does, or its holder has exited. on as in rb_dev_lock_fd. */
int rb_dev_check_holder(const struct stat *st, const char *path, const char *on, int mode, rb_err *err);

/* rb_dev_backing.c, for rb_dev_open: one lock for a file and every loop device over it.
 * fd (st: its fstat) is the lock descriptor of path, already locked for mode. For a loop device
 * (or a partition of one) its backing file is locked too, for mode, on a descriptor of its own
 * returned in *fd_out (-1 none: other modes, not a loop device, or the backing file cannot be
 * opened by the path sysfs gives - renamed away, deleted, another mount namespace - in which
 * case the holders of its inode in /proc/locks are checked instead). For a regular file and a
 * loop device alike, every other loop device over the same file (compared by device and inode:
 * LOOP_GET_STATUS64) is then checked: held by a writer (its flock) or, for EXCLUSIVE, mounted
 * or claimed by another block device. 0, or -EBUSY (or -errno) with err set and nothing left
 * open. */
int rb_dev_lock_backing(int fd, const struct stat *st, const char *path, int mode, int *fd_out, rb_err *err);

/* rb_dev_lock.c: the mount point of the block device rdev in this mount namespace, and the
 * first block device built on it (sysfs holders), cut to n - 1 bytes: 1 found, 0 none. */
int rb_dev_find_mount(dev_t rdev, char *where, size_t n);
int rb_dev_find_sysfs_holder(dev_t rdev, char *name, size_t n);

/* open(path, flags | O_EXCL) of the block device path (st: its stat): the descriptor, or -errno
 * with err set ("open failed", or for EBUSY who holds it - a raw-block writer (its flock in
 * /proc/locks), a mount (its mount point), a device built on it (sysfs holders), or another
 * process that has it open). EBUSY is retried while no live holder is named: for
 * RB_LOCK_EXIT_WAIT_MS when the flock holder has exited, RB_LOCK_WAIT_MS otherwise. */
int rb_dev_open_excl(const char *path, int flags, const struct stat *st, rb_err *err);

/* Passthrough: apply mode to the namespace block device /dev/nvmeXnY of the character device
 * path (/dev/ngXnY), when it exists: opened read-only (with O_EXCL for EXCLUSIVE) and locked
 * like the character device. *fd_out is the descriptor to keep for the lifetime (SHARED and
 * EXCLUSIVE) or -1 (none kept: other modes, other names, no block device); *state as in
 * rb_dev_lock_fd. 0, or -errno with err set (nothing left open). */
int rb_dev_lock_sibling(const char *path, int mode, int *fd_out, int *state, rb_err *err);

#endif /* RB_DEVICE_INT_H */
