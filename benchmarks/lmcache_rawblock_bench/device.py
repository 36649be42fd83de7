"""Device parts: synchronous per-call latency and io_uring batches, ours against the Rust wheel.

Both implementations (ours and, when importable, the Rust wheel) are measured in this one
process. Each measurement cell (operation, mode, size) runs ``repeats`` rounds; in every
round each implementation times one batch of ``calls`` identical-shape calls, and the order
of the implementations alternates between rounds. Reported figures are medians.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Callable, Sequence

from .common import (
    MiB,
    Competitor,
    aligned_buffer,
    fmt_size,
    interleave,
    median,
    ratio,
    spread,
)
from .target import settle, sync_file, warm

SYNC_OPS = ("pread_into", "pwrite_from_buffer")
MODES = ("buffered", "odirect")
BATCH_OPS = ("batched_write", "batched_read")


@dataclass
class SuiteSettings:
    name: str
    sizes: list[int]
    repeats: int
    target_batch_s: float  # wall time one timed batch aims for
    min_calls: int
    max_calls: int
    region: int  # bytes at the start of the target that the suites touch
    modes: list[str] = field(default_factory=lambda: list(MODES))
    ops: list[str] = field(default_factory=lambda: list(SYNC_OPS))
    uring_depths: list[int] = field(default_factory=lambda: [64, 256])
    # fio against our io_uring stream: (fio rw, block size, queue depth), seconds per run, rounds
    limit_cases: list[tuple[str, int, int]] = field(default_factory=list)
    limit_seconds: float = 1.0
    limit_rounds: int = 2

    def describe(self) -> dict:
        return {
            "suite": self.name,
            "sizes": list(self.sizes),
            "repeats": self.repeats,
            "target_batch_s": self.target_batch_s,
            "min_calls": self.min_calls,
            "max_calls": self.max_calls,
            "region_bytes": self.region,
            "modes": list(self.modes),
            "ops": list(self.ops),
            "uring_depths": list(self.uring_depths),
            "limit_cases": [list(c) for c in self.limit_cases],
            "limit_seconds": self.limit_seconds,
            "limit_rounds": self.limit_rounds,
        }


DEFAULT_SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20]
SEQ_1M = [("read", MiB, 32), ("write", MiB, 32)]
RAND_4K = [("randread", 4 << 10, 64)]

SUITES: dict[str, SuiteSettings] = {
    # Hidden: a few calls at 4 KiB, for tests of the CLI itself.
    "smoke": SuiteSettings(
        name="smoke", sizes=[4 << 10], repeats=1, target_batch_s=0.001, min_calls=3, max_calls=64,
        region=4 * MiB, uring_depths=[4], limit_cases=[("read", 4 << 10, 4), ("write", 4 << 10, 4)],
        limit_seconds=0.2, limit_rounds=1,
    ),
    "quick": SuiteSettings(
        name="quick", sizes=list(DEFAULT_SIZES), repeats=7, target_batch_s=0.01, min_calls=3,
        max_calls=20000, region=128 * MiB, uring_depths=[64, 256], limit_cases=SEQ_1M + RAND_4K,
        limit_seconds=1.0, limit_rounds=2,
    ),
    "full": SuiteSettings(
        name="full", sizes=list(DEFAULT_SIZES), repeats=15, target_batch_s=0.04, min_calls=5,
        max_calls=200000, region=512 * MiB, uring_depths=[1, 8, 64, 256],
        limit_cases=[("read", MiB, 16), ("write", MiB, 16)] + SEQ_1M + RAND_4K, limit_seconds=3.0,
        limit_rounds=3,
    ),
}


def sync_steps(s: SuiteSettings) -> int:
    return len(s.modes) * len(s.sizes) * len(s.ops)


def uring_steps(s: SuiteSettings) -> int:
    return len(s.modes) * len(s.sizes) * len(s.uring_depths) * len(BATCH_OPS)


# --------------------------------------------------------------------------- timing loops
# The same loop times every implementation, so its own overhead (tens of ns) is shared.


def _loop_read(meth: Any, offsets: Sequence[int], buf: Any, n: int) -> float:
    t0 = perf_counter()
    for off in offsets:
        meth(off, buf, n)
    return perf_counter() - t0


def _loop_write(meth: Any, offsets: Sequence[int], buf: Any) -> float:
    t0 = perf_counter()
    for off in offsets:
        meth(off, buf)
    return perf_counter() - t0


def _time_sync(dev: Any, op: str, offsets: Sequence[int], buf: Any, size: int) -> float:
    if op == "pread_into":
        return _loop_read(dev.pread_into, offsets, buf, size)
    return _loop_write(dev.pwrite_from_buffer, offsets, buf)


def _loop_batched(submit: Any, wait: Any, batches: Sequence[list[int]], bufs: list, lens: list[int]) -> float:
    t0 = perf_counter()
    for offs in batches:
        _ok, errors = wait(submit(offs, bufs, lens))
        if errors:
            raise RuntimeError(f"batched I/O failed: {errors[:3]}")
    return perf_counter() - t0


def _calls_for(per_call: float, s: SuiteSettings) -> int:
    if per_call <= 0:
        return s.max_calls
    return max(s.min_calls, min(s.max_calls, math.ceil(s.target_batch_s / per_call)))


def _offsets(count: int, size: int, region: int, start: int = 0) -> list[int]:
    slots = max(1, region // size)
    return [((start + i) % slots) * size for i in range(count)]


def _prepare(path: str, mode: str, region: int) -> None:
    """O_DIRECT: nothing of the region dirty or cached; buffered: the region in the page cache."""
    if mode == "odirect":
        settle(path, region)
    else:
        warm(path, region)


def _open_all(comps: list[Competitor], path: str, failed: Callable[[str, str], None], **kw: Any) -> dict[str, Any]:
    """Each competitor's device on path; a device that cannot be opened is reported, not fatal."""
    devs: dict[str, Any] = {}
    for c in comps:
        try:
            devs[c.name] = c.cls(path, True, **kw)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none is fatal
            failed(c.name, f"{type(exc).__name__}: {exc}")
    return devs


# --------------------------------------------------------------------------- sync suite


def run_sync(path: str, comps: list[Competitor], s: SuiteSettings, bar: Any) -> dict:
    """Per-call latency of pread_into / pwrite_from_buffer for each mode and size."""
    comps = [c for c in comps if c.available]
    rows: list[dict] = []
    errors: dict[str, str] = {}
    for mode in s.modes:
        _prepare(path, mode, s.region)
        devs = _open_all(comps, path, lambda name, err: errors.__setitem__(
            f"{name}/{mode}", f"cannot open {path} ({mode}): {err}"), use_odirect=(mode == "odirect"))
        try:
            for size in s.sizes:
                buf = aligned_buffer(size)
                for op in s.ops:
                    bar.set_description_str(f"device {op} {mode} {fmt_size(size)}")
                    if "ours" not in devs or size > s.region:
                        bar.update(1)
                        continue
                    rows.append(_measure_sync(devs, op, mode, size, buf, s))
                    bar.update(1)
        finally:
            for dev in devs.values():
                dev.close()
    return {"results": rows, "errors": errors}


def _measure_sync(devs: dict[str, Any], op: str, mode: str, size: int, buf: Any, s: SuiteSettings) -> dict:
    names = list(devs)
    # Calibrate the batch length on ours, then warm every implementation with it.
    cursor = 0

    def next_offsets(count: int) -> list[int]:
        # Every batch walks on through the region, so no implementation re-reads blocks that
        # the other one (or its own previous batch) just brought into a cache below us.
        nonlocal cursor
        offs = _offsets(count, size, s.region, start=cursor)
        cursor += count
        return offs

    probe = next_offsets(s.min_calls)
    for _ in range(2):
        per = _time_sync(devs["ours"], op, probe, buf, size) / len(probe)
    calls = _calls_for(per, s)
    warm = next_offsets(max(1, min(calls, 32)))
    for name in names:
        _time_sync(devs[name], op, warm, buf, size)
    samples = interleave(names, s.repeats,
                         lambda name, _r: _time_sync(devs[name], op, next_offsets(calls), buf, size) / calls)
    ours_s = median(samples["ours"])
    rust_s = median(samples["rust"]) if "rust" in samples else None
    return {
        "op": op,
        "mode": mode,
        "engine": "posix",
        "size": size,
        "calls": calls,
        "repeats": s.repeats,
        "ours_s": ours_s,
        "rust_s": rust_s,
        "ratio": ratio(ours_s, rust_s),
        "ours_spread": spread(samples["ours"]),
        "rust_spread": spread(samples["rust"]) if "rust" in samples else None,
        "ours_bytes_per_s": size / ours_s if ours_s else None,
        "rust_bytes_per_s": size / rust_s if rust_s else None,
        "samples_s": samples,
    }


# --------------------------------------------------------------------------- io_uring suite


def run_uring(path: str, comps: list[Competitor], s: SuiteSettings, bar: Any) -> dict:
    """Time per batch of batched_read / batched_write + wait_iouring, per mode, size and depth."""
    comps = [c for c in comps if c.available]
    rows: list[dict] = []
    errors: dict[str, str] = {}
    opened: dict[str, bool] = {c.name: False for c in comps}
    for mode in s.modes:
        _prepare(path, mode, s.region)
        devs = _open_all(comps, path, lambda name, err: errors.setdefault(
            name, f"io_uring engine not available: {err}"), use_odirect=(mode == "odirect"), io_engine="io_uring",
            iouring_queue_depth=max(s.uring_depths))
        opened.update({name: True for name in devs})
        try:
            for size in s.sizes:
                for depth in s.uring_depths:
                    bufs = [aligned_buffer(size) for _ in range(depth)] if "ours" in devs else []
                    for op in BATCH_OPS:
                        bar.set_description_str(f"io_uring {op} {mode} {depth} x {fmt_size(size)}")
                        if "ours" in devs and size * depth <= s.region:
                            rows.append(_measure_batched(devs, op, mode, size, depth, bufs, s))
                        bar.update(1)
                    if mode == "buffered":
                        sync_file(path)  # write back what the writes dirtied before the next cell
        finally:
            for dev in devs.values():
                dev.close()
    return {"available": opened, "errors": errors, "results": rows}


def _batches(count: int, size: int, depth: int, region: int, start: int = 0) -> list[list[int]]:
    slots = max(depth, region // size)
    return [[(((start + b) * depth + i) % slots) * size for i in range(depth)] for b in range(count)]


def _measure_batched(devs: dict[str, Any], op: str, mode: str, size: int, depth: int, bufs: list,
                     s: SuiteSettings) -> dict:
    names = list(devs)
    lens = [size] * depth
    first = names[0]

    def run(name: str, batches: list[list[int]]) -> float:
        dev = devs[name]
        return _loop_batched(getattr(dev, op), dev.wait_iouring, batches, bufs, lens)

    cursor = 0

    def next_batches(n: int) -> list[list[int]]:
        nonlocal cursor
        out = _batches(n, size, depth, s.region, start=cursor)
        cursor += n
        return out

    per = min(run(first, next_batches(2)), run(first, next_batches(2))) / 2
    count = max(1, min(s.max_calls, math.ceil(s.target_batch_s * 2 / per) if per > 0 else 1))
    for name in names:
        run(name, next_batches(2))
    samples = interleave(names, s.repeats, lambda name, _r: run(name, next_batches(count)) / count)
    per_batch = {n: median(v) for n, v in samples.items()}
    nbytes = size * depth
    row = {
        "op": op,
        "engine": "io_uring",
        "mode": mode,
        "size": size,
        "depth": depth,
        "batches": count,
        "repeats": s.repeats,
        "samples_s": samples,
    }
    for name in ("ours", "rust"):
        t = per_batch.get(name)
        row[f"{name}_batch_s"] = t
        row[f"{name}_bytes_per_s"] = nbytes / t if t else None
        row[f"{name}_spread"] = spread(samples[name]) if name in samples else None
    row["ratio"] = ratio(row["ours_batch_s"], row["rust_batch_s"])
    return row
