"""Load-check part: what the load-time slot-header check costs a load (our core only).

Every load reads its key's slot header with the payload and serves the payload only when the
header vouches for it (magic, key identity, length, checksum record): on the posix engine one
``preadv`` of [whole header into a scratch block][payload into the caller's buffer]; on io_uring
a second read request (64 bytes buffered, the whole header with O_DIRECT) in the same batch as
the payload read. The benchmark hook ``core.hooks.set_load_check(False)`` makes loads of
verified records skip the check (a plain payload read, as before the check existed); this part
times ``load_many_into`` on one core with the check on and off, side by side in one process,
mode by mode inside each round and the order alternating from round to round (off, on / on,
off / ...), so that the drift of a shared machine hits both modes alike.

Grid: engine (posix, io_uring) x medium (O_DIRECT, page cache) x device x chunk size
(64 KiB, 8 MiB, 32 MiB). Devices are files in a directory: ``tmpfs`` is ``/dev/shm`` (a
memory-speed device that takes O_DIRECT, so the device is not the bottleneck) and ``disk`` the
benchmark's scratch directory on a disk-backed file system (``scratch_dir``: ``/tmp`` or
``/var/tmp``). A medium a directory cannot do (O_DIRECT) is skipped with a note.

Each cell: a fresh file with room for ``keys`` slots of chunk + header; ``keys`` payloads of
random bytes put once, the file synced (no write-back under the timed loads); one untimed
``load_many_into`` per mode into zeroed buffers whose bytes must equal what was put (and whose
device counters show the header read in one mode only); ``warmup`` untimed rounds; then
rounds, each timing ``calls`` back-to-back ``load_many_into`` of all ``keys`` keys per mode:
at least ``rounds``, then more until the 95 % confidence interval of the median ratio is
within ``ci_target`` of it, ``max_rounds`` are done or the cell has run ``budget_s``.

The core is configured as LMCache's plugin runs it: ``block_align`` = ``header_bytes`` = 4096,
slot = chunk + header, ``enable_zero_copy`` with page-aligned destination buffers (one arena; on
io_uring registered as fixed buffers, as the plugin registers its allocator), queue depth 256,
payload checksums off (the default), so what the check adds is the header read, its decode, the
key's identity hash and the comparisons.

Figures per cell: the median wall time of one ``load_many_into`` call in each mode; the ratio
*check on / check off* of each round, its median, quartiles, extremes and the distribution-free
95 % confidence interval of the median (order statistics; 1.00 is free, 1.02 is 2 % more); the
time the check adds per key (median over rounds of the per-round difference); CPU time of the
process (all threads) per call in each mode.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from .common import KiB, MiB, fmt_size, median, remove_file, sparse
from .core import BLOCK, Arena, PlainObj, close_core, object_keys, open_core, ours_core
from .target import scratch_dir, supports_odirect, sync_file

ENGINES = ("posix", "io_uring")
MEDIA = {"O_DIRECT": True, "page cache": False}
DEVICES = ("tmpfs", "disk")
TMPFS_DIR = "/dev/shm"
MODES = ("off", "on")  # the header check skipped (benchmark hook), and done (the product)
TARGET_RATIO = 1.02  # goal at 8 MiB and above: the check costs at most 2 % of a load
TARGET_FROM = 8 * MiB


@dataclass
class ChunkPlan:
    """One chunk size: keys per ``load_many_into``, calls per timed sample, the least and most
    rounds and the time a cell may take before it stops adding rounds."""

    size: int
    keys: int
    calls: int
    rounds: int
    max_rounds: int = 0  # 0: exactly ``rounds``
    budget_s: float = 0.0

    def describe(self) -> dict:
        return {"chunk_bytes": self.size, "keys": self.keys, "calls": self.calls, "rounds": self.rounds,
                "max_rounds": max(self.rounds, self.max_rounds), "budget_s": self.budget_s}


@dataclass
class LoadCheckSettings:
    chunks: list[ChunkPlan]
    engines: list[str] = field(default_factory=lambda: list(ENGINES))
    media: list[str] = field(default_factory=lambda: list(MEDIA))
    devices: list[str] = field(default_factory=lambda: list(DEVICES))
    warmup: int = 2
    ci_target: float = 0.005  # stop adding rounds when the median ratio's 95 % CI is within this of it
    queue_depth: int = 256
    dirs: dict[str, str] = field(default_factory=dict)  # device -> directory (default: device_dir)

    def describe(self) -> dict:
        return {"chunks": [c.describe() for c in self.chunks], "engines": list(self.engines),
                "media": list(self.media), "devices": list(self.devices), "warmup": self.warmup,
                "ci_target": self.ci_target,
                "queue_depth": self.queue_depth, "header_bytes": BLOCK, "block_align": BLOCK,
                "enable_zero_copy": True, "fixed_buffers": "io_uring", "verify_payload_checksum": False,
                "order": "off,on in even rounds, on,off in odd rounds", "target_ratio": TARGET_RATIO,
                "target_from_chunk_bytes": TARGET_FROM}


SUITES = {
    "smoke": LoadCheckSettings(chunks=[ChunkPlan(64 * KiB, 4, 1, 2)], devices=["tmpfs"], warmup=0),
    "quick": LoadCheckSettings(chunks=[ChunkPlan(64 * KiB, 64, 8, 11), ChunkPlan(8 * MiB, 8, 1, 11)], warmup=1),
    "full": LoadCheckSettings(chunks=[ChunkPlan(64 * KiB, 64, 8, 21, 201, 6.0), ChunkPlan(8 * MiB, 8, 1, 21, 201, 8.0),
                                      ChunkPlan(32 * MiB, 8, 1, 15, 101, 12.0)]),
}


def steps(s: LoadCheckSettings) -> int:
    return len(s.engines) * len(s.media) * len(s.devices) * len(s.chunks)


# --------------------------------------------------------------------------- devices


def mount_of(path: str) -> dict:
    """The file system *path* lives on: {"mount_point", "fs_type", "source"} (/proc/self/mountinfo)."""
    real = os.path.realpath(path)
    best = {"mount_point": None, "fs_type": None, "source": None}
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 2:
            continue
        mp = fields[4].replace("\\040", " ")
        inside = real == mp or real.startswith(mp.rstrip("/") + "/")
        if inside and (best["mount_point"] is None or len(mp) >= len(best["mount_point"])):
            best = {"mount_point": mp, "fs_type": rest[0], "source": rest[1]}
    return best


def device_dir(name: str) -> tuple[str | None, str | None]:
    """The directory of a device, or (None, why not)."""
    if name == "tmpfs":
        if os.path.isdir(TMPFS_DIR) and mount_of(TMPFS_DIR)["fs_type"] == "tmpfs":
            return TMPFS_DIR, None
        return None, f"{TMPFS_DIR} is not a tmpfs here"
    if name == "disk":
        for d in (scratch_dir(), "/var/tmp"):
            fs = mount_of(d)["fs_type"]
            if os.path.isdir(d) and fs not in (None, "tmpfs", "ramfs"):
                return d, None
        return None, "no disk-backed scratch directory (/tmp and /var/tmp are memory file systems)"
    raise ValueError(f"unknown device {name!r}: choose from {', '.join(DEVICES)}")


# --------------------------------------------------------------------------- one cell


def median_ci(vals: Sequence[float], z: float = 1.96) -> tuple[float | None, float | None]:
    """Distribution-free confidence interval of the median (order statistics, normal
    approximation of the binomial); (None, None) with fewer than 6 values."""
    v = sorted(vals)
    n = len(v)
    if n < 6:
        return None, None
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half))
    return v[lo], v[hi]


def _settled(ratios: list[float], target: float) -> bool:
    lo, hi = median_ci(ratios)
    m = median(ratios)
    return lo is not None and m is not None and max(m - lo, hi - m) <= target * m


def _quartiles(vals: Sequence[float]) -> tuple[float | None, float | None]:
    v = sorted(vals)
    if len(v) < 3:
        return (v[0], v[-1]) if v else (None, None)
    q = statistics.quantiles(v, n=4, method="inclusive")
    return q[0], q[2]


def _io(core: Any) -> dict:
    return dict(core._native.status()["io"])


def _io_delta(before: dict, after: dict) -> dict:
    keys = ("read_attempts", "read_submitted_bytes", "bounce_attempts", "fixed_buffer_attempts")
    return {k: after.get(k, 0) - before.get(k, 0) for k in keys}


def _load(core: Any, enc: list, dst: list, what: str) -> None:
    ok = core.load_many_into(enc, dst)
    if not all(ok):
        raise RuntimeError(f"{what}: load_many_into missed {ok.count(False)} of {len(ok)} keys")


def measure_cell(engine: str, medium: str, device: str, directory: str, plan: ChunkPlan, src: memoryview,
                 s: LoadCheckSettings) -> dict:
    """One row: load_many_into of plan.keys keys of plan.size bytes, the check on and off."""
    odirect = MEDIA[medium]
    n, size = plan.keys, plan.size
    slot = size + BLOCK
    meta = MiB
    path = sparse(os.path.join(directory, f"loadcheck-{engine}-{size}.img"), meta + (n + 1) * slot)
    arena = Arena(n, size)  # the destination buffers (registered on io_uring)
    dst = [arena.obj(i, 0) for i in range(n)]
    srcs = [PlainObj(size, view=src[i * size:(i + 1) * size]) for i in range(n)]
    keys = object_keys(n, f"loadcheck{size}")
    enc = [k.encoded for k in keys]
    core = open_core(ours_core(), path, slot_bytes=slot, meta_total_bytes=meta, io_engine=engine,
                     use_odirect=odirect, enable_zero_copy=True, iouring_queue_depth=s.queue_depth)
    row: dict[str, Any] = {"engine": engine, "medium": medium, "device": device, "chunk_bytes": size, "keys": n,
                           "calls": plan.calls, "rounds": plan.rounds}
    try:
        if engine == "io_uring":
            core.register_fixed_buffers_from_allocator(arena)
        res = core.put_many(keys, srcs)
        if not all(res.results):
            raise RuntimeError(f"put_many stored {sum(res.results)} of {n} keys: {res.failure}")
        core.checkpoint_now()
        sync_file(path)
        # Outside the timed region: each mode returns the bytes that were put, and the device
        # counters show what it read (the header read in one mode only).
        io: dict[str, dict] = {}
        for mode in MODES:
            core.hooks.set_load_check(mode == "on")
            for d in dst:
                d.byte_array[:] = bytes(size)
            before = _io(core)
            _load(core, enc, dst, f"check {mode}")
            io[mode] = _io_delta(before, _io(core))
            bad = [i for i in range(n) if dst[i].byte_array != srcs[i].byte_array]
            if bad:
                raise RuntimeError(f"check {mode}: key {bad[0]} loaded other bytes than were put")
        if io["on"]["read_submitted_bytes"] <= io["off"]["read_submitted_bytes"]:
            raise RuntimeError("the load-check hook changed nothing: both modes read "
                               f"{io['on']['read_submitted_bytes']} bytes")
        row["bytes_verified"] = True
        row["io_per_call"] = io
        for rnd in range(s.warmup):
            for mode in MODES:
                core.hooks.set_load_check(mode == "on")
                _load(core, enc, dst, "warm-up")
        wall: dict[str, list[float]] = {m: [] for m in MODES}
        cpu: dict[str, list[float]] = {m: [] for m in MODES}
        ratios: list[float] = []
        most = max(plan.rounds, plan.max_rounds)
        t_start = time.perf_counter()
        gc.collect()
        gc_was = gc.isenabled()
        gc.disable()
        try:
            for rnd in range(most):
                if rnd >= plan.rounds and rnd % 2 == 0 and (_settled(ratios, s.ci_target) or
                                                             time.perf_counter() - t_start >= plan.budget_s):
                    break
                for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
                    core.hooks.set_load_check(mode == "on")
                    c0, w0 = time.process_time(), time.perf_counter()
                    for _ in range(plan.calls):
                        _load(core, enc, dst, f"check {mode}")
                    w1, c1 = time.perf_counter(), time.process_time()
                    wall[mode].append((w1 - w0) / plan.calls)
                    cpu[mode].append((c1 - c0) / plan.calls)
                ratios.append(wall["on"][-1] / wall["off"][-1])
        finally:
            if gc_was:
                gc.enable()
        row["rounds"] = len(ratios)
        row["cell_s"] = time.perf_counter() - t_start
        if core._native.status()["load_rejected_entries"]:
            raise RuntimeError("the check refused a slot header of a key this core wrote")
        # the distribution of the cell's load_many_into calls (both modes), for latency_cdf.png
        row["latency"] = {"load_ns": core._native.histograms()["histograms"]["load_ns"]}
    finally:
        try:
            core.hooks.set_load_check(True)
        except Exception:  # noqa: BLE001 - a closed core: nothing to restore
            pass
        close_core(core)
        remove_file(path)
    added = [(a - b) / n for a, b in zip(wall["on"], wall["off"])]
    q1, q3 = _quartiles(ratios)
    lo, hi = median_ci(ratios)
    on_s, off_s = median(wall["on"]), median(wall["off"])
    row.update({
        "off_s": off_s, "on_s": on_s,
        "off_per_key_s": off_s / n if off_s else None, "on_per_key_s": on_s / n if on_s else None,
        "ratio": median(ratios), "ratio_q1": q1, "ratio_q3": q3, "ratio_ci95": [lo, hi],
        "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
        "added_per_key_s": median(added),
        "off_cpu_s": median(cpu["off"]), "on_cpu_s": median(cpu["on"]),
        "off_bytes_per_s": n * size / off_s if off_s else None,
        "samples_s": wall, "cpu_samples_s": cpu, "ratios": ratios,
    })
    return row


# --------------------------------------------------------------------------- the part


def run_loadcheck(s: LoadCheckSettings, bar: Any) -> dict:
    """Every cell of the grid; a cell that fails is reported under errors and the run goes on."""
    out: dict[str, Any] = {"settings": s.describe(), "devices": {}, "rows": [], "errors": {}, "notes": []}
    dirs: dict[str, str] = {}
    try:
        for dev in s.devices:
            d, why = (s.dirs[dev], None) if dev in s.dirs else device_dir(dev)
            if d is None:
                out["notes"].append(f"{dev}: not measured: {why}")
                continue
            dirs[dev] = tempfile.mkdtemp(prefix="lmcache-rawblock-loadcheck-", dir=d)
            out["devices"][dev] = {"directory": d, **mount_of(d), "odirect": supports_odirect(dirs[dev])}
        for plan in s.chunks:
            src = memoryview(os.urandom(plan.keys * plan.size))  # one set of payloads per chunk size
            for dev, work in dirs.items():
                for medium in s.media:
                    if MEDIA[medium] and not out["devices"][dev]["odirect"]:
                        note = (f"{dev} ({out['devices'][dev]['directory']}): O_DIRECT rows skipped: the file "
                                "system refuses O_DIRECT")
                        if note not in out["notes"]:
                            out["notes"].append(note)
                        bar.update(len(s.engines))
                        continue
                    for engine in s.engines:
                        label = f"{engine}/{medium}/{dev}/{fmt_size(plan.size)}"
                        bar.set_description_str(f"loadcheck {label}")
                        try:
                            out["rows"].append(measure_cell(engine, medium, dev, work, plan, src, s))
                        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                            out["errors"][label] = f"{type(exc).__name__}: {exc}"
                        bar.update(1)
            del src
    finally:
        for work in dirs.values():
            shutil.rmtree(work, ignore_errors=True)
    return out
