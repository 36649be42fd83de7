"""Put latency with extents: the plugin's store path (``RustRawBlockBackend._put_with_policy``,
what each ``batched_submit_put_task`` batch runs off the event loop: the core's ``put_many`` and,
when it finds no slot, the put's own eviction) timed per one-key put on a cache with room and on
a full cache, side by side for ``eviction_policy`` ``extent`` (``extent_bytes`` on, the
background evictor keeping ``extent_reserve`` clean extents) and ``lru`` (evict-ahead at its
defaults). One process, a sparse file per policy, posix engine, format log, deallocation on
(punched holes), the plugin's background thread running as in production.

Run: PYTHONPATH=benchmarks python3 -m lmcache_rawblock_bench.extent_latency [--repeat N] [--device DEV] [--out DIR]
(with ``--repeat``, ``pooled`` is each setting's puts of all its runs summarised together).

Through the page cache a put with room returns once its pages are dirty, until the kernel's dirty
limit is reached; past it every buffered write is held toward the device's speed. A test device is
smaller than that limit (here about 20 % of RAM), so its "room" phase would time memory copies while
its full phase, which writes several capacities, times the throttled writes: a drive of terabytes
passed its dirty limit long before its cache filled. ``--dirty-bytes N`` scales the limit to the
device for the run (``vm.dirty_bytes`` = N, ``vm.dirty_background_bytes`` = N/2, restored after;
root only) and times the room phase only after 2N bytes were put, so both phases run past it.

In a virtual machine that reports freed pages to its host (free page reporting), a page the guest
frees and writes again comes back through a host fault: each deallocation drops the extent's cached
pages, and the full phase then times those faults, which a machine without page reporting never
pays. ``--page-reporting hold`` stops the reports for the runs (root; put back after), and each run
records the KiB reported while it ran where the kernel counts them. ``--reset-device`` deallocates
the whole test device before each run, so no run starts from what the one before it left.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import itertools
import json
import mmap
import os
import statistics
import struct
import sys
import tempfile
import time
from typing import Any

from .common import MiB
from .core import make_obj
from .plugin import _Config, _LocalCPU, _Metadata
from .target import _block_size

HEADER = 4096


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _summary(ns: list[float]) -> dict:
    return {"puts": len(ns), "p50_us": round(_pct(ns, 0.5) / 1e3, 1), "p90_us": round(_pct(ns, 0.9) / 1e3, 1),
            "p99_us": round(_pct(ns, 0.99) / 1e3, 1), "mean_us": round(sum(ns) / len(ns) / 1e3, 1)}


VM = "/proc/sys/vm"
DIRTY_KNOBS = ("dirty_bytes", "dirty_background_bytes", "dirty_ratio", "dirty_background_ratio")


@contextlib.contextmanager
def dirty_limit(nbytes: int | None):
    """The kernel's dirty limits set to ``nbytes`` (background writeback from half of it) for the
    block, then put back as they were; nothing is changed for None."""
    if not nbytes:
        yield
        return
    saved = {}
    for k in DIRTY_KNOBS:
        with open(os.path.join(VM, k)) as f:
            saved[k] = int(f.read())
    try:
        for k, v in (("dirty_bytes", nbytes), ("dirty_background_bytes", nbytes // 2)):
            with open(os.path.join(VM, k), "w") as f:
                f.write(str(v))
        yield
    finally:
        # Writing a *_bytes knob zeroes its *_ratio twin and the other way round: put back the one
        # that was in effect (the non-zero one) of each pair.
        for b, r in (("dirty_bytes", "dirty_ratio"), ("dirty_background_bytes", "dirty_background_ratio")):
            k = b if saved[b] else r
            with open(os.path.join(VM, k), "w") as f:
                f.write(str(saved[k]))


PAGE_REPORTING = "/sys/module/page_reporting/parameters"
# the largest order a kernel's page_reporting_order takes: above the largest free block, so no
# free block is reported (MAX_PAGE_ORDER is 10 on x86-64; some kernels take one more)
HOLD_ORDERS = (11, 10)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def reporting_state() -> dict:
    """This guest's free page reporting: the order from which free blocks are reported to the host
    (None: the kernel has no page reporting) and, where the kernel counts it, KiB reported so far."""
    return {"order": _read_int(os.path.join(PAGE_REPORTING, "page_reporting_order")),
            "reported_kib": _read_int(os.path.join(PAGE_REPORTING, "reported_kib"))}


def _touch_free_memory(keep_free: int = 2 << 30) -> int:
    """Write every page of the guest's free memory but ``keep_free`` bytes once, then free it: pages
    the host took back after an earlier report are backed again before anything is timed."""
    with open("/proc/meminfo") as f:
        free_kib = next(int(line.split()[1]) for line in f if line.startswith("MemFree:"))
    piece = 64 * MiB
    zeros = bytes(piece)
    maps = []
    try:
        for _ in range(max(0, (free_kib * 1024 - keep_free) // piece)):
            m = mmap.mmap(-1, piece)
            m[:] = zeros
            maps.append(m)
        return len(maps) * piece
    finally:
        for m in maps:
            m.close()


@contextlib.contextmanager
def page_reporting(mode: str):
    """``hold``: no free block reported to the host for the block (``page_reporting_order`` above
    the largest block; root; put back after) and free memory touched once first. A guest that
    reports freed pages gets them back from its host only through a fault per page when it writes
    them again: a test device's page cache, dropped by each deallocation and filled again, then
    times the host's faults, which a machine without page reporting never pays. ``as-is``: as
    the machine is."""
    path = os.path.join(PAGE_REPORTING, "page_reporting_order")
    saved = _read_int(path)
    if mode == "as-is" or saved is None:
        yield
        return
    for order in HOLD_ORDERS:
        try:
            with open(path, "w") as f:
                f.write(str(order))
            break
        except OSError:
            continue
    else:
        raise PermissionError(f"--page-reporting hold: could not write {path} (root is needed)")
    try:
        _touch_free_memory()
        yield
    finally:
        with open(path, "w") as f:
            f.write(str(saved))


BLKDISCARD = 0x1277  # _IO(0x12, 119): deallocate a byte range of a block device
BLKFLSBUF = 0x1261  # _IO(0x12, 97): write back and drop a block device's cached pages


def reset_device(dev: str) -> None:
    """The whole block device deallocated and its cached pages dropped: each run then starts from
    the same state (a loop device's backing file emptied to holes, a RAM disk's memory freed),
    whatever the runs before it wrote or deallocated."""
    size = _block_size(dev)
    fd = os.open(dev, os.O_WRONLY)
    try:
        fcntl.ioctl(fd, BLKFLSBUF, 0)
        fcntl.ioctl(fd, BLKDISCARD, struct.pack("QQ", 0, size))
    finally:
        os.close(fd)


def run_policy(policy: str, workdir: str, slots: int, per: int, chunk: int, rounds: float, reserve: int = 2,
               dealloc: str = "on", device: str | None = None, odirect: bool = False,
               room_skip_bytes: int = 0, discard: str = "auto", free_lane: str = "on", reset: bool = False,
               evictor_pass: str = "native", gap_us: int = 0) -> dict:
    from lmcache_rawblock.plugin import RustRawBlockBackend
    from lmcache_rawblock.raw_block import encode_legacy_key
    from lmcache_rawblock.raw_block._lmcache import CacheEngineKey

    slot = HEADER + chunk
    path = device or os.path.join(workdir, f"{policy}.img")
    if not device:
        with open(path, "wb") as f:
            f.truncate(16 * MiB + slots * slot)
    elif reset:
        reset_device(device)
    reporting_before = reporting_state()
    extra = {
        "rust_raw_block.device_path": path, "rust_raw_block.slot_bytes": slot, "rust_raw_block.header_bytes": HEADER,
        "rust_raw_block.block_align": 4096, "rust_raw_block.meta_total_bytes": 16 * MiB,
        "rust_raw_block.meta_enable_periodic": True, "rust_raw_block.load_checkpoint_on_init": False,
        "rust_raw_block.deallocate_freed": dealloc, "rust_raw_block.eviction_policy": policy,
        "rust_raw_block.extent_bytes": per * slot,
    }
    if odirect:  # each put then costs the device's write time (a capped device throttles it)
        extra["rust_raw_block.use_odirect"] = True
    if reserve:  # 0: the plugin's default
        extra["rust_raw_block.extent_reserve"] = reserve
    loop = asyncio.new_event_loop()
    be = RustRawBlockBackend(config=_Config(extra), metadata=_Metadata(), local_cpu_backend=_LocalCPU(chunk),
                             loop=loop)
    try:
        if discard == "ioctl":  # a block device's discards through BLKDISCARD, as before io_uring took them
            be._core._native.discard_force_ioctl()
        if free_lane == "off":  # every FREE record in line behind the pending puts' records, as before the lane
            be._core._native.free_lane_off()
        if evictor_pass == "python" and be._extents is not None:  # a victim at a time, several calls each
            be._extents.native_pass = False
        if evictor_pass == "native-single" and be._extents is not None:  # one call, one victim a pass
            be._extents.batch = 1
        obj = make_obj(chunk, 0x5A)
        capacity = be._core.extent_counts()["extents_total"] * per

        def put(i: int) -> float:
            spec = encode_legacy_key(CacheEngineKey("bench", 1, 0, i, "bfloat16"))
            t0 = time.perf_counter_ns()
            results, failure = be._put_with_policy([spec], [obj])
            dt = time.perf_counter_ns() - t0
            if not results[0]:
                raise RuntimeError(f"{policy}: put {i} failed: {failure}")
            if gap_us:  # the time an engine spends between two stores (its GPU work), asleep
                time.sleep(gap_us / 1e6)
            return dt

        # a cache with room: nothing evicted; with room_skip_bytes, timed once that much was put
        skip = -(-room_skip_bytes // chunk)
        if skip > capacity // 4:
            raise ValueError(f"--dirty-bytes {room_skip_bytes // 2}: twice it is {skip} puts of {chunk} bytes, more "
                             f"than a quarter of the {capacity} slots: the room phase would be too short")
        room = [put(i) for i in range(capacity // 2)][skip:]
        for i in range(capacity // 2, capacity):
            put(i)
        be.wait_idle(120)
        full = [put(i) for i in range(capacity, capacity + int(rounds * capacity))]
        be.wait_idle(120)
        reporting_after = reporting_state()
        st = be.report_status()
        hist = be._core._native.histograms()["histograms"]  # the whole run's, room and full
        reserve = st.get("extent_reserve", reserve)
        effective = st.get("extent_reserve_effective")
    finally:
        be.close()
        loop.close()
        if not device:
            os.unlink(path)
    r_room, r_full = _summary(room), _summary(full)
    keys = ("evicted_ahead_entries", "put_evicted_entries", "put_evict_retries", "evicted_extents",
            "evicted_extent_entries", "extents_total", "extent_deallocs", "extent_fallbacks", "dealloc_ranges",
            "dealloc_skipped", "checkpoints_for_room", "dealloc_discard_path")
    return {"policy": policy, "deallocate_freed": dealloc, "discard": discard, "free_lane": free_lane,
            "evictor_pass": evictor_pass if policy == "extent" else None, "gap_us": gap_us,
            "dealloc_discard_path": st.get("dealloc_discard_path"), "extent_reserve": reserve if policy == "extent" else None,
            "extent_reserve_effective_at_end": effective, "slots_in_extents": capacity, "slot_bytes": slot, "extent_bytes": per * slot,
            "room_untimed_puts": skip, "room": r_room, "full": r_full, "_room_ns": room, "_full_ns": full,
            "full_over_room_p50": round(r_full["p50_us"] / r_room["p50_us"], 3),
            "full_over_room_p99": round(r_full["p99_us"] / r_room["p99_us"], 3),
            "full_over_room_mean": round(r_full["mean_us"] / r_room["mean_us"], 3),
            "status": {k: st.get(k) for k in keys}, "device_reset": bool(device and reset),
            # the deletes' FREE groups, each synced by itself: {"groups": n, "records": n}
            "free_lane_written": (st.get("metadata_log") or {}).get("free_lane"),
            "page_reporting_order": reporting_before["order"],
            "reported_kib_during_run": (None if reporting_before["reported_kib"] is None
                                        else reporting_after["reported_kib"] - reporting_before["reported_kib"]),
            # the metadata writes and deallocations the puts shared the device with
            **{f"{h}_count_mean_p99_us": _hist_summary(hist[f"{h}_ns"]) for h in ("checkpoint", "dealloc")}}


def _hist_summary(h: dict) -> list:
    """[count, mean us, p99 us] of one of the core's latency histograms."""
    from lmcache_rawblock.metrics import quantile
    if not h["count"]:
        return [0, None, None]
    return [h["count"], round(h["sum"] / h["count"] / 1e3, 1), round((quantile(h, 0.99) or 0) / 1e3, 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lmcache_rawblock_bench.extent_latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", type=int, default=2048, help="slots of the device (default 2048)")
    ap.add_argument("--per", type=int, default=16, help="slots per extent (default 16)")
    ap.add_argument("--chunk", type=int, default=64 * 1024, help="payload bytes per key (default 64 KiB)")
    ap.add_argument("--rounds", type=float, default=3.0, help="full-cache puts, in cache capacities (default 3)")
    ap.add_argument("--policies", default="extent,lru", help="comma-separated (default extent,lru)")
    ap.add_argument("--reserve", default="0", help="extent_reserve values, comma-separated (default 0: the "
                                                   "plugin's default, 5%% of the extents)")
    ap.add_argument("--dealloc", default="on", help="deallocate_freed values, comma-separated (default on)")
    ap.add_argument("--device", help="a block device to use instead of a sparse file (its size sets the slots; "
                                     "every run overwrites it)")
    ap.add_argument("--odirect", action="store_true", help="open the device with O_DIRECT (default: through the "
                                                          "page cache)")
    ap.add_argument("--dirty-bytes", type=int, default=0,
                    help="the kernel's dirty limit for the run, in bytes (root; restored after), and the room "
                         "phase timed after twice that was put (default 0: the machine's as they are)")
    ap.add_argument("--discard", default="auto", help="a block device's discards, comma-separated: auto (the "
                                                       "product's choice: io_uring where the kernel has it), "
                                                       "ioctl (BLKDISCARD) (default auto)")
    ap.add_argument("--free-lane", default="on", help="the deletes' FREE records ahead of pending puts, "
                                                       "comma-separated: on (the product), off (in line behind "
                                                       "them) (default on)")
    ap.add_argument("--evictor-pass", default="native",
                    help="the extent evictor's pass, comma-separated: native (the product: one call without the "
                         "GIL, at least 16 MiB of extents a pass), native-single (one call, only the extents "
                         "missing), python (a victim at a time, several calls each) (default native)")
    ap.add_argument("--gap-us", default="0",
                    help="microseconds asleep after each put, comma-separated (default 0: a put storm); a model of "
                         "the engine's own work between two stores")
    ap.add_argument("--reset-device", action="store_true",
                    help="with --device: deallocate the whole device and drop its cached pages before each run, "
                         "so every run starts from the same state")
    ap.add_argument("--page-reporting", choices=("as-is", "hold"), default="as-is",
                    help="this guest's reports of free pages to its host: as-is, or hold (none for the runs; "
                         "root, put back after; free memory touched once first) (default as-is)")
    ap.add_argument("--warmup", type=int, default=0, help="first runs left out of the pooled figures (default 0)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each setting, interleaved (default 1)")
    ap.add_argument("--out", help="write latency.json there")
    a = ap.parse_args(argv)
    if a.dirty_bytes and a.odirect:
        ap.error("--dirty-bytes is for the page cache: O_DIRECT writes are never dirty")
    if a.reset_device and not a.device:
        ap.error("--reset-device is for --device: a sparse file is made afresh for every run")
    if not all(g.isdigit() for g in a.gap_us.split(",")):
        ap.error(f"--gap-us {a.gap_us!r}: comma-separated whole numbers of microseconds, 0 or more")
    with (tempfile.TemporaryDirectory(prefix="extent-latency-") as d, dirty_limit(a.dirty_bytes),
          page_reporting(a.page_reporting)):
        runs = []
        for _, dl, p in itertools.product(range(a.repeat), a.dealloc.split(","), a.policies.split(",")):
            extent = p == "extent"
            for rv, dc, fl, ep, gap in itertools.product(a.reserve.split(",") if extent else ["2"],
                                                         a.discard.split(","), a.free_lane.split(","),
                                                         a.evictor_pass.split(",") if extent else ["native"],
                                                         a.gap_us.split(",")):
                runs.append(run_policy(p, d, a.slots, a.per, a.chunk, a.rounds, int(rv), dl, a.device, a.odirect,
                                       2 * a.dirty_bytes, dc, fl, a.reset_device, ep, int(gap)))
        # the first runs on a fresh device time its start (page cache and device never written
        # before): --warmup of them are kept in the file but left out of the pooled figures
        for r in runs[:a.warmup]:
            r["warmup"] = True
    pooled = _pooled([r for r in runs if not r.get("warmup")])
    for r in runs:
        del r["_room_ns"], r["_full_ns"]
    doc: dict[str, Any] = {"argv": sys.argv, "device": a.device or "sparse file", "odirect": a.odirect,
                           "dirty_bytes": a.dirty_bytes or None, "page_reporting": a.page_reporting,
                           "loadavg_at_end": os.getloadavg(),
                           "pooled": pooled, "runs": runs}
    text = json.dumps(doc, indent=1)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "latency.json"), "w") as f:
            f.write(text + "\n")
    for r in runs:
        print(("(warm-up) " if r.get("warmup") else "") + f"{r['policy']:7s} dealloc {r['deallocate_freed']} discard {r['discard']} lane {r['free_lane']} pass {r['evictor_pass']} gap {r['gap_us']} us reserve {r['extent_reserve']} room p50 {r['room']['p50_us']:8.1f} us p99 {r['room']['p99_us']:8.1f} us | full p50 "
              f"{r['full']['p50_us']:8.1f} us p99 {r['full']['p99_us']:8.1f} us | full/room p50 "
              f"{r['full_over_room_p50']:.3f} p99 {r['full_over_room_p99']:.3f} mean {r['full_over_room_mean']:.3f} | "
              f"checkpoints n/mean/p99 {r['checkpoint_count_mean_p99_us']} dealloc runs {r['dealloc_count_mean_p99_us']}"
              + ("" if r["reported_kib_during_run"] is None else f" | free KiB reported to host {r['reported_kib_during_run']}"))
    for r in pooled:
        print(f"pooled {r['policy']:7s} dealloc {r['deallocate_freed']} discard {r['discard']} lane {r['free_lane']} pass {r['evictor_pass']} gap {r['gap_us']} us reserve {r['extent_reserve']} ({r['runs']} runs) "
              f"full/room p50 {r['full_over_room_p50']:.3f} p99 {r['full_over_room_p99']:.3f} "
              f"mean {r['full_over_room_mean']:.3f} | median of the runs' own p50 "
              f"{r['run_median_full_over_room_p50']:.3f} p99 {r['run_median_full_over_room_p99']:.3f} "
              f"mean {r['run_median_full_over_room_mean']:.3f}")
    return 0


def _pooled(runs: list[dict]) -> list[dict]:
    """Each setting's puts over all its runs together (a noisy machine's passing load spreads
    over room and full alike): the same summary and ratios; and the median over its runs of each
    run's own ratio (a few runs whose tail a passing load set move the pooled p99, not it)."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["policy"], r["deallocate_freed"], r["extent_reserve"], r["discard"], r["free_lane"],
                           r["evictor_pass"], r["gap_us"]), []).append(r)
    out = []
    for (policy, dealloc, reserve, discard, free_lane, evictor_pass, gap_us), rs in groups.items():
        room = _summary([x for r in rs for x in r["_room_ns"]])
        full = _summary([x for r in rs for x in r["_full_ns"]])
        out.append({"policy": policy, "deallocate_freed": dealloc, "extent_reserve": reserve, "discard": discard,
                    "free_lane": free_lane, "evictor_pass": evictor_pass, "gap_us": gap_us, "runs": len(rs),
                    "room": room, "full": full,
                    **{f"full_over_room_{k}": round(full[f"{k}_us"] / room[f"{k}_us"], 3)
                       for k in ("p50", "p99", "mean")},
                    **{f"run_median_full_over_room_{k}": round(statistics.median(r[f"full_over_room_{k}"] for r in rs), 3)
                       for k in ("p50", "p99", "mean")}})
    return out


if __name__ == "__main__":
    sys.exit(main())
