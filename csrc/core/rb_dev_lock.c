/*
 * rb_dev_lock.c - one writer per device: the flock(2) and O_EXCL rules rb_dev_open applies
 * (enum rb_dev_lock_mode in rb_device.h), and the diagnosis of a refusal: who holds the device,
 * found in /proc/locks (flock holders), /proc/self/mountinfo (mounts), sysfs holders (a
 * device-mapper or RAID device built on it) and /proc/<pid>/fd (another opener). Diagnosis runs
 * only on the refusal path; the open of a device nobody holds costs one flock call.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "rb_device_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

static _Atomic int lock_fault; /* test hook: errno the next flock reports */

/* See rb_device.h: the next flock_nb call fails with errnum (0 clears). */
void rb_dev_inject_lock_errno(int errnum)
{
    atomic_store(&lock_fault, errnum);
}

/* flock(fd, op | LOCK_NB), retried on EINTR: 0 or -errno. */
static int flock_nb(int fd, int op)
{
    int e = atomic_exchange(&lock_fault, 0);
    if (e > 0)
        return -e;
    for (;;) {
        if (flock(fd, op | LOCK_NB) == 0)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
}

/* The file system cannot lock (rather than: someone holds the lock). */
static int lock_unsupported(int e)
{
    return e == ENOLCK || e == EOPNOTSUPP || e == EINVAL || e == ENOSYS;
}

typedef struct lock_holder {
    int found; /* an flock on the inode is listed */
    int write; /* the one chosen is an exclusive (WRITE) lock */
    long pid;  /* as /proc/locks prints it; <= 0 when not visible from this pid namespace */
} lock_holder;

/*
 * The flock holder of the inode st describes, from /proc/locks. Lines read
 * "N: FLOCK  ADVISORY  WRITE <pid> <maj>:<min>:<ino> 0 EOF", major and minor of the file
 * system's device in hex; waiters ("N: -> FLOCK ...") and other lock kinds are skipped. An
 * exclusive holder is preferred to a shared one, and a holder in another process to this one.
 * h->found is 0 when none is listed (or /proc/locks cannot be read).
 */
static void find_flock_holder(const struct stat *st, lock_holder *h)
{
    memset(h, 0, sizeof(*h));
    FILE *f = fopen("/proc/locks", "re");
    if (!f)
        return;
    const long self = (long)getpid();
    int best = -1;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        char kind[16], rw[16];
        long pid;
        unsigned maj, min;
        unsigned long long ino;
        if (sscanf(line, "%*d: %15s %*s %15s %ld %x:%x:%llu", kind, rw, &pid, &maj, &min, &ino) != 6)
            continue;
        if (strcmp(kind, "FLOCK") != 0 || maj != major(st->st_dev) || min != minor(st->st_dev) ||
            ino != (unsigned long long)st->st_ino)
            continue;
        int write = strcmp(rw, "WRITE") == 0;
        int score = write * 2 + (pid != self);
        if (score > best) {
            best = score;
            h->found = 1;
            h->write = write;
            h->pid = pid;
        }
    }
    fclose(f);
}

/* Has process pid exited (no /proc entry, or a zombie)? Its locks are then on their way out: the
 * kernel drops them as it releases its files, which for a file registered with an io_uring ring
 * happens when the ring is torn down, tens of milliseconds after the exit. */
static int process_exited(long pid)
{
    if (pid <= 0)
        return 0;
    char p[48], buf[512];
    snprintf(p, sizeof(p), "/proc/%ld/stat", pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces and ')' */
    return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

/* "pid 1234", or why there is none to name. */
static void describe_holder(const lock_holder *h, char *buf, size_t n)
{
    if (!h->found)
        snprintf(buf, n, "pid not found in /proc/locks");
    else if (h->pid <= 0)
        snprintf(buf, n, "pid not visible here");
    else if (process_exited(h->pid))
        snprintf(buf, n, "pid %ld, exited", h->pid);
    else
        snprintf(buf, n, "pid %ld", h->pid);
}

/* The refusal of mode by holder h (found or not): RB_ERR_OS, EBUSY. Short texts, the path last:
 * rb_err's 256 bytes must leave room for a long path. */
static int refuse(const char *path, int mode, const lock_holder *h, rb_err *err)
{
    char who[40];
    describe_holder(h, who, sizeof(who));
    const char *where = h->found && h->pid == (long)getpid() ? " in this process" : "";
    if (h->found && !h->write && mode == RB_LOCK_EXCLUSIVE)
        return rb_err_set(err, RB_ERR_OS, EBUSY,
                          "device is being read%s (%s, shared lock: inspect, verify); wait for it to finish, then "
                          "retry. device_path='%s'",
                          where, who, path);
    if (mode == RB_LOCK_SHARED)
        return rb_err_set(err, RB_ERR_OS, EBUSY,
                          "device is held by a raw-block writer%s (%s): a reader could see its cache half-written; "
                          "stop the writer first. device_path='%s'",
                          where, who, path);
    return rb_err_set(err, RB_ERR_OS, EBUSY,
                      "device is held by another raw-block writer%s (%s): two writers on one device corrupt each "
                      "other's cache; %s. device_path='%s'",
                      where, who, *where ? "close the other first" : "stop that process or use another device", path);
}

/* CLOCK_MONOTONIC in milliseconds. */
static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sleep ms milliseconds, resumed after a signal. */
static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* See rb_device_int.h. A refused lock is retried while the holder may be on its way out:
 * shared holders and a holder that let go while /proc/locks was read for RB_LOCK_WAIT_MS, a
 * holder whose process has exited for RB_LOCK_EXIT_WAIT_MS; a live exclusive holder at once. */
/* A lock of mode is held on fd: a probe (RB_LOCK_CHECK) lets it go at once; *state says
 * what is kept. */
static void lock_taken(int fd, int mode, int *state)
{
    if (mode == RB_LOCK_CHECK) {
        (void)flock(fd, LOCK_UN); /* only a probe: nobody else writes it */
        return;
    }
    *state = mode == RB_LOCK_EXCLUSIVE ? RB_LOCKST_EXCLUSIVE : RB_LOCKST_SHARED;
}

/* After a refused attempt that began waiting at start, holder h: 1 when the refusal is final
 * (a live exclusive holder, or the wait for this kind of holder is over), 0 to try again.
 * Shared holders (udev probing the device, a short read), a holder that let go before
 * /proc/locks was read and one whose process has exited are waited out. */
static int lock_refusal_final(const lock_holder *h, long long start)
{
    long long waited = now_ms() - start;
    int exited = h->found && process_exited(h->pid);
    return (h->found && h->write && !exited) || waited >= (exited ? RB_LOCK_EXIT_WAIT_MS : RB_LOCK_WAIT_MS);
}

/* See rb_device_int.h. A refused lock is retried while the holder may be on its way out:
 * shared holders and a holder that let go while /proc/locks was read for RB_LOCK_WAIT_MS, a
 * holder whose process has exited for RB_LOCK_EXIT_WAIT_MS; a live exclusive holder at once. */
int rb_dev_lock_fd(int fd, const struct stat *st, const char *path, int mode, int *state, rb_err *err)
{
    *state = RB_LOCKST_NONE;
    if (mode == RB_LOCK_NONE)
        return 0;
    const int op = mode == RB_LOCK_EXCLUSIVE ? LOCK_EX : LOCK_SH;
    const long long start = now_ms();
    lock_holder h;
    for (int attempt = 0;; attempt++) {
        int rc = flock_nb(fd, op);
        if (rc == 0) {
            lock_taken(fd, mode, state);
            return 0;
        }
        if (lock_unsupported(-rc)) {
            *state = RB_LOCKST_UNSUPPORTED;
            return 0;
        }
        if (rc != -EWOULDBLOCK)
            return rb_err_set(err, RB_ERR_OS, -rc, "flock failed on device_path='%s'", path);
        find_flock_holder(st, &h);
        /* A shared probe is only blocked by an exclusive lock: one of this process's is allowed. */
        if (mode == RB_LOCK_CHECK && h.found && h.write && h.pid == (long)getpid())
            return 0;
        if (lock_refusal_final(&h, start))
            break;
        sleep_ms(attempt < 5 ? 2 : 20);
    }
    return refuse(path, mode, &h, err);
}

/* The mount point of the block device rdev in /proc/self/mountinfo (octal escapes kept), cut to
 * n - 1 bytes (n > 0): 1 found, 0 not mounted in this mount namespace. */
static int find_mount(dev_t rdev, char *where, size_t n)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f)) {
        unsigned maj, min;
        char mnt[1024];
        if (sscanf(line, "%*u %*u %u:%u %*s %1023s", &maj, &min, mnt) == 3 && maj == major(rdev) &&
            min == minor(rdev)) {
            size_t l = strlen(mnt) < n ? strlen(mnt) : n - 1; /* a long mount point is cut */
            memcpy(where, mnt, l);
            where[l] = '\0';
            found = 1;
        }
    }
    fclose(f);
    return found;
}

/* The first device the kernel lists as built on rdev (/sys/dev/block/M:m/holders): 1 found. */
static int find_sysfs_holder(dev_t rdev, char *name, size_t n)
{
    char p[96];
    snprintf(p, sizeof(p), "/sys/dev/block/%u:%u/holders", major(rdev), minor(rdev));
    DIR *d = opendir(p);
    if (!d)
        return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(name, n, "%.40s", e->d_name); /* dm-0, md127: short */
        found = 1;
    }
    closedir(d);
    return found;
}

/* A process other than this one with the block device rdev open (a scan of /proc/<pid>/fd):
 * its pid, or 0. Which of them holds it exclusively, /proc does not say. */
static long find_opener(dev_t rdev)
{
    DIR *proc = opendir("/proc");
    if (!proc)
        return 0;
    const long self = (long)getpid();
    long found = 0;
    struct dirent *pe;
    while (!found && (pe = readdir(proc)) != NULL) {
        char *end;
        long pid = strtol(pe->d_name, &end, 10);
        if (*end != '\0' || pid <= 0 || pid == self)
            continue;
        char dir[64];
        snprintf(dir, sizeof(dir), "/proc/%ld/fd", pid);
        DIR *fds = opendir(dir);
        if (!fds)
            continue;
        struct dirent *fe;
        while (!found && (fe = readdir(fds)) != NULL) {
            if (fe->d_name[0] == '.')
                continue;
            struct stat st; /* of what the fd link points to */
            if (fstatat(dirfd(fds), fe->d_name, &st, 0) == 0 && S_ISBLK(st.st_mode) && st.st_rdev == rdev)
                found = pid;
        }
        closedir(fds);
    }
    closedir(proc);
    return found;
}

/* Why an O_EXCL open of the block device path (st: its stat) gave EBUSY, into err (RB_ERR_OS,
 * EBUSY). Returns how long the caller may wait for it to pass: 0 when a live holder is named (a
 * raw-block writer, a mount, a device built on it), RB_LOCK_EXIT_WAIT_MS when the flock holder
 * has exited (its claim goes with its files), RB_LOCK_WAIT_MS otherwise (a short-lived exclusive
 * opener such as mkfs or blkid, or a claim released as we looked). The scan of /proc/<pid>/fd
 * for another opener runs only when last is set. */
static int excl_busy(const char *path, const struct stat *st, int last, rb_err *err)
{
    lock_holder h;
    find_flock_holder(st, &h);
    if (h.found && h.write) {
        refuse(path, RB_LOCK_EXCLUSIVE, &h, err);
        return process_exited(h.pid) ? RB_LOCK_EXIT_WAIT_MS : 0;
    }
    char what[72];
    if (find_mount(st->st_rdev, what, sizeof(what))) {
        rb_err_set(err, RB_ERR_OS, EBUSY,
                   "device is mounted on %s: a raw-block cache would destroy its file system; unmount it or use "
                   "another device. device_path='%s'",
                   what, path);
        return 0;
    }
    if (find_sysfs_holder(st->st_rdev, what, sizeof(what))) {
        rb_err_set(err, RB_ERR_OS, EBUSY,
                   "device is in use by %s (device-mapper, RAID or similar; O_EXCL open: EBUSY); use another "
                   "device. device_path='%s'",
                   what, path);
        return 0;
    }
    long pid = last ? find_opener(st->st_rdev) : 0;
    char by[48] = "";
    if (pid > 0)
        snprintf(by, sizeof(by), " (pid %ld has it open)", pid);
    rb_err_set(err, RB_ERR_OS, EBUSY,
               "device is mounted or opened exclusively by another process%s (O_EXCL open: EBUSY); use another "
               "device. device_path='%s'",
               by, path);
    return RB_LOCK_WAIT_MS;
}

/* See rb_device_int.h. */
int rb_dev_open_excl(const char *path, int flags, const struct stat *st, rb_err *err)
{
    const long long start = now_ms();
    int last = 0;
    for (int attempt = 0;; attempt++) {
        int fd;
        do {
            fd = open(path, flags | O_EXCL);
        } while (fd < 0 && errno == EINTR);
        if (fd >= 0)
            return fd;
        if (errno != EBUSY)
            return rb_err_set(err, RB_ERR_OS, errno, "open failed");
        int wait = excl_busy(path, st, last, err);
        if (last || wait == 0)
            return -EBUSY;
        if (now_ms() - start >= wait)
            last = 1; /* one more try, then the full diagnosis */
        else
            sleep_ms(attempt < 5 ? 2 : 20);
    }
}

/* The block device of the NVMe namespace whose generic character device is path
 * (/dev/ngXnY -> /dev/nvmeXnY) in blk, its stat in *st: 1, or 0 when path is no such device or
 * the namespace has no block device (e.g. a format the block layer skips). */
static int sibling_path(const char *path, char *blk, size_t n, struct stat *st)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    unsigned ctrl, nsn;
    char tail;
    if (sscanf(base, "ng%un%u%c", &ctrl, &nsn, &tail) != 2)
        return 0;
    snprintf(blk, n, "/dev/nvme%un%u", ctrl, nsn);
    return stat(blk, st) == 0 && S_ISBLK(st->st_mode);
}

/* Open blk (stat st) read-only for a lock of mode, O_EXCL for an exclusive one, into *fd_out:
 * 0 (*fd_out -1 when the device is gone since the stat), or <0 with err set. */
static int sibling_open(const char *blk, const struct stat *st, int mode, int *fd_out, rb_err *err)
{
    const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
    int fd;
    *fd_out = -1;
    if (mode == RB_LOCK_EXCLUSIVE) {
        rb_err e;
        fd = rb_dev_open_excl(blk, flags, st, &e);
        if (fd == -EBUSY) {
            *err = e;
            return fd;
        }
    } else {
        do {
            fd = open(blk, flags);
        } while (fd < 0 && errno == EINTR);
        if (fd < 0)
            fd = -errno;
    }
    if (fd == -ENOENT || fd == -ENXIO || fd == -ENODEV)
        return 0; /* gone since the stat */
    if (fd < 0)
        return rb_err_set(err, RB_ERR_OS, -fd, "open failed on the namespace's block device '%s'", blk);
    *fd_out = fd;
    return 0;
}

/* See rb_device_int.h. */
int rb_dev_lock_sibling(const char *path, int mode, int *fd_out, int *state, rb_err *err)
{
    *fd_out = -1;
    *state = RB_LOCKST_NONE;
    if (mode == RB_LOCK_NONE)
        return 0;
    char blk[64];
    struct stat st;
    if (!sibling_path(path, blk, sizeof(blk), &st))
        return 0;
    int fd;
    int rc = sibling_open(blk, &st, mode, &fd, err);
    if (rc < 0 || fd < 0)
        return rc;
    struct stat fst;
    rc = fstat(fd, &fst) == 0 ? 0 : rb_err_set(err, RB_ERR_OS, errno, "fstat failed on '%s'", blk);
    if (rc == 0)
        rc = rb_dev_lock_fd(fd, &fst, blk, mode, state, err);
    if (rc < 0 || mode == RB_LOCK_CHECK || *state == RB_LOCKST_UNSUPPORTED) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

/* See rb_device.h (the two accessors). */
int rb_dev_lock_state(const rb_dev *dev)
{
    return dev->lock_state;
}

const char *rb_dev_lock_name(const rb_dev *dev)
{
    if (atomic_load(&dev->closing))
        return "released";
    switch (dev->lock_state) {
    case RB_LOCKST_SHARED:
        return "shared";
    case RB_LOCKST_EXCLUSIVE:
        return "exclusive";
    case RB_LOCKST_UNSUPPORTED:
        return "unsupported";
    default:
        return "none";
    }
}
