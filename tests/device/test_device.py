"""RawBlockDevice, posix engine: round trips, padding, O_DIRECT bounce paths, every error of
LMCache's device, GIL release, close semantics."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import shutil
import sys
import tempfile
import threading

import numpy as np
import pytest

from helpers import PEP688, PythonBuffer
from lmcache_rawblock import RawBlockDevice

KiB = 1 << 10
MiB = 1 << 20


def pattern(n: int, seed: int = 1) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def aligned_buffer(n: int, offset: int = 0) -> memoryview:
    """Page-aligned writable memory (plus offset bytes, to make it deliberately unaligned)."""
    m = mmap.mmap(-1, n + offset + mmap.PAGESIZE)
    return memoryview(m)[offset : offset + n]


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("odirect", [False, True], ids=["buffered", "odirect"])
@pytest.mark.parametrize("payload,total", [(4096, 4096), (5, 4096), (4097, 8192), (MiB, MiB), (MiB - 3, MiB)])
def test_round_trip_and_zero_padding(sparse_file, odirect, payload, total):
    path = sparse_file()
    # Dirty the whole region first so zero padding must really be written.
    with open(path, "r+b") as f:
        f.write(b"\xff" * (2 * MiB))
    data = pattern(payload)
    with RawBlockDevice(path, True, use_odirect=odirect) as dev:
        dev.pwrite_from_buffer(4096, data, payload, total)
        out = bytearray(payload)
        dev.pread_into(4096, out, payload, total)
        assert bytes(out) == data
    with open(path, "rb") as f:
        f.seek(4096)
        raw = f.read(total)
    assert raw[:payload] == data
    assert raw[payload:] == bytes(total - payload), "padding must be zeros"
    with open(path, "rb") as f:
        f.seek(4096 + total)
        assert f.read(1) == b"\xff", "nothing written past total_len"


@pytest.mark.parametrize("shift", [0, 1, 513])
@pytest.mark.parametrize("payload,total", [(8192, 8192), (5000, 8192)])
def test_odirect_unaligned_memory_is_bounced(sparse_file, shift, payload, total):
    path = sparse_file()
    data = pattern(payload, seed=shift)
    src = aligned_buffer(payload, shift)
    src[:] = data
    with RawBlockDevice(path, True, use_odirect=True) as dev:
        dev.pwrite_from_buffer(8192, src, payload, total)
        dst = aligned_buffer(payload, shift)
        dev.pread_into(8192, dst, payload, total)
        assert bytes(dst) == data
        st = dev.io_stats_snapshot()
    if shift or payload != total:
        assert st["bounce_attempts"] >= 1
    else:
        assert st["bounce_attempts"] == 0, "aligned, unpadded O_DIRECT I/O must go straight to the caller's memory"


def test_odirect_read_into_big_aligned_buffer_keeps_payload(sparse_file):
    path = sparse_file()
    with RawBlockDevice(path, True, use_odirect=True) as dev:
        dev.pwrite_from_buffer(0, b"abc", 3, 4096)
        out = aligned_buffer(4096)
        out[:] = b"\x07" * 4096
        dev.pread_into(0, out, 3, 4096)
        assert bytes(out[:3]) == b"abc"


def test_buffered_padded_read_leaves_rest_of_buffer(sparse_file):
    path = sparse_file()
    with RawBlockDevice(path, True) as dev:
        dev.pwrite_from_buffer(0, b"hello", 5, 4096)
        out = bytearray(b"\x07" * 64)
        dev.pread_into(0, out, 5, 4096)
        assert out[:5] == b"hello" and out[5:] == b"\x07" * 59


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda b: bytes(b), id="bytes"),
        pytest.param(lambda b: bytearray(b), id="bytearray"),
        pytest.param(lambda b: memoryview(bytearray(b)), id="memoryview"),
        pytest.param(lambda b: np.frombuffer(bytearray(b), dtype=np.uint8), id="numpy-u8"),
        pytest.param(lambda b: np.frombuffer(bytearray(b), dtype=np.float32).reshape(64, -1), id="numpy-2d-f32"),
        pytest.param(lambda b: np.asfortranarray(np.frombuffer(bytearray(b), dtype=np.float32).reshape(64, -1)),
                     id="numpy-fortran"),
    ],
)
def test_buffer_protocol_sources(sparse_file, make):
    data = pattern(64 * KiB)
    src = make(data)
    with RawBlockDevice(sparse_file(), True) as dev:
        dev.pwrite_from_buffer(0, src)
        out = np.zeros(64 * KiB, dtype=np.uint8)
        dev.pread_into(0, out, 64 * KiB)
    assert out.tobytes() == memoryview(src).tobytes(order="A")


@PEP688
def test_buffer_implemented_in_python_is_taken_and_released_once_per_call(sparse_file):
    data = pattern(64 * KiB)
    src, dst = PythonBuffer(data), PythonBuffer(bytes(64 * KiB))
    with RawBlockDevice(sparse_file(), True) as dev:
        dev.pwrite_from_buffer(0, src)
        assert (src.taken, src.released) == (1, 1)
        dev.pread_into(0, dst, 64 * KiB)
        assert (dst.taken, dst.released) == (1, 1)
        with pytest.raises(ValueError, match=f"^output buffer too small: cap={64 * KiB} need={128 * KiB}$"):
            dev.pread_into(0, dst, 128 * KiB)  # longer than the buffer: refused, still released
        assert (dst.taken, dst.released) == (2, 2)
    assert bytes(dst.mem) == data


def test_non_contiguous_buffer_is_rejected(sparse_file):
    # Whatever the exporter raises for a contiguous request propagates unchanged.
    with RawBlockDevice(sparse_file(), True) as dev:
        with pytest.raises(BufferError, match="^memoryview: underlying buffer is not contiguous$"):
            dev.pwrite_from_buffer(0, memoryview(bytearray(128))[::2])
        with pytest.raises(ValueError, match="not contiguous"):
            dev.pwrite_from_buffer(0, np.zeros((64, 64), dtype=np.uint8)[:, ::2])


def test_size_bytes_and_accessors(sparse_file):
    path = sparse_file(3 * MiB + 4096)
    dev = RawBlockDevice(path, False)
    assert dev.size_bytes() == 3 * MiB + 4096
    assert dev.io_engine == "posix" and dev.use_odirect is False and dev.alignment == 4096
    dev.close()
    assert dev.size_bytes() == 3 * MiB + 4096, "size_bytes works after close, like LMCache's device"
    assert dev.closed


def test_keyword_call_forms(sparse_file):
    with RawBlockDevice(path=sparse_file(), writable=True, alignment=512, io_engine="posix") as dev:
        dev.pwrite_from_buffer(offset=0, data=b"xyz", total_len=4096)
        out = bytearray(3)
        dev.pread_into(offset=0, out=out, payload_len=3, total_len=4096)
        assert out == b"xyz"
        with pytest.raises(TypeError, match="unexpected keyword"):
            dev.pread_into(offset=0, out=out, payload_len=3, bogus=1)
        with pytest.raises(TypeError, match="missing required argument 'payload_len'"):
            dev.pread_into(0, out)
        with pytest.raises(TypeError, match="multiple values"):
            dev.pread_into(0, out, 3, payload_len=3)


def test_io_stats_count_attempts(sparse_file):
    with RawBlockDevice(sparse_file(), True) as dev:
        dev.pwrite_from_buffer(0, b"a" * 4096)
        dev.pwrite_from_buffer(4096, b"b" * 100, 100, 4096)
        dev.pread_into(0, bytearray(4096), 4096)
        st = dev.io_stats_snapshot()
    assert st["write_attempts"] == 2 and st["read_attempts"] == 1
    assert st["write_submitted_bytes"] == 8192 and st["read_submitted_bytes"] == 4096
    assert st["completed_attempts"] == 3 and st["failed_attempts"] == 0
    assert st["queued_requests"] == 0
    expected_keys = {
        "read_attempts", "write_attempts", "read_submitted_bytes", "write_submitted_bytes",
        "completed_attempts", "failed_attempts", "bounce_attempts", "bounce_submitted_bytes",
        "fixed_buffer_attempts", "fixed_buffer_submitted_bytes", "outstanding_requests",
        "peak_outstanding_requests", "queued_requests", "peak_queued_requests", "queue_full_events",
    }
    assert expected_keys <= set(st), "LMCache's io_stats_snapshot keys must all be present"


# --------------------------------------------------------------------------- errors


def test_bad_io_engine(sparse_file):
    with pytest.raises(ValueError, match=r"^io_engine must be one of posix, io_uring; got IO_URING$"):
        RawBlockDevice(sparse_file(), True, io_engine="IO_URING")
    with pytest.raises(ValueError, match="got libblkio"):
        RawBlockDevice(sparse_file(), True, io_engine="libblkio")


def test_empty_io_engine_means_use_iouring_flag(sparse_file):
    with RawBlockDevice(sparse_file(), True, io_engine="") as dev:
        assert dev.io_engine == "posix"


def test_uring_cmd_requires_iouring(sparse_file):
    with pytest.raises(ValueError, match=r"^use_uring_cmd requires use_iouring to be enabled$"):
        RawBlockDevice(sparse_file(), True, use_uring_cmd=True)
    # io_engine="posix" wins over use_iouring=True, so this is still an error.
    with pytest.raises(ValueError, match="use_uring_cmd requires use_iouring"):
        RawBlockDevice(sparse_file(), True, use_iouring=True, use_uring_cmd=True, io_engine="posix")


def test_engine_checked_before_path(tmp_path):
    # Validation order: engine, uring_cmd, NUL, then open.
    with pytest.raises(ValueError, match="io_engine"):
        RawBlockDevice(str(tmp_path / "missing\0"), True, io_engine="x")
    with pytest.raises(ValueError, match="use_uring_cmd"):
        RawBlockDevice(str(tmp_path / "missing\0"), True, use_uring_cmd=True)


def test_nul_in_path(tmp_path):
    with pytest.raises(ValueError, match=r"^path contains NUL$"):
        RawBlockDevice(str(tmp_path) + "/a\0b", True)


def test_missing_file_is_not_created(tmp_path):
    p = tmp_path / "nope.img"
    with pytest.raises(FileNotFoundError) as ei:
        RawBlockDevice(str(p), True)
    assert ei.value.errno == errno.ENOENT and ei.value.strerror == "open failed"
    assert not p.exists(), "the device must never be created (no O_CREAT)"


def _permission_denied_outcome(path: str) -> str:
    """Open ``path`` (readable, not writable, by this user) read-only, then writable."""
    RawBlockDevice(path, False).close()  # the path itself is reachable and readable
    try:
        RawBlockDevice(path, True)
    except PermissionError as e:
        return f"PermissionError errno={e.errno} strerror={e.strerror}"
    except BaseException as e:  # noqa: BLE001 - reported as the outcome
        return f"{type(e).__name__}: {e}"
    return "opened"


def test_permission_error_is_oserror_subclass(tmp_path):
    """A device file the user may read but not write: opening it writable raises
    PermissionError (an OSError) with EACCES. Root bypasses file permissions, so as root the
    check runs in a forked child that has dropped to the unprivileged uid/gid 65534."""
    d = tempfile.mkdtemp(prefix="rb-perm-")  # /tmp: reachable by any user, unlike tmp_path
    try:
        os.chmod(d, 0o755)
        path = os.path.join(d, "dev.img")
        with open(path, "wb") as f:
            f.truncate(1 << 20)
        os.chmod(path, 0o444)
        if os.geteuid() != 0:
            outcome = _permission_denied_outcome(path)
        else:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # child: report the outcome through the pipe, never return into pytest
                try:
                    os.close(r)
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                    msg = _permission_denied_outcome(path)
                except BaseException as e:  # noqa: BLE001
                    msg = f"child failed: {type(e).__name__}: {e}"
                finally:
                    try:
                        os.write(w, msg.encode())
                    finally:
                        os._exit(0)
            os.close(w)
            with os.fdopen(r, "rb") as f:
                outcome = f.read().decode()
            assert os.waitpid(pid, 0)[1] == 0
        assert outcome == f"PermissionError errno={errno.EACCES} strerror=open failed"
    finally:
        shutil.rmtree(d)


def test_fd_is_close_on_exec(sparse_file):
    path = sparse_file()
    dev = RawBlockDevice(path, True)
    fds = [int(fd) for fd in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{fd}") == path]
    assert fds, "the device fd should be visible in /proc/self/fd"
    for fd in fds:
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    dev.close()


def test_read_only_device_rejects_writes(sparse_file):
    with RawBlockDevice(sparse_file(), False) as dev:
        with pytest.raises(OSError) as ei:
            dev.pwrite_from_buffer(0, b"x" * 4096)
        assert ei.value.errno == errno.EBADF and ei.value.strerror == "pwrite failed"
        dev.pread_into(0, bytearray(16), 16)


def test_pread_into_readonly_buffer(sparse_file):
    with RawBlockDevice(sparse_file(), True) as dev:
        # The exporter's own error, as with LMCache's device.
        with pytest.raises(BufferError, match="not writable"):
            dev.pread_into(0, b"immutable", 4)
        with pytest.raises(BufferError, match="^memoryview: underlying buffer is not writable$"):
            dev.pread_into(0, memoryview(b"immutable"), 4)
        with pytest.raises(TypeError, match="^a bytes-like object is required, not 'str'$"):
            dev.pread_into(0, "not a buffer", 4)


def test_payload_larger_than_buffer(sparse_file):
    with RawBlockDevice(sparse_file(), True) as dev:
        with pytest.raises(ValueError, match=r"^payload_len exceeds buffer length$"):
            dev.pwrite_from_buffer(0, b"abc", 4)
        with pytest.raises(ValueError, match=r"^output buffer too small: cap=3 need=4$"):
            dev.pread_into(0, bytearray(3), 4)


def test_total_smaller_than_payload(sparse_file):
    with RawBlockDevice(sparse_file(), True) as dev:
        with pytest.raises(ValueError, match=r"^total_len must be >= payload_len$"):
            dev.pwrite_from_buffer(0, b"abcd", 4, 3)
        with pytest.raises(ValueError, match=r"^total_len must be >= payload_len$"):
            dev.pread_into(0, bytearray(4), 4, 3)


def test_negative_or_wrong_type_arguments(sparse_file):
    with RawBlockDevice(sparse_file(), True) as dev:
        with pytest.raises(OverflowError, match="offset"):
            dev.pwrite_from_buffer(-1, b"x")
        with pytest.raises(OverflowError, match="payload_len"):
            dev.pread_into(0, bytearray(4), -4)
        with pytest.raises(TypeError, match="total_len must be an int"):
            dev.pread_into(0, bytearray(4), 4, "4096")
    with pytest.raises(ValueError, match="alignment must be >= 0, got -1"):
        RawBlockDevice(sparse_file(), True, alignment=-1)


@pytest.mark.parametrize("op", ["write", "read"])
def test_odirect_misaligned_offset_and_length(sparse_file, op):
    with RawBlockDevice(sparse_file(), True, use_odirect=True) as dev:
        call = (lambda off, n, t: dev.pwrite_from_buffer(off, bytes(n), n, t)) if op == "write" else (
            lambda off, n, t: dev.pread_into(off, bytearray(n), n, t))
        with pytest.raises(ValueError, match=r"^O_DIRECT requires aligned offset$"):
            call(512, 4096, 4096)
        with pytest.raises(ValueError, match=r"^O_DIRECT requires aligned total_len$"):
            call(0, 100, 100)
        call(0, 100, 4096)  # padded up to the alignment: fine


def test_odirect_zero_alignment_is_a_value_error(sparse_file):
    with RawBlockDevice(sparse_file(), True, use_odirect=True, alignment=0) as dev:
        with pytest.raises(ValueError, match="non-zero alignment"):
            dev.pread_into(0, bytearray(4096), 4096)


def test_eof(sparse_file):
    path = sparse_file(MiB)
    with RawBlockDevice(path, True) as dev:
        with pytest.raises(RuntimeError, match="unexpected EOF"):
            dev.pread_into(MiB, bytearray(1), 1)
        with pytest.raises(RuntimeError, match="unexpected EOF"):
            dev.pread_into(MiB - 10, bytearray(20), 20)
        # The padding must be readable too: reading past the end of the file is EOF.
        with pytest.raises(RuntimeError, match="unexpected EOF"):
            dev.pread_into(MiB - 10, bytearray(5), 5, 20)


def test_closed_device(sparse_file):
    dev = RawBlockDevice(sparse_file(), True)
    dev.close()
    dev.close()  # idempotent
    for call in (
        lambda: dev.pwrite_from_buffer(0, b"x"),
        lambda: dev.pread_into(0, bytearray(1), 1),
        lambda: dev.batched_read([0], [bytearray(1)], [1]),
        lambda: dev.register_fixed_buffers([1], [1]),
    ):
        with pytest.raises(RuntimeError, match=r"^device is closed$"):
            call()
    with pytest.raises(RuntimeError, match="device is closed"):
        with dev:
            pass


def test_iouring_only_methods_on_posix_device(sparse_file):
    with RawBlockDevice(sparse_file(), True) as dev:
        for call in (
            lambda: dev.batched_write([0], [b"x"], [1]),
            lambda: dev.batched_read([0], [bytearray(1)], [1]),
            lambda: dev.write_uring(0, b"x", 1),
            lambda: dev.register_fixed_buffers([1], [1]),
        ):
            with pytest.raises(RuntimeError, match=r"^io_uring not enabled$"):
                call()
        assert dev.wait_iouring(1) == ([], [])
        assert dev.worker_error() is None
        assert dev.fixed_buffer_status() == (False, 0)
        with pytest.raises(RuntimeError, match=r"NVMe namespace ID not available \(use_uring_cmd not enabled\)"):
            dev.nvme_nsid()
        with pytest.raises(RuntimeError, match="LBA shift"):
            dev.nvme_lba_shift()
        with pytest.raises(RuntimeError, match="LBA size"):
            dev.nvme_lba_size()
        with pytest.raises(RuntimeError, match="^fetch_fdp_status requires use_uring_cmd to be enabled$"):
            dev.fetch_fdp_status()


def test_uring_cmd_needs_char_device(sparse_file):
    with pytest.raises(ValueError, match=r"NVMe namespace character device \(e\.g\., /dev/ng0n1\)"):
        RawBlockDevice(sparse_file(), True, io_engine="io_uring", use_uring_cmd=True)


# --------------------------------------------------------------------------- concurrency


def test_gil_released_during_large_io(sparse_file):
    size = 256 * MiB
    path = sparse_file(size)
    data = np.ones(size, dtype=np.uint8)
    out = np.empty(size, dtype=np.uint8)
    counter = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counter[0] += 1

    old = sys.getswitchinterval()
    # With a 0.5 s switch interval the counting thread can only run while the main thread
    # releases the GIL by itself: any progress during the call proves the release.
    sys.setswitchinterval(0.5)
    t = threading.Thread(target=count)
    try:
        with RawBlockDevice(path, True) as dev:
            t.start()
            progress = []
            for call in (lambda: dev.pwrite_from_buffer(0, data), lambda: dev.pread_into(0, out, size)):
                before = counter[0]
                call()
                progress.append(counter[0] - before)
    finally:
        stop.set()
        sys.setswitchinterval(old)
        t.join()
    assert progress[0] > 0, "another thread must run while pwrite_from_buffer works"
    assert progress[1] > 0, "another thread must run while pread_into works"
    assert np.array_equal(out, data)


def test_close_while_other_threads_do_io(sparse_file):
    path = sparse_file(64 * MiB)
    dev = RawBlockDevice(path, True)
    errors: list[BaseException] = []
    started = threading.Barrier(5)

    def worker(i):
        buf = bytearray(4 * MiB)
        started.wait()
        try:
            for k in range(200):
                dev.pwrite_from_buffer((i * 16 + k % 16) * MiB // 4 * 4, buf)
        except RuntimeError as e:
            if str(e) != "device is closed":
                errors.append(e)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    started.wait()
    dev.close()
    for t in threads:
        t.join()
    assert not errors, errors
    assert dev.closed


def test_dealloc_without_close_releases_fd(sparse_file):
    path = sparse_file()

    def open_fds():
        return sum(1 for fd in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{fd}") == path)

    dev = RawBlockDevice(path, True)
    assert open_fds() == 1
    del dev
    assert open_fds() == 0


# --------------------------------------------------------------------------- RWF_NOWAIT fast path


def test_small_buffered_reads_hit_the_page_cache_without_blocking(sparse_file):
    path = sparse_file()
    with RawBlockDevice(path, True) as dev:
        dev.pwrite_from_buffer(0, b"q" * 4096)
        out = bytearray(4096)
        dev.pread_into(0, out, 4096)
        st = dev.io_stats_snapshot()
    assert out == b"q" * 4096
    assert st["nowait_hits"] >= 1, "a cached 4 KiB read is served by the RWF_NOWAIT attempt"


def test_small_buffered_read_that_would_block_falls_back(sparse_file):
    # The no-wait attempt is told to give up (as when the page cache would block), so the blocking
    # path must finish the read.  A real uncached read cannot force this: the kernel starts
    # readahead inside the no-wait attempt, and on a fast disk it completes before the attempt
    # looks again, which makes the attempt a hit by chance.
    path = sparse_file()
    data = pattern(8192, seed=9)
    with open(path, "r+b") as f:
        f.write(data)
    with RawBlockDevice(path, False) as dev:
        dev._inject_nowait_miss(1)
        out = bytearray(8192)
        dev.pread_into(0, out, 8192)
        st = dev.io_stats_snapshot()
        assert bytes(out) == data
        assert (st["nowait_hits"], st["nowait_misses"]) == (0, 1)
        assert st["completed_attempts"] >= 1, "the miss was completed by a blocking read"
        out2 = bytearray(8192)
        dev.pread_into(0, out2, 8192)
        assert bytes(out2) == data
        assert dev.io_stats_snapshot()["nowait_hits"] == 1, "the hook is spent: the next read probes for real"


def test_small_buffered_reads_of_uncached_regions_are_correct(sparse_file):
    # Regions written with O_DIRECT are not in the page cache: each first buffered read probes,
    # and whether the probe hits or falls back, the bytes are the stored ones.
    path = sparse_file()
    regions = 8
    datas = [pattern(8192, seed=20 + i) for i in range(regions)]
    buf = mmap.mmap(-1, 8192)
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        for i, data in enumerate(datas):
            buf[:] = data
            assert os.pwrite(fd, buf, i * MiB) == len(data)
        os.fsync(fd)
    finally:
        os.close(fd)
        buf.close()
    with RawBlockDevice(path, False) as dev:
        for i, data in enumerate(datas):
            out = bytearray(8192)
            dev.pread_into(i * MiB, out, 8192)
            assert bytes(out) == data, f"region {i}"
        st = dev.io_stats_snapshot()
    assert st["nowait_hits"] + st["nowait_misses"] == regions, "every small buffered read probes first"


def test_nowait_miss_hook_rejects_bad_counts(sparse_file):
    with RawBlockDevice(sparse_file(), False) as dev:
        with pytest.raises(ValueError, match="-1"):
            dev._inject_nowait_miss(-1)


def test_large_and_odirect_transfers_never_probe(sparse_file):
    with RawBlockDevice(sparse_file(), True) as dev:
        dev.pread_into(0, bytearray(64 * KiB), 64 * KiB)
        assert dev.io_stats_snapshot()["nowait_hits"] + dev.io_stats_snapshot()["nowait_misses"] == 0
    with RawBlockDevice(sparse_file(name="b.img"), True, use_odirect=True) as dev:
        dev.pread_into(0, aligned_buffer(4096), 4096)
        assert dev.io_stats_snapshot()["nowait_hits"] + dev.io_stats_snapshot()["nowait_misses"] == 0
