/*
 * io_floor.c - the kernel's share of a 64-key x 64 KiB put / load, measured with the
 * cheapest user-space loop there is (no index, no Python, no worker thread): CPU time
 * (getrusage, all threads of the process) per key.
 *
 *   io_floor FILE ODIRECT ROUNDS
 *
 * Layout as the raw-block tier's: slot = one 4 KiB header block + the 64 KiB payload, slots
 * back to back after 1 MiB of metadata. A put writes the payload and the header (two
 * writes per key, as LMCache's core and ours do); a load reads the payload. Engines:
 * pread/pwrite one key at a time, and io_uring with one submission per 64 keys, without and
 * with registered (fixed) payload buffers. Output: one line per row,
 * "engine op fixed=0|1 median_us mean_us", for bench_core.py to read.
 *
 * bench_core.py compiles and runs it next to its per-key CPU section, so the table shows
 * what no user-space change can remove on the machine that produced it.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define NKEYS 64
#define PAYLOAD (64 * 1024)
#define HDR 4096
#define SLOT (HDR + PAYLOAD)
#define BASE (1 << 20)
#define BATCHES 8 /* batches per sample: getrusage is tick-granular on some kernels */

static double cpu_now(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

enum { POSIX, URING };

static void run_posix(int fd, char **bufs, char *hdr, int put)
{
    for (int i = 0; i < NKEYS; i++) {
        off_t slot = BASE + (off_t)i * SLOT;
        if (put) {
            if (pwrite(fd, bufs[i], PAYLOAD, slot + HDR) != PAYLOAD || pwrite(fd, hdr, HDR, slot) != HDR)
                die("pwrite");
        } else if (pread(fd, bufs[i], PAYLOAD, slot + HDR) != PAYLOAD) {
            die("pread");
        }
    }
}

static void run_uring(struct io_uring *ring, int fd, char **bufs, char *hdr, int put, int fixed)
{
    unsigned n = 0;
    for (int i = 0; i < NKEYS; i++) {
        off_t slot = BASE + (off_t)i * SLOT;
        struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
        if (put) {
            if (fixed)
                io_uring_prep_write_fixed(sqe, fd, bufs[i], PAYLOAD, slot + HDR, i);
            else
                io_uring_prep_write(sqe, fd, bufs[i], PAYLOAD, slot + HDR);
            sqe = io_uring_get_sqe(ring);
            io_uring_prep_write(sqe, fd, hdr, HDR, slot);
            n += 2;
        } else {
            if (fixed)
                io_uring_prep_read_fixed(sqe, fd, bufs[i], PAYLOAD, slot + HDR, i);
            else
                io_uring_prep_read(sqe, fd, bufs[i], PAYLOAD, slot + HDR);
            n++;
        }
    }
    if (io_uring_submit_and_wait(ring, n) < 0)
        die("io_uring_submit_and_wait");
    for (unsigned j = 0; j < n; j++) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(ring, &cqe) < 0)
            die("io_uring_wait_cqe");
        if (cqe->res < 0) {
            fprintf(stderr, "completion: %s\n", strerror(-cqe->res));
            exit(1);
        }
        io_uring_cqe_seen(ring, cqe);
    }
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s FILE ODIRECT(0|1) ROUNDS\n", argv[0]);
        return 2;
    }
    int odirect = atoi(argv[2]), rounds = atoi(argv[3]);
    if (rounds < 1 || rounds > 100000) {
        fprintf(stderr, "ROUNDS must be in 1..100000, got %d\n", rounds);
        return 2;
    }
    int fd = open(argv[1], O_RDWR | (odirect ? O_DIRECT : 0));
    if (fd < 0)
        die("open");
    char *bufs[NKEYS], *hdr;
    struct iovec iov[NKEYS];
    for (int i = 0; i < NKEYS; i++) {
        if (posix_memalign((void **)&bufs[i], 4096, PAYLOAD))
            die("posix_memalign");
        memset(bufs[i], i, PAYLOAD);
        iov[i] = (struct iovec){bufs[i], PAYLOAD};
    }
    if (posix_memalign((void **)&hdr, 4096, HDR))
        die("posix_memalign");
    memset(hdr, 0, HDR);
    memcpy(hdr, "LMCBLK01", 8);
    struct io_uring ring;
    int rc = io_uring_queue_init(256, &ring, 0);
    if (rc < 0) {
        fprintf(stderr, "io_uring_queue_init: %s\n", strerror(-rc));
        return 1;
    }
    if ((rc = io_uring_register_buffers(&ring, iov, NKEYS)) < 0) {
        fprintf(stderr, "io_uring_register_buffers: %s\n", strerror(-rc));
        return 1;
    }
    static const struct { int engine, put, fixed; const char *name; } rows[] = {
        {POSIX, 1, 0, "posix put"},  {POSIX, 0, 0, "posix load"},    {URING, 1, 0, "io_uring put"},
        {URING, 0, 0, "io_uring load"}, {URING, 1, 1, "io_uring put"}, {URING, 0, 1, "io_uring load"},
    };
    double *per = malloc(sizeof(double) * (size_t)rounds);
    if (!per)
        die("malloc");
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
        double sum = 0;
        for (int k = 0; k < rounds; k++) {
            double t0 = cpu_now();
            for (int b = 0; b < BATCHES; b++) {
                if (rows[r].engine == POSIX)
                    run_posix(fd, bufs, hdr, rows[r].put);
                else
                    run_uring(&ring, fd, bufs, hdr, rows[r].put, rows[r].fixed);
            }
            per[k] = (cpu_now() - t0) / (BATCHES * NKEYS);
            sum += per[k];
        }
        qsort(per, (size_t)rounds, sizeof(double), cmp_double);
        printf("%s fixed=%d %.2f %.2f\n", rows[r].name, rows[r].fixed, per[rounds / 2] * 1e6, sum / rounds * 1e6);
    }
    return 0;
}
