"""The ``loadcost`` part: cost-aware loads (``lmcache_rawblock.load_cost``) on the capped drives rig.

A cache over N capped RAM devices (``rig.CappedDrives``: zram in a cgroup v1 blkio group, reads
and writes capped per device), io_uring with ``io_scheduler: fifo`` by default (one queue, as
LMCache's own engine has: a load waits behind the stores queued before it). One prompt of
``max(prefixes)`` chunks is stored while the devices are idle; then requests for its first k
chunks, k cycling through ``prefixes``, each asked twice back to back (order alternating):

- without the policy: the k held chunks are loaded (``load_many_into``); time to data is the
  measured load;
- with it: ``load_cost.PrefixPricer`` decides how many leading chunks are worth loading (n, at
  ``recompute_tps`` tokens per second and ``tokens_per_chunk`` tokens a chunk); those are loaded
  and the rest recomputed: time to data is the decision plus the measured load of n chunks plus
  the modelled recompute of k - n chunks (there is no GPU: a chunk's recompute is
  tokens_per_chunk / recompute_tps seconds).

A load "finished after recompute" when its measured time exceeds the modelled recompute of the
chunks it loaded. First a few idle requests, then the same while ``writers`` threads store
``per_call`` chunks per ``put_many`` back to back over every device (each call's keys deleted
and a checkpoint written after it, so the stores never run out of slots): the devices saturated
by stores. Per phase and mode: requests, loads, the share of loads that finished after recompute,
and the mean time to data over all requests (served or recomputed).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .common import MiB, fmt_size
from .core import BLOCK, Arena, close_core, object_keys

MB = 1000 * 1000
META = 4 * MiB


@dataclass
class LoadCostSettings:
    n: int = 2  # devices
    chunk: int = 1 * MiB
    tokens_per_chunk: int = 256
    recompute_tps: float = 10_000.0  # the engine's prefill speed the policy is given
    read_bps: int = 200 * MB
    write_bps: int = 100 * MB
    prefixes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    idle_requests: int = 12
    busy_requests: int = 60
    writers: int = 4
    per_call: int = 8
    engine: str = "io_uring"
    io_scheduler: str = "fifo"
    queue_depth: int = 4  # the stores fill the ring, as they fill a drive's queue
    gap_s: float = 0.05  # between two requests
    warm_s: float = 1.0  # stores running before the first busy request
    backend: str = "zram"

    def describe(self) -> dict:
        return {"n": self.n, "chunk": self.chunk, "tokens_per_chunk": self.tokens_per_chunk,
                "recompute_tps": self.recompute_tps, "read_bps": self.read_bps, "write_bps": self.write_bps,
                "prefixes": list(self.prefixes), "idle_requests": self.idle_requests,
                "busy_requests": self.busy_requests, "writers": self.writers, "per_call": self.per_call,
                "engine": self.engine, "io_scheduler": self.io_scheduler, "queue_depth": self.queue_depth,
                "gap_s": self.gap_s, "warm_s": self.warm_s, "backend": self.backend, "use_odirect": True,
                "meta_total_bytes": META,
                "rig": "RAM block devices (rig.CappedDrives), cgroup v1 blkio throttle per device"}


SUITES = {
    "smoke": LoadCostSettings(prefixes=[1, 4, 8], idle_requests=3, busy_requests=6, writers=2, per_call=4,
                              warm_s=0.3),
    "quick": LoadCostSettings(),
    "full": LoadCostSettings(busy_requests=180, idle_requests=24),
}


def steps(s: LoadCostSettings) -> int:
    return 3


def device_bytes(s: LoadCostSettings) -> int:
    slot = s.chunk + BLOCK
    need = META + (max(s.prefixes) + 2 * s.writers * s.per_call + 8) * slot * 2
    return int(-(-need // MiB) * MiB)


def _open(devices: list[str], s: LoadCostSettings) -> Any:
    from lmcache_rawblock.raw_block import MultiDeviceCore, RawBlockCore, RawBlockCoreConfig

    from .core import config_kwargs

    kw = dict(slot_bytes=s.chunk + BLOCK, meta_total_bytes=META, io_engine=s.engine, use_odirect=True,
              enable_zero_copy=True, iouring_queue_depth=s.queue_depth)
    if s.engine == "io_uring":
        kw["io_scheduler"] = s.io_scheduler
    cfgs = [RawBlockCoreConfig(**config_kwargs(d, **kw)) for d in devices]
    if len(cfgs) == 1:
        return RawBlockCore(cfgs[0], key_namespace="object")
    return MultiDeviceCore(cfgs, key_namespace="object")


class _Writers:
    """Threads storing per_call chunks per put_many back to back (deleted and checkpointed after)."""

    def __init__(self, cache: Any, arena: Arena, base: int, s: LoadCostSettings) -> None:
        self.cache, self.s, self.stop = cache, s, threading.Event()
        self.stored, self.errors = [0] * s.writers, []  # type: ignore[var-annotated]
        self.srcs = [[arena.obj(base + w * s.per_call + j, 0x60 + j) for j in range(s.per_call)]
                     for w in range(s.writers)]
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(s.writers)]
        self.t0 = 0.0

    def _run(self, w: int) -> None:
        n = 0
        while not self.stop.is_set():
            keys = object_keys(n + self.s.per_call, tag=f"burst{w}")[n:]
            n += self.s.per_call
            r = self.cache.put_many(keys, self.srcs[w])
            if not all(r.results):
                self.errors.append(f"put_many under load: {r.failure}")
                return
            self.stored[w] += len(keys) * self.s.chunk
            self.cache.delete_many([k.encoded for k in keys])
            self.cache.checkpoint_now()

    def __enter__(self) -> _Writers:
        self.t0 = time.perf_counter()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        self.elapsed = time.perf_counter() - self.t0


def _request(cache: Any, pricer: Any, enc: list[str], objs: list[Any], k: int, policy: bool,
             s: LoadCostSettings) -> dict:
    per_chunk = s.tokens_per_chunk / s.recompute_tps
    t0 = time.perf_counter()
    n = pricer.prefix(enc[:k]) if policy else k
    decide = time.perf_counter() - t0
    load = 0.0
    if n:
        t1 = time.perf_counter()
        got = cache.load_many_into(enc[:n], objs[:n])
        load = time.perf_counter() - t1
        if not all(got):
            raise RuntimeError(f"a stored chunk was not loaded ({got.count(False)} of {n} missed)")
    return {"policy": policy, "k": k, "loaded": n, "decide_s": decide, "load_s": load,
            "recompute_loaded_s": n * per_chunk, "late": bool(n and load > n * per_chunk),
            "ttd_s": decide + load + (k - n) * per_chunk, "recompute_all_s": k * per_chunk}


def _phase(cache: Any, pricer: Any, enc: list[str], objs: list[Any], count: int, s: LoadCostSettings) -> list[dict]:
    rows = []
    for i in range(count):
        k = s.prefixes[i % len(s.prefixes)]
        order = (True, False) if i % 2 else (False, True)
        for policy in order:
            rows.append(_request(cache, pricer, enc, objs, k, policy, s))
            time.sleep(s.gap_s)
    return rows


def summarize(rows: list[dict]) -> dict:
    """Per mode ("policy" / "no_policy"): requests, loads, late loads and their share, the mean
    time to data, and per prefix length the chunks loaded and the mean time to data."""
    out: dict[str, Any] = {}
    for policy, name in ((True, "policy"), (False, "no_policy")):
        rs = [r for r in rows if r["policy"] is policy]
        loads = [r for r in rs if r["loaded"]]
        late = [r for r in loads if r["late"]]
        by_k = {}
        for k in sorted({r["k"] for r in rs}):
            kr = [r for r in rs if r["k"] == k]
            by_k[str(k)] = {"requests": len(kr), "mean_loaded": statistics.fmean(r["loaded"] for r in kr),
                            "mean_ttd_s": statistics.fmean(r["ttd_s"] for r in kr),
                            "mean_load_s": statistics.fmean(r["load_s"] for r in kr),
                            "recompute_s": kr[0]["recompute_all_s"]}
        out[name] = {"requests": len(rs), "loads": len(loads), "late_loads": len(late),
                     "late_share": len(late) / len(loads) if loads else 0.0,
                     "refused": sum(1 for r in rs if r["loaded"] == 0),
                     "truncated": sum(1 for r in rs if 0 < r["loaded"] < r["k"]),
                     "mean_ttd_s": statistics.fmean(r["ttd_s"] for r in rs) if rs else None,
                     "by_prefix": by_k}
    p, q = out["policy"]["mean_ttd_s"], out["no_policy"]["mean_ttd_s"]
    out["ttd_ratio"] = p / q if p is not None and q else None
    return out


def run_loadcost(s: LoadCostSettings, bar: Any) -> dict:
    from lmcache_rawblock.load_cost import PrefixPricer

    from . import rig  # here: ``python -m lmcache_rawblock_bench.rig`` runs it as __main__
    why = rig.why_unavailable(rig.BLKIO, s.backend)
    if why:
        bar.update(steps(s))
        return {"available": False, "error": why, "settings": s.describe()}
    out: dict[str, Any] = {"available": True, "settings": s.describe()}
    with rig.CappedDrives(s.n, device_bytes(s), s.read_bps, s.write_bps, s.backend) as d:
        out["rig"] = d.describe()
        out["caps_read_back"] = d.caps()
        d.wipe(META)
        cache = _open(d.devices, s)
        try:
            kmax = max(s.prefixes)
            arena = Arena(kmax + 1 + s.writers * s.per_call, s.chunk)
            if s.engine == "io_uring":
                cache.register_fixed_buffers_from_allocator(arena)
            prompt = object_keys(kmax, tag="prompt")
            if not all(cache.put_many(prompt, [arena.obj(0, 0x41)] * kmax).results):
                raise RuntimeError("the prompt's chunks were not all stored")
            enc = [k.encoded for k in prompt]
            objs = [arena.obj(1 + i, 0) for i in range(kmax)]
            pricer = PrefixPricer(cache, tokens_per_key=s.tokens_per_chunk, recompute_tps=s.recompute_tps)
            bar.set_description_str("loadcost idle")
            idle = _phase(cache, pricer, enc, objs, s.idle_requests, s)
            bar.update(1)
            bar.set_description_str("loadcost under stores")
            with _Writers(cache, arena, 1 + kmax, s) as w:
                time.sleep(s.warm_s)
                busy = _phase(cache, pricer, enc, objs, s.busy_requests, s)
                queue_seen = pricer.status()
            bar.update(1)
            if w.errors:
                raise RuntimeError(w.errors[0])
            out["store_bytes_per_s_during"] = sum(w.stored) / w.elapsed
            out["estimator_during_stores"] = queue_seen
            out["accounted_total"] = d.service_bytes()
        finally:
            close_core(cache)
    out["idle"] = {"rows": idle, **summarize(idle)}
    out["busy"] = {"rows": busy, **summarize(busy)}
    bar.update(1)
    return out


def print_rows(lc: dict) -> list[list[str]]:
    rows = []
    for phase in ("idle", "busy"):
        for mode in ("no_policy", "policy"):
            m = lc[phase][mode]
            rows.append([phase, mode.replace("_", " "), str(m["requests"]), str(m["loads"]), str(m["refused"]),
                         str(m["truncated"]), f"{100 * m['late_share']:.0f} %", f"{1000 * m['mean_ttd_s']:.1f}"])
    return rows


def describe_rig(s: dict) -> str:
    return (f"{s['n']} x zram capped at {s['read_bps'] / MB:g} MB/s read, {s['write_bps'] / MB:g} MB/s write; "
            f"{fmt_size(s['chunk'])} chunks of {s['tokens_per_chunk']} tokens, recompute {s['recompute_tps']:g} "
            f"tokens/s; {s['engine']} {s['io_scheduler']} QD{s['queue_depth']}; {s['writers']} writers x "
            f"{s['per_call']} chunks per put")
