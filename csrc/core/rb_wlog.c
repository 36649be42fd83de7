/*
 * rb_wlog.c - the test-only write log (format and contract in rb_wlog.h).
 */
#include "rb_wlog.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

atomic_int rb_wlog_on;

static pthread_mutex_t wlog_mu = PTHREAD_MUTEX_INITIALIZER;
static int wlog_fd = -1;
static uint64_t wlog_seq;
static int wlog_bytes; /* writes carry their bytes (rb_wlog_set) or not (rb_wlog_set_journal) */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t r = write(fd, p, len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return; /* a test log: a short log shows up as a truncated record in the reader */
        p += r;
        len -= (size_t)r;
    }
}

static int wlog_start(const char *path, int with_bytes)
{
    int fd = -1;
    if (path) {
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            return -errno;
        write_all(fd, "RBWLOG01", 8);
    }
    pthread_mutex_lock(&wlog_mu);
    int old = wlog_fd;
    wlog_fd = fd;
    wlog_seq = 0;
    wlog_bytes = with_bytes;
    atomic_store(&rb_wlog_on, fd >= 0);
    pthread_mutex_unlock(&wlog_mu);
    if (old >= 0)
        close(old);
    return 0;
}

int rb_wlog_set(const char *path)
{
    return wlog_start(path, 1);
}

int rb_wlog_set_journal(const char *path)
{
    return wlog_start(path, 0);
}

/* Under wlog_mu: one record header. */
static void record_locked(uint32_t kind, int fd, uint64_t a, uint64_t len)
{
    struct stat st;
    uint8_t h[48];
    memset(h, 0, sizeof(h));
    if (fstat(fd, &st) != 0)
        memset(&st, 0, sizeof(st));
    put_u32(h, kind);
    put_u64(h + 8, (uint64_t)st.st_dev);
    put_u64(h + 16, (uint64_t)st.st_ino);
    put_u64(h + 24, a);
    put_u64(h + 32, len);
    put_u64(h + 40, wlog_seq++);
    write_all(wlog_fd, h, sizeof(h));
}

void rb_wlog_writev(int fd, uint64_t off, const struct iovec *iov, int iovcnt, size_t skip, size_t len)
{
    pthread_mutex_lock(&wlog_mu);
    if (wlog_fd >= 0 && !wlog_bytes)
        record_locked(RB_WLOG_WRITE_LEN, fd, off, len);
    else if (wlog_fd >= 0) {
        record_locked(RB_WLOG_WRITE, fd, off, len);
        for (int i = 0; i < iovcnt && len; i++) {
            size_t l = iov[i].iov_len;
            if (skip >= l) {
                skip -= l;
                continue;
            }
            size_t n = l - skip < len ? l - skip : len;
            write_all(wlog_fd, (const uint8_t *)iov[i].iov_base + skip, n);
            len -= n;
            skip = 0;
        }
    }
    pthread_mutex_unlock(&wlog_mu);
}

void rb_wlog_write(int fd, uint64_t off, const void *buf, size_t len)
{
    struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
    rb_wlog_writev(fd, off, &v, 1, 0, len);
}

uint64_t rb_wlog_flush_begin(void)
{
    pthread_mutex_lock(&wlog_mu);
    uint64_t b = wlog_seq;
    pthread_mutex_unlock(&wlog_mu);
    return b;
}

void rb_wlog_flush_done(int fd, uint64_t barrier)
{
    pthread_mutex_lock(&wlog_mu);
    if (wlog_fd >= 0)
        record_locked(RB_WLOG_FLUSH, fd, barrier, 0);
    pthread_mutex_unlock(&wlog_mu);
}

void rb_wlog_synced(int fd, uint64_t off, uint64_t len)
{
    pthread_mutex_lock(&wlog_mu);
    if (wlog_fd >= 0 && wlog_bytes)
        record_locked(RB_WLOG_SYNCED, fd, off, len);
    else if (wlog_fd >= 0) /* the wear journal: counted as the flush it costs */
        record_locked(RB_WLOG_FLUSH, fd, wlog_seq, 0);
    pthread_mutex_unlock(&wlog_mu);
}

void rb_wlog_dealloc(int fd, uint64_t off, uint64_t len)
{
    pthread_mutex_lock(&wlog_mu);
    if (wlog_fd >= 0)
        record_locked(RB_WLOG_DEALLOC, fd, off, len);
    pthread_mutex_unlock(&wlog_mu);
}
