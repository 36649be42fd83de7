"""Run LMCache's MP adapter with FDP on our core against an NVMe namespace and report which
reclaim unit handles its store tasks wrote to. Executed by test_fdp_strategies.py in an
interpreter that has LMCache (the LMCache virtualenv when the test's own has not).

    python fdp_mp_probe.py DEVICE RU_BLOCKS

prints one JSON object: for each scenario, the policy LMCache's adapter reports and the blocks
each placement identifier's handle took ({pid: blocks}).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import warnings

warnings.simplefilter("ignore")

try:
    import torch
    from lmcache.v1.distributed.api import ObjectKey
    from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
except ImportError as e:  # exit 77: the caller skips, naming the reason
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for helpers
from helpers import ruamw  # noqa: E402

SLOT = 4096 + 16384


CHECKPOINT_PID = 1


def drops(before: dict[int, int], after: dict[int, int], ru_blocks: int) -> dict[int, int]:
    """Blocks each KV handle took (not the checkpoint's: the core may checkpoint before reusing a
    slot an older checkpoint lists), modulo the reclaim unit (a full unit is replaced)."""
    return {p: (before[p] - after[p]) % ru_blocks for p in before
            if before[p] != after[p] and p != CHECKPOINT_PID}


def adapter(dev: str, **params):
    p = {"device_path": dev, "slot_bytes": SLOT, "meta_total_bytes": 4 << 20, "capacity_bytes": 128 << 20,
         "meta_enable_periodic": False, "load_checkpoint_on_init": False, "allow_foreign_device": True,
         "use_odirect": False, "io_engine": "io_uring", "use_uring_cmd": True, "fdp_enabled": True,
         "meta_checkpoint_placement_id": CHECKPOINT_PID}
    p.update(params)
    spec = json.dumps({"type": "plugin", "module_path": "lmcache_rawblock.l2_adapter",
                       "class_name": "RawBlockL2Adapter", "adapter_params": p})
    cfgs = parse_args_to_l2_adapters_config(add_l2_adapters_args(argparse.ArgumentParser()).parse_args(
        ["--l2-adapter", spec]))
    return create_l2_adapter_from_registry(list(cfgs.adapters if hasattr(cfgs, "adapters") else cfgs)[0])


def key(h: int, rank: int = 0, world: int = 1, salt: str = "") -> ObjectKey:
    kv_rank = ObjectKey.ComputeKVRank(world_size=world, global_rank=rank, local_world_size=world, local_rank=rank)
    return ObjectKey(chunk_hash=h.to_bytes(8, "big"), model_name="org/fdp-probe", kv_rank=kv_rank, cache_salt=salt)


def obj(seed: int) -> TensorMemoryObj:
    raw = torch.full((1024,), float(seed), dtype=torch.float32)  # 4 KiB: one block after the header block
    meta = MemoryObjMetadata(shape=torch.Size([1024]), dtype=torch.float32, address=0, phy_size=4096,
                             fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(raw, meta, parent_allocator=None)


def store(a, keys) -> None:
    tid = a.submit_store_task(keys, [obj(i) for i in range(len(keys))])
    poll = select.poll()
    poll.register(a.get_store_event_fd(), select.POLLIN)
    if not poll.poll(30000):
        raise SystemExit("the adapter never signalled its store event fd")
    try:
        os.eventfd_read(a.get_store_event_fd())
    except BlockingIOError:
        pass
    if not a.pop_completed_store_tasks()[tid].is_successful():
        raise SystemExit("store task failed")


SCENARIOS = {
    # LMCache's own default policy: one handle per cache-salt bucket, first seen first
    "cache_salt_prefix": (dict(fdp_placement_ids=[13, 14, 15]),
                          [key(0x11, salt="alice:1"), key(0x12, salt="bob:1"), key(0x13, salt="alice:2")]),
    "tp_worker": (dict(fdp_placement_ids=[13, 14], fdp_data_placement_policy="tp_worker"),
                  [key(0x21 + i, rank=r, world=2) for i, r in enumerate((0, 1, 0, 1, 1))]),
    "prompt": (dict(fdp_placement_ids=[13, 14, 15], fdp_data_placement_policy="prompt"),
               [key(0x31), key(0x32), key(0x33)]),  # 0x31 % 3 == 1 -> 14
    "phase": (dict(fdp_placement_ids=[13, 14], fdp_data_placement_policy="phase"), [key(0x41), key(0x42)]),
}


def main() -> int:
    dev, ru_blocks = sys.argv[1], int(sys.argv[2])
    out = {}
    for name, (params, keys) in SCENARIOS.items():
        a = adapter(dev, **params)
        try:
            before = ruamw(dev)
            store(a, keys)
            moved = drops(before, ruamw(dev), ru_blocks)
            st = a.report_status()
            out[name] = {"policy": st["fdp_data_placement_policy"], "ids": st["fdp_placement_ids"],
                         "core": type(a._core).__module__, "moved": {str(p): n for p, n in moved.items()}}
        finally:
            a.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
