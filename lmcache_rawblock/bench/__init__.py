"""Benchmarks of lmcache_rawblock against the Rust wheel it replaces.

``run(options)`` drives the parts of a suite and returns the results dictionary that
``report`` prints and writes. Parts are registered in ``PARTS`` (device, uring, limit);
later suites (core, seeds) plug in the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from . import common, device, limit
from .common import Competitor
from .target import Target, prefill

ENGINES = ("posix", "io_uring")
PART_NAMES = ("device", "uring", "limit")


@dataclass
class Options:
    suite: str = "quick"
    engines: list[str] = field(default_factory=lambda: list(ENGINES))
    parts: list[str] = field(default_factory=lambda: list(PART_NAMES))
    sizes: list[int] | None = None
    repeats: int | None = None
    progress: bool = True
    argv: list[str] | None = None


def settings_for(opts: Options, target: Target) -> tuple[device.SuiteSettings, list[str]]:
    """The suite's settings adjusted to the options and the target; plus notes."""
    s = replace(device.SUITES[opts.suite])
    notes: list[str] = []
    if opts.sizes:
        s.sizes = sorted(set(opts.sizes))
    if opts.repeats:
        s.repeats = opts.repeats
    s.region = min(s.region, target.size)
    if s.region < max(s.sizes):
        # A small target still gets every size it can hold.
        s.region = target.size
    kept = [z for z in s.sizes if z <= s.region]
    dropped = [z for z in s.sizes if z > s.region]
    if dropped:
        notes.append(
            "sizes larger than the target were skipped: " + ", ".join(common.fmt_size(z) for z in dropped)
        )
    s.sizes = kept
    return s, notes


def planned_parts(opts: Options) -> list[str]:
    parts = []
    for p in opts.parts:
        if p == "device" and "posix" not in opts.engines:
            continue
        if p == "uring" and "io_uring" not in opts.engines:
            continue
        parts.append(p)
    return parts


def run(opts: Options, target: Target, comps: list[Competitor], notes: list[str] | None = None) -> dict:
    t0 = time.perf_counter()
    s, more_notes = settings_for(opts, target)
    notes = list(notes or []) + more_notes + list(target.notes)
    parts = planned_parts(opts)
    results: dict[str, Any] = {
        "schema": 1,
        "tool": "python -m lmcache_rawblock bench",
        "machine": common.machine_info(opts.argv),
        "settings": {**s.describe(), "engines": list(opts.engines), "parts": parts},
        "target": target.describe(),
        "competitors": {c.name: c.describe() for c in comps},
        "notes": notes,
    }
    if not s.sizes:
        raise ValueError(f"no block size fits in the target ({common.fmt_size(target.size)})")

    steps = {
        "device": device.sync_steps(s),
        "uring": device.uring_steps(s),
        "limit": limit.limit_steps(s.sizes, limit.limit_depths(s.uring_depths), s.fio_passes),
    }
    prefill(target.path, s.region)
    runners: dict[str, Callable[[Any], dict]] = {
        "device": lambda bar: device.run_sync(target.path, comps, s, bar),
        "uring": lambda bar: device.run_uring(target.path, comps, s, bar),
        "limit": lambda bar: limit.run_limit(
            target.path, s.sizes, limit.limit_depths(s.uring_depths), s.region, s.fio_runtime_s, bar,
            passes=s.fio_passes,
        ),
    }
    total = sum(steps[p] for p in parts)
    with common.progress(total, f"bench {opts.suite}", enabled=opts.progress) as bar:
        for p in parts:
            results[p] = runners[p](bar)
    limit.attach_fractions(results)
    results["elapsed_s"] = time.perf_counter() - t0
    return results
