"""Plugin part: LMCache's storage plugin API on our ``RustRawBlockBackend`` and, when LMCache and
the Rust wheel import, on LMCache's own backend (``lmcache.v1.storage_backend.plugins.
rust_raw_block_backend``). Each backend is built on a sparse file of its own (4 KiB chunks,
``slot_bytes`` 8192, posix engine), everything in this one process.

* ``batched_remove``: one ``batched_remove(keys)`` on a backend holding exactly those N keys
  (N = 10 ... 10000), the base class's per-key fan-out (``remove(k, force)`` per key: one
  pin-lock section and one ``delete_many([k])`` per key) against the backend's own override
  (one lock section, one ``delete_many`` of all keys). Each cycle re-populates the N keys
  (untimed) after a ``gc.collect()``; cycles alternate methods and backends; medians.
* breakdown: where one override call of 1,000 keys spends its time (key encoding, the core's
  delete of pre-encoded keys, the fused encode-and-delete call).
* contention: contender threads loop ``contains(k)``, ``pin(k)``, ``unpin(k)`` on resident keys
  while one thread evicts other keys in batches with the fan-out or the override: eviction
  throughput and the contenders' ops/s during it, and their ops/s with nobody evicting.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from lmcache_rawblock import lmcache_paths

from .common import MiB, interleaved_order, median, remove_file, sparse, spread
from .core import _quiet, make_obj

LMC_PLUGIN_MODULE = "lmcache.v1.storage_backend.plugins.rust_raw_block_backend"
BREAKDOWN_N = 1000
RESIDENT = 256


@dataclass
class PluginSettings:
    remove_sizes: list[int]
    remove_cycles: int
    remove_cycles_large: int  # N > 1000
    breakdown_cycles: int = 0  # 0: no breakdown
    contention_runs: int = 0  # 0: no contention runs
    victims: int = 20000
    evict_batch: int = 100
    contenders: int = 4

    def describe(self) -> dict:
        return {"remove_sizes": list(self.remove_sizes), "remove_cycles": self.remove_cycles,
                "remove_cycles_large": self.remove_cycles_large, "breakdown_cycles": self.breakdown_cycles,
                "contention_runs": self.contention_runs, "victims": self.victims, "evict_batch": self.evict_batch,
                "contenders": self.contenders}


SUITES = {
    "smoke": PluginSettings(remove_sizes=[10], remove_cycles=1, remove_cycles_large=1),
    "quick": PluginSettings(remove_sizes=[10, 100, 1000], remove_cycles=7, remove_cycles_large=5,
                            breakdown_cycles=5, contention_runs=1, victims=20000),
    "full": PluginSettings(remove_sizes=[10, 100, 1000, 10000], remove_cycles=15, remove_cycles_large=7,
                           breakdown_cycles=15, contention_runs=5, victims=20000),
}


def steps(s: PluginSettings) -> int:
    return len(s.remove_sizes) + (1 if s.breakdown_cycles else 0) + s.contention_runs


# --------------------------------------------------------------------------- batched_remove


class _Config:
    def __init__(self, extra: dict):
        self.extra_config = extra


class _Metadata:
    world_size = 1
    worker_id = 0


class _LocalCPU:
    """The two LocalCPUBackend methods a raw-block backend calls at construction."""

    def __init__(self, chunk_bytes: int):
        self.chunk_bytes = chunk_bytes

    def get_full_chunk_size_bytes(self) -> int:
        return self.chunk_bytes

    def get_memory_allocator(self) -> Any:
        return None


def _extra(path: str) -> dict:
    return {
        "rust_raw_block.device_path": path,
        "rust_raw_block.slot_bytes": 8192,
        "rust_raw_block.header_bytes": 4096,
        "rust_raw_block.block_align": 4096,
        "rust_raw_block.meta_total_bytes": 16 * MiB,
        "rust_raw_block.meta_enable_periodic": False,
        "rust_raw_block.load_checkpoint_on_init": False,
    }


class RemoveBackend:
    """A storage backend under test, the two ways of removing a batch of keys, and how its
    keys are encoded."""

    def __init__(self, name: str, cls: Any, base: Any, encode: Any, path: str, loop: Any, real_objs: bool):
        self.name = name
        self.path = path
        self.be = cls(config=_Config(_extra(path)), metadata=_Metadata(), local_cpu_backend=_LocalCPU(4096),
                      loop=loop, dst_device="cpu")
        self._fanout = base.batched_remove  # the base class's per-key loop over remove()
        self._encode = encode
        self.obj = make_obj(4096, 0x5A, real_objs)

    def populate(self, keys: Sequence[Any], step: int = 512) -> None:
        core = self.be._core
        for i in range(0, len(keys), step):
            part = keys[i:i + step]
            res = core.put_many([self._encode(k) for k in part], [self.obj] * len(part))
            if not all(res.results):
                raise RuntimeError(f"{self.name}: populate failed (device full?)")

    def remove(self, method: str, keys: Sequence[Any]) -> int:
        if method == "fan-out":
            return self._fanout(self.be, keys, True)
        return self.be.batched_remove(keys, True)

    def close(self) -> None:
        try:
            self.be.close()
        except Exception:  # noqa: BLE001
            pass


def _cache_keys(n: int, base: int) -> list:
    from lmcache_rawblock.raw_block._lmcache import CacheEngineKey, torch

    dtype = torch.bfloat16 if torch is not None else "bfloat16"
    return [CacheEngineKey("bench", 1, 0, base + i, dtype) for i in range(n)]


def remove_backends(have_lmcache: bool, workdir: str, size: int, loop: Any) -> tuple[list[RemoveBackend], dict]:
    """Our backend, and LMCache's when asked for and importable (else an error entry)."""
    from lmcache_rawblock import plugin
    from lmcache_rawblock._plugin_base import StoragePluginInterface
    from lmcache_rawblock.raw_block import encode_legacy_key

    errors: dict[str, str] = {}
    out = []
    specs = [("ours", lambda: (plugin.RustRawBlockBackend, StoragePluginInterface, encode_legacy_key))]
    if have_lmcache:
        def lmc() -> tuple:
            rust = importlib.import_module("lmcache_rust_raw_block_io")
            if getattr(rust, "__lmcache_rawblock__", False):
                raise ImportError("lmcache_rust_raw_block_io is our compat shim, not the Rust wheel")
            mod = importlib.import_module(LMC_PLUGIN_MODULE)
            base = importlib.import_module("lmcache.v1.storage_backend.abstract_backend").StoragePluginInterface
            enc = lmcache_paths.import_raw_block().encode_legacy_key
            return mod.RustRawBlockBackend, base, enc

        specs.append(("lmcache", lmc))
    for name, get in specs:
        path = sparse(os.path.join(workdir, f"plugin-{name}.img"), size)
        try:
            cls, base, enc = get()
            out.append(RemoveBackend(name, cls, base, enc, path, loop, have_lmcache))
        except Exception as exc:  # noqa: BLE001
            errors[name] = f"{type(exc).__name__}: {exc}"
    return out, errors


def _timed(fn: Any, collect: bool = False) -> float:
    """Wall time of fn() with the garbage collector off (after a full collection if asked)."""
    if collect:
        gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        gc.enable()


def run_remove(backends: list[RemoveBackend], sizes: Sequence[int], cycles: int, cycles_large: int,
               bar: Any) -> list[dict]:
    rows = []
    for n in sizes:
        bar.set_description_str(f"plugin batched_remove N={n}")
        keys = _cache_keys(n, 1 << 40)
        reps = cycles if n <= 1000 else cycles_large
        times: dict[tuple[str, str], list[float]] = {}
        for rep in range(reps):
            for b in interleaved_order(rep, backends):
                for method in interleaved_order(rep, ["fan-out", "override"]):
                    b.populate(keys)
                    removed = []
                    dt = _timed(lambda: removed.append(b.remove(method, keys)), collect=True)
                    if removed != [n] or b.be._core.indexed_key_count() != 0:
                        raise RuntimeError(f"{b.name} {method} N={n}: removed {removed} of {n}")
                    times.setdefault((b.name, method), []).append(dt)
        for b in backends:
            f, o = median(times[(b.name, "fan-out")]), median(times[(b.name, "override")])
            rows.append({"backend": b.name, "n": n, "cycles": reps, "fanout_s": f, "override_s": o,
                         "speedup": f / o if o else None,
                         "fanout_spread": spread(times[(b.name, "fan-out")]),
                         "override_spread": spread(times[(b.name, "override")]),
                         "samples_s": {"fan-out": times[(b.name, "fan-out")],
                                       "override": times[(b.name, "override")]}})
        bar.update(1)
    return rows


# --------------------------------------------------------------------------- breakdown


def run_breakdown(backends: list[RemoveBackend], cycles: int) -> list[dict]:
    """Where one override call of BREAKDOWN_N keys spends its time, step by step."""
    keys = _cache_keys(BREAKDOWN_N, 1 << 43)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(cycles):
        for b in backends:
            core = b.be._core
            times.setdefault((b.name, "key.to_string() per key"), []).append(
                _timed(lambda: [k.to_string() for k in keys]))
            times.setdefault((b.name, "encode_legacy_key(key) per key"), []).append(
                _timed(lambda: [b._encode(k) for k in keys]))
            enc = [k.to_string() for k in keys]
            b.populate(keys)
            times.setdefault((b.name, "core.delete_many(encoded keys)"), []).append(
                _timed(lambda: core.delete_many(enc, force=True)))
            if b.name == "ours":
                b.populate(keys)
                times.setdefault((b.name, "core.delete_legacy_keys(keys)"), []).append(
                    _timed(lambda: core.delete_legacy_keys(keys, True), collect=True))
            b.populate(keys)
            times.setdefault((b.name, "batched_remove(keys)"), []).append(
                _timed(lambda: b.remove("override", keys), collect=True))
            if core.indexed_key_count() != 0:
                raise RuntimeError(f"{b.name}: breakdown left keys behind")
    return [{"backend": be, "step": step, "keys": BREAKDOWN_N, "cycles": cycles, "time_s": median(v),
             "per_key_s": median(v) / BREAKDOWN_N} for (be, step), v in times.items()]


# --------------------------------------------------------------------------- contention


def contention_run(b: RemoveBackend, method: str | None, resident: list, victims: list, batch: int,
                   contenders: int, idle_s: float = 0.3) -> dict:
    """Contenders loop contains/pin/unpin over *resident* while *victims* are evicted in batches
    by *method* (None: nobody evicts for idle_s)."""
    be = b.be
    if method:
        b.populate(victims)
    stop = threading.Event()
    go = threading.Barrier(contenders + 1)
    counts = [0] * contenders
    lat: list[list[float]] = [[] for _ in range(contenders)]
    clock = time.perf_counter

    def contend(t: int) -> None:
        mine, record, n = resident[t::contenders], lat[t].append, 0
        go.wait()
        while not stop.is_set():
            for k in mine:
                t0 = clock()
                be.contains(k)
                t1 = clock()
                be.pin(k)
                t2 = clock()
                be.unpin(k)
                t3 = clock()
                record(t1 - t0)
                record(t2 - t1)
                record(t3 - t2)
                n += 3
                if stop.is_set():
                    break
        counts[t] = n

    threads = [threading.Thread(target=contend, args=(t,), daemon=True) for t in range(contenders)]
    for th in threads:
        th.start()
    go.wait()
    t0 = time.perf_counter()
    if method:
        removed = sum(b.remove(method, victims[i:i + batch]) for i in range(0, len(victims), batch))
        if removed != len(victims):
            raise RuntimeError(f"{b.name} {method}: evicted {removed} of {len(victims)}")
    else:
        time.sleep(idle_s)
    dt = time.perf_counter() - t0
    stop.set()
    for th in threads:
        th.join()
    lats = sorted(x for xs in lat for x in xs)
    return {"seconds": dt, "evicted_per_s": len(victims) / dt if method else None, "ops_per_s": sum(counts) / dt,
            "p99_s": lats[int(0.99 * (len(lats) - 1))] if lats else None, "max_s": lats[-1] if lats else None}


def run_contention(backends: list[RemoveBackend], s: PluginSettings, bar: Any) -> list[dict]:
    resident = _cache_keys(RESIDENT, 1 << 41)
    victims = _cache_keys(s.victims, 1 << 42)
    for b in backends:
        b.populate(resident)
    runs: dict[tuple[str, str], list[dict]] = {}
    for rep in range(s.contention_runs):
        bar.set_description_str(f"plugin contention run {rep + 1}/{s.contention_runs}")
        for b in interleaved_order(rep, backends):
            for method in interleaved_order(rep, ["fan-out", "override"]):
                gc.collect()
                runs.setdefault((b.name, method), []).append(
                    contention_run(b, method, resident, victims, s.evict_batch, s.contenders))
            runs.setdefault((b.name, "idle"), []).append(
                contention_run(b, None, resident, victims, s.evict_batch, s.contenders))
        bar.update(1)
    for b in backends:
        b.be.batched_remove(resident)
    rows = []
    for (name, method), rs in runs.items():
        row = {"backend": name, "evictor": method, "runs": len(rs), "victims": s.victims, "batch": s.evict_batch,
               "contenders": s.contenders}
        for key in ("seconds", "evicted_per_s", "ops_per_s", "p99_s", "max_s"):
            row[key] = median([r[key] for r in rs if r[key] is not None])
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- the part


def run_plugin(comps: Sequence[Any], s: PluginSettings, workdir: str, bar: Any) -> dict:
    _quiet()
    have_lmc = any(c.name == "lmcache" and c.available for c in comps)
    out: dict[str, Any] = {"settings": s.describe(), "remove": [], "breakdown": [], "contention": [],
                           "errors": {}}
    loop = asyncio.new_event_loop()  # handed to the backends; nothing here runs on it
    size = (max(max(s.remove_sizes), BREAKDOWN_N) + s.victims + RESIDENT) * 8192 + 32 * MiB
    backends, errors = remove_backends(have_lmc, workdir, size, loop)
    out["errors"].update(errors)
    try:
        if not backends:
            bar.update(steps(s))
            return out
        out["remove"] = run_remove(backends, s.remove_sizes, s.remove_cycles, s.remove_cycles_large, bar)
        if s.breakdown_cycles:
            bar.set_description_str("plugin batched_remove breakdown")
            out["breakdown"] = run_breakdown(backends, s.breakdown_cycles)
            bar.update(1)
        if s.contention_runs:
            out["contention"] = run_contention(backends, s, bar)
    finally:
        for b in backends:
            b.close()
            remove_file(b.path)
        loop.close()
    return out
