"""The ``drives`` part: the cache over N drives of known speed (``rig.CappedDrives``: loop devices
over tmpfs files, each capped in a blkio cgroup), so that the limit of every figure is exactly
N x cap.

For N = 1, 2, 4 (and 8 in the full suite) capped devices and 8 / 32 MiB chunks:

- store and load bandwidth of our cache (``put_many`` / ``load_many_into`` of a few chunks per
  device per call, O_DIRECT, registered buffers on io_uring), as a share of N x cap, beside fio
  with N jobs (one per device, io_uring, the same block size) on the same rig, and, on one device,
  beside LMCache's core (its ``RawBlockCore`` over the Rust wheel) when ``lmcache`` imports;
- CPU seconds of the process per GB moved, against N (the loop devices' copies run in the
  kernel's loop workers, not in the process);
- load latency on one device: p50 / p99 of one-chunk ``load_many_into`` idle, and while another
  thread's stores keep the write budget saturated, per ``io_scheduler`` value when the core has
  that setting (else today's single queue only).

N > 1 runs through ``lmcache_rawblock.raw_block.MultiDeviceCore`` (``driver`` in each row says
which class drove it).
Every row also carries what the group's throttle accounted per device
(``blkio.throttle.io_service_bytes``), which must cover the bytes the row moved: proof that the
caps bound that I/O.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .common import MiB, fmt_size
from .core import BLOCK, Arena, PlainObj, close_core, object_keys, open_core

if TYPE_CHECKING:
    from . import rig

MB = 1000 * 1000
META = 4 * MiB


@dataclass
class DrivesSettings:
    ns: list[int] = field(default_factory=lambda: [1, 2, 4])
    chunks: list[int] = field(default_factory=lambda: [8 * MiB, 32 * MiB])
    read_bps: int = 100 * MB
    write_bps: int = 100 * MB
    seconds: float = 3.0  # per bandwidth figure
    per_call: int = 2  # chunks per device per put_many / load_many_into
    engines: list[str] = field(default_factory=lambda: ["io_uring", "posix"])
    queue_depth: int = 32
    fio_depth: int = 4
    lat_chunk: int = 8 * MiB  # one load's size in the latency figures
    lat_store_chunk: int = 32 * MiB  # the stores running beside them
    lat_samples: int = 200
    lat_depths: list[int] = field(default_factory=lambda: [4, 32])  # io_uring ring depths of the latency series
    lat_read_bps: int = 0  # the latency device's read cap (0: none, so the throttle's slices do not mask queueing)
    lat_seconds: float = 12.0  # at most, per latency series
    backend: str = "zram"  # rig.BACKENDS: zram charges every engine's bytes once

    def describe(self) -> dict:
        return {"ns": list(self.ns), "chunks": list(self.chunks), "read_bps": self.read_bps,
                "write_bps": self.write_bps, "seconds": self.seconds, "per_call": self.per_call,
                "engines": list(self.engines), "queue_depth": self.queue_depth, "fio_depth": self.fio_depth,
                "lat_chunk": self.lat_chunk, "lat_store_chunk": self.lat_store_chunk,
                "lat_samples": self.lat_samples, "lat_seconds": self.lat_seconds,
                "lat_depths": list(self.lat_depths), "lat_read_bps": self.lat_read_bps,
                "use_odirect": True, "enable_zero_copy": True, "meta_total_bytes": META,
                "backend": self.backend,
                "rig": "RAM block devices (rig.CappedDrives), cgroup v1 blkio throttle per device"}


SUITES = {
    "smoke": DrivesSettings(ns=[1, 2], chunks=[1 * MiB], seconds=0.5, engines=["io_uring"], lat_chunk=1 * MiB,
                            lat_store_chunk=2 * MiB, lat_samples=8, lat_seconds=2.0, read_bps=400 * MB,
                            write_bps=400 * MB, lat_depths=[4]),
    "quick": DrivesSettings(),
    "full": DrivesSettings(ns=[1, 2, 4, 8], seconds=6.0, lat_samples=500, lat_seconds=30.0),
}


def steps(s: DrivesSettings) -> int:
    return len(s.ns) * len(s.chunks) + 1


def device_bytes(s: DrivesSettings) -> int:
    """Room for the chunks one bandwidth figure stores on a device, with margin."""
    slot = max(s.chunks + [s.lat_store_chunk]) + BLOCK
    stored = (s.seconds + WARMUP_S) * max(s.write_bps, 50 * MB) * 1.5 + 4 * s.per_call * slot
    lat = s.lat_seconds * max(s.write_bps, 50 * MB) * 1.5 + 4 * slot
    need = META + max(stored, lat) + 8 * slot
    return int(-(-need // MiB) * MiB)


# ---------------------------------------------------------------------------- the caches


def has_setting(name: str) -> bool:
    from lmcache_rawblock.settings import SETTINGS

    return name in SETTINGS


def _core_kwargs(chunk: int, engine: str, qd: int, extra: dict | None) -> dict:
    return dict(slot_bytes=chunk + BLOCK, meta_total_bytes=META, io_engine=engine, use_odirect=True,
                enable_zero_copy=True, iouring_queue_depth=qd, **(extra or {}))


def open_cache(comp: Any, devices: list[str], chunk: int, engine: str, qd: int,
               extra: dict | None = None) -> tuple[Any, str]:
    """A cache over devices: (the cache, which class drives it). N > 1: MultiDeviceCore, one
    RawBlockCore per device with the same settings."""
    kw = _core_kwargs(chunk, engine, qd, extra)
    if len(devices) == 1:
        return open_core(comp, devices[0], **kw), "RawBlockCore"
    from lmcache_rawblock.raw_block import MultiDeviceCore, RawBlockCoreConfig

    from .core import config_kwargs

    cfgs = [RawBlockCoreConfig(**config_kwargs(d, **kw)) for d in devices]
    return MultiDeviceCore(cfgs, key_namespace="object"), "MultiDeviceCore"


def reset_devices(d: rig.CappedDrives) -> None:
    """Every device's metadata region overwritten outside the throttle, so that the next cache
    opens on a device without another layout's metadata."""
    d.wipe(META)


# ---------------------------------------------------------------------------- bandwidth


WARMUP_S = 0.5  # untimed: the throttle lets a device's first slice through in a burst


def _pump(fn: Callable[[int], int], seconds: float, warmup: float = WARMUP_S) -> tuple[float, float, float]:
    """Call fn(round) for warmup seconds untimed, then until seconds have passed; (bytes, wall
    seconds, CPU seconds) of the timed calls."""
    done, k = 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup:
        fn(k)
        k += 1
    c0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        done += fn(k)
        k += 1
    return done, time.perf_counter() - t0, time.process_time() - c0


def measure_cache(cache: Any, n: int, chunk: int, s: DrivesSettings, tag: str, real: bool = False) -> dict:
    """Store then load bandwidth of one cache: fresh keys every store call; loads cycle over
    what was stored; the bytes loaded are checked against the bytes stored once."""
    per = s.per_call * n
    arena = Arena(2 * per, chunk, real=real)
    src = [arena.obj(i, 0x30 + i % 64) for i in range(per)]
    dst = [arena.obj(per + i, 0) for i in range(per)]
    if hasattr(cache, "register_fixed_buffers_from_allocator"):
        cache.register_fixed_buffers_from_allocator(arena)
    stored: list[list] = []

    def store(k: int) -> int:
        keys = _keys(per * k, per, tag)
        res = cache.put_many(keys, src)
        ok = res.results if hasattr(res, "results") else res
        if not all(ok):
            raise RuntimeError(f"put_many stored {sum(ok)} of {per} keys ({fmt_size(chunk)}, N={n}): "
                               f"{getattr(res, 'failure', '')}")
        stored.append([x.encoded for x in keys])
        return per * chunk

    def load(k: int) -> int:
        ok = cache.load_many_into(stored[k % len(stored)], dst)
        if not all(ok):
            raise RuntimeError(f"load_many_into missed {ok.count(False)} of {per} keys ({fmt_size(chunk)}, N={n})")
        return per * chunk

    sb, sw, sc = _pump(store, s.seconds)
    load(0)
    if any(bytes(dst[i].byte_array[:4096]) != bytes(src[i].byte_array[:4096]) for i in range(per)):
        raise RuntimeError(f"a load returned other bytes than were stored ({fmt_size(chunk)}, N={n})")
    lb, lw, lc = _pump(load, s.seconds)
    return {"store_bytes": sb, "store_s": sw, "store_cpu_s": sc, "store_bytes_per_s": sb / sw,
            "load_bytes": lb, "load_s": lw, "load_cpu_s": lc, "load_bytes_per_s": lb / lw,
            "cpu_s_per_gb": (sc + lc) / ((sb + lb) / 1e9)}


def _keys(start: int, n: int, tag: str) -> list:
    """n object keys numbered from start (LMCache-shaped, as core.object_keys)."""
    from lmcache_rawblock.raw_block import encode_object_key
    from lmcache_rawblock.raw_block._lmcache import ObjectKey

    return [encode_object_key(ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name=tag, kv_rank=0))
            for i in range(start, start + n)]


def _accounted(d: rig.CappedDrives, before: dict) -> dict:
    now = d.service_bytes()
    return {dev: {k: now[dev][k] - before[dev][k] for k in ("Read", "Write")} for dev in d.devices}


def measure_cell(d: rig.CappedDrives, comps: list[Any], n: int, chunk: int, s: DrivesSettings) -> list[dict]:
    """One (N, chunk) cell: ours per engine (and LMCache's core at N = 1), then fio."""
    from . import rig
    rows = []
    devs = d.devices[:n]
    real = any(c.name == "lmcache" for c in comps)  # LMCache's memory objects for both, when it is there
    for comp in comps:
        if comp.name != "ours" and n != 1:
            continue
        for engine in s.engines:
            reset_devices(d)
            before = d.service_bytes()
            cache, driver = open_cache(comp, devs, chunk, engine, s.queue_depth)
            try:
                r = measure_cache(cache, n, chunk, s, f"{comp.name}{engine}{n}x{chunk}", real=real)
            finally:
                close_core(cache)
            acc = _accounted(d, before)
            rows.append({"who": comp.name, "engine": engine, "driver": driver, "n": n, "chunk": chunk, **r,
                         "accounted": {k: v for k, v in acc.items() if k in devs},
                         "accounted_covers_io": _covers(acc, devs, r),
                         "threads_outside_group": d.threads_outside()})
    for rw in ("write", "read"):
        f = rig.run_fio(devs, rw, chunk, s.fio_depth, s.seconds, "io_uring", size=d.size - META,
                        extra=[f"--ramp_time={int(WARMUP_S * 1000)}ms"])
        rows.append({"who": "fio", "engine": "io_uring", "driver": f"fio, {n} jobs", "n": n, "chunk": chunk,
                     ("store" if rw == "write" else "load") + "_bytes_per_s": f["bytes_per_s"],
                     "fio_command": f["command"], "fio_version": f["fio_version"]})
    return rows


def _covers(acc: dict, devs: list[str], r: dict) -> bool:
    """The group's throttle saw at least the payload bytes moved, spread over every device."""
    reads = sum(acc[x]["Read"] for x in devs)
    writes = sum(acc[x]["Write"] for x in devs)
    return reads >= r["load_bytes"] and writes >= r["store_bytes"] and all(
        acc[x]["Read"] > 0 and acc[x]["Write"] > 0 for x in devs)


# ---------------------------------------------------------------------------- latency under stores


def _pct(vals: list[float], q: float) -> float | None:
    if not vals:
        return None
    v = sorted(vals)
    return v[min(len(v) - 1, int(q * len(v)))]


def measure_latency(d: rig.CappedDrives, s: DrivesSettings, engine: str, scheduler: str | None,
                    depth: int) -> dict:
    """One device, its reads capped at lat_read_bps: one-chunk loads idle, then while a thread
    stores lat_store_chunk chunks back to back (4 per put_many, at the write cap); p50 / p99 of
    each. With a ring of depth 4 the stores fill it, as they fill a drive's queue."""
    reset_devices(d)
    chunk = max(s.lat_chunk, s.lat_store_chunk)
    extra = {"io_scheduler": scheduler} if scheduler else None
    d.set_caps(d.devices[0], s.lat_read_bps, s.write_bps)
    cache, _ = open_cache(_ours(), d.devices[:1], chunk, engine, depth, extra)
    try:
        arena = Arena(2 + 8, chunk)
        src = arena.obj(0, 0x41)
        dst = arena.obj(1, 0)
        if engine == "io_uring":
            cache.register_fixed_buffers_from_allocator(arena)
        small = PlainObj(s.lat_chunk, view=src.byte_array[:s.lat_chunk])
        probe = object_keys(1, "latprobe")
        cache.put_many(probe, [small])
        into = PlainObj(s.lat_chunk, view=dst.byte_array[:s.lat_chunk])
        enc = [probe[0].encoded]

        # Loads paced at half the read budget: the throttle never holds them, what they wait
        # for is the cache's own queue.
        pace = 2 * s.lat_chunk / s.lat_read_bps if s.lat_read_bps else 0.005

        def series() -> list[float]:
            out: list[float] = []
            t_end = time.perf_counter() + s.lat_seconds
            while len(out) < s.lat_samples and time.perf_counter() < t_end:
                t0 = time.perf_counter()
                if not cache.load_many_into(enc, [into])[0]:
                    raise RuntimeError("the latency probe's key was not loaded")
                out.append(time.perf_counter() - t0)
                time.sleep(max(0.005, pace - out[-1]))
            return out

        for _ in range(3):  # untimed: the first loads after open fault in buffers and ring state
            cache.load_many_into(enc, [into])
        idle = series()
        stop = threading.Event()
        stores = [0]
        big = [arena.obj(2 + i, 0x50 + i) for i in range(4)]
        big = [PlainObj(s.lat_store_chunk, view=b.byte_array[:s.lat_store_chunk]) for b in big]
        errors: list[str] = []

        def writer() -> None:
            k = 0
            while not stop.is_set():
                keys = _keys(4 * k, 4, "latstore")
                res = cache.put_many(keys, big)
                if not all(res.results):
                    errors.append(f"put_many under load: {res.failure}")
                    return
                stores[0] += 4 * s.lat_store_chunk
                k += 1

        th = threading.Thread(target=writer, daemon=True)
        t0 = time.perf_counter()
        th.start()
        time.sleep(0.3)  # the write budget saturated before the first sample
        busy = series()
        stop.set()
        th.join()
        store_bps = stores[0] / (time.perf_counter() - t0)
        if errors:
            raise RuntimeError(errors[0])
    finally:
        close_core(cache)
        d.set_caps(d.devices[0], s.read_bps, s.write_bps)
    label = scheduler or ("none (posix: one call at a time)" if engine == "posix"
                          else "single queue (no io_scheduler setting)")
    return {"engine": engine, "io_scheduler": label, "queue_depth": depth if engine == "io_uring" else None,
            "read_bps": s.lat_read_bps, "write_bps": s.write_bps,
            "load_chunk": s.lat_chunk, "store_chunk": s.lat_store_chunk,
            "idle_p50_s": _pct(idle, 0.5), "idle_p99_s": _pct(idle, 0.99), "idle_samples": len(idle),
            "busy_p50_s": _pct(busy, 0.5), "busy_p99_s": _pct(busy, 0.99), "busy_samples": len(busy),
            "p99_ratio": (_pct(busy, 0.99) or 0) / (_pct(idle, 0.99) or 1),
            "store_bytes_per_s_during": store_bps, "idle_s": idle, "busy_s": busy}


def latency_cases(s: DrivesSettings, schedulers: list) -> list[tuple[str, int, str | None]]:
    """(engine, ring depth, io_scheduler): io_uring at each depth and scheduler, posix once (one
    call at a time: neither setting applies)."""
    out: list[tuple[str, int, str | None]] = []
    for engine in s.engines:
        if engine == "io_uring":
            out += [(engine, qd, sch) for qd in s.lat_depths for sch in schedulers]
        else:
            out.append((engine, s.queue_depth, None))
    return out


def _ours() -> Any:
    from .core import ours_core

    return ours_core()


# ---------------------------------------------------------------------------- the part


def _shares(rows: list[dict], s: DrivesSettings) -> None:
    for r in rows:
        for side, cap in (("store", s.write_bps), ("load", s.read_bps)):
            v = r.get(f"{side}_bytes_per_s")
            r[f"{side}_share_of_cap"] = v / (r["n"] * cap) if v is not None and cap else None


def run_drives(comps: list[Any], s: DrivesSettings, bar: Any) -> dict:
    """Every (N, chunk) cell on one rig of max(N) devices, then the latency figures."""
    from . import rig  # here: ``python -m lmcache_rawblock_bench.rig`` runs it as __main__
    why = rig.why_unavailable(rig.BLKIO, s.backend)
    if why:
        bar.update(steps(s))
        return {"available": False, "error": why, "settings": s.describe(), "rows": [], "latency": []}
    comps = [c for c in comps if c.available]
    schedulers = ["fifo", "loads_first"] if has_setting("io_scheduler") else [None]
    out: dict[str, Any] = {"available": True, "settings": s.describe(), "rows": [], "latency": [], "errors": [],
                           "io_schedulers": schedulers}
    with rig.CappedDrives(max(s.ns), device_bytes(s), s.read_bps, s.write_bps, s.backend) as d:
        out["rig"] = d.describe()
        out["caps_read_back"] = d.caps()
        for n in s.ns:
            for chunk in s.chunks:
                bar.set_description_str(f"drives N={n} {fmt_size(chunk)}")
                try:
                    out["rows"] += measure_cell(d, comps, n, chunk, s)
                except (OSError, RuntimeError, ValueError) as exc:
                    out["errors"].append(f"N={n} {fmt_size(chunk)}: {type(exc).__name__}: {exc}")
                bar.update(1)
        bar.set_description_str("drives latency")
        for engine, depth, sched in latency_cases(s, schedulers):
            try:
                out["latency"].append(measure_latency(d, s, engine, sched, depth))
            except (OSError, RuntimeError, ValueError) as exc:
                out["errors"].append(f"latency {engine} QD{depth} {sched}: {type(exc).__name__}: {exc}")
        bar.update(1)
        out["accounted_total"] = d.service_bytes()
    _shares(out["rows"], s)
    out["cpu_per_gb_vs_n"] = cpu_vs_n(out["rows"])
    return out


def cpu_vs_n(rows: list[dict]) -> list[dict]:
    """Ours: CPU seconds per GB at each N over the same at N = 1, per engine and chunk."""
    out = []
    ours = [r for r in rows if r["who"] == "ours"]
    for r in ours:
        base = next((b for b in ours if b["n"] == 1 and b["engine"] == r["engine"] and b["chunk"] == r["chunk"]),
                    None)
        if base:
            out.append({"engine": r["engine"], "chunk": r["chunk"], "n": r["n"], "cpu_s_per_gb": r["cpu_s_per_gb"],
                        "vs_n1": r["cpu_s_per_gb"] / base["cpu_s_per_gb"]})
    return out
