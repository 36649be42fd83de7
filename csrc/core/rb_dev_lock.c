/*
 * rb_dev_lock.c - one writer per device: the flock(2) and O_EXCL rules rb_dev_open applies
 * (enum rb_dev_lock_mode in rb_device.h), and the diagnosis of a refusal: who holds the device,
 * found in /proc/locks (flock holders), /proc/<pid>/fdinfo (who shares the holder's open file
 * description once the locker has exited), /proc/self/mountinfo (mounts), sysfs holders (a
 * device-mapper or RAID device built on it) and /proc/<pid>/fd (another opener). Diagnosis runs
 * only on the refusal path; the open of a device nobody holds costs one flock call.
 *
 * The locks live on descriptors of their own (rb_dev_lock_open), never on the descriptor the
 * engines transfer through: a write in flight, or an io_uring ring the kernel tears down after
 * a kill -9 (asynchronously, seconds later on a loaded host), holds that one; a lock on it would
 * outlive its writer. Every lock descriptor (and an exclusive writer's data descriptor) is
 * listed here, and a child forked without exec closes them all (pthread_atfork): it never holds
 * the lock of the process it was forked from. The data descriptor carries the drain mark
 * instead (rb_dev_drain_mark): the next writer waits for a dead writer's writes in flight.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "rb_device_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

static _Atomic int lock_fault; /* test hook: errno the next flock reports */

/* ---- lock descriptors, closed in a forked child -------------------------------------------- */

/* The descriptors rb_dev_lock_open gave out and rb_dev_lock_close has not taken back. reg_mu
 * is a leaf lock, also held across fork(2) (prepare to parent/child), so a child never sees a
 * descriptor opened but not yet listed. */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static int *reg_fds;
static size_t reg_n, reg_cap;

static void reg_prepare(void)
{
    pthread_mutex_lock(&reg_mu);
}

static void reg_parent(void)
{
    pthread_mutex_unlock(&reg_mu);
}

/* In the child of a fork: the parent's locks are not ours to hold. Closing our reference to
 * each lock's open file description leaves the parent's lock in place, and lets it go with the
 * parent. */
static void reg_child(void)
{
    for (size_t i = 0; i < reg_n; i++)
        (void)close(reg_fds[i]);
    reg_n = 0;
    pthread_mutex_unlock(&reg_mu);
}

static void reg_init(void)
{
    (void)pthread_atfork(reg_prepare, reg_parent, reg_child);
}

/* List fd (reg_mu held): 0, or -ENOMEM. */
static int reg_add_locked(int fd)
{
    if (reg_n == reg_cap) {
        size_t cap = reg_cap ? reg_cap * 2 : 16;
        int *p = realloc(reg_fds, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        reg_fds = p;
        reg_cap = cap;
    }
    reg_fds[reg_n++] = fd;
    return 0;
}

/* See rb_device_int.h. */
int rb_dev_lock_open(const char *path, int flags)
{
    pthread_once(&reg_once, reg_init);
    pthread_mutex_lock(&reg_mu);
    int fd;
    do {
        fd = open(path, flags | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        fd = -errno;
    } else if (reg_add_locked(fd) < 0) {
        close(fd);
        fd = -ENOMEM;
    }
    pthread_mutex_unlock(&reg_mu);
    return fd;
}

/* See rb_device_int.h. */
void rb_dev_lock_close(int fd)
{
    if (fd < 0)
        return;
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < reg_n; i++) {
        if (reg_fds[i] == fd) {
            reg_fds[i] = reg_fds[--reg_n];
            (void)close(fd); /* only a descriptor this process still lists: never a reused number */
            break;
        }
    }
    pthread_mutex_unlock(&reg_mu);
}

/* See rb_device_int.h. */
int rb_dev_lock_list(int fd)
{
    pthread_once(&reg_once, reg_init);
    pthread_mutex_lock(&reg_mu);
    int rc = reg_add_locked(fd);
    pthread_mutex_unlock(&reg_mu);
    return rc;
}

/* See rb_device_int.h. */
int rb_dev_lock_unlist(int fd)
{
    int found = 0;
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < reg_n && !found; i++) {
        if (reg_fds[i] == fd) {
            reg_fds[i] = reg_fds[--reg_n];
            found = 1;
        }
    }
    pthread_mutex_unlock(&reg_mu);
    return found;
}

/* ---- flock and its holders ------------------------------------------------------------------ */

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
    int found;  /* an flock on the inode is listed */
    int write;  /* the one chosen is an exclusive (WRITE) lock */
    long pid;   /* as /proc/locks prints it: who took it; <= 0 when not visible from this pid namespace */
    int exited; /* pid has exited or is exiting */
    long owner; /* pid exited: a live process that still has the lock's open file description; 0 none */
} lock_holder;

/* Parse the lock part of a /proc/locks or fdinfo "lock:" line: 1 when it is an flock on the
 * inode st describes (*write, *pid filled), 0 otherwise (waiters "-> FLOCK", other kinds). */
static int parse_flock_line(const char *line, const struct stat *st, int *write, long *pid)
{
    char kind[16], rw[16];
    unsigned maj, min;
    unsigned long long ino;
    if (sscanf(line, "%*d: %15s %*s %15s %ld %x:%x:%llu", kind, rw, pid, &maj, &min, &ino) != 6)
        return 0;
    if (strcmp(kind, "FLOCK") != 0 || maj != major(st->st_dev) || min != minor(st->st_dev) ||
        ino != (unsigned long long)st->st_ino)
        return 0;
    *write = strcmp(rw, "WRITE") == 0;
    return 1;
}

/* Is a SIGKILL pending for process pid (sent, not yet acted on: /proc/<pid>/status SigPnd or
 * ShdPnd has bit 8)? A writer killed an instant ago is about to exit. */
static int sigkill_pending(long pid)
{
    char p[48], line[128];
    snprintf(p, sizeof(p), "/proc/%ld/status", pid);
    FILE *f = fopen(p, "re");
    if (!f)
        return 0;
    int pending = 0;
    while (!pending && fgets(line, sizeof(line), f)) {
        unsigned long long mask;
        if ((sscanf(line, "SigPnd: %llx", &mask) == 1 || sscanf(line, "ShdPnd: %llx", &mask) == 1) &&
            (mask & (1ull << (SIGKILL - 1))))
            pending = 1;
    }
    fclose(f);
    return pending;
}

/* Has process pid exited (no /proc entry, a zombie), begun to (PF_EXITING in its flags), or been
 * sent a SIGKILL it has not acted on yet? Its locks are then on their way out: the kernel drops
 * them as the process's files are released. */
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
    const char *rp = strrchr(buf, ')'); /* "pid (comm) S ppid pgrp session tty tpgid flags ..." */
    if (!rp || rp[1] != ' ')
        return 0;
    if (rp[2] == 'Z' || rp[2] == 'X')
        return 1;
    unsigned long flags = 0;
    if (sscanf(rp + 3, " %*d %*d %*d %*d %*d %lu", &flags) == 1 && (flags & 0x4) != 0) /* PF_EXITING */
        return 1;
    return sigkill_pending(pid);
}

/* Does /proc/<pid>/fdinfo/<fd> list an flock on st? */
static int fdinfo_holds(long pid, const char *fd, const struct stat *st)
{
    char p[96], line[256];
    snprintf(p, sizeof(p), "/proc/%ld/fdinfo/%.32s", pid, fd);
    FILE *f = fopen(p, "re");
    if (!f)
        return 0;
    int found = 0;
    while (!found && fgets(line, sizeof(line), f)) {
        int write;
        long lpid;
        found = strncmp(line, "lock:", 5) == 0 && parse_flock_line(line + 5, st, &write, &lpid);
    }
    fclose(f);
    return found;
}

/* A match of a scan of /proc/<pid>/fd: 1 when descriptor fd (a name in dir, an open
 * /proc/<pid>/fd) of process pid is the one looked for (ctx says what). */
typedef int (*fd_match)(long pid, int dir, const char *fd, const void *ctx);

/* The first process other than skip with a descriptor that match accepts: its pid, or 0. One
 * scan of /proc/<pid>/fd: the refusal path only. */
static long scan_proc_fds(long skip, fd_match match, const void *ctx)
{
    DIR *proc = opendir("/proc");
    if (!proc)
        return 0;
    long found = 0;
    struct dirent *pe;
    while (!found && (pe = readdir(proc)) != NULL) {
        char *end;
        long pid = strtol(pe->d_name, &end, 10);
        if (*end != '\0' || pid <= 0 || pid == skip)
            continue;
        char dir[64];
        snprintf(dir, sizeof(dir), "/proc/%ld/fd", pid);
        DIR *fds = opendir(dir);
        if (!fds)
            continue;
        struct dirent *fe;
        while (!found && (fe = readdir(fds)) != NULL)
            if (fe->d_name[0] != '.' && match(pid, dirfd(fds), fe->d_name, ctx))
                found = pid;
        closedir(fds);
    }
    closedir(proc);
    return found;
}

/* fd_match: a descriptor of the file ctx (a struct stat) whose open file description holds
 * the flock (its fdinfo lists it), in a live process. */
static int holds_lock_on(long pid, int dir, const char *fd, const void *ctx)
{
    const struct stat *st = ctx;
    struct stat fst;
    return fstatat(dir, fd, &fst, 0) == 0 && fst.st_dev == st->st_dev && fst.st_ino == st->st_ino &&
           fdinfo_holds(pid, fd, st) && !process_exited(pid);
}

/* A live process, other than pid gone, with a descriptor of st whose open file description
 * holds the flock (its fdinfo lists it): the child a holder forked, or one it passed the
 * descriptor to. 0 when none is found. */
static long find_lock_owner(const struct stat *st, long gone)
{
    return scan_proc_fds(gone, holds_lock_on, st);
}

/*
 * The flock holder of the inode st describes, from /proc/locks. Lines read
 * "N: FLOCK  ADVISORY  WRITE <pid> <maj>:<min>:<ino> 0 EOF", major and minor of the file
 * system's device in hex; waiters ("N: -> FLOCK ...") and other lock kinds are skipped. An
 * exclusive holder is preferred to a shared one, and a holder in another process to this one.
 * h->found is 0 when none is listed (or /proc/locks cannot be read). /proc/locks names the
 * process that took the lock; when it has exited, the live process still holding the lock's
 * open file description is looked for (h->owner).
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
        int write;
        long pid;
        if (!parse_flock_line(line, st, &write, &pid))
            continue;
        int score = write * 2 + (pid != self);
        if (score > best) {
            best = score;
            h->found = 1;
            h->write = write;
            h->pid = pid;
        }
    }
    fclose(f);
    if (h->found && h->pid > 0 && (h->exited = process_exited(h->pid)) != 0)
        h->owner = find_lock_owner(st, h->pid);
}

/* "pid 1234", or why there is none to name. */
static void describe_holder(const lock_holder *h, char *buf, size_t n)
{
    if (!h->found)
        snprintf(buf, n, "pid not found in /proc/locks");
    else if (h->pid <= 0)
        snprintf(buf, n, "pid not visible here");
    else if (h->exited && h->owner > 0)
        snprintf(buf, n, "pid %ld, inherited from exited pid %ld", h->owner, h->pid);
    else if (h->exited)
        snprintf(buf, n, "pid %ld, exited", h->pid);
    else
        snprintf(buf, n, "pid %ld", h->pid);
}

/* The process that holds the lock now: the owner when the locker has exited, else the locker. */
static long holder_pid(const lock_holder *h)
{
    return h->exited && h->owner > 0 ? h->owner : h->pid;
}

/* The refusal of mode by holder h (found or not) of what path reaches: the device itself (on
 * NULL) or, through it, on (its backing file, another loop device over that file):
 * RB_ERR_OS, EBUSY. Short texts, the path last: rb_err's 256 bytes must leave room for a long
 * path. */
static int refuse_on(const char *path, int mode, const lock_holder *h, const char *on, rb_err *err)
{
    char who[96], where_on[112] = "";
    describe_holder(h, who, sizeof(who));
    if (on)
        snprintf(where_on, sizeof(where_on), " on %s", on);
    const char *where = h->found && holder_pid(h) == (long)getpid() ? " in this process" : "";
    if (h->found && !h->write && mode == RB_LOCK_EXCLUSIVE)
        return rb_err_set(err, RB_ERR_OS, EBUSY,
                          "device is being read%s (%s, shared lock%s: inspect, verify); wait for it to finish, then "
                          "retry. device_path='%s'",
                          where, who, where_on, path);
    if (mode == RB_LOCK_SHARED)
        return rb_err_set(err, RB_ERR_OS, EBUSY,
                          "device is held by a raw-block writer%s (%s)%s: a reader could see its cache half-written; "
                          "stop the writer first. device_path='%s'",
                          where, who, where_on, path);
    const char *advice = *where ? "close the other first" : "stop it or use another device";
    if (on) /* a longer text already: the path must still fit */
        return rb_err_set(err, RB_ERR_OS, EBUSY,
                          "device is held by another raw-block writer%s (%s)%s; %s. device_path='%s'", where, who,
                          where_on, advice, path);
    return rb_err_set(err, RB_ERR_OS, EBUSY,
                      "device is held by another raw-block writer%s (%s): two writers corrupt each other's cache; %s. "
                      "device_path='%s'",
                      where, who, advice, path);
}

static int refuse(const char *path, int mode, const lock_holder *h, rb_err *err)
{
    return refuse_on(path, mode, h, NULL, err);
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

/* See rb_device_int.h. */
int rb_dev_drain_mark(int fd, const char *path, rb_err *err)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = RB_DRAIN_MARK_OFF, .l_len = 1};
    const long long start = now_ms();
    for (;;) {
        if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
            return 0;
        int e = errno;
        if (e == EINTR)
            continue;
        if (e != EAGAIN && e != EACCES)
            return 0; /* no OFD locks on this file system (EINVAL, ENOLCK): the writer lock alone */
        long long waited = now_ms() - start;
        if (waited >= RB_DRAIN_WAIT_MS)
            return rb_err_set(err, RB_ERR_OS, EBUSY,
                              "'%s': the previous writer's data descriptor is still open %lld ms after its lock "
                              "was released (its writes still in flight, or a process it passed the descriptor "
                              "to); nothing was written, try again",
                              path, waited);
        sleep_ms(5);
    }
}

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
 * (a live exclusive holder - the locker, or a process that still has its lock after it
 * exited - or the wait for this kind of holder is over), 0 to try again. Shared holders
 * (udev probing the device, a short read), a holder that let go before /proc/locks was read
 * and one whose process is exiting are waited out. */
static int lock_refusal_final(const lock_holder *h, long long start)
{
    long long waited = now_ms() - start;
    int going = h->found && h->exited && h->owner <= 0;
    return (h->found && h->write && !going) || waited >= (going ? RB_LOCK_EXIT_WAIT_MS : RB_LOCK_WAIT_MS);
}

/* See rb_device_int.h. A refused lock is retried while the holder may be on its way out:
 * shared holders and a holder that let go while /proc/locks was read for RB_LOCK_WAIT_MS, a
 * holder whose process is exiting (and nobody else has its lock) for RB_LOCK_EXIT_WAIT_MS; a
 * live exclusive holder is refused at once. */
int rb_dev_lock_fd(int fd, const struct stat *st, const char *path, const char *on, int mode, int *state, rb_err *err)
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
        if (mode == RB_LOCK_CHECK && h.found && h.write && holder_pid(&h) == (long)getpid())
            return 0;
        if (lock_refusal_final(&h, start))
            break;
        sleep_ms(attempt < 5 ? 2 : 20);
    }
    return refuse_on(path, mode, &h, on, err);
}

/* See rb_device_int.h. */
int rb_dev_check_holder(const struct stat *st, const char *path, const char *on, int mode, rb_err *err)
{
    if (mode == RB_LOCK_NONE)
        return 0;
    lock_holder h;
    find_flock_holder(st, &h);
    if (!h.found || (h.exited && h.owner <= 0))
        return 0;
    /* Readers are not refused here: shared holders come and go (udev probes a block device under
     * LOCK_SH after a writer closes it), and a reader of a loop device locks its backing file
     * too, where a writer meets it through the lock's own wait. */
    if (!h.write || (mode == RB_LOCK_CHECK && holder_pid(&h) == (long)getpid()))
        return 0;
    return refuse_on(path, mode, &h, on, err);
}

/* The mount point of the block device rdev in /proc/self/mountinfo (octal escapes kept), cut to
 * n - 1 bytes (n > 0): 1 found, 0 not mounted in this mount namespace. */
int rb_dev_find_mount(dev_t rdev, char *where, size_t n)
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
int rb_dev_find_sysfs_holder(dev_t rdev, char *name, size_t n)
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

/* fd_match: a descriptor of the block device ctx (a dev_t). */
static int opens_blockdev(long pid, int dir, const char *fd, const void *ctx)
{
    (void)pid;
    struct stat st; /* of what the fd link points to */
    return fstatat(dir, fd, &st, 0) == 0 && S_ISBLK(st.st_mode) && st.st_rdev == *(const dev_t *)ctx;
}

/* A process other than this one with the block device rdev open (a scan of /proc/<pid>/fd):
 * its pid, or 0. Which of them holds it exclusively, /proc does not say. */
static long find_opener(dev_t rdev)
{
    return scan_proc_fds((long)getpid(), opens_blockdev, &rdev);
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
        return h.exited && h.owner <= 0 ? RB_LOCK_EXIT_WAIT_MS : 0;
    }
    char what[72];
    if (rb_dev_find_mount(st->st_rdev, what, sizeof(what))) {
        rb_err_set(err, RB_ERR_OS, EBUSY,
                   "device is mounted on %s: a raw-block cache would destroy its file system; unmount it or use "
                   "another device. device_path='%s'",
                   what, path);
        return 0;
    }
    if (rb_dev_find_sysfs_holder(st->st_rdev, what, sizeof(what))) {
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
        int fd = rb_dev_lock_open(path, flags | O_EXCL);
        if (fd >= 0)
            return fd;
        if (fd != -EBUSY)
            return rb_err_set(err, RB_ERR_OS, -fd, "open failed");
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
        fd = rb_dev_lock_open(blk, flags);
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
        rc = rb_dev_lock_fd(fd, &fst, blk, NULL, mode, state, err);
    if (rc < 0 || mode == RB_LOCK_CHECK || *state == RB_LOCKST_UNSUPPORTED) {
        rb_dev_lock_close(fd);
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
    if (atomic_load(&dev->closing) || dev->lock_pid != (long)getpid())
        return "released"; /* closed, or this is a forked child: the lock stayed with the parent */
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
