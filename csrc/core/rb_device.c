/*
 * rb_device.c - open/close, size, admission gate and the synchronous (posix) transfer path.
 * See rb_device.h for the contract.
 */

#include "rb_device_int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "rb_uring.h"
#include "rb_wlog.h"

static int is_aligned_ptr(const void *p, size_t a)
{
    return a != 0 && ((uintptr_t)p % a) == 0;
}

void *rb_alloc_aligned(size_t alignment, size_t len, rb_err *err)
{
    void *p = NULL;
    size_t a = alignment < sizeof(void *) ? sizeof(void *) : alignment;
    int rc = posix_memalign(&p, a, len ? len : 1);
    if (rc != 0) {
        rb_err_set(err, RB_ERR_RUNTIME, rc, "posix_memalign failed rc=%d", rc);
        return NULL;
    }
    return p;
}

static const char *mode_name(unsigned mode)
{
    if (S_ISFIFO(mode))
        return "a FIFO (named pipe)";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISLNK(mode))
        return "a symbolic link";
    return "neither a regular file nor a device";
}

int rb_dev_check_mode(const char *path, unsigned mode, rb_err *err)
{
    if (S_ISREG(mode) || S_ISBLK(mode) || S_ISCHR(mode))
        return 0;
    return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                      "device path '%s' is %s; a raw-block device must be a regular file or a block or "
                      "character device",
                      path, mode_name(mode));
}

int rb_dev_check_path(const char *path, rb_err *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return 0; /* open reports a missing or unreadable path with its own error */
    return rb_dev_check_mode(path, (unsigned)st.st_mode, err);
}

/* Transfers below this are never split (every NVMe controller takes 128 KiB). */
#define RB_NVME_FALLBACK_TRANSFER ((size_t)128 * 1024)
/* NLB is a 16-bit, 0-based count: one command moves at most 65536 blocks. */
#define RB_NVME_MAX_BLOCKS ((uint64_t)65536)

/* The passthrough rules of rb_dev_open on an open fd: an NVMe namespace character device,
 * identified, with an alignment that is a multiple of its LBA size; the per-command transfer
 * limit, a multiple of the LBA size. */
static int open_passthrough(const rb_dev_config *cfg, int fd, const struct stat *st, rb_nvme_ns *ns,
                            size_t *max_transfer, rb_err *err)
{
    if (cfg->engine != RB_ENGINE_IOURING)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "use_uring_cmd requires use_iouring to be enabled");
    if (!S_ISCHR(st->st_mode))
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "use_uring_cmd requires an NVMe namespace character device (e.g., /dev/ng0n1)");
    int rc = rb_nvme_identify(fd, ns, err);
    if (rc < 0)
        return rc;
    if (cfg->alignment == 0 || cfg->alignment % ns->lba_size != 0)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "alignment (%zu) must be a non-zero multiple of NVMe LBA size (%u)", cfg->alignment,
                          ns->lba_size);
    uint64_t mt = cfg->max_transfer;
    if (mt) {
        if (mt % ns->lba_size != 0)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                              "max_data_transfer_size (%llu) must be a multiple of the NVMe LBA size (%u)",
                              (unsigned long long)mt, ns->lba_size);
    } else if (rb_nvme_sysfs_max_transfer(cfg->path, &mt) < 0 || mt < ns->lba_size) {
        mt = RB_NVME_FALLBACK_TRANSFER;
    }
    if (mt > (RB_NVME_MAX_BLOCKS << ns->lba_shift))
        mt = RB_NVME_MAX_BLOCKS << ns->lba_shift;
    if (mt > ((uint64_t)1 << 30))
        mt = (uint64_t)1 << 30;
    mt -= mt % ns->lba_size;
    if (mt == 0)
        mt = ns->lba_size;
    *max_transfer = (size_t)mt;
    return 0;
}

/* FDP through the block device: an NVMe namespace opened with O_DIRECT whose queue reports
 * max_write_streams > 0 (Linux >= 6.16). Stream s maps to the s-th placement id of the
 * reclaim unit handle status. Anything that does not fit leaves the device without streams:
 * writes are then simply not placed. */
static void probe_write_streams(rb_dev *dev, const struct stat *st)
{
    char p[96];
    snprintf(p, sizeof(p), "/sys/dev/block/%u:%u/queue/max_write_streams", major(st->st_rdev), minor(st->st_rdev));
    FILE *f = fopen(p, "re");
    if (!f)
        return;
    unsigned n = 0;
    int ok = fscanf(f, "%u", &n) == 1;
    fclose(f);
    if (!ok || n == 0)
        return;
    rb_nvme_ns ns;
    rb_nvme_ruh *ruh = NULL;
    size_t nruh = 0;
    rb_err e;
    if (rb_nvme_identify(dev->fd, &ns, &e) < 0 || rb_nvme_ruh_status(dev->fd, ns.nsid, &ruh, &nruh, &e) < 0)
        return;
    if (n > nruh)
        n = (unsigned)nruh;
    if (n > RB_MAX_WRITE_STREAMS)
        n = RB_MAX_WRITE_STREAMS;
    for (unsigned i = 0; i < n; i++)
        dev->stream_pid[i] = ruh[i].pid;
    dev->nstreams = n;
    dev->ns = ns;
    free(ruh);
}

/* What rb_dev_open learns of the device, phase by phase, before the rb_dev exists. */
typedef struct dev_opening {
    int fd, flags, excl;
    int lock_fd, lock_fd2, backing_fd, lock_state;
    int fd_listed; /* fd is listed (rb_dev_lock_list): an exclusive writer's, with its drain mark */
    struct stat st;
    uint64_t size;
    int size_known;
    rb_nvme_ns ns;
    size_t max_transfer;
} dev_opening;

/* The data descriptor: the file lock_fd has open, reopened through /proc/self/fd with flags (a
 * new open file description of the same file, whatever happened to the path since), or by path
 * where /proc is not mounted (dev_check_opened then compares the two). fd or -errno. */
static int reopen_data(const char *path, int lock_fd, int flags)
{
    int fd = -ENOENT;
    if (lock_fd >= 0) {
        char self[40];
        snprintf(self, sizeof(self), "/proc/self/fd/%d", lock_fd);
        do {
            fd = open(self, flags);
        } while (fd < 0 && errno == EINTR);
        if (fd < 0)
            fd = -errno;
    }
    if (fd == -ENOENT) {
        do {
            fd = open(path, flags);
        } while (fd < 0 && errno == EINTR);
        if (fd < 0)
            fd = -errno;
    }
    return fd;
}

/* The lock's own read-only descriptor of cfg->path into o->lock_fd (rb_dev_lock_open: never
 * given to the engine, so the lock goes with the process, not with an io_uring ring the kernel
 * tears down later); an exclusive writer of a block device opens it with O_EXCL
 * (rb_dev_open_excl), so the kernel refuses it while it is mounted or claimed by anyone else,
 * and refuses them while we hold it. A path this user may write but not read gets none
 * (o->lock_fd -1): the data descriptor then carries the lock. 0, or <0 with err set. */
static int dev_open_lock(const rb_dev_config *cfg, dev_opening *o, rb_err *err)
{
    struct stat pst;
    const int flags = O_RDONLY | O_NONBLOCK; /* O_NONBLOCK: a path swapped for a FIFO cannot block */
    o->excl = cfg->lock == RB_LOCK_EXCLUSIVE && !cfg->uring_cmd && stat(cfg->path, &pst) == 0 && S_ISBLK(pst.st_mode);
    if (o->excl) {
        o->lock_fd = rb_dev_open_excl(cfg->path, flags, &pst, err);
        return o->lock_fd < 0 ? o->lock_fd : 0;
    }
    o->lock_fd = rb_dev_lock_open(cfg->path, flags);
    if (o->lock_fd == -EACCES)
        o->lock_fd = -1;
    else if (o->lock_fd < 0)
        return rb_err_set(err, RB_ERR_OS, -o->lock_fd, "open failed");
    return 0;
}

/* Open cfg->path: with a lock asked for, the lock's descriptor first (dev_open_lock), then the
 * data descriptor with the flags cfg asks for (O_NONBLOCK on top, to guard the open) into o->fd.
 * 0, or <0 with err set (the caller closes what is open). */
static int dev_open_fd(const rb_dev_config *cfg, dev_opening *o, rb_err *err)
{
    o->flags = (cfg->writable ? O_RDWR : O_RDONLY) | O_CLOEXEC;
    if (cfg->odirect && !cfg->uring_cmd)
        o->flags |= O_DIRECT;
    int rc = rb_dev_check_path(cfg->path, err);
    if (rc == 0 && cfg->lock != RB_LOCK_NONE)
        rc = dev_open_lock(cfg, o, err);
    if (rc < 0)
        return rc;
    int fd = reopen_data(cfg->path, o->lock_fd, o->flags | O_NONBLOCK);
    if (fd < 0)
        return rb_err_set(err, RB_ERR_OS, -fd, "open failed");
    o->fd = fd;
    return 0;
}

/* Do the descriptors a and b (fstat) reach the same file or device? */
static int same_file(const struct stat *a, const struct stat *b)
{
    if ((a->st_mode & S_IFMT) != (b->st_mode & S_IFMT))
        return 0;
    if (S_ISBLK(a->st_mode) || S_ISCHR(a->st_mode))
        return a->st_rdev == b->st_rdev;
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* The open descriptor's stat in o->st, checked to be a kind of file we take (the same one the
 * lock descriptor has, and the O_EXCL claim a block device needs, present), then made blocking.
 * 0, or <0 with err set. */
static int dev_check_opened(const rb_dev_config *cfg, dev_opening *o, rb_err *err)
{
    if (fstat(o->fd, &o->st) != 0)
        return rb_err_set(err, RB_ERR_OS, errno, "fstat failed");
    int rc = rb_dev_check_mode(cfg->path, (unsigned)o->st.st_mode, err);
    if (rc < 0)
        return rc;
    struct stat lst;
    if (o->lock_fd >= 0 && (fstat(o->lock_fd, &lst) != 0 || !same_file(&lst, &o->st)))
        return rb_err_set(err, RB_ERR_OS, EAGAIN, "device_path changed while it was opened; retry. device_path='%s'",
                          cfg->path);
    if (cfg->lock == RB_LOCK_EXCLUSIVE && !cfg->uring_cmd && S_ISBLK(o->st.st_mode) && !o->excl)
        /* The path became a block device between stat and open: its O_EXCL claim is missing. */
        return rb_err_set(err, RB_ERR_OS, EAGAIN, "device_path changed while it was opened; retry. device_path='%s'",
                          cfg->path);
    /* O_NONBLOCK only guarded the open; I/O on the device blocks as usual. */
    int fl = fcntl(o->fd, F_GETFL);
    if (fl < 0 || fcntl(o->fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        return rb_err_set(err, RB_ERR_OS, errno, "fcntl failed");
    return 0;
}

/* An exclusive writer's data descriptor: listed (a forked child closes it), then its drain
 * mark taken, waiting for a dead writer's writes still in flight (rb_dev_drain_mark). 0, or <0
 * with err set. */
static int dev_take_drain_mark(const rb_dev_config *cfg, dev_opening *o, rb_err *err)
{
    if (rb_dev_lock_list(o->fd) < 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    o->fd_listed = 1;
    return rb_dev_drain_mark(o->fd, cfg->path, err);
}

/* The lock cfg asks for: on the lock descriptor, on a passthrough character device's namespace
 * block device, on a loop device's backing file (and the check of other loop devices over the
 * same file): o->lock_state, o->lock_fd2, o->backing_fd. A lock descriptor left holding
 * nothing (a probe, no flock here) is closed, unless it holds a block device's O_EXCL claim.
 * 0, or <0 with err set. */
static int dev_take_locks(const rb_dev_config *cfg, dev_opening *o, rb_err *err)
{
    if (cfg->lock == RB_LOCK_NONE)
        return 0;
    const int lfd = o->lock_fd >= 0 ? o->lock_fd : o->fd;
    int rc = rb_dev_lock_fd(lfd, &o->st, cfg->path, NULL, cfg->lock, &o->lock_state, err);
    if (rc < 0)
        return rc;
    if (cfg->uring_cmd && S_ISCHR(o->st.st_mode)) {
        int sib_state = RB_LOCKST_NONE;
        rc = rb_dev_lock_sibling(cfg->path, cfg->lock, &o->lock_fd2, &sib_state, err);
        if (rc < 0)
            return rc;
        if (sib_state == RB_LOCKST_UNSUPPORTED)
            o->lock_state = RB_LOCKST_UNSUPPORTED;
    }
    rc = rb_dev_lock_backing(lfd, &o->st, cfg->path, cfg->lock, &o->backing_fd, err);
    if (rc < 0)
        return rc;
    if (o->lock_state != RB_LOCKST_SHARED && o->lock_state != RB_LOCKST_EXCLUSIVE && !o->excl) {
        rb_dev_lock_close(o->lock_fd);
        o->lock_fd = -1;
    }
    return o->lock_state == RB_LOCKST_EXCLUSIVE ? dev_take_drain_mark(cfg, o, err) : 0;
}

/* Close what o holds: the data descriptor, then the lock descriptors (their locks and O_EXCL
 * claims go with them). */
static void dev_opening_close(dev_opening *o)
{
    if (o->fd_listed)
        (void)rb_dev_lock_unlist(o->fd);
    if (o->fd >= 0)
        close(o->fd);
    rb_dev_lock_close(o->backing_fd);
    rb_dev_lock_close(o->lock_fd2);
    rb_dev_lock_close(o->lock_fd);
}

/* The device's size (o->size, o->size_known) and, for passthrough, its namespace and transfer
 * limit (o->ns, o->max_transfer). 0, or <0 with err set. */
static int dev_find_size(const rb_dev_config *cfg, dev_opening *o, rb_err *err)
{
    o->size = (uint64_t)o->st.st_size;
    o->size_known = S_ISREG(o->st.st_mode);
    if (cfg->uring_cmd) {
        int rc = open_passthrough(cfg, o->fd, &o->st, &o->ns, &o->max_transfer, err);
        if (rc < 0)
            return rc;
        o->size = o->ns.nsze << o->ns.lba_shift;
        o->size_known = 1;
    }
    if (S_ISBLK(o->st.st_mode)) {
        uint64_t bsz = 0;
        if (ioctl(o->fd, BLKGETSIZE64, &bsz) == 0) {
            o->size = bsz;
            o->size_known = 1;
        }
    }
    return 0;
}

/* The rb_dev of what o holds (it owns o's descriptors from now on), with its io_uring engine
 * when cfg asks for one. 0, or <0 with err set (nothing allocated; o's descriptors still open). */
static int dev_new(const rb_dev_config *cfg, const dev_opening *o, rb_dev **out, rb_err *err)
{
    rb_dev *dev = calloc(1, sizeof(*dev));
    if (!dev)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    dev->fd = o->fd;
    dev->fd_listed = o->fd_listed;
    dev->lock_fd = o->lock_fd;
    dev->lock_fd2 = o->lock_fd2;
    dev->backing_fd = o->backing_fd;
    dev->lock_pid = (long)getpid();
    dev->lock_state = o->lock_state;
    dev->writable = cfg->writable;
    dev->odirect = (o->flags & O_DIRECT) != 0;
    dev->engine = cfg->engine;
    dev->alignment = cfg->alignment;
    dev->size = o->size;
    dev->size_known = o->size_known;
    dev->is_blk = S_ISBLK(o->st.st_mode);
    dev->uring_cmd = cfg->uring_cmd;
    dev->ns = o->ns;
    dev->max_transfer = o->max_transfer;
    if (dev->is_blk && dev->odirect && cfg->engine == RB_ENGINE_IOURING)
        probe_write_streams(dev, &o->st);
    rb_dev_dealloc_probe(dev, &o->st);
    pthread_mutex_init(&dev->gate_mu, NULL);
    pthread_cond_init(&dev->gate_cv, NULL);
    if (cfg->engine == RB_ENGINE_IOURING) {
        int rc = rb_uring_create(dev, cfg->queue_depth ? cfg->queue_depth : 1, &cfg->sched, &dev->uring, err);
        if (rc < 0) {
            pthread_mutex_destroy(&dev->gate_mu);
            pthread_cond_destroy(&dev->gate_cv);
            free(dev);
            return rc;
        }
    }
    *out = dev;
    return 0;
}

/* Open, check, lock (right after the descriptor is open: nothing reads or writes the device
 * before the lock is held; the passthrough Identify is an admin command, no data), size, then
 * the rb_dev itself. */
int rb_dev_open(const rb_dev_config *cfg, rb_dev **out, rb_err *err)
{
    dev_opening o;
    memset(&o, 0, sizeof(o));
    o.fd = o.lock_fd = o.lock_fd2 = o.backing_fd = -1;
    o.lock_state = RB_LOCKST_NONE;
    int rc;
    if ((rc = dev_open_fd(cfg, &o, err)) < 0 || (rc = dev_check_opened(cfg, &o, err)) < 0 ||
        (rc = dev_take_locks(cfg, &o, err)) < 0 || (rc = dev_find_size(cfg, &o, err)) < 0 ||
        (rc = dev_new(cfg, &o, out, err)) < 0) {
        dev_opening_close(&o); /* the descriptors' locks and O_EXCL claims go with them */
        return rc;
    }
    return 0;
}

int rb_dev_enter(rb_dev *dev)
{
    atomic_fetch_add(&dev->users, 1);
    if (atomic_load(&dev->closing)) {
        rb_dev_leave(dev);
        return -ESHUTDOWN;
    }
    return 0;
}

void rb_dev_leave(rb_dev *dev)
{
    if (atomic_fetch_sub(&dev->users, 1) == 1 && atomic_load(&dev->closing)) {
        pthread_mutex_lock(&dev->gate_mu);
        pthread_cond_broadcast(&dev->gate_cv);
        pthread_mutex_unlock(&dev->gate_mu);
    }
}

int rb_dev_close(rb_dev *dev, rb_err *err)
{
    pthread_mutex_lock(&dev->gate_mu);
    atomic_store(&dev->closing, 1);
    while (atomic_load(&dev->users) > 0)
        pthread_cond_wait(&dev->gate_cv, &dev->gate_mu);
    /* gate_mu stays held: a second closer waits here until the first one finished. */
    int rc = 0;
    if (!dev->closed) {
        if (dev->uring) {
            rb_uring_destroy(dev->uring);
            dev->uring = NULL;
        }
        /* A listed data descriptor was closed in a forked child at the fork: its number may
         * name another file there. */
        int mine = !dev->fd_listed || dev->lock_pid == (long)getpid();
        if (mine && dev->fd_listed)
            (void)rb_dev_lock_unlist(dev->fd);
        if (mine && close(dev->fd) != 0 && errno != EINTR) {
            /* Linux releases the descriptor even when close reports EIO; report it once. */
            rc = rb_err_set(err, RB_ERR_OS, errno, "close failed");
        }
        dev->fd = -1;
        /* The engine has finished with the device: let go of the locks last. They are on
         * descriptors of their own, which no ring ever held; in a forked child (another pid)
         * they were closed at the fork and the numbers may name other files now. */
        if (dev->lock_pid == (long)getpid()) {
            rb_dev_lock_close(dev->backing_fd);
            rb_dev_lock_close(dev->lock_fd2);
            rb_dev_lock_close(dev->lock_fd);
        }
        dev->lock_fd = dev->lock_fd2 = dev->backing_fd = -1;
        dev->closed = 1;
    }
    pthread_mutex_unlock(&dev->gate_mu);
    return rc;
}

int rb_dev_flush(rb_dev *dev, rb_err *err)
{
    uint64_t wlog_barrier = RB_WLOG_ENABLED() ? rb_wlog_flush_begin() : 0;
    if (dev->uring_cmd) {
        /* fsync(2) does not reach a namespace through its generic character device: send the
         * NVMe Flush command itself. */
        int rc = rb_nvme_flush(dev->fd, dev->ns.nsid, err);
        if (rc == 0 && RB_WLOG_ENABLED())
            rb_wlog_flush_done(dev->fd, wlog_barrier);
        return rc;
    }
    for (;;) {
        if (fdatasync(dev->fd) == 0) {
            if (RB_WLOG_ENABLED())
                rb_wlog_flush_done(dev->fd, wlog_barrier);
            return 0;
        }
        if (errno != EINTR)
            return rb_err_set(err, RB_ERR_OS, errno, "fdatasync failed");
    }
}

int rb_dev_write_behind(rb_dev *dev)
{
    if (dev->uring_cmd || dev->odirect)
        return 0;
    return sync_file_range(dev->fd, 0, 0, SYNC_FILE_RANGE_WRITE) == 0;
}

void rb_dev_free(rb_dev *dev)
{
    if (!dev)
        return;
    rb_dev_close(dev, NULL);
    pthread_mutex_destroy(&dev->gate_mu);
    pthread_cond_destroy(&dev->gate_cv);
    free(dev);
}

uint64_t rb_dev_size(const rb_dev *dev)
{
    return dev->size;
}

int rb_dev_odirect(const rb_dev *dev)
{
    return dev->odirect;
}

size_t rb_dev_alignment(const rb_dev *dev)
{
    return dev->alignment;
}

int rb_dev_nvme_ns(const rb_dev *dev, rb_nvme_ns *ns)
{
    if (!dev->uring_cmd)
        return 0;
    *ns = dev->ns;
    return 1;
}

size_t rb_dev_max_transfer(const rb_dev *dev)
{
    return dev->uring_cmd ? dev->max_transfer : 0;
}

unsigned rb_dev_write_streams(const rb_dev *dev)
{
    return dev->nstreams;
}

uint8_t rb_dev_stream_of(const rb_dev *dev, uint16_t pid)
{
    for (unsigned i = 0; i < dev->nstreams; i++)
        if (dev->stream_pid[i] == pid)
            return (uint8_t)(i + 1);
    return 0;
}

int rb_dev_fdp_status(rb_dev *dev, rb_nvme_ruh **out, size_t *n, rb_err *err)
{
    *out = NULL;
    *n = 0;
    if (!dev->uring_cmd && !dev->nstreams)
        return rb_err_set(err, RB_ERR_RUNTIME, EINVAL, "fetch_fdp_status requires use_uring_cmd to be enabled");
    if (rb_dev_enter(dev) < 0)
        return rb_err_set(err, RB_ERR_RUNTIME, ESHUTDOWN, "device is closed");
    int rc = rb_nvme_ruh_status(dev->fd, dev->ns.nsid, out, n, err);
    rb_dev_leave(dev);
    return rc;
}

int rb_dev_closing(const rb_dev *dev)
{
    return atomic_load(&dev->closing);
}

struct rb_uring *rb_dev_uring(const rb_dev *dev)
{
    return dev->uring;
}

void rb_dev_stats_read(rb_dev *dev, rb_stats_snapshot *out)
{
    rb_stats_read(&dev->stats, out);
}

int rb_dev_check_direct(const rb_dev *dev, uint64_t offset, size_t total_len, rb_err *err)
{
    if (!dev->odirect)
        return 0;
    if (dev->alignment == 0)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "O_DIRECT requires a non-zero alignment");
    if (offset % dev->alignment)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "O_DIRECT requires aligned offset");
    if (total_len % dev->alignment)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "O_DIRECT requires aligned total_len");
    return 0;
}

int rb_dev_check_range(const rb_dev *dev, int write, uint64_t offset, size_t total_len, rb_err *err)
{
    if (!dev->size_known)
        return 0;
    uint64_t size = dev->size;
    if (offset <= size && total_len <= size - offset)
        return 0;
    /* Past the size cached at open: look again (cold path), a file may have grown. */
    uint64_t now = 0;
    if (dev->is_blk) {
        if (ioctl(dev->fd, BLKGETSIZE64, &now) != 0)
            now = 0;
    } else {
        struct stat st;
        if (fstat(dev->fd, &st) == 0 && st.st_size > 0)
            now = (uint64_t)st.st_size;
    }
    if (now > size)
        size = now;
    if (offset <= size && total_len <= size - offset)
        return 0;
    if (write)
        return rb_err_set(err, RB_ERR_OS, ENOSPC,
                          "write beyond the end of the device: offset=%llu + total_len=%zu > device size %llu",
                          (unsigned long long)offset, total_len, (unsigned long long)size);
    /* LMCache's exact text (its callers and tests match on it). */
    return rb_err_set(err, RB_ERR_RUNTIME, EIO, "unexpected EOF");
}

int rb_xfer_init(const rb_dev *dev, rb_xfer *x, int write, uint64_t offset, void *buf, size_t buf_len,
                 size_t payload_len, size_t total_len, rb_err *err)
{
    memset(x, 0, sizeof(*x));
    x->write = write;
    x->offset = offset;
    x->buf = buf;
    x->buf_len = buf_len;
    x->payload_len = payload_len;
    x->total_len = total_len;
    if (payload_len > buf_len) {
        if (write)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "payload_len exceeds buffer length");
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "output buffer too small: cap=%zu need=%zu", buf_len, payload_len);
    }
    if (total_len < payload_len)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "total_len must be >= payload_len");
    if (offset > (uint64_t)INT64_MAX || total_len > (uint64_t)INT64_MAX - offset)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "offset + total_len overflows: offset=%llu total_len=%zu",
                          (unsigned long long)offset, total_len);
    int rc = rb_dev_check_direct(dev, offset, total_len, err);
    if (rc < 0)
        return rc;
    return rb_dev_check_range(dev, write, offset, total_len, err);
}

int rb_xfer_set_head(const rb_dev *dev, rb_xfer *x, void *head, size_t head_len, rb_err *err)
{
    if (dev->uring_cmd || x->write || x->offset < head_len)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "a transfer head needs a read(2) device and a read");
    if (dev->odirect && (!is_aligned_ptr(head, dev->alignment) || head_len % dev->alignment))
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "O_DIRECT requires an aligned transfer head");
    x->head = head;
    x->head_len = head_len;
    x->offset -= head_len;
    return 0;
}

/* Append the iovec [base, base + len) to x's plan. */
static void xfer_iov_add(rb_xfer *x, void *base, size_t len)
{
    x->iov[x->iovcnt].iov_base = base;
    x->iov[x->iovcnt].iov_len = len;
    x->iovcnt++;
}

/* How much of the transfer the caller's (suitably aligned) memory takes directly: the payload,
 * with O_DIRECT the whole transfer for a read that fits, or the payload's aligned prefix when
 * padding follows it. */
static size_t xfer_direct_len(const rb_dev *dev, const rb_xfer *x)
{
    size_t direct = x->payload_len;
    if (dev->odirect) {
        if (!x->write && x->buf_len >= x->total_len)
            direct = x->total_len; /* read everything straight into the buffer */
        else if (x->total_len != x->payload_len)
            direct -= direct % dev->alignment; /* aligned prefix; the tail is bounced */
    }
    return direct;
}

/* The caller's memory takes the first direct bytes; the rest goes through a bounce (aligned
 * for O_DIRECT; zeros to write, or padding to read and drop, when buffered). */
static int xfer_plan_direct(rb_dev *dev, rb_xfer *x, rb_err *err)
{
    const size_t a = dev->alignment;
    size_t direct = xfer_direct_len(dev, x);
    if (direct)
        xfer_iov_add(x, x->buf, direct);
    size_t rest = x->total_len - direct;
    if (!rest)
        return 0;
    size_t tail = x->payload_len > direct ? x->payload_len - direct : 0;
    if (dev->odirect) {
        x->bounce = rb_alloc_aligned(a, rest, err);
        if (!x->bounce)
            return -ENOMEM;
        if (x->write) {
            memcpy(x->bounce, x->buf + direct, tail);
            memset(x->bounce + tail, 0, rest - tail);
        }
    } else {
        x->bounce = calloc(1, rest);
        if (!x->bounce)
            return rb_err_set(err, RB_ERR_RUNTIME, ENOMEM, "bounce allocation failed: %zu bytes", rest);
    }
    xfer_iov_add(x, x->bounce, rest);
    x->copy_back_off = direct;
    x->copy_back_len = x->write ? 0 : tail;
    return 0;
}

/* O_DIRECT with unaligned caller memory: one aligned bounce of the whole transfer. */
static int xfer_plan_bounce(rb_dev *dev, rb_xfer *x, rb_err *err)
{
    x->bounce = rb_alloc_aligned(dev->alignment, x->total_len, err);
    if (!x->bounce)
        return -ENOMEM;
    if (x->write) {
        memcpy(x->bounce, x->buf, x->payload_len);
        memset(x->bounce + x->payload_len, 0, x->total_len - x->payload_len);
    }
    xfer_iov_add(x, x->bounce, x->total_len);
    x->copy_back_off = 0;
    x->copy_back_len = x->write ? 0 : x->payload_len;
    return 0;
}

/* Build the iovecs of the transfer (the head's, then at most two); see rb_device.h. */
int rb_xfer_prepare(rb_dev *dev, rb_xfer *x, rb_err *err)
{
    x->want = x->head_len + x->total_len;
    x->iovcnt = 0;
    if (dev->uring_cmd)
        return 0; /* the engine plans (and bounces) the transfer itself */
    if (x->head_len)
        xfer_iov_add(x, x->head, x->head_len);
    if (!dev->odirect || is_aligned_ptr(x->buf, dev->alignment))
        return xfer_plan_direct(dev, x, err); /* the caller's memory can take (part of) it */
    return xfer_plan_bounce(dev, x, err);
}

/* One preadv2/pwritev2 attempt over what is left of the plan; returns its result (errno kept). */
static ssize_t xfer_attempt(rb_dev *dev, rb_xfer *x, int flags)
{
    /* Skip the iovecs (or the part of one) already transferred. */
    struct iovec iov[3];
    int n = 0;
    size_t skip = x->done;
    for (int i = 0; i < x->iovcnt; i++) {
        size_t l = x->iov[i].iov_len;
        if (skip >= l) {
            skip -= l;
            continue;
        }
        iov[n].iov_base = (uint8_t *)x->iov[i].iov_base + skip;
        iov[n].iov_len = l - skip;
        skip = 0;
        n++;
    }
    off_t off = (off_t)(x->offset + x->done);
    if (n == 1 && flags == 0)
        return x->write ? pwrite(dev->fd, iov[0].iov_base, iov[0].iov_len, off)
                        : pread(dev->fd, iov[0].iov_base, iov[0].iov_len, off);
    return x->write ? pwritev2(dev->fd, iov, n, off, flags) : preadv2(dev->fd, iov, n, off, flags);
}

static void xfer_account(rb_dev *dev, rb_xfer *x, size_t req, ssize_t r)
{
    rb_stats *st = &dev->stats;
    if (x->write) {
        RB_STAT_ADD(st, write_attempts, 1);
        RB_STAT_ADD(st, write_submitted_bytes, req);
    } else {
        RB_STAT_ADD(st, read_attempts, 1);
        RB_STAT_ADD(st, read_submitted_bytes, req);
    }
    if (x->bounce) {
        RB_STAT_ADD(st, bounce_attempts, 1);
        RB_STAT_ADD(st, bounce_submitted_bytes, req);
    }
    if (r <= 0) {
        RB_STAT_ADD(st, failed_attempts, 1);
        return;
    }
    RB_STAT_ADD(st, completed_attempts, 1);
    if (x->write)
        RB_STAT_ADD(st, write_completed_bytes, r);
    else
        RB_STAT_ADD(st, read_completed_bytes, r);
    if ((size_t)r < req)
        RB_STAT_ADD(st, short_io_resubmits, 1);
}

static void xfer_finish(rb_xfer *x)
{
    if (x->copy_back_len) {
        memcpy(x->buf + x->copy_back_off, x->bounce, x->copy_back_len);
        x->copy_back_len = 0;
    }
}

void rb_dev_inject_nowait_miss(rb_dev *dev, int n)
{
    atomic_store_explicit(&dev->nowait_fault, n, memory_order_relaxed);
}

int rb_xfer_try_nowait(rb_dev *dev, rb_xfer *x)
{
    if (x->done >= x->want)
        return 1;
    if (dev->odirect || dev->uring_cmd ||
        atomic_load_explicit(&dev->nowait_unsupported[x->write], memory_order_relaxed))
        return 0;
    size_t req = x->want - x->done;
    ssize_t r;
    if (atomic_load_explicit(&dev->nowait_fault, memory_order_relaxed) > 0) {
        atomic_fetch_sub_explicit(&dev->nowait_fault, 1, memory_order_relaxed);
        errno = EAGAIN;
        r = -1;
    } else {
        r = xfer_attempt(dev, x, RWF_NOWAIT);
    }
    if (r <= 0) {
        /* EAGAIN (would block), EOF or a real error: the blocking path decides. A file
         * system without NOWAIT support for this direction (ext4 buffered writes) says so
         * once; after that the probe is skipped. */
        if (r < 0 && errno == EOPNOTSUPP)
            atomic_store_explicit(&dev->nowait_unsupported[x->write], 1, memory_order_relaxed);
        RB_STAT_ADD(&dev->stats, nowait_misses, 1);
        return 0;
    }
    RB_STAT_ADD(&dev->stats, nowait_hits, 1);
    xfer_account(dev, x, req, r);
    if (RB_WLOG_ENABLED() && x->write)
        rb_wlog_writev(dev->fd, x->offset + x->done, x->iov, x->iovcnt, x->done, (size_t)r);
    x->done += (size_t)r;
    if (x->done < x->want)
        return 0;
    xfer_finish(x);
    return 1;
}

/* A failed or empty attempt of rb_xfer_run (r <= 0, e its errno): -EINTR, or the error. */
static int xfer_failed(const rb_xfer *x, ssize_t r, int e, rb_err *err)
{
    if (r == 0)
        return rb_err_set(err, RB_ERR_RUNTIME, EIO, x->write ? "pwrite made no progress" : "unexpected EOF");
    if (e == EINTR)
        return -EINTR;
    return rb_err_set(err, RB_ERR_OS, e,
                      x->write ? (x->dsync ? "pwritev2(RWF_DSYNC) failed" : "pwrite failed") : "pread failed");
}

/* r bytes written at x->done: into the write log, and a synced write's durability with them
 * (its own range alone: rb_wlog.h). */
static void xfer_logged(rb_dev *dev, const rb_xfer *x, size_t r)
{
    rb_wlog_writev(dev->fd, x->offset + x->done, x->iov, x->iovcnt, x->done, r);
    if (x->dsync)
        rb_wlog_synced(dev->fd, x->offset + x->done, r);
}

int rb_xfer_run(rb_dev *dev, rb_xfer *x, rb_err *err)
{
    if (dev->uring_cmd && x->dsync)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "a write synced by itself (RWF_DSYNC) on a passthrough device");
    if (dev->uring_cmd && x->done < x->want) {
        int rc = rb_uring_sync(dev->uring, x->write ? RB_REQ_WRITE : RB_REQ_READ, x->offset, x->buf, x->buf_len,
                               x->payload_len, x->total_len, x->pid, err);
        if (rc == 0)
            x->done = x->want;
        return rc;
    }
    while (x->done < x->want) {
        size_t req = x->want - x->done;
        ssize_t r = xfer_attempt(dev, x, x->write && x->dsync ? RWF_DSYNC : 0);
        int e = errno;
        xfer_account(dev, x, req, r);
        if (r <= 0)
            return xfer_failed(x, r, e, err);
        if (RB_WLOG_ENABLED() && x->write)
            xfer_logged(dev, x, (size_t)r);
        x->done += (size_t)r;
    }
    xfer_finish(x);
    return 0;
}

void rb_xfer_release(rb_xfer *x)
{
    free(x->bounce);
    x->bounce = NULL;
}

int rb_dev_current_size(rb_dev *dev, uint64_t *size)
{
    *size = dev->size;
    if (!dev->size_known || dev->uring_cmd)
        return 0; /* a namespace's size is the one identified at open */
    if (dev->is_blk) {
        uint64_t now;
        if (ioctl(dev->fd, BLKGETSIZE64, &now) != 0)
            return -errno;
        *size = now;
        return 0;
    }
    struct stat st;
    if (fstat(dev->fd, &st) != 0)
        return -errno;
    *size = st.st_size > 0 ? (uint64_t)st.st_size : 0;
    return 0;
}
