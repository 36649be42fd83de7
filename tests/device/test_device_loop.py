"""RawBlockDevice on real block devices: loop devices with 512- and 4096-byte sectors
(root only; skipped with the reason elsewhere)."""

from __future__ import annotations

import errno
import mmap

import pytest

from lmcache_rawblock import RawBlockDevice

MiB = 1 << 20


def unaligned(n: int, shift: int = 512) -> memoryview:
    m = mmap.mmap(-1, n + shift + mmap.PAGESIZE)
    return memoryview(m)[shift : shift + n]


def test_block_device_size_comes_from_blkgetsize64(loop_device):
    dev_path = loop_device(size=24 * MiB)
    with RawBlockDevice(dev_path, False) as dev:
        assert dev.size_bytes() == 24 * MiB  # st_size of a block device node is 0


def test_4k_sector_device_rejects_512_byte_odirect_but_bounce_succeeds(loop_device):
    dev_path = loop_device(size=16 * MiB, sector_size=4096, direct_io=True)
    # alignment=512 lets a 512-byte access through our checks: the kernel refuses it.
    with RawBlockDevice(dev_path, True, use_odirect=True, alignment=512) as dev:
        with pytest.raises(OSError) as ei:
            dev.pread_into(512, bytearray(512), 512)
        assert ei.value.errno == errno.EINVAL and ei.value.strerror == "pread failed"
    # With the device's real alignment, memory at a 512-byte (not 4096) boundary goes
    # through the aligned bounce buffer and the payload is padded to a full sector.
    with RawBlockDevice(dev_path, True, use_odirect=True, alignment=4096) as dev:
        src = unaligned(1000)
        src[:] = bytes(range(250)) * 4
        dev.pwrite_from_buffer(8192, src, 1000, 4096)
        dst = unaligned(1000)
        dev.pread_into(8192, dst, 1000, 4096)
        assert bytes(dst) == bytes(src)
        assert dev.io_stats_snapshot()["bounce_attempts"] >= 2
    with open(dev_path, "rb") as f:
        f.seek(8192)
        raw = f.read(4096)
    assert raw[:1000] == bytes(src) and raw[1000:] == bytes(3096)


def test_512_sector_device_round_trip_large(loop_device):
    dev_path = loop_device(size=16 * MiB, sector_size=512)
    data = bytes(range(256)) * (4 * MiB // 256)
    with RawBlockDevice(dev_path, True, use_odirect=True, alignment=512) as dev:
        dev.pwrite_from_buffer(MiB, data)
        out = bytearray(len(data))
        dev.pread_into(MiB, out, len(data))
    assert out == data
