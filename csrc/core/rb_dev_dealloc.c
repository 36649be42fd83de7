/*
 * rb_dev_dealloc.c - giving freed byte ranges back to the device (see rb_device.h): punched
 * holes in a regular file, discards on a block device, NVMe Dataset Management (deallocate)
 * on a passthrough namespace. What the device supports is probed once at open.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "rb_device_int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "rb_wlog.h"

#ifndef BLOCK_URING_CMD_DISCARD
#define BLOCK_URING_CMD_DISCARD _IO(0x12, 0) /* <linux/fs.h> of Linux 6.12 */
#endif

/* discard_max_bytes of the block device st names (a partition reads its disk's queue):
 * 0 read, -1 sysfs does not say. */
static int blk_discard_max(const struct stat *st, uint64_t *out)
{
    static const char *const fmt[] = {"/sys/dev/block/%u:%u/queue/discard_max_bytes",
                                      "/sys/dev/block/%u:%u/../queue/discard_max_bytes"};
    for (size_t i = 0; i < sizeof(fmt) / sizeof(fmt[0]); i++) {
        char path[96];
        snprintf(path, sizeof(path), fmt[i], major(st->st_rdev), minor(st->st_rdev));
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        unsigned long long v;
        int ok = fscanf(f, "%llu", &v) == 1;
        fclose(f);
        if (ok) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

void rb_dev_dealloc_probe(rb_dev *dev, const struct stat *st)
{
    dev->dealloc = RB_DEALLOC_UNKNOWN;
    if (!dev->writable) {
        dev->dealloc = RB_DEALLOC_NO;
        snprintf(dev->dealloc_why, sizeof(dev->dealloc_why), "the device is open read-only");
        return;
    }
    if (dev->uring_cmd) {
        rb_err e;
        rb_err_clear(&e);
        if (rb_nvme_dsm_caps(dev->fd, dev->ns.nsid, &dev->dsm, &e) < 0) {
            dev->dealloc = RB_DEALLOC_NO;
            snprintf(dev->dealloc_why, sizeof(dev->dealloc_why), "%.190s", e.msg);
        } else if (!dev->dsm.supported) {
            dev->dealloc = RB_DEALLOC_NO;
            snprintf(dev->dealloc_why, sizeof(dev->dealloc_why),
                     "the controller does not support Dataset Management (Identify Controller ONCS bit 2 clear)");
        } else {
            dev->dealloc = RB_DEALLOC_YES;
        }
        return;
    }
    if (dev->is_blk) {
        uint64_t max;
        if (blk_discard_max(st, &max) == 0) {
            if (max == 0) {
                dev->dealloc = RB_DEALLOC_NO;
                snprintf(dev->dealloc_why, sizeof(dev->dealloc_why),
                         "the block device takes no discards (queue/discard_max_bytes is 0)");
            } else {
                dev->dealloc = RB_DEALLOC_YES;
            }
        }
        return; /* sysfs silent: the first discard answers */
    }
    /* A regular file: its file system answers the first punched hole. */
}

void rb_dev_nvme_dsm(const rb_dev *dev, rb_nvme_dsm *out)
{
    *out = dev->dsm;
}

const char *rb_dev_dealloc_kind(const rb_dev *dev)
{
    return dev->uring_cmd ? "nvme_dsm" : dev->is_blk ? "discard" : "punch_hole";
}

const char *rb_dev_discard_path(const rb_dev *dev)
{
    if (!dev->is_blk || dev->uring_cmd)
        return "";
    int s = dev->discard_uring;
    return s > 0 ? "io_uring" : s < 0 ? "ioctl" : "";
}

void rb_dev_discard_force_ioctl(rb_dev *dev)
{
    dev->discard_uring = -1;
}

int rb_dev_dealloc_support(const rb_dev *dev, const char **why)
{
    if (why)
        *why = dev->dealloc == RB_DEALLOC_NO ? dev->dealloc_why : "";
    return dev->dealloc;
}

static int dealloc_nvme(rb_dev *dev, const rb_dev_range *r, size_t n, uint64_t *cmds, rb_err *err)
{
    uint64_t slba[RB_NVME_DSM_MAX_RANGES];
    uint32_t nlb[RB_NVME_DSM_MAX_RANGES];
    unsigned shift = dev->ns.lba_shift;
    uint32_t per_cmd = dev->dsm.max_ranges ? dev->dsm.max_ranges : RB_NVME_DSM_MAX_RANGES;
    uint64_t per_range = dev->dsm.max_range_lbas ? dev->dsm.max_range_lbas : UINT32_MAX;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if ((r[i].off | r[i].len) & ((1ull << shift) - 1))
            return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                              "deallocate: range at offset %llu of %llu bytes is not whole %u-byte blocks",
                              (unsigned long long)r[i].off, (unsigned long long)r[i].len, 1u << shift);
        uint64_t lba = r[i].off >> shift, left = r[i].len >> shift;
        while (left > 0) {
            uint64_t take = left < per_range ? left : per_range;
            slba[k] = lba;
            nlb[k] = (uint32_t)take;
            k++;
            lba += take;
            left -= take;
            if (k == per_cmd) {
                int rc = rb_nvme_deallocate(dev->fd, dev->ns.nsid, slba, nlb, k, err);
                if (rc < 0)
                    return rc;
                (*cmds)++;
                k = 0;
            }
        }
    }
    if (k > 0) {
        int rc = rb_nvme_deallocate(dev->fd, dev->ns.nsid, slba, nlb, k, err);
        if (rc < 0)
            return rc;
        (*cmds)++;
    }
    return 0;
}

/* One range on a block device (BLKDISCARD) or a file (a hole punched, the size kept). */
static int dealloc_one(rb_dev *dev, const rb_dev_range *r, rb_err *err)
{
    int rc;
    do {
        if (dev->is_blk) {
            uint64_t range[2] = {r->off, r->len};
            rc = ioctl(dev->fd, BLKDISCARD, range);
        } else {
            rc = fallocate(dev->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)r->off, (off_t)r->len);
        }
    } while (rc < 0 && errno == EINTR);
    if (rc == 0)
        return 0;
    int e = errno;
    return rb_err_set(err, RB_ERR_OS, e, "%s failed at offset %llu (%llu bytes)",
                      dev->is_blk ? "BLKDISCARD" : "fallocate(PUNCH_HOLE)", (unsigned long long)r->off,
                      (unsigned long long)r->len);
}

/* The errnos that say "this device or file system cannot deallocate", as opposed to a fault. */
static int unsupported_errno(int e)
{
    return e == EOPNOTSUPP || e == ENOTTY || e == ENOSYS;
}

/* Block devices discard through io_uring where the kernel has it (Linux 6.12+): BLKDISCARD holds
 * the device's inode lock across the whole discard (Linux 6.15+), and every buffered write to
 * the device takes that lock, so through the page cache a put waited for each extent's discard
 * and for the writeback queued ahead of it. The io_uring discard drops the range's page cache
 * and issues the same discard without that lock. IOSQE_ASYNC issues it from the kernel's worker,
 * where it may block: bio-based drivers (zram) refuse the non-blocking first attempt.
 *
 * One range on ring: 0 done, -errno (the command's, or the ring's). */
static int discard_uring(struct io_uring *ring, int fd, const rb_dev_range *r)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    if (!sqe)
        return -EBUSY;
    io_uring_prep_rw(IORING_OP_URING_CMD, sqe, fd, NULL, 0, 0);
    sqe->cmd_op = BLOCK_URING_CMD_DISCARD;
    sqe->addr = r->off;
    sqe->addr3 = r->len;
    sqe->flags |= IOSQE_ASYNC;
    int rc;
    do
        rc = io_uring_submit(ring);
    while (rc == -EINTR);
    if (rc < 0)
        return rc;
    struct io_uring_cqe *cqe;
    do
        rc = io_uring_wait_cqe(ring, &cqe);
    while (rc == -EINTR);
    if (rc < 0)
        return rc;
    rc = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    return rc;
}

/* An io_uring discard's failure that is this range's, not the kernel's want of the command:
 * pages of the range dirty or under writeback, which BLKDISCARD truncates instead. */
static int discard_uring_transient(int e)
{
    return e == EBUSY || e == EAGAIN || e == EINTR;
}

/* A block device's or a file's ranges r[0..n), one command each, in order: the discards
 * through io_uring while the kernel takes them there (discard_uring). *done as for
 * dealloc_ranges. 0 or <0 (the first failure). */
static int dealloc_each(rb_dev *dev, const rb_dev_range *r, size_t n, uint64_t *cmds, size_t *done, rb_err *err)
{
    struct io_uring ring;
    int use_ring = dev->is_blk && dev->discard_uring >= 0;
    if (use_ring && io_uring_queue_init(2, &ring, 0) < 0) {
        dev->discard_uring = -1; /* no ring for this process (io_uring disabled, a limit) */
        use_ring = 0;
    }
    int rc = 0;
    size_t k = 0;
    for (; k < n; k++) {
        int res = use_ring ? discard_uring(&ring, dev->fd, &r[k]) : -1;
        if (res == 0) {
            dev->discard_uring = 1;
            (*cmds)++;
            continue;
        }
        rc = dealloc_one(dev, &r[k], err);
        if (rc < 0)
            break;
        (*cmds)++;
        /* BLKDISCARD took what the ring refused for no reason of the range's: this kernel or
         * driver has no io_uring discard. */
        if (use_ring && !discard_uring_transient(-res) && dev->discard_uring == 0) {
            dev->discard_uring = -1;
            use_ring = 0;
            io_uring_queue_exit(&ring);
        }
    }
    if (use_ring)
        io_uring_queue_exit(&ring);
    *done = k;
    return rc;
}

/* Deallocate r[0..n) in order, *cmds counting the commands that succeeded; *done the ranges
 * deallocated before the first failure (all of them or none for NVMe's one batch). */
static int dealloc_ranges(rb_dev *dev, const rb_dev_range *r, size_t n, uint64_t *cmds, size_t *done, rb_err *err)
{
    if (!dev->uring_cmd)
        return dealloc_each(dev, r, n, cmds, done, err);
    int rc = dealloc_nvme(dev, r, n, cmds, err);
    *done = rc == 0 ? n : 0;
    return rc;
}

/* What a batch's outcome rc says of the device: it cannot deallocate (its first command
 * failed as unsupported), or it can (the first success). */
static void dealloc_learn(rb_dev *dev, int rc, uint64_t cmds, const rb_err *err)
{
    if (rc < 0 && unsupported_errno(err->errnum) && cmds == 0) {
        dev->dealloc = RB_DEALLOC_NO;
        snprintf(dev->dealloc_why, sizeof(dev->dealloc_why), "%.190s", err->msg);
    } else if (rc == 0 && dev->dealloc == RB_DEALLOC_UNKNOWN) {
        dev->dealloc = RB_DEALLOC_YES;
    }
}

int rb_dev_deallocate(rb_dev *dev, const rb_dev_range *r, size_t n, uint64_t *cmds, rb_err *err)
{
    *cmds = 0;
    if (n == 0)
        return 0;
    if (dev->dealloc == RB_DEALLOC_NO)
        return rb_err_set(err, RB_ERR_OS, EOPNOTSUPP, "deallocation is not supported: %s", dev->dealloc_why);
    if (rb_dev_enter(dev) < 0)
        return rb_err_set(err, RB_ERR_OS, ESHUTDOWN, "the device is closed");
    size_t done = 0;
    int rc = dealloc_ranges(dev, r, n, cmds, &done, err);
    if (RB_WLOG_ENABLED())
        for (size_t i = 0; i < done; i++)
            rb_wlog_dealloc(dev->fd, r[i].off, r[i].len);
    dealloc_learn(dev, rc, *cmds, err);
    rb_dev_leave(dev);
    return rc;
}
