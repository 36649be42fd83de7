"""The passthrough transfer limit as the core's configuration resolves it, on the emulated NVMe
device: from sysfs (max_hw_sectors_kb, capped by max_segments pages), or explicit (a multiple of
block_align); the same limit the device derives in C."""

from __future__ import annotations

import os
from unittest.mock import patch

import pytest

from core_helpers import make_config
from lmcache_rawblock import RawBlockDevice
from lmcache_rawblock.raw_block import config as rb_config


def resolve(path: str, requested: int) -> int:
    cfg = make_config(path, io_engine="io_uring", use_uring_cmd=True, max_data_transfer_size=requested)
    return rb_config.resolve_passthrough(cfg).max_data_transfer_size


def fake_sysfs(values: dict[str, int | None]):
    def read(path: str) -> int | None:
        return values.get(os.path.basename(path))
    return patch.object(rb_config, "_read_sysfs_int", side_effect=read)


def test_transfer_limit_from_sysfs(nvme_char):
    with fake_sysfs({"max_hw_sectors_kb": 1024, "max_segments": 4096}) as read:
        assert resolve(nvme_char, 0) == 1024 * 1024
    assert read.call_args_list[0].args[0] == "/sys/block/nvme0n1/queue/max_hw_sectors_kb"


def test_transfer_limit_capped_by_max_segments(nvme_char):
    with fake_sysfs({"max_hw_sectors_kb": 2048, "max_segments": 128}):
        assert resolve(nvme_char, -1) == 128 * os.sysconf("SC_PAGE_SIZE")


def test_transfer_limit_without_max_segments(nvme_char):
    with fake_sysfs({"max_hw_sectors_kb": 512}):
        assert resolve(nvme_char, 0) == 512 * 1024


def test_transfer_limit_fails_without_sysfs(nvme_char):
    with fake_sysfs({}), pytest.raises(RuntimeError, match="failed to read max_hw_sectors_kb"):
        resolve(nvme_char, 0)


def test_explicit_transfer_limit_must_be_block_aligned(nvme_char):
    assert resolve(nvme_char, 4096) == 4096
    assert resolve(nvme_char, 8192) == 8192
    with pytest.raises(ValueError, match=r"max_data_transfer_size \(5000\) must be a multiple of block_align \(4096\)"):
        resolve(nvme_char, 5000)


def test_resolved_limit_matches_the_device(nvme_char):
    """Python's resolution from the real sysfs and the device's own (in C) agree."""
    dev = RawBlockDevice(nvme_char, False, io_engine="io_uring", use_uring_cmd=True)
    try:
        assert resolve(nvme_char, 0) == dev.max_data_transfer_size()
    finally:
        dev.close()
