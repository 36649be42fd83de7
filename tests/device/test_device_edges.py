"""Device edge cases: paths that are not devices, and I/O past the end of the device.

A FIFO would block open(2) forever, so such paths are refused before the open; a write past
the end of a pre-sized file would silently grow it, so it is refused before any buffer is
allocated (OSError(ENOSPC), what a block device gives); a read past the end is LMCache's
"unexpected EOF" without allocating the padding first.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from lmcache_rawblock import RawBlockDevice

MiB = 1 << 20


def _run(code: str, timeout: float = 20) -> subprocess.CompletedProcess:
    """Run code in a child so that a call that would block forever fails the test instead."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "pipe"
    os.mkfifo(p)
    return str(p)


@pytest.mark.parametrize("writable", [False, True])
def test_fifo_is_refused_without_blocking(fifo, writable):
    r = _run(f"""
        from lmcache_rawblock import RawBlockDevice
        try:
            RawBlockDevice({fifo!r}, {writable})
        except ValueError as e:
            print("ValueError:", e)
        """)
    assert r.returncode == 0, r.stderr
    assert f"ValueError: device path '{fifo}' is a FIFO (named pipe)" in r.stdout
    assert "regular file or a block or character device" in r.stdout


def test_fifo_refused_on_io_uring_engine_too(fifo):
    with pytest.raises(ValueError, match="is a FIFO"):
        RawBlockDevice(fifo, False, io_engine="io_uring")


def test_directory_and_socket_are_refused(tmp_path):
    with pytest.raises(ValueError, match=f"device path '{tmp_path}' is a directory"):
        RawBlockDevice(str(tmp_path), False)
    sock_path = str(tmp_path / "s")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(sock_path)
        with pytest.raises(ValueError, match="is a socket"):
            RawBlockDevice(sock_path, True)
    finally:
        s.close()


def test_missing_path_is_still_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="open failed"):
        RawBlockDevice(str(tmp_path / "missing"), False)


def test_symlink_to_a_file_is_accepted(sparse_file, tmp_path):
    link = tmp_path / "link"
    os.symlink(sparse_file(1 * MiB), link)
    with RawBlockDevice(str(link), True) as dev:
        assert dev.size_bytes() == MiB


def test_probe_refuses_a_fifo_without_blocking(fifo):
    r = _run(f"""
        from lmcache_rawblock import _native
        try:
            _native.probe_foreign({fifo!r})
        except ValueError as e:
            print("ValueError:", e)
        """)
    assert r.returncode == 0, r.stderr
    assert "is a FIFO" in r.stdout


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_cli_inspect_on_a_fifo_exits_2(fifo, engine):
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "inspect", fifo], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "is a FIFO" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "verify", fifo], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "is a FIFO" in r.stderr and "Traceback" not in r.stderr


# --------------------------------------------------------------------------- past the end


def test_write_past_end_does_not_grow_the_file(sparse_file):
    p = sparse_file(1 * MiB)
    with RawBlockDevice(p, True) as dev:
        with pytest.raises(OSError) as ei:
            dev.pwrite_from_buffer(MiB, b"x" * 10)
        assert ei.value.errno == errno.ENOSPC
        assert "write beyond the end of the device: offset=1048576 + total_len=10 > device size 1048576" in str(ei.value)
        # straddling the end
        with pytest.raises(OSError, match="beyond the end") as ei:
            dev.pwrite_from_buffer(MiB - 4, b"abcdefgh")
        assert ei.value.errno == errno.ENOSPC
        # padding past the end
        with pytest.raises(OSError, match="beyond the end"):
            dev.pwrite_from_buffer(MiB - 4096, b"abc", 3, 8192)
        # exactly up to the end is fine
        dev.pwrite_from_buffer(MiB - 4, b"abcd")
        out = bytearray(4)
        dev.pread_into(MiB - 4, out, 4)
        assert out == b"abcd"
    assert os.path.getsize(p) == MiB
    with open(p, "rb") as f:
        f.seek(MiB - 8)
        assert f.read() == bytes(4) + b"abcd"


def test_huge_total_len_is_refused_before_allocating(sparse_file):
    p = sparse_file(1 * MiB)
    with RawBlockDevice(p, True) as dev:
        with pytest.raises(OSError, match="total_len=1099511627776") as ei:
            dev.pwrite_from_buffer(0, b"x", 1, 1 << 40)
        assert ei.value.errno == errno.ENOSPC
        with pytest.raises(RuntimeError, match="^unexpected EOF$"):
            dev.pread_into(0, bytearray(1), 1, 1 << 40)
        st = dev.io_stats_snapshot()
        assert st["write_attempts"] == 0 and st["read_attempts"] == 0, "refused before any I/O"
    assert os.path.getsize(p) == MiB


def test_huge_total_len_with_odirect(sparse_file):
    p = sparse_file(1 * MiB)
    try:
        dev = RawBlockDevice(p, True, use_odirect=True)
    except OSError as e:
        pytest.skip(f"O_DIRECT not supported here: {e}")
    with dev:
        with pytest.raises(OSError, match="beyond the end"):
            dev.pwrite_from_buffer(0, bytearray(4096), 4096, 1 << 40)
        with pytest.raises(OSError, match="beyond the end"):
            dev.pwrite_from_buffer(MiB, bytearray(4096), 4096, 4096)
    assert os.path.getsize(p) == MiB


def test_file_grown_after_open_takes_writes(sparse_file):
    p = sparse_file(1 * MiB)
    with RawBlockDevice(p, True) as dev:
        os.truncate(p, 2 * MiB)
        dev.pwrite_from_buffer(MiB, b"grown")
        assert dev.size_bytes() == MiB, "the size stays the one cached at open, as in LMCache"
        with pytest.raises(OSError, match="device size 2097152"):
            dev.pwrite_from_buffer(2 * MiB, b"x")
    assert os.path.getsize(p) == 2 * MiB


def _uring(p):
    try:
        return RawBlockDevice(p, True, io_engine="io_uring", iouring_queue_depth=8)
    except (OSError, RuntimeError) as e:
        pytest.skip(f"io_uring unavailable: {e}")


def test_uring_batched_write_past_end_is_refused(sparse_file):
    p = sparse_file(1 * MiB)
    dev = _uring(p)
    with dev:
        with pytest.raises(OSError, match="write beyond the end of the device") as ei:
            dev.batched_write([0, MiB], [b"a" * 16, b"b" * 16], [16, 16])
        assert ei.value.errno == errno.ENOSPC
        with pytest.raises(OSError, match="total_len=1099511627776"):
            dev.batched_write([0], [b"a"], [1 << 40], payload_lens=[1])
        with pytest.raises(OSError, match="beyond the end"):
            dev.write_uring(MiB - 1, b"ab", 2)
        # nothing of the refused batch was written; an in-range batch still works
        ok, errs = dev.wait_iouring(dev.batched_write([MiB - 16], [b"z" * 16], [16]))
        assert (ok, errs) == ([True], [])
    assert os.path.getsize(p) == MiB
    with open(p, "rb") as f:
        assert f.read(16) == bytes(16)
        f.seek(MiB - 16)
        assert f.read() == b"z" * 16


def test_uring_read_past_end_stays_a_per_entry_failure(sparse_file):
    p = sparse_file(1 * MiB)
    dev = _uring(p)
    with dev:
        ok, errs = dev.wait_iouring(dev.batched_read([0, MiB], [bytearray(16), bytearray(16)], [16, 16]))
        assert ok == [True, False] and [i for i, _m in errs] == [1]


def test_loop_device_write_past_end(loop_device):
    dev_path = loop_device(4 * MiB)
    with RawBlockDevice(dev_path, True) as dev:
        assert dev.size_bytes() == 4 * MiB
        with pytest.raises(OSError, match="write beyond the end of the device") as ei:
            dev.pwrite_from_buffer(4 * MiB - 512, bytearray(1024))
        assert ei.value.errno == errno.ENOSPC
        dev.pwrite_from_buffer(4 * MiB - 512, bytearray(b"q" * 512))
