"""Benchmarks of lmcache_rawblock against what it replaces: LMCache's Rust device, LMCache's
Python core and plugin, and fio.

``run(options)`` drives the parts of a suite and returns the results dictionary that
``report`` prints and writes. Parts on the target (``--device`` or a temporary sparse file):
device (per-call latency against the Rust device), uring (io_uring batches against the Rust
device), limit (our io_uring engine streaming against fio). Parts on sparse files of their own:
core (our RawBlockCore against LMCache's, with per-key CPU beside the kernel floor and the
checkpoint flush cost), recovery (slot-header validation, sequential against batched),
plugin (batched_remove fan-out against the override, and eviction under contention) and e2e
(LMCache's plugin store and retrieve path with its LocalCPUBackend, ours against LMCache's, and fio),
mp (LMCache's MP-mode L2 tier under its kv-tier-pressure workload's requests: our MP adapter against
LMCache's raw-block adapter on the Rust wheel), mpevict (MP mode's L2 eviction over extents:
LMCache's LRU controller against our adapter's whole-extent eviction: hit ratio, extents freed
whole, puts into partly live extents) and scale (both metadata formats and LMCache's core against index size: the checkpoint after churn
beside a full base, bytes per entry, reopen time beside fio, index memory, and what a put costs on
a full cache). On capped RAM devices of its own (``rig``, root): drives (store and load bandwidth
over N devices as a share of N x cap beside fio and LMCache's core, CPU per GB against N, load
latency under stores); loadcost (cost-aware loads: the share of loads that finish after a recompute
and the mean time to data, with and without the priced prefix lookup, while stores saturate the
capped devices).
Ours only: prefix (prefix-aware eviction against LRU, a multi-turn conversation trace replayed
through the plugin at 25/50/100 % of its working set: tokens served, reachable bytes, per-put
CPU); on files of its own on tmpfs and on disk: loadcheck (what the load-time slot-header
check costs a load, the check on against off on one core) and dealloc (what deallocating freed
slots costs an eviction batch and the puts after it, on against off, on a file and a loop device).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from . import common, device, limit
from . import core as core_suite
from . import dealloc as dealloc_suite
from . import drives as drives_suite
from . import e2e as e2e_suite
from . import histcost as histcost_suite
from . import loadcheck as loadcheck_suite
from . import loadcost as loadcost_suite
from . import mp as mp_suite
from . import mpevict as mpevict_suite
from . import prefix as prefix_suite
from . import plugin as plugin_suite
from . import recovery as recovery_suite
from . import scale as scale_suite
from .common import Competitor
from .target import Target, make_workdir, prefill

ENGINES = ("posix", "io_uring", "uring_cmd")
DEFAULT_ENGINES = ("posix", "io_uring")
PART_NAMES = ("device", "uring", "limit", "core", "recovery", "plugin", "e2e", "mp", "mpevict", "loadcheck", "dealloc", "scale",
              "histcost", "prefix", "drives", "loadcost")
# drives and loadcost need root and move the process into a blkio group: asked for by name only
RIG_PARTS = ("drives", "loadcost")
DEFAULT_PARTS = tuple(p for p in PART_NAMES if p not in RIG_PARTS)
TARGET_PARTS = ("device", "uring", "limit")  # the parts that run on --device / the sparse target
CORE_PARTS = ("core", "recovery", "plugin", "e2e", "mp", "scale", "drives")  # the parts that compare with LMCache, on files of their own
OWN_PARTS = ("loadcheck", "dealloc", "histcost", "prefix", "loadcost", "mpevict")  # ours only, on files of their own in directories they choose
URING_CMD_NOTE = ("uring_cmd: not measured: it needs an NVMe generic character device (/dev/ngXnY) with "
                  "io_uring passthrough, which neither implementation can use on a file")


@dataclass
class Options:
    suite: str = "quick"
    engines: list[str] = field(default_factory=lambda: list(DEFAULT_ENGINES))
    parts: list[str] = field(default_factory=lambda: list(DEFAULT_PARTS))
    sizes: list[int] | None = None
    repeats: int | None = None
    scale_entries: list[int] | None = None
    drives_n: list[int] | None = None
    drives_seconds: float | None = None
    drives_backend: str | None = None
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
        if p in ("uring", "limit", "recovery") and "io_uring" not in opts.engines:
            continue
        if p in ("core", "loadcheck") and not core_engines(opts):
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


def recovery_settings(opts: Options) -> recovery_suite.RecoverySettings:
    s = replace(recovery_suite.SUITES[opts.suite])
    if opts.repeats:
        s.repeats = opts.repeats
    return s


def plugin_settings(opts: Options) -> plugin_suite.PluginSettings:
    s = replace(plugin_suite.SUITES[opts.suite])
    if opts.repeats:
        s.remove_cycles = opts.repeats
        s.remove_cycles_large = min(s.remove_cycles_large, opts.repeats)
    return s


def e2e_settings(opts: Options) -> e2e_suite.E2ESettings:
    s = replace(e2e_suite.SUITES[opts.suite])
    if opts.repeats:
        s.rounds = opts.repeats
    return s


def mp_settings(opts: Options) -> mp_suite.MPSettings:
    s = replace(mp_suite.SUITES[opts.suite])
    if opts.repeats:
        s.rounds = opts.repeats
    return s


def mpevict_settings(opts: Options) -> mpevict_suite.MPEvictSettings:
    return replace(mpevict_suite.SUITES[opts.suite])


def loadcheck_settings(opts: Options) -> loadcheck_suite.LoadCheckSettings:
    s = replace(loadcheck_suite.SUITES[opts.suite])
    s.engines = [e for e in s.engines if e in opts.engines]
    if opts.repeats:
        s.chunks = [replace(c, rounds=opts.repeats, max_rounds=opts.repeats) for c in s.chunks]
    return s


def histcost_settings(opts: Options) -> histcost_suite.HistCostSettings:
    s = replace(histcost_suite.SUITES[opts.suite])
    s.engines = [e for e in s.engines if e in opts.engines]
    if opts.repeats:
        s.rounds = opts.repeats
    return s


def prefix_settings(opts: Options) -> prefix_suite.PrefixSettings:
    s = replace(prefix_suite.SUITES[opts.suite])
    if opts.repeats:
        s.cpu_rounds = s.put_rounds = opts.repeats
    return s


def dealloc_settings(opts: Options) -> dealloc_suite.DeallocSettings:
    s = replace(dealloc_suite.SUITES[opts.suite])
    if opts.repeats:
        s.plans = [replace(p, rounds=opts.repeats) for p in s.plans]
    return s


def drives_settings(opts: Options) -> drives_suite.DrivesSettings:
    s = replace(drives_suite.SUITES[opts.suite])
    s.engines = [e for e in s.engines if e in opts.engines] or s.engines[:1]
    if opts.sizes:
        s.chunks = sorted(set(opts.sizes))
    if opts.drives_n:
        s.ns = list(opts.drives_n)
    if opts.drives_seconds:
        s.seconds = opts.drives_seconds
    if opts.drives_backend:
        s.backend = opts.drives_backend
    return s


def loadcost_settings(opts: Options) -> loadcost_suite.LoadCostSettings:
    s = replace(loadcost_suite.SUITES[opts.suite])
    if opts.drives_backend:
        s.backend = opts.drives_backend
    return s


def scale_settings(opts: Options) -> scale_suite.ScaleSettings:
    s = replace(scale_suite.SUITES[opts.suite])
    if opts.repeats:
        s.ckpt_rounds = s.reopen_rounds = opts.repeats
    if opts.scale_entries:
        s.sizes = list(opts.scale_entries)
    return s


def run(opts: Options, target: Target, comps: list[Competitor], notes: list[str] | None = None,
        core_comps: list[Competitor] | None = None) -> dict:
    """Run the planned parts. ``comps``: ours + the Rust wheel (device parts); ``core_comps``:
    our core + LMCache's (core, recovery and plugin parts; discovered here when not given)."""
    t0 = time.perf_counter()
    s, more_notes = settings_for(opts, target)
    notes = list(notes or []) + more_notes + list(target.notes)
    parts = planned_parts(opts)
    if "uring_cmd" in opts.engines:
        notes.append(URING_CMD_NOTE)
    on_files = [p for p in parts if p in CORE_PARTS]
    if core_comps is None and on_files:
        core_comps = [core_suite.ours_core(), core_suite.lmcache_core()]
    core_comps = core_comps or []
    part_settings: dict[str, Any] = {}
    if "core" in parts:
        part_settings["core"] = core_settings(opts)
    if "recovery" in parts:
        part_settings["recovery"] = recovery_settings(opts)
    if "plugin" in parts:
        part_settings["plugin"] = plugin_settings(opts)
    if "e2e" in parts:
        part_settings["e2e"] = e2e_settings(opts)
    if "mp" in parts:
        part_settings["mp"] = mp_settings(opts)
    if "mpevict" in parts:
        part_settings["mpevict"] = mpevict_settings(opts)
    if "loadcheck" in parts:
        part_settings["loadcheck"] = loadcheck_settings(opts)
    if "dealloc" in parts:
        part_settings["dealloc"] = dealloc_settings(opts)
    if "histcost" in parts:
        part_settings["histcost"] = histcost_settings(opts)
    if "prefix" in parts:
        part_settings["prefix"] = prefix_settings(opts)
    if "scale" in parts:
        part_settings["scale"] = scale_settings(opts)
    if "drives" in parts:
        part_settings["drives"] = drives_settings(opts)
    if "loadcost" in parts:
        part_settings["loadcost"] = loadcost_settings(opts)
    settings = {**s.describe(), "engines": list(opts.engines), "parts": parts}
    settings.update({p: ps.describe() for p, ps in part_settings.items()})
    competitors = {c.name: c.describe() for c in comps}
    for c in core_comps:
        if c.name != "ours":
            competitors[c.name] = c.describe()
    results: dict[str, Any] = {
        "schema": 2,
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
        "limit": len(s.limit_cases),
        "core": core_suite.steps(part_settings["core"]) if "core" in parts else 0,
        "recovery": recovery_suite.steps(part_settings["recovery"]) if "recovery" in parts else 0,
        "plugin": plugin_suite.steps(part_settings["plugin"]) if "plugin" in parts else 0,
        "e2e": e2e_suite.steps(part_settings["e2e"]) if "e2e" in parts else 0,
        "mp": mp_suite.steps(part_settings["mp"]) if "mp" in parts else 0,
        "mpevict": mpevict_suite.steps(part_settings["mpevict"]) if "mpevict" in parts else 0,
        "loadcheck": loadcheck_suite.steps(part_settings["loadcheck"]) if "loadcheck" in parts else 0,
        "dealloc": dealloc_suite.steps(part_settings["dealloc"]) if "dealloc" in parts else 0,
        "scale": scale_suite.steps(part_settings["scale"]) if "scale" in parts else 0,
        "histcost": histcost_suite.steps(part_settings["histcost"]) if "histcost" in parts else 0,
        "prefix": prefix_suite.steps(part_settings["prefix"]) if "prefix" in parts else 0,
        "drives": drives_suite.steps(part_settings["drives"]) if "drives" in parts else 0,
        "loadcost": loadcost_suite.steps(part_settings["loadcost"]) if "loadcost" in parts else 0,
    }
    if any(p in TARGET_PARTS for p in parts):
        prefill(target.path, s.region)
    workdir = make_workdir() if on_files else None
    runners: dict[str, Callable[[Any], dict]] = {
        "device": lambda bar: device.run_sync(target.path, comps, s, bar),
        "uring": lambda bar: device.run_uring(target.path, comps, s, bar),
        "limit": lambda bar: limit.run_limit(target.path, comps[0].cls, s.limit_cases, s.region, s.limit_seconds,
                                             s.limit_rounds, bar),
        "core": lambda bar: core_suite.run_core(core_comps, part_settings["core"], workdir, bar),
        "recovery": lambda bar: recovery_suite.run_recovery(core_comps, part_settings["recovery"], workdir, bar),
        "plugin": lambda bar: plugin_suite.run_plugin(core_comps, part_settings["plugin"], workdir, bar),
        "e2e": lambda bar: e2e_suite.run_e2e(part_settings["e2e"], workdir, bar),
        "mp": lambda bar: mp_suite.run_mp(part_settings["mp"], workdir, bar),
        "mpevict": lambda bar: mpevict_suite.run_mpevict(part_settings["mpevict"], bar),
        "loadcheck": lambda bar: loadcheck_suite.run_loadcheck(part_settings["loadcheck"], bar),
        "dealloc": lambda bar: dealloc_suite.run_dealloc(part_settings["dealloc"], bar),
        "histcost": lambda bar: histcost_suite.run_histcost(part_settings["histcost"], bar),
        "prefix": lambda bar: prefix_suite.run_prefix(part_settings["prefix"], bar),
        "scale": lambda bar: scale_suite.run_scale(core_comps, part_settings["scale"], workdir, bar),
        "drives": lambda bar: drives_suite.run_drives(core_comps, part_settings["drives"], bar),
        "loadcost": lambda bar: loadcost_suite.run_loadcost(part_settings["loadcost"], bar),
    }
    total = sum(steps[p] for p in parts)
    quiet = on_files or any(p in OWN_PARTS for p in parts)
    if quiet:
        logging.disable(logging.WARNING)  # LMCache and the cores log every open at INFO/WARNING
    try:
        with common.progress(total, f"bench {opts.suite}", enabled=opts.progress) as bar:
            for p in parts:
                results[p] = runners[p](bar)
    finally:
        if quiet:
            logging.disable(logging.NOTSET)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    results["elapsed_s"] = time.perf_counter() - t0
    return results
