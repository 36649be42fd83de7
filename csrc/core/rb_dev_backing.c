/*
 * rb_dev_backing.c - a file and every loop device over it are one backing store, so one writer
 * among them all. A loop device knows its backing file by device and inode
 * (LOOP_GET_STATUS64's lo_device and lo_inode, which survive a rename or an unlink of the path)
 * and sysfs names it (/sys/block/loopN/loop/backing_file: the current path, " (deleted)" once
 * unlinked). The rule (rb_dev_lock_backing):
 *   - a writer (or reader) of a loop device locks the backing file as well as the device, on a
 *     descriptor of its own: it then conflicts with a writer of the file, through any path, and
 *     with a writer of any other loop device over it, who locks the same file;
 *   - where the backing file cannot be opened by that path (unlinked, renamed over, out of this
 *     mount namespace), the flock holders of its inode are checked in /proc/locks instead;
 *   - a writer of a file or of a loop device then checks every other loop device over the same
 *     file: held by a writer (the flock on its node), or, for a writer, mounted or built on.
 * Each side takes its own locks before it checks the others', so of two writers starting at
 * once at least one sees the other.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "rb_device_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define DELETED_SUFFIX " (deleted)"

/* A backing file: the device and inode of the file a loop device reads and writes. */
typedef struct backing {
    dev_t dev;
    ino_t ino;
} backing;

/* The first line of sysfs file p in buf (newline cut): 0, or -1 when it cannot be read. */
static int read_line(const char *p, char *buf, size_t n)
{
    FILE *f = fopen(p, "re");
    if (!f)
        return -1;
    int ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

static int read_devno(const char *p, dev_t *rdev);

/* The backing file's path sysfs gives for the loop directory dir: 1 usable, 0 not (an unbound
 * loop device: none; an unlinked file: the path with " (deleted)", kept in path for messages). */
static int backing_path(const char *dir, char *path, size_t n)
{
    char p[160];
    snprintf(p, sizeof(p), "%s/backing_file", dir);
    if (read_line(p, path, n) < 0 || !path[0])
        return 0;
    size_t l = strlen(path), sl = strlen(DELETED_SUFFIX);
    return !(l > sl && strcmp(path + l - sl, DELETED_SUFFIX) == 0);
}

/* The sysfs loop directory of the block device rdev (a loop device, or a partition of one) in
 * dir, and the loop device's own number in *disk: 1, or 0 when rdev is neither. */
static int loop_dir_of(dev_t rdev, char *dir, size_t n, dev_t *disk, int *partition)
{
    char p[128];
    snprintf(dir, n, "/sys/dev/block/%u:%u/loop", major(rdev), minor(rdev));
    *partition = access(dir, F_OK) != 0;
    if (*partition) {
        snprintf(p, sizeof(p), "/sys/dev/block/%u:%u/partition", major(rdev), minor(rdev));
        snprintf(dir, n, "/sys/dev/block/%u:%u/../loop", major(rdev), minor(rdev));
        if (access(p, F_OK) != 0 || access(dir, F_OK) != 0)
            return 0;
    }
    snprintf(p, sizeof(p), "%s/../dev", dir);
    return read_devno(p, disk);
}

/* The backing file of the loop device open on fd: LOOP_GET_STATUS64. 1, or 0 when unbound. */
static int loop_backing_fd(int fd, backing *b)
{
    struct loop_info64 info;
    memset(&info, 0, sizeof(info));
    if (ioctl(fd, LOOP_GET_STATUS64, &info) != 0)
        return 0;
    b->dev = (dev_t)info.lo_device; /* the kernel's encoding of st_dev, as stat(2) reports it */
    b->ino = (ino_t)info.lo_inode;
    return 1;
}

/* Is the loop device name (sysfs /sys/block/<name>) backed by b? Its sysfs path is compared
 * first (stat: no device opened); an unlinked or unreachable path is settled by the ioctl on
 * /dev/<name>. */
static int loop_backed_by(const char *name, const backing *b)
{
    char dir[96], path[4096];
    snprintf(dir, sizeof(dir), "/sys/block/%.40s/loop", name);
    struct stat st;
    if (backing_path(dir, path, sizeof(path)) && stat(path, &st) == 0)
        return st.st_dev == b->dev && st.st_ino == b->ino;
    if (access(dir, F_OK) != 0)
        return 0; /* not bound to a file */
    snprintf(path, sizeof(path), "/dev/%.40s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return 0;
    backing lb;
    int same = loop_backing_fd(fd, &lb) && lb.dev == b->dev && lb.ino == b->ino;
    close(fd);
    return same;
}

/* The block device node (rdev: a loop device over the same file as path, or a partition of
 * one): refuse (-EBUSY) when a writer holds it or, for an EXCLUSIVE open, when it is mounted or
 * has a device built on it. */
static int check_node(const char *name, dev_t rdev, const char *path, int mode, rb_err *err)
{
    char node[80], on[128], what[72];
    snprintf(node, sizeof(node), "/dev/%.40s", name);
    snprintf(on, sizeof(on), "loop device %s over the same file", node);
    struct stat st;
    if (stat(node, &st) == 0 && S_ISBLK(st.st_mode) && st.st_rdev == rdev) {
        int rc = rb_dev_check_holder(&st, path, on, mode, err);
        if (rc < 0)
            return rc;
    }
    if (mode != RB_LOCK_EXCLUSIVE)
        return 0;
    if (rb_dev_find_mount(rdev, what, sizeof(what)))
        return rb_err_set(err, RB_ERR_OS, EBUSY,
                          "device's file is mounted on %s via %s; unmount it first. device_path='%s'", what, node,
                          path);
    if (rb_dev_find_sysfs_holder(rdev, what, sizeof(what)))
        return rb_err_set(err, RB_ERR_OS, EBUSY,
                          "device's file is in use by %s via %s; use another device. device_path='%s'", what, node,
                          path);
    return 0;
}

/* The major:minor in sysfs file p as a dev_t: 1, or 0 when unreadable. */
static int read_devno(const char *p, dev_t *rdev)
{
    char line[32];
    unsigned maj, min;
    if (read_line(p, line, sizeof(line)) < 0 || sscanf(line, "%u:%u", &maj, &min) != 2)
        return 0;
    *rdev = makedev(maj, min);
    return 1;
}

/* The loop device name (rdev) over the same file as path, and each of its partitions
 * (/sys/block/<name>/<name>pN): check_node. 0, or the first refusal. */
static int check_loop_user(const char *name, dev_t rdev, const char *path, int mode, rb_err *err)
{
    int rc = check_node(name, rdev, path, mode, err);
    char p[160];
    snprintf(p, sizeof(p), "/sys/block/%.40s", name);
    DIR *d = rc == 0 ? opendir(p) : NULL;
    if (!d)
        return rc;
    const size_t nl = strlen(name);
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        dev_t part;
        if (strncmp(e->d_name, name, nl) != 0 || e->d_name[nl] != 'p' || strlen(e->d_name) > 40)
            continue;
        snprintf(p, sizeof(p), "/sys/block/%.40s/%.40s/dev", name, e->d_name);
        if (read_devno(p, &part))
            rc = check_node(e->d_name, part, path, mode, err);
    }
    closedir(d);
    return rc;
}

/* Every loop device but self (a loop device's own number, 0 for a file) backed by b: checked
 * by check_loop_user. 0, or the first refusal. */
static int check_other_loops(const backing *b, dev_t self, const char *path, int mode, rb_err *err)
{
    DIR *d = opendir("/sys/block");
    if (!d)
        return 0;
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "loop", 4) != 0 || strlen(e->d_name) > 32)
            continue;
        char p[80];
        dev_t rdev;
        snprintf(p, sizeof(p), "/sys/block/%.40s/dev", e->d_name);
        if (!read_devno(p, &rdev))
            continue;
        if (rdev != self && loop_backed_by(e->d_name, b))
            rc = check_loop_user(e->d_name, rdev, path, mode, err);
    }
    closedir(d);
    return rc;
}

/* Lock the backing file b of the loop device path, by the path sysfs gives (bpath), for mode:
 * 0 with *fd_out the descriptor kept (-1: none kept, or the file is out of reach and its
 * holders were checked instead), or the refusal. */
static int lock_backing_file(const backing *b, const char *bpath, int usable, const char *path, int mode, int *fd_out,
                             rb_err *err)
{
    char on[128];
    snprintf(on, sizeof(on), "its backing file %.96s", bpath);
    int fd = usable ? rb_dev_lock_open(bpath, O_RDONLY | O_NONBLOCK) : -1;
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_dev != b->dev || st.st_ino != b->ino)) {
        rb_dev_lock_close(fd); /* the path names another file now */
        fd = -1;
    }
    if (fd < 0) {
        memset(&st, 0, sizeof(st));
        st.st_dev = b->dev;
        st.st_ino = b->ino;
        return rb_dev_check_holder(&st, path, on, mode, err);
    }
    int state;
    int rc = rb_dev_lock_fd(fd, &st, path, on, mode, &state, err);
    if (rc < 0 || (state != RB_LOCKST_SHARED && state != RB_LOCKST_EXCLUSIVE)) {
        rb_dev_lock_close(fd); /* refused, a probe (CHECK), or a file system without flock */
        return rc;
    }
    *fd_out = fd;
    return 0;
}

/* See rb_device_int.h. */
int rb_dev_lock_backing(int fd, const struct stat *st, const char *path, int mode, int *fd_out, rb_err *err)
{
    *fd_out = -1;
    if (mode == RB_LOCK_NONE)
        return 0;
    backing b;
    dev_t self = 0;
    if (S_ISREG(st->st_mode)) {
        b.dev = st->st_dev; /* the file itself: its lock is the caller's */
        b.ino = st->st_ino;
        return check_other_loops(&b, 0, path, mode, err);
    }
    char dir[96], bpath[4096];
    int partition;
    if (!S_ISBLK(st->st_mode) || !loop_dir_of(st->st_rdev, dir, sizeof(dir), &self, &partition))
        return 0;
    /* A partition holds a part of the file only: its writer does not lock the file (a writer of
     * another partition may share it), it checks it; a writer of the file checks partitions. */
    int usable = backing_path(dir, bpath, sizeof(bpath)) && !partition;
    if (!loop_backing_fd(fd, &b)) {
        struct stat bst; /* no ioctl answer (a partition on an old kernel): the sysfs path */
        if (!usable || stat(bpath, &bst) != 0)
            return 0;
        b.dev = bst.st_dev;
        b.ino = bst.st_ino;
    }
    int rc = lock_backing_file(&b, bpath, usable, path, mode, fd_out, err);
    if (rc == 0)
        rc = check_other_loops(&b, self, path, mode, err);
    if (rc < 0) {
        rb_dev_lock_close(*fd_out);
        *fd_out = -1;
    }
    return rc;
}
