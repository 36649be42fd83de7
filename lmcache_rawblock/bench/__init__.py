"""Benchmarks of lmcache_rawblock against the Rust wheel it replaces.

``run(options)`` drives the parts of a suite and returns the results dictionary that
``report`` prints and writes. Parts: device, uring, limit (RawBlockDevice against the Rust
wheel and fio, on the target), core (our RawBlockCore against LMCache's) and seeds (the
batched_remove and recovery-validation tables), the last two on sparse files of their own.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from . import common, device, limit
from . import core as core_suite
from . import seeds as seeds_suite
from .common import Competitor
from .target import Target, prefill

ENGINES = ("posix", "io_uring", "uring_cmd")
DEFAULT_ENGINES = ("posix", "io_uring")
PART_NAMES = ("device", "uring", "limit", "core", "seeds")
TARGET_PARTS = ("device", "uring", "limit")  # the parts that run on --device / the sparse target
URING_CMD_NOTE = ("uring_cmd: not measured: it needs an NVMe generic character device (/dev/ngXnY) with "
                  "io_uring passthrough, which neither implementation can use on a file")


@dataclass
class Options:
    suite: str = "quick"
    engines: list[str] = field(default_factory=lambda: list(DEFAULT_ENGINES))
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
        if p == "core" and not core_engines(opts):
            continue
        parts.append(p)
    return parts


def core_settings(opts: Options) -> core_suite.CoreSettings:
    s = replace(core_suite.SUITES[opts.suite])
    s.engines = core_engines(opts)
    if opts.repeats:
        s.repeats = s.cpu_repeats = opts.repeats
        s.repeats_large = min(s.repeats_large, opts.repeats)
    return s


def core_engines(opts: Options) -> list[str]:
    """The suite's core engines that --engines allows; else the first allowed core engine."""
    allowed = [e for e in opts.engines if e in ("posix", "io_uring")]
    picked = [e for e in core_suite.SUITES[opts.suite].engines if e in allowed]
    return picked or allowed[:1]


def seed_settings(opts: Options) -> seeds_suite.SeedSettings:
    s = replace(seeds_suite.SUITES[opts.suite])
    if opts.repeats:
        s.remove_cycles = s.recovery_repeats = opts.repeats
        s.remove_cycles_large = min(s.remove_cycles_large, opts.repeats)
    return s


def run(opts: Options, target: Target, comps: list[Competitor], notes: list[str] | None = None,
        core_comps: list[Competitor] | None = None) -> dict:
    """Run the planned parts. ``comps``: ours + the Rust wheel (device parts); ``core_comps``:
    our core + LMCache's (core and seeds parts; discovered here when not given)."""
    t0 = time.perf_counter()
    s, more_notes = settings_for(opts, target)
    notes = list(notes or []) + more_notes + list(target.notes)
    parts = planned_parts(opts)
    if "uring_cmd" in opts.engines:
        notes.append(URING_CMD_NOTE)
    if core_comps is None and ("core" in parts or "seeds" in parts):
        core_comps = [core_suite.ours_core(), core_suite.lmcache_core()]
    core_comps = core_comps or []
    cs = core_settings(opts) if "core" in parts else None
    ss = seed_settings(opts) if "seeds" in parts else None
    settings = {**s.describe(), "engines": list(opts.engines), "parts": parts}
    if cs:
        settings["core"] = cs.describe()
    if ss:
        settings["seeds"] = ss.describe()
    competitors = {c.name: c.describe() for c in comps}
    for c in core_comps:
        if c.name != "ours":
            competitors[c.name] = c.describe()
    results: dict[str, Any] = {
        "schema": 1,
        "tool": "python -m lmcache_rawblock bench",
        "machine": common.machine_info(opts.argv),
        "settings": settings,
        "target": target.describe(),
        "competitors": competitors,
        "notes": notes,
    }
    if not s.sizes:
        raise ValueError(f"no block size fits in the target ({common.fmt_size(target.size)})")

    steps = {
        "device": device.sync_steps(s),
        "uring": device.uring_steps(s),
        "limit": limit.limit_steps(s.sizes, limit.limit_depths(s.uring_depths), s.fio_passes),
    }
    if any(p in TARGET_PARTS for p in parts):
        prefill(target.path, s.region)
    workdir = tempfile.mkdtemp(prefix="lmcache_rawblock-bench-") if (cs or ss) else None
    runners: dict[str, Callable[[Any], dict]] = {
        "device": lambda bar: device.run_sync(target.path, comps, s, bar),
        "uring": lambda bar: device.run_uring(target.path, comps, s, bar),
        "limit": lambda bar: limit.run_limit(
            target.path, s.sizes, limit.limit_depths(s.uring_depths), s.region, s.fio_runtime_s, bar,
            passes=s.fio_passes,
        ),
        "core": lambda bar: core_suite.run_core(core_comps, cs, workdir, bar),
        "seeds": lambda bar: seeds_suite.run_seeds(core_comps, ss, workdir, bar),
    }
    if cs:
        steps["core"] = core_suite.steps(cs)
    if ss:
        steps["seeds"] = seeds_suite.steps(ss)
    total = sum(steps[p] for p in parts)
    if cs or ss:
        logging.disable(logging.WARNING)  # LMCache and the cores log every open at INFO/WARNING
    try:
        with common.progress(total, f"bench {opts.suite}", enabled=opts.progress) as bar:
            for p in parts:
                results[p] = runners[p](bar)
    finally:
        if cs or ss:
            logging.disable(logging.NOTSET)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    limit.attach_fractions(results)
    results["elapsed_s"] = time.perf_counter() - t0
    return results
