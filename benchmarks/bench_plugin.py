#!/usr/bin/env python3
"""Plugin benchmark: ``batched_remove`` of the storage plugin, the base-class per-key fan-out
against the plugin's own override, on our RustRawBlockBackend and on LMCache's (Rust wheel).

Run it with the LMCache virtualenv, from the repository root (so the in-place extension is
imported), everything in one process:

    .venv-lmcache/bin/python benchmarks/bench_plugin.py --md benchmarks/results/plugin.md

Two parts, each backend loaded by LMCache's own ``storage_plugin_launcher`` on a sparse file
(4 KiB chunks, ``slot_bytes`` 8192) with a real LocalCPUBackend:

1. Seed reproduction. For N = 10, 100, 1000, 10000: populate N keys (through the core's
   ``put_many``, untimed), then time one ``batched_remove(keys)``: either the base class's
   loop (``StorageBackendInterface.batched_remove``: ``remove(k, force)`` per key) or the
   backend's override. Cycles alternate fan-out/override and ours/LMCache's; every figure is
   the median over the cycles. Target: our override >= 10x faster than the fan-out on our
   backend at N = 1000 (the reference measured 1.04-1.28x for LMCache's fan-out against its
   fork's override).
2. Contention. 4 contender threads loop ``contains(k)``, ``pin(k)``, ``unpin(k)`` on resident
   keys while one thread evicts V other keys in batches of B with fan-out or override.
   Reported: eviction throughput (keys/s) and contender ops/s during the eviction, medians
   over interleaved runs, plus the contenders' rate with nobody evicting.

No timing is asserted anywhere; this only measures and reports.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MiB = 1 << 20
PLUGIN = "raw_block"
OURS = ("ours", "lmcache_rawblock.plugin")
LMC = ("lmcache", "lmcache.v1.storage_backend.plugins.rust_raw_block_backend")
TARGET_N, TARGET_RATIO = 1000, 10.0
REFERENCE = "1.04-1.28x (LMCache's fan-out vs its fork's override)"
# 4 KiB chunk: 1 layer x (K,V) x 16 tokens x 4 heads x 16 dims x bf16
KV_SHAPE = (1, 2, 16, 4, 16)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10,100,1000,10000", help="N values (default 10,100,1000,10000)")
    p.add_argument("--cycles", type=int, default=15, help="populate->remove cycles per cell, N <= 1000 (default 15)")
    p.add_argument("--cycles-large", type=int, default=7, help="cycles per cell for N > 1000 (default 7)")
    p.add_argument("--contention-runs", type=int, default=5, help="interleaved contention runs (default 5)")
    p.add_argument("--victims", type=int, default=20000, help="keys evicted per contention run (default 20000)")
    p.add_argument("--batch", type=int, default=100, help="eviction batch size (default 100)")
    p.add_argument("--contenders", type=int, default=4, help="contender threads (default 4)")
    p.add_argument("--dir", help="directory for the sparse files (default: a temporary directory)")
    p.add_argument("--no-lmcache-backend", action="store_true", help="only our backend")
    p.add_argument("--md", help="write the markdown report here")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- set-up


class Env:
    """A LocalCPUBackend, a storage-manager-like loop thread, and plugins loaded by LMCache."""

    def __init__(self, workdir: Path, size: int):
        import torch
        from lmcache.v1.metadata import LMCacheMetadata

        self.torch = torch
        self.workdir = workdir
        self.size = size
        self.metadata = LMCacheMetadata(model_name="bench", world_size=1, local_world_size=1, worker_id=0,
                                        local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=KV_SHAPE,
                                        chunk_size=KV_SHAPE[2])
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="storage-manager-event-loop",
                                       daemon=True)
        self.thread.start()
        self.locals = []

    def config(self, module: str, device: str):
        from lmcache.v1.config import LMCacheEngineConfig

        return LMCacheEngineConfig.from_defaults(
            chunk_size=KV_SHAPE[2], max_local_cpu_size=0.02, local_cpu=False, storage_plugins=[PLUGIN],
            extra_config={
                f"storage_plugin.{PLUGIN}.module_path": module,
                f"storage_plugin.{PLUGIN}.class_name": "RustRawBlockBackend",
                "rust_raw_block.device_path": device,
                "rust_raw_block.slot_bytes": 8192,
                "rust_raw_block.header_bytes": 4096,
                "rust_raw_block.block_align": 4096,
                "rust_raw_block.meta_total_bytes": 16 * MiB,
                "rust_raw_block.meta_enable_periodic": False,
                "rust_raw_block.load_checkpoint_on_init": False,
            })

    def launch(self, name: str, module: str):
        from lmcache.v1.storage_backend import storage_plugin_launcher
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

        device = str(self.workdir / f"{name}.img")
        with open(device, "wb") as f:
            f.truncate(self.size)
        cfg = self.config(module, device)
        local = LocalCPUBackend(cfg, self.metadata, "cpu")
        self.locals.append(local)
        found = collections.OrderedDict()
        storage_plugin_launcher(cfg, self.metadata, self.loop, local, "cpu", found)
        if PLUGIN not in found:
            raise RuntimeError(f"LMCache did not load {module} (see the log)")
        be = found[PLUGIN]
        obj = local.allocate(self.metadata.get_shapes()[0], self.torch.bfloat16)
        obj.tensor.view(self.torch.uint8).fill_(0x5A)
        assert len(obj.byte_array) == 4096
        return Backend(name, be, obj)

    def close(self, backends):
        for b in backends:
            b.obj.ref_count_down()
            b.be.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        for local in self.locals:
            local.close()


class Backend:
    def __init__(self, name, be, obj):
        self.name, self.be, self.obj = name, be, obj
        if name == "ours":
            from lmcache_rawblock.raw_block import encode_legacy_key
        else:
            from lmcache.v1.storage_backend.raw_block import encode_legacy_key
        self._encode = encode_legacy_key
        from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface

        self._fanout = StorageBackendInterface.batched_remove  # the base-class per-key loop

    def populate(self, keys, step: int = 512):
        core = self.be._core
        for i in range(0, len(keys), step):
            part = keys[i:i + step]
            res = core.put_many([self._encode(k) for k in part], [self.obj] * len(part))
            if not all(res.results):
                raise RuntimeError(f"{self.name}: populate failed (device full?)")

    def remove(self, method: str, keys) -> int:
        if method == "fan-out":
            return self._fanout(self.be, keys, True)
        return self.be.batched_remove(keys, True)


def make_keys(n: int, base: int):
    import torch
    from lmcache.utils import CacheEngineKey

    return [CacheEngineKey("bench", 1, 0, base + i, torch.bfloat16) for i in range(n)]


# --------------------------------------------------------------------------- part 1


def seed_reproduction(backends, sizes, cycles, cycles_large, progress):
    """{(backend, N, method): [seconds...]}"""
    times = collections.defaultdict(list)
    keysets = {n: make_keys(n, 1 << 40) for n in sizes}
    for n in sizes:
        reps = cycles if n <= 1000 else cycles_large
        for rep in range(reps):
            order = ["fan-out", "override"] if rep % 2 == 0 else ["override", "fan-out"]
            bes = backends if rep % 2 == 0 else list(reversed(backends))
            for b in bes:
                for method in order:
                    keys = keysets[n]
                    b.populate(keys)
                    gc.collect()
                    gc.disable()
                    t0 = time.perf_counter()
                    removed = b.remove(method, keys)
                    dt = time.perf_counter() - t0
                    gc.enable()
                    if removed != n or b.be.indexed_key_count() != 0:
                        raise RuntimeError(f"{b.name} {method} N={n}: removed {removed}")
                    times[(b.name, n, method)].append(dt)
        progress(f"seed N={n}: done ({reps} cycles per cell)")
    return times


def breakdown(backends, n: int, cycles: int):
    """Where one override call's time goes, for N keys: {(backend, part): [seconds...]}."""
    keys = make_keys(n, 1 << 43)
    out = collections.defaultdict(list)
    for _ in range(cycles):
        for b in backends:
            gc.disable()
            t0 = time.perf_counter()
            enc = [k.to_string() for k in keys]
            out[(b.name, "key.to_string()")].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            [b._encode(k) for k in keys]
            out[(b.name, "encode_legacy_key(key)")].append(time.perf_counter() - t0)
            if b.name == "ours":
                from lmcache_rawblock import _native

                t0 = time.perf_counter()
                _native.encode_legacy_keys(keys)
                out[(b.name, "_native.encode_legacy_keys(keys)")].append(time.perf_counter() - t0)
            gc.enable()
            b.populate(keys)
            gc.disable()
            t0 = time.perf_counter()
            res = b.be._core.delete_many(enc, force=True)
            out[(b.name, "core.delete_many(pre-encoded)")].append(time.perf_counter() - t0)
            gc.enable()
            if sum(res) != n:
                raise RuntimeError("breakdown: delete_many removed too little")
            b.populate(keys)
            gc.disable()
            t0 = time.perf_counter()
            b.remove("override", keys)
            out[(b.name, "override batched_remove(keys)")].append(time.perf_counter() - t0)
            gc.enable()
            if b.name == "ours":
                from lmcache_rawblock import _native

                b.populate(keys)
                gc.collect()
                gc.disable()
                t0 = time.perf_counter()
                removed = _native.delete_legacy_keys(b.be._core._native, keys, True)
                out[(b.name, "fused _native.delete_legacy_keys(keys)")].append(time.perf_counter() - t0)
                gc.enable()
                if removed != n:
                    raise RuntimeError("breakdown: delete_legacy_keys removed too little")
                b.populate(keys)
                gc.collect()
                gc.disable()
                t0 = time.perf_counter()
                b.remove("override", keys)
                out[(b.name, "override after gc.collect()")].append(time.perf_counter() - t0)
                gc.enable()
    return out


# --------------------------------------------------------------------------- part 2


def contention_run(b: Backend, method: str, resident, victims, batch: int, contenders: int,
                   evict: bool, idle_seconds: float = 0.3):
    """(evict seconds, keys evicted/s, contender ops/s, p99 op latency s, max op latency s)."""
    be = b.be
    if evict:
        b.populate(victims)
    stop = threading.Event()
    go = threading.Barrier(contenders + 1)
    counts = [0] * contenders
    lat: list[list[float]] = [[] for _ in range(contenders)]
    clock = time.perf_counter

    def contend(t: int):
        mine = resident[t::contenders]
        record = lat[t].append
        n = 0
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
    if evict:
        removed = 0
        for i in range(0, len(victims), batch):
            removed += b.remove(method, victims[i:i + batch])
        if removed != len(victims):
            raise RuntimeError(f"{b.name} {method}: evicted {removed} of {len(victims)}")
    else:
        time.sleep(idle_seconds)
    dt = time.perf_counter() - t0
    stop.set()
    for th in threads:
        th.join()
    all_lat = sorted(x for xs in lat for x in xs)
    p99 = all_lat[int(0.99 * (len(all_lat) - 1))] if all_lat else float("nan")
    mx = all_lat[-1] if all_lat else float("nan")
    return dt, (len(victims) / dt if evict else 0.0), sum(counts) / dt, p99, mx


def contention(backends, runs, n_victims, batch, contenders, progress):
    resident = make_keys(256, 1 << 41)
    victims = make_keys(n_victims, 1 << 42)
    for b in backends:
        b.populate(resident)
    out = collections.defaultdict(list)
    for rep in range(runs):
        bes = backends if rep % 2 == 0 else list(reversed(backends))
        order = ["fan-out", "override"] if rep % 2 == 0 else ["override", "fan-out"]
        for b in bes:
            for method in order:
                gc.collect()
                out[(b.name, method)].append(contention_run(b, method, resident, victims, batch, contenders, True))
            out[(b.name, "idle")].append(contention_run(b, "idle", resident, victims, batch, contenders, False))
        progress(f"contention run {rep + 1}/{runs} done")
    for b in backends:
        b.be.batched_remove(resident)
    return out


# --------------------------------------------------------------------------- report


def med(xs):
    return statistics.median(xs)


def fmt_t(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def machine_description() -> str:
    try:
        from lmcache_rawblock.bench import common

        return common.machine_summary(common.machine_info())
    except Exception:  # noqa: BLE001
        return f"{platform.platform()}, {os.cpu_count()} CPUs"


def versions() -> str:
    import importlib.metadata as md

    parts = [f"Python {platform.python_version()}"]
    for dist in ("lmcache", "torch", "lmcache-rust-raw-block-io", "lmcache-rawblock"):
        try:
            parts.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    return ", ".join(parts)


def report(args, names, sizes, seed, parts, cont, workdir, elapsed) -> str:
    cmd = shlex.join([os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else sys.executable,
                      *sys.argv])
    L = []
    L.append("# Plugin benchmark: `batched_remove`, fan-out vs override\n")
    L.append(f"Command (repository root): `{cmd}`\n")
    L.append(f"Machine: {machine_description()}. Shared 2-core VM; figures are medians over interleaved "
             f"cycles and only the ratios are meant to be compared.\n")
    L.append(f"Software: {versions()}.\n")
    L.append(f"Device: sparse files in `{workdir}` (posix engine, buffered I/O), 4 KiB chunks, "
             f"`slot_bytes` 8192, `header_bytes` 4096, 16 MiB metadata region, periodic checkpoints off. "
             f"Backends loaded by LMCache's `storage_plugin_launcher` with a real LocalCPUBackend. "
             f"Run time {elapsed:.0f} s.\n")
    L.append("## 1. Seed reproduction: one `batched_remove(keys)` on a backend holding exactly those N keys\n")
    L.append("*fan-out* = LMCache's base class `StorageBackendInterface.batched_remove` "
             "(`remove(k, force)` per key: one pin-lock section and one `delete_many([k])` per key); "
             "*override* = the backend's own `batched_remove` (one lock section, one `delete_many(keys)`). "
             f"Cycles per cell: {args.cycles} (N <= 1000), {args.cycles_large} (N > 1000); each cycle "
             "re-populates N keys (untimed) and times one call.\n")
    L.append("| backend | N | fan-out | override | fan-out / override | per key (override) |")
    L.append("|---|---:|---:|---:|---:|---:|")
    for n in sizes:
        for name in names:
            f, o = med(seed[(name, n, "fan-out")]), med(seed[(name, n, "override")])
            L.append(f"| {name} | {n} | {fmt_t(f)} | {fmt_t(o)} | **{f / o:.2f}x** | {fmt_t(o / n)} |")
    if "lmcache" in names:
        L.append("\nOurs against LMCache's backend (LMCache time / our time, same method):\n")
        L.append("| N | fan-out: LMCache / ours | override: LMCache / ours | LMCache fan-out / our override |")
        L.append("|---:|---:|---:|---:|")
        for n in sizes:
            lf, lo = med(seed[("lmcache", n, "fan-out")]), med(seed[("lmcache", n, "override")])
            of, oo = med(seed[("ours", n, "fan-out")]), med(seed[("ours", n, "override")])
            L.append(f"| {n} | {lf / of:.2f}x | {lo / oo:.2f}x | {lf / oo:.2f}x |")
    if TARGET_N in sizes:
        f, o = med(seed[("ours", TARGET_N, "fan-out")]), med(seed[("ours", TARGET_N, "override")])
        ratio = f / o
        L.append(f"\n**Target**: our override >= {TARGET_RATIO:.0f}x faster than the fan-out on our backend "
                 f"at N = {TARGET_N}. Measured **{ratio:.2f}x** -> **{'met' if ratio >= TARGET_RATIO else 'NOT met'}**. "
                 f"Reference: {REFERENCE}.")
        if "lmcache" in names:
            lf, lo = med(seed[("lmcache", TARGET_N, "fan-out")]), med(seed[("lmcache", TARGET_N, "override")])
            L.append(f"LMCache's own backend at N = {TARGET_N}: fan-out / override = {lf / lo:.2f}x.\n")
    L.append(f"### Where the override's time goes (N = {TARGET_N}, medians over {args.cycles} cycles)\n")
    L.append("| backend | step | per call | per key |")
    L.append("|---|---|---:|---:|")
    for name in names:
        for part in ("key.to_string()", "encode_legacy_key(key)", "_native.encode_legacy_keys(keys)",
                     "core.delete_many(pre-encoded)", "override batched_remove(keys)",
                     "override after gc.collect()", "fused _native.delete_legacy_keys(keys)"):
            if (name, part) not in parts:
                continue
            t = med(parts[(name, part)])
            L.append(f"| {name} | `{part}` x {TARGET_N} | {fmt_t(t)} | {fmt_t(t / TARGET_N)} |")
    L.append("\nThe first five rows run right after populating (keys and index warm in cache); "
             "the last two, like section 1, after a `gc.collect()`. The fused call is not what "
             "`batched_remove` runs (see plugin-notes.md).\n")
    if cont:
        L.append("## 2. Contention: eviction in batches while pinning and looking up\n")
        L.append(f"{args.contenders} contender threads loop `contains(k)`, `pin(k)`, `unpin(k)` over 256 resident "
                 f"keys (3 ops per key) while one thread evicts {args.victims} other keys in batches of "
                 f"{args.batch}. Medians over {args.contention_runs} interleaved runs. *idle* = the contenders "
                 "with nobody evicting (0.3 s).\n")
        L.append("| backend | evictor | eviction time | evicted keys/s | contender ops/s | contender op p99 | op max |")
        L.append("|---|---|---:|---:|---:|---:|---:|")
        for name in names:
            for method in ("fan-out", "override", "idle"):
                rows = cont[(name, method)]
                t = med([r[0] for r in rows])
                kps = med([r[1] for r in rows])
                ops = med([r[2] for r in rows])
                p99 = med([r[3] for r in rows])
                mx = med([r[4] for r in rows])
                L.append(f"| {name} | {method} | {fmt_t(t) if method != 'idle' else '-'} | "
                         f"{f'{kps:,.0f}' if method != 'idle' else '-'} | {ops:,.0f} | {fmt_t(p99)} | {fmt_t(mx)} |")
        L.append("\nRatios (override against fan-out, same backend):\n")
        L.append("| backend | eviction throughput | contender ops/s |")
        L.append("|---|---:|---:|")
        for name in names:
            f, o = cont[(name, "fan-out")], cont[(name, "override")]
            L.append(f"| {name} | {med([r[1] for r in o]) / med([r[1] for r in f]):.2f}x | "
                     f"{med([r[2] for r in o]) / med([r[2] for r in f]):.2f}x |")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    try:
        import lmcache  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"error: needs the real LMCache and torch ({e}); run with .venv-lmcache/bin/python", file=sys.stderr)
        return 2
    import logging

    logging.disable(logging.WARNING)  # LMCache logs every plugin load at INFO/WARNING
    names = ["ours"]
    if not args.no_lmcache_backend:
        try:
            import lmcache_rust_raw_block_io as rust

            if getattr(rust, "__lmcache_rawblock__", False):
                raise ImportError("lmcache_rust_raw_block_io is our compat shim, not the Rust wheel")
            names.append("lmcache")
        except ImportError as e:
            print(f"note: LMCache's own backend skipped: {e}", file=sys.stderr)

    def progress(msg):
        print(msg, file=sys.stderr, flush=True)

    need = max(max(sizes), args.victims + 256) * 8192 + 32 * MiB
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_plugin.", dir=args.dir) as tmp:
        workdir = Path(tmp)
        env = Env(workdir, need)
        backends = [env.launch(n, OURS[1] if n == "ours" else LMC[1]) for n in names]
        try:
            seed = seed_reproduction(backends, sizes, args.cycles, args.cycles_large, progress)
            parts = breakdown(backends, TARGET_N, args.cycles)
            cont = contention(backends, args.contention_runs, args.victims, args.batch, args.contenders,
                              progress) if args.contention_runs > 0 else None
        finally:
            env.close(backends)
        text = report(args, names, sizes, seed, parts, cont, args.dir or tempfile.gettempdir(),
                      time.perf_counter() - t_start)
    print(text)
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
