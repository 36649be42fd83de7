"""Our cost-aware KVLoadPolicy inside LMCache 0.5.7's MP mode, through its real hook: the server's
own argument parser and configs, its MPCacheServerContext with a StorageManager over our L2
adapter, and its LookupModule built by its factory, which constructs the policy from
``--kv-load-policy`` and ``--runtime-plugin-config``. Chunks stored through the storage
manager and dropped from L1 are served from our device while it is idle; while a store burst
is queued on the device (held by the engine's test hook) the lookup is refused, before any
prefetch, and the engine recomputes.

Marked ``lmcache``: run with ``make test-lmcache`` (LMCache 0.5.7 or later: 0.5.6 has no hook).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import threading
import time

import pytest

from helpers import lmcache_imports
from lmcache_rawblock.lmcache_paths import KV_LOAD_POLICY_MODULE, has_module, lmcache_installed

if lmcache_installed() and not has_module(KV_LOAD_POLICY_MODULE):
    pytest.skip("the KVLoadPolicy hook (lmcache.v1.multiprocess.kv_load_policy) is in LMCache 0.5.7 and later",
                allow_module_level=True)

with lmcache_imports() as lmc:
    import torch
    from lmcache.v1.distributed.api import MemoryLayoutDesc
    from lmcache.v1.distributed.config import add_storage_manager_args, parse_args_to_config
    from lmcache.v1.multiprocess.config import (
        add_coordinator_args,
        add_mp_server_args,
        parse_args_to_coordinator_config,
        parse_args_to_mp_server_config,
    )
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
    from lmcache.v1.multiprocess.engine_context import MPCacheServerContext
    from lmcache.v1.multiprocess.engine_module import ModuleBuildContext
    from lmcache.v1.multiprocess.kv_load_policy import create_kv_load_policy
    from lmcache.v1.multiprocess.modules.lookup import LookupModule, ipc_key_to_object_keys

    from core_helpers import Obj, okey
    from lmcache_rawblock.load_policy import PRIOR_KEY, RATE_KEY, RawBlockLoadCostPolicy

pytestmark = lmc.marks

logging.getLogger("LMCache").setLevel(logging.ERROR)

POLICY = "lmcache_rawblock.load_policy:RawBlockLoadCostPolicy"
CHUNK = 16
PAYLOAD = 16384  # [2, 4, 16, 64] bfloat16
MiB = 1 << 20


class Server:
    """LMCache's MP server pieces, built as its run_cache_server builds them (no transport)."""

    def __init__(self, tmp_path, plugin_config: dict, policy: str = POLICY):
        dev = tmp_path / "dev.img"
        with open(dev, "wb") as f:
            f.truncate(64 * MiB)
        spec = {"type": "plugin", "module_path": "lmcache_rawblock.l2_adapter", "class_name": "RawBlockL2Adapter",
                "adapter_params": {"device_path": str(dev), "slot_bytes": 4096 + PAYLOAD,
                                   "meta_total_bytes": 1 << 20, "meta_enable_periodic": False,
                                   "use_odirect": False, "io_engine": "io_uring", "io_scheduler": "fifo"}}
        parser = argparse.ArgumentParser()
        add_mp_server_args(parser)
        add_storage_manager_args(parser)
        add_coordinator_args(parser)
        args = parser.parse_args([
            "--kv-load-policy", policy, "--runtime-plugin-config", json.dumps(plugin_config),
            "--l1-size-gb", "0.05", "--eviction-policy", "LRU", "--l2-adapter", json.dumps(spec),
            "--chunk-size", str(CHUNK)])
        mp = parse_args_to_mp_server_config(args)
        try:
            self.ctx = MPCacheServerContext(storage_manager_config=parse_args_to_config(args), chunk_size=mp.chunk_size)
        except RuntimeError as e:
            if "io_uring" in str(e):
                pytest.skip(f"io_uring unavailable: {e}")
            raise
        self.lookup = LookupModule.create(ModuleBuildContext(self.ctx, mp, parse_args_to_coordinator_config(args)))
        self.policy = self.lookup._load_policy
        self.layout = MemoryLayoutDesc(shapes=[torch.Size([2, 4, 16, 64])], dtypes=[torch.bfloat16])
        self.ctx.layout_desc_registry.register("m", 1, self.layout)
        self.adapter = self.ctx.storage_manager.l2_adapters()[0][1]

    def key(self, rid: str, ntok: int, start: int = 0, **configs) -> IPCCacheServerKey:
        return IPCCacheServerKey.from_token_ids("m", 1, None, list(range(ntok)), start, ntok, request_id=rid,
                                                request_configs=configs or None)

    def store_on_device_only(self, ntok: int) -> None:
        """Store the chunks of the first ntok tokens through the storage manager, wait for
        our adapter to hold them, then drop them from L1 so only the device can serve them."""
        k = self.key("store", ntok)
        hashes = self.ctx.token_hasher.compute_packed_chunk_hashes(k.token_bytes, end=k.end)
        keys = [o for group in ipc_key_to_object_keys(k, hashes, [0]) for o in group]
        sm = self.ctx.storage_manager
        for obj in sm.reserve_write(keys, self.layout).values():
            obj.tensor.fill_(1)
        sm.finish_write(keys)
        for _ in range(2000):  # a hang guard, not a verdict
            if self.adapter.report_status().get("held_key_count", 0) >= len(keys):
                break
            time.sleep(0.01)
        assert self.adapter.report_status()["held_key_count"] == len(keys)
        assert sm.delete_l1_keys(keys, force=True) == (len(keys), 0)

    def ask(self, key: IPCCacheServerKey) -> tuple[int, str]:
        """(hit chunks, the lookup's early-exit reason) as the engine would poll them."""
        self.lookup.lookup(key, 1)
        job = self.lookup._prefetch_jobs.get(key.request_id)
        reason = job.early_exit_reason if job is not None else "?"
        for _ in range(2000):
            hits = self.lookup.query_prefetch_status(key.request_id)
            if hits is not None:
                # done with the request as an engine is: its read locks given back, its session ended
                self.lookup.free_lookup_locks(key, 1)
                self.lookup.end_session(key.request_id)
                return hits, reason
            time.sleep(0.005)
        raise AssertionError("the prefetch never finished")

    def close(self) -> None:
        self.ctx.close()


_BURSTS = itertools.count()


def held_burst(core, nkeys: int, while_held):
    """A store burst of nkeys new slots queued on the core's device (the engine holds it) while
    while_held() runs; released after, and the burst must land."""
    res: dict = {}
    base = 10_000 + 1000 * next(_BURSTS)
    core._native._hold_engine(True)
    try:
        t = threading.Thread(target=lambda: res.setdefault(
            "put", core.put_many([okey(base + i, "burst") for i in range(nkeys)],
                                 [Obj(PAYLOAD) for _ in range(nkeys)]).results))
        t.start()
        for _ in range(20000):  # a hang guard, not a verdict
            if core._native.load_queue()[1] >= MiB:  # the core sends a put in rounds: 1 MiB queued suffices
                break
            time.sleep(0.001)
        assert core._native.load_queue()[1] >= MiB, "the burst is queued"
        out = while_held()
    finally:
        core._native._hold_engine(False)
    t.join()
    assert res["put"] == [True] * nkeys
    return out


# 8 chunks of 16 tokens, 16 KiB each from the device. Recompute at 500 tokens/s: 0.256 s. The
# prior read bandwidth, 1 MiB/s: 8 chunks from an idle device 0.125 s (served); behind a burst of
# 16 KiB stores with at least 1 MiB queued over 1 s (refused).
CONFIG = {RATE_KEY: 500, PRIOR_KEY: MiB} if lmc.reason is None else {}


def test_lmcache_builds_our_policy_from_its_config(tmp_path):
    s = Server(tmp_path, CONFIG)
    try:
        assert isinstance(s.policy, RawBlockLoadCostPolicy)
        assert s.policy.recompute_tps == 500.0 and s.policy.prior_bandwidth == MiB
    finally:
        s.close()


def test_refused_behind_a_store_burst_and_served_when_idle(tmp_path):
    s = Server(tmp_path, CONFIG)
    try:
        s.store_on_device_only(8 * CHUNK)
        core = s.adapter._core
        assert held_burst(core, 256, lambda: s.ask(s.key("busy", 8 * CHUNK))) == (0, "load_policy_recompute")
        assert s.policy.decisions["refused"] == 1
        assert s.policy.last["load_seconds"] > s.policy.last["recompute_seconds"]
        assert s.ask(s.key("idle", 8 * CHUNK)) == (8, ""), "an idle device serves every chunk from disk"
        assert s.policy.decisions["served"] == 1
        assert s.policy.last["load_seconds"] < s.policy.last["recompute_seconds"]
    finally:
        s.close()


def test_tokens_the_engine_holds_are_not_priced(tmp_path):
    """Behind a burst, a lookup whose whole range the engine already holds (its start and the
    ``engine_computed_tokens`` hint) loads nothing, so it is not refused: the engine's prefix
    is reported as covered."""
    s = Server(tmp_path, CONFIG)
    try:
        s.store_on_device_only(8 * CHUNK)
        hint = {"lmcache.hint.engine_computed_tokens": 8 * CHUNK}
        out = held_burst(s.adapter._core, 256, lambda: s.ask(s.key("held", 8 * CHUNK, 8 * CHUNK, **hint)))
        assert out == (8, "")
        assert s.policy.decisions == {"served": 1, "refused": 0, "skip_load": 0, "no_cache": 0}
        # the same lookup without the hint is priced in full, and refused
        out = held_burst(s.adapter._core, 256, lambda: s.ask(s.key("full", 8 * CHUNK)))
        assert out == (0, "load_policy_recompute")
    finally:
        s.close()


def test_skip_load_is_honoured(tmp_path):
    s = Server(tmp_path, CONFIG)
    try:
        s.store_on_device_only(2 * CHUNK)
        assert s.ask(s.key("skip", 2 * CHUNK, **{"lmcache.skip_load": True})) == (0, "load_policy_recompute")
        assert s.policy.decisions["skip_load"] == 1
    finally:
        s.close()


@pytest.mark.parametrize("bad", [None, 0, -5, "fast", True])
def test_a_bad_or_missing_rate_names_the_key_and_the_value(bad):
    configs = {} if bad is None else {RATE_KEY: bad}
    with pytest.raises(ValueError, match=RATE_KEY.replace(".", r"\.") + ".*" + repr(bad).replace("(", r"\(")):
        create_kv_load_policy(POLICY, configs)


def test_a_bad_prior_names_the_key():
    with pytest.raises(ValueError, match=PRIOR_KEY.replace(".", r"\.") + ".*'slow'"):
        create_kv_load_policy(POLICY, {RATE_KEY: 100, PRIOR_KEY: "slow"})
