"""Our MP-mode raw-block L2 adapter (LMCache 0.5.6 and 0.5.7), selected by docs/configuration.md's
``--l2-adapter`` JSON through LMCache's own parser and factory (the ``plugin`` adapter type).

Marked ``lmcache``: run with ``make test-lmcache``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import select
import subprocess
import sys
import textwrap
import threading

import pytest

from helpers import REPO, TESTS, lmcache_imports

with lmcache_imports() as lmc:
    import torch
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.distributed.internal_api import L1MemoryDesc
    from lmcache.v1.distributed.l2_adapters import raw_block_l2_adapter as lmc_adapter
    from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
    from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    LmcCore = lmc_adapter.RawBlockCore  # LMCache's core, wherever the installed version keeps it

pytestmark = lmc.marks

logging.getLogger("LMCache").setLevel(logging.ERROR)

README_DEVICE = "/dev/nvme0n1"
SLOT = 4096 + 16384


def _readme_json() -> dict:
    text = (REPO / "docs" / "configuration.md").read_text()
    section = text[text.index("## As the core of LMCache's MP-mode L2 adapter"):]
    return json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))


def _adapter_json(device: str, **params) -> str:
    d = _readme_json()
    assert d["adapter_params"]["device_path"] == README_DEVICE
    d["adapter_params"].update(device_path=device, slot_bytes=SLOT, meta_total_bytes=1 << 20,
                               meta_enable_periodic=False, use_odirect=False, io_engine="posix")
    d["adapter_params"].update(params)
    return json.dumps(d)


def _parse(spec: str):
    parser = add_l2_adapters_args(argparse.ArgumentParser())
    return parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", spec]))


def _adapters(cfgs):
    return list(cfgs.adapters if hasattr(cfgs, "adapters") else cfgs)


def _device(tmp_path, name="dev.img", size=32 << 20) -> str:
    p = tmp_path / name
    with open(p, "wb") as f:
        f.truncate(size)
    return str(p)


def _key(i: int, group: int = 0, salt: str = "") -> "ObjectKey":
    return ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="org/mp-model", kv_rank=0, object_group_id=group,
                     cache_salt=salt)


def _obj(n_floats: int, seed: int) -> "TensorMemoryObj":
    g = torch.Generator().manual_seed(seed)
    raw = torch.rand(n_floats, generator=g, dtype=torch.float32)
    meta = MemoryObjMetadata(shape=torch.Size([n_floats]), dtype=torch.float32, address=0, phy_size=n_floats * 4,
                             fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(raw, meta, parent_allocator=None)


def _wait(fd: int, timeout: float = 10.0) -> None:
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    assert poll.poll(timeout * 1000), "the adapter never signalled its event fd"
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


def _store(adapter, keys, objs) -> bool:
    tid = adapter.submit_store_task(keys, objs)
    _wait(adapter.get_store_event_fd())
    return adapter.pop_completed_store_tasks()[tid].is_successful()


def _lookup(adapter, keys) -> list[int]:
    tid = adapter.submit_lookup_and_lock_task(keys, {0: MemoryLayoutDesc(shapes=[], dtypes=[])})
    _wait(adapter.get_lookup_and_lock_event_fd())
    return adapter.query_lookup_and_lock_result(tid).get_indices_list()


def _load(adapter, keys, objs) -> list[int]:
    tid = adapter.submit_load_task(keys, objs)
    _wait(adapter.get_load_event_fd())
    return adapter.query_load_result(tid).get_indices_list()


def test_readme_example_selects_our_core(tmp_path):
    from lmcache_rawblock.l2_adapter import RawBlockL2Adapter, RawBlockL2AdapterConfig
    from lmcache_rawblock.raw_block import RawBlockCore

    cfgs = _parse(_adapter_json(_device(tmp_path), verify_payload_checksum=True))
    adapter = create_l2_adapter_from_registry(_adapters(cfgs)[0])
    try:
        assert type(adapter) is RawBlockL2Adapter
        # a class of our own implementing LMCache's interface, not LMCache's adapter class
        assert isinstance(adapter, L2AdapterInterface) and not isinstance(adapter, lmc_adapter.RawBlockL2Adapter)
        assert type(adapter._core) is RawBlockCore and not isinstance(adapter._core, LmcCore)
        assert adapter._core.report_status()["verify_payload_checksum"] is True
        assert RawBlockL2AdapterConfig.from_dict({"device_path": "x", "slot_bytes": SLOT}).verify_payload_checksum \
            is False
    finally:
        adapter.close()
    # LMCache's own names are untouched: the built-in type still builds LMCache's core.
    assert lmc_adapter.RawBlockCore is LmcCore


def test_adapter_config_rejects_a_bad_boolean(tmp_path):
    cfg = _adapters(_parse(_adapter_json(_device(tmp_path), allow_foreign_device="maybe")))[0]
    with pytest.raises(ValueError, match=r"allow_foreign_device must be a boolean \(true/false\), got 'maybe'"):
        create_l2_adapter_from_registry(cfg)  # the plugin type builds the config when it creates
    from lmcache_rawblock.l2_adapter import RawBlockL2AdapterConfig

    with pytest.raises(ValueError, match=r"allow_foreign_device must be a boolean \(true/false\), got 'maybe'"):
        RawBlockL2AdapterConfig.from_dict({"device_path": "x", "slot_bytes": SLOT, "allow_foreign_device": "maybe"})


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_adapter_behaviour_on_our_core_and_devices_shared_with_lmcache(tmp_path, engine):
    """Store / lookup-and-lock / load / delete-while-locked / unlock through LMCache's adapter
    code on our core; then LMCache's built-in raw_block adapter reopens the device and finds
    the same keys and bytes, and ours reads what LMCache's adapter wrote."""
    dev = _device(tmp_path)
    keys = [_key(1), _key(1, group=1), _key(2, salt="tenant-a"), _key(3)]
    objs = [_obj(1024 + 256 * i, seed=i) for i in range(len(keys))]
    miss = _key(99)
    ours = create_l2_adapter_from_registry(_adapters(_parse(_adapter_json(dev, io_engine=engine, meta_format="v1")))[0])
    try:
        assert _store(ours, keys[:3], objs[:3]) is True
        assert _lookup(ours, [keys[0], miss, keys[1], keys[2]]) == [0, 2, 3]
        outs = [_obj(o.raw_data.numel(), seed=1000) for o in objs[:3]]
        assert _load(ours, [keys[0], keys[1], keys[2]], outs) == [0, 1, 2]
        assert all(torch.equal(a.raw_data, b.raw_data) for a, b in zip(outs, objs[:3]))
        # keys[0] is locked by the lookup: a delete leaves it until unlocked
        ours.delete([keys[0]])
        assert _lookup(ours, [keys[0]]) == [0]
        ours.submit_unlock([keys[0], keys[0], keys[1], keys[2]])
        ours.delete([keys[0]])
        assert _lookup(ours, [keys[0], keys[1]]) == [1]
        ours.submit_unlock([keys[1]])
        st = ours.report_status()
        assert st["is_healthy"] is True
    finally:
        ours.close()

    # ours wrote format v1 (meta_format), which LMCache's own core reads
    builtin = json.loads(_adapter_json(dev, io_engine=engine))
    builtin = dict(builtin["adapter_params"], type="raw_block")
    theirs = create_l2_adapter_from_registry(_adapters(_parse(json.dumps(builtin)))[0])
    try:
        assert isinstance(theirs._core, LmcCore)
        assert _lookup(theirs, [keys[0], keys[1], keys[2]]) == [1, 2]
        outs = [_obj(o.raw_data.numel(), seed=2000) for o in objs[1:3]]
        assert _load(theirs, keys[1:3], outs) == [0, 1]
        assert all(torch.equal(a.raw_data, b.raw_data) for a, b in zip(outs, objs[1:3]))
        theirs.submit_unlock(keys[1:3])
        assert _store(theirs, [keys[3]], [objs[3]]) is True
    finally:
        theirs.close()

    again = create_l2_adapter_from_registry(_adapters(_parse(_adapter_json(dev, io_engine=engine, meta_format="v1")))[0])
    try:
        assert _lookup(again, [keys[1], keys[2], keys[3]]) == [0, 1, 2]
        out = [_obj(objs[3].raw_data.numel(), seed=3000)]
        assert _load(again, [keys[3]], out) == [0]
        assert torch.equal(out[0].raw_data, objs[3].raw_data)
        again.submit_unlock([keys[1], keys[2], keys[3]])
    finally:
        again.close()


def test_fixed_buffer_registration_of_the_l1_arena(tmp_path):
    """On io_uring with zero-copy, LMCache's adapter registers the stable L1 arena through
    register_fixed_buffer_range; on our core the registration shows in report_status()."""
    arena = torch.zeros(4 << 20, dtype=torch.uint8)
    desc = L1MemoryDesc(ptr=arena.data_ptr(), size=arena.numel(), align_bytes=4096,
                        stable_registration_size=arena.numel())
    cfg = _adapters(_parse(_adapter_json(_device(tmp_path), io_engine="io_uring", enable_zero_copy=True)))[0]
    adapter = create_l2_adapter_from_registry(cfg, desc)
    try:
        st = adapter._core.report_status()
        assert (st["fixed_buffers_registered"], st["fixed_buffer_registered_bytes"]) == (True, arena.numel())
        key, obj = _key(7), _obj(2048, seed=7)
        assert _store(adapter, [key], [obj]) is True
    finally:
        adapter.close()


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_load_of_a_slot_holding_another_keys_header_is_a_miss(tmp_path, engine):
    """Another key's slot header over a key's slot (a second writer, a stale slot) with
    checksums off: LMCache's adapter code gets a miss for that key, never the bytes read."""
    dev = _device(tmp_path)
    keys = [_key(11), _key(12)]
    objs = [_obj(2048, seed=11), _obj(2048, seed=12)]  # the same length: only the identity differs
    adapter = create_l2_adapter_from_registry(
        _adapters(_parse(_adapter_json(dev, io_engine=engine, verify_payload_checksum=False)))[0])
    try:
        assert _store(adapter, keys, objs) is True
        core = adapter._core
        enc = [lmc_adapter.encode_object_key(k).encoded for k in keys]
        with open(dev, "r+b") as f:
            f.seek(core.entry_offset(enc[1]))
            hdr = f.read(core.header_bytes)
            f.seek(core.entry_offset(enc[0]))
            f.write(hdr)
        assert _lookup(adapter, keys) == [0, 1]
        outs = [_obj(2048, seed=1000), _obj(2048, seed=1001)]
        assert _load(adapter, keys, outs) == [1]
        assert int(torch.count_nonzero(outs[0].raw_data)) == 0  # what was read is erased
        assert torch.equal(outs[1].raw_data, objs[1].raw_data)
        assert core._native.status()["load_rejected_entries"] == 1
        adapter.submit_unlock(keys)
        assert _lookup(adapter, keys) == [1]
        adapter.submit_unlock([keys[1]])
        assert adapter.report_status()["is_healthy"] is True
    finally:
        adapter.close()


# --------------------------------------------------------------------------- deletes free their slots


def _full_adapter(tmp_path, slots: int):
    """Our adapter on a device of ``slots`` slots, every one holding an entry that a checkpoint
    lists (filled, closed, reopened): (adapter, keys, objects)."""
    dev = _device(tmp_path, size=(1 << 20) + slots * SLOT)
    adapter = create_l2_adapter_from_registry(_adapters(_parse(_adapter_json(dev)))[0])
    usable = adapter._core.slot_counts().usable
    keys = [_key(1000 + i) for i in range(usable)]
    objs = [_obj(1024, seed=i) for i in range(usable)]
    try:
        for k in range(0, usable, 8):
            assert _store(adapter, keys[k:k + 8], objs[k:k + 8]) is True
    finally:
        adapter.close()
    adapter = create_l2_adapter_from_registry(_adapters(_parse(_adapter_json(dev)))[0])
    c = adapter._core.slot_counts()
    assert (c.indexed, c.reusable, c.held) == (usable, 0, 0)
    return adapter, keys, objs


def test_deletes_free_their_slots_off_the_callers_thread(tmp_path):
    """LMCache's adapter code deletes a batch (one delete_many(force=False)); ours then writes
    the checkpoint that makes the freed slots reusable on its reclaim thread, so the stores
    that follow find slots without writing checkpoints of their own."""
    adapter, keys, objs = _full_adapter(tmp_path, 24)
    core = adapter._core
    try:
        assert _store(adapter, [_key(1)], [_obj(1024, seed=1)]) is False  # full: LMCache's answer
        threads = []
        real = core.reclaim_held_slots

        def recording():
            threads.append(threading.current_thread().name)
            return real()

        core.reclaim_held_slots = recording
        written = core._native.status()["checkpoints_written"]
        adapter.delete(keys[:8])
        assert adapter._reclaimer.wait_idle(60)
        assert threads and set(threads) == {"rawblock-l2-reclaim"}, threads
        assert core._native.status()["checkpoints_written"] > written
        assert _lookup(adapter, keys[:9]) == [8]
        adapter.submit_unlock([keys[8]])
        c = core.slot_counts()
        assert (c.indexed, c.held + c.reusable) == (len(keys) - 8, 8)

        new = [_key(2000 + i) for i in range(8)]
        new_objs = [_obj(1024, seed=2000 + i) for i in range(8)]
        assert _store(adapter, new, new_objs) is True
        # Without the reclaim the store writes one checkpoint per v1 container (two) first; a
        # core that frees held slots at the first checkpoint after a delete leaves it none.
        assert core.slot_counts().room_checkpoints <= 1
        outs = [_obj(1024, seed=9000 + i) for i in range(8)]
        assert _load(adapter, new, outs) == list(range(8))
        assert all(torch.equal(a.raw_data, b.raw_data) for a, b in zip(outs, new_objs))
        st = adapter.report_status()
        assert st["reclaim"]["passes"] >= 1 and st["reclaim"]["errors"] == 0
        reclaimer = adapter._reclaimer
    finally:
        adapter.close()
    assert not reclaimer.running, "close stops the reclaim thread"


def test_lmcache_eviction_controller_frees_slots_through_our_adapter(tmp_path):
    """LMCache's own L2 eviction controller (LRU, trigger_watermark / eviction_ratio) on our
    adapter: its deletes land as batches, the reclaim thread frees their slots, and stores go
    on succeeding on a device that was full."""
    from lmcache.v1.distributed.config import EvictionConfig
    from lmcache.v1.distributed.storage_controllers.eviction_controller import (
        L2AdapterEvictionState,
        L2EvictionController,
    )

    adapter, keys, objs = _full_adapter(tmp_path, 24)
    core = adapter._core
    deletes = []
    real_delete = core.delete_many

    def recording(encoded, *, force=False):
        deletes.append(len(encoded))
        return real_delete(encoded, force=force)

    core.delete_many = recording
    state = L2AdapterEvictionState(0, adapter, EvictionConfig("LRU", trigger_watermark=0.9, eviction_ratio=0.5))
    controller = L2EvictionController([state])
    controller.start()
    try:
        # The controller checks once a second: wait (bounded) for its first eviction.
        for _ in range(300):
            if adapter.get_usage().usage_fraction < 0.9:
                break
            threading.Event().wait(0.1)
        assert adapter.get_usage().usage_fraction < 0.9, "LMCache's controller never evicted"
        assert adapter._reclaimer.wait_idle(60)
        assert deletes and max(deletes) > 1, f"deletes came one key at a time: {deletes}"
        found = _lookup(adapter, keys)
        adapter.submit_unlock([keys[i] for i in found])
        assert len(found) < len(keys)
        new = [_key(3000 + i) for i in range(8)]
        new_objs = [_obj(1024, seed=3000 + i) for i in range(8)]
        assert _store(adapter, new, new_objs) is True
        assert adapter.report_status()["reclaim"]["passes"] >= 1
    finally:
        controller.stop()
        adapter.close()


# --------------------------------------------------------------------------- extent eviction

EXTENT_SLOTS = 4


class _Recorder:
    """An L2 listener recording what LMCache would be told (stored / deleted keys)."""

    def __init__(self):
        self.stored, self.deleted = [], []

    def on_l2_keys_stored(self, keys, sizes=None):
        self.stored += list(keys)

    def on_l2_keys_accessed(self, keys):
        pass

    def on_l2_keys_deleted(self, keys, sizes=None):
        self.deleted += list(keys)


def _extent_adapter(tmp_path, extents: int, **params):
    dev = _device(tmp_path, size=(1 << 20) + extents * EXTENT_SLOTS * SLOT)
    params.setdefault("eviction_policy", "extent")
    spec = _adapter_json(dev, extent_bytes=EXTENT_SLOTS * SLOT, **params)
    return create_l2_adapter_from_registry(_adapters(_parse(spec))[0])


def test_extent_eviction_keeps_storing_and_tells_lmcache_what_it_deleted(tmp_path):
    """eviction_policy extent in the adapter: stores of three devices' worth all succeed, the
    space comes back a whole extent at a time (every slot of a victim freed, the extent
    deallocated as one range), and LMCache's byte accounting stays equal to what the core
    holds, because every key the evictor deleted was reported deleted."""
    adapter = _extent_adapter(tmp_path, 16, extent_reserve=2, extent_reinsert=False, deallocate_freed="on")
    rec = _Recorder()
    adapter.register_listener(rec)
    core = adapter._core
    try:
        usable = core.slot_counts().usable
        keys = [_key(5000 + i) for i in range(3 * usable)]
        for k in range(0, len(keys), EXTENT_SLOTS):
            batch = keys[k:k + EXTENT_SLOTS]
            assert _store(adapter, batch, [_obj(1024, seed=5000 + k + j) for j in range(len(batch))]) is True, k
        assert adapter.wait_idle(60)
        st = adapter.report_status()
        assert st["eviction_policy"] == "extent" and st["reclaim"]["errors"] == 0, st
        assert st["evicted_extents"] >= (2 * usable) // EXTENT_SLOTS - 2, st
        assert st["evicted_extent_entries"] == len(rec.deleted) > 0
        present = set(i for i, ok in enumerate(core.exists_many([encode(k) for k in keys])) if ok)
        deleted = {keys.index(k) for k in rec.deleted}
        assert present and not present & deleted, "a key reported deleted is still held"
        assert present | deleted == set(range(len(keys))), "a key vanished without LMCache being told"
        assert adapter.get_usage().total_bytes_used == len(present) * int(core.slot_bytes)
        assert st["held_key_count"] == len(present) == core.slot_counts().indexed
        counts = core.extent_counts()
        assert counts["extents_clean"] + counts["extents_pending_dealloc"] >= 1, counts
        # space came back as whole extents: each deallocation one range of the extent's bytes
        dl = core.report_status()
        assert dl["dealloc_bytes"] > 0 and dl["dealloc_bytes"] % (EXTENT_SLOTS * SLOT) == 0, dl
        assert 0 < dl["dealloc_ranges"] <= dl["dealloc_bytes"] // (EXTENT_SLOTS * SLOT), dl
    finally:
        adapter.close()


def test_extent_eviction_puts_hot_keys_back_and_tells_lmcache(tmp_path):
    """A key loaded since its store survives the eviction of its extent (reinsertion); LMCache
    is told it was deleted and then stored again, so its accounting still holds it."""
    adapter = _extent_adapter(tmp_path, 16, extent_reserve=2)
    rec = _Recorder()
    adapter.register_listener(rec)
    core = adapter._core
    try:
        usable = core.slot_counts().usable
        first = [_key(7000 + i) for i in range(EXTENT_SLOTS)]
        first_objs = [_obj(1024, seed=7000 + i) for i in range(EXTENT_SLOTS)]
        assert _store(adapter, first, first_objs) is True
        hot = first[0]
        assert _load(adapter, [hot], [_obj(1024, seed=1)]) == [0]
        for k in range(0, 2 * usable, EXTENT_SLOTS):  # until the first extent is evicted
            batch = [_key(8000 + k + j) for j in range(EXTENT_SLOTS)]
            assert _store(adapter, batch, [_obj(1024, seed=8000 + k + j) for j in range(EXTENT_SLOTS)]) is True
            assert adapter.wait_idle(60)  # stores paced: the evictor (which reinserts) keeps ahead
            if hot in rec.deleted:
                break
        assert adapter.wait_idle(60)
        st = adapter.report_status()
        assert st["reinserted_extent_entries"] >= 1, st
        assert hot in rec.deleted and rec.stored.count(hot) >= 2, "LMCache never heard the hot key came back"
        out = [_obj(1024, seed=2)]
        assert _load(adapter, [hot], out) == [0]
        assert torch.equal(out[0].raw_data, first_objs[0].raw_data), "the key put back holds other bytes"
        assert all(k in rec.deleted for k in first[1:]), "cold keys of the first extent were kept"
    finally:
        adapter.close()


def _unlocked_lookup(adapter, keys) -> list[int]:
    """A prompt's lookup as LMCache's prefetch makes it (the chain in order), its locks released."""
    found = _lookup(adapter, keys)
    adapter.submit_unlock([keys[i] for i in found])
    return found


def _heads_scenario(tmp_path, policy: str) -> tuple[bool, bool, dict]:
    """The oldest extent holds a chain's first chunks, the next its tail (stored after a lookup
    that found the first four, as LMCache stores what its lookup missed), a third a chain whose
    head LMCache deleted; then stores until one extent is evicted: (the chain's head kept, the
    unreachable chunks kept, the status)."""
    adapter = _extent_adapter(tmp_path, 8, eviction_policy=policy, extent_reserve=1, extent_reinsert=False)
    try:
        chain, dead = [_key(i) for i in range(8)], [_key(10 + i) for i in range(4)]
        assert _store(adapter, chain[:4], [_obj(1024, i) for i in range(4)]) is True  # extent A: the head
        assert _unlocked_lookup(adapter, chain) == [0, 1, 2, 3]
        assert _store(adapter, chain[4:], [_obj(1024, i) for i in range(4, 8)]) is True  # extent B: the tail
        assert _store(adapter, dead, [_obj(1024, 10 + i) for i in range(4)]) is True  # extent C
        assert _unlocked_lookup(adapter, dead) == [0, 1, 2, 3]
        adapter.delete([dead[0]])  # LMCache's eviction: what follows is unreachable
        assert adapter.wait_idle(60)
        total, nxt = adapter._core.extent_counts()["extents_total"], 100
        while adapter.report_status()["evicted_extents"] == 0:
            assert nxt < 100 + 4 * EXTENT_SLOTS * total, "no extent was evicted"
            batch = [_key(nxt + j) for j in range(EXTENT_SLOTS)]  # newer extents, chains of their own
            assert _store(adapter, batch, [_obj(1024, nxt + j) for j in range(EXTENT_SLOTS)]) is True
            assert adapter.wait_idle(60)
            nxt += EXTENT_SLOTS
        st = adapter.report_status()
        assert st["evicted_extents"] == 1, st
        held = adapter._core.exists_many([encode(k) for k in chain + dead[1:]])
        return all(held[:8]), any(held[8:]), st
    finally:
        adapter.close()


def test_extent_prefix_in_mp_mode_evicts_the_unreachable_extent_before_a_chains_head(tmp_path):
    """eviction_policy extent_prefix in the adapter: the chains learned from LMCache's lookups
    weigh the victim, so of the extents filled longest ago the one whose chunks no lookup can
    reach goes, not the oldest (the chain's head, whose loss would take its tail too)."""
    head_kept, dead_kept, st = _heads_scenario(tmp_path, "extent_prefix")
    assert (head_kept, dead_kept) == (True, False), st
    assert st["eviction_policy"] == "extent_prefix" and st["extent_victims_not_oldest"] == 1, st
    assert st["prefix_keys"] == st["held_key_count"], st


def test_plain_extent_in_mp_mode_evicts_the_oldest_extent_in_the_same_scenario(tmp_path):
    assert _heads_scenario(tmp_path, "extent")[:2] == (False, True)


def test_adapter_eviction_policy_is_checked(tmp_path):
    """The adapter's eviction settings are checked when LMCache builds it, naming the value."""
    dev = _device(tmp_path)

    def build(**params):
        return create_l2_adapter_from_registry(_adapters(_parse(_adapter_json(dev, **params)))[0])

    with pytest.raises(ValueError, match=r"eviction_policy must be one of none, extent, extent_prefix .*'lru'"):
        build(eviction_policy="lru")
    with pytest.raises(ValueError, match=r"eviction_policy must be one of .*'extent-prefix'"):
        build(eviction_policy="extent-prefix")
    with pytest.raises(ValueError, match=r"extent_reserve=3 needs eviction_policy 'extent' or 'extent_prefix'"):
        build(extent_reserve=3)
    with pytest.raises(ValueError, match=r"extent_reserve must be an integer >= 1"):
        build(eviction_policy="extent", extent_reserve="two")
    with pytest.raises(ValueError, match="needs extents"):
        build(eviction_policy="extent")
    with pytest.raises(ValueError, match="needs extents"):
        build(eviction_policy="extent_prefix")


def encode(key) -> str:
    from lmcache_rawblock.raw_block import encode_object_key

    return encode_object_key(key).encoded


def test_key_whose_extent_is_evicted_before_its_store_finishes_is_not_reported_stored(tmp_path):
    """A store's keys are in the core before the store task records them; the extent evictor
    can delete their extent in that window (a small cache). LMCache must then not be told
    those keys were stored: what it holds stays what the core holds. The window is made by
    running the evictor from the store's own put, right after the core committed it."""
    adapter = _extent_adapter(tmp_path, 16, extent_reserve=2, extent_reinsert=False)
    rec = _Recorder()
    adapter.register_listener(rec)
    core = adapter._core
    real_put = core.put_many
    evicted = []

    def put_then_evict(*args, **kwargs):
        result = real_put(*args, **kwargs)
        if not evicted:  # the first store's first extent is closed now: evict it before the finish
            evicted.append(adapter._extents.evict(EXTENT_SLOTS))
        return result

    core.put_many = put_then_evict
    try:
        keys = [_key(9000 + i) for i in range(EXTENT_SLOTS + 1)]  # one extent filled, the next opened
        assert _store(adapter, keys, [_obj(1024, seed=9000 + i) for i in range(len(keys))]) is True
        assert evicted == [EXTENT_SLOTS], evicted
        held = set(i for i, ok in enumerate(core.exists_many([encode(k) for k in keys])) if ok)
        told = {keys.index(k) for k in rec.stored} - {keys.index(k) for k in rec.deleted}
        assert len(held) == 1, held
        assert told == held, f"LMCache was told {sorted(told)} are stored; the core holds {sorted(held)}"
        assert adapter.get_usage().total_bytes_used == len(held) * int(core.slot_bytes)
        assert adapter.report_status()["held_key_count"] == len(held)
    finally:
        del core.put_many
        adapter.close()


def test_deletes_kept_for_stores_in_flight_are_forgotten_once_those_stores_finish(tmp_path):
    """The extent evictor's deletes are remembered only for the stores in flight when they were
    made: under stores that overlap without ever going idle (each starts before the last ends),
    the remembered deletes stay as few as the stores still running could need, not every key
    evicted since the adapter last had no store in flight."""
    adapter = _extent_adapter(tmp_path, 16, extent_reserve=2, extent_reinsert=False)
    gates: list[threading.Event] = []

    def held_store(gate_list, _objects):
        assert gate_list[0].wait(30), "the test never released this store"
        return True, []

    def start() -> int:
        gate = threading.Event()
        gates.append(gate)
        return adapter._submit("store", held_store, adapter._finish_store, [gate], [None])

    try:
        running = start()
        for i in range(20):
            nxt = start()
            adapter._extent_deleted([f"evicted-{i}"])  # an eviction while both are in flight
            gates[-2].set()
            _wait(adapter.get_store_event_fd())
            assert running in adapter.pop_completed_store_tasks()
            running = nxt
        # only the last delete came after the running store started
        assert list(adapter._evicted_storing) == ["evicted-19"], adapter._evicted_storing
        gates[-1].set()
        _wait(adapter.get_store_event_fd())
        assert running in adapter.pop_completed_store_tasks()
        assert not adapter._evicted_storing
    finally:
        for gate in gates:
            gate.set()
        adapter.close()


def test_a_drop_check_during_an_extent_eviction_waits_for_its_record(tmp_path, caplog):
    """The background thread's check for entries the core dropped by itself compares what the
    adapter holds with the core. Run between the evictor's delete in the core and its record in
    the adapter, it would take the victim's keys for dropped ones (a false warning, and the
    keys told deleted by the wrong path): it waits for the eviction instead."""
    adapter = _extent_adapter(tmp_path, 16, extent_reserve=2, extent_reinsert=False)
    rec = _Recorder()
    adapter.register_listener(rec)
    keys = [_key(9600 + i) for i in range(EXTENT_SLOTS + 1)]  # one extent filled, the next opened
    told_adapter = adapter._extents._on_deleted
    reports: list[int] = []
    checker: list[threading.Thread] = []

    def check_drops_then_tell(encoded):
        t = threading.Thread(target=lambda: reports.append(adapter._report_dropped()))
        checker.append(t)
        t.start()
        t.join(0.5)  # a check that does not wait for the eviction has finished by now
        told_adapter(encoded)

    try:
        assert _store(adapter, keys, [_obj(1024, seed=9600 + i) for i in range(len(keys))]) is True
        adapter._extents._on_deleted = check_drops_then_tell
        with caplog.at_level(logging.WARNING, logger="lmcache_rawblock.l2_adapter"):
            assert adapter._extents.evict(EXTENT_SLOTS) == EXTENT_SLOTS
            checker[0].join(10)
            adapter._tell_recorded()
        assert reports == [0], reports
        assert "dropped by the core" not in caplog.text
        assert sorted(rec.deleted, key=repr) == sorted(keys[:EXTENT_SLOTS], key=repr)  # each victim told once
        assert adapter.report_status()["held_key_count"] == 1
    finally:
        adapter.close()


def test_key_stored_again_while_its_eviction_is_told_stays_reported_stored(tmp_path):
    """The extent evictor deletes a victim's keys in the core, then tells the adapter. A store
    of one of those keys that puts it again and finishes in between holds it in the core:
    LMCache must not be told it was deleted after it was told it was stored again."""
    adapter = _extent_adapter(tmp_path, 16, extent_reserve=2, extent_reinsert=False)
    rec = _Recorder()
    adapter.register_listener(rec)
    core = adapter._core
    keys = [_key(9500 + i) for i in range(EXTENT_SLOTS + 1)]  # one extent filled, the next opened
    told_adapter = adapter._extents._on_deleted

    def store_again_then_tell(encoded):
        again = [k for k in keys if encode(k) == encoded[0]]
        assert _store(adapter, again, [_obj(1024, seed=1)]) is True
        told_adapter(encoded)

    try:
        assert _store(adapter, keys, [_obj(1024, seed=9500 + i) for i in range(len(keys))]) is True
        adapter._extents._on_deleted = store_again_then_tell
        assert adapter._extents.evict(EXTENT_SLOTS) == EXTENT_SLOTS
        adapter._tell_recorded()
        held = {i for i, ok in enumerate(core.exists_many([encode(k) for k in keys])) if ok}
        assert len(held) == 2, held
        assert adapter.report_status()["held_key_count"] == len(held), "the key stored again was dropped"
        assert keys[0] not in rec.deleted, "LMCache was told the key stored again was deleted"
    finally:
        adapter.close()


def test_key_stored_again_before_its_eviction_is_told_is_counted_once(tmp_path):
    """LMCache's byte usage (the base class sums what listeners are told) matches what the core
    holds when an evicted key is stored again before the eviction is told."""
    adapter = _extent_adapter(tmp_path, 16, extent_reserve=2, extent_reinsert=False)
    core = adapter._core
    keys = [_key(9600 + i) for i in range(EXTENT_SLOTS + 1)]
    try:
        assert _store(adapter, keys, [_obj(1024, seed=9600 + i) for i in range(len(keys))]) is True
        assert adapter._extents.evict(EXTENT_SLOTS) == EXTENT_SLOTS
        assert _store(adapter, keys[:1], [_obj(1024, seed=1)]) is True
        adapter._tell_recorded()
        held = {i for i, ok in enumerate(core.exists_many([encode(k) for k in keys])) if ok}
        assert held == {0, EXTENT_SLOTS}, held
        assert adapter.report_status()["held_key_count"] == len(held)
        assert adapter.get_usage().total_bytes_used == len(held) * int(core.slot_bytes)
    finally:
        adapter.close()


def test_extent_prefix_chains_forget_a_key_evicted_while_its_store_finishes(tmp_path):
    """Under extent_prefix the chains hear of a victim's keys first, then the adapter. A store
    that put one of them before the delete and finishes in between must not leave it in the
    chains as stored: the core no longer holds it."""
    adapter = _extent_adapter(tmp_path, 16, extent_reserve=2, extent_reinsert=False, eviction_policy="extent_prefix")
    core = adapter._core
    keys = [_key(9700 + i) for i in range(EXTENT_SLOTS + 1)]
    gate = threading.Event()

    def held_store(_keys, _objects):
        assert gate.wait(30), "the test never released this store"
        return True, [(encode(keys[0]), keys[0])]  # it put keys[0] before the eviction

    chains_first, told_adapter = adapter._extents.chooser.deleted, adapter._extent_deleted

    def store_finishes_between(encoded):
        chains_first(encoded)
        gate.set()
        _wait(adapter.get_store_event_fd())
        told_adapter(encoded)

    try:
        assert _store(adapter, keys, [_obj(1024, seed=9700 + i) for i in range(len(keys))]) is True
        adapter._submit("store", held_store, adapter._finish_store, [None], [None])
        adapter._extents._on_deleted = store_finishes_between
        assert adapter._extents.evict(EXTENT_SLOTS) == EXTENT_SLOTS
        assert core.exists_many([encode(keys[0])]) == [False]
        assert encode(keys[0]) not in adapter._chains, "the chains hold a key the core deleted"
    finally:
        gate.set()
        adapter.close()


class _Sequence(_Recorder):
    """A listener recording what it is told, in order: ("stored" | "deleted", key)."""

    def __init__(self):
        super().__init__()
        self.events = []

    def on_l2_keys_stored(self, keys, sizes=None):
        self.events += [("stored", k) for k in keys]

    def on_l2_keys_deleted(self, keys, sizes=None):
        self.events += [("deleted", k) for k in keys]


@pytest.mark.parametrize("how", ["delete", "dropped"])
def test_a_key_deleted_before_its_store_is_told_is_told_stored_then_deleted(tmp_path, how):
    """A store records its keys, then tells LMCache; a delete of one of them (LMCache's own
    eviction, or the core dropping it) can come in between. LMCache must hear stored, then
    deleted, as it happened: told the other way round its listeners keep a key the core no
    longer holds, and its byte usage (clamped at zero by the delete) counts it."""
    adapter = create_l2_adapter_from_registry(_adapters(_parse(_adapter_json(_device(tmp_path))))[0])
    rec = _Sequence()
    adapter.register_listener(rec)
    key = _key(9800)
    tell = adapter._tell_recorded

    def deleted_in_between():
        adapter._tell_recorded = tell
        if how == "delete":
            adapter.delete([key])
        else:
            adapter._core.delete_many([encode(key)])  # gone without the adapter's delete
            assert adapter._report_dropped() == 1
        tell()

    try:
        adapter._tell_recorded = deleted_in_between
        assert _store(adapter, [key], [_obj(1024, seed=9800)]) is True
        assert adapter._core.exists_many([encode(key)]) == [False]
        assert rec.events == [("stored", key), ("deleted", key)], rec.events
        assert adapter.get_usage().total_bytes_used == 0
    finally:
        adapter.close()


def test_a_key_lmcache_deletes_while_a_store_of_it_runs_is_not_told_stored_again(tmp_path):
    """LMCache deletes a held key while a store of that key is in flight, its put already in the
    core (so the delete removes it). The store then finishes: the core does not hold the key,
    so LMCache must not be told it was stored after it was told it was deleted."""
    adapter = create_l2_adapter_from_registry(_adapters(_parse(_adapter_json(_device(tmp_path))))[0])
    rec = _Sequence()
    key = _key(9900)
    gate = threading.Event()

    def held_store(_keys, _objects):
        assert gate.wait(30), "the test never released this store"
        return True, [(encode(key), key)]  # it put the key before the delete

    try:
        assert _store(adapter, [key], [_obj(1024, seed=9900)]) is True
        adapter.register_listener(rec)
        adapter._submit("store", held_store, adapter._finish_store, [None], [None])
        adapter.delete([key])
        gate.set()
        _wait(adapter.get_store_event_fd())
        assert adapter._core.exists_many([encode(key)]) == [False]
        assert rec.events == [("stored", key), ("deleted", key)], rec.events
        assert adapter.report_status()["held_key_count"] == 0
        assert adapter.get_usage().total_bytes_used == 0
    finally:
        gate.set()
        adapter.close()


def test_a_listener_deleting_what_it_is_told_was_stored_does_not_hang_the_adapter(tmp_path):
    """A listener that deletes a key from inside the notice that it was stored (the telling
    thread calls back into the adapter) must not wait on the telling it runs in: the store
    completes, LMCache hears stored, then deleted, and nothing stays counted. Run in a child
    process so that a hang fails the test instead of stopping the run."""
    code = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(TESTS)!r}, {str(TESTS / "conformance")!r}]
        from pathlib import Path
        import test_conformance_mp_adapter as t
        adapter = t.create_l2_adapter_from_registry(t._adapters(t._parse(t._adapter_json(
            t._device(Path({str(tmp_path)!r})))))[0])
        key = t._key(9950)
        rec = t._Sequence()

        class Evicting(t._Sequence):
            def on_l2_keys_stored(self, keys, sizes=None):
                adapter.delete(keys)

        adapter.register_listener(rec)
        adapter.register_listener(Evicting())
        assert t._store(adapter, [key], [t._obj(1024, seed=9950)]) is True
        assert adapter._core.exists_many([t.encode(key)]) == [False]
        assert rec.events == [("stored", key), ("deleted", key)], rec.events
        assert adapter.get_usage().total_bytes_used == 0
        adapter.close()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_a_listener_registered_with_events_still_untold_hears_each_key_stored_once(tmp_path):
    """A listener registering while stores and deletes are recorded but not yet told (their
    teller waits, or has not run yet) hears of every entry held when it registered, once, and
    of what is recorded after, never of what was recorded before: told the held keys directly
    and then the queue, it heard a key stored twice, and deleted a key it never heard stored."""
    adapter = create_l2_adapter_from_registry(_adapters(_parse(_adapter_json(_device(tmp_path))))[0])
    first, late = _Sequence(), _Sequence()
    adapter.register_listener(first)
    gone, kept, after = _key(9960), _key(9961), _key(9962)
    tell = adapter._tell_recorded
    try:
        assert _store(adapter, [gone], [_obj(1024, seed=9960)]) is True
        adapter._tell_recorded = lambda: None  # the teller of what follows has not run yet
        adapter.delete([gone])
        assert _store(adapter, [kept], [_obj(1024, seed=9961)]) is True
        adapter._tell_recorded = tell
        adapter.register_listener(late)
        adapter._tell_recorded()  # the teller runs
        assert _store(adapter, [after], [_obj(1024, seed=9962)]) is True
        assert late.events == [("stored", kept), ("stored", after)], late.events
        assert first.events == [("stored", gone), ("deleted", gone), ("stored", kept), ("stored", after)]
        assert adapter.get_usage().total_bytes_used == 2 * SLOT
    finally:
        adapter._tell_recorded = tell
        adapter.close()


def test_a_listener_registered_from_inside_a_notice_hears_each_key_stored_once(tmp_path):
    """A listener that registers another from inside the notice that keys were stored: the new
    one hears those keys once (as held when it registered), not also from the notice under
    way, and hears what comes after."""
    adapter = create_l2_adapter_from_registry(_adapters(_parse(_adapter_json(_device(tmp_path))))[0])
    late = _Sequence()

    class Registering(_Sequence):
        def on_l2_keys_stored(self, keys, sizes=None):
            super().on_l2_keys_stored(keys, sizes)
            if len(self.events) == 1:
                adapter.register_listener(late)

    first = Registering()
    adapter.register_listener(first)
    k1, k2 = _key(9970), _key(9971)
    try:
        assert _store(adapter, [k1], [_obj(1024, seed=9970)]) is True
        assert late.events == [("stored", k1)], late.events
        adapter.delete([k1])
        assert _store(adapter, [k2], [_obj(1024, seed=9971)]) is True
        assert late.events == [("stored", k1), ("deleted", k1), ("stored", k2)], late.events
        assert first.events == late.events
    finally:
        adapter.close()
