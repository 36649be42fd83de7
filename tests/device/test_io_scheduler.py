"""The io_uring scheduler (io_scheduler): loads before stores, stores cut into pieces, bytes in
flight bounded per device, every attempt of a request in flight together; and fifo, the one
queue of before.

Order is asserted through the engine's completion trace (a test hook recording each attempt's
completion in order) and its hold (new requests wait in the queue until released, so requests
from several calls meet in one worker round); budgets through the in-flight high-water marks of
io_stats_snapshot(). Nothing here times anything.
"""

from __future__ import annotations

import errno
import pytest

from lmcache_rawblock import RawBlockDevice

KiB = 1024
MiB = 1024 * KiB
FILE_SIZE = 64 * MiB


def pattern(seed: int, n: int) -> bytes:
    """n bytes that differ per 4 KiB block and per seed."""
    out = bytearray(n)
    for blk in range(0, n, 4096):
        tag = ((seed * 7919 + blk // 4096) * 2654435761) & 0xFFFFFFFF
        out[blk : blk + 4096] = (tag.to_bytes(4, "little") * 1024)[: min(4096, n - blk)]
    return bytes(out)


@pytest.fixture
def dev_file(tmp_path):
    path = tmp_path / "dev.bin"
    with open(path, "wb") as f:
        f.truncate(FILE_SIZE)
    return str(path)


def open_dev(path, depth=64, **kw):
    try:
        return RawBlockDevice(path, True, io_engine="io_uring", iouring_queue_depth=depth, **kw)
    except RuntimeError as e:
        if "io_uring init failed" in str(e):
            pytest.skip(f"io_uring unavailable: {e}")
        raise


def held(dev, submit):
    """Run submit() (which queues batches and returns their ids) while the worker holds new
    requests back, with the completion trace on; release, wait for every batch and return
    (the wait results, the trace)."""
    dev._trace_engine(4096)
    dev._hold_engine(True)
    try:
        ids = submit()
    finally:
        dev._hold_engine(False)
    results = [dev.wait_iouring(i) for i in ids]
    return results, dev._trace_engine(0)


# --------------------------------------------------------------------------- settings


def test_defaults_and_settings_in_effect(dev_file):
    with open_dev(dev_file) as dev:
        assert dev.io_scheduler() == {
            "io_scheduler": "loads_first", "read_max_bytes_in_flight": 96 * MiB,
            "write_max_bytes_in_flight": 16 * MiB, "write_piece_bytes": 1 * MiB,
        }
    with open_dev(dev_file, io_scheduler="fifo") as dev:
        assert dev.io_scheduler()["io_scheduler"] == "fifo"
    # a piece larger than the write budget is cut to it; pieces are whole pages
    with open_dev(dev_file, write_max_bytes_in_flight=3 * MiB, write_piece_bytes=5 * MiB + 100) as dev:
        st = dev.io_scheduler()
        assert (st["write_max_bytes_in_flight"], st["write_piece_bytes"]) == (3 * MiB, 3 * MiB)
    with open_dev(dev_file, write_piece_bytes=5000) as dev:
        assert dev.io_scheduler()["write_piece_bytes"] == 4096
    with RawBlockDevice(dev_file, True) as dev:
        assert dev.io_scheduler() is None, "posix: no scheduler"


def test_bad_scheduler_values_name_the_setting(dev_file):
    with pytest.raises(ValueError, match=r"io_scheduler must be one of: loads_first, fifo; got 'reads_first'"):
        open_dev(dev_file, io_scheduler="reads_first")
    with pytest.raises(TypeError, match="io_scheduler must be a str or None"):
        open_dev(dev_file, io_scheduler=1)
    with pytest.raises(ValueError, match="write_piece_bytes"):
        open_dev(dev_file, write_piece_bytes=-1)
    with pytest.raises(ValueError, match="read_max_bytes_in_flight"):
        open_dev(dev_file, read_max_bytes_in_flight=1 << 41)


# --------------------------------------------------------------------------- order


@pytest.mark.parametrize("depth", [1, 64])
def test_a_load_queued_behind_a_large_store_completes_before_its_last_piece(dev_file, depth):
    """loads_first: a read submitted after a 16 MiB write ends before the write's last piece.
    With one ring entry the read ends before any piece of the write: it is sent first."""
    payload = pattern(1, 16 * MiB)
    out = bytearray(64 * KiB)
    with open_dev(dev_file, depth=depth, write_max_bytes_in_flight=1 * MiB, write_piece_bytes=1 * MiB) as dev:
        results, trace = held(dev, lambda: [
            dev.batched_write([0], [payload], [len(payload)]),
            dev.batched_read([32 * MiB], [out], [len(out)]),
        ])
        assert results == [([True], []), ([True], [])]
        writes = [i for i, t in enumerate(trace) if t[0] == "write"]
        reads = [i for i, t in enumerate(trace) if t[0] == "read"]
        assert len(writes) == 16 and len(reads) == 1, trace
        assert trace[writes[-1]][3] and trace[reads[0]][3], "the last attempts end their requests"
        assert reads[0] < writes[-1], trace
        if depth == 1:
            assert reads[0] == 0, trace
        st = dev.io_stats_snapshot()
        assert st["split_requests"] == 1 and st["write_attempts"] == 16
        assert st["peak_write_inflight_bytes"] == 1 * MiB
        check = bytearray(len(payload))
        assert dev.wait_iouring(dev.batched_read([0], [check], [len(check)])) == ([True], [])
        assert check == payload


def test_fifo_keeps_the_load_behind_the_store(dev_file):
    """fifo, one ring entry: the write goes first, whole, and the read after it."""
    payload = pattern(2, 16 * MiB)
    out = bytearray(64 * KiB)
    with open_dev(dev_file, depth=1, io_scheduler="fifo") as dev:
        results, trace = held(dev, lambda: [
            dev.batched_write([0], [payload], [len(payload)]),
            dev.batched_read([32 * MiB], [out], [len(out)]),
        ])
        assert results == [([True], []), ([True], [])]
        assert [(t[0], t[2]) for t in trace] == [("write", 16 * MiB), ("read", 64 * KiB)]
        st = dev.io_stats_snapshot()
        assert st["split_requests"] == 0 and st["write_attempts"] == 1
        assert st["peak_write_inflight_bytes"] == 16 * MiB, "fifo has no byte budget"


def test_loads_keep_submission_order_among_themselves(dev_file):
    outs = [bytearray(256 * KiB) for _ in range(6)]
    with open_dev(dev_file, depth=1) as dev:
        _, trace = held(dev, lambda: [dev.batched_read([i * MiB], [outs[i]], [len(outs[i])]) for i in range(6)])
        assert [t[1] for t in trace] == [i * MiB for i in range(6)]


# --------------------------------------------------------------------------- budgets


@pytest.mark.parametrize("sched", ["loads_first", "fifo"])
def test_byte_budgets_bound_what_is_in_flight(dev_file, sched):
    """Many stores and loads at once: under loads_first the high-water marks of bytes in flight
    stay within the budgets (a load longer than the read budget is cut to it); fifo has none."""
    rd_cap, wr_cap = 2 * MiB, 3 * MiB
    payloads = [pattern(10 + i, 4 * MiB) for i in range(6)]
    with open_dev(dev_file, io_scheduler=sched, read_max_bytes_in_flight=rd_cap, write_max_bytes_in_flight=wr_cap,
                  write_piece_bytes=1 * MiB) as dev:
        results, _ = held(dev, lambda: [dev.batched_write([i * 4 * MiB for i in range(6)], payloads, [4 * MiB] * 6)])
        assert results == [([True] * 6, [])]
        outs = [bytearray(5 * MiB) for _ in range(4)]
        more = [pattern(20 + i, 4 * MiB) for i in range(4)]
        results, _ = held(dev, lambda: [
            dev.batched_read([i * 4 * MiB for i in range(4)], outs, [5 * MiB] * 4),
            dev.batched_write([(8 + i) * 4 * MiB for i in range(4)], more, [4 * MiB] * 4),
        ])
        assert results == [([True] * 4, []), ([True] * 4, [])]
        for i in range(4):
            assert outs[i][: 4 * MiB] == payloads[i] and outs[i][4 * MiB :] == payloads[i + 1][: MiB]
        st = dev.io_stats_snapshot()
        assert st["read_inflight_bytes"] == 0 and st["write_inflight_bytes"] == 0, "nothing left in flight"
        if sched == "loads_first":
            assert st["peak_read_inflight_bytes"] == rd_cap, "reads cut to the budget, and it was used"
            assert st["peak_write_inflight_bytes"] == wr_cap
            assert st["peak_inflight_bytes"] <= rd_cap + wr_cap
            assert st["budget_waits"] > 0
        else:
            assert st["peak_read_inflight_bytes"] == 4 * 5 * MiB
            assert st["peak_write_inflight_bytes"] >= 6 * 4 * MiB
            assert st["budget_waits"] == 0


def test_every_piece_of_a_store_in_flight_together(dev_file):
    """A store of four pieces within the write budget: all four are in the kernel at once (fifo:
    one attempt, the whole store)."""
    payload = pattern(3, 4 * MiB)
    with open_dev(dev_file, write_max_bytes_in_flight=4 * MiB, write_piece_bytes=1 * MiB) as dev:
        assert dev.wait_iouring(dev.batched_write([0], [payload], [len(payload)])) == ([True], [])
        st = dev.io_stats_snapshot()
        assert (st["write_attempts"], st["peak_write_inflight_bytes"]) == (4, 4 * MiB)


def test_writes_leave_ring_entries_to_loads(dev_file):
    """Many one-page stores: writes hold at most three quarters of an 8-entry ring."""
    bufs = [pattern(40 + i, 4096) for i in range(64)]
    with open_dev(dev_file, depth=8) as dev:
        assert dev.wait_iouring(dev.batched_write([i * 4096 for i in range(64)], bufs, [4096] * 64))[0] == [True] * 64
        st = dev.io_stats_snapshot()
        assert st["peak_write_inflight_bytes"] <= 6 * 4096


# --------------------------------------------------------------------------- split stores


@pytest.mark.parametrize("odirect", [False, True])
def test_split_store_content_with_bounce_and_padding(dev_file, odirect):
    """A store cut into pieces lands whole: an unaligned source (bounced) with zero padding up
    to total_len, beside aligned ones."""
    raw = bytearray(3 * MiB + 8192)
    src = memoryview(raw)[1 : 1 + 3 * MiB - 100]
    src[:] = pattern(5, 3 * MiB)[: len(src)]
    aligned = pattern(6, 2 * MiB)
    try:
        dev = open_dev(dev_file, use_odirect=odirect, write_piece_bytes=256 * KiB)
    except OSError as e:
        if odirect and e.errno == errno.EINVAL:
            pytest.skip(f"file system refuses O_DIRECT: {e}")
        raise
    with dev:
        ok, errs = dev.wait_iouring(dev.batched_write([0, 4 * MiB], [src, aligned], [3 * MiB, 2 * MiB],
                                                      payload_lens=[len(src), len(aligned)]))
        assert (ok, errs) == ([True, True], [])
        back = bytearray(3 * MiB)
        assert dev.wait_iouring(dev.batched_read([0], [back], [len(back)])) == ([True], [])
        assert back[: len(src)] == bytes(src) and back[len(src) :] == bytes(100)
        back2 = bytearray(2 * MiB)
        assert dev.wait_iouring(dev.batched_read([4 * MiB], [back2], [len(back2)])) == ([True], [])
        assert back2 == aligned
        assert dev.io_stats_snapshot()["split_requests"] == 2


def test_a_failed_piece_fails_its_request_alone(dev_file):
    """The third write attempt to complete reports EIO: the store it belongs to fails once all its
    pieces ended, with the error; the other store of the batch and a later one succeed."""
    a, b = pattern(7, 2 * MiB), pattern(8, 2 * MiB)
    with open_dev(dev_file, depth=1, write_piece_bytes=512 * KiB) as dev:
        dev._fail_engine_write(3)
        ok, errs = dev.wait_iouring(dev.batched_write([0, 4 * MiB], [a, b], [len(a), len(b)]))
        assert ok == [False, True]
        assert errs == [(0, "OSError: [Errno 5] io_uring I/O error")]
        st = dev.io_stats_snapshot()
        assert st["outstanding_requests"] == 0 and st["write_inflight_bytes"] == 0
        assert st["write_attempts"] == 7, "depth 1: the failed store's last piece is never sent"
        assert dev.wait_iouring(dev.batched_write([0], [a], [len(a)])) == ([True], [])
        back = [bytearray(2 * MiB), bytearray(2 * MiB)]
        assert dev.wait_iouring(dev.batched_read([0, 4 * MiB], back, [2 * MiB] * 2)) == ([True, True], [])
        assert back == [a, b]


def test_failed_piece_with_pieces_still_in_flight_waits_for_them(dev_file):
    """All pieces in flight at once, the first to complete fails: the request ends only after
    every piece ended (no piece completes after its request was reported)."""
    a = pattern(9, 4 * MiB)
    with open_dev(dev_file, write_max_bytes_in_flight=4 * MiB, write_piece_bytes=512 * KiB) as dev:
        dev._fail_engine_write(1)
        _, trace = held(dev, lambda: [dev.batched_write([0], [a], [len(a)])])
        assert len(trace) == 8 and [t[3] for t in trace] == [False] * 7 + [True], trace
        assert dev.io_stats_snapshot()["write_inflight_bytes"] == 0
