"""Part mpevict: MP mode's L2 eviction over extents, LMCache's LRU controller against the
adapter's whole-extent eviction, on our adapter with ``extent_bytes`` on.

Over the extent allocator, key-level eviction leaves every extent partly live and stores refill
the holes of the emptiest one, so a drive still copies the live slots when it reclaims the
unit; whole-extent eviction frees and deallocates extents whole. This part plays one request
stream against our adapter once per arm, on fresh device files, in one process:

* ``lmcache-lru``: LMCache's own ``L2EvictionController`` with its ``LRU`` policy at its
  defaults (``trigger_watermark`` 0.8, ``eviction_ratio`` 0.2), checked after every request
  (its loop checks once a second: requests a second apart), the adapter's ``eviction_policy``
  ``none``;
* ``lmcache-lru-0.95``: the same at ``trigger_watermark`` 0.95 and ``eviction_ratio`` 0.05,
  about the capacity the extent arm's reserve leaves (key-level LRU at the same capacity);
* ``extent``: the same controller with LMCache's ``noop`` policy, the adapter's
  ``eviction_policy: extent`` (default reserve, reinsertion on), its background pass finished
  after every request;
* ``extent_prefix``: as ``extent`` with the adapter's ``eviction_policy: extent_prefix`` (of the
  four extents filled longest ago, the one losing the fewest chunks a lookup reaches goes; the
  chains learned from the lookups, each document's chunks one chain).

The stream: ``docs`` documents of ``chunks_per_doc`` chunks, each request ``docs_per_request``
documents drawn by a Zipf law (exponent ``zipf``) from a fixed seed; per document, the chunks
are looked up in prompt order, the prefix L2 holds is loaded (every byte checked), and the
chunks after it are stored (recomputed). The device holds ``capacity`` of the working set.

Reported per arm: hit ratio (chunks served by L2 over chunks asked), stores refused, whole
extents deallocated and bytes deallocated, extents opened with no clean extent left (puts then
fill a partly live extent's holes: what a drive copies at reclaim), keys LMCache's controller
deleted, keys the extent evictor deleted and put back, and under ``extent_prefix`` the victims
that were not the extent filled longest ago. Needs LMCache (0.5.6 or 0.5.7) and torch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from .common import MiB, remove_file, sparse
from .mp import _result

# arm: (LMCache's policy, trigger_watermark, eviction_ratio, the adapter's eviction_policy)
ARMS = {"lmcache-lru": ("LRU", 0.8, 0.2, "none"), "lmcache-lru-0.95": ("LRU", 0.95, 0.05, "none"),
        "extent": ("noop", 0.8, 0.2, "extent"), "extent_prefix": ("noop", 0.8, 0.2, "extent_prefix")}
META_BYTES = 4 * MiB


@dataclass
class MPEvictSettings:
    docs: int = 160
    chunks_per_doc: int = 8
    docs_per_request: int = 2
    requests: int = 600
    capacity: float = 0.5  # of the working set (docs x chunks_per_doc chunks)
    extent_slots: int = 16
    chunk_floats: int = 4096  # 16 KiB objects: the slot is 4 KiB + this
    zipf: float = 0.9
    seed: int = 0
    skip: str | None = None

    def describe(self) -> dict:
        return dict(self.__dict__)


SUITES = {
    "smoke": MPEvictSettings(docs=80, docs_per_request=1, requests=160),
    "quick": MPEvictSettings(),
    "full": MPEvictSettings(docs=400, requests=2000),
}


def steps(s: MPEvictSettings) -> int:
    return 0 if s.skip else len(ARMS)


def _lmcache() -> tuple[Any, str | None]:
    try:
        import torch  # noqa: F401
        from lmcache.v1.distributed.config import EvictionConfig  # noqa: F401

        return True, None
    except Exception as e:  # noqa: BLE001 - no LMCache or no torch here
        return None, f"LMCache's MP mode and torch are not importable here ({type(e).__name__}: {e})"


def _adapter(path: str, slot: int, s: MPEvictSettings, arm: str) -> Any:
    from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry

    params = {"device_path": path, "slot_bytes": slot, "meta_total_bytes": META_BYTES, "use_odirect": False,
              "io_engine": "posix", "meta_checkpoint_interval_sec": 60, "extent_bytes": s.extent_slots * slot,
              "deallocate_freed": "on", "eviction_policy": ARMS[arm][3]}
    spec = json.dumps({"type": "plugin", "module_path": "lmcache_rawblock.l2_adapter",
                       "class_name": "RawBlockL2Adapter", "adapter_params": params})
    parser = add_l2_adapters_args(argparse.ArgumentParser())
    cfgs = parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", spec]))
    return create_l2_adapter_from_registry(list(cfgs.adapters if hasattr(cfgs, "adapters") else cfgs)[0])


def _obj(s: MPEvictSettings, chunk: int) -> Any:
    import torch
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    raw = torch.full((s.chunk_floats,), chunk, dtype=torch.int32).view(torch.float32)
    meta = MemoryObjMetadata(shape=torch.Size([s.chunk_floats]), dtype=torch.float32, address=0,
                             phy_size=s.chunk_floats * 4, fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(raw, meta, parent_allocator=None)


def _key(chunk: int) -> Any:
    from lmcache.v1.distributed.api import ObjectKey

    return ObjectKey(chunk_hash=chunk.to_bytes(8, "big"), model_name="bench/mpevict", kv_rank=0)


def _stream(s: MPEvictSettings) -> list[list[int]]:
    """Each request's documents: Zipf-popular documents from a fixed seed."""
    rng = random.Random(s.seed)
    weights = [1.0 / (d + 1) ** s.zipf for d in range(s.docs)]
    order = list(range(s.docs))
    rng.shuffle(order)  # popularity not tied to document number (nor to its chunks' slots)
    return [[order[i] for i in rng.choices(range(s.docs), weights, k=s.docs_per_request)] for _ in range(s.requests)]


def _document(adapter: Any, s: MPEvictSettings, doc: int, tally: dict) -> None:
    """One document of a request: the held prefix looked up, loaded and checked, the rest stored."""
    from lmcache.v1.distributed.api import MemoryLayoutDesc

    chunks = [doc * s.chunks_per_doc + j for j in range(s.chunks_per_doc)]
    keys = [_key(c) for c in chunks]
    found = _result(adapter, "lookup", adapter.submit_lookup_and_lock_task(
        keys, {0: MemoryLayoutDesc(shapes=[], dtypes=[])})).get_indices_list()
    prefix = 0
    while prefix < len(chunks) and prefix in found:
        prefix += 1
    if prefix:
        outs = [_obj(s, -1) for _ in range(prefix)]
        loaded = _result(adapter, "load", adapter.submit_load_task(keys[:prefix], outs)).get_indices_list()
        good = [i for i in loaded if int(outs[i].tensor.view(-1).view(__import__("torch").int32)[0]) == chunks[i]]
        tally["bad_bytes"] += len(loaded) - len(good)
        prefix = min([i for i in range(prefix) if i not in good], default=prefix)
    adapter.submit_unlock([keys[i] for i in found])
    tally["asked"] += len(chunks)
    tally["served"] += prefix
    rest = list(range(prefix, len(chunks)))
    if rest:
        ok = _result(adapter, "store", adapter.submit_store_task([keys[i] for i in rest],
                                                                 [_obj(s, chunks[i]) for i in rest]))
        tally["stores_refused"] += 0 if ok.is_successful() else 1


def run_arm(s: MPEvictSettings, arm: str, path: str) -> dict:
    import torch
    from lmcache.v1.distributed.api import MemoryLayoutDesc
    from lmcache.v1.distributed.config import EvictionConfig
    from lmcache.v1.distributed.storage_controllers.eviction_controller import (
        L2AdapterEvictionState,
        L2EvictionController,
    )

    from lmcache_rawblock.l2_adapter import slot_bytes_for

    slot = slot_bytes_for(MemoryLayoutDesc(shapes=[torch.Size([s.chunk_floats])], dtypes=[torch.float32]))
    slots = int(s.capacity * s.docs * s.chunks_per_doc)
    sparse(path, META_BYTES + (slots + 2 * s.extent_slots) * slot)
    adapter = _adapter(path, slot, s, arm)
    deleted_by_lmcache = 0
    real_delete = adapter.delete

    def counting_delete(keys: list) -> None:
        nonlocal deleted_by_lmcache
        deleted_by_lmcache += len(keys)
        real_delete(keys)

    adapter.delete = counting_delete
    policy, watermark, ratio, _ = ARMS[arm]
    state = L2AdapterEvictionState(0, adapter, EvictionConfig(policy, trigger_watermark=watermark,
                                                              eviction_ratio=ratio))
    controller = L2EvictionController([state])
    tally = {"asked": 0, "served": 0, "bad_bytes": 0, "stores_refused": 0}
    try:
        for request in _stream(s):
            for doc in request:
                _document(adapter, s, doc, tally)
            controller._check_and_evict(state)  # its once-a-second check, after each request
            adapter.wait_idle(120)
        st = adapter.report_status()
        ext = adapter._core.extent_counts()
        core = st["core"]
    finally:
        adapter.close()
        remove_file(path)
    return {"arm": arm, "extents": ext["extents_total"], "extent_slots": ext["extent_slots"], **tally,
            "hit_ratio": tally["served"] / max(1, tally["asked"]),
            "extents_deallocated": ext["extent_deallocs"], "extents_opened": ext["extents_opened"],
            "opened_without_clean": ext["extent_fallbacks"], "dealloc_bytes": core.get("dealloc_bytes", 0),
            "deleted_by_lmcache": deleted_by_lmcache, "deleted_by_extent": st.get("evicted_extent_entries", 0),
            "reinserted": st.get("reinserted_extent_entries", 0),
            "victims_not_oldest": st.get("extent_victims_not_oldest", 0)}


def run_mpevict(s: MPEvictSettings, bar: Any, arms: list[str] | None = None) -> dict:
    """The arms (default: every one of ARMS) played in turn."""
    out: dict[str, Any] = {"settings": s.describe(), "rows": [], "errors": {}, "skipped": s.skip}
    if s.skip:
        return out
    ok, why = _lmcache()
    if not ok:
        out["skipped"] = why
        bar.update(steps(s))
        return out
    workdir = tempfile.mkdtemp(prefix="rb-mpevict-")  # sparse files under the temporary directory
    try:
        for arm in arms or ARMS:
            bar.set_description_str(f"mpevict {arm}")
            try:
                out["rows"].append(run_arm(s, arm, os.path.join(workdir, f"mpevict-{arm}.img")))
            except Exception as exc:  # noqa: BLE001 - one failing arm must not lose the other
                out["errors"][arm] = f"{type(exc).__name__}: {exc}"
            bar.update(1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = {r["arm"]: r for r in out["rows"]}
    if "extent" in rows:
        out["hit_ratio_delta"] = {arm: rows["extent"]["hit_ratio"] - r["hit_ratio"] for arm, r in rows.items()
                                  if arm not in ("extent", "extent_prefix")}
    if "extent_prefix" in rows:
        out["prefix_hit_ratio_delta"] = {arm: rows["extent_prefix"]["hit_ratio"] - r["hit_ratio"]
                                         for arm, r in rows.items() if arm != "extent_prefix"}
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m lmcache_rawblock_bench.mpevict [--suite S] [--capacity C ...] [--arms A ...]
    [--out F]``: the part at other capacities of the working set (the bench runs it at the
    suite's), chosen arms only, printed and written as JSON."""
    from . import report

    ap = argparse.ArgumentParser(prog="lmcache_rawblock_bench.mpevict")
    ap.add_argument("--suite", choices=sorted(SUITES), default="quick")
    ap.add_argument("--capacity", type=float, nargs="+", help="of the working set (default: the suite's)")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), help="default: every arm")
    ap.add_argument("--out", help="write the results here as JSON, one entry per capacity")
    a = ap.parse_args(argv)
    if any(not 0 < c <= 4 for c in a.capacity or ()):
        ap.error(f"--capacity takes fractions in (0, 4], got {a.capacity}")
    from .common import _NullBar

    out: dict[str, Any] = {}
    for cap in a.capacity or [SUITES[a.suite].capacity]:
        s = MPEvictSettings(**{**SUITES[a.suite].describe(), "capacity": cap})
        out[f"{cap:g}"] = got = run_mpevict(s, _NullBar(), a.arms)
        report.print_mpevict({"mpevict": got}, print)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
