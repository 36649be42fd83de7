"""Differential test: the same calls on our RawBlockDevice and on LMCache's Rust wheel
(PyPI lmcache-rust-raw-block-io) give the same results, exception types and messages.
Skipped, with the reason, where the wheel is not installed."""

from __future__ import annotations

import pytest

from lmcache_rawblock import RawBlockDevice as Ours

from helpers import rust_module

rust = rust_module()
pytestmark = pytest.mark.skipif(rust is None, reason="lmcache-rust-raw-block-io is not installed (pip install lmcache-rust-raw-block-io)")

MiB = 1 << 20


def outcome(fn):
    try:
        r = fn()
    except BaseException as e:  # noqa: BLE001
        errno_ = e.errno if isinstance(e, OSError) else None  # our RuntimeErrors carry an errno too
        return ("raise", type(e).__name__, str(e) if errno_ is None else (errno_, e.strerror))
    return ("ok", r)


def scenarios(path, missing):
    """name -> function(cls) exercising one behaviour."""

    def dev(cls, **kw):
        return cls(path, True, **kw)

    def read(cls, n, payload, total=None, off=0, **kw):
        d = dev(cls, **kw)
        buf = bytearray(n)
        d.pread_into(off, buf, payload, total)
        d.close()
        return bytes(buf)

    def write_then_read(cls, data, total, **kw):
        d = dev(cls, **kw)
        d.pwrite_from_buffer(8192, data, len(data), total)
        out = bytearray(len(data))
        d.pread_into(8192, out, len(data), total)
        d.close()
        return bytes(out)

    return {
        "bad_engine": lambda c: c(path, True, io_engine="spdk"),
        "uring_cmd_without_iouring": lambda c: c(path, True, use_uring_cmd=True),
        "nul_path": lambda c: c(path + "\0x", True),
        "missing": lambda c: c(missing, True),
        "readonly_out": lambda c: dev(c).pread_into(0, b"abc", 3),
        "payload_gt_buffer_write": lambda c: dev(c).pwrite_from_buffer(0, b"abc", 4),
        "payload_gt_buffer_read": lambda c: read(c, 3, 4),
        "total_lt_payload_write": lambda c: dev(c).pwrite_from_buffer(0, b"abcd", 4, 2),
        "total_lt_payload_read": lambda c: read(c, 4, 4, 2),
        "odirect_offset": lambda c: read(c, 4096, 4096, 4096, off=512, use_odirect=True),
        "odirect_total": lambda c: read(c, 100, 100, 100, use_odirect=True),
        "eof": lambda c: read(c, 1, 1, off=16 * MiB),
        "eof_padding": lambda c: read(c, 4, 4, 64, off=16 * MiB - 32),
        "round_trip_padded": lambda c: write_then_read(c, b"hello world", 4096),
        "round_trip_odirect": lambda c: write_then_read(c, b"x" * 5000, 8192, use_odirect=True),
        "closed_pread": lambda c: (lambda d: (d.close(), d.pread_into(0, bytearray(1), 1)))(dev(c)),
        "closed_close_twice": lambda c: (lambda d: (d.close(), d.close()))(dev(c)),
        "size_after_close": lambda c: (lambda d: (d.close(), d.size_bytes()))(dev(c)),
        "posix_batched_read": lambda c: dev(c).batched_read([0], [bytearray(1)], [1]),
        "posix_wait": lambda c: dev(c).wait_iouring(5),
        "posix_worker_error": lambda c: dev(c).worker_error(),
        "posix_fixed_status": lambda c: dev(c).fixed_buffer_status(),
        "posix_register": lambda c: dev(c).register_fixed_buffers([4096], [4096]),
        "nvme_nsid": lambda c: dev(c).nvme_nsid(),
        "nvme_lba_size": lambda c: dev(c).nvme_lba_size(),
        "fdp_status": lambda c: dev(c).fetch_fdp_status(),
        "uring_cmd_regular_file": lambda c: c(path, True, io_engine="io_uring", use_uring_cmd=True),
    }


@pytest.fixture
def paths(sparse_file, tmp_path):
    return sparse_file(16 * MiB), str(tmp_path / "missing.img")


NAMES = list(scenarios("p", "m"))


@pytest.mark.parametrize("name", NAMES)
def test_same_behaviour_as_rust(paths, name):
    fn = scenarios(*paths)[name]
    theirs = outcome(lambda: fn(rust.RawBlockDevice))
    ours = outcome(lambda: fn(Ours))
    if theirs[0] == "ok" and ours[0] == "ok":
        # Return values (objects such as devices differ by type; compare plain data only).
        if isinstance(theirs[1], (bytes, tuple, list, int, type(None))):
            assert ours[1] == theirs[1]
        return
    assert ours == theirs
