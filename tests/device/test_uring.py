"""io_uring engine of RawBlockDevice: batched I/O, queue pressure, per-entry errors, fixed
buffers, counters, threads, close/dealloc while busy, GIL release, and LMCache's error texts.

Every test runs against a temporary file. O_DIRECT cases skip (with the reason) where the
file system refuses O_DIRECT; everything else needs a kernel with io_uring.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import tty
import warnings

import pytest

from helpers import PEP688, PythonBuffer
from lmcache_rawblock import RawBlockDevice

np = pytest.importorskip("numpy", reason="numpy gives stable, registrable buffer addresses")

KiB = 1024
MiB = 1024 * KiB
FILE_SIZE = 8 * MiB
DEPRECATION_TEXT = (
    "RawBlockDevice.read_uring() is deprecated; use batched_read() followed by wait_iouring() instead."
)


def pattern(offset: int, n: int) -> bytes:
    """Deterministic, position-dependent bytes: every 4 KiB block differs."""
    out = bytearray(n)
    for blk in range(0, n, 4096):
        tag = ((offset + blk) // 4096 * 2654435761) & 0xFFFFFFFF
        chunk = tag.to_bytes(4, "little") * 1024
        out[blk : blk + 4096] = chunk[: min(4096, n - blk)]
    return bytes(out)


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "dev.bin"
    with open(path, "wb") as f:
        f.write(pattern(0, FILE_SIZE))
    return str(path)


def open_dev(path, writable=True, odirect=False, depth=64, **kw):
    try:
        return RawBlockDevice(
            path, writable, use_odirect=odirect, io_engine="io_uring", iouring_queue_depth=depth, **kw
        )
    except OSError as e:
        if odirect and e.errno == errno.EINVAL:
            pytest.skip(f"file system refuses O_DIRECT: {e}")
        raise
    except RuntimeError as e:
        if "io_uring init failed" in str(e):
            pytest.skip(f"io_uring unavailable: {e}")
        raise


def unaligned_buffer(n: int, shift: int = 1) -> memoryview:
    """A writable view whose address is off a 4 KiB boundary by `shift` bytes."""
    raw = bytearray(n + 8192)
    addr = np.frombuffer(raw, dtype=np.uint8).ctypes.data
    start = (4096 - addr % 4096) % 4096 + shift
    return memoryview(raw)[start : start + n]


def aligned_array(n: int, align: int = 4096, shift: int = 0):
    """A numpy uint8 array of n bytes whose address is `shift` bytes past an `align` boundary."""
    raw = np.empty(n + 2 * align, dtype=np.uint8)
    start = (align - raw.ctypes.data % align) % align + shift
    return raw[start : start + n]


def uring_threads() -> set[str]:
    """Thread ids of this process's io_uring workers (named rb-uring)."""
    tids = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "rb-uring":
                    tids.add(tid)
        except OSError:
            pass
    return tids


def wait_threads_gone(tids: set[str], timeout: float = 5.0) -> set[str]:
    """Return which of ``tids`` are still listed after at most ``timeout`` s.

    pthread_join returns once the kernel clears the thread's tid, a moment
    before the task leaves /proc/self/task, so a listing taken straight
    after close() can still show a joined worker.  A worker that was not
    joined stays listed for good.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = tids & uring_threads()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def fds_open_on(target: str) -> list[int]:
    """This process's file descriptors whose /proc link names ``target``."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                fds.append(int(fd))
        except OSError:
            pass  # the directory's own descriptor, already closed
    return fds


@contextlib.contextmanager
def held_back_device():
    """A device whose reads the test completes: the slave end of a pseudo-terminal (a character
    device) in raw mode. A read on it stays in flight until bytes are written to the master end,
    so the test decides when it finishes. Yields (path, master_fd).

    The device opens the terminal without O_NOCTTY, which makes it the controlling terminal of a
    session leader that has none; closing the master would then send SIGHUP. Only a session
    leader is exposed, and it ignores SIGHUP while the terminal exists."""
    master, slave = os.openpty()
    leader = os.getsid(0) == os.getpid()
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN) if leader else None
    try:
        tty.setraw(slave)  # bytes reach the reader as written: no line editing, no echo
        yield os.ttyname(slave), master
    finally:
        os.close(slave)
        os.close(master)
        if leader:
            signal.signal(signal.SIGHUP, old)


class CallWatch:
    """Runs ``fn(*args)`` in a thread and tells when that thread is inside the C function
    ``name`` (``fn`` itself, or a builtin that the Python function ``fn`` calls directly): a
    per-thread profile hook sees the call start and end, and the thread is inside it when the
    start was seen, the end was not, and its innermost Python frame is the caller's (the hook's
    frame is gone). The observer holds the GIL while it looks, so a thread found inside is
    running or blocked in C without it."""

    def __init__(self, name: str, fn, *args):
        self.name, self.fn, self.args = name, fn, args
        self.caller = getattr(fn, "__code__", None) or CallWatch._run.__code__
        self.entered, self.returned = threading.Event(), threading.Event()
        self.result: dict = {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _profile(self, frame, event, arg):
        if event in ("c_call", "c_return", "c_exception") and getattr(arg, "__name__", None) == self.name:
            (self.entered if event == "c_call" else self.returned).set()

    def _run(self):
        sys.setprofile(self._profile)  # this thread only
        try:
            self.result["value"] = self.fn(*self.args)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            self.result["error"] = e
        finally:
            sys.setprofile(None)

    def start(self) -> "CallWatch":
        self.thread.start()
        return self

    def wait_inside(self, timeout: float) -> bool:
        """True once the thread is seen inside the call; False if it returned or time ran out."""
        deadline = time.monotonic() + timeout
        while not self.returned.is_set() and time.monotonic() < deadline:
            frame = sys._current_frames().get(self.thread.ident)
            if self.entered.is_set() and not self.returned.is_set() and frame is not None \
                    and frame.f_code is self.caller:
                return True
            time.sleep(0.001)
        return False


# --------------------------------------------------------------------------- basics


def test_round_trip_and_worker_thread(data_file):
    gc.collect()  # devices other tests left for the collector
    before = uring_threads()
    dev = open_dev(data_file, depth=8)
    mine = uring_threads() - before
    assert len(mine) == 1, "one worker thread named rb-uring per device"
    payload = b"hello io_uring" * 100
    bid = dev.batched_write([4096], [payload], [len(payload)])
    assert isinstance(bid, int) and bid >= 1
    assert dev.wait_iouring(bid) == ([True], [])
    out = bytearray(len(payload))
    assert dev.wait_iouring(dev.batched_read([4096], [out], [len(payload)])) == ([True], [])
    assert bytes(out) == payload
    assert dev.worker_error() is None
    dev.close()
    assert wait_threads_gone(mine) == set(), "close() joins the worker"


def test_batch_ids_and_unknown_ids(data_file):
    dev = open_dev(data_file, depth=4)
    a = dev.batched_write([], [], [])
    b = dev.batched_read([0], [bytearray(16)], [16])
    c = dev.batched_read([], [], [])
    assert a < b < c, "ids increase and are shared by reads and writes"
    assert dev.wait_iouring(a) == ([], []), "empty batch"
    assert dev.wait_iouring(b) == ([True], [])
    assert dev.wait_iouring(b) == ([], []), "already waited"
    assert dev.wait_iouring(987654321) == ([], []), "unknown"
    assert dev.wait_iouring(batch_id=0) == ([], [])
    with pytest.raises(OverflowError, match="can't convert negative int to unsigned"):
        dev.wait_iouring(-1)
    dev.close()


def test_posix_device_refuses_uring_methods(data_file):
    dev = RawBlockDevice(data_file, True)
    for call in (
        lambda: dev.batched_write([0], [b"a"], [1]),
        lambda: dev.batched_read([0], [bytearray(1)], [1]),
        lambda: dev.write_uring(0, b"a", 1),
        lambda: dev.register_fixed_buffers([1], [1]),
    ):
        with pytest.raises(RuntimeError, match="^io_uring not enabled$"):
            call()
    with pytest.warns(DeprecationWarning):
        with pytest.raises(RuntimeError, match="^io_uring not enabled$"):
            dev.read_uring(0, bytearray(1), 1)
    assert dev.wait_iouring(1) == ([], [])
    assert dev.worker_error() is None
    assert dev.fixed_buffer_status() == (False, 0)
    dev.close()


def test_legacy_use_iouring_flag(data_file):
    dev = RawBlockDevice(data_file, True, use_iouring=True, iouring_queue_depth=2)
    assert dev.wait_iouring(dev.batched_read([0], [bytearray(8)], [8])) == ([True], [])
    dev.close()


# --------------------------------------------------------------------------- queue pressure


@pytest.mark.parametrize("odirect", [False, True], ids=["buffered", "odirect"])
@pytest.mark.parametrize("depth", [1, 2, 4, 64])
def test_queue_pressure(data_file, depth, odirect):
    dev = open_dev(data_file, odirect=odirect, depth=depth)
    n = depth * 16
    for rep in range(3):
        offsets = [((i * 7 + rep) % (FILE_SIZE // 4096)) * 4096 for i in range(n)]
        # mix of plain bytearrays (address chosen by the allocator) and deliberately unaligned views
        bufs = [bytearray(4096) if i % 2 else unaligned_buffer(4096, shift=1 + i % 7) for i in range(n)]
        ok, errs = dev.wait_iouring(dev.batched_read(offsets, bufs, [4096] * n))
        assert errs == []
        assert ok == [True] * n
        for off, buf in zip(offsets, bufs):
            assert bytes(buf) == pattern(off, 4096)
    st = dev.io_stats_snapshot()
    assert st["read_attempts"] >= 3 * n
    assert st["outstanding_requests"] == 0 and st["queued_requests"] == 0
    assert st["peak_outstanding_requests"] >= n
    assert st["max_batch_size"] == n
    if depth < n:
        assert st["queue_full_events"] > 0, "a batch larger than the ring waits in the software queue"
    if odirect:
        assert st["bounce_attempts"] > 0, "unaligned buffers under O_DIRECT go through bounce buffers"
    dev.close()


@pytest.mark.parametrize("odirect", [False, True], ids=["buffered", "odirect"])
def test_write_pressure_round_trip(data_file, odirect):
    dev = open_dev(data_file, odirect=odirect, depth=2)
    n = 64
    offsets = [i * 8192 for i in range(n)]
    srcs = [bytes([i]) * 4096 for i in range(n)]
    ok, errs = dev.wait_iouring(dev.batched_write(offsets, srcs, [4096] * n))
    assert (ok, errs) == ([True] * n, [])
    outs = [unaligned_buffer(4096, 3) for _ in range(n)]
    assert dev.wait_iouring(dev.batched_read(offsets, outs, [4096] * n)) == ([True] * n, [])
    assert [bytes(o) for o in outs] == srcs
    dev.close()


# --------------------------------------------------------------------------- per-entry errors


def test_mixed_batch_read_past_eof(data_file):
    dev = open_dev(data_file, depth=4)
    bufs = [bytearray(4096) for _ in range(5)]
    offsets = [0, FILE_SIZE, 8192, FILE_SIZE - 2048, 4096]
    ok, errs = dev.wait_iouring(dev.batched_read(offsets, bufs, [4096] * 5))
    assert ok == [True, False, True, False, True]
    assert errs == [
        (1, "RuntimeError: Unexpected short I/O: internal error"),
        (3, "RuntimeError: Unexpected short I/O: internal error"),
    ]
    for i in (0, 2, 4):
        assert bytes(bufs[i]) == pattern(offsets[i], 4096)
    st = dev.io_stats_snapshot()
    assert st["short_io_resubmits"] >= 1, "the read straddling EOF was short, then resubmitted"
    assert st["failed_attempts"] >= 2
    dev.close()


def test_mixed_batch_write_on_read_only_device(data_file):
    dev = open_dev(data_file, writable=False, depth=4)
    ok, errs = dev.wait_iouring(dev.batched_write([0, 4096], [b"x" * 4096, b"y" * 4096], [4096, 4096]))
    assert ok == [False, False]
    assert errs == [(0, "OSError: [Errno 9] io_uring I/O error"), (1, "OSError: [Errno 9] io_uring I/O error")]
    # reads on the same ring are unaffected
    out = bytearray(4096)
    assert dev.wait_iouring(dev.batched_read([4096], [out], [4096])) == ([True], [])
    assert bytes(out) == pattern(4096, 4096)
    with pytest.raises(OSError, match=r"\[Errno 9\] io_uring I/O error") as ei:
        dev.write_uring(0, b"z" * 16, 16)
    assert ei.value.errno == errno.EBADF
    dev.close()


def test_mixed_batch_misaligned_odirect(data_file):
    # alignment=256 passes our validation, but the file system needs >= 512: the kernel says EINVAL
    dev = open_dev(data_file, odirect=True, depth=4, alignment=256)
    good = [aligned_array(4096) for _ in range(2)]
    bad_view = aligned_array(4096)  # aligned buffer, but offset 256 is not a multiple of 512
    ok, errs = dev.wait_iouring(dev.batched_read([0, 256, 8192], [good[0], bad_view, good[1]], [4096, 4096, 4096]))
    assert ok == [True, False, True]
    assert errs == [(1, "OSError: [Errno 22] io_uring I/O error")]
    assert good[0].tobytes() == pattern(0, 4096) and good[1].tobytes() == pattern(8192, 4096)
    dev.close()


# --------------------------------------------------------------------------- padding, placement


def test_payload_lens_zero_padding(data_file):
    dev = open_dev(data_file, depth=4)
    src_full = bytearray(b"P" * 100 + b"\xee" * 3996)  # garbage after the payload: must not reach disk
    src_short = b"Q" * 50  # shorter than total_len: bounced and padded
    src_clean = bytearray(b"R" * 10 + b"\0" * 4086)  # padding already zero: written directly
    before = bytes(src_full)
    ok, errs = dev.wait_iouring(
        dev.batched_write([0, 4096, 8192], [src_full, src_short, src_clean], [4096] * 3, None, [100, 50, 10])
    )
    assert (ok, errs) == ([True] * 3, [])
    assert bytes(src_full) == before, "the source is never modified"
    with open(data_file, "rb") as f:
        disk = f.read(3 * 4096)
    assert disk[:4096] == b"P" * 100 + b"\0" * 3996
    assert disk[4096:8192] == b"Q" * 50 + b"\0" * 4046
    assert disk[8192:12288] == b"R" * 10 + b"\0" * 4086
    st = dev.io_stats_snapshot()
    assert st["bounce_attempts"] == 2, "dirty padding and the short buffer bounce; the clean one does not"
    # keyword form and write_uring padding
    dev.write_uring(12288, b"S" * 7, 7, 4096, None)
    with open(data_file, "rb") as f:
        f.seek(12288)
        assert f.read(4096) == b"S" * 7 + b"\0" * 4089
    dev.close()


def test_short_read_buffer_bounces(data_file):
    dev = open_dev(data_file, depth=2)
    small = bytearray(100)
    assert dev.wait_iouring(dev.batched_read([4096], [small], [4096])) == ([True], [])
    assert bytes(small) == pattern(4096, 4096)[:100]
    dev.close()


def test_placement_ids_validation(data_file):
    dev = open_dev(data_file, depth=2)
    args = ([0], [b"a"], [1])
    with pytest.raises(ValueError, match="^placement_ids must have same length as offsets$"):
        dev.batched_write(*args, [None, None])
    with pytest.raises(ValueError, match="^placement_id must not be 0; use None to omit the FDP directive$"):
        dev.batched_write(*args, [0])
    for bad in (-1, 65536, 2**70):
        with pytest.raises(ValueError, match=r"^placement_id must be in range 1\.\.=65535$"):
            dev.batched_write(*args, [bad])
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        dev.batched_write(*args, ["x"])
    # valid ids are accepted (and ignored: no NVMe passthrough on a file)
    assert dev.wait_iouring(dev.batched_write([0, 1], [b"a", b"b"], [1, 1], [None, 65535])) == ([True, True], [])
    assert dev.wait_iouring(dev.batched_write(*args, placement_ids=[1])) == ([True], [])
    with pytest.raises(ValueError, match="^placement_id must not be 0"):
        dev.write_uring(0, b"a", 1, 1, 0)
    with pytest.raises(ValueError, match="^placement_id must be in range"):
        dev.write_uring(0, b"a", 1, None, 70000)
    dev.write_uring(0, b"a", 1, None, 7)
    dev.close()


# --------------------------------------------------------------------------- error texts


def test_batched_write_error_texts(data_file):
    dev = open_dev(data_file, depth=2)
    with pytest.raises(ValueError, match="^All vectors must have same length$"):
        dev.batched_write([0], [b"a", b"b"], [1])
    with pytest.raises(ValueError, match="^All vectors must have same length$"):
        dev.batched_write([0], [b"a"], [1, 1])
    with pytest.raises(ValueError, match="^payload_lens must have same length as offsets$"):
        dev.batched_write([0], [b"a"], [1], None, [1, 2])
    with pytest.raises(ValueError, match="^total_len must be >= payload_len$"):
        dev.batched_write([0], [b"ab"], [1], None, [2])
    with pytest.raises(ValueError, match="^input buffer too small: cap=1 need=4$"):
        dev.batched_write([0], [b"a"], [4])
    with pytest.raises(TypeError, match="a bytes-like object is required, not 'int'"):
        dev.batched_write([0], [5], [1])
    with pytest.raises(OverflowError, match="can't convert negative int to unsigned"):
        dev.batched_write([-1], [b"a"], [1])
    with pytest.raises(TypeError, match="argument 'offsets': 'list_iterator' object cannot be converted to 'Sequence'"):
        dev.batched_write(iter([0]), [b"a"], [1])
    with pytest.raises(BufferError, match="^memoryview: underlying buffer is not contiguous$"):
        dev.batched_write([0], [memoryview(bytearray(8))[::2]], [4])
    # a tuple is a sequence too
    assert dev.wait_iouring(dev.batched_write((0,), (b"a",), (1,))) == ([True], [])
    dev.close()


def test_batched_read_error_texts(data_file):
    dev = open_dev(data_file, depth=2)
    with pytest.raises(ValueError, match="^All vectors must have same length$"):
        dev.batched_read([0], [bytearray(4)], [4, 4])
    with pytest.raises(BufferError, match="^Object is not writable.$"):
        dev.batched_read([0], [b"abcd"], [4])
    with pytest.raises(ValueError, match="^output buffer too small: cap=0 need=4$"):
        dev.batched_read([0], [bytearray(0)], [4])
    dev.close()


def test_odirect_alignment_texts(data_file):
    dev = open_dev(data_file, odirect=True, depth=2)
    with pytest.raises(ValueError, match="^O_DIRECT requires aligned offset$"):
        dev.batched_write([1], [b"a"], [4096])
    with pytest.raises(ValueError, match="^O_DIRECT requires aligned total_len$"):
        dev.batched_write([0], [b"a"], [100])
    with pytest.raises(ValueError, match="^O_DIRECT requires aligned offset$"):
        dev.batched_read([1], [bytearray(4096)], [4096])
    with pytest.raises(ValueError, match="^O_DIRECT requires aligned total_len$"):
        dev.batched_read([0], [bytearray(4096)], [100])
    with pytest.raises(ValueError, match="^O_DIRECT requires aligned offset$"):
        dev.write_uring(1, b"a" * 4096, 4096)
    with pytest.warns(DeprecationWarning):
        with pytest.raises(ValueError, match="^O_DIRECT requires aligned offset$"):
            dev.read_uring(1, bytearray(4096), 4096)
    dev.close()


def test_single_op_texts(data_file):
    dev = open_dev(data_file, depth=2)
    with pytest.warns(DeprecationWarning) as rec:
        dev.read_uring(0, bytearray(4), 4)
    assert [str(w.message) for w in rec] == [DEPRECATION_TEXT]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DeprecationWarning, match="read_uring"):
            dev.read_uring(0, bytearray(4), 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="^output buffer too small: cap=4 need=8$"):
            dev.read_uring(0, bytearray(4), 8)
        with pytest.raises(ValueError, match="^total_len must be >= payload_len$"):
            dev.read_uring(0, bytearray(8), 8, 4)
        with pytest.raises(BufferError, match="^Object is not writable.$"):
            dev.read_uring(0, b"1234", 4)
        with pytest.raises(RuntimeError, match="^Unexpected short I/O: internal error$"):
            dev.read_uring(FILE_SIZE, bytearray(4), 4)
        buf = bytearray(8)
        dev.read_uring(offset=4096, data=buf, payload_len=8, total_len=None)
        assert bytes(buf) == pattern(4096, 8)
        short = bytearray(8)
        dev.read_uring(4096, short, 8, 4096)  # bounced: only payload_len bytes come back
        assert bytes(short) == pattern(4096, 8)
    with pytest.raises(ValueError, match="^input buffer too small: cap=4 need=8$"):
        dev.write_uring(0, b"abcd", 8)
    with pytest.raises(ValueError, match="^total_len must be >= payload_len$"):
        dev.write_uring(0, b"abcd", 4, 2)
    dev.write_uring(offset=0, data=b"abcd", payload_len=4, total_len=8, placement_id=None)
    with open(data_file, "rb") as f:
        assert f.read(8) == b"abcd\0\0\0\0"
    dev.close()


def test_closed_device_texts(data_file):
    dev = open_dev(data_file, depth=2)
    dev.close()
    dev.close()  # idempotent
    for call in (
        lambda: dev.batched_write([0], [b"a"], [1]),
        lambda: dev.batched_read([0], [bytearray(1)], [1]),
        lambda: dev.write_uring(0, b"a", 1),
        lambda: dev.register_fixed_buffers([1], [1]),
    ):
        with pytest.raises(RuntimeError, match="^device is closed$"):
            call()
    with pytest.warns(DeprecationWarning):
        with pytest.raises(RuntimeError, match="^device is closed$"):
            dev.read_uring(0, bytearray(1), 1)
    assert dev.wait_iouring(1) == ([], [])
    assert dev.worker_error() is None
    assert dev.fixed_buffer_status() == (False, 0)


# --------------------------------------------------------------------------- fixed buffers


def test_fixed_buffers_used_for_contained_ranges(data_file):
    dev = open_dev(data_file, depth=8)
    arena = np.zeros(1 * MiB, dtype=np.uint8)
    other = np.zeros(64 * KiB, dtype=np.uint8)
    assert dev.fixed_buffer_status() == (False, 0)
    dev.register_fixed_buffers([arena.ctypes.data, other.ctypes.data], [arena.nbytes, other.nbytes])
    assert dev.fixed_buffer_status() == (True, arena.nbytes + other.nbytes)
    st0 = dev.io_stats_snapshot()

    # writes from sub-ranges of the arena (not only its start), then reads back into others
    n = 32
    for i in range(n):
        arena[i * 4096 : (i + 1) * 4096] = i + 1
    views = [arena[i * 4096 : (i + 1) * 4096] for i in range(n)]
    offsets = [(100 + i) * 4096 for i in range(n)]
    assert dev.wait_iouring(dev.batched_write(offsets, views, [4096] * n)) == ([True] * n, [])
    st1 = dev.io_stats_snapshot()
    assert st1["fixed_buffer_attempts"] - st0["fixed_buffer_attempts"] == n
    assert st1["fixed_buffer_submitted_bytes"] - st0["fixed_buffer_submitted_bytes"] == n * 4096

    dst = [arena[512 * KiB + i * 4096 : 512 * KiB + (i + 1) * 4096] for i in range(n)]
    assert dev.wait_iouring(dev.batched_read(offsets, dst, [4096] * n)) == ([True] * n, [])
    for i in range(n):
        assert (dst[i] == i + 1).all()
    st2 = dev.io_stats_snapshot()
    assert st2["fixed_buffer_attempts"] - st1["fixed_buffer_attempts"] == n

    # a buffer outside every registered region, and one straddling the end, are not fixed
    loose = np.zeros(4096, dtype=np.uint8)
    straddle = other[-2048:]
    assert dev.wait_iouring(dev.batched_read([0], [loose], [4096])) == ([True], [])
    assert dev.wait_iouring(dev.batched_read([0], [bytearray(4096)], [4096])) == ([True], [])
    assert dev.wait_iouring(dev.batched_read([0], [straddle], [2048])) == ([True], [])
    assert dev.io_stats_snapshot()["fixed_buffer_attempts"] == st2["fixed_buffer_attempts"] + 1
    assert loose.tobytes() == pattern(0, 4096)
    dev.close()


@pytest.mark.parametrize("odirect", [False, True], ids=["buffered", "odirect"])
def test_fixed_buffers_odirect_mmap(data_file, odirect):
    import mmap

    dev = open_dev(data_file, odirect=odirect, depth=4)
    region = mmap.mmap(-1, 256 * KiB)
    addr = np.frombuffer(region, dtype=np.uint8).ctypes.data
    dev.register_fixed_buffers([addr], [len(region)])
    arr = np.frombuffer(region, dtype=np.uint8)
    views = [arr[i * 8192 : i * 8192 + 4096] for i in range(16)]
    assert dev.wait_iouring(dev.batched_read([i * 4096 for i in range(16)], views, [4096] * 16)) == ([True] * 16, [])
    for i, v in enumerate(views):
        assert v.tobytes() == pattern(i * 4096, 4096)
    assert dev.io_stats_snapshot()["fixed_buffer_attempts"] == 16
    del views, arr, v
    dev.close()
    region.close()  # raises BufferError if any view of the region were still held


def test_register_fixed_buffers_validation(data_file):
    dev = open_dev(data_file, depth=2)
    a = np.zeros(64 * KiB, dtype=np.uint8)
    p = a.ctypes.data
    cases = [
        (([1], [1, 2]), ValueError, "^buffer_ptrs and buffer_sizes must have same length$"),
        (([], []), ValueError, "^at least one buffer must be provided$"),
        (([0], [4096]), ValueError, "^fixed buffer 0 has a null pointer$"),
        (([p, p + 8192], [4096, 0]), ValueError, "^fixed buffer 1 has zero size$"),
        (([p], [1 << 40]), ValueError, "^fixed buffer 0 size 1099511627776 exceeds the 1 GiB limit$"),
        (([p, p + 4096], [8192, 4096]), ValueError, r"^fixed buffer regions overlap: \[0x[0-9a-f]+, 0x[0-9a-f]+\) and"),
        (([p] * 70000, [1] * 70000), ValueError, "^too many fixed buffers: 70000 exceeds the u16 index space$"),
        ((["x"], [1]), TypeError, "argument 'buffer_ptrs': 'str' object cannot be interpreted as an integer"),
        (([-1], [1]), OverflowError, "can't convert negative int to unsigned"),
    ]
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            dev.register_fixed_buffers(*args)
        assert dev.fixed_buffer_status() == (False, 0), "a failed registration leaves no state behind"
    dev.register_fixed_buffers((p,), (4096,))
    assert dev.fixed_buffer_status() == (True, 4096)
    # a second registration is rejected before anything changes, even a valid one
    with pytest.raises(RuntimeError, match="^fixed buffers are already registered$"):
        dev.register_fixed_buffers([p + 8192], [8192])
    assert dev.fixed_buffer_status() == (True, 4096)
    # the old registration is still the one in use
    st0 = dev.io_stats_snapshot()["fixed_buffer_attempts"]
    assert dev.wait_iouring(dev.batched_read([0], [a[:4096]], [4096])) == ([True], [])
    assert dev.wait_iouring(dev.batched_read([0], [a[8192 : 8192 + 4096]], [4096])) == ([True], [])
    assert dev.io_stats_snapshot()["fixed_buffer_attempts"] == st0 + 1
    dev.close()


def test_register_kernel_refusal_text(data_file):
    dev = open_dev(data_file, depth=2)
    # an address range with no mapping behind it: the kernel cannot pin it
    with pytest.raises(RuntimeError, match=r"^register_buffers failed: Bad address \(os error 14\)$"):
        dev.register_fixed_buffers([4096], [4096])
    assert dev.fixed_buffer_status() == (False, 0)
    dev.close()


# --------------------------------------------------------------------------- counters


def test_stats_counters(data_file):
    dev = open_dev(data_file, depth=4)
    n = 40
    dev.wait_iouring(dev.batched_write([i * 4096 for i in range(n)], [b"w" * 4096] * n, [4096] * n))
    dev.wait_iouring(dev.batched_read([i * 4096 for i in range(n)], [bytearray(4096) for _ in range(n)], [4096] * n))
    st = dev.io_stats_snapshot()
    assert st["write_attempts"] == n and st["write_submitted_bytes"] == n * 4096
    assert st["read_attempts"] == n and st["read_submitted_bytes"] == n * 4096
    assert st["write_completed_bytes"] == n * 4096 and st["read_completed_bytes"] == n * 4096
    assert st["completed_attempts"] == 2 * n and st["failed_attempts"] == 0
    assert st["outstanding_requests"] == 0 and st["queued_requests"] == 0
    assert st["peak_outstanding_requests"] >= n and st["peak_queued_requests"] >= n - 4
    assert st["batches_submitted"] == 2 and st["max_batch_size"] == n
    assert st["queue_full_events"] > 0
    assert st["bounce_attempts"] == 0 and st["fixed_buffer_attempts"] == 0
    dev.close()


# --------------------------------------------------------------------------- threads, GIL, lifetime


def test_four_threads_submit_and_wait(data_file):
    dev = open_dev(data_file, depth=8)
    failures = []

    def worker(t):
        try:
            base = t * 1 * MiB
            for rep in range(10):
                n = 32
                offs = [base + i * 4096 for i in range(n)]
                srcs = [bytes([(t * 16 + rep + i) % 251]) * 4096 for i in range(n)]
                ok, errs = dev.wait_iouring(dev.batched_write(offs, srcs, [4096] * n))
                assert (ok, errs) == ([True] * n, [])
                outs = [unaligned_buffer(4096, 1 + t) for _ in range(n)]
                ok, errs = dev.wait_iouring(dev.batched_read(offs, outs, [4096] * n))
                assert (ok, errs) == ([True] * n, [])
                assert [bytes(o) for o in outs] == srcs
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append((t, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert failures == []
    assert dev.io_stats_snapshot()["outstanding_requests"] == 0
    dev.close()


def test_wait_from_another_thread(data_file):
    dev = open_dev(data_file, depth=2)
    out = bytearray(4096 * 8)
    views = [memoryview(out)[i * 4096 : (i + 1) * 4096] for i in range(8)]
    bid = dev.batched_read([i * 4096 for i in range(8)], views, [4096] * 8)
    res = []
    th = threading.Thread(target=lambda: res.append(dev.wait_iouring(bid)))
    th.start()
    th.join()
    assert res == [([True] * 8, [])]
    assert bytes(out) == pattern(0, 4096 * 8)
    dev.close()


def test_views_held_until_wait(data_file):
    dev = open_dev(data_file, depth=1)
    bufs = [bytearray(4096) for _ in range(16)]
    bid = dev.batched_read([i * 4096 for i in range(16)], bufs, [4096] * 16)
    with pytest.raises(BufferError, match="^Existing exports of data: object cannot be re-sized$"):
        bufs[-1].extend(b"x")  # exported: cannot be resized while the batch may still write into it
    dev.wait_iouring(bid)
    bufs[-1].extend(b"x")  # released by wait_iouring
    assert len(bufs[-1]) == 4097
    # close releases the views of batches nobody waited for
    bufs2 = [bytearray(4096) for _ in range(4)]
    dev.batched_read([0, 4096, 8192, 12288], bufs2, [4096] * 4)
    dev.close()
    bufs2[0].extend(b"x")


FALLBACK_S = 20.0


def test_gil_released_during_wait():
    """wait_iouring blocks without the GIL. The batch reads a terminal that has data only once
    this test writes it, and the test writes it from the main thread only after the waiting
    thread is inside wait_iouring (CallWatch): the call can return only because another Python
    thread ran while it was blocked. If it held the GIL, nothing in this process could run; a
    child process then writes other bytes after FALLBACK_S s, which end the wait, and the bytes
    read tell which writer it was."""
    n = 512
    with held_back_device() as (path, master):
        fallback = subprocess.Popen(
            [sys.executable, "-c", "import os, sys, time; time.sleep(float(sys.argv[1])); "
                                   "os.write(int(sys.argv[2]), b'F' * int(sys.argv[3]))",
             str(FALLBACK_S), str(master), str(n)], pass_fds=(master,))
        dev = open_dev(path, writable=False, depth=4)
        buf = bytearray(n)
        try:
            bid = dev.batched_read([0], [buf], [n])
            call = CallWatch("wait_iouring", lambda: dev.wait_iouring(bid)).start()
            inside = call.wait_inside(timeout=2 * FALLBACK_S)
            if inside:
                os.write(master, b"M" * n)
            call.thread.join(2 * FALLBACK_S)
            assert not call.thread.is_alive(), "wait_iouring did not return after its read completed"
            assert not bytes(buf) == b"F" * n, (
                f"wait_iouring held the GIL: no other thread ran until the fallback writer ended the read "
                f"after {FALLBACK_S:.0f} s")
            assert inside, f"the waiting thread was never seen inside wait_iouring: {call.result}"
            assert call.result == {"value": ([True], [])}
            assert bytes(buf) == b"M" * n
        finally:
            fallback.kill()
            fallback.wait()
            dev.close()


@pytest.mark.parametrize("waiter", [True, False], ids=["with-waiter", "no-waiter"])
def test_close_waits_for_a_read_in_flight(waiter):
    """A read the kernel holds (a terminal with no data yet), with or without a thread waiting
    for it, while three threads close the device: close() must not free the batch under the
    kernel, so the closers stay inside close() until the read completes; then the bytes are in
    the caller's buffer, the buffer is released, and a waiter gets the full result."""
    n = 512
    with held_back_device() as (path, master):
        dev = open_dev(path, writable=False, depth=4)
        buf = bytearray(n)
        bid = dev.batched_read([0], [buf], [n])
        released = False
        try:
            # Only a request the worker has taken from its queue reaches the kernel; one still
            # queued when close() starts ends unsubmitted (test_close_ends_queued_requests...).
            deadline = time.monotonic() + 10
            while dev.io_stats_snapshot()["queued_requests"] and time.monotonic() < deadline:
                time.sleep(0.001)
            assert dev.io_stats_snapshot()["queued_requests"] == 0
            threads = []
            if waiter:
                call = CallWatch("wait_iouring", lambda: dev.wait_iouring(bid)).start()
                assert call.wait_inside(timeout=10), f"wait_iouring returned before its read completed: {call.result}"
                threads.append(call.thread)
            closers = [CallWatch("close", dev.close).start() for _ in range(3)]
            for c in closers:
                assert c.wait_inside(timeout=10), f"close() returned with a read in flight: {c.result}"
            assert dev.closed  # closing has started: new calls are refused
            with pytest.raises(RuntimeError, match="^device is closed$"):
                dev.batched_read([0], [bytearray(n)], [n])
            os.write(master, b"M" * n)
            released = True
            for th in threads + [c.thread for c in closers]:
                th.join(10)
                assert not th.is_alive(), "close() or wait_iouring() did not return after the read completed"
            assert [c.result for c in closers] == [{"value": None}] * 3
            if waiter:
                assert call.result == {"value": ([True], [])}
            else:
                assert dev.wait_iouring(bid) == ([], [])  # close released the batch nobody waited for
            assert bytes(buf) == b"M" * n
            buf.extend(b"x")  # the batch's view was released
        finally:
            if not released:
                os.write(master, b"M" * n)
            dev.close()


def test_close_while_batches_in_flight(data_file):
    dev = open_dev(data_file, depth=1)
    pending = []
    for rep in range(20):
        bufs = [bytearray(4096) for _ in range(64)]
        pending.append((dev.batched_read([i * 4096 for i in range(64)], bufs, [4096] * 64), bufs))
    dev.close()
    for bid, bufs in pending:
        assert dev.wait_iouring(bid) == ([], [])  # tracking was released by close
        bufs[0].extend(b"x")  # and so were the views
    assert dev.io_stats_snapshot()["outstanding_requests"] == 0


def test_close_from_other_thread_while_waiting(data_file):
    dev = open_dev(data_file, odirect=True, depth=1)
    n = 400
    bufs = [np.empty(4096, dtype=np.uint8) for _ in range(n)]
    bid = dev.batched_read([i * 4096 for i in range(n)], bufs, [4096] * n)
    result = []
    waiter = threading.Thread(target=lambda: result.append(dev.wait_iouring(bid)))
    waiter.start()
    time.sleep(0.002)
    closers = [threading.Thread(target=dev.close) for _ in range(3)]
    for c in closers:
        c.start()
    for c in closers:
        c.join(timeout=30)
        assert not c.is_alive(), "close() must not deadlock"
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    ok, errs = result[0]
    # the waiter either got the full result (close waited for it) or nothing (close came first)
    assert (ok, errs) in (([True] * n, []), ([], []))
    assert dev.closed


def test_close_ends_queued_requests_without_submitting_them():
    """A depth-1 ring holds one read the kernel cannot finish yet (a terminal with no data), so
    a second batch of 8 waits in the engine's queue. close() ends the 8 queued requests at once,
    without submitting them (no attempt, no bytes, buffers untouched), waits for the read in
    flight only, and releases every buffer."""
    n = 512
    with held_back_device() as (path, master):
        dev = open_dev(path, writable=False, depth=1)
        first = bytearray(n)
        queued = [bytearray(n) for _ in range(8)]
        dev.batched_read([0], [first], [n])
        bid2 = dev.batched_read([0] * 8, queued, [n] * 8)
        deadline = time.monotonic() + 10
        while dev.io_stats_snapshot()["queued_requests"] == 9 and time.monotonic() < deadline:
            time.sleep(0.001)  # until the worker has taken the first read (the ring has room for one)
        st = dev.io_stats_snapshot()
        assert (st["outstanding_requests"], st["queued_requests"]) == (9, 8)
        closer = CallWatch("close", dev.close).start()
        try:
            assert closer.wait_inside(timeout=10), f"close() returned with a read in flight: {closer.result}"
            # The closer wakes the worker, which ends the queued requests at once; only the held
            # read stays outstanding (were the data written before that, the worker could submit a
            # queued read that no data would ever complete).
            deadline = time.monotonic() + 10
            while dev.io_stats_snapshot()["queued_requests"] and time.monotonic() < deadline:
                time.sleep(0.001)
            st = dev.io_stats_snapshot()
            assert (st["outstanding_requests"], st["queued_requests"]) == (1, 0)
            assert closer.wait_inside(timeout=10), f"close() returned with a read in flight: {closer.result}"
        finally:
            os.write(master, b"M" * n)
        closer.thread.join(10)
        assert not closer.thread.is_alive(), "close() did not return after the read in flight completed"
        assert closer.result == {"value": None}
        st = dev.io_stats_snapshot()
        assert (st["read_attempts"], st["completed_attempts"], st["failed_attempts"]) == (1, 1, 0)
        assert (st["read_completed_bytes"], st["outstanding_requests"], st["queued_requests"]) == (n, 0, 0)
        assert bytes(first) == b"M" * n
        assert all(bytes(b) == bytes(n) for b in queued), "a queued request was submitted after close() began"
        assert dev.wait_iouring(bid2) == ([], [])
        for b in [first] + queued:
            b.extend(b"x")  # released by close


def test_batch_queued_behind_a_full_ring_completes_for_another_thread(data_file):
    """A batch queued behind 2,000 reads on a depth-1 ring, waited for from another thread,
    completes in full; close() then releases the 2,000-read batch nobody waited for."""
    dev = open_dev(data_file, odirect=True, depth=1)
    n = 2000
    bufs = [np.empty(4096, dtype=np.uint8) for _ in range(n)]
    bid = dev.batched_read([(i % 2000) * 4096 for i in range(n)], bufs, [4096] * n)
    bid2 = dev.batched_read([0] * 8, [np.empty(4096, dtype=np.uint8) for _ in range(8)], [4096] * 8)
    got = []
    waiter = threading.Thread(target=lambda: got.append(dev.wait_iouring(bid2)))
    waiter.start()
    waiter.join()
    assert got == [([True] * 8, [])]
    dev.close()
    assert dev.wait_iouring(bid) == ([], [])


def test_dealloc_without_close(data_file):
    gc.collect()
    before = uring_threads()
    bufs = [bytearray(4096) for _ in range(128)]
    dev = open_dev(data_file, depth=2)
    mine = uring_threads() - before
    assert len(mine) == 1
    dev.batched_read([i * 4096 for i in range(128)], bufs, [4096] * 128)
    dev.batched_write([i * 4096 for i in range(128, 256)], [b"z" * 4096] * 128, [4096] * 128)
    del dev
    gc.collect()
    assert wait_threads_gone(mine) == set(), "dealloc stops and joins the worker"
    bufs[0].extend(b"x")  # views released by dealloc
    with open(data_file, "rb") as f:
        f.seek(200 * 4096)
        block = f.read(4096)
    assert block in (b"z" * 4096, pattern(200 * 4096, 4096)), "each write either ran fully or not at all"


def test_many_devices_and_rapid_close(data_file):
    """Thirty devices, each closed straight after queueing a read: every close() returns with
    its batch accounted for, the batch's buffers released, its worker thread joined and its file
    descriptors closed, so nothing accumulates over the cycles."""
    gc.collect()
    threads_before = uring_threads()
    assert fds_open_on(data_file) == []
    for depth in (1, 3, 32):
        for rep in range(10):
            dev = open_dev(data_file, depth=depth)
            mine = uring_threads() - threads_before
            assert len(mine) == 1, (depth, rep)
            assert len(fds_open_on(data_file)) == 1, (depth, rep)
            bufs = [bytearray(4096), bytearray(4096)]
            bid = dev.batched_read([0, 4096], bufs, [4096, 4096])
            dev.close()
            assert dev.closed
            assert dev.wait_iouring(bid) == ([], [])  # tracking was released by close
            assert dev.io_stats_snapshot()["outstanding_requests"] == 0
            for b in bufs:
                b.extend(b"x")  # and so were the views
                assert bytes(b[:4096]) in (bytes(4096), pattern(0, 4096), pattern(4096, 4096))
            assert fds_open_on(data_file) == [], (depth, rep)
            assert wait_threads_gone(mine) == set(), f"depth {depth}: close() left its worker running"
    assert uring_threads() - threads_before == set()


# --------------------------------------------------------------------------- hard engine failures


def _wait_in_thread(dev, bid, timeout=10.0):
    out = {}
    th = threading.Thread(target=lambda: out.update(r=dev.wait_iouring(bid)), daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), "wait_iouring hung: a request was never finished"
    return out["r"]


def test_submit_failure_then_lost_completions_fail_every_request(data_file):
    """The kernel took a batch, then io_uring_enter failed hard and no completion could be
    reaped any more (test hooks 1 and 2). The worker used to leave the loop with those requests
    never finished, so wait_iouring and close() waited for ever; now every one of them fails with
    the reap error, later submissions are refused, and close() returns."""
    dev = open_dev(data_file, depth=16)
    dev._inject_engine_fault(1 | 2)
    bufs = [bytearray(4096) for _ in range(8)]
    ok, errs = _wait_in_thread(dev, dev.batched_read([i * 4096 for i in range(8)], bufs, [4096] * 8))
    assert ok == [False] * 8
    assert [i for i, _ in errs] == list(range(8))
    assert all("io_uring I/O error" in e and f"[Errno {errno.EFAULT}]" in e for _, e in errs), errs
    assert "io_uring submit failed" in (dev.worker_error() or "")
    with pytest.raises(RuntimeError, match="io_uring worker stopped"):
        dev.wait_iouring(dev.batched_read([0], [bytearray(4096)], [4096]))
    th = threading.Thread(target=dev.close, daemon=True)
    th.start()
    th.join(10)
    assert not th.is_alive(), "close() hung"


def test_submit_failure_alone_still_delivers_what_the_kernel_completed(data_file):
    """Only the submission fails (hook 1): the requests the kernel took complete and are reaped
    as usual, the engine stops admitting new work."""
    dev = open_dev(data_file, depth=16)
    dev._inject_engine_fault(1)
    bufs = [bytearray(4096) for _ in range(4)]
    ok, errs = _wait_in_thread(dev, dev.batched_read([i * 4096 for i in range(4)], bufs, [4096] * 4))
    assert ok == [True] * 4 and errs == []
    assert all(bytes(b) == pattern(i * 4096, 4096) for i, b in enumerate(bufs))
    assert "io_uring submit failed" in (dev.worker_error() or "")
    dev.close()


@PEP688
def test_buffer_implemented_in_python_is_held_until_wait(data_file):
    """A batch takes each buffer once when it is queued and releases it when wait_iouring
    returns, not before (the kernel may still write into it)."""

    dev = open_dev(data_file, depth=4)
    try:
        src = PythonBuffer(b"p" * 8192)
        bid = dev.batched_write([0], [src], [8192])
        assert (src.taken, src.released) == (1, 0)
        assert dev.wait_iouring(bid) == ([True], [])
        assert (src.taken, src.released) == (1, 1)
        dst = [PythonBuffer(bytes(4096)) for _ in range(2)]
        bid = dev.batched_read([0, 4096], dst, [4096, 4096])
        assert [(d.taken, d.released) for d in dst] == [(1, 0)] * 2
        assert dev.wait_iouring(bid) == ([True, True], [])
        assert [(d.taken, d.released) for d in dst] == [(1, 1)] * 2
        assert [bytes(d.mem) for d in dst] == [b"p" * 4096] * 2
        pending = PythonBuffer(bytes(4096))
        dev.batched_read([0], [pending], [4096])
    finally:
        dev.close()
    assert (pending.taken, pending.released) == (1, 1)  # close released the batch nobody waited for


@PEP688
@pytest.mark.parametrize("call", ["batched_read", "batched_write", "read_uring", "write_uring"])
def test_buffer_code_that_closes_the_device_does_not_deadlock(data_file, call):
    """Buffers are taken before the call is admitted: a __buffer__ that closes the device would
    otherwise wait in close() for the very call that is running it."""
    dev = open_dev(data_file, depth=8)

    class Closing:
        def __init__(self):
            self.mem = bytearray(4096)

        def __buffer__(self, flags):
            dev.close()
            return memoryview(self.mem)

    out = {}

    def run():
        obj = Closing()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                if call == "batched_read":
                    dev.wait_iouring(dev.batched_read([0], [obj], [4096]))
                elif call == "batched_write":
                    dev.wait_iouring(dev.batched_write([0], [obj], [4096]))
                elif call == "read_uring":
                    dev.read_uring(0, obj, 4096)
                else:
                    dev.write_uring(0, obj, 4096)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out["exc"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(10)
    assert not th.is_alive(), f"{call}: deadlock between __buffer__ and close()"
    assert isinstance(out.get("exc"), RuntimeError), out
