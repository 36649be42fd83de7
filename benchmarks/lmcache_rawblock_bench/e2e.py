"""End-to-end part: the store and retrieve path an LMCache user sees, our ``RustRawBlockBackend``
against LMCache's own raw-block plugin on the Rust wheel, interleaved in one process.

Both plugins get LMCache's real ``LocalCPUBackend`` (its allocator, aligned for O_DIRECT and
registered as io_uring fixed buffers by each plugin) and real ``MemoryObj``s of the KV chunk
size of a model (256 tokens, bfloat16, K and V):

* ``1B``: 16 layers x 8 KV heads x head dim 64 (grouped-query attention) = 8 MiB per chunk;
* ``8B``: 32 layers x 8 KV heads x head dim 128 = 32 MiB per chunk.

Two configurations: ``odirect_uring`` (``use_odirect`` and ``use_uring`` true, as on an NVMe
device) and ``buffered_posix`` (page cache, posix engine). Each round, for each plugin in
alternating order: ``batched_submit_put_task`` of ``batch`` new chunks until every future is
done (store), then ``batched_get_blocking`` of those keys (retrieve), then single chunks stored
and retrieved on their own, then every key of the round is removed with ``batched_remove`` and
the plugin's background work that started is waited for (ours writes there the checkpoint that
makes the freed slots reusable; LMCache's plugin has none): timed as ``remove``, so that work
neither runs into the other plugin's measurements nor is left out of this one's. Bytes are
compared with what was stored in the first round. Per-chunk latency is one chunk stored or
retrieved on its own (``latency_samples`` per round; the first round's land on never-written
parts of the file for both plugins). CPU is ``time.process_time()`` of the whole process
(every thread, the event loop's and the plugins' included) per GB moved.

The device limit is fio on the same file (our plugin's, over its data region) with the chunk as
block size: ``io_uring``, O_DIRECT, registered buffers and ``iodepth`` = chunks per batch for
``odirect_uring``; ``psync`` through the page cache (not dropped before a run) for
``buffered_posix``. fio runs once per
round between the plugins. GB is 10^9 bytes.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .common import MiB, interleaved_order, median, remove_file, sparse
from .limit import FIO_INSTALL, run_fio
from .target import settle

GB = 1e9
TOKENS = 256
LMC_PLUGIN_MODULE = "lmcache.v1.storage_backend.plugins.rust_raw_block_backend"
OUR_PLUGIN_MODULE = "lmcache_rawblock.plugin"
META_BYTES = 16 * MiB
NOT_INSTALLED = ("LMCache is not importable in this Python ({why}): the end-to-end part needs its "
                 "LocalCPUBackend and MemoryObj; run it in the LMCache virtualenv "
                 "(make lmcache-venv, then .venv-lmcache/bin/python -m lmcache_rawblock bench --parts e2e)")


@dataclass(frozen=True)
class Model:
    label: str
    layers: int
    kv_heads: int
    head_dim: int

    def kv_shape(self, tokens: int) -> tuple:
        return (self.layers, 2, tokens, self.kv_heads, self.head_dim)

    def chunk_bytes(self, tokens: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * tokens * 2  # K and V, bfloat16


MODELS = {
    "1B": Model("1B-class, GQA: 16 layers, 8 KV heads, head dim 64", 16, 8, 64),
    "8B": Model("8B-class, GQA: 32 layers, 8 KV heads, head dim 128", 32, 8, 128),
    "tiny": Model("test size: 2 layers, 2 KV heads, head dim 32", 2, 2, 32),
}

CONFIGS = {
    "odirect_uring": {"rust_raw_block.use_odirect": True, "rust_raw_block.use_uring": True},
    "buffered_posix": {"rust_raw_block.use_odirect": False, "rust_raw_block.use_uring": False},
}
CONFIG_TEXT = {"odirect_uring": "O_DIRECT + io_uring, registered buffers", "buffered_posix": "page cache, posix"}


@dataclass
class E2ESettings:
    models: list[str]
    configs: list[str] = field(default_factory=lambda: list(CONFIGS))
    batch: int = 8  # chunks per store / retrieve call
    rounds: int = 5
    latency_samples: int = 4  # one-chunk stores and retrieves per plugin per round
    fio_loops: int = 2
    tokens: int = TOKENS
    skip: str | None = None  # why the suite does not run the part

    def describe(self) -> dict:
        return {"models": list(self.models), "configs": list(self.configs), "batch": self.batch,
                "rounds": self.rounds, "latency_samples": self.latency_samples, "fio_loops": self.fio_loops,
                "tokens": self.tokens, "skip": self.skip,
                "chunk_bytes": {m: MODELS[m].chunk_bytes(self.tokens) for m in self.models}}


SUITES = {
    "smoke": E2ESettings(models=["tiny"], batch=2, rounds=1, latency_samples=1, fio_loops=1, tokens=16),
    "quick": E2ESettings(models=["1B"], batch=4, rounds=2, latency_samples=2, fio_loops=1),
    "full": E2ESettings(models=["1B", "8B"], batch=8, rounds=6, latency_samples=4, fio_loops=2),
}


def steps(s: E2ESettings) -> int:
    return 0 if s.skip else len(s.models) * len(s.configs)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    rank = max(1, -(-len(vals) * q // 100))
    return vals[int(min(rank, len(vals))) - 1]


# --------------------------------------------------------------------------- LMCache objects


def lmcache_modules() -> tuple[dict | None, str | None]:
    """LMCache's classes the part needs, and the plugin classes; (None, why) when missing."""
    from .core import quiet_imports

    try:
        with quiet_imports():
            torch = importlib.import_module("torch")
            mods = {
                "torch": torch,
                "CacheEngineKey": importlib.import_module("lmcache.utils").CacheEngineKey,
                "LMCacheEngineConfig": importlib.import_module("lmcache.v1.config").LMCacheEngineConfig,
                "LMCacheMetadata": importlib.import_module("lmcache.v1.metadata").LMCacheMetadata,
                "LocalCPUBackend": importlib.import_module(
                    "lmcache.v1.storage_backend.local_cpu_backend").LocalCPUBackend,
            }
    except Exception as exc:  # noqa: BLE001 - lmcache imports torch and much more
        return None, NOT_INSTALLED.format(why=f"{type(exc).__name__}: {exc}")
    return mods, None


def plugin_classes() -> tuple[dict[str, Any], dict[str, str]]:
    """{"ours": class, "lmcache": class} and an error per plugin that could not be loaded."""
    from .core import quiet_imports

    classes: dict[str, Any] = {}
    errors: dict[str, str] = {}
    with quiet_imports():
        try:
            classes["ours"] = importlib.import_module(OUR_PLUGIN_MODULE).RustRawBlockBackend
        except Exception as exc:  # noqa: BLE001
            errors["ours"] = f"{type(exc).__name__}: {exc}"
        try:
            rust = importlib.import_module("lmcache_rust_raw_block_io")
            if getattr(rust, "__lmcache_rawblock__", False):
                raise ImportError("lmcache_rust_raw_block_io is our compat shim, not the Rust wheel")
            classes["lmcache"] = importlib.import_module(LMC_PLUGIN_MODULE).RustRawBlockBackend
        except Exception as exc:  # noqa: BLE001
            errors["lmcache"] = f"{type(exc).__name__}: {exc}"
    return classes, errors


class Stack:
    """One LocalCPUBackend (sized for the chunks a round holds) and a storage-manager-like event
    loop thread, shared by the plugins of one model and configuration."""

    def __init__(self, mods: dict, model: Model, config: str, s: E2ESettings, extra: dict):
        self.mods = mods
        torch = mods["torch"]
        self.chunk = model.chunk_bytes(s.tokens)
        self.metadata = mods["LMCacheMetadata"](
            model_name="e2e-bench", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
            kv_dtype=torch.bfloat16, kv_shape=model.kv_shape(s.tokens), chunk_size=s.tokens)
        held = 2 * s.batch + 4  # stored objects, retrieved objects, one-chunk objects
        self.cpu_gb = held * self.chunk / (1 << 30) * 1.25 + 0.01
        self.config = self.make_config(extra)
        self.local = mods["LocalCPUBackend"](self.config, self.metadata, "cpu")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="e2e-event-loop", daemon=True)
        self.thread.start()

    def make_config(self, extra: dict) -> Any:
        return self.mods["LMCacheEngineConfig"].from_defaults(
            chunk_size=self.metadata.chunk_size, max_local_cpu_size=self.cpu_gb, local_cpu=False,
            extra_config=dict(extra))

    def alloc(self, pattern: int | None) -> Any:
        torch = self.mods["torch"]
        obj = self.local.allocate(self.metadata.get_shapes(self.metadata.chunk_size)[0], torch.bfloat16)
        if obj is None:
            raise RuntimeError("LocalCPUBackend could not allocate a chunk")
        if pattern is not None:
            raw = obj.tensor.view(torch.uint8)
            g = torch.Generator().manual_seed(pattern)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))
        return obj

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        self.local.close()


def _extra(path: str, config: str) -> dict:
    extra = {"rust_raw_block.device_path": path, "rust_raw_block.meta_total_bytes": META_BYTES,
             "rust_raw_block.meta_enable_periodic": False, "rust_raw_block.load_checkpoint_on_init": False,
             "rust_raw_block.block_align": 4096}
    extra.update(CONFIGS[config])
    return extra


class Plugin:
    """One plugin under test on a sparse file of its own."""

    def __init__(self, name: str, cls: Any, stack: Stack, path: str, config: str):
        self.name, self.stack, self.path = name, stack, path
        self.be = cls(config=stack.make_config(_extra(path, config)), metadata=stack.metadata,
                      local_cpu_backend=stack.local, loop=stack.loop, dst_device="cpu")

    def store(self, keys: list, objs: list) -> None:
        futs = self.be.batched_submit_put_task(keys, objs)
        for f in futs or []:
            f.result(120)

    def retrieve(self, keys: list) -> list:
        return self.be.batched_get_blocking(keys)

    def remove(self, keys: list) -> int:
        """batched_remove, then the wait for the plugin's background work to end (ours writes
        the checkpoint that makes the freed slots reusable there), so it neither runs into the
        other plugin's measurements nor is left out of this plugin's."""
        n = self.be.batched_remove(keys, True)
        wait_idle = getattr(self.be, "wait_idle", None)
        if wait_idle is not None and not wait_idle(120):
            raise RuntimeError(f"{self.name}: background work still running 120 s after a remove")
        return n

    def close(self) -> None:
        try:
            self.be.close()
        except Exception:  # noqa: BLE001
            pass


def _release(objs: Sequence[Any]) -> None:
    for o in objs:
        if o is not None:
            o.ref_count_down()


# --------------------------------------------------------------------------- fio reference


def fio_command(path: str, config: str, rw: str, chunk: int, depth: int, offset: int, loops: int) -> list[str]:
    cmd = ["fio", "--name=e2e", f"--filename={path}", f"--rw={rw}", f"--bs={chunk}", f"--offset={offset}",
           f"--size={depth * chunk}", f"--loops={loops}", "--numjobs=1", "--thread", "--output-format=json"]
    if config == "odirect_uring":
        return cmd + ["--ioengine=io_uring", "--direct=1", "--fixedbufs", f"--iodepth={depth}"]
    # --invalidate=0: the plugins retrieve what they just stored through the page cache; so does fio
    return cmd + ["--ioengine=psync", "--direct=0", "--iodepth=1", "--invalidate=0"]


# --------------------------------------------------------------------------- one model x configuration


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def measure_case(mods: dict, classes: dict[str, Any], model_name: str, config: str, s: E2ESettings,
                 workdir: str, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> dict:
    """Every round: each plugin stores and retrieves a batch and single chunks; fio once."""
    model = MODELS[model_name]
    torch = mods["torch"]
    key_cls = mods["CacheEngineKey"]
    chunk = model.chunk_bytes(s.tokens)
    slot = -(-(4096 + chunk) // 4096) * 4096
    size = META_BYTES + (s.batch + s.latency_samples + 4) * slot + 4 * MiB
    stack = Stack(mods, model, config, s, _extra("", config))
    plugins: list[Plugin] = []
    errors: dict[str, str] = {}
    out: dict[str, Any] = {"model": model_name, "config": config, "chunk_bytes": chunk, "errors": errors}
    try:
        for name, cls in classes.items():
            path = sparse(os.path.join(workdir, f"e2e-{model_name}-{config}-{name}.img"), size)
            try:
                plugins.append(Plugin(name, cls, stack, path, config))
            except Exception as exc:  # noqa: BLE001
                errors[name] = f"{type(exc).__name__}: {exc}"
                remove_file(path)
        src = [stack.alloc(1000 + i) for i in range(s.batch)]
        single = stack.alloc(7)
        want = [bytes(o.byte_array) for o in src]
        data: dict[str, dict[str, list[float]]] = {
            p.name: {k: [] for k in ("store_s", "retrieve_s", "store_cpu_s", "retrieve_cpu_s", "store_one_s",
                                     "retrieve_one_s", "remove_s")} for p in plugins}
        fio: dict[str, list[float]] = {"write": [], "read": []}
        fio_cmds: dict[str, list[str]] = {}
        fio_error = None if shutil.which("fio") else FIO_INSTALL
        serial = 0
        verified: dict[str, bool] = {}
        for rnd in range(s.rounds):
            order: list[Any] = list(plugins) + (["fio"] if fio_error is None and plugins else [])
            for p in interleaved_order(rnd, order):
                if p == "fio":
                    ref = plugins[0]
                    offset = ref.be.data_base_offset if hasattr(ref.be, "data_base_offset") else META_BYTES
                    if config == "odirect_uring":
                        settle(ref.path, size)
                    try:
                        for rw in ("write", "read"):
                            cmd = fio_command(ref.path, config, rw, chunk, s.batch, offset, s.fio_loops)
                            fio_cmds[rw] = cmd
                            fio[rw].append(run_fio(cmd, rw, run)["bw_bytes"])
                    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
                        fio_error = f"{type(exc).__name__}: {exc}"
                    continue
                d = data[p.name]
                keys = [key_cls("e2e-bench", 1, 0, 0x5E000000 + serial + i, torch.bfloat16) for i in range(s.batch)]
                serial += s.batch
                _, dt, cpu = _timed(lambda: p.store(keys, src))
                d["store_s"].append(dt)
                d["store_cpu_s"].append(cpu)
                got, dt, cpu = _timed(lambda: p.retrieve(keys))
                d["retrieve_s"].append(dt)
                d["retrieve_cpu_s"].append(cpu)
                try:
                    if any(g is None for g in got):
                        raise RuntimeError(f"{p.name}: retrieved {sum(g is not None for g in got)} of {len(keys)}")
                    if p.name not in verified:
                        verified[p.name] = all(bytes(g.byte_array) == w for g, w in zip(got, want))
                        if not verified[p.name]:
                            raise RuntimeError(f"{p.name}: retrieved bytes differ from the stored ones")
                finally:
                    _release(got)
                for _ in range(s.latency_samples):
                    k = key_cls("e2e-bench", 1, 0, 0x5F000000 + serial, torch.bfloat16)
                    serial += 1
                    _, dt, _ = _timed(lambda: p.store([k], [single]))
                    d["store_one_s"].append(dt)
                    one, dt, _ = _timed(lambda: p.be.get_blocking(k))
                    if one is None:
                        raise RuntimeError(f"{p.name}: a chunk stored on its own was not retrieved")
                    d["retrieve_one_s"].append(dt)
                    _release([one])
                    keys.append(k)
                removed, dt, _ = _timed(lambda: p.remove(keys))
                d["remove_s"].append(dt)
                if removed != len(keys):
                    raise RuntimeError(f"{p.name}: not every key of the round was removed")
        _release(src + [single])
        moved = s.batch * chunk
        fio_w, fio_r = median(fio["write"]), median(fio["read"])
        rows = []
        for p in plugins:
            d = data[p.name]
            st, rt = median(d["store_s"]), median(d["retrieve_s"])
            row = {"model": model_name, "config": config, "backend": p.name, "chunk_bytes": chunk,
                   "batch": s.batch, "rounds": s.rounds, "bytes_match": verified.get(p.name, False),
                   "store_bytes_per_s": moved / st if st else None,
                   "retrieve_bytes_per_s": moved / rt if rt else None,
                   "store_cpu_s_per_gb": median(d["store_cpu_s"]) / (moved / GB),
                   "retrieve_cpu_s_per_gb": median(d["retrieve_cpu_s"]) / (moved / GB),
                   "store_p50_s": percentile(d["store_one_s"], 50), "store_p99_s": percentile(d["store_one_s"], 99),
                   "retrieve_p50_s": percentile(d["retrieve_one_s"], 50),
                   "retrieve_p99_s": percentile(d["retrieve_one_s"], 99),
                   "remove_p50_s": percentile(d["remove_s"], 50),
                   "latency_samples": len(d["store_one_s"]),
                   "fio_write_bytes_per_s": fio_w, "fio_read_bytes_per_s": fio_r, "samples_s": d}
            row["store_of_limit"] = row["store_bytes_per_s"] / fio_w if fio_w and row["store_bytes_per_s"] else None
            row["retrieve_of_limit"] = (row["retrieve_bytes_per_s"] / fio_r
                                        if fio_r and row["retrieve_bytes_per_s"] else None)
            rows.append(row)
        out.update({"rows": rows, "fio_error": fio_error, "fio_commands": fio_cmds,
                    "fio_samples_bytes_per_s": fio})
        return out
    finally:
        for p in plugins:
            p.close()
            remove_file(p.path)
        stack.close()


RATIO_KEYS = ("store_bytes_per_s", "retrieve_bytes_per_s", "store_p50_s", "retrieve_p50_s",
              "store_cpu_s_per_gb", "retrieve_cpu_s_per_gb")


def ratios(rows: list[dict]) -> list[dict]:
    """ours / LMCache's plugin for each model and configuration measured with both."""
    out = []
    by = {(r["model"], r["config"], r["backend"]): r for r in rows}
    for (model, config, backend), ours in by.items():
        theirs = by.get((model, config, "lmcache"))
        if backend != "ours" or theirs is None:
            continue
        row = {"model": model, "config": config}
        for k in RATIO_KEYS:
            a, b = ours.get(k), theirs.get(k)
            row[k] = a / b if a is not None and b else None
        out.append(row)
    return out


# --------------------------------------------------------------------------- the part


def run_e2e(s: E2ESettings, workdir: str, bar: Any,
            run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> dict:
    out: dict[str, Any] = {"settings": s.describe(), "rows": [], "ratios": [], "cases": [], "errors": {},
                           "skipped": None}
    if s.skip:
        out["skipped"] = s.skip
        return out
    mods, why = lmcache_modules()
    if mods is None:
        out["skipped"] = why
        bar.update(steps(s))
        return out
    classes, errors = plugin_classes()
    out["errors"].update(errors)
    if not classes:
        out["skipped"] = "neither plugin could be loaded"
        bar.update(steps(s))
        return out
    for model in s.models:
        for config in s.configs:
            bar.set_description_str(f"e2e {model} {config}")
            try:
                case = measure_case(mods, classes, model, config, s, workdir, run)
            except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
                out["errors"][f"{model} {config}"] = f"{type(exc).__name__}: {exc}"
                bar.update(1)
                continue
            for name, err in case.pop("errors").items():
                out["errors"][f"{model} {config} {name}"] = err
            out["rows"] += case.pop("rows")
            out["cases"].append(case)
            bar.update(1)
    out["ratios"] = ratios(out["rows"])
    return out
