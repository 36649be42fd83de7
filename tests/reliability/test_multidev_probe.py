"""The probe that decides whether a device of a MultiDeviceCore failed, on a real block device
whose logical block size (4096) is larger than the bytes it is asked to read: a direct read below
the logical block size is refused (EINVAL), which must not make a healthy drive look failed.

The rig needs root (tmpfs, loop devices); elsewhere this test skips with the reason."""

from __future__ import annotations

import os

from helpers import Rig
from lmcache_rawblock.raw_block.multi import _logical_block_size, probe_device


def test_the_probe_reads_the_logical_block_size_of_a_block_device(rig: Rig):
    fs = rig.tmpfs(24)
    backing = fs / "drive.img"
    with open(backing, "wb") as fh:
        fh.truncate(16 << 20)
    dev = rig.attach(str(backing), sector_size=4096)
    fd = os.open(dev, os.O_RDONLY)
    try:
        assert _logical_block_size(fd) == 4096
    finally:
        os.close(fd)
    assert probe_device(dev, 512) is None, "a 512-byte direct read of a 4096-byte-sector drive is no failure"
    assert probe_device(dev, 4096) is None
