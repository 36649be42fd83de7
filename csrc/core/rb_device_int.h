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

#include "rb_device.h"
#include "rb_nvme.h"

struct rb_dev {
    int fd;
    int writable;
    int odirect;
    int engine;
    size_t alignment;
    uint64_t size;
    int size_known; /* regular file or block device: I/O beyond size is refused */
    int is_blk;     /* block device (size from BLKGETSIZE64) */
    struct rb_uring *uring; /* NULL unless engine == RB_ENGINE_IOURING */
    int uring_cmd;          /* NVMe passthrough: every transfer is an NVMe command on the ring */
    rb_nvme_ns ns;          /* uring_cmd: the namespace (id, LBA format, size) */
    size_t max_transfer;    /* uring_cmd: bytes per NVMe command; longer requests are split */
    /* FDP through the block device (Linux >= 6.16 write streams, O_DIRECT): write stream s
     * (1-based) places data on placement id stream_pid[s - 1], in the order the namespace's
     * reclaim unit handle status lists them (the order the kernel's NVMe driver uses). */
    unsigned nstreams;
    uint16_t stream_pid[RB_MAX_WRITE_STREAMS];
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

#endif /* RB_DEVICE_INT_H */
