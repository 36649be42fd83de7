"""FDP placement through the block device (/dev/nvmeXnY) with io_uring write streams.

Linux 6.16 added the SQE's write_stream field and the queue's max_write_streams: on an FDP
namespace the NVMe driver turns write stream s into a Data Placement directive for the s-th
placement id. Our device detects that at open (O_DIRECT, io_uring) and places writes that carry
a placement id. On an older guest kernel the same tests check that nothing is detected and that
writes still succeed unplaced.
"""

from __future__ import annotations

import mmap
import os
import re

import pytest

from core_helpers import Obj, make_config, okey
from helpers import ruamw
from lmcache_rawblock import RawBlockDevice
from lmcache_rawblock.raw_block import RawBlockCore

LBA = 4096
MiB = 1 << 20


def kernel_has_write_streams() -> bool:
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (6, 16)


def drops(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
    return {p: before[p] - after[p] for p in before if before[p] != after[p]}


def aligned(n: int, fill: int) -> mmap.mmap:
    m = mmap.mmap(-1, n)
    m[:] = bytes([fill]) * n
    return m


def test_streams_are_detected_where_the_kernel_has_them(nvme_block):
    dev = RawBlockDevice(nvme_block, True, use_odirect=True, io_engine="io_uring")
    try:
        expected = int(os.environ.get("RB_NVME_RUHS", "16")) if kernel_has_write_streams() else 0
        assert dev.write_streams() == expected
    finally:
        dev.close()
    # Buffered or posix: the kernel places only direct writes, so nothing is detected.
    for kw in (dict(use_odirect=False, io_engine="io_uring"), dict(use_odirect=True, io_engine="posix")):
        dev = RawBlockDevice(nvme_block, True, **kw)
        try:
            assert dev.write_streams() == 0
        finally:
            dev.close()


@pytest.mark.parametrize("pid", [2, 13])
def test_a_placed_block_device_write_is_charged_to_its_handle(nvme_block, pid):
    blocks = 8
    buf = aligned(blocks * LBA, pid)
    before = ruamw(nvme_block)
    dev = RawBlockDevice(nvme_block, True, use_odirect=True, io_engine="io_uring")
    try:
        bid = dev.batched_write([(200 + pid) * MiB], [buf], [blocks * LBA], [pid])
        assert dev.wait_iouring(bid) == ([True], [])
    finally:
        dev.close()
        buf.close()
    moved = drops(before, ruamw(nvme_block))
    if kernel_has_write_streams():
        assert list(moved) == [pid]
        assert moved[pid] == blocks or moved[pid] < 0  # a full reclaim unit is replaced
    else:
        assert set(moved) <= {0}  # unplaced: the default handle


def test_core_on_the_block_device_places_keys(nvme_block):
    cfg = make_config(nvme_block, io_engine="io_uring", use_odirect=True, slot_bytes=64 * 1024,
                      meta_total_bytes=4 * MiB, capacity_bytes=300 * MiB, load_checkpoint_on_init=False,
                      iouring_queue_depth=32)
    c = RawBlockCore(cfg, key_namespace="object")
    try:
        assert c.put_many([okey(1, model="streams")], [Obj(4096)]).results == [True]  # settles checkpoints
        before = ruamw(nvme_block)
        keys = [okey(10 + i, model="streams") for i in range(4)]
        r = c.put_many(keys, [Obj(8192) for _ in keys], placement_ids=[6, 6, 8, None])
        assert r.results == [True] * 4
        moved = drops(before, ruamw(nvme_block))
        if kernel_has_write_streams():
            assert moved.get(6) == 6 and moved.get(8) == 3  # header + two payload blocks per key
            assert set(moved) <= {0, 6, 8}
        else:
            assert set(moved) <= {0}
    finally:
        c.close()
