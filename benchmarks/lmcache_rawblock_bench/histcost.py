"""Histogram-cost part: what recording the core's histograms costs a put and a load (ours only).

The core times every ``put_many`` / ``load_many_into`` call (two clock reads), samples the
bytes in flight, counts each key's outcome and, on io_uring, stamps each batch when it is handed
to the engine and when the kernel takes it (``_native.set_histograms`` turns all of it off).
This part runs one core per cell with recording off and on, side by side in one process: in
each round both modes, the order alternating (off, on / on, off / ...), each timing ``calls``
back-to-back calls of all ``keys`` keys. CPU is ``time.process_time()`` of the process (all
threads: the io_uring worker is counted).

Grid: engine (posix, io_uring) x operation (put, load) x chunk size (64 KiB, 8 MiB), on a file
in ``/dev/shm`` (page cache, memory speed: the device hides nothing) or the scratch directory.

Figures per cell: median CPU and wall time per call in each mode; the ratio *on / off* of CPU
per round, its median and 95 % confidence interval. On a shared machine that ratio's noise
(a few %) is larger than the cost, so each cell also times the recording itself: the same
inline functions a load call of ``keys`` keys runs (clock reads, bytes in flight, an outcome per
key, the counters, and on io_uring one batch's stamps), in a C loop on a scratch histogram
(``_native.Core._recording_cost_ns``). The verdict: that time per call over the CPU of one 64 KiB
load call with recording off, for the batch the cell loads and for a call of one key. The goal
is at most 1 %.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from .common import KiB, MiB, median
from .core import PlainObj, close_core, object_keys, open_core, ours_core
from .loadcheck import median_ci
from .target import scratch_dir

ENGINES = ("posix", "io_uring")
OPS = ("put", "load")
MODES = ("off", "on")
GOAL = 0.01  # recording costs at most 1 % of a 64 KiB load's CPU
TMPFS_DIR = "/dev/shm"
REC_ITERS = 50_000
REC_RUNS = 9  # the least of several short runs: the cost without the other jobs of a busy machine


@dataclass
class HistCostSettings:
    chunks: list[tuple[int, int]]  # (chunk bytes, keys per call)
    rounds: int
    calls: int
    engines: list[str] = field(default_factory=lambda: list(ENGINES))
    warmup: int = 1

    def describe(self) -> dict:
        return {"chunks": [{"chunk_bytes": s, "keys": k} for s, k in self.chunks], "rounds": self.rounds,
                "calls": self.calls, "engines": list(self.engines), "warmup": self.warmup, "goal_share": GOAL,
                "order": "off,on in even rounds, on,off in odd rounds"}


SUITES = {
    "smoke": HistCostSettings(chunks=[(64 * KiB, 4)], rounds=2, calls=1, warmup=0),
    "quick": HistCostSettings(chunks=[(64 * KiB, 64), (8 * MiB, 8)], rounds=15, calls=8),
    "full": HistCostSettings(chunks=[(64 * KiB, 64), (8 * MiB, 8)], rounds=41, calls=16),
}


def steps(s: HistCostSettings) -> int:
    return len(s.engines) * len(s.chunks)


def _directory() -> str:
    return TMPFS_DIR if os.path.isdir(TMPFS_DIR) and os.access(TMPFS_DIR, os.W_OK) else scratch_dir()


def _timed(fn: Any, calls: int, before: Any = None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per call of ``calls`` calls of fn, each after an untimed
    ``before()`` when given."""
    cpu = wall = 0.0
    for _ in range(calls):
        if before is not None:
            before()
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu += time.process_time() - c0
        wall += time.perf_counter() - w0
    return cpu / calls, wall / calls


def _cell_figures(samples: dict[str, dict[str, list[tuple[float, float]]]]) -> dict:
    out: dict[str, Any] = {}
    for op in OPS:
        cpu = {m: [s[0] for s in samples[op][m]] for m in MODES}
        wall = {m: [s[1] for s in samples[op][m]] for m in MODES}
        ratios = [on / off for on, off in zip(cpu["on"], cpu["off"]) if off > 0]
        lo, hi = median_ci(ratios)
        out[op] = {"cpu_s_off": median(cpu["off"]), "cpu_s_on": median(cpu["on"]),
                   "wall_s_off": median(wall["off"]), "wall_s_on": median(wall["on"]),
                   "cpu_ratio_median": median(ratios) if ratios else None, "cpu_ratio_ci95": [lo, hi],
                   "rounds": len(ratios)}
    return out


def measure_cell(engine: str, size: int, keys: int, s: HistCostSettings, directory: str) -> dict:
    slot = size + 4096
    path = os.path.join(directory, f"histcost-{os.getpid()}-{engine}-{size}.img")
    meta = 4 * MiB
    with open(path, "wb") as f:
        f.truncate(meta + slot * keys * 3)
    core = open_core(ours_core(), path, slot_bytes=slot, meta_total_bytes=meta, io_engine=engine)
    try:
        enc = object_keys(keys, tag=f"histcost-{size}")
        src = [PlainObj(size, fill=i % 251 + 1) for i in range(keys)]
        dst = [PlainObj(size) for _ in range(keys)]
        codes = [k.encoded for k in enc]
        def put() -> None:
            if not all(core.put_many(enc, src).results):
                raise RuntimeError(f"histcost: a put was refused ({engine}, {size} bytes)")

        def make_room() -> None:  # the slots of the keys' last copies back in use (untimed)
            core.delete_many(codes)
            core.checkpoint_now()

        put()
        ops = {"put": (put, make_room), "load": (lambda: core.load_many_into(codes, dst), None)}
        if core.load_many_into(codes, dst) != [True] * keys:
            raise RuntimeError(f"histcost: a load after the first put missed ({engine}, {size} bytes)")
        samples: dict[str, dict[str, list[tuple[float, float]]]] = {op: {m: [] for m in MODES} for op in OPS}
        gc.disable()
        try:
            for r in range(-s.warmup, s.rounds):
                for op in OPS:
                    for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                        core._native.set_histograms(mode == "on")
                        got = _timed(ops[op][0], s.calls, ops[op][1])
                        if r >= 0:
                            samples[op][mode].append(got)
        finally:
            gc.enable()
        core._native.set_histograms(True)
        rec = {k: min(core._native._recording_cost_ns(REC_ITERS, k, engine == "io_uring") for _ in range(REC_RUNS))
               for k in {1, keys}}
        h = core._native.histograms()
        return {"engine": engine, "chunk_bytes": size, "keys": keys, **_cell_figures(samples),
                "recording_ns_per_call": rec[keys], "recording_ns_one_key_call": rec[1],
                "recorded_loads": h["histograms"]["load_ns"]["count"], "recorded_puts": h["histograms"]["put_ns"]["count"],
                "latency": {k: h["histograms"][k] for k in ("put_ns", "load_ns")}}
    finally:
        close_core(core)
        try:
            os.unlink(path)
        except OSError:
            pass


def run_histcost(s: HistCostSettings, bar: Any) -> dict:
    directory = _directory()
    work = tempfile.mkdtemp(prefix="rb-histcost-", dir=directory)
    rows = []
    try:
        for engine in s.engines:
            for size, keys in s.chunks:
                rows.append(measure_cell(engine, size, keys, s, work))
                bar.update(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"settings": s.describe(), "directory": directory, "rows": rows, "verdict": verdict(rows)}


def verdict(rows: list[dict]) -> dict:
    """The cost against the goal, per engine, for 64 KiB loads: the recording's time per call
    (C loop) over the CPU of a load call with recording off, for the cell's batch and for a
    call of one key (the off CPU per key); the batch's largest share is the headline."""
    batch, one = {}, {}
    for r in rows:
        ld = r["load"]
        if r["chunk_bytes"] != 64 * KiB or not ld["cpu_s_off"]:
            continue
        batch[r["engine"]] = r["recording_ns_per_call"] * 1e-9 / ld["cpu_s_off"]
        one[r["engine"]] = r["recording_ns_one_key_call"] * 1e-9 / (ld["cpu_s_off"] / r["keys"])
    worst = max(batch.values()) if batch else None
    return {"load_64k_batch_share": batch, "load_64k_one_key_share": one, "worst": worst, "goal": GOAL,
            "met": worst is not None and worst <= GOAL}
