"""RawBlockCore over NVMe passthrough on the emulated FDP SSD: puts and loads split into
NVMe commands, FDP placement of keys and of checkpoints as the device accounts it, and
checkpoint + recovery (with batched slot-header validation) through passthrough."""

from __future__ import annotations

import re

import pytest

from core_helpers import Obj, make_config, okey, payload
from helpers import ruamw
from lmcache_rawblock.raw_block import RawBlockCore

MiB = 1 << 20
SLOT = 256 * 1024


def pt_core(path: str, **kw) -> RawBlockCore:
    kw.setdefault("slot_bytes", SLOT)
    kw.setdefault("meta_total_bytes", 4 * MiB)
    kw.setdefault("capacity_bytes", 128 * MiB)
    kw.setdefault("meta_format", "log")  # the product default (the namespace is shared by the tests)
    cfg = make_config(path, io_engine="io_uring", use_uring_cmd=True, iouring_queue_depth=64, **kw)
    return RawBlockCore(cfg, key_namespace="object")


def drops(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
    return {p: before[p] - after[p] for p in before if before[p] != after[p]}


def test_round_trip_with_split_transfers_and_recovery(nvme_char):
    keys = [okey(i, model="nvme_pt") for i in range(40)]
    data = [payload(i, 1000 + i * 5000) for i in range(40)]  # up to ~196 KiB: several commands
    c = pt_core(nvme_char, max_data_transfer_size=16384)
    try:
        view = c.raw_device()  # what LMCache's callers ask of a passthrough device
        assert (view.nvme_nsid(), view.nvme_lba_size(), view.nvme_lba_shift()) == (1, 4096, 12)
        assert view.max_data_transfer_size() == 16384
        assert sorted(view.fetch_fdp_status()) == [(p, p) for p in range(16)]
        assert c.put_many(keys, [Obj(d) for d in data]).results == [True] * 40
        outs = [Obj(len(d)) for d in data]
        assert c.load_many_into([k.encoded for k in keys], outs) == [True] * 40
        assert [o.bytes() for o in outs] == data
        c.checkpoint_now()
    finally:
        c.close()
    # Reopen: the checkpoint is read and every slot header validated, in batches, through
    # passthrough.
    c = pt_core(nvme_char, max_data_transfer_size=16384)
    try:
        st = c.report_status()
        assert st["recovery_outcome"] == "loaded"
        assert st["indexed_key_count"] == 40 and st["recovery_dropped_entries"] == 0
        assert st["rust_io"]["max_batch_size"] > 1
        outs = [Obj(len(d)) for d in data]
        assert c.load_many_into([k.encoded for k in keys], outs) == [True] * 40
        assert [o.bytes() for o in outs] == data
    finally:
        c.close()


def test_keys_and_checkpoints_are_placed_on_their_handles(nvme_char):
    """Header and payload of a key go to its placement id; the checkpoint to
    meta_checkpoint_placement_id; nothing else moves."""
    c = pt_core(nvme_char, meta_checkpoint_placement_id=9, load_checkpoint_on_init=False)
    try:
        keys = [okey(1000 + i, model="nvme_place") for i in range(6)]
        # The two containers a previous run left may list any slot: until both are rewritten a
        # put writes checkpoints before taking one. A first put does that, so the put below
        # moves key data only.
        assert c.put_many([okey(999, model="nvme_place")], [Obj(4096)]).results == [True]
        before = ruamw(nvme_char)
        r = c.put_many(keys, [Obj(payload(i, 8192)) for i in range(6)], placement_ids=[4, 4, 4, 7, 7, None])
        assert r.results == [True] * 6
        after = ruamw(nvme_char)
        # 4 KiB header + 8 KiB payload = 3 blocks per key.
        moved = drops(before, after)
        assert moved.get(4) == 9 and moved.get(7) == 6
        assert set(moved) <= {0, 4, 7}
        before = after
        c.checkpoint_now()
        moved = drops(before, ruamw(nvme_char))
        assert list(moved) == [9] and moved[9] > 0
    finally:
        c.close()


def test_fetch_fdp_status_through_the_core(nvme_char):
    c = pt_core(nvme_char, load_checkpoint_on_init=False)
    try:
        assert sorted(c.fetch_fdp_status()) == [(p, p) for p in range(16)]
    finally:
        c.close()


def test_slot_affinity_reuses_a_slot_of_the_same_handle(nvme_char):
    c = pt_core(nvme_char, fdp_slot_affinity_enabled=True, load_checkpoint_on_init=False)
    try:
        a = [okey(2000 + i, model="nvme_aff") for i in range(4)]
        assert c.put_many(a, [Obj(4096) for _ in a], placement_ids=[5, 6, 5, 6]).results == [True] * 4
        assert c.delete_many([a[0].encoded, a[1].encoded]) == [True, True]
        c.checkpoint_now()  # freed slots become reusable once no durable checkpoint lists them
        c.checkpoint_now()
        b = okey(2100, model="nvme_aff")
        assert c.put_many([b], [Obj(4096)], placement_ids=[6]).results == [True]
        st = c.report_status()
        assert st["fdp_slot_affinity_hit_count"] >= 1
    finally:
        c.close()


def test_passthrough_core_refuses_a_block_device(nvme_block):
    with pytest.raises(ValueError, match="character device"):
        pt_core(nvme_block)


def test_a_file_system_on_the_namespace_is_not_overwritten(nvme_char, nvme_block):
    """libblkid cannot read the character device; the namespace's block device is probed."""
    import shutil
    import subprocess

    mkfs = shutil.which("mkfs.ext4")
    if mkfs is None:
        pytest.skip("mkfs.ext4 is not installed (e2fsprogs)")
    subprocess.run([mkfs, "-q", "-F", "-E", "nodiscard,lazy_itable_init=1", nvme_block], check=True)
    try:
        with pytest.raises(ValueError, match=r"holds a ext4 file system.*found by libblkid on " + re.escape(nvme_block)):
            pt_core(nvme_char)
    finally:
        subprocess.run(["wipefs", "-q", "-a", nvme_block], check=True)
    pt_core(nvme_char, load_checkpoint_on_init=False).close()
