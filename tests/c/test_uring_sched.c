/*
 * test_uring_sched.c - the io_uring engine's scheduler (rb_uring.h) on a temporary file:
 * loads sent before stores, stores cut into pieces within their byte budget, every piece of a
 * request completing before the request does, a failed piece failing its request alone, and
 * fifo keeping submission order. Order comes from the completion trace and the hold (test
 * hooks), budgets from the in-flight high-water marks; nothing is timed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "rb_device.h"
#include "rb_uring.h"

#define MiB ((size_t)1 << 20)
#define FILE_BYTES (64 * MiB)

static char path[] = "/tmp/rb-sched-XXXXXX";

static rb_dev *open_dev(unsigned depth, int mode, uint64_t wr_cap, uint64_t piece)
{
    rb_dev_config cfg = {.path = path,
                         .writable = 1,
                         .engine = RB_ENGINE_IOURING,
                         .alignment = 4096,
                         .queue_depth = depth,
                         .sched = {.mode = mode, .write_max_bytes = wr_cap, .write_piece_bytes = piece}};
    rb_dev *dev = NULL;
    rb_err err;
    rb_err_clear(&err);
    if (rb_dev_open(&cfg, &dev, &err) < 0) {
        fprintf(stderr, "open %s: %s\n", path, err.msg);
        exit(1);
    }
    return dev;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 131 + seed * 7 + (i >> 12));
}

/* One request of n bytes at off from/to buf, queued. */
static rb_batch *submit1(struct rb_uring *u, int op, uint64_t off, uint8_t *buf, size_t n)
{
    rb_err err;
    rb_batch *b = rb_batch_new(1, 0);
    CHECK(b != NULL);
    CHECK(rb_batch_set(u, b, 0, op, off, buf, n, n, n, (size_t)-1, &err) == 0);
    CHECK(rb_batch_prepare(u, b, &err) == 0);
    CHECK(rb_uring_submit(u, b) == 0);
    return b;
}

static int result(struct rb_uring *u, rb_batch *b)
{
    rb_err err;
    rb_uring_wait(u, b);
    int rc = rb_batch_result(b, 0, &err);
    rb_batch_free(b);
    return rc;
}

/* A 16 MiB store then a 64 KiB load, queued while the worker holds: the trace of completions. */
static size_t store_then_load(rb_dev *dev, uint8_t *w, uint8_t *r, rb_trace_ent *t, size_t max)
{
    struct rb_uring *u = rb_dev_uring(dev);
    CHECK(rb_uring_trace(u, max) == 0);
    rb_uring_hold(u, 1);
    rb_batch *bw = submit1(u, RB_REQ_WRITE, 0, w, 16 * MiB);
    rb_batch *br = submit1(u, RB_REQ_READ, 32 * MiB, r, 64 * 1024);
    rb_uring_hold(u, 0);
    CHECK(result(u, bw) == 0 && result(u, br) == 0);
    size_t n = rb_uring_trace_read(u, t, max);
    CHECK(rb_uring_trace(u, 0) == 0);
    return n;
}

static void test_loads_first_order(uint8_t *w, uint8_t *r)
{
    rb_trace_ent t[64];
    rb_dev *dev = open_dev(1, RB_SCHED_LOADS_FIRST, MiB, MiB);
    size_t n = store_then_load(dev, w, r, t, 64);
    CHECK(n == 17);
    CHECK(t[0].op == RB_REQ_READ && t[0].last); /* one ring entry: the load goes first */
    for (size_t i = 1; i < n; i++)
        CHECK(t[i].op == RB_REQ_WRITE && t[i].len == MiB && t[i].last == (i == n - 1));
    rb_stats_snapshot st;
    rb_dev_stats_read(dev, &st);
    CHECK(st.peak_write_inflight_bytes == MiB && st.split_requests == 1 && st.write_inflight_bytes == 0);
    rb_err err;
    CHECK(rb_dev_close(dev, &err) == 0);
    rb_dev_free(dev);
}

static void test_fifo_order(uint8_t *w, uint8_t *r)
{
    rb_trace_ent t[64];
    rb_dev *dev = open_dev(1, RB_SCHED_FIFO, 0, 0);
    size_t n = store_then_load(dev, w, r, t, 64);
    CHECK(n == 2);
    CHECK(t[0].op == RB_REQ_WRITE && t[0].len == 16 * MiB && t[1].op == RB_REQ_READ);
    rb_stats_snapshot st;
    rb_dev_stats_read(dev, &st);
    CHECK(st.peak_write_inflight_bytes == 16 * MiB && st.split_requests == 0);
    rb_err err;
    CHECK(rb_dev_close(dev, &err) == 0);
    rb_dev_free(dev);
}

/* Pieces all in flight at once, the first to complete fails: the request ends after its last
 * piece, with EIO; a second store beside it lands whole. */
static void test_failed_piece(uint8_t *w, uint8_t *r)
{
    rb_dev *dev = open_dev(64, RB_SCHED_LOADS_FIRST, 4 * MiB, MiB);
    struct rb_uring *u = rb_dev_uring(dev);
    rb_trace_ent t[16];
    CHECK(rb_uring_trace(u, 16) == 0);
    rb_uring_fail_write(u, 1);
    rb_uring_hold(u, 1);
    rb_batch *b1 = submit1(u, RB_REQ_WRITE, 0, w, 4 * MiB);
    rb_uring_hold(u, 0);
    CHECK(result(u, b1) == -EIO);
    size_t n = rb_uring_trace_read(u, t, 16);
    CHECK(n == 4 && !t[0].last && !t[1].last && !t[2].last && t[3].last);
    CHECK(result(u, submit1(u, RB_REQ_WRITE, 8 * MiB, w, 4 * MiB)) == 0);
    memset(r, 0, 4 * MiB);
    CHECK(result(u, submit1(u, RB_REQ_READ, 8 * MiB, r, 4 * MiB)) == 0);
    CHECK(memcmp(r, w, 4 * MiB) == 0);
    rb_stats_snapshot st;
    rb_dev_stats_read(dev, &st);
    CHECK(st.peak_write_inflight_bytes == 4 * MiB && st.outstanding_requests == 0);
    rb_err err;
    CHECK(rb_dev_close(dev, &err) == 0);
    rb_dev_free(dev);
}

int main(void)
{
    int fd = mkstemp(path);
    CHECK(fd >= 0 && ftruncate(fd, FILE_BYTES) == 0);
    close(fd);
    uint8_t *w = malloc(16 * MiB), *r = malloc(16 * MiB);
    CHECK(w && r);
    fill(w, 16 * MiB, 1);
    test_loads_first_order(w, r);
    test_fifo_order(w, r);
    test_failed_piece(w, r);
    free(w);
    free(r);
    unlink(path);
    printf("test_uring_sched: ok\n");
    return 0;
}
