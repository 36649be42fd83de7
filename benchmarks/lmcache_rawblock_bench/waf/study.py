"""The simulated study on real drive geometry: WAF of the LMCache-shaped workload per product
lever (deallocation of freed slots, slot reuse order, evict-ahead, placement, checkpoints on
their own handle, write admission) at 50-100% utilisation on a drive with 1 GiB reclaim units;
a sweep of reclaim unit size (256 MiB - 16 GiB) and chunk size (8, 32 MiB); the validation
figures (uniform random overwrites, and deallocation at the effective spare factor); the
published anchors and a drive not in steady state. Writes results.json, summary.md and PNG
plots, with the operator table.

Scale: a simulated page is 1/8 of a slot (so a partial chunk leaves up to 7/8 of its slot's
old bytes behind) and the drive has 256 reclaim units (128 where that would pass
``MAX_PAGES`` pages), i.e. the drive is scaled down from a real one's thousands of reclaim
units while the reclaim unit / chunk ratio is kept. The workload's shared prefixes and
conversations in flight scale with the drive's slot count, so the cache sees the same working
set to capacity ratio on every geometry. The study records both choices, and the RU-count
sensitivity run shows what the scaling costs."""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Optional

from .analytic import greedy_uniform_waf
from .classes import WriteClass, cumulative_at, run_classes
from .ftl import RESERVE_RUS, FlashSim, Geometry
from .run import simulate_lmcache, spec_for_slot
from .stream import CacheConfig, CacheModel, SimSink
from .workload import WorkloadSpec

MIB = 1 << 20
GIB = 1 << 30
PAGES_PER_SLOT = 8
N_RUS = 256
MIN_RUS = 128
MAX_PAGES = 1 << 20
OP = 0.1
HANDLES = 8  # placement handles of the drive (8 reclaim unit handles, as on the FDP drives measured)
HEADLINE = dict(ru_bytes=GIB, slot_bytes=8 * MIB)
REF_SLOTS = (N_RUS - RESERVE_RUS) * GIB / (1 + OP) / (8 * MIB)  # logical slots of the headline drive: workload scale 1
EVICT_AHEAD = (0.95, 0.05)  # the plugin's eviction_trigger_watermark / eviction_ratio defaults
VALIDATION_GEOMETRY = dict(ru_pages=64, n_rus=256, max_handles=1, page_bytes=4096)

# Levers: name -> (simulate_lmcache keywords, how to get it in the product)
_DEALLOC = "deallocate_freed: on (auto on block devices and NVMe namespaces)"
_AHEAD = "eviction_policy: lru, eviction_trigger_watermark: 0.95, eviction_ratio: 0.05"


def _levers() -> dict:
    lv = {
        "today": (dict(mode="no_fdp"), "LIFO reuse, no deallocation, eviction on demand (the core before deallocate_freed)"),
        "dealloc": (dict(mode="no_fdp", dealloc=True), _DEALLOC),
        "dealloc_skipped_on_demand": (dict(mode="no_fdp", dealloc=True, dealloc_skip_on_demand=True),
                                      "deallocate_freed on, but every slot a put frees for itself taken undeallocated "
                                      "(the core's room-making checkpoint inside a put)"),
        "fifo": (dict(mode="no_fdp", reuse="fifo"), "oldest-freed slot first: an allocator change, not a setting"),
        "fifo+dealloc": (dict(mode="no_fdp", reuse="fifo", dealloc=True), "fifo reuse and " + _DEALLOC),
        "ru_groups": (dict(mode="no_fdp", reuse="ru_groups"),
                      "slots handed out and evicted in RU-sized groups: an allocator and eviction change, not a setting"),
        "ru_groups+dealloc": (dict(mode="no_fdp", reuse="ru_groups", dealloc=True), "ru_groups and " + _DEALLOC),
        "evict_ahead": (dict(mode="no_fdp", evict_ahead=EVICT_AHEAD), _AHEAD),
        "evict_ahead+dealloc": (dict(mode="no_fdp", evict_ahead=EVICT_AHEAD, dealloc=True), _AHEAD + "; " + _DEALLOC),
        "mixed": (dict(mode="mixed"), "fdp_enabled, fdp_data_placement_policy: none, checkpoint on the same identifier"),
        "mixed+dealloc": (dict(mode="mixed", dealloc=True), "mixed and " + _DEALLOC),
        "ckpt_apart": (dict(mode="ckpt_apart"), "fdp_enabled, fdp_data_placement_policy: none, "
                                                 "meta_checkpoint_placement_id: an identifier of its own"),
        "ckpt_apart+dealloc": (dict(mode="ckpt_apart", dealloc=True), "ckpt_apart and " + _DEALLOC),
    }
    for strat in ("tp_worker", "prompt", "phase", "cache_salt_prefix", "cache_salt_rank"):
        lv[f"separated:{strat}"] = (dict(mode="separated", strategy=strat),
                                    f"fdp_enabled, fdp_data_placement_policy: {strat}, checkpoint apart")
        lv[f"separated:{strat}+dealloc"] = (dict(mode="separated", strategy=strat, dealloc=True),
                                            f"separated:{strat} and " + _DEALLOC)
    lv["second_hit"] = (dict(mode="no_fdp", admission="second_hit"), "admission: second_hit")
    lv["second_hit+dealloc"] = (dict(mode="no_fdp", admission="second_hit", dealloc=True),
                                "admission: second_hit and " + _DEALLOC)
    lv["ru_groups+evict_ahead+dealloc"] = (dict(mode="no_fdp", reuse="ru_groups", evict_ahead=EVICT_AHEAD,
                                                dealloc=True), "ru_groups, evict-ahead and " + _DEALLOC)
    return lv


LEVERS = _levers()
SWEEP_LEVERS = ("today", "dealloc", "ru_groups+dealloc")


def label(mode: str, strategy: Optional[str]) -> str:
    return mode if mode != "separated" else f"separated:{strategy}"


def drive(ru_bytes: int, slot_bytes: int, *, n_rus: Optional[int] = None, op: float = OP,
          handles: int = HANDLES, pages_per_slot: int = PAGES_PER_SLOT) -> Geometry:
    """The simulated drive for reclaim units of ``ru_bytes`` and slots of ``slot_bytes`` (see
    the module docstring for the scale)."""
    if slot_bytes % pages_per_slot or ru_bytes % (slot_bytes // pages_per_slot):
        raise ValueError(f"ru_bytes={ru_bytes} and slot_bytes={slot_bytes} must be whole pages of "
                         f"slot_bytes / {pages_per_slot}")
    pb = slot_bytes // pages_per_slot
    ru_pages = ru_bytes // pb
    if n_rus is None:
        n_rus = N_RUS
        while n_rus > MIN_RUS and n_rus * ru_pages > MAX_PAGES:
            n_rus //= 2
        while n_rus * ru_pages > MAX_PAGES and pages_per_slot > 4:  # coarser pages, never below 4 a slot
            pages_per_slot //= 2
            pb = slot_bytes // pages_per_slot
            ru_pages = ru_bytes // pb
    return Geometry(ru_pages=ru_pages, n_rus=n_rus, n_groups=1, op=op, max_handles=handles, page_bytes=pb)


def workload_for(g: Geometry, slot_bytes: int, base: Optional[WorkloadSpec] = None) -> WorkloadSpec:
    """``base`` with full objects filling a slot, its prefixes and conversations scaled with the
    drive's logical slots (scale 1: the headline drive)."""
    base = base or WorkloadSpec()
    k = g.logical_bytes / slot_bytes / REF_SLOTS
    return spec_for_slot(replace(base, families=max(1, round(base.families * k)),
                                 concurrency=max(1, round(base.concurrency * k))), slot_bytes)


def _one(args: tuple) -> dict:
    tag, geometry, spec, kw = args
    try:
        r = simulate_lmcache(geometry, spec, **kw)
    except (RuntimeError, ValueError) as exc:  # e.g. GC that cannot free a reclaim unit: no steady state
        r = dict(kw, waf=float("inf"), error=f"{type(exc).__name__}: {exc}", cache={"hit_ratio": float("nan")},
                 window={}, slot_bytes=spec.object_bytes + 4096)
    r["tag"] = tag
    r["seed"] = spec.seed
    return r


def _geo_tag(ru_bytes: int, slot_bytes: int) -> str:
    ru = f"{ru_bytes // GIB}G" if ru_bytes >= GIB else f"{ru_bytes // MIB}M"
    return f"ru{ru}-chunk{slot_bytes // MIB}M"


def study_tasks(*, utils=(0.5, 0.8, 0.95, 1.0), levers=tuple(LEVERS), repeats: int = 2, warmup: float = 2.0,
                measure: float = 2.0, sweep_ru=(256 * MIB, GIB, 4 * GIB, 16 * GIB), sweep_slot=(8 * MIB, 32 * MIB),
                sweep_levers=SWEEP_LEVERS, sweep_repeats: int = 1, ru_counts=(64, 128, 256, 512),
                base: Optional[WorkloadSpec] = None) -> list[tuple]:
    base = base or WorkloadSpec()
    tasks = []
    hg = drive(**HEADLINE)
    for util in utils:
        for name in levers:
            kw0 = LEVERS[name][0]
            for rep in range(repeats):
                spec = replace(workload_for(hg, HEADLINE["slot_bytes"], base), seed=base.seed + rep)
                kw = dict(dict(mode="no_fdp", dealloc=False), **kw0, util=util, warmup=warmup, measure=measure)
                tasks.append((("levers", _geo_tag(**HEADLINE), name), hg, spec, kw))
    for ru in sweep_ru:
        for sb in sweep_slot:
            g = drive(ru, sb, handles=1)
            for util in utils:
                for name in sweep_levers:
                    for rep in range(sweep_repeats):
                        spec = replace(workload_for(g, sb, base), seed=base.seed + rep)
                        kw = dict(dict(mode="no_fdp", dealloc=False), **LEVERS[name][0], util=util, warmup=warmup,
                                  measure=measure)
                        tasks.append((("sweep", _geo_tag(ru, sb), name), g, spec, kw))
    for n in ru_counts:
        for pps in ((PAGES_PER_SLOT, 4) if n == N_RUS else (PAGES_PER_SLOT,)):
            g = drive(GIB, 8 * MIB, n_rus=n, handles=1, pages_per_slot=pps)
            for name in ("today", "dealloc"):
                spec = workload_for(g, 8 * MIB, base)
                kw = dict(dict(mode="no_fdp", dealloc=False), **LEVERS[name][0], util=0.95, warmup=warmup,
                          measure=measure)
                tasks.append((("ru_count", f"{n}x{pps}", name), g, spec, kw))
    # the big drives first, so the pool ends on the short runs
    tasks.sort(key=lambda t: -t[1].physical_pages)
    return tasks


ENDURANCE_LEVERS = ("today", "dealloc", "evict_ahead+dealloc", "ru_groups+dealloc", "ru_groups+evict_ahead+dealloc")
ENDURANCE_PLACEMENT = ("mixed", "ckpt_apart", "separated:tp_worker", "separated:prompt", "separated:phase",
                       "separated:cache_salt_prefix", "separated:cache_salt_rank")


def _pps(workload: str, ru_bytes: int, meta_format: str) -> int:
    """Pages per slot: LMCache's default store pattern writes whole slots only (every object a
    full chunk), so coarser pages lose nothing there with the log format (its log is handed to
    the drive in whole pages) and cut the cost: 1/2 of a slot, a whole slot at 16 GiB RUs. The
    study's workload needs 1/8 pages for the tails partial chunks leave, and format v1 for its
    checkpoints (a few MiB each, rounded up to whole pages)."""
    if workload != "lmcache_defaults" or meta_format != "log":
        return PAGES_PER_SLOT
    return 2 if ru_bytes <= GIB else 1


def endurance_tasks(*, workloads=("lmcache_defaults", "study"), utils=(0.95, 1.0), concurrency=(1, 2, 4, 8),
                    ops=(0.07, 0.28), formats=("log", "v1"), ru_sizes=(GIB, 16 * GIB),
                    levers=ENDURANCE_LEVERS, big_ru_workloads=("lmcache_defaults",), big_ru_concurrency=(1, 8),
                    big_ru_formats=("log",), v1_concurrency=(1, 8), placement=ENDURANCE_PLACEMENT, warmup: float = 1.5,
                    measure: float = 1.5, seed: int = 1) -> list[tuple]:
    """The endurance table: ``workloads`` (named store patterns of :data:`.workload.WORKLOADS`) x
    utilisation x ``concurrency`` (multiples of the study's conversations in flight) x drive
    spare ``ops`` x metadata ``formats`` x ``levers``, 8 MiB slots, on 1 GiB RUs; on the larger
    RU sizes only ``big_ru_workloads``, ``big_ru_concurrency`` and ``big_ru_formats``, on
    :data:`MIN_RUS` RUs (their runs cost 8x as much); format v1 at ``v1_concurrency`` only.
    FDP ``placement`` levers (and each with deallocation) at 1x, the first spare, log format."""
    from .workload import WORKLOADS

    tasks = []
    for ru in ru_sizes:
        for wl in workloads:
            if ru != GIB and wl not in big_ru_workloads:
                continue
            for op in ops:
                for conc in concurrency:
                    if ru != GIB and conc not in big_ru_concurrency:
                        continue
                    base = replace(WorkloadSpec(**WORKLOADS[wl]), concurrency=WorkloadSpec.concurrency * conc,
                                   seed=seed)
                    names = list(levers)
                    if ru == GIB and conc == 1 and op == ops[0]:
                        names += [n + s for n in placement for s in ("", "+dealloc")]
                    for fmt in formats:
                        if (ru != GIB and fmt not in big_ru_formats) or (fmt == "v1" and conc not in v1_concurrency):
                            continue
                        g = drive(ru, 8 * MIB, handles=HANDLES if ru == GIB else 1, op=op,
                                  pages_per_slot=_pps(wl, ru, fmt), n_rus=None if ru == GIB else MIN_RUS)
                        spec = workload_for(g, 8 * MIB, base)
                        for util in utils:
                            for name in names:
                                if fmt != formats[0] and name not in levers:
                                    continue
                                kw = dict(dict(mode="no_fdp", dealloc=False), **LEVERS[name][0], util=util,
                                          warmup=warmup, measure=measure, meta_format=fmt)
                                variant = {"workload": wl, "concurrency": conc, "op": op, "meta_format": fmt}
                                tasks.append((("endurance", _geo_tag(ru, 8 * MIB), name, variant), g, spec, kw))
    tasks.sort(key=lambda t: -t[1].physical_pages)
    return tasks


def run_study(tasks: list[tuple], *, jobs: int = 0, progress=None) -> dict:
    jobs = jobs or max(1, min(len(tasks), os.cpu_count() or 1))
    runs = []
    with ProcessPoolExecutor(jobs) as ex:
        for i, r in enumerate(ex.map(_one, tasks)):
            t = tasks[i]
            r["part"], r["geometry_tag"], r["lever"] = t[0][:3]
            if len(t[0]) > 3:
                r["variant"] = t[0][3]
            r["geometry"] = t[1].to_dict()
            r["workload"] = t[2].to_dict()
            runs.append(r)
            if progress:
                progress(i + 1, len(tasks), r)
    return {"runs": runs}


def summarize(study: dict) -> list[dict]:
    rows = {}
    for r in study["runs"]:
        v = tuple(sorted(r.get("variant", {}).items()))
        rows.setdefault((r["part"], r["geometry_tag"], r["util"], r["lever"], v), []).append(r)
    out = []
    for (part, geo, util, lever, v), rs in rows.items():
        wafs = [r["waf"] for r in rs]
        c = [r["cache"] for r in rs if "lookups" in r["cache"]]
        g = rs[0]["geometry"]
        row = {"part": part, "geometry": geo, "util": util, "lever": lever, "waf": statistics.mean(wafs),
               "waf_min": min(wafs), "waf_max": max(wafs), "n": len(rs),
               "page_bytes": g["page_bytes"], "ru_bytes": g["ru_pages"] * g["page_bytes"], "slot_bytes": rs[0]["slot_bytes"] if "slot_bytes" in
               rs[0] else None, "n_rus": g["n_rus"], "op": g["op"],
               "settings": LEVERS[lever][1] if lever in LEVERS else "",
               "error": next((r["error"] for r in rs if "error" in r), None)}
        row.update(dict(v))
        if c:
            row["hit_ratio"] = statistics.mean(x["hit_ratio"] for x in c)
            row["media_mib_per_k_lookups"] = statistics.mean(
                r["window"]["media_pages"] * g["page_bytes"] / MIB / (r["cache"]["lookups"] / 1000)
                for r in rs if "lookups" in r["cache"])
            row["dealloc_commands_per_gib"] = statistics.mean(
                x["dealloc_commands"] / max(1, x["host_bytes"] / GIB) for x in c)
            row["evictions"] = statistics.mean(x["evictions"] for x in c)
        out.append(row)
    order = {k: i for i, k in enumerate(LEVERS)}
    out.sort(key=lambda r: (r["part"], r["ru_bytes"], r["slot_bytes"] or 0, r["n_rus"], r["page_bytes"], r["util"],
                            order.get(r["lever"], 99)))
    return out


def operator_table(rows: list[dict], target: float = 1.05) -> list[dict]:
    """Per geometry and utilisation of the sweep: the first of today's core and deallocation
    that meets ``target``, else the lower of them."""
    product = ("today", "dealloc")
    out = []
    cells = {}
    for r in rows:
        if r["part"] == "sweep":
            cells.setdefault((r["ru_bytes"], r["slot_bytes"], r["util"]), {})[r["lever"]] = r
    for (ru, sb, util), levs in sorted(cells.items()):
        cands = [levs[n] for n in product if n in levs]
        if not cands:
            continue
        pick = next((c for c in cands if c["waf"] <= target), min(cands, key=lambda c: c["waf"]))
        out.append({"ru_bytes": ru, "slot_bytes": sb, "util": util, "today": levs.get("today", {}).get("waf"),
                    "lever": pick["lever"], "waf": pick["waf"],
                    "settings": "nothing: within the target as it is" if pick["lever"] == "today" and pick["waf"] <= target
                    else LEVERS[pick["lever"]][1],
                    "hit_ratio": pick.get("hit_ratio"), "meets_target": pick["waf"] <= target,
                    "ru_groups+dealloc": levs.get("ru_groups+dealloc", {}).get("waf")})
    return out


def uniform_random_waf(op: float, *, policy: str = "greedy", warmup: float = 2.0, measure: float = 2.0,
                       seed: int = 1, geometry: Optional[dict] = None) -> float:
    """Simulated WAF of uniform random single-page overwrites at spare factor ``op``."""
    import random

    g = Geometry(op=op, **(geometry or VALIDATION_GEOMETRY))
    sim = FlashSim(g, policy=policy)
    L = g.logical_pages
    rnd = random.Random(seed)
    for p in range(L):
        sim.write(p, 1)
    for _ in range(int(warmup * L)):
        sim.write(rnd.randrange(L), 1)
    sim.mark()
    for _ in range(int(measure * L)):
        sim.write(rnd.randrange(L), 1)
    return sim.window().waf()


def uniform_slot_waf(op: float, *, policy: str = "greedy", count_reserve: bool = True, warmup: float = 2.0,
                     measure: float = 2.0, seed: int = 1, ru_bytes: int = GIB, slot_bytes: int = 8 * MIB) -> float:
    """Simulated WAF of uniform random slot overwrites on the study's own drive for ``ru_bytes``
    and ``slot_bytes`` (:func:`drive`: a page is 1/8 of a slot, 256 RUs): every write one whole,
    aligned slot, so an RU holds ``ru_bytes / slot_bytes`` units as in the study. ``count_reserve``:
    :class:`.ftl.Geometry`'s accounting of the RUs GC keeps empty (False: as before it)."""
    g = replace(drive(ru_bytes, slot_bytes, handles=1, op=op), count_reserve=count_reserve)
    sim = FlashSim(g, policy=policy)
    pps = slot_bytes // g.page_bytes
    n = g.logical_pages // pps
    rnd = random.Random(seed)
    for x in range(n):
        sim.write(x * pps, pps)
    for _ in range(int(warmup * n)):
        sim.write(rnd.randrange(n) * pps, pps)
    sim.mark()
    for _ in range(int(measure * n)):
        sim.write(rnd.randrange(n) * pps, pps)
    return sim.window().waf()


def reserve_bias(ops=(0.07, 0.1, 0.28)) -> list[dict]:
    """The simulator against the closed-form model on the study's geometry (1 GiB RUs, 8 MiB
    slots), before and after counting the RUs GC holds back; FIFO victims as well as greedy."""
    out = []
    for op in ops:
        m = greedy_uniform_waf(op)
        row = {"op": op, "model": m}
        for name, kw in (("greedy_before", dict(count_reserve=False)), ("greedy", {}),
                         ("fifo_before", dict(policy="fifo", count_reserve=False)), ("fifo", dict(policy="fifo"))):
            w = uniform_slot_waf(op, **kw)
            row[name] = w
            row[name + "_error"] = (w - m) / m
        out.append(row)
    return out


def dealloc_uniform_waf(live: float, *, op: float = OP, dealloc: bool = True, warmup: float = 2.0,
                        measure: float = 2.0, seed: int = 1, checkpoint_every: int = 256,
                        geometry: Optional[dict] = None) -> dict:
    """Uniform random slot frees through the cache model: ``live`` of the slots hold an entry;
    each step deletes one at random and stores a new one, so each entry's death is memoryless
    as in uniform random overwrites. Freed slots are reused oldest first, so every slot of the
    space gets written: without deallocation the drive holds all of them (its spare is only
    the over-provisioning); with deallocation the drive's spare is everything but the
    live data; the analytic WAF at that effective spare factor is the model's prediction.
    ``warmup`` / ``measure`` in writes of the slot space. Returns the simulated WAF, the mean
    valid pages over the window and the model's WAF at the spare factor they leave."""
    g = Geometry(op=op, **(geometry or VALIDATION_GEOMETRY))
    sim = FlashSim(g)
    pb = g.page_bytes
    cfg = CacheConfig(capacity_bytes=g.logical_bytes, slot_bytes=pb, header_bytes=0, meta_total_bytes=4 * pb,
                      meta_io_bytes=pb, checkpoint_every=checkpoint_every, dealloc=dealloc, tp=1, reuse="fifo")
    model = CacheModel(cfg, "no_fdp", None, SimSink(sim))
    n_live = int(live * cfg.n_slots)
    rnd = random.Random(seed)
    keys: list[int] = []
    nxt = [1]

    def put() -> dict:
        k = nxt[0]
        nxt[0] += 1
        keys.append(k)
        return {"op": "put", "key": f"{k:016x}", "size": pb, "worker": 0, "batch": k}

    def delete() -> dict:
        i = rnd.randrange(len(keys))
        k = keys[i]
        keys[i] = keys[-1]
        keys.pop()
        return {"op": "delete", "key": f"{k:016x}", "worker": 0}

    def step() -> list:
        return [delete(), put()]

    # every slot written once, then the entries beyond ``live`` deleted at random
    model.feed(put() for _ in range(cfg.n_slots))
    for _ in range(cfg.n_slots - n_live):
        model.feed([delete()])
    for _ in range(int(warmup * cfg.n_slots)):
        model.feed(step())
    sim.mark()
    valid, samples = 0, 0
    every = max(1, cfg.n_slots // 64)
    for i in range(int(measure * cfg.n_slots)):
        model.feed(step())
        if i % every == 0:
            valid += sim.valid_pages()
            samples += 1
    live_pages = valid / samples
    eff = (g.physical_pages - live_pages) / live_pages
    return {"live": live, "dealloc": dealloc, "op": op, "waf": sim.window().waf(), "live_pages": live_pages,
            "physical_pages": g.physical_pages, "effective_op": eff, "model": greedy_uniform_waf(eff),
            "model_at_drive_op": greedy_uniform_waf(op)}


def validation() -> dict:
    ops = (0.1, 0.2, 0.28, 0.5, 1.0)
    out = {"geometry": VALIDATION_GEOMETRY, "model": "Desnoyers' FIFO/LRU model, u = exp(-(1+op)(1-u)), "
           "WAF = 1/(1-u)", "uniform": []}
    for op in ops:
        out["uniform"].append({"op": op, "model": greedy_uniform_waf(op), "greedy": uniform_random_waf(op),
                               "cost_benefit": uniform_random_waf(op, policy="cost_benefit")})
    out["study_geometry"] = reserve_bias()
    out["dealloc"] = [dealloc_uniform_waf(f) for f in (0.5, 0.75, 0.9, 0.97)]
    out["dealloc_off"] = [dealloc_uniform_waf(f, dealloc=False) for f in (0.5, 0.9)]
    g = Geometry(ru_pages=64, n_rus=256, op=0.28, max_handles=2, page_bytes=4096)
    two = [WriteClass("short", 0.1, 0.9, "random", 1), WriteClass("long", 0.9, 0.1, "random", 1)]
    out["two_lifetimes"] = {"mixed": run_classes(g, two, separated=False)["waf"],
                            "separated": run_classes(g, two, separated=True)["waf"],
                            "separated_persistent": run_classes(g, two, separated=True, isolation="persistent")["waf"]}
    return out


def _not_steady(base: Optional[WorkloadSpec] = None) -> dict:
    """A fresh drive and half a drive write: nothing to collect, every mode WAF 1."""
    hg = drive(**HEADLINE)
    spec = workload_for(hg, HEADLINE["slot_bytes"], base)
    out = {}
    for name in ("today", "dealloc", "mixed", "separated:tp_worker", "separated:prompt", "ru_groups+dealloc"):
        kw = dict(dict(mode="no_fdp", dealloc=False), **LEVERS[name][0])
        out[name] = simulate_lmcache(hg, spec, util=0.95, warmup=0, measure=0.5, **kw)["waf"]
    return out


def anchors() -> dict:
    g = Geometry(ru_pages=64, n_rus=512, op=0.07, max_handles=4, page_bytes=4096)
    share = 0.76  # the one calibrated parameter: the small-object cache's share of host writes
    cachelib = [WriteClass("small_object_cache", 0.04, share, "random", 1),
                WriteClass("large_object_cache", 0.96, 1 - share, "sequential", 16)]
    res = {"cachelib": {"published": {"util_1.0": [3.22, 1.03], "util_0.5": [1.22, 1.03]},
                        "model": "small-object cache: 4% of the space, 1-page random overwrites, "
                                 f"{share:.0%} of host writes (calibrated to the 100% non-FDP figure); "
                                 "large-object cache: a 16-page circular log; drive op 7%",
                        "simulated": {}}}
    for util in (1.0, 0.5):
        res["cachelib"]["simulated"][f"util_{util}"] = [
            run_classes(g, cachelib, util=util, separated=sep, warmup=2, measure=1)["waf"] for sep in (False, True)]
    lmc = [WriteClass("short_lived", 0.05, 0.9, "random", 8), WriteClass("long_lived", 0.95, 0.1, "random", 8)]
    sims = {}
    for name, sep, iso in (("mixed", False, "initial"), ("separated", True, "initial"),
                           ("separated_persistent", True, "persistent")):
        r = run_classes(g, lmc, util=0.89, separated=sep, isolation=iso, warmup=3, measure=1)
        sims[name] = {"cumulative_4x": cumulative_at(r, 4.0), "steady": r["waf"]}
    res["lmcache"] = {"published": {"mixed": 2.600, "separated": 1.425, "util": 0.89, "capacity_written": 4},
                      "model": "two classes of 8-page slots reused at random: 5% of the space takes 90% of the "
                               "writes, 95% takes 10%; 89% of the logical space in use, the rest unwritten; "
                               "drive op 7%; WAF from the start over 4x the space written",
                      "simulated": sims}
    # Our own workload and levers at the anchor's 89% and 7% spare, on the 1 GiB-RU drive.
    hg = drive(**HEADLINE, op=0.07)
    spec = workload_for(hg, HEADLINE["slot_bytes"])
    ours = {}
    for name in ("today", "separated:tp_worker", "dealloc", "evict_ahead+dealloc"):
        kw = dict(dict(mode="no_fdp", dealloc=False), **LEVERS[name][0])
        r = simulate_lmcache(hg, spec, util=0.89, warmup=2, measure=2, **kw)
        ours[name] = {"steady": r["waf"], "cumulative_4x": r["cumulative_waf"]}
    res["lmcache"]["our_workload_levers"] = ours
    res["not_steady_state"] = _not_steady()
    return res


_WL_TITLE = {"lmcache_defaults": "LMCache's default store pattern (save_decode_cache and save_unfull_chunk "
                                  "false: every stored object a full chunk, stored at prefill)",
             "study": "the study's workload (decode chunks and partial last chunks stored)"}


def endurance_md(rows: list[dict]) -> list[str]:
    """The endurance tables: per RU size and workload, WAF per lever for each utilisation,
    drive spare, metadata format and concurrency; then the placement levers."""
    en = [r for r in rows if r["part"] == "endurance"]
    if not en:
        return []
    L = ["", "## Endurance table: WAF per lever, 8 MiB slots", "",
         "Levers: today = LIFO slot reuse, no deallocation, eviction on demand (the core's room-making put, "
         "and `eviction_policy: none`, the plugin's default); dealloc = `deallocate_freed` with the "
         "deallocation before the slot's reuse; evict-ahead = the plugin's `eviction_policy: lru` at 0.95 / 0.05; "
         "ru_groups = slots handed out and evicted in reclaim-unit-sized groups (the extent design). "
         "Concurrency: conversations in flight, a multiple of the study's 32 per 254 GiB. Formats: log "
         "(the product default: changes appended) and v1 (the whole index rewritten into one of two containers "
         "at each checkpoint). Hit ratio: today's, and the extent design's (ru_groups+evict_ahead+dealloc).", ""]
    by: dict = {}
    for r in en:
        by.setdefault((r["ru_bytes"], r["workload"]), {}).setdefault(
            (r["util"], r["op"], r["meta_format"], r["concurrency"]), {})[r["lever"]] = r
    for (ru, wl), cells in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] != "lmcache_defaults")):
        n_rus = next(iter(next(iter(cells.values())).values()))["n_rus"]
        L += ["", f"### {_size(ru)} reclaim units ({n_rus} simulated), {_WL_TITLE.get(wl, wl)}", "",
              "| util | spare | format | concurrency | " + " | ".join(ENDURANCE_LEVERS) +
              " | hit ratio today / extents |", "|---|---|---|---|" + "---|" * len(ENDURANCE_LEVERS) + "---|"]
        for (util, op, fmt, conc), lv in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "log",
                                                                            kv[0][3])):
            h0 = lv.get("today", {}).get("hit_ratio")
            h1 = lv.get("ru_groups+evict_ahead+dealloc", {}).get("hit_ratio")
            hr = " / ".join("-" if h is None else f"{h:.3f}" for h in (h0, h1))
            L.append(f"| {util:.0%} | {op:.0%} | {fmt} | {conc}x | " +
                     " | ".join(_w(lv.get(n)) for n in ENDURANCE_LEVERS) + f" | {hr} |")
    pl = [r for r in en if r["lever"] in LEVERS and LEVERS[r["lever"]][0].get("mode", "no_fdp") != "no_fdp"]
    if pl:
        cols = sorted({(r["workload"] != "lmcache_defaults", r["workload"], r["util"]) for r in pl})
        ref = {(r["workload"], r["util"], r["lever"]): r for r in en
               if r["concurrency"] == pl[0]["concurrency"] and r["op"] == pl[0]["op"] and r["meta_format"] == "log"
               and r["ru_bytes"] == GIB}
        L += ["", f"### FDP placement, 1 GiB RUs, spare {pl[0]['op']:.0%}, log format, 1x concurrency", "",
              "| lever | " + " | ".join(f"{w} {u:.0%}" for _, w, u in cols) + " |", "|---|" + "---|" * len(cols)]
        for name in ("today", "dealloc") + tuple(n + s for n in ENDURANCE_PLACEMENT for s in ("", "+dealloc")):
            if any((w, u, name) in ref for _, w, u in cols):
                L.append(f"| {name} | " + " | ".join(_w(ref.get((w, u, name))) for _, w, u in cols) + " |")
    return L


def _size(b: Optional[int]) -> str:
    if b is None:
        return "?"
    return f"{b // GIB} GiB" if b >= GIB and b % GIB == 0 else f"{b // MIB} MiB"


def _w(r: Optional[dict], spread: bool = False) -> str:
    if r is None:
        return "-"
    if r.get("error"):
        return "no steady state"
    t = f"{r['waf']:.3f}"
    if spread and r["n"] > 1:
        t += f" [{r['waf_min']:.3f}, {r['waf_max']:.3f}]"
    return t


def _wm(study: dict) -> tuple:
    r = next((r for r in study["runs"] if "warmup_drive_writes" in r), {})
    return r.get("warmup_drive_writes"), r.get("measure_drive_writes")


def markdown(study: dict, rows: list[dict], val: Optional[dict], anc: Optional[dict], argv: list[str],
             target: float = 1.05) -> str:
    utils = sorted({r["util"] for r in rows})
    lev = [r for r in rows if r["part"] == "levers"]
    L = ["# Simulated write amplification of LMCache's SSD tier on real drive geometry", "",
         f"Command: `{' '.join(argv)}`", "",
         "Scale: a drive has 256 reclaim units (RUs), 128 where that would pass "
         f"{MAX_PAGES} pages (16 GiB RUs with 8 MiB chunks); the RU / chunk ratio is the real one. A simulated page "
         "is 1/8 of a slot for workloads with partial chunks and for format v1 (whose checkpoints are rounded "
         "up to whole pages); for LMCache's default store pattern with the log format, whose writes are all "
         "whole slots, 1/2 of a slot at 1 GiB RUs and a whole slot at 16 GiB (the 16 GiB rows are on 128 RUs). "
         "A real drive of the same RU size has thousands of RUs (a 7.68 TB drive: 447 of "
         "16 GiB); 128 RUs and more give the same WAF within a few percent (the earlier scale sensitivity "
         "run), so the 16 GiB rows read somewhat high. The workload's shared prefixes and conversations "
         "in flight scale with the drive's slot count (the same working set / capacity ratio everywhere). "
         "Greedy GC, initially isolated handles; the spare (over-provisioning) is the stated fraction of the "
         "logical space over the RUs that hold data: the 2 RUs garbage collection keeps empty are counted "
         "outside it. \"Chunk\" is the slot: one TP worker's KV of one LMCache chunk plus its 4 KiB header. "
         "Utilisation: the fraction of the drive's logical space the cache's slots take. WAF is measured over "
         f"{_wm(study)[1]} drive writes after {_wm(study)[0]} drive writes of warm-up (steady state); one seed per "
         "cell unless [min, max] is shown. Every run is in results.json.", ""]
    if lev:
        L += ["## Every lever on a drive with 1 GiB reclaim units, 8 MiB chunks", ""]
        g = lev[0]
        L.append(f"Drive: {g['n_rus']} RUs of 1 GiB, {HANDLES} placement handles, spare {g['op']:.0%}.")
        L += ["", "| lever | " + " | ".join(f"WAF at {u:.0%}" for u in utils) + " | hit ratio at 95% | how |",
              "|---|" + "---|" * len(utils) + "---|---|"]
        by = {(r["lever"], r["util"]): r for r in lev}
        for name in LEVERS:
            if not any((name, u) in by for u in utils):
                continue
            hr = by.get((name, 0.95), {}).get("hit_ratio")
            L.append(f"| {name} | " + " | ".join(_w(by.get((name, u)), True) for u in utils) +
                     f" | {hr if hr is None else f'{hr:.3f}'} | {LEVERS[name][1]} |")
    L += endurance_md(rows)
    sw = [r for r in rows if r["part"] == "sweep"]
    if sw:
        L += ["", "## Reclaim unit size and chunk size (no FDP)", "",
              "| RU | chunk | RUs simulated | pages per slot | lever | " + " | ".join(f"{u:.0%}" for u in utils) + " |",
              "|---|---|---|---|---|" + "---|" * len(utils)]
        cells = {}
        for r in sw:
            cells.setdefault((r["ru_bytes"], r["slot_bytes"], r["n_rus"], r["slot_bytes"] // r["page_bytes"],
                              r["lever"]), {})[r["util"]] = r
        order = {k: i for i, k in enumerate(LEVERS)}
        for (ru, sb, n, pps, name), byu in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0], order[kv[0][4]])):
            L.append(f"| {_size(ru)} | {_size(sb)} | {n} | {pps} | {name} | " +
                     " | ".join(_w(byu.get(u)) for u in utils) + " |")
    rc = [r for r in rows if r["part"] == "ru_count"]
    if rc:
        L += ["", "## Scale sensitivity (1 GiB RUs, 8 MiB chunks, 95%, no FDP)", "",
              "| RUs | pages per slot | today | dealloc |", "|---|---|---|---|"]
        cells = {}
        for r in rc:
            cells.setdefault((r["n_rus"], r["slot_bytes"] // r["page_bytes"]), {})[r["lever"]] = r
        for (n, pps), d in sorted(cells.items()):
            L.append(f"| {n} | {pps} | {_w(d.get('today'))} | {_w(d.get('dealloc'))} |")
    ot = operator_table(rows, target)
    if ot:
        L += ["", f"## Operator table (target WAF <= {target})", "",
              "| drive RU | chunk | utilisation | WAF today | set | expected WAF | hit ratio |", "|---|---|---|---|---|---|---|"]
        for o in ot:
            L.append(f"| {_size(o['ru_bytes'])} | {_size(o['slot_bytes'])} | {o['util']:.0%} | {o['today']:.3f} | "
                     f"{o['settings']} | {o['waf']:.3f} | {o['hit_ratio']:.3f} |")
    if val:
        L += ["", "## Validation", "", f"Uniform random single-page overwrites, {val['geometry']}; model: "
              f"{val['model']}.", "", "| op | model | greedy | cost-benefit |", "|---|---|---|---|"]
        for u in val["uniform"]:
            L.append(f"| {u['op']} | {u['model']:.3f} | {u['greedy']:.3f} | {u['cost_benefit']:.3f} |")
        sg = val.get("study_geometry")
        if sg:
            L += ["", "On the study's own geometry (1 GiB RUs, 8 MiB slots: 128 slots per RU, 256 RUs, a page 1/8 "
                  "of a slot; uniform random whole-slot overwrites), before and after counting the 2 RUs garbage "
                  "collection keeps empty outside the spare (before, they came out of it):", "",
                  "| op | model | greedy before | greedy | FIFO victims before | FIFO victims |", "|---|---|---|---|---|---|"]
            for u in sg:
                L.append(f"| {u['op']} | {u['model']:.3f} | " + " | ".join(
                    f"{u[k]:.3f} ({100 * u[k + '_error']:+.1f}%)" for k in ("greedy_before", "greedy", "fifo_before",
                                                                           "fifo")) + " |")
        L += ["", "Deallocation: uniform random slot frees through the cache model (a random live entry deleted, a "
              "new one stored), freed slots deallocated at the checkpoint that makes them reusable (every 256 "
              "puts); drive spare 10%. The model's WAF is taken at the effective spare factor (physical - live "
              "pages) / live pages, live pages averaged over the window:", "",
              "| live slots | dealloc | effective spare | simulated WAF | model at effective spare | error | "
              "model at the drive's spare |", "|---|---|---|---|---|---|---|"]
        for d in val.get("dealloc", []) + val.get("dealloc_off", []):
            L.append(f"| {d['live']:.0%} | {'on' if d['dealloc'] else 'off'} | {d['effective_op']:.3f} | "
                     f"{d['waf']:.3f} | {d['model']:.3f} | {100 * (d['waf'] - d['model']) / d['model']:+.1f}% | "
                     f"{d['model_at_drive_op']:.3f} |")
        t = val["two_lifetimes"]
        L += ["", f"Two lifetimes (10% of the space takes 90% of the writes, op 28%): mixed {t['mixed']:.3f}, "
              f"separated {t['separated']:.3f}, separated with persistently isolated handles "
              f"{t['separated_persistent']:.3f}."]
    if anc:
        c, m = anc["cachelib"], anc["lmcache"]
        L += ["", "## Published anchors", "", f"CacheLib with FDP ({c['model']}):", "",
              "| util | published no FDP -> FDP | simulated no FDP -> FDP |", "|---|---|---|"]
        for u in ("1.0", "0.5"):
            p, s = c["published"][f"util_{u}"], c["simulated"][f"util_{u}"]
            L.append(f"| {float(u):.0%} | {p[0]:.2f} -> {p[1]:.2f} | {s[0]:.2f} -> {s[1]:.2f} |")
        s = m["simulated"]
        L += ["", f"LMCache's FDP change ({m['model']}): published 2.600 -> 1.425; simulated "
              f"{s['mixed']['cumulative_4x']:.3f} -> {s['separated']['cumulative_4x']:.3f} (initially isolated), "
              f"{s['separated_persistent']['cumulative_4x']:.3f} (persistently isolated); in steady state "
              f"{s['mixed']['steady']:.3f} -> {s['separated']['steady']:.3f} / "
              f"{s['separated_persistent']['steady']:.3f}."]
        o = m.get("our_workload_levers")
        if o:
            L += ["", "Our LMCache-shaped workload at the anchor's 89% utilisation and 7% spare (1 GiB RUs): " +
                  ", ".join(f"{k} {v['steady']:.3f}" for k, v in o.items()) + " (steady state)."]
        ns = anc.get("not_steady_state")
        if ns:
            L += ["", "A drive not in steady state (fresh, half a drive write at 95%): " +
                  ", ".join(f"{k} {v:.3f}" for k, v in ns.items()) + ": every mode equal, WAF 1, because "
                  "nothing has been collected yet."]
    return "\n".join(L) + "\n"


def _save(plt, fig, out: str, name: str) -> str:
    """Lay out, write and close one figure: its path."""
    fig.tight_layout()
    path = os.path.join(out, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plots(rows: list[dict], val: Optional[dict], out: str) -> tuple[list[str], Optional[str]]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "matplotlib is not importable: no plots (pip install matplotlib)"
    files = []
    utils = sorted({r["util"] for r in rows})
    lev = [r for r in rows if r["part"] == "levers"]
    if lev:
        names = [n for n in LEVERS if any(r["lever"] == n for r in lev)]
        fig, ax = plt.subplots(figsize=(13, 5))
        width = 0.8 / len(utils)
        for j, util in enumerate(utils):
            sel = {r["lever"]: r for r in lev if r["util"] == util}
            xs = [i + j * width for i in range(len(names))]
            ys = [min(sel[n]["waf"], 3) if n in sel else 0 for n in names]
            ax.bar(xs, ys, width, label=f"util {util:.0%}")
        ax.axhline(1.05, color="k", ls="--", lw=0.8, label="WAF 1.05")
        ax.set_xticks([i + width * (len(utils) - 1) / 2 for i in range(len(names))])
        ax.set_xticklabels(names, rotation=40, ha="right", fontsize=7)
        ax.set_ylabel("WAF (media / host writes)")
        ax.set_ylim(0.9, max(1.2, max(min(r["waf"], 3) for r in lev) + 0.05))
        ax.set_title("Simulated WAF per lever, 1 GiB reclaim units, 8 MiB chunks")
        ax.legend(fontsize=8)
        files.append(_save(plt, fig, out, "waf_per_lever.png"))
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for n in ("today", "dealloc", "evict_ahead", "evict_ahead+dealloc", "ru_groups+dealloc",
                  "separated:tp_worker", "second_hit"):
            pts = sorted((r["util"], r["waf"]) for r in lev if r["lever"] == n)
            if pts:
                ax.plot([u for u, _ in pts], [w for _, w in pts], marker="o", label=n)
        ax.axhline(1.05, color="k", ls="--", lw=0.8)
        ax.set_xlabel("utilisation (fraction of the drive's logical space in slots)")
        ax.set_ylabel("WAF")
        ax.set_title("WAF against utilisation, 1 GiB RUs, 8 MiB chunks")
        ax.legend(fontsize=7)
        files.append(_save(plt, fig, out, "waf_vs_utilisation.png"))
    en = [r for r in rows if r["part"] == "endurance" and r["ru_bytes"] == GIB and r["meta_format"] == "log"
          and r["lever"] in ENDURANCE_LEVERS]
    if en:
        op0 = min(r["op"] for r in en)
        wls = sorted({r["workload"] for r in en}, key=lambda w: w != "lmcache_defaults")
        eus = sorted({r["util"] for r in en})
        fig, axes = plt.subplots(len(wls), len(eus), figsize=(5.5 * len(eus), 4 * len(wls)), squeeze=False,
                                 sharey=True)
        for i, wl in enumerate(wls):
            for j, util in enumerate(eus):
                ax = axes[i][j]
                for n in ENDURANCE_LEVERS:
                    pts = sorted((r["concurrency"], r["waf"]) for r in en if r["workload"] == wl and r["util"] == util
                                 and r["lever"] == n and r["op"] == op0 and r["waf"] != float("inf"))
                    if pts:
                        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=n)
                ax.set_xscale("log", base=2)
                ax.axhline(1.02, color="k", ls="--", lw=0.8)
                ax.set_xlabel("conversations in flight (x the study's)")
                ax.set_ylabel("WAF")
                ax.set_title(f"{wl}, {util:.0%}, spare {op0:.0%}, 1 GiB RUs, log", fontsize=9)
                ax.legend(fontsize=7)
        files.append(_save(plt, fig, out, "waf_endurance.png"))
    sw = [r for r in rows if r["part"] == "sweep"]
    if sw:
        show = [u for u in (0.95, 1.0) if u in utils] or utils[-1:]
        slots = sorted({r["slot_bytes"] for r in sw})
        fig, axes = plt.subplots(len(show), len(slots), figsize=(5.5 * len(slots), 4 * len(show)), squeeze=False,
                                 sharey="row")
        for i, util in enumerate(show):
            for j, sb in enumerate(slots):
                ax = axes[i][j]
                for n in SWEEP_LEVERS:
                    pts = sorted((r["ru_bytes"] / GIB, r["waf"]) for r in sw
                                 if r["slot_bytes"] == sb and r["util"] == util and r["lever"] == n
                                 and r["waf"] != float("inf"))
                    if pts:
                        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=n)
                ax.set_xscale("log", base=2)
                ticks = sorted({r["ru_bytes"] for r in sw})
                ax.set_xticks([t / GIB for t in ticks])
                ax.set_xticklabels([_size(t) for t in ticks])
                ax.axhline(1.05, color="k", ls="--", lw=0.8)
                ax.set_xlabel("reclaim unit size")
                ax.set_ylabel("WAF")
                ax.set_title(f"{_size(sb)} chunks, utilisation {util:.0%}")
                ax.legend(fontsize=7)
        files.append(_save(plt, fig, out, "waf_vs_ru_size.png"))
    if val and val.get("dealloc"):
        fig, ax = plt.subplots(figsize=(6, 4.5))
        import math

        xs = [0.1 + i * 0.02 for i in range(100)]
        ax.plot(xs, [greedy_uniform_waf(x) for x in xs], label="analytic (greedy, uniform random)")
        d = val["dealloc"]
        ax.scatter([x["effective_op"] for x in d], [x["waf"] for x in d], color="C1", zorder=3,
                   label="simulated, dealloc on (at effective spare)")
        off = val.get("dealloc_off", [])
        ax.scatter([x["op"] for x in off], [x["waf"] for x in off], color="C3", marker="x", zorder=3,
                   label="simulated, dealloc off (at the drive's spare)")
        ax.set_xscale("log")
        ax.set_xlabel("spare factor (physical - live) / live")
        ax.set_ylabel("WAF")
        ax.set_title("Deallocation validation: uniform random slot frees")
        ax.legend(fontsize=7)
        ax.set_ylim(1, max(6, math.ceil(max(x["waf"] for x in d + off))))
        files.append(_save(plt, fig, out, "dealloc_validation.png"))
    return files, None


def write_study(out: str, study: dict, val: Optional[dict], anc: Optional[dict], argv: list[str],
                plot: bool = True) -> list[str]:
    os.makedirs(out, exist_ok=True)
    rows = summarize(study)
    doc = dict(study, command=" ".join(argv), scale={"pages_per_slot": PAGES_PER_SLOT, "n_rus": N_RUS,
                                                     "min_rus": MIN_RUS, "max_pages": MAX_PAGES, "op": OP,
                                                     "handles": HANDLES, "ref_slots": REF_SLOTS},
               summary=rows, operator_table=operator_table(rows), validation=val, anchors=anc)
    files = []
    p = os.path.join(out, "results.json")
    with open(p, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    files.append(p)
    p = os.path.join(out, "summary.md")
    with open(p, "w") as f:
        f.write(markdown(study, rows, val, anc, argv))
    files.append(p)
    p = os.path.join(out, "COMMAND")
    with open(p, "w") as f:
        f.write(" ".join(argv) + "\n")
    files.append(p)
    if plot:
        more, note = plots(rows, val, out)
        files += more
        if note:
            print(f"note: {note}", file=sys.stderr)
    return files
