"""The floor of start-up slot-header validation: the wall time of reading the same headers with
the cheapest user-space loop there is, in C, with no index, no hashing and no worker thread.

Two loops over N headers of ``length`` bytes at ``base + i * stride``:

* ``pread``: one pread per header on the calling thread (the sequential reader's floor);
* ``io_uring``: batches of ``depth`` reads, each batch submitted with one ``io_uring_enter`` and
  waited for whole (the batched reader's floor at the same queue depth).

Both read into one buffer per in-flight read, touched beforehand, so a buffered read completes
inline. Figures are medians over rounds of the wall time of the whole set (CLOCK_MONOTONIC).
The program is compiled on first use like the per-key floor (:mod:`.floor`).
"""

from __future__ import annotations

import subprocess

from . import floor

SOURCE = r"""
/* header_floor FILE ODIRECT(0|1) N STRIDE BASE LENGTH DEPTH ROUNDS:
 * "pread MEDIAN_US" and "io_uring MEDIAN_US", the wall time of reading N headers. */
""" + floor.PRELUDE + r"""
static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static long arg(const char *s, const char *name, long lo, long hi)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "%s must be an integer in %ld..%ld, got %s\n", name, lo, hi, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr, "usage: %s FILE ODIRECT N STRIDE BASE LENGTH DEPTH ROUNDS\n", argv[0]);
        return 2;
    }
    int odirect = (int)arg(argv[2], "ODIRECT", 0, 1);
    long n = arg(argv[3], "N", 1, 10000000), stride = arg(argv[4], "STRIDE", 1, 1L << 30);
    long base = arg(argv[5], "BASE", 0, 1L << 50), len = arg(argv[6], "LENGTH", 1, 1 << 20);
    long depth = arg(argv[7], "DEPTH", 1, 4096), rounds = arg(argv[8], "ROUNDS", 1, 100000);
    int fd = open(argv[1], O_RDONLY | (odirect ? O_DIRECT : 0));
    if (fd < 0)
        die("open");
    size_t slot = ((size_t)len + 4095) & ~(size_t)4095;
    char *buf;
    if (posix_memalign((void **)&buf, 4096, slot * (size_t)depth))
        die("posix_memalign");
    memset(buf, 0, slot * (size_t)depth);
    struct io_uring ring;
    int rc = io_uring_queue_init((unsigned)depth, &ring, 0);
    if (rc < 0) {
        fprintf(stderr, "io_uring_queue_init: %s\n", strerror(-rc));
        return 1;
    }
    double *t = malloc(sizeof(double) * (size_t)rounds);
    if (!t)
        die("malloc");
    for (int mode = 0; mode < 2; mode++) {
        for (long r = 0; r < rounds; r++) {
            double t0 = now_us();
            if (mode == 0) {
                for (long i = 0; i < n; i++)
                    if (pread(fd, buf, (size_t)len, base + i * stride) != len)
                        die("pread");
            } else {
                for (long lo = 0; lo < n; lo += depth) {
                    long cnt = n - lo < depth ? n - lo : depth;
                    for (long j = 0; j < cnt; j++)
                        io_uring_prep_read(io_uring_get_sqe(&ring), fd, buf + (size_t)j * slot, (unsigned)len,
                                           (unsigned long long)(base + (lo + j) * stride));
                    if (io_uring_submit_and_wait(&ring, (unsigned)cnt) < 0)
                        die("io_uring_submit_and_wait");
                    for (long j = 0; j < cnt; j++) {
                        struct io_uring_cqe *cqe;
                        if (io_uring_wait_cqe(&ring, &cqe) < 0)
                            die("io_uring_wait_cqe");
                        if (cqe->res != len) {
                            fprintf(stderr, "read: %s\n", cqe->res < 0 ? strerror(-cqe->res) : "short");
                            return 1;
                        }
                        io_uring_cqe_seen(&ring, cqe);
                    }
                }
            }
            t[r] = now_us() - t0;
        }
        qsort(t, (size_t)rounds, sizeof(double), cmp_double);
        printf("%s %.2f\n", mode == 0 ? "pread" : "io_uring", t[rounds / 2]);
    }
    return 0;
}
"""


def build(directory: str | None = None) -> tuple[str | None, str | None]:
    """The compiled program: (path, None), or (None, why it could not be built)."""
    return floor.build(directory, source=SOURCE, name="header_floor")


def run(exe: str, path: str, *, odirect: bool, n: int, stride: int, base: int, length: int, depth: int,
        rounds: int) -> dict[str, float]:
    """{"pread": seconds, "io_uring": seconds}: median wall time of reading the n headers."""
    args = [exe, path, "1" if odirect else "0", str(n), str(stride), str(base), str(length), str(depth),
            str(rounds)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"header_floor exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    out = {}
    for line in proc.stdout.splitlines():
        name, med = line.split()
        out[name] = float(med) * 1e-6
    return out
