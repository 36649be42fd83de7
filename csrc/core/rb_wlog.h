/*
 * rb_wlog.h - test-only write log: records every device write (offset, length, bytes) and
 * every device flush of the process, so a test can rebuild the device images a power loss
 * could leave behind (tests/reliability/crashstates.py).
 *
 * Off by default. The hooks in the write paths (rb_xfer_run / rb_xfer_try_nowait after a
 * successful pwrite/pwritev, the io_uring worker's write completions, rb_dev_flush) cost one
 * relaxed load and a predictable branch while it is off.
 *
 * Log file: the 8-byte magic "RBWLOG01", then records of a 48-byte little-endian header
 *   u32 kind (1 write, 2 flush, 3 deallocation), u32 zero, u64 st_dev, u64 st_ino of the file,
 *   u64 offset (write, deallocation) or barrier (flush), u64 length (0 for flush), u64 sequence
 * followed, for a write, by its bytes. A log started without bytes (rb_wlog_set_journal: the
 * write journal `waf replay` feeds to the wear simulator) records each write as kind 4, its
 * offset and length with no bytes after it. A deallocation carries no bytes: the range reads back
 * as zeros once it is durable (like a write, after a flush that began after it). Sequence numbers count records from 0 in log order.
 * A write is logged once it completed, so its record comes after every record of a write
 * that completed before it. A flush record's barrier is the sequence number the log had
 * reached when the flush started: every write with a smaller sequence number is durable once
 * the flush record exists. A write synced by itself (RWF_DSYNC: a log group) is followed by a
 * kind-5 record with its offset and length and no bytes: that write, and only it, is durable
 * once the record exists (a file system may make it durable with a FUA write, which flushes
 * nothing else); a journal without bytes records a flush there instead.
 *
 * Thread safety: records are appended under one mutex; enabling or disabling takes the same
 * mutex. Enable only while no device write is in flight that should be left out.
 */
#ifndef RB_WLOG_H
#define RB_WLOG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

enum { RB_WLOG_WRITE = 1, RB_WLOG_FLUSH = 2, RB_WLOG_DEALLOC = 3, RB_WLOG_WRITE_LEN = 4, RB_WLOG_SYNCED = 5 };

extern atomic_int rb_wlog_on;

#define RB_WLOG_ENABLED() __builtin_expect(atomic_load_explicit(&rb_wlog_on, memory_order_relaxed), 0)

/* Start logging to path (created or truncated), or stop (path NULL). 0 or -errno. */
int rb_wlog_set(const char *path);

/* The same, but writes are recorded without their bytes (kind 4). 0 or -errno. */
int rb_wlog_set_journal(const char *path);

/* Record len bytes written at off on fd, taken from iov after skipping `skip` bytes. */
void rb_wlog_writev(int fd, uint64_t off, const struct iovec *iov, int iovcnt, size_t skip, size_t len);
void rb_wlog_write(int fd, uint64_t off, const void *buf, size_t len);

/* A completed deallocation of len bytes at off on fd. */
void rb_wlog_dealloc(int fd, uint64_t off, uint64_t len);

/* The write of len bytes at off on fd just logged is durable by itself (RWF_DSYNC). */
void rb_wlog_synced(int fd, uint64_t off, uint64_t len);

/* A flush of fd is starting: returns the barrier to pass to rb_wlog_flush_done. */
uint64_t rb_wlog_flush_begin(void);
/* The flush of fd that began at barrier succeeded. */
void rb_wlog_flush_done(int fd, uint64_t barrier);

#endif /* RB_WLOG_H */
