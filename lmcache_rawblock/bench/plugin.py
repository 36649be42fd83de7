"""Seed suite: the two measurements this project's issues start from, with their parameter grids.

* ``batched_remove``: one ``batched_remove(keys)`` of the storage plugin on a backend holding
  exactly those N keys (N = 10, 100, 1000, 10000), the base class's per-key fan-out
  (``remove(k, force)`` per key) against the backend's override (one lock section, one
  ``delete_many``). Our ``lmcache_rawblock.plugin.RustRawBlockBackend`` always; LMCache's own
  backend (``lmcache.v1.storage_backend.plugins.rust_raw_block_backend``) when LMCache and the
  Rust wheel import. Issue 5's target: override >= 10x faster than the fan-out at N = 1000.
* ``recovery``: startup slot-header validation of 100, 200, 500, 1000, 3000 slots, the
  sequential reader (one pread per header) against the batched one (io_uring), for our core
  and, when installed, LMCache's; every 97th header is corrupted and all readers must drop the
  same entries. Issue 4's target: batched >= 8x faster than sequential.

Everything runs in this one process; every cell alternates its competitors from one cycle to
the next and reports medians.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Sequence

from .common import MiB, Competitor, interleaved_order, median, spread
from .core import BLOCK, close_core, make_obj, object_keys, open_core, sparse

LMC_PLUGIN_MODULE = "lmcache.v1.storage_backend.plugins.rust_raw_block_backend"
REMOVE_TARGET_N, REMOVE_TARGET = 1000, 10.0
RECOVERY_TARGET = 8.0
RECOVERY_SLOT = 64 * 1024
CORRUPT_EVERY = 97


@dataclass
class SeedSettings:
    remove_sizes: list[int]
    remove_cycles: int
    remove_cycles_large: int  # N > 1000
    recovery_slots: list[int]
    recovery_repeats: int
    recovery_modes: list[str] = field(default_factory=lambda: ["page cache"])

    def describe(self) -> dict:
        return {"remove_sizes": list(self.remove_sizes), "remove_cycles": self.remove_cycles,
                "remove_cycles_large": self.remove_cycles_large, "recovery_slots": list(self.recovery_slots),
                "recovery_repeats": self.recovery_repeats, "recovery_modes": list(self.recovery_modes)}


SUITES = {
    "smoke": SeedSettings(remove_sizes=[10], remove_cycles=1, remove_cycles_large=1, recovery_slots=[100],
                          recovery_repeats=1),
    "quick": SeedSettings(remove_sizes=[10, 100, 1000], remove_cycles=7, remove_cycles_large=5,
                          recovery_slots=[100, 1000, 3000], recovery_repeats=5),
    "full": SeedSettings(remove_sizes=[10, 100, 1000, 10000], remove_cycles=15, remove_cycles_large=7,
                         recovery_slots=[100, 200, 500, 1000, 3000], recovery_repeats=9,
                         recovery_modes=["page cache", "O_DIRECT"]),
}


def steps(s: SeedSettings) -> int:
    return len(s.remove_sizes) + len(s.recovery_slots) * len(s.recovery_modes)


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
    """A storage backend under test plus the two ways of removing a batch of keys."""

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
            enc = importlib.import_module("lmcache.v1.storage_backend.raw_block").encode_legacy_key
            return mod.RustRawBlockBackend, base, enc

        specs.append(("lmcache", lmc))
    for name, get in specs:
        path = sparse(os.path.join(workdir, f"remove-{name}.img"), size)
        try:
            cls, base, enc = get()
            out.append(RemoveBackend(name, cls, base, enc, path, loop, have_lmcache))
        except Exception as exc:  # noqa: BLE001
            errors[name] = f"{type(exc).__name__}: {exc}"
    return out, errors


def run_remove(backends: list[RemoveBackend], sizes: Sequence[int], cycles: int, cycles_large: int,
               bar: Any) -> list[dict]:
    rows = []
    for n in sizes:
        bar.set_description_str(f"seeds batched_remove N={n}")
        keys = _cache_keys(n, 1 << 40)
        reps = cycles if n <= 1000 else cycles_large
        times: dict[tuple[str, str], list[float]] = {}
        for rep in range(reps):
            for b in interleaved_order(rep, backends):
                for method in interleaved_order(rep, ["fan-out", "override"]):
                    b.populate(keys)
                    gc.collect()
                    gc.disable()
                    try:
                        t0 = time.perf_counter()
                        removed = b.remove(method, keys)
                        dt = time.perf_counter() - t0
                    finally:
                        gc.enable()
                    if removed != n or b.be._core.indexed_key_count() != 0:
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


# --------------------------------------------------------------------------- recovery validation


def _state(path: str, keys: list, slot: int, meta: int, payload_len: int) -> dict:
    entries = {k.encoded: {"offset": meta + i * slot, "size": payload_len, "shape": [payload_len],
                           "dtype": "uint8", "fmt": "BINARY", "cached_positions": None}
               for i, k in enumerate(keys)}
    return {"version": 1, "device_path": path, "capacity_bytes": os.path.getsize(path), "block_align": BLOCK,
            "header_bytes": BLOCK, "slot_bytes": slot, "meta_total_bytes": meta, "meta_magic": "LMCIDX01",
            "meta_version": 1, "data_base_offset": meta, "next_slot": len(keys), "entries": entries}


def write_image(path: str, keys: list, slot: int, meta: int, corrupt: set, payload_len: int = 100) -> dict:
    """Slot headers (the corrupt ones with a wrong magic) and one checkpoint, with plain file I/O
    in on-disk format v1; returns the checkpoint state."""
    fd = os.open(path, os.O_RDWR)
    try:
        blob = bytearray(BLOCK)
        for i, k in enumerate(keys):
            magic = b"BROKEN01" if i in corrupt else b"LMCBLK01"
            struct.pack_into("<8sQQ", blob, 0, magic, k.slot_identity, payload_len)
            os.pwrite(fd, bytes(blob), meta + i * slot)
        st = _state(path, keys, slot, meta, payload_len)
        body = json.dumps(st, separators=(",", ":"), ensure_ascii=True).encode()
        if len(body) > meta // 2 - BLOCK:
            raise ValueError("metadata region too small for the checkpoint")
        hdr = struct.pack("<8sIQQI", b"LMCIDX01", 1, 1, len(body), zlib.crc32(body))
        os.pwrite(fd, body + bytes((-len(body)) % BLOCK), BLOCK)
        os.pwrite(fd, hdr + bytes(BLOCK - len(hdr)), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return st


def measure_recovery(comps: Sequence[Competitor], n: int, mode: str, repeats: int, workdir: str) -> dict:
    odirect = mode == "O_DIRECT"
    path = sparse(os.path.join(workdir, f"recovery-{n}.img"), MiB + (n + 1) * RECOVERY_SLOT)
    keys = object_keys(n, f"rec{n}")
    corrupt = set(range(0, n, CORRUPT_EVERY))
    state = write_image(path, keys, RECOVERY_SLOT, MiB, corrupt)
    blob = json.dumps(state, separators=(",", ":")).encode()
    offsets = [MiB + i * RECOVERY_SLOT for i in range(n)]
    readers: dict[str, Any] = {}
    resets: dict[str, Any] = {}
    cores: list[Any] = []
    errors: dict[str, str] = {}
    kw = dict(slot_bytes=RECOVERY_SLOT, meta_total_bytes=MiB, use_odirect=odirect, meta_verify_on_load=False)
    try:
        for c in comps:
            try:
                if c.name == "ours":
                    core = open_core(c, path, io_engine="io_uring", **kw)
                    cores.append(core)

                    def ours_reader(seq: bool, _core=core) -> int:
                        return int(_core._native._revalidate(seq))

                    def ours_reset(_core=core) -> None:
                        _core._native.apply_state_json(blob)  # put the dropped entries back

                    resets["ours"] = ours_reset

                    readers["ours sequential"] = lambda: ours_reader(True)
                    readers["ours batched"] = lambda: ours_reader(False)
                else:
                    seq_core = open_core(c, path, io_engine="posix", **kw)
                    bat_core = open_core(c, path, io_engine="io_uring", **kw)
                    cores += [seq_core, bat_core]
                    readers[f"{c.name} sequential"] = lambda _c=seq_core: sum(
                        1 for o in offsets if _c._read_slot_header(o) is None)
                    readers[f"{c.name} batched"] = lambda _c=bat_core: sum(
                        1 for h in _c._read_slot_headers(offsets) if h is None)
            except Exception as exc:  # noqa: BLE001
                errors[c.name] = f"{type(exc).__name__}: {exc}"
        names = list(readers)
        samples: dict[str, list[float]] = {k: [] for k in names}
        drops: dict[str, int] = {}
        for rnd in range(repeats):
            for name in interleaved_order(rnd, names):
                t0 = time.perf_counter()
                d = readers[name]()
                samples[name].append(time.perf_counter() - t0)
                drops[name] = d
                reset = resets.get(name.split()[0])
                if d and reset is not None:
                    reset()  # untimed
    finally:
        for core in cores:
            close_core(core)
        os.unlink(path)
    med = {k: median(v) for k, v in samples.items()}

    def sp(a: str, b: str) -> float | None:
        return med[a] / med[b] if med.get(a) and med.get(b) else None

    row = {"mode": mode, "slots": n, "repeats": repeats, "corrupted": len(corrupt),
           "times_s": med, "drops": drops, "drops_agree": all(d == len(corrupt) for d in drops.values()),
           "ours_speedup": sp("ours sequential", "ours batched"),
           "lmcache_speedup": sp("lmcache sequential", "lmcache batched"),
           "ours_batched_vs_lmcache_sequential": sp("lmcache sequential", "ours batched"),
           "samples_s": samples, "errors": errors}
    return row


# --------------------------------------------------------------------------- the part


def run_seeds(comps: Sequence[Competitor], s: SeedSettings, workdir: str, bar: Any) -> dict:
    from .core import _quiet

    _quiet()
    comps = [c for c in comps if c.available]
    have_lmc = any(c.name == "lmcache" for c in comps)
    out: dict[str, Any] = {"settings": s.describe(), "remove": [], "recovery": [], "errors": {},
                           "remove_target": {"n": REMOVE_TARGET_N, "speedup": REMOVE_TARGET},
                           "recovery_target": {"speedup": RECOVERY_TARGET}}
    loop = asyncio.new_event_loop()  # handed to the backends; batched_remove never runs on it
    size = max(s.remove_sizes) * 8192 + 32 * MiB
    backends, errors = remove_backends(have_lmc, workdir, size, loop)
    out["errors"].update({f"batched_remove/{k}": v for k, v in errors.items()})
    try:
        if backends:
            out["remove"] = run_remove(backends, s.remove_sizes, s.remove_cycles, s.remove_cycles_large, bar)
        else:
            bar.update(len(s.remove_sizes))
    finally:
        for b in backends:
            b.close()
            try:
                os.unlink(b.path)
            except OSError:
                pass
        loop.close()
    for mode in s.recovery_modes:
        for n in s.recovery_slots:
            bar.set_description_str(f"seeds recovery {mode} {n} slots")
            row = measure_recovery(comps, n, mode, s.recovery_repeats, workdir)
            for k, v in row.pop("errors").items():
                out["errors"][f"recovery/{k}"] = v
            out["recovery"].append(row)
            bar.update(1)
    return out
