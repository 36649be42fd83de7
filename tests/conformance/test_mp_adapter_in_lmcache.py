"""Our MP-mode L2 adapter inside the real LMCache of the installed version (0.5.6 or 0.5.7):
``shared`` and the memory tags, ``submit_touch``, entries our core drops reaching LMCache's
listeners and event bus, LMCache's serde wrapper around our adapter with slots sized from the
serialised size, and per-``cache_salt`` quotas through LMCache's own eviction controller.

Marked ``lmcache``: run with ``make test-lmcache``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import threading

import pytest

from helpers import lmcache_imports

with lmcache_imports() as lmc:
    import torch
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.distributed.config import EvictionConfig
    from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
    from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry
    from lmcache.v1.distributed.storage_controllers.eviction_controller import (
        L2AdapterEvictionState,
        L2EvictionController,
    )
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
    from lmcache.v1.mp_observability.event import EventType
    from lmcache.v1.mp_observability.event_bus import EventBusConfig, init_event_bus

    from lmcache_rawblock.l2_adapter import RawBlockL2Adapter, memory_tags, slot_bytes_for
    from lmcache_rawblock.raw_block import encode_object_key

pytestmark = lmc.marks

logging.getLogger("LMCache").setLevel(logging.ERROR)

SLOT = 4096 + 16384
HAS_TAGS = hasattr(L2AdapterInterface, "get_memory_tags") if lmc.reason is None else False


def _spec(device: str, *, outer: dict | None = None, typ: str = "plugin", **params) -> str:
    p = {"device_path": device, "slot_bytes": SLOT, "meta_total_bytes": 1 << 20, "meta_enable_periodic": False,
         "use_odirect": False, "io_engine": "posix"}
    p.update(params)
    d = ({"type": "plugin", "module_path": "lmcache_rawblock.l2_adapter", "class_name": "RawBlockL2Adapter",
          "adapter_params": p} if typ == "plugin" else dict(p, type=typ))
    d.update(outer or {})
    return json.dumps(d)


def _build(spec: str, desc=None):
    """The adapter as LMCache's storage manager builds it: parsed from the --l2-adapter JSON,
    created by the factory, then given its identity with the JSON's ``shared``."""
    parser = add_l2_adapters_args(argparse.ArgumentParser())
    cfgs = parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", spec]))
    cfg = list(cfgs.adapters if hasattr(cfgs, "adapters") else cfgs)[0]
    adapter = create_l2_adapter_from_registry(cfg, desc) if desc is not None else create_l2_adapter_from_registry(cfg)
    adapter.set_backend_identity(json.loads(spec)["type"], shared=cfg.shared)
    return adapter


def _device(tmp_path, name="dev.img", size=32 << 20) -> str:
    p = tmp_path / name
    with open(p, "wb") as f:
        f.truncate(size)
    return str(p)


def _key(i: int, salt: str = "") -> "ObjectKey":
    return ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="org/mp-model", kv_rank=0, cache_salt=salt)


def _obj(n_floats: int, seed: int) -> "TensorMemoryObj":
    raw = torch.rand(n_floats, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    meta = MemoryObjMetadata(shape=torch.Size([n_floats]), dtype=torch.float32, address=0, phy_size=n_floats * 4,
                             fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(raw, meta, parent_allocator=None)


def _wait(fd: int, timeout: float = 20.0) -> None:
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    assert poll.poll(timeout * 1000), "the adapter never signalled its event fd"
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


def _store(adapter, keys, objs) -> bool:
    tid = adapter.submit_store_task(keys, objs)
    for _ in range(100):
        _wait(adapter.get_store_event_fd())
        done = adapter.pop_completed_store_tasks()
        if tid in done:
            return done[tid].is_successful()
    raise AssertionError("the store task never completed")


def _lookup(adapter, keys) -> list[int]:
    tid = adapter.submit_lookup_and_lock_task(keys, {0: MemoryLayoutDesc(shapes=[], dtypes=[])})
    _wait(adapter.get_lookup_and_lock_event_fd())
    found = adapter.query_lookup_and_lock_result(tid).get_indices_list()
    adapter.submit_unlock([keys[i] for i in found])
    return found


def _load(adapter, keys, objs) -> list[int]:
    tid = adapter.submit_load_task(keys, objs)
    for _ in range(100):
        _wait(adapter.get_load_event_fd())
        bitmap = adapter.query_load_result(tid)
        if bitmap is not None:
            return bitmap.get_indices_list()
    raise AssertionError("the load task never completed")


class Recorder:
    """An L2 adapter listener (LMCache's L2AdapterListener methods) that records its calls."""

    def __init__(self) -> None:
        self.stored: list = []
        self.accessed: list = []
        self.deleted: list = []

    def on_l2_keys_stored(self, keys, sizes=None) -> None:
        self.stored.extend(keys)

    def on_l2_keys_accessed(self, keys) -> None:
        self.accessed.extend(keys)

    def on_l2_keys_deleted(self, keys) -> None:
        self.deleted.extend(keys)


# --------------------------------------------------------------------------- shared, memory tags


def test_our_class_implements_the_interface_of_the_installed_version():
    assert issubclass(RawBlockL2Adapter, L2AdapterInterface)
    assert not getattr(RawBlockL2Adapter, "__abstractmethods__", None)
    if HAS_TAGS:  # 0.5.7: get_memory_tags is abstract in LMCache's interface
        assert "get_memory_tags" in L2AdapterInterface.__abstractmethods__


@pytest.mark.parametrize("where", ["none", "adapter_params", "outer"])
def test_shared_gives_the_tags_lmcache_own_adapter_gives(tmp_path, where):
    """``shared`` in adapter_params or in the --l2-adapter JSON itself: (storage, remote), as
    LMCache's built-in raw_block type reports with ``shared``; (storage, local) without."""
    dev = _device(tmp_path)
    params = {"shared": True} if where == "adapter_params" else {}
    outer = {"shared": True} if where == "outer" else None
    ours = _build(_spec(dev, outer=outer, **params))
    try:
        tags = ours.get_memory_tags()
        shared = where != "none"
        assert tags == memory_tags(shared)
        assert str(getattr(tags.residency, "name", tags.residency)).lower() == ("remote" if shared else "local")
        assert str(getattr(tags.segment, "name", tags.segment)).lower() == "storage"
        assert ours.report_status()["memory_tags"] == ["storage", "remote" if shared else "local"]
    finally:
        ours.close()
    if not HAS_TAGS:
        return  # 0.5.6: LMCache's adapter has no memory tags to compare with
    theirs = _build(_spec(dev, typ="raw_block", outer={"shared": True} if where != "none" else None))
    try:
        assert theirs.get_memory_tags() == tags
    finally:
        theirs.close()


def test_shared_reaches_the_events_lmcache_publishes(tmp_path):
    bus = init_event_bus(EventBusConfig(enabled=True))
    seen = []
    bus.subscribe(EventType.L2_KEYS_STORED, lambda e: seen.append(e.metadata))
    bus.start()
    try:
        adapter = _build(_spec(_device(tmp_path), outer={"shared": True}))
        try:
            assert _store(adapter, [_key(1)], [_obj(1024, 1)]) is True
        finally:
            adapter.close()
        for _ in range(100):
            if seen:
                break
            threading.Event().wait(0.05)
        assert seen and seen[0]["shared"] is True and seen[0]["backend"] == "plugin"
    finally:
        bus.stop()
        init_event_bus(EventBusConfig(enabled=False))


def test_a_bad_shared_value_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"shared must be a boolean \(true/false\), got 'perhaps'"):
        _build(_spec(_device(tmp_path), shared="perhaps"))


# --------------------------------------------------------------------------- touch


def test_touch_refreshes_lmcache_lru_order_without_io(tmp_path):
    """submit_touch: LMCache's LRU policy, fed by our adapter, evicts the untouched key first;
    the device sees no read and no write."""
    adapter = _build(_spec(_device(tmp_path)))
    try:
        state = L2AdapterEvictionState(0, adapter, EvictionConfig("LRU", trigger_watermark=0.0, eviction_ratio=0.5))
        keys = [_key(i) for i in range(4)]
        assert _store(adapter, keys, [_obj(1024, i) for i in range(4)]) is True
        io = adapter._core._native.status()["io"]
        before = {k: v for k, v in io.items() if isinstance(v, int)}
        # LMCache's LRU takes a store batch's last key as the oldest: keys[3] goes first.
        first = state.eviction_policy.get_eviction_actions(0.25)[0].keys
        assert first == [keys[3]]
        adapter.submit_touch([keys[3]])
        after_touch = state.eviction_policy.get_eviction_actions(0.25)[0].keys
        assert after_touch == [keys[2]]
        io = adapter._core._native.status()["io"]
        assert {k: v for k, v in io.items() if isinstance(v, int)} == before
    finally:
        adapter.close()


# --------------------------------------------------------------------------- drops reach the listeners


def _overwrite_header(dev: str, core, victim, donor) -> None:
    enc = [encode_object_key(k).encoded for k in (victim, donor)]
    with open(dev, "r+b") as f:
        f.seek(core.entry_offset(enc[1]))
        hdr = f.read(core.header_bytes)
        f.seek(core.entry_offset(enc[0]))
        f.write(hdr)


def test_an_entry_the_core_drops_reaches_lmcache_listeners_and_events(tmp_path):
    """A slot whose header no longer matches its key: the load misses, the core drops the
    entry, and the adapter's background thread tells LMCache's listeners and event bus it was
    deleted; LMCache's byte accounting (per cache_salt too) follows."""
    bus = init_event_bus(EventBusConfig(enabled=True))
    events = []
    bus.subscribe(EventType.L2_KEYS_DELETED, lambda e: events.append(e.metadata))
    bus.start()
    dev = _device(tmp_path)
    adapter = _build(_spec(dev, verify_payload_checksum=False))
    try:
        rec = Recorder()
        adapter.register_listener(rec)
        keys = [_key(11, salt="a"), _key(12, salt="a")]
        assert _store(adapter, keys, [_obj(2048, 11), _obj(2048, 12)]) is True
        assert adapter.get_usage().bytes_by_cache_salt["a"] == 2 * SLOT
        _overwrite_header(dev, adapter._core, keys[0], keys[1])
        assert _load(adapter, keys, [_obj(2048, 0), _obj(2048, 0)]) == [1]
        assert adapter.wait_idle(30)
        assert rec.deleted == [keys[0]]
        usage = adapter.get_usage()
        assert (usage.total_bytes_used, usage.bytes_by_cache_salt["a"]) == (SLOT, SLOT)
        assert adapter.report_status()["held_key_count"] == 1
        for _ in range(100):
            if events:
                break
            threading.Event().wait(0.05)
        assert events and events[0]["keys"] == [keys[0]]
        # stored again, it is held again (a later check does not drop the new store)
        assert _store(adapter, [keys[0]], [_obj(2048, 13)]) is True
        adapter._reclaimer.signal()
        assert adapter.wait_idle(30)
        assert rec.deleted == [keys[0]] and adapter.get_usage().total_bytes_used == 2 * SLOT
    finally:
        adapter.close()
        bus.stop()
        init_event_bus(EventBusConfig(enabled=False))


def test_deletes_tell_listeners_once(tmp_path):
    adapter = _build(_spec(_device(tmp_path)))
    try:
        rec = Recorder()
        adapter.register_listener(rec)
        keys = [_key(i) for i in range(3)]
        assert _store(adapter, keys, [_obj(1024, i) for i in range(3)]) is True
        adapter.delete([keys[0], keys[0], _key(99)])
        adapter.delete([keys[0]])
        assert adapter.wait_idle(30)
        assert rec.deleted == [keys[0]]
        assert adapter.get_usage().total_bytes_used == 2 * SLOT
    finally:
        adapter.close()


# --------------------------------------------------------------------------- serde


def _l1():
    from lmcache.v1.distributed.config import L1ManagerConfig, L1MemoryManagerConfig
    from lmcache.v1.distributed.l1_manager import L1Manager

    return L1Manager(L1ManagerConfig(memory_config=L1MemoryManagerConfig(size_in_bytes=32 << 20, use_lazy=False,
                                                                          shm_name="")))


def _l1_objects(l1, keys, layout, tag, fill=None):
    res = l1.reserve_write(keys=keys, is_temporary=[False] * len(keys), layout_desc=layout, tag=tag)
    objs = [res[k][1] for k in keys]
    assert all(o is not None for o in objs), res
    if fill is not None:
        for o, t in zip(objs, fill):
            o.tensor.copy_(t)
    return objs


def _serde_kwargs(kind: str, tmp_path) -> dict:
    if kind == "aesgcm":
        path = tmp_path / "master.key"
        path.write_bytes(os.urandom(32))
        return {"master_key_path": str(path)}
    if kind == "turboquant":
        return {"head_dim": 64, "skip_first_layers": 0, "skip_last_layers": 0}
    return {}


@pytest.mark.parametrize("kind", ["fp8", "aesgcm", "turboquant"])
def test_lmcache_serde_wrapper_around_our_adapter(tmp_path, kind):
    """LMCache's SerdeL2AdapterWrapper (what its storage manager builds from the JSON's
    ``serde``) around our adapter, slots sized by ``slot_bytes_for`` from the serialised
    size: chunks go through serialise, our store, our load and deserialise; the raw chunk
    would not fit such a slot where the serialised one is smaller."""
    from lmcache.v1.distributed.l2_adapters.serde_wrapper import SerdeL2AdapterWrapper
    from lmcache.v1.distributed.serde import SerdeConfig, create_serde_processor

    layout = MemoryLayoutDesc(shapes=[torch.Size([2, 4, 16, 64])], dtypes=[torch.bfloat16])
    serde = dict(type=kind, **_serde_kwargs(kind, tmp_path))
    try:
        slot = slot_bytes_for(layout, serde=serde)
    except ValueError as e:  # a serde type this LMCache version does not register
        pytest.skip(f"LMCache's {kind} serde is not in this version: {e}")
    raw_slot = slot_bytes_for(layout)
    if kind == "turboquant" and not torch.cuda.is_available():
        assert slot < raw_slot  # its size estimate works anywhere
        pytest.skip("LMCache's turboquant serde serialises with Triton kernels that require CUDA; no GPU here")
    l1 = _l1()
    inner = _build(_spec(_device(tmp_path), slot_bytes=slot), l1.get_l1_memory_desc())
    if slot < raw_slot:  # the raw chunk does not fit a slot sized for the serialised one
        raw = _l1_objects(l1, [_key(50)], layout, "raw", [torch.zeros(2, 4, 16, 64, dtype=torch.bfloat16)])
        assert _store(inner, [_key(50)], raw) is False
        l1.finish_write_and_delete([_key(50)], tag="raw")
    processor = create_serde_processor(SerdeConfig(type=kind, kwargs={k: v for k, v in serde.items() if k != "type"}))
    wrapper = SerdeL2AdapterWrapper(inner=inner, serde=processor, l1_manager=l1)
    try:
        keys = [_key(i) for i in range(3)]
        data = [torch.randn(2, 4, 16, 64, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
                for i in range(3)]
        src = _l1_objects(l1, keys, layout, "src", data)
        l1.finish_write(keys, tag="src")
        assert _store(wrapper, keys, src) is True
        assert inner.report_status()["held_key_count"] == 3
        dst = _l1_objects(l1, [_key(100 + i) for i in range(3)], layout, "dst")
        assert _load(wrapper, keys, dst) == [0, 1, 2]
        for d, want in zip(dst, data):
            if kind == "aesgcm":
                assert torch.equal(d.tensor, want)
            elif kind == "fp8":
                assert torch.equal(d.tensor, want.to(torch.float8_e4m3fn).to(torch.bfloat16))
            else:
                assert torch.isfinite(d.tensor.float()).all() and d.tensor.float().abs().sum() > 0
    finally:
        wrapper.close()
        l1.close()


def test_slot_bytes_for_the_chunk_itself():
    layout = MemoryLayoutDesc(shapes=[torch.Size([2, 4, 16, 64])], dtypes=[torch.bfloat16])
    assert slot_bytes_for(layout) == 4096 + 16384
    assert slot_bytes_for(layout, serde={"type": "fp8"}) == 4096 + 8192
    assert slot_bytes_for(layout, header_bytes=512, block_align=512) == 512 + 16384


# --------------------------------------------------------------------------- per-cache_salt quotas


def test_cache_salt_quota_through_lmcache_eviction_controller(tmp_path):
    """LMCache's IsolatedLRU policy and QuotaManager, through its L2 eviction controller, on our
    adapter: the salt over its quota loses keys (ours delete them and free their slots), the
    salt under its quota keeps all of its own."""
    from lmcache.v1.distributed.quota_manager import QuotaManager

    adapter = _build(_spec(_device(tmp_path)))
    quotas = QuotaManager()
    quotas.set_quota("tenant-a", 4 * SLOT)
    quotas.set_quota("tenant-b", 100 * SLOT)
    state = L2AdapterEvictionState(0, adapter, EvictionConfig("IsolatedLRU", trigger_watermark=0.9,
                                                              eviction_ratio=0.5))
    controller = L2EvictionController([state], quota_manager=quotas)
    a_keys = [_key(i, salt="tenant-a") for i in range(8)]
    b_keys = [_key(100 + i, salt="tenant-b") for i in range(4)]
    try:
        assert _store(adapter, a_keys, [_obj(1024, i) for i in range(8)]) is True
        assert _store(adapter, b_keys, [_obj(1024, 100 + i) for i in range(4)]) is True
        controller.start()
        for _ in range(300):  # the controller checks once a second
            if adapter.get_usage().bytes_by_cache_salt.get("tenant-a", 0) < 0.9 * 4 * SLOT:
                break
            threading.Event().wait(0.1)
        usage = adapter.get_usage().bytes_by_cache_salt
        assert usage.get("tenant-a", 0) < 0.9 * 4 * SLOT, "LMCache's controller never evicted tenant-a"
        assert usage["tenant-b"] == 4 * SLOT
        assert adapter.wait_idle(30)
        assert _lookup(adapter, b_keys) == [0, 1, 2, 3]
        left = _lookup(adapter, a_keys)
        assert len(left) * SLOT == usage.get("tenant-a", 0)
        assert adapter._core.slot_counts().indexed == len(left) + len(b_keys)
    finally:
        controller.stop()
        adapter.close()


# --------------------------------------------------------------------------- drop_unreachable


def _rank_key(i: int, rank: int) -> "ObjectKey":
    return ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="org/mp-model", kv_rank=rank, cache_salt="")


@pytest.mark.parametrize("drop", [True, False])
def test_lmcache_eviction_of_a_middle_chunk_drops_the_chunks_behind_it(tmp_path, drop):
    """LMCache's LRU (its policy, fed by our adapter's listeners; its controller's delete)
    takes a store's last chunks first, so of a prompt stored in two calls (a first turn, then
    its continuation) it evicts the middle of the chain. With drop_unreachable our adapter
    deletes what follows, which no lookup can reach, and LMCache's listeners and byte
    accounting see those deletes too. Off, those chunks stay as dead bytes."""
    params = {"drop_unreachable": True} if drop else {}
    adapter = _build(_spec(_device(tmp_path), **params))
    state = L2AdapterEvictionState(0, adapter, EvictionConfig("LRU", trigger_watermark=0.5, eviction_ratio=0.25))
    controller = L2EvictionController([state])
    try:
        rec = Recorder()
        adapter.register_listener(rec)
        chain = [_key(i) for i in range(8)]
        assert _store(adapter, chain[:4], [_obj(1024, i) for i in range(4)]) is True
        assert _store(adapter, chain[4:], [_obj(1024, i) for i in range(4, 8)]) is True
        assert _lookup(adapter, chain) == list(range(8))  # a prompt's lookup: the chain in order
        actions = state.eviction_policy.get_eviction_actions(0.25)
        assert [k for a in actions for k in a.keys] == [chain[3], chain[2]]
        for action in actions:  # what the controller's loop does with them
            controller._execute_eviction_action(adapter, action)
        assert adapter.wait_idle(30)
        # The lookup's bitmap shows every chunk held; LMCache's prefix stops at the first miss.
        assert _lookup(adapter, chain) == ([0, 1] if drop else [0, 1, 4, 5, 6, 7])
        held = adapter.report_status()["held_key_count"]
        if drop:
            assert held == 2, "every chunk behind the evicted ones is gone"
            assert set(rec.deleted) == set(chain[2:])
            assert adapter.report_status()["dropped_unreachable_count"] == 4
            assert adapter.get_usage().total_bytes_used == 2 * SLOT
            assert state.eviction_policy.get_eviction_actions(1.0)[0].keys == [chain[1], chain[0]]
        else:
            assert held == 6 and set(rec.deleted) == {chain[2], chain[3]}
    finally:
        adapter.close()


def test_drop_unreachable_keeps_chains_of_other_ranks(tmp_path):
    """A lookup hands a request's keys rank by rank: each rank's chain is its own."""
    adapter = _build(_spec(_device(tmp_path), drop_unreachable="true"))
    try:
        r0 = [_rank_key(i, 0) for i in range(4)]
        r1 = [_rank_key(i, 1) for i in range(4)]
        assert _store(adapter, r0 + r1, [_obj(1024, i) for i in range(8)]) is True
        assert _lookup(adapter, r0 + r1) == list(range(8))
        adapter.delete([r0[1]])
        assert adapter.wait_idle(30)
        assert _lookup(adapter, r0) == [0]
        assert _lookup(adapter, r1) == [0, 1, 2, 3]
    finally:
        adapter.close()


def test_drop_unreachable_keeps_a_chunk_whose_predecessor_was_stored_again(tmp_path):
    """A chunk a lookup held when its predecessor was deleted stays; once the predecessor is
    stored again (the prompt recomputed) a lookup reaches it, so a later delete elsewhere must
    not drop it as unreachable."""
    adapter = _build(_spec(_device(tmp_path), drop_unreachable=True))
    try:
        chain, other = [_key(i) for i in range(4)], [_key(100 + i) for i in range(2)]
        assert _store(adapter, chain + other, [_obj(1024, i) for i in range(6)]) is True
        assert _lookup(adapter, chain) == [0, 1, 2, 3]
        assert _lookup(adapter, other) == [0, 1]
        held = adapter.submit_lookup_and_lock_task([chain[2]], {0: MemoryLayoutDesc(shapes=[], dtypes=[])})
        _wait(adapter.get_lookup_and_lock_event_fd())
        assert adapter.query_lookup_and_lock_result(held).get_indices_list() == [0]
        adapter.delete([chain[1]])  # chain[3] is dropped; chain[2], locked, stays
        adapter.submit_unlock([chain[2]])
        assert _lookup(adapter, chain) == [0, 2]
        assert _store(adapter, [chain[1]], [_obj(1024, 1)]) is True  # the recompute stores it again
        assert _lookup(adapter, chain) == [0, 1, 2]
        adapter.delete([other[1]])  # a delete of another prompt's chunk
        assert adapter.wait_idle(30)
        assert _lookup(adapter, chain) == [0, 1, 2], "chain[2] is reachable: it stays"
        assert adapter.report_status()["dropped_unreachable_count"] == 1
    finally:
        adapter.close()


def test_drop_unreachable_setting_is_checked(tmp_path):
    with pytest.raises(ValueError, match=r"drop_unreachable must be a boolean \(true/false\), got 'sometimes'"):
        _build(_spec(_device(tmp_path), drop_unreachable="sometimes"))
