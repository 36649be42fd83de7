"""One simulated run: a workload through the cache model onto a simulated drive, measured in
steady state."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

from lmcache_rawblock.admission import Admission

from .ftl import FlashSim, Geometry
from .stream import CacheConfig, CacheModel, SimSink
from .workload import WorkloadSpec, generate


def slot_bytes_for(spec: WorkloadSpec, geometry: Geometry, header_bytes: int = 4096) -> int:
    """A slot holds a header and a full object, rounded up to whole simulated pages."""
    pb = geometry.page_bytes
    return -(-(header_bytes + spec.object_bytes) // pb) * pb


def spec_for_slot(spec: WorkloadSpec, slot_bytes: int, header_bytes: int = 4096) -> WorkloadSpec:
    """``spec`` with full objects of ``slot_bytes - header_bytes``: a slot of exactly
    ``slot_bytes`` (the study's "chunk" size is the slot's)."""
    return replace(spec, chunk_bytes=(slot_bytes - header_bytes) * spec.tp)


V1_CONTAINER_MAX = 64 << 20  # format v1's container on a device (128 MiB of metadata, two containers)


def meta_bytes_for(meta_format: str, capacity_bytes: int, slot_bytes: int, page_bytes: int,
                   entry_bytes: int = CacheConfig.checkpoint_entry_bytes) -> int:
    """The metadata region of the simulated cache: the log format's, 4 pages (the log is written
    in whole pages, so its size does not change the bytes written); format v1's, two containers
    each large enough for the whole index (every v1 checkpoint rewrites it whole), at most
    :data:`V1_CONTAINER_MAX` each."""
    if meta_format != "v1":
        return 4 * page_bytes
    index = min(V1_CONTAINER_MAX, max(1, capacity_bytes // slot_bytes) * entry_bytes)
    return 2 * max(2, -(-index // page_bytes)) * page_bytes


def simulate_lmcache(geometry: Geometry, spec: WorkloadSpec, *, util: float, mode: str,
                     strategy: Optional[str] = None, admission: str = "always", policy: str = "greedy",
                     isolation: str = "initial", warmup: float = 2.0, measure: float = 2.0,
                     dealloc: bool = True, checkpoint_every: int = 2000, reuse: str = "lifo",
                     evict_ahead: Optional[tuple] = None, meta_format: str = "log",
                     meta_bytes: Optional[int] = None, dealloc_skip_on_demand: bool = False) -> dict:
    """WAF of ``spec`` on a cache using ``util`` of the drive's logical space, after ``warmup``
    drive writes (host bytes / logical bytes), over ``measure`` more. Also the WAF from the
    start, at each whole drive write (``cumulative``). ``reuse``, ``evict_ahead``,
    ``meta_format``: :class:`.stream.CacheConfig`; with ``reuse="ru_groups"`` a group is one
    reclaim unit's worth of slots."""
    if not 0.0 < util <= 1.0:
        raise ValueError(f"util must be in (0, 1] (fraction of the drive's logical space the cache uses), got {util!r}")
    for name, v in (("warmup", warmup), ("measure", measure)):
        if not v >= 0 or (name == "measure" and v == 0):
            raise ValueError(f"{name} must be {'> 0' if name == 'measure' else '>= 0'} drive writes, got {v!r}")
    sim = FlashSim(geometry, policy=policy, isolation=isolation)
    slot_bytes = slot_bytes_for(spec, geometry)
    meta = meta_bytes or meta_bytes_for(meta_format, int(util * geometry.logical_bytes), slot_bytes,
                                        geometry.page_bytes)
    ru_bytes = geometry.ru_pages * geometry.page_bytes
    cfg = CacheConfig(capacity_bytes=int(util * geometry.logical_bytes), slot_bytes=slot_bytes,
                      meta_total_bytes=meta, dealloc=dealloc, tp=spec.tp, checkpoint_every=checkpoint_every,
                      reuse=reuse, group_slots=max(1, ru_bytes // slot_bytes), evict_ahead=evict_ahead,
                      meta_format=meta_format, meta_io_bytes=geometry.page_bytes,
                      dealloc_skip_on_demand=dealloc_skip_on_demand)
    model = CacheModel(cfg, mode, strategy, SimSink(sim), Admission(admission))
    events = generate(replace(spec, requests=0))
    L = geometry.logical_bytes
    t0 = time.perf_counter()
    cumulative = []
    done = 0.0
    target = warmup + measure
    while done < warmup:
        step = min(1.0, warmup - done)
        done += step
        model.feed(events, stop_bytes=int(done * L))
        cumulative.append({"drive_writes": round(done, 3), "waf": sim.counters.waf()})
    sim.mark()
    stats0 = model.stats.to_dict()
    while done < target:
        step = min(1.0, target - done)
        done += step
        model.feed(events, stop_bytes=int(done * L))
        cumulative.append({"drive_writes": round(done, 3), "waf": sim.counters.waf()})
    w = sim.window()
    st = model.stats.to_dict()
    window_stats = {k: st[k] - stats0[k] for k in st if k != "hit_ratio"}
    window_stats["hit_ratio"] = (window_stats["hits"] / window_stats["lookups"]) if window_stats["lookups"] else None
    return {
        "mode": mode, "strategy": strategy if mode == "separated" else None, "util": util, "admission": admission,
        "dealloc": dealloc, "dealloc_skip_on_demand": dealloc_skip_on_demand, "reuse": reuse, "evict_ahead": list(evict_ahead) if evict_ahead else None,
        "meta_format": meta_format, "gc_policy": policy, "isolation": isolation, "warmup_drive_writes": warmup, "measure_drive_writes": measure,
        "waf": w.waf(), "window": w.to_dict(), "cumulative_waf": sim.counters.waf(), "cumulative": cumulative,
        "cache": window_stats, "slots": cfg.n_slots, "slot_bytes": cfg.slot_bytes,
        "handles_used": len(sim._handles), "seconds": round(time.perf_counter() - t0, 2),
    }
