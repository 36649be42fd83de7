"""Our MP adapter with FDP (LMCache 0.5.6 and 0.5.7): it starts (LMCache's code reads the device's
placement identifiers through our core's fetch_fdp_status), LMCache's cache-salt policies and
our tp_worker / prompt / phase strategies place store tasks' writes through our core's
put_many, and the FDP keys are checked with errors naming them. The device is a file standing
in for an FDP namespace (tests/fdp_fakes.py); tests/nvme runs the same on the emulated SSD.

Marked ``lmcache``: run with ``make test-lmcache``.
"""

from __future__ import annotations

import json
import os
import select

import pytest

from helpers import lmcache_imports

with lmcache_imports() as lmc:
    import torch
    from lmcache.v1.distributed.api import ObjectKey
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    from lmcache_rawblock import l2_adapter
    from lmcache_rawblock.l2_adapter import RawBlockL2Adapter, RawBlockL2AdapterConfig

pytestmark = lmc.marks

from fdp_fakes import FdpCoreOnFile  # noqa: E402

SLOT = 4096 + 16384


def params(dev: str, **over) -> dict:
    p = {"device_path": dev, "slot_bytes": SLOT, "meta_total_bytes": 1 << 20, "meta_enable_periodic": False,
         "use_odirect": False, "io_engine": "io_uring", "use_uring_cmd": True, "fdp_enabled": True}
    p.update(over)
    return p


@pytest.fixture
def dev(tmp_path):
    p = tmp_path / "dev.img"
    with open(p, "wb") as f:
        f.truncate(32 << 20)
    return str(p)


@pytest.fixture
def adapter(dev, monkeypatch):
    monkeypatch.setattr(l2_adapter, "_OurCore", FdpCoreOnFile)
    made = []

    def make(**over):
        from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config, add_l2_adapters_args
        import argparse

        spec = json.dumps({"type": "plugin", "module_path": "lmcache_rawblock.l2_adapter",
                           "class_name": "RawBlockL2Adapter", "adapter_params": params(dev, **over)})
        cfgs = parse_args_to_l2_adapters_config(add_l2_adapters_args(argparse.ArgumentParser()).parse_args(
            ["--l2-adapter", spec]))
        cfg = list(cfgs.adapters if hasattr(cfgs, "adapters") else cfgs)[0]
        a = create_l2_adapter_from_registry(cfg)
        made.append(a)
        return a

    yield make
    for a in made:
        a.close()


def kv_rank(rank: int, world: int) -> int:
    return ObjectKey.ComputeKVRank(world_size=world, global_rank=rank, local_world_size=world, local_rank=rank)


def key(h: int, rank: int = 0, world: int = 1, salt: str = "") -> "ObjectKey":
    return ObjectKey(chunk_hash=h.to_bytes(8, "big"), model_name="org/m", kv_rank=kv_rank(rank, world),
                     cache_salt=salt)


def obj(seed: int) -> "TensorMemoryObj":
    raw = torch.full((1024,), float(seed), dtype=torch.float32)
    meta = MemoryObjMetadata(shape=torch.Size([1024]), dtype=torch.float32, address=0, phy_size=4096,
                             fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(raw, meta, parent_allocator=None)


def store(a, keys) -> list:
    """One store task; the placement identifier each key was written with."""
    tid = a.submit_store_task(keys, [obj(i) for i in range(len(keys))])
    poll = select.poll()
    poll.register(a.get_store_event_fd(), select.POLLIN)
    assert poll.poll(10000), "the adapter never signalled its store event fd"
    try:
        os.eventfd_read(a.get_store_event_fd())
    except BlockingIOError:
        pass
    assert a.pop_completed_store_tasks()[tid].is_successful()
    from lmcache_rawblock.raw_block import encode_object_key

    return [a._core.placed[encode_object_key(k).encoded] for k in keys]


def test_lmcache_fdp_starts_on_our_core_and_places_by_cache_salt(adapter):
    a = adapter(meta_checkpoint_placement_id=1)
    assert type(a) is RawBlockL2Adapter and type(a._core) is FdpCoreOnFile
    st = a.report_status()
    assert st["fdp_enabled"] and st["fdp_discovered_status"] == FdpCoreOnFile.reported
    assert st["fdp_placement_ids"] == [2, 3, 4] and st["fdp_data_placement_policy"] == "cache_salt_prefix"
    assert st["core"]["fdp_slot_affinity_enabled"] is True
    assert store(a, [key(1, salt="Alice:1"), key(2, salt="bob:2"), key(3), key(4, salt="alice:9")]) == [2, 3, None, 2]


def test_tp_worker_strategy(adapter):
    a = adapter(fdp_data_placement_policy="tp_worker", fdp_placement_ids=[3, 4])
    assert store(a, [key(1, rank=r, world=4) for r in range(4)]) == [3, 4, 3, 4]
    assert a.report_status()["fdp_data_placement_policy"] == "tp_worker"


def test_prompt_strategy(adapter):
    a = adapter(fdp_data_placement_policy="prompt")  # ids (1, 2, 3, 4)
    assert store(a, [key(6), key(100), key(101)]) == [3, 3, 3]  # 6 % 4 == 2
    assert store(a, [key(9, salt="t:1"), key(10, salt="t:1"), key(11, salt="u:1")]) == [2, 2, 4]


def test_phase_strategy_by_shape_and_by_setting(adapter):
    a = adapter(fdp_data_placement_policy="phase", fdp_placement_ids=[2, 3])
    assert store(a, [key(1), key(2)]) == [2, 2]
    assert store(a, [key(3)]) == [3]
    a.close()  # one adapter (one core) per device at a time
    b = adapter(fdp_data_placement_policy="phase", fdp_placement_ids=[2, 3], fdp_phase="decode")
    assert store(b, [key(11), key(12)]) == [3, 3]


def test_none_places_nothing(adapter):
    a = adapter(fdp_data_placement_policy="none")
    assert store(a, [key(1, salt="a:b")]) == [None]


@pytest.mark.parametrize("over,exc,msg", [
    (dict(fdp_enabled=False, fdp_data_placement_policy="prompt"), ValueError,
     r"fdp_data_placement_policy='prompt' requires fdp_enabled=true"),
    (dict(fdp_data_placement_policy="phase", fdp_placement_ids=[2]), ValueError,
     r"fdp_data_placement_policy='phase' needs two identifiers in fdp_placement_ids \(prefill, decode\), got \[2\]"),
    (dict(fdp_phase="prefill"), ValueError,
     r"fdp_phase='prefill' applies to fdp_data_placement_policy='phase' only \(it is 'cache_salt_prefix'\)"),
    (dict(fdp_phase="soon"), ValueError, r"fdp_phase must be one of: auto, prefill, decode; got 'soon'"),
    (dict(fdp_data_placement_policy="zigzag"), ValueError,
     r"fdp_data_placement_policy must be one of: none, cache_salt_prefix, cache_salt_rank, tp_worker, prompt, phase; "
     r"got 'zigzag'"),
    (dict(use_uring_cmd=False), ValueError, r"fdp_enabled requires io_engine='io_uring' and use_uring_cmd=true"),
    (dict(fdp_placement_ids=[0, 2]), ValueError, r"fdp_placement_ids must not contain 0"),
    (dict(fdp_placement_ids=[2, 2]), ValueError, r"fdp_placement_ids must not contain duplicates"),
    (dict(fdp_placement_ids=[2], meta_checkpoint_placement_id=2), ValueError,
     r"meta_checkpoint_placement_id must not overlap with fdp_placement_ids"),
])
def test_config_errors_name_the_key(dev, over, exc, msg):
    with pytest.raises(exc, match=msg):
        RawBlockL2AdapterConfig.from_dict(params(dev, **over))


def test_identifiers_the_device_does_not_report(adapter):
    with pytest.raises(RuntimeError, match=r"configured=\[2, 9\] device=\[1, 2, 3, 4\]"):
        adapter(fdp_placement_ids=[2, 9])
    FdpCoreOnFile.reported = [(0, 0), (5, 1)]
    try:
        with pytest.raises(ValueError, match=r"'phase' needs two placement identifiers for KV data .* leaves \[5\]"):
            adapter(fdp_data_placement_policy="phase")
    finally:
        FdpCoreOnFile.reported = list(__import__("fdp_fakes").REPORTED)


def test_help_names_the_strategies():
    text = RawBlockL2AdapterConfig.help()
    assert "fdp_phase" in text and "also takes tp_worker, prompt, phase" in text
