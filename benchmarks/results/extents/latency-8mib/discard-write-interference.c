/* What a block device's discards cost buffered writes to other parts of it, without the product.
 *
 * 8 MiB buffered writes cycle over the device in 64 MiB extents, as a full cache's puts refill
 * victim extents. With a discard mode, a thread of its own discards each extent 4 extents before
 * the writes reach it, as the product's evictor does ahead of the puts: "uring" through io_uring
 * (BLOCK_URING_CMD_DISCARD with IOSQE_ASYNC, the product's path on Linux 6.12+), "ioctl" through
 * BLKDISCARD (which since Linux 6.15 holds the device's inode lock, and so every buffered write,
 * for the whole discard). Every 8 MiB pwrite is timed after one untimed pass over the device
 * (the cache full); the device is discarded whole and its cached pages dropped first.
 *
 * Build: cc -O2 -pthread -o dwi discard-write-interference.c -luring
 * Run (root): ./dwi DEVICE none|uring|ioctl [ROUNDS]   -> one line: mode p50 p99 mean (us)
 * The kernel's dirty limit is the caller's (discard-write-interference.py sets 256 MiB). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#ifndef BLOCK_URING_CMD_DISCARD
#define BLOCK_URING_CMD_DISCARD _IO(0x12, 0)
#endif

#define CH (8ull << 20)
#define PER 8ull
#define EXT (PER * CH)
#define AHEAD 4ull

static const char *dev;
static int mode; /* 0 none, 1 uring, 2 ioctl */
static uint64_t queue_[1 << 16];
static unsigned qhead, qtail;
static int done;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static void die(const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", dev, what, strerror(errno));
    exit(1);
}

static int discard_uring(struct io_uring *ring, int fd, uint64_t off, uint64_t len)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    io_uring_prep_rw(IORING_OP_URING_CMD, sqe, fd, NULL, 0, 0);
    sqe->cmd_op = BLOCK_URING_CMD_DISCARD;
    sqe->addr = off;
    sqe->addr3 = len;
    sqe->flags |= IOSQE_ASYNC;
    io_uring_submit(ring);
    struct io_uring_cqe *cqe;
    int rc = io_uring_wait_cqe(ring, &cqe);
    if (rc == 0) {
        rc = cqe->res;
        io_uring_cqe_seen(ring, cqe);
    }
    return rc;
}

static void *discarder(void *arg)
{
    (void)arg;
    int fd = open(dev, O_WRONLY);
    if (fd < 0)
        die("open for discards");
    struct io_uring ring;
    if (mode == 1 && io_uring_queue_init(2, &ring, 0) < 0)
        die("io_uring_queue_init");
    for (;;) {
        pthread_mutex_lock(&mu);
        while (qhead == qtail && !done)
            pthread_cond_wait(&cv, &mu);
        if (qhead == qtail && done) {
            pthread_mutex_unlock(&mu);
            break;
        }
        uint64_t e = queue_[qhead++ % (1 << 16)];
        pthread_mutex_unlock(&mu);
        uint64_t range[2] = {e * EXT, EXT};
        int rc = mode == 1 ? discard_uring(&ring, fd, range[0], range[1]) : ioctl(fd, BLKDISCARD, range);
        if (rc < 0 && mode == 1) {
            errno = -rc;
            die("io_uring discard");
        } else if (rc < 0) {
            die("BLKDISCARD");
        }
    }
    if (mode == 1)
        io_uring_queue_exit(&ring);
    close(fd);
    return NULL;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s DEVICE none|uring|ioctl [ROUNDS]\n", argv[0]);
        return 2;
    }
    dev = argv[1];
    mode = !strcmp(argv[2], "uring") ? 1 : !strcmp(argv[2], "ioctl") ? 2 : 0;
    int rounds = argc > 3 ? atoi(argv[3]) : 3;
    int fd = open(dev, O_RDWR);
    if (fd < 0)
        die("open");
    uint64_t size;
    if (ioctl(fd, BLKGETSIZE64, &size) < 0)
        die("BLKGETSIZE64");
    uint64_t whole[2] = {0, size};
    if (ioctl(fd, BLKFLSBUF, 0) < 0 || ioctl(fd, BLKDISCARD, whole) < 0)
        die("reset");
    uint64_t n_ext = size / EXT;
    char *buf = aligned_alloc(4096, CH);
    for (uint64_t i = 0; i < CH; i++)
        buf[i] = (char)(rand() & 0xff);
    for (uint64_t e = 0; e < n_ext; e++) /* the cache full, untimed */
        for (uint64_t i = 0; i < PER; i++)
            if (pwrite(fd, buf, CH, (off_t)(e * EXT + i * CH)) != (ssize_t)CH)
                die("pwrite");
    fsync(fd);
    pthread_t t;
    pthread_create(&t, NULL, discarder, NULL);
    uint64_t n = (uint64_t)rounds * n_ext * PER, k = 0;
    uint64_t *lat = malloc(n * sizeof *lat);
    for (uint64_t r = 0; r < (uint64_t)rounds * n_ext; r++) {
        uint64_t e = r % n_ext;
        if (mode) {
            pthread_mutex_lock(&mu);
            queue_[qtail++ % (1 << 16)] = (e + AHEAD) % n_ext;
            pthread_cond_signal(&cv);
            pthread_mutex_unlock(&mu);
        }
        for (uint64_t i = 0; i < PER; i++) {
            uint64_t t0 = now_ns();
            if (pwrite(fd, buf, CH, (off_t)(e * EXT + i * CH)) != (ssize_t)CH)
                die("pwrite");
            lat[k++] = now_ns() - t0;
        }
    }
    pthread_mutex_lock(&mu);
    done = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(t, NULL);
    fsync(fd);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < k; i++)
        sum += lat[i];
    qsort(lat, k, sizeof *lat, cmp_u64);
    printf("%s %.1f %.1f %.1f\n", argv[2], lat[k / 2] / 1e3, lat[(uint64_t)(0.99 * (double)(k - 1))] / 1e3,
           (double)sum / (double)k / 1e3);
    return 0;
}
