"""The kernel floor of a 64-key x 64 KiB put / load: the CPU time the kernel alone needs for the
same transfers, measured by a small C program with the cheapest user-space loop there is (no
index, no Python, no worker thread). No implementation can go below it, so *LMCache / floor*
is the best ratio a machine allows.

The program's source is kept here, not as a separate file, so it is part of every install of
the package: the first run compiles it with the system C compiler (``$CC``, default ``cc``,
linked with ``-luring``; Debian: ``apt-get install gcc liburing-dev``) into
``$XDG_CACHE_HOME/lmcache-rawblock/`` (default ``~/.cache``), keyed by a hash of the source,
and later runs reuse the binary. Without a compiler or liburing the floor is reported as not
measured, with the compiler's message.

Layout as the raw-block tier's: slot = one 4 KiB header block + the 64 KiB payload, slots back
to back after 1 MiB of metadata. A put writes the payload and the header (two writes per key,
as both cores do); a load reads the payload. Engines: pread/pwrite one key at a time, and
io_uring with one submission per 64 keys, without and with registered (fixed) payload buffers.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile

NKEYS, PAYLOAD, HEADER, BASE = 64, 64 * 1024, 4096, 1 << 20
FILE_BYTES = BASE + (NKEYS + 1) * (HEADER + PAYLOAD)

# The floor programs' common start: headers, the median's comparison, the error exit.
PRELUDE = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

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
"""

SOURCE = r"""
/* io_floor FILE ODIRECT(0|1) ROUNDS: CPU time (getrusage, all threads) per key of a 64-key x
 * 64 KiB put / load. One line per row: "engine op fixed=0|1 median_us mean_us". */
""" + PRELUDE + r"""
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
"""


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lmcache-rawblock")


def build(directory: str | None = None, *, source: str = SOURCE,
          name: str = "io_floor") -> tuple[str | None, str | None]:
    """The compiled program (``source``, cached as ``name-<hash>``): (path, None), or (None, why
    it could not be built)."""
    cc = os.environ.get("CC", "cc")
    tag = hashlib.sha256((cc + source).encode()).hexdigest()[:12]
    directory = directory or cache_dir()
    exe = os.path.join(directory, f"{name}-{tag}")
    if os.access(exe, os.X_OK):
        return exe, None
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            src = os.path.join(tmp, f"{name}.c")
            with open(src, "w", encoding="utf-8") as f:
                f.write(source)
            out = os.path.join(tmp, name)
            proc = subprocess.run([cc, "-O2", "-o", out, src, "-luring"], capture_output=True, text=True,
                                  timeout=120)
            if proc.returncode != 0:
                lines = (proc.stderr or proc.stdout).strip().splitlines() or [f"{cc} exited {proc.returncode}"]
                return None, f"{cc} failed: {lines[-1]}"
            os.replace(out, exe)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot compile {name} with {cc}: {exc}"
    return exe, None


def run(exe: str, path: str, odirect: bool, rounds: int) -> dict[tuple[str, str, bool], float]:
    """{(engine, op, fixed buffers): median CPU seconds per key} on *path* (FILE_BYTES long)."""
    proc = subprocess.run([exe, path, "1" if odirect else "0", str(rounds)], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"io_floor exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    out = {}
    for line in proc.stdout.splitlines():
        engine, op, fixed, med, _mean = line.split()
        out[(engine, op, fixed == "fixed=1")] = float(med) * 1e-6
    return out
