"""Core part: our ``RawBlockCore`` against LMCache's Python ``RawBlockCore`` (over the Rust wheel).

For each index size N (1k / 10k / 100k entries) every round gives each implementation a fresh
sparse file and runs, operation by operation and with the order of the implementations
alternating from round to round:

* ``put_many``: N keys x ``PAYLOAD`` bytes, in calls of ``BATCH`` keys;
* ``exists_many``: one call over the N keys;
* ``load_many_into``: the N payloads back, in calls of ``BATCH`` keys;
* ``checkpoint``: ``checkpoint_now()`` with N entries indexed;
* ``open_recovery``: close, then the constructor on the same file with slot-header
  verification on (reads the checkpoint, checks every entry's header);
* ``delete_many``: one call over the N keys.

Figures are medians over the rounds; ``speedup`` is *LMCache time / our time* (higher is
better). The index memory per entry comes from ``RawBlockCore.index_memory_bytes()``. The same
part times per-key CPU (``cpu.py``) and what the durability flushes cost a checkpoint (ours
only: the same checkpoint with and without them).

LMCache (``pip install torch==2.13.0 && pip install lmcache``) is optional: without it only
our core is measured and the competitor is reported as not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from lmcache_rawblock import lmcache_paths
from lmcache_rawblock._quiet import quiet_imports

from .common import (LMCACHE_VERSION, MiB, Competitor, _dist_version, aligned_buffer, interleaved_order, median, pip_install,
                     remove_file, sparse, spread)

LMCACHE_DIST = "lmcache"
# LMCache's raw-block package where the installed LMCache keeps it (lmcache_rawblock.lmcache_paths).
LMCACHE_MODULE = lmcache_paths.raw_block_package()
LMCACHE_PIP = f"pip install torch==2.13.0 && pip install lmcache=={LMCACHE_VERSION}"

BLOCK = 4096
PAYLOAD = 4096
SLOT = 8192
BATCH = 256
OPS = ("put_many", "exists_many", "load_many_into", "checkpoint", "open_recovery", "delete_many")
CPU_KEYS, CPU_SIZE = 64, 64 * 1024


CPU_MEDIA = ("page cache", "O_DIRECT", "O_DIRECT, registered buffers")
FLUSH_BATCH, FLUSH_PAYLOAD, FLUSH_SLOT = 64, 64 * 1024, 128 * 1024


@dataclass
class CoreSettings:
    sizes: list[int]
    repeats: int
    repeats_large: int  # rounds for N >= 100k
    cpu_repeats: int
    engines: list[str] = field(default_factory=lambda: ["posix"])
    cpu_media: list[str] = field(default_factory=lambda: list(CPU_MEDIA))
    floor_rounds: int = 20  # io_floor rounds per medium; 0: no kernel floor
    flush_entries: list[int] = field(default_factory=lambda: [1000])
    flush_rounds: int = 3  # checkpoints with flushes, and as many without

    def describe(self) -> dict:
        return {"sizes": list(self.sizes), "repeats": self.repeats, "repeats_large": self.repeats_large,
                "cpu_repeats": self.cpu_repeats, "payload_bytes": PAYLOAD, "slot_bytes": SLOT, "batch": BATCH,
                "engines": list(self.engines), "cpu_media": list(self.cpu_media),
                "floor_rounds": self.floor_rounds, "flush_entries": list(self.flush_entries),
                "flush_rounds": self.flush_rounds}


SUITES = {
    "smoke": CoreSettings(sizes=[64], repeats=1, repeats_large=1, cpu_repeats=1, cpu_media=["page cache"],
                          floor_rounds=0, flush_entries=[64], flush_rounds=1),
    "quick": CoreSettings(sizes=[1000], repeats=5, repeats_large=3, cpu_repeats=5),
    "full": CoreSettings(sizes=[1000, 10000, 100000], repeats=7, repeats_large=3, cpu_repeats=9,
                         engines=["posix", "io_uring"], floor_rounds=40, flush_entries=[1000, 10000],
                         flush_rounds=7),
}


def steps(s: CoreSettings) -> int:
    return len(s.engines) * (len(s.sizes) + 1 + len(s.flush_entries))


# --------------------------------------------------------------------------- competitor


def lmcache_core() -> Competitor:
    """LMCache's Python RawBlockCore, if ``lmcache`` (and torch) import."""
    lmcache_paths.clear_cache()  # --install-competitors may have just put it on sys.path
    comp = Competitor(name="lmcache", dist=LMCACHE_DIST, module=lmcache_paths.raw_block_package())
    if importlib.util.find_spec("lmcache") is None:
        comp.error = "not installed"
        comp.install = LMCACHE_PIP
        return comp
    try:
        with quiet_imports():
            mod = importlib.import_module(comp.module)
            importlib.import_module("torch")
    except Exception as exc:  # noqa: BLE001 - lmcache imports torch and much more
        comp.error = f"import failed ({type(exc).__name__}: {exc})"
        comp.install = LMCACHE_PIP
        return comp
    comp.cls = mod.RawBlockCore
    comp.version = _dist_version(LMCACHE_DIST)
    logging.getLogger("lmcache").setLevel(logging.ERROR)
    return comp


def ours_core() -> Competitor:
    with quiet_imports():  # our LMCache API loads LMCache's key classes when it is installed
        from lmcache_rawblock import RawBlockCore, __version__

    return Competitor(name="ours", dist="lmcache-rawblock", module="lmcache_rawblock", cls=RawBlockCore,
                      version=__version__)


# --------------------------------------------------------------------------- memory objects, keys, cores


class _Meta:
    __slots__ = ("shape", "dtype", "fmt", "cached_positions")

    def __init__(self, n: int):
        self.shape = [n]
        self.dtype = "uint8"
        self.fmt = "BINARY"
        self.cached_positions = None


class PlainObj:
    """A MemoryObj-shaped buffer (byte_array + metadata) for runs without torch/LMCache."""

    def __init__(self, n: int, fill: int = 0, view: memoryview | None = None):
        self.byte_array = view if view is not None else memoryview(bytearray([fill]) * n)
        self.metadata = _Meta(n)


def _tensor_obj(t: Any) -> Any:
    """LMCache's TensorMemoryObj (BINARY, uint8) over the uint8 tensor t."""
    import torch
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    n = t.numel()
    md = MemoryObjMetadata(shape=torch.Size([n]), dtype=torch.uint8, address=0, phy_size=n, ref_count=1,
                           fmt=MemoryFormat.BINARY)
    return TensorMemoryObj(raw_data=t, metadata=md, parent_allocator=None)


def make_obj(n: int, fill: int = 0x5A, real: bool = False) -> Any:
    """A memory object of n bytes: LMCache's TensorMemoryObj when ``real`` (LMCache installed)."""
    if not real:
        return PlainObj(n, fill)
    import torch

    return _tensor_obj(torch.full((n,), fill, dtype=torch.uint8))


class Arena:
    """n payload-sized memory objects carved out of one page-aligned buffer (what O_DIRECT zero
    copy needs); ``get_paged_buffers()`` is what ``register_fixed_buffers_from_allocator``
    registers, as with LMCache's paged CPU allocator. Torch-backed when ``real``."""

    def __init__(self, n: int, size: int, real: bool = False):
        self.size, self.real = size, real
        if real:
            import torch

            raw = torch.zeros(n * size + BLOCK, dtype=torch.uint8)
            off = -raw.data_ptr() % BLOCK
            self.buf = raw[off:off + n * size]
        else:
            self.buf = aligned_buffer(n * size)

    def get_paged_buffers(self) -> list:
        return [self.buf]

    def obj(self, i: int, fill: int) -> Any:
        piece = self.buf[i * self.size:(i + 1) * self.size]
        if self.real:
            piece.fill_(fill)
            return _tensor_obj(piece)
        piece[:] = bytes([fill]) * self.size
        return PlainObj(self.size, view=piece)


def payload(obj: Any) -> bytes:
    return bytes(obj.byte_array)


def clear(obj: Any) -> None:
    """Zero an object's bytes without a torch op (an OpenMP worker spinning after one would be
    billed to process_time)."""
    if isinstance(obj, PlainObj):
        obj.byte_array[:] = bytes(len(obj.byte_array))
    else:
        import ctypes

        ctypes.memset(obj.raw_data.data_ptr(), 0, obj.raw_data.numel())


def object_keys(n: int, tag: str = "bench") -> list:
    from lmcache_rawblock.raw_block import encode_object_key
    from lmcache_rawblock.raw_block._lmcache import ObjectKey

    return [encode_object_key(ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name=tag, kv_rank=0))
            for i in range(n)]


def meta_bytes_for(n: int) -> int:
    """Metadata region big enough for two checkpoint copies of n entries (~320 B each in JSON)."""
    need = 2 * (n * 320 + 64 * 1024)
    return max(MiB, -(-need // MiB) * MiB)


def config_kwargs(path: str, **kw: Any) -> dict:
    base = dict(device_path=path, capacity_bytes=0, block_align=BLOCK, header_bytes=BLOCK, slot_bytes=SLOT,
                use_odirect=False, enable_zero_copy=False, meta_total_bytes=MiB, meta_magic=b"LMCIDX01",
                meta_version=1, meta_checkpoint_interval_sec=60, meta_idle_quiet_ms=0,
                meta_enable_periodic=False, meta_verify_on_load=True, io_engine="posix", iouring_queue_depth=256)
    base.update(kw)
    return base


def open_core(comp: Competitor, path: str, **kw: Any) -> Any:
    """A RawBlockCore of ``comp`` (ours or LMCache's) on path, object key namespace."""
    if comp.name == "ours":
        from lmcache_rawblock.raw_block import RawBlockCoreConfig
    else:
        RawBlockCoreConfig = importlib.import_module(LMCACHE_MODULE).RawBlockCoreConfig  # noqa: N806
    return comp.cls(RawBlockCoreConfig(**config_kwargs(path, **kw)), key_namespace="object")


def close_core(core: Any) -> None:
    try:
        core.close()
    except Exception:  # noqa: BLE001 - a failed close must not hide the figures
        pass


def _quiet() -> None:
    for name in ("lmcache", "lmcache_rawblock"):
        logging.getLogger(name).setLevel(logging.ERROR)


# --------------------------------------------------------------------------- the index-size part


def _timed(call: Callable[[], Any], ok: Callable[[Any], bool], failure: str) -> float:
    t0 = time.perf_counter()
    got = call()
    dt = time.perf_counter() - t0
    if not ok(got):
        raise RuntimeError(failure)
    return dt


def _run_op(op: str, state: dict, keys: list, enc: list, objs: list, dst: list) -> float:
    core = state["core"]
    n = len(keys)
    starts = range(0, n, BATCH)
    if op == "put_many":
        return _timed(lambda: [all(core.put_many(keys[i:i + BATCH], objs[:min(BATCH, n - i)]).results)
                               for i in starts], all, "put_many did not store every key")
    if op == "exists_many":
        return _timed(lambda: core.exists_many(enc), all, "exists_many missed keys")
    if op == "load_many_into":
        return _timed(lambda: [all(core.load_many_into(enc[i:i + BATCH], dst[:min(BATCH, n - i)])) for i in starts],
                      all, "load_many_into missed keys")
    if op == "checkpoint":
        return _timed(core.checkpoint_now, lambda _: True, "")
    if op == "open_recovery":
        close_core(core)
        state["core"] = None
        dt = _timed(lambda: state.update(core=state["open"](True)), lambda _: True, "")
        if state["core"].indexed_key_count() != n:
            raise RuntimeError(f"recovery found {state['core'].indexed_key_count()} of {n} entries")
        return dt
    if op == "delete_many":
        return _timed(lambda: core.delete_many(enc), all, "delete_many missed keys")
    raise ValueError(op)


def measure_size(comps: Sequence[Competitor], n: int, repeats: int, workdir: str, engine: str = "posix",
                 real_objs: bool = False) -> dict:
    """One row per operation for index size n: medians over interleaved rounds."""
    keys = object_keys(n, f"core{n}")
    enc = [k.encoded for k in keys]
    b = min(BATCH, n)
    objs = [make_obj(PAYLOAD, 0x30 + i % 64, real_objs) for i in range(b)]
    dst = [make_obj(PAYLOAD, 0, real_objs) for _ in range(b)]
    meta = meta_bytes_for(n)
    size = meta + (n + 2) * SLOT
    names = [c.name for c in comps]
    by_name = {c.name: c for c in comps}
    samples: dict[str, dict[str, list[float]]] = {op: {c: [] for c in names} for op in OPS}
    mem: list[int] = []
    errors: dict[str, str] = {}
    for rnd in range(repeats):
        states: dict[str, dict] = {}
        for name in names:
            path = sparse(os.path.join(workdir, f"core-{name}-{n}.img"), size)

            def opener(verify: bool, _c=by_name[name], _p=path) -> Any:
                return open_core(_c, _p, slot_bytes=SLOT, meta_total_bytes=meta, io_engine=engine,
                                 meta_verify_on_load=verify)

            try:
                states[name] = {"core": opener(False), "open": opener, "path": path}
            except Exception as exc:  # noqa: BLE001
                errors[name] = f"{type(exc).__name__}: {exc}"
        live = [nm for nm in names if nm in states]
        try:
            for op in OPS:
                for name in interleaved_order(rnd, live):
                    if name in errors:
                        continue
                    try:
                        samples[op][name].append(_run_op(op, states[name], keys, enc, objs, dst))
                    except Exception as exc:  # noqa: BLE001
                        errors[name] = f"{op}: {type(exc).__name__}: {exc}"
                if op == "load_many_into" and "ours" in states and "ours" not in errors:
                    mem.append(states["ours"]["core"].index_memory_bytes())
                if op == "load_many_into" and "ours" in states and bytes(dst[0].byte_array[:8]) != bytes(
                        objs[0].byte_array[:8]):
                    errors["ours"] = "load_many_into returned other bytes than were put"
        finally:
            for st in states.values():
                close_core(st["core"])
                remove_file(st["path"])
    rows = []
    for op in OPS:
        ours_s = median(samples[op].get("ours", []))
        lmc_s = median(samples[op].get("lmcache", [])) if "lmcache" in samples[op] else None
        rows.append({
            "op": op, "entries": n, "engine": engine, "repeats": repeats,
            "ours_s": ours_s, "lmcache_s": lmc_s,
            "ours_per_key_s": ours_s / n if ours_s else None,
            "lmcache_per_key_s": lmc_s / n if lmc_s else None,
            "speedup": (lmc_s / ours_s) if (ours_s and lmc_s) else None,
            "ours_spread": spread(samples[op].get("ours", [])),
            "lmcache_spread": spread(samples[op].get("lmcache", [])),
            "samples_s": samples[op],
        })
    key_bytes = sum(len(e) + 1 for e in enc)
    m = median(mem) if mem else None
    index = {"entries": n, "mem_bytes": m, "key_bytes": key_bytes,
             "bytes_per_entry_without_keys": (m - key_bytes) / n if m else None}
    return {"rows": rows, "index": index, "errors": errors}


# --------------------------------------------------------------------------- checkpoint flushes


def measure_flush(s: CoreSettings, engine: str, medium: str, entries: int, workdir: str) -> dict:
    """Our checkpoint with and without its device flushes, on one core: each round puts a batch
    of new payloads (what a checkpoint interval writes), then checkpoints; rounds alternate
    between flushes on (the product) and off. Medians of wall and CPU time per checkpoint."""
    odirect = medium == "O_DIRECT"
    meta = meta_bytes_for(entries + FLUSH_BATCH)
    path = sparse(os.path.join(workdir, f"flush-{engine}.img"),
                  meta + (entries + FLUSH_BATCH * (2 * s.flush_rounds + 2)) * FLUSH_SLOT)
    small_arena = Arena(FLUSH_BATCH, PAYLOAD)
    small = [small_arena.obj(i, 0x33) for i in range(FLUSH_BATCH)]
    body = Arena(1, FLUSH_PAYLOAD).obj(0, 0x44)
    core = open_core(ours_core(), path, slot_bytes=FLUSH_SLOT, meta_total_bytes=meta, io_engine=engine,
                     use_odirect=odirect, enable_zero_copy=True, meta_verify_on_load=False)
    times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    try:
        keys = object_keys(entries, f"flush{entries}")
        for i in range(0, entries, FLUSH_BATCH):
            part = keys[i:i + FLUSH_BATCH]
            core.put_many(part, small[:len(part)])
        core.checkpoint_now()
        for rnd in range(2 * s.flush_rounds):
            flush = rnd % 2 == 0
            core.hooks.set_checkpoint_flush(flush)
            batch = object_keys(FLUSH_BATCH, f"flush{entries}-{rnd}")
            if not all(core.put_many(batch, [body] * FLUSH_BATCH).results):
                raise RuntimeError("put_many failed while measuring checkpoints")
            w, c = time.perf_counter(), time.process_time()
            core.checkpoint_now()
            times[flush].append((time.perf_counter() - w, time.process_time() - c))
            core.delete_many([k.encoded for k in batch])
    finally:
        core.hooks.set_checkpoint_flush(True)
        close_core(core)
        remove_file(path)
    on = [median([t[i] for t in times[True]]) for i in (0, 1)]
    off = [median([t[i] for t in times[False]]) for i in (0, 1)]
    return {"engine": engine, "medium": medium, "entries": entries, "rounds": s.flush_rounds,
            "batch_keys": FLUSH_BATCH, "batch_payload": FLUSH_PAYLOAD,
            "with_flush_wall_s": on[0], "with_flush_cpu_s": on[1],
            "without_flush_wall_s": off[0], "without_flush_cpu_s": off[1],
            "wall_ratio": on[0] / off[0] if off[0] else None}


# --------------------------------------------------------------------------- the part


def run_core(comps: Sequence[Competitor], s: CoreSettings, workdir: str, bar: Any) -> dict:
    """The core part: index-size rows per engine, index memory, per-key CPU beside the kernel
    floor, and the checkpoint with and without its flushes."""
    from . import cpu

    _quiet()
    comps = [c for c in comps if c.available]
    real = any(c.name == "lmcache" for c in comps)
    out: dict[str, Any] = {"settings": s.describe(), "rows": [], "index": [], "cpu": [], "flush": [],
                           "errors": {}, "competitors": [c.name for c in comps]}
    floor = cpu.kernel_floor(s.cpu_media, s.floor_rounds, workdir)
    out["floor"] = floor
    for engine in s.engines:
        for n in s.sizes:
            bar.set_description_str(f"core {engine} {n:,} entries")
            reps = s.repeats_large if n >= 100_000 else s.repeats
            r = measure_size(comps, n, reps, workdir, engine=engine, real_objs=real)
            out["rows"] += r["rows"]
            out["index"].append({**r["index"], "engine": engine})
            for k, v in r["errors"].items():
                out["errors"][f"{k}/{engine}/{n}"] = v
            bar.update(1)
        bar.set_description_str(f"core per-key CPU {engine}")
        r = cpu.measure_cpu(comps, s, workdir, engine, real, floor)
        out["cpu"] += r["rows"]
        for k, v in r["errors"].items():
            out["errors"][f"cpu/{engine}/{k}"] = v
        bar.update(1)
        for n in s.flush_entries:
            bar.set_description_str(f"core checkpoint flushes {engine} {n:,} entries")
            for medium in ("page cache", "O_DIRECT"):
                try:
                    out["flush"].append(measure_flush(s, engine, medium, n, workdir))
                except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                    out["errors"][f"flush/{engine}/{medium}/{n}"] = f"{type(exc).__name__}: {exc}"
            bar.update(1)
    return out


# --------------------------------------------------------------------------- installing LMCache


def competitor_dir() -> str:
    """Where --install-competitors puts LMCache and torch (``pip install --target``): outside
    the interpreter's site-packages, so installing the benchmark's competitor does not turn
    every other use of this Python into an LMCache environment."""
    env = os.environ.get("LMCACHE_RAWBLOCK_COMPETITORS")
    if env:
        return env
    import sys

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lmcache-rawblock", f"competitors-py{sys.version_info[0]}{sys.version_info[1]}")


def activate_competitor_dir(path: str | None = None) -> bool:
    """Append the competitor directory to sys.path when it exists (this process only)."""
    import sys

    path = path or competitor_dir()
    if os.path.isdir(path) and path not in sys.path:
        sys.path.append(path)
        importlib.invalidate_caches()
        return True
    return path in sys.path


def install_commands(target: str) -> list[list[str]]:
    import sys

    # One command: with --target pip does not see what an earlier command put there, so a second
    # `pip install lmcache` would resolve torch afresh and fetch a multi-GB CUDA build beside the
    # CPU one (5.8 GB seen). Listed together, the resolver keeps torch at the CPU 2.13.0.
    return [[sys.executable, "-m", "pip", "install", "-q", "--target", target, "torch==2.13.0",
             f"lmcache=={LMCACHE_VERSION}"]]


def install_lmcache(run: Callable[..., Any] | None = None, target: str | None = None) -> tuple[bool, str]:
    """torch (the local CPU wheel) and lmcache, into ``competitor_dir()``. Never raises."""
    import subprocess

    target = target or competitor_dir()
    t0 = time.perf_counter()
    for cmd in install_commands(target):
        err = pip_install(cmd, 1800, run or subprocess.run)
        if err:
            return False, err
    activate_competitor_dir(target)
    return True, f"installed torch 2.13.0 + lmcache into {target} in {time.perf_counter() - t0:.0f} s"
