/* rb_probe.c - libblkid signature probe (see rb_probe.h). */
#include "rb_probe.h"

#include <blkid/blkid.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "rb_device.h"

/* Describe what the last successful probe found. */
static void describe(blkid_probe pr, uint64_t off, char *what, size_t what_len)
{
    const char *type = NULL, *usage = NULL, *pttype = NULL;
    blkid_probe_lookup_value(pr, "TYPE", &type, NULL);
    blkid_probe_lookup_value(pr, "USAGE", &usage, NULL);
    blkid_probe_lookup_value(pr, "PTTYPE", &pttype, NULL);
    char where[64] = "";
    if (off)
        snprintf(where, sizeof(where), " at byte offset %llu", (unsigned long long)off);
    if (pttype)
        snprintf(what, what_len, "%s partition table%s", pttype, where);
    else if (type)
        snprintf(what, what_len, "%s %s%s", type, usage && strcmp(usage, "filesystem") != 0 ? usage : "file system",
                 where);
    else
        snprintf(what, what_len, "unidentified signature%s", where);
}

static int read_full(int fd, void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, (uint8_t *)buf + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        done += (size_t)r;
    }
    return 0;
}

/*
 * Does offset 0 hold a raw-block checkpoint container whose payload passes its CRC-32
 * (LMCache's format, whatever the magic)? Then the device is ours (or LMCache's) and its slot
 * payloads - arbitrary bytes - are not scanned for signatures, which they could match by chance.
 */
static int holds_valid_container(int fd, uint64_t size)
{
    static const size_t aligns[] = {4096, 512, 1024, 2048, 8192, 16384, 65536};
    uint8_t h[32];
    if (size < sizeof(h) || read_full(fd, h, sizeof(h), 0) < 0)
        return 0;
    for (int i = 0; i < 8; i++)
        if (h[i] < 0x21 || h[i] > 0x7e)
            return 0;
    uint64_t plen;
    uint32_t crc;
    memcpy(&plen, h + 20, 8); /* little-endian hosts only, as the rest of the format code */
    memcpy(&crc, h + 28, 4);
    if (plen == 0 || plen > (256u << 20))
        return 0;
    uint8_t *p = malloc((size_t)plen);
    if (!p)
        return 0;
    int ours = 0;
    for (size_t k = 0; k < sizeof(aligns) / sizeof(aligns[0]) && !ours; k++) {
        if (aligns[k] + plen > size || read_full(fd, p, (size_t)plen, aligns[k]) < 0)
            continue;
        uLong c = crc32(0L, Z_NULL, 0);
        for (uint64_t done = 0; done < plen;) {
            uInt step = plen - done > (1u << 30) ? (1u << 30) : (uInt)(plen - done);
            c = crc32(c, p + done, step);
            done += step;
        }
        ours = (uint32_t)c == crc;
    }
    free(p);
    return ours;
}

/* One probe of len bytes at off (len 0: to the end). 1 found, 0 none, -1 libblkid error. */
static int probe_at(blkid_probe pr, int fd, uint64_t off, uint64_t len, int partitions, char *what, size_t what_len)
{
    if (blkid_probe_set_device(pr, fd, (blkid_loff_t)off, (blkid_loff_t)len) != 0)
        return -1;
    blkid_probe_enable_superblocks(pr, 1);
    blkid_probe_set_superblocks_flags(pr, BLKID_SUBLKS_TYPE | BLKID_SUBLKS_USAGE);
    blkid_probe_enable_partitions(pr, partitions);
    if (partitions)
        blkid_probe_set_partitions_flags(pr, BLKID_PARTS_MAGIC);
    int rc = blkid_do_safeprobe(pr);
    if (rc == 0) {
        describe(pr, off, what, what_len);
        return 1;
    }
    if (rc == -2) {
        if (off)
            snprintf(what, what_len, "ambiguous signatures (several file systems or tables) at byte offset %llu",
                     (unsigned long long)off);
        else
            snprintf(what, what_len, "ambiguous signatures (several file systems or tables)");
        return 1;
    }
    return rc < 0 ? -1 : 0;
}

/* Open path for the probe (read-only, blocking once open) after the checks a device path
 * passes, and its size in *size (0 when unknown): the descriptor, or <0 with err set. */
static int probe_open(const char *path, uint64_t *size, rb_err *err)
{
    int rc = rb_dev_check_path(path, err);
    if (rc < 0)
        return rc;
    /* O_NONBLOCK: a path swapped for a FIFO after the check cannot block the open. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return rb_err_set(err, RB_ERR_OS, errno, "cannot probe %s for existing signatures", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return rb_err_set(err, RB_ERR_OS, e, "cannot probe %s for existing signatures", path);
    }
    if ((rc = rb_dev_check_mode(path, (unsigned)st.st_mode, err)) < 0) {
        close(fd);
        return rc;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *size = S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    if (S_ISBLK(st.st_mode)) {
        uint64_t b = 0;
        if (ioctl(fd, BLKGETSIZE64, &b) == 0)
            *size = b;
    }
    /* No readahead: every page the probe reads is read by its own call and unlocked when the
     * call returns, so the DONTNEED after the probe finds no page still under an asynchronous
     * readahead (which it would skip, leaving it cached). */
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    return fd;
}

/*
 * A file system inside a partition whose table was wiped starts further in. Everything
 * we write first (the checkpoint containers of the metadata region, 128 MiB by default
 * and 256 MiB in LMCache's multi-process example, then the first slots) lies in the first
 * RB_PROBE_SPAN bytes, so every partition start there is probed: each MiB (where
 * partitioning tools have placed partitions since 2008) and the old DOS start at sector 63.
 * 1 found (what says what), 0 none.
 */
static int probe_partition_starts(blkid_probe pr, int fd, uint64_t size, char *what, size_t what_len)
{
    int found = 0;
    uint64_t limit = size < RB_PROBE_SPAN ? size : RB_PROBE_SPAN;
    for (uint64_t off = 63 * 512; off < limit && !found; off = off < (1u << 20) ? (1u << 20) : off + (1u << 20)) {
        if (size - off < RB_PROBE_MIN_FS)
            break;
        uint8_t m[8];
        if (read_full(fd, m, sizeof(m), off) == 0 && memcmp(m, "LMCBLK01", 8) == 0)
            continue; /* one of our slots starts here */
        /* A window, not the rest of the device: the superblock sits at the start of a
         * partition, and some probers scan the whole of a large window (1 GiB: 0.9 s for
         * all starts; 16 MiB windows: 0.08 s). */
        uint64_t len = size - off < RB_PROBE_WINDOW ? size - off : RB_PROBE_WINDOW;
        found = probe_at(pr, fd, off, len, 0, what, what_len);
        if (found < 0)
            found = 0; /* an unreadable window is not a signature */
    }
    return found;
}

int rb_probe_foreign(const char *path, char *what, size_t what_len, rb_err *err)
{
    if (what_len)
        what[0] = '\0';
    uint64_t size = 0;
    int fd = probe_open(path, &size, err);
    if (fd < 0)
        return fd;
    blkid_probe pr = blkid_new_probe();
    if (!pr) {
        close(fd);
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "cannot probe %s: out of memory", path);
    }
    /* The whole device: file systems, RAID/LVM members, partition tables. */
    int found = probe_at(pr, fd, 0, 0, 1, what, what_len);
    if (found < 0) {
        blkid_free_probe(pr);
        close(fd);
        return rb_err_set(err, RB_ERR_OS, EIO, "libblkid failed to probe %s", path);
    }
    /* Then the partition starts, skipped on a device that already holds a valid checkpoint
     * container (ours or LMCache's). */
    if (!found && size && !holds_valid_container(fd, size))
        found = probe_partition_starts(pr, fd, size, what, what_len);
    blkid_free_probe(pr);
    /* The probers read tens of MiB of scattered windows (28 MiB of a 96 MiB sparse file), which
     * stay in the page cache as small pages; the slots written there later reuse them, and
     * reading those slots back from the page cache was 1.25x slower than on a file that was
     * never probed. Dropping the clean pages the probe left (nothing dirty is dropped) lets the
     * writes build the page cache afresh. */
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return found;
}
