"""Part mp: LMCache's MP-mode L2 tier under the kv-tier-pressure workload, our MP adapter
against LMCache's own raw-block adapter on the Rust wheel, interleaved in one process.

``lmcache bench engine --workload kv-tier-pressure`` (LMCache 0.5.7) sends chat requests to a
serving engine (vLLM with LMCache's MP connector) and needs a GPU: neither is on a CPU-only
machine. This part is the nearest thing that runs on CPU: the workload's own request stream
(LMCache's ``warmup_sweep`` and ``sample_requests`` of that workload, so the document pool,
the documents per request and the overflow of L1 are the workload's), played against the L2
adapter the way LMCache's storage manager uses it, with the engine's compute left out:

* a document is ``context_tokens`` of KV in chunks of ``chunk_tokens`` (bfloat16, K and V of a
  small model, in LMCache's real L1 memory: ``L1Manager`` objects, its arena registered with
  the adapter as LMCache's storage manager does); chunks are keyed by document and position
  (the blending the workload assumes);
* L1 is an LRU of ``l1_chunks`` chunks; the pool holds ``overflow`` times that, so about half
  of the chunks a request needs come from L2;
* warm-up: the workload's sweep stores every document once (store tasks, one per request);
* each measured request: the chunks not in L1 are looked up and locked in L2 (one task), the
  hits loaded into L1 buffers (one task) and unlocked; a chunk L2 misses is recomputed and
  stored. The request's L2 time is from the lookup's submit to the last completion.

Both adapters are built from their ``--l2-adapter`` JSON by LMCache's parser and factory with
the same settings: ours as the ``plugin`` type, LMCache's as the built-in ``raw_block`` type
(its Python core on the Rust wheel's device). Each round uses fresh device files, after a
``sync``; the order of the adapters alternates from round to round. Requests run one at a time (the workload
keeps up to 8 in flight against the engine; here the engine's compute, which overlaps them,
is absent). GB is 10^9 bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .common import MiB, interleaved_order, median, remove_file, sparse

GB = 1e9
META_BYTES = 16 * MiB
ADAPTERS = ("ours", "lmcache")
CONFIGS = {
    "odirect_uring": {"use_odirect": True, "io_engine": "io_uring"},
    "buffered_posix": {"use_odirect": False, "io_engine": "posix"},
}
WORKLOAD_MODULE = "lmcache.cli.commands.bench.engine_bench.workloads.kv_tier_pressure"
NO_WORKLOAD = ("LMCache's kv-tier-pressure workload ({module}) is not importable here ({why}): it is in "
               "LMCache 0.5.7 and later; run this part in a 0.5.7 virtualenv")
RATIO_KEYS = ("store_bytes_per_s", "load_bytes_per_s", "request_p50_s", "request_p99_s", "measured_s")


@dataclass
class MPSettings:
    configs: list[str] = field(default_factory=lambda: list(CONFIGS))
    rounds: int = 2
    l1_chunks: int = 64
    overflow: float = 2.0  # the workload's --ktp-overflow-factor
    context_tokens: int = 1024  # the workload's --ktp-context-length
    docs_per_request: int = 4  # the workload's --ktp-docs-per-request
    requests: int = 60  # the workload's --ktp-num-requests
    chunk_tokens: int = 256
    layers: int = 4
    kv_heads: int = 4
    head_dim: int = 64
    seed: int = 0
    skip: str | None = None

    @property
    def chunk_shape(self) -> tuple:
        return (self.layers, 2, self.chunk_tokens, self.kv_heads, self.head_dim)

    @property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunk_shape) * 2  # bfloat16

    @property
    def chunks_per_doc(self) -> int:
        return -(-self.context_tokens // self.chunk_tokens)

    @property
    def pool_size(self) -> int:
        """The workload's sizing: pool = ceil(F x L1 / context), in chunks here."""
        return max(self.docs_per_request, math.ceil(self.overflow * self.l1_chunks / self.chunks_per_doc))

    def describe(self) -> dict:
        return {"configs": list(self.configs), "rounds": self.rounds, "l1_chunks": self.l1_chunks,
                "overflow": self.overflow, "context_tokens": self.context_tokens,
                "docs_per_request": self.docs_per_request, "requests": self.requests,
                "chunk_tokens": self.chunk_tokens, "chunk_bytes": self.chunk_bytes, "pool_size": self.pool_size,
                "chunk_shape": list(self.chunk_shape), "seed": self.seed, "skip": self.skip}


SUITES = {
    "smoke": MPSettings(configs=["buffered_posix"], rounds=1, l1_chunks=16, requests=8, layers=1, kv_heads=2,
                        head_dim=32),
    "quick": MPSettings(rounds=4, requests=120),
    "full": MPSettings(rounds=4, l1_chunks=128, requests=200, docs_per_request=8, context_tokens=2560,
                       layers=8, kv_heads=8),
}


def steps(s: MPSettings) -> int:
    return 0 if s.skip else len(s.configs) * s.rounds * len(ADAPTERS)


# --------------------------------------------------------------------------- LMCache's pieces


def workload() -> tuple[Any, str | None]:
    """LMCache's kv-tier-pressure workload module, or None and why."""
    import importlib

    try:
        return importlib.import_module(WORKLOAD_MODULE), None
    except Exception as e:  # noqa: BLE001 - LMCache missing, or a version without the workload
        return None, NO_WORKLOAD.format(module=WORKLOAD_MODULE, why=f"{type(e).__name__}: {e}")


def adapter_json(name: str, device: str, slot_bytes: int, config: str) -> str:
    params = {"device_path": device, "slot_bytes": slot_bytes, "meta_total_bytes": META_BYTES,
              "meta_checkpoint_interval_sec": 60, **CONFIGS[config]}
    if name == "ours":
        return json.dumps({"type": "plugin", "module_path": "lmcache_rawblock.l2_adapter",
                           "class_name": "RawBlockL2Adapter", "adapter_params": params})
    return json.dumps(dict(params, type="raw_block"))


def build_adapter(spec: str, desc: Any) -> Any:
    """An adapter as LMCache's storage manager builds one: parsed, created, named."""
    from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry

    parser = add_l2_adapters_args(argparse.ArgumentParser())
    cfgs = parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", spec]))
    cfg = list(cfgs.adapters if hasattr(cfgs, "adapters") else cfgs)[0]
    adapter = create_l2_adapter_from_registry(cfg, desc)
    adapter.set_backend_identity(json.loads(spec)["type"], shared=cfg.shared)
    return adapter


def device_module(adapter: Any) -> str:
    """Whose core and device the adapter stores through: ``lmcache_rawblock`` (our C core owns
    its device), or LMCache's core with the module of the device it opened (the Rust wheel's)."""
    core = adapter._core
    module = type(core).__module__
    if module.startswith("lmcache_rawblock"):
        return "lmcache_rawblock"
    raw = getattr(core, "_rawdev", None)
    dev = raw() if callable(raw) else None
    import sys

    rust = sys.modules.get("lmcache_rust_raw_block_io")
    is_rust = rust is not None and type(dev) is getattr(rust, "RawBlockDevice", None)
    on = "the Rust wheel" if is_rust else type(dev).__name__
    return f"{module} on {on}"


class L1:
    """LMCache's L1 memory (an ``L1Manager``) as the buffers of an LRU of chunks: ``capacity``
    buffers, the least recently used chunk's buffer reused when none is free."""

    def __init__(self, s: MPSettings, capacity: int) -> None:
        import torch
        from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
        from lmcache.v1.distributed.config import L1ManagerConfig, L1MemoryManagerConfig
        from lmcache.v1.distributed.l1_manager import L1Manager

        self.manager = L1Manager(L1ManagerConfig(memory_config=L1MemoryManagerConfig(
            size_in_bytes=(capacity + 4) * s.chunk_bytes, use_lazy=False, shm_name="")))
        layout = MemoryLayoutDesc(shapes=[torch.Size(s.chunk_shape)], dtypes=[torch.bfloat16])
        self.keys = [ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="l1-buffer", kv_rank=0)
                     for i in range(capacity)]
        res = self.manager.reserve_write(keys=self.keys, is_temporary=[False] * capacity, layout_desc=layout,
                                         tag="bench")
        self.free = [res[k][1] for k in self.keys]
        if any(o is None for o in self.free):
            raise RuntimeError(f"L1Manager could not give {capacity} buffers of {s.chunk_bytes} bytes")
        self.lru: OrderedDict[int, Any] = OrderedDict()

    def get(self, chunk: int) -> Any:
        obj = self.lru.get(chunk)
        if obj is not None:
            self.lru.move_to_end(chunk)
        return obj

    def take(self) -> Any:
        if self.free:
            return self.free.pop()
        _, obj = self.lru.popitem(last=False)
        return obj

    def put(self, chunk: int, obj: Any) -> None:
        self.lru[chunk] = obj

    def reset(self) -> None:
        self.free.extend(self.lru.values())
        self.lru.clear()

    def close(self) -> None:
        self.manager.finish_write_and_delete(self.keys, tag="bench")
        self.manager.close()


# --------------------------------------------------------------------------- one run


def _wait(fd: int) -> None:
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    if not poll.poll(120_000):
        raise TimeoutError("the adapter signalled no completion in 120 s")
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


def _result(adapter: Any, kind: str, task: int) -> Any:
    fd = {"store": adapter.get_store_event_fd, "lookup": adapter.get_lookup_and_lock_event_fd,
          "load": adapter.get_load_event_fd}[kind]()
    while True:
        if kind == "store":
            done = adapter.pop_completed_store_tasks()
            if task in done:
                return done[task]
        else:
            r = (adapter.query_lookup_and_lock_result if kind == "lookup" else adapter.query_load_result)(task)
            if r is not None:
                return r
        _wait(fd)


def _key(chunk: int) -> Any:
    from lmcache.v1.distributed.api import ObjectKey

    return ObjectKey(chunk_hash=chunk.to_bytes(8, "big"), model_name="bench/kv-tier-pressure", kv_rank=0)


def _fill(obj: Any, chunk: int) -> None:
    """The chunk's content: its number in every 32-bit word (checked at a load)."""
    obj.tensor.view(-1).view(__import__("torch").int32).fill_(chunk)


def _holds(obj: Any, chunk: int) -> bool:
    words = obj.tensor.view(-1).view(__import__("torch").int32)
    return bool((words[:1024] == chunk).all()) and int(words[-1]) == chunk


def _store(adapter: Any, l1: L1, chunks: list[int]) -> int:
    objs = []
    for c in chunks:
        obj = l1.take()
        _fill(obj, c)
        objs.append(obj)
    ok = _result(adapter, "store", adapter.submit_store_task([_key(c) for c in chunks], objs)).is_successful()
    for c, obj in zip(chunks, objs):
        l1.put(c, obj)
    if not ok:
        raise RuntimeError(f"a store task of {len(chunks)} chunks failed")
    return len(chunks)


def _request(adapter: Any, l1: L1, chunks: list[int], tally: dict) -> float:
    """One measured request: its L2 time (s)."""
    from lmcache.v1.distributed.api import MemoryLayoutDesc

    missing = [c for c in chunks if l1.get(c) is None]
    tally["l1_hits"] += len(chunks) - len(missing)
    if not missing:
        return 0.0
    t0 = time.perf_counter()
    keys = [_key(c) for c in missing]
    found = _result(adapter, "lookup", adapter.submit_lookup_and_lock_task(
        keys, {0: MemoryLayoutDesc(shapes=[], dtypes=[])})).get_indices_list()
    hits = [missing[i] for i in found]
    loaded: list[int] = []
    if hits:
        bufs = [l1.take() for _ in hits]
        got = _result(adapter, "load", adapter.submit_load_task([_key(c) for c in hits], bufs)).get_indices_list()
        adapter.submit_unlock([_key(c) for c in hits])
        for i in got:
            if not _holds(bufs[i], hits[i]):
                tally["bad_bytes"] += 1
            l1.put(hits[i], bufs[i])
        loaded = [hits[i] for i in got]
        l1.free.extend(bufs[i] for i in range(len(hits)) if i not in set(got))
    recompute = [c for c in missing if c not in set(loaded)]
    if recompute:
        _store(adapter, l1, recompute)
    elapsed = time.perf_counter() - t0
    tally["l2_loads"] += len(loaded)
    tally["l2_misses"] += len(recompute)
    tally["load_s"] += elapsed
    return elapsed


def run_once(name: str, config: str, s: MPSettings, wl: Any, l1: L1, path: str) -> dict:
    import torch
    from lmcache.v1.distributed.api import MemoryLayoutDesc

    from lmcache_rawblock.l2_adapter import slot_bytes_for

    slot = slot_bytes_for(MemoryLayoutDesc(shapes=[torch.Size(s.chunk_shape)], dtypes=[torch.bfloat16]))
    total_chunks = s.pool_size * s.chunks_per_doc
    sparse(path, META_BYTES + (total_chunks + 16) * slot)
    l1.reset()
    os.sync()  # the dirty pages of earlier runs (and of the machine) written back before this one
    adapter = build_adapter(adapter_json(name, path, slot, config), l1.manager.get_l1_memory_desc())
    try:
        device = device_module(adapter)

        def chunks_of(docs: tuple) -> list[int]:
            return [d * s.chunks_per_doc + j for d in docs for j in range(s.chunks_per_doc)]

        t0 = time.perf_counter()
        stored = sum(_store(adapter, l1, chunks_of(g)) for g in wl.warmup_sweep(s.pool_size, s.docs_per_request))
        store_s = time.perf_counter() - t0
        tally = {"l1_hits": 0, "l2_loads": 0, "l2_misses": 0, "bad_bytes": 0, "load_s": 0.0}
        stream = wl.sample_requests(s.pool_size, s.docs_per_request, s.requests, 0.0, s.seed)
        t1 = time.perf_counter()
        latencies = [_request(adapter, l1, chunks_of(g), tally) for g in stream]
        measured_s = time.perf_counter() - t1
    finally:
        adapter.close()
        remove_file(path)
    return {"store_s": store_s, "stored_chunks": stored, "measured_s": measured_s, "latencies": latencies,
            "device": device, **tally}


# --------------------------------------------------------------------------- the part


def _percentile(values: list[float], q: float) -> float | None:
    vals = sorted(values)
    if not vals:
        return None
    return vals[min(len(vals) - 1, max(0, math.ceil(q / 100 * len(vals)) - 1))]


def summarize(config: str, name: str, runs: list[dict], s: MPSettings) -> dict:
    lat = [x for r in runs for x in r["latencies"] if x > 0]
    needed = s.requests * s.docs_per_request * s.chunks_per_doc
    return {
        "config": config, "adapter": name, "device": runs[0]["device"], "rounds": len(runs),
        "store_bytes_per_s": median([r["stored_chunks"] * s.chunk_bytes / r["store_s"] for r in runs]),
        "load_bytes_per_s": median([r["l2_loads"] * s.chunk_bytes / r["load_s"] for r in runs if r["load_s"] > 0]),
        "request_p50_s": _percentile(lat, 50), "request_p99_s": _percentile(lat, 99),
        "measured_s": median([r["measured_s"] for r in runs]),
        "l2_share": median([r["l2_loads"] / needed for r in runs]),
        "l2_misses": sum(r["l2_misses"] for r in runs), "bytes_match": all(r["bad_bytes"] == 0 for r in runs),
        "samples": {"store_s": [r["store_s"] for r in runs], "load_s": [r["load_s"] for r in runs],
                    "measured_s": [r["measured_s"] for r in runs]},
    }


def ratios(rows: list[dict]) -> list[dict]:
    """ours / LMCache's adapter per configuration."""
    by = {(r["config"], r["adapter"]): r for r in rows}
    out = []
    for config in dict.fromkeys(r["config"] for r in rows):
        ours, theirs = by.get((config, "ours")), by.get((config, "lmcache"))
        if ours is None or theirs is None:
            continue
        out.append({"config": config, **{k: (ours[k] / theirs[k] if ours.get(k) is not None and theirs.get(k)
                                             else None) for k in RATIO_KEYS}})
    return out


def run_mp(s: MPSettings, workdir: str, bar: Any) -> dict:
    out: dict[str, Any] = {"settings": s.describe(), "rows": [], "ratios": [], "errors": {}, "skipped": None}
    if s.skip:
        out["skipped"] = s.skip
        return out
    wl, why = workload()
    if wl is None:
        out["skipped"] = why
        bar.update(steps(s))
        return out
    l1 = L1(s, s.l1_chunks)
    try:
        for config in s.configs:
            runs: dict[str, list[dict]] = {n: [] for n in ADAPTERS}
            for rnd in range(s.rounds):
                for name in interleaved_order(rnd, ADAPTERS):
                    bar.set_description_str(f"mp {config} {name}")
                    try:
                        runs[name].append(run_once(name, config, s, wl, l1, os.path.join(workdir, f"mp-{name}.img")))
                    except Exception as exc:  # noqa: BLE001 - one failing adapter must not lose the other
                        out["errors"][f"{config} {name}"] = f"{type(exc).__name__}: {exc}"
                    bar.update(1)
            out["rows"] += [summarize(config, n, r, s) for n, r in runs.items() if r]
    finally:
        l1.close()
    out["ratios"] = ratios(out["rows"])
    return out
