"""Core suite: our ``RawBlockCore`` against LMCache's Python ``RawBlockCore`` (over the Rust wheel).

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

The CPU part times ``time.process_time()`` per key of ``put_many`` / ``load_many_into`` of
64 x 64 KiB (issue 4's per-key CPU target). Figures are medians over the rounds; the ratio
reported is *LMCache time / our time* (the speed-up, higher is better), because that is how
the targets of issue 4 are phrased.

LMCache (``pip install torch==2.13.0 && pip install lmcache``) is optional: without it only
our core is measured and the competitor is reported as not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .common import MiB, Competitor, _dist_version, interleaved_order, median, spread

LMCACHE_DIST = "lmcache"
LMCACHE_MODULE = "lmcache.v1.storage_backend.raw_block"
LMCACHE_PIP = "pip install torch==2.13.0 && pip install lmcache"

BLOCK = 4096
PAYLOAD = 4096
SLOT = 8192
BATCH = 256
OPS = ("put_many", "exists_many", "load_many_into", "checkpoint", "open_recovery", "delete_many")
CPU_KEYS, CPU_SIZE = 64, 64 * 1024


@dataclass
class CoreSettings:
    sizes: list[int]
    repeats: int
    repeats_large: int  # rounds for N >= 100k
    cpu_repeats: int
    engines: list[str] = field(default_factory=lambda: ["posix"])

    def describe(self) -> dict:
        return {"sizes": list(self.sizes), "repeats": self.repeats, "repeats_large": self.repeats_large,
                "cpu_repeats": self.cpu_repeats, "payload_bytes": PAYLOAD, "slot_bytes": SLOT, "batch": BATCH,
                "engines": list(self.engines)}


SUITES = {
    "smoke": CoreSettings(sizes=[64], repeats=1, repeats_large=1, cpu_repeats=1),
    "quick": CoreSettings(sizes=[1000], repeats=5, repeats_large=3, cpu_repeats=5),
    "full": CoreSettings(sizes=[1000, 10000, 100000], repeats=7, repeats_large=3, cpu_repeats=9,
                         engines=["posix", "io_uring"]),
}


def steps(s: CoreSettings) -> int:
    return len(s.sizes) * len(s.engines) + len(s.engines)


# --------------------------------------------------------------------------- competitor


def lmcache_core() -> Competitor:
    """LMCache's Python RawBlockCore, if ``lmcache`` (and torch) import."""
    comp = Competitor(name="lmcache", dist=LMCACHE_DIST, module=LMCACHE_MODULE)
    if importlib.util.find_spec("lmcache") is None:
        comp.error = "not installed"
        comp.install = LMCACHE_PIP
        return comp
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = importlib.import_module(LMCACHE_MODULE)
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
    from lmcache_rawblock import RawBlockCore, __version__

    return Competitor(name="ours", dist="lmcache-rawblock", module="lmcache_rawblock", cls=RawBlockCore,
                      version=__version__)


# --------------------------------------------------------------------------- helpers shared with seeds


class _Meta:
    __slots__ = ("shape", "dtype", "fmt", "cached_positions")

    def __init__(self, n: int):
        self.shape = [n]
        self.dtype = "uint8"
        self.fmt = "BINARY"
        self.cached_positions = None


class PlainObj:
    """A MemoryObj-shaped buffer (byte_array + metadata) for runs without torch/LMCache."""

    def __init__(self, n: int, fill: int = 0):
        self._buf = bytearray([fill]) * n
        self.byte_array = memoryview(self._buf)
        self.metadata = _Meta(n)


def make_obj(n: int, fill: int = 0x5A, real: bool = False) -> Any:
    """A memory object of n bytes: LMCache's TensorMemoryObj when ``real`` (LMCache installed)."""
    if not real:
        return PlainObj(n, fill)
    import torch
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    t = torch.full((n,), fill, dtype=torch.uint8)
    md = MemoryObjMetadata(shape=torch.Size([n]), dtype=torch.uint8, address=0, phy_size=n, ref_count=1,
                           fmt=MemoryFormat.BINARY)
    return TensorMemoryObj(raw_data=t, metadata=md, parent_allocator=None)


def object_keys(n: int, tag: str = "bench") -> list:
    from lmcache_rawblock.raw_block import encode_object_key
    from lmcache_rawblock.raw_block._lmcache import ObjectKey

    return [encode_object_key(ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name=tag, kv_rank=0))
            for i in range(n)]


def sparse(path: str, size: int) -> str:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


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


def _run_op(op: str, state: dict, keys: list, enc: list, objs: list, dst: list) -> float:
    core = state["core"]
    n = len(keys)
    if op == "put_many":
        t0 = time.perf_counter()
        for i in range(0, n, BATCH):
            res = core.put_many(keys[i:i + BATCH], objs[:min(BATCH, n - i)])
            if not all(res.results):
                raise RuntimeError(f"put_many stored {sum(res.results)} of {len(res.results)} keys")
        return time.perf_counter() - t0
    if op == "exists_many":
        t0 = time.perf_counter()
        got = core.exists_many(enc)
        dt = time.perf_counter() - t0
        if not all(got):
            raise RuntimeError("exists_many missed keys")
        return dt
    if op == "load_many_into":
        t0 = time.perf_counter()
        for i in range(0, n, BATCH):
            got = core.load_many_into(enc[i:i + BATCH], dst[:min(BATCH, n - i)])
            if not all(got):
                raise RuntimeError("load_many_into missed keys")
        return time.perf_counter() - t0
    if op == "checkpoint":
        t0 = time.perf_counter()
        core.checkpoint_now()
        return time.perf_counter() - t0
    if op == "open_recovery":
        close_core(core)
        t0 = time.perf_counter()
        state["core"] = core = state["open"](True)
        dt = time.perf_counter() - t0
        if core.indexed_key_count() != n:
            raise RuntimeError(f"recovery found {core.indexed_key_count()} of {n} entries")
        return dt
    if op == "delete_many":
        t0 = time.perf_counter()
        got = core.delete_many(enc)
        dt = time.perf_counter() - t0
        if not all(got):
            raise RuntimeError("delete_many missed keys")
        return dt
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
                    mem.append(int(states["ours"]["core"]._native.mem_bytes()))
                if op == "load_many_into" and "ours" in states and bytes(dst[0].byte_array[:8]) != bytes(
                        objs[0].byte_array[:8]):
                    errors["ours"] = "load_many_into returned other bytes than were put"
        finally:
            for st in states.values():
                close_core(st["core"])
                try:
                    os.unlink(st["path"])
                except OSError:
                    pass
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


# --------------------------------------------------------------------------- per-key CPU part


def measure_cpu(comps: Sequence[Competitor], repeats: int, workdir: str, engine: str = "posix",
                real_objs: bool = False) -> dict:
    """process_time per key of put_many / load_many_into, 64 keys x 64 KiB (page cache)."""
    slot = CPU_SIZE + BLOCK
    objs = [make_obj(CPU_SIZE, 0x41 + i % 32, real_objs) for i in range(CPU_KEYS)]
    dst = [make_obj(CPU_SIZE, 0, real_objs) for _ in range(CPU_KEYS)]
    cores: dict[str, Any] = {}
    paths = []
    errors: dict[str, str] = {}
    for c in comps:
        path = sparse(os.path.join(workdir, f"cpu-{c.name}-{engine}.img"), MiB + (CPU_KEYS + 2) * slot)
        paths.append(path)
        try:
            cores[c.name] = open_core(c, path, slot_bytes=slot, io_engine=engine, meta_verify_on_load=False)
        except Exception as exc:  # noqa: BLE001
            errors[c.name] = f"{type(exc).__name__}: {exc}"
    res: dict[str, dict[str, list[float]]] = {"put_many": {}, "load_many_into": {}}
    try:
        for rnd in range(repeats):
            keys = object_keys(CPU_KEYS, f"cpu{rnd}")
            enc = [k.encoded for k in keys]
            for name in interleaved_order(rnd, list(cores)):
                core = cores[name]
                p0 = time.process_time()
                pr = core.put_many(keys, objs)
                p1 = time.process_time()
                got = core.load_many_into(enc, dst)
                p2 = time.process_time()
                if not all(pr.results) or not all(got) or bytes(dst[3].byte_array[:16]) != bytes(
                        objs[3].byte_array[:16]):
                    errors[name] = "put/load round trip failed"
                core.delete_many(enc)
                res["put_many"].setdefault(name, []).append((p1 - p0) / CPU_KEYS)
                res["load_many_into"].setdefault(name, []).append((p2 - p1) / CPU_KEYS)
    finally:
        for core in cores.values():
            close_core(core)
        for p in paths:
            try:
                os.unlink(p)
            except OSError:
                pass
    rows = []
    for op, by in res.items():
        o, lm = median(by.get("ours", [])), median(by.get("lmcache", []))
        rows.append({"op": op, "engine": engine, "keys": CPU_KEYS, "size": CPU_SIZE, "repeats": repeats,
                     "ours_cpu_per_key_s": o, "lmcache_cpu_per_key_s": lm,
                     "speedup": (lm / o) if (o and lm) else None, "samples_s": by})
    return {"rows": rows, "errors": errors}


# --------------------------------------------------------------------------- the part


def run_core(comps: Sequence[Competitor], s: CoreSettings, workdir: str, bar: Any,
             note: Callable[[str], None] | None = None) -> dict:
    """The core part: index-size rows per engine, index memory, per-key CPU."""
    _quiet()
    comps = [c for c in comps if c.available]
    real = any(c.name == "lmcache" for c in comps)
    out: dict[str, Any] = {"settings": s.describe(), "rows": [], "index": [], "cpu": [], "errors": {},
                           "competitors": [c.name for c in comps]}
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
        bar.set_description_str(f"core cpu 64x64KiB {engine}")
        r = measure_cpu(comps, s.cpu_repeats, workdir, engine=engine, real_objs=real)
        out["cpu"] += r["rows"]
        for k, v in r["errors"].items():
            out["errors"][f"{k}/cpu/{engine}"] = v
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
    return [[sys.executable, "-m", "pip", "install", "-q", "--target", target, "torch==2.13.0", "lmcache"]]


def install_lmcache(run: Callable[..., Any] | None = None, target: str | None = None) -> tuple[bool, str]:
    """torch (the local CPU wheel) and lmcache, into ``competitor_dir()``. Never raises."""
    import subprocess

    run = run or subprocess.run
    target = target or competitor_dir()
    t0 = time.perf_counter()
    for cmd in install_commands(target):
        try:
            proc = run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"{' '.join(cmd)} failed: {exc}"
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
            return False, f"{' '.join(cmd)} exited {proc.returncode}: {' | '.join(tail)}"
    activate_competitor_dir(target)
    return True, f"installed torch 2.13.0 + lmcache into {target} in {time.perf_counter() - t0:.0f} s"
