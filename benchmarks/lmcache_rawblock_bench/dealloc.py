"""Dealloc part: what deallocating freed slots costs an eviction batch (our core only).

With ``deallocate_freed`` on, a slot freed by ``delete_many`` is given back to the device once it
is reusable (log format: after the checkpoint that makes its FREE record durable): the
checkpoint sorts the freed slots, merges adjacent ones into ranges and deallocates them (a
punched hole in a file, a discard on a block device) before the slots return to the allocator.
This part times, side by side in one process, one core with deallocation on and one with it off
(two devices of the same kind), rounds interleaved and the order alternating from round to round
(off, on / on, off / ...) so that the drift of a shared machine hits both alike:

- the eviction batch: ``delete_many`` of N keys and the ``checkpoint_now`` that makes their
  slots reusable (the log format, the product default); µs per key of the whole batch, the
  deallocation's own time (the ``dealloc_seconds`` delta of the core's status) and the commands,
  ranges, slots and bytes each batch deallocated (status deltas);
- the put path right after: ``put_many`` of N new keys, which land in the slots just freed
  (the device holds exactly 2N slots, all taken before the batch).

Grid: medium x N x layout. Media: ``file`` (a sparse file in the benchmark's scratch directory
on a disk-backed file system: punched holes) and ``loop device`` (a loop device over a sparse
file in the same directory, as root with losetup: discards, which the loop driver turns into
punched holes in its backing file); a medium that cannot be set up is reported "not measured"
with the reason. Layouts of the freed slots: ``adjacent`` (N slots in a row: one range per
batch) and ``scattered`` (every other slot: one range per key), since merging is what makes a
batch cheap. A plan may name the media it runs on: the quick suite (16 KiB slots) runs its
10,000-key batches on the file only, to stay under a minute.

Each (medium, N): two devices with room for exactly 2N slots (slot = payload + one 4 KiB
header, payloads filling their slots), one core each (``deallocate_freed`` "on" and "off"),
O_DIRECT with zero copy from page-aligned buffers, the posix engine (the default), 2N keys put
and a checkpoint written; then, per layout, ``warmup`` untimed rounds and ``rounds`` timed
rounds. Before each timed batch and each timed put the devices are synced (untimed), so that
write-back of an earlier phase does not land inside a timed one.
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from .common import KiB, MiB, median, remove_file, sparse
from .core import BLOCK, Arena, close_core, object_keys, open_core, ours_core
from .loadcheck import device_dir, mount_of

MEDIA = ("file", "loop device")
LAYOUTS = ("adjacent", "scattered")
MODES = ("off", "on")
META = 128 * MiB  # the log format's default metadata region
BUFFERS = 64  # distinct payload buffers, cycled over the keys of a put


@dataclass
class DeallocPlan:
    """One batch size: keys per batch, untimed warm-up rounds and timed rounds per layout, and
    the media it runs on (None: all of the suite's)."""

    keys: int
    rounds: int
    warmup: int = 0
    media: list[str] | None = None

    def describe(self) -> dict:
        return {"keys": self.keys, "rounds": self.rounds, "warmup": self.warmup, "media": self.media}

    def runs_on(self, medium: str) -> bool:
        return self.media is None or medium in self.media


@dataclass
class DeallocSettings:
    plans: list[DeallocPlan]
    slot_bytes: int = 64 * KiB
    media: list[str] = field(default_factory=lambda: list(MEDIA))
    layouts: list[str] = field(default_factory=lambda: list(LAYOUTS))
    directory: str | None = None  # default: the disk-backed scratch directory (loadcheck.device_dir)

    def describe(self) -> dict:
        return {"plans": [p.describe() for p in self.plans], "slot_bytes": self.slot_bytes,
                "payload_bytes": self.slot_bytes - BLOCK, "header_bytes": BLOCK, "media": list(self.media),
                "layouts": list(self.layouts), "meta_format": "log", "use_odirect": True,
                "enable_zero_copy": True, "io_engine": "posix", "device_slots": "2 x keys",
                "order": "off,on in even rounds, on,off in odd rounds"}


SUITES = {
    "smoke": DeallocSettings(plans=[DeallocPlan(8, 2, 1), DeallocPlan(24, 2)], slot_bytes=16 * KiB, media=["file"]),
    # quick: a scattered 10,000-key batch is 10,000 synchronous punches or discards (10-30 s on a
    # virtio disk), so the loop device gets the 100-key batches only
    "quick": DeallocSettings(plans=[DeallocPlan(100, 5, 1), DeallocPlan(10_000, 1, media=["file"])],
                             slot_bytes=16 * KiB),
    "full": DeallocSettings(plans=[DeallocPlan(100, 15, 2), DeallocPlan(10_000, 3)], slot_bytes=64 * KiB),
}


def steps(s: DeallocSettings) -> int:
    return sum(p.runs_on(m) for m in s.media for p in s.plans) * len(s.layouts)


# --------------------------------------------------------------------------- devices


def can_loop() -> str | None:
    """Why no loop device can be attached here, or None."""
    if os.geteuid() != 0:
        return "loop devices need root"
    if not shutil.which("losetup"):
        return "losetup is not installed (util-linux)"
    if not os.path.exists("/dev/loop-control"):
        return "/dev/loop-control is missing (no loop driver)"
    return None


def losetup(backing: str) -> str:
    r = subprocess.run(["losetup", "-f", "--show", backing], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"losetup failed: {r.stderr.strip()}")
    return r.stdout.strip()


def detach(dev: str) -> None:
    subprocess.run(["losetup", "-d", dev], capture_output=True)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Dev:
    """One device of a cell: a sparse file, or a loop device over one."""

    def __init__(self, medium: str, work: str, name: str, size: int):
        self.backing = sparse(os.path.join(work, f"dealloc-{name}.img"), size)
        self.loop: str | None = None
        if medium == "loop device":
            self.loop = losetup(self.backing)
        self.path = self.loop or self.backing

    def sync(self) -> None:
        _fsync(self.path)
        if self.loop:
            _fsync(self.backing)

    def remove(self) -> None:
        if self.loop:
            detach(self.loop)
        remove_file(self.backing)


# --------------------------------------------------------------------------- one cell


_COUNTERS = ("dealloc_slots", "dealloc_ranges", "dealloc_commands", "dealloc_bytes", "dealloc_seconds",
             "dealloc_failures", "dealloc_skipped")


def _counters(core: Any) -> dict:
    st = core._native.status()
    return {k: st[k] for k in _COUNTERS}


def _delta(a: dict, b: dict) -> dict:
    return {k: b[k] - a[k] for k in _COUNTERS}


def _quartiles(vals: list[float]) -> tuple[float | None, float | None]:
    v = sorted(vals)
    if len(v) < 3:
        return (v[0], v[-1]) if v else (None, None)
    q = statistics.quantiles(v, n=4, method="inclusive")
    return q[0], q[2]


class _Side:
    """One mode's device, core and the key held by each of its 2N slots (by position)."""

    def __init__(self, mode: str, medium: str, work: str, n: int, s: DeallocSettings, arena: Arena):
        self.mode, self.n, self.slot = mode, n, s.slot_bytes
        self.dev = _Dev(medium, work, mode, META + 2 * n * s.slot_bytes)
        self.core = None
        self.objs = [arena.obj(i, i) for i in range(BUFFERS)]
        self.gen = 0
        try:
            self._open(mode, n, s)
        except BaseException:
            if self.core is not None:
                close_core(self.core)
            self.dev.remove()
            raise

    def _open(self, mode: str, n: int, s: DeallocSettings) -> None:
        self.core = open_core(ours_core(), self.dev.path, slot_bytes=s.slot_bytes, meta_total_bytes=META,
                              meta_format="log", deallocate_freed=mode, use_odirect=True, enable_zero_copy=True)
        st = self.core._native.status()
        if st["usable_slots"] != 2 * n:
            raise RuntimeError(f"{mode}: the device holds {st['usable_slots']} slots, not {2 * n}")
        if st["dealloc_state"] != mode:
            raise RuntimeError(f"deallocate_freed={mode!r}: the core reports {st['dealloc_state']!r} "
                               f"({st.get('dealloc_unsupported_reason') or st.get('dealloc_kind')})")
        self.kind = st["dealloc_kind"]
        self.base = st["data_base_offset"]
        keys = self._new_keys(2 * n)
        self._put(keys)
        self.core.checkpoint_now()
        self.by_pos: list[Any] = [None] * (2 * n)
        self._place(keys, range(2 * n))

    def _new_keys(self, n: int) -> list:
        self.gen += 1
        return object_keys(n, f"dealloc-{self.mode}-{self.gen}")

    def _put(self, keys: list) -> float:
        objs = [self.objs[i % BUFFERS] for i in range(len(keys))]
        t0 = time.perf_counter()
        res = self.core.put_many(keys, objs)
        dt = time.perf_counter() - t0
        if not all(res.results):
            raise RuntimeError(f"{self.mode}: put_many stored {sum(res.results)} of {len(keys)} keys: {res.failure}")
        return dt

    def _place(self, keys: list, positions: Any) -> None:
        """Record where keys landed; they must fill exactly the given slot positions."""
        got = sorted((self.core.entry_offset(k.encoded) - self.base) // self.slot for k in keys)
        if got != sorted(positions):
            raise RuntimeError(f"{self.mode}: the put keys did not land in the freed slots")
        for k in keys:
            self.by_pos[(self.core.entry_offset(k.encoded) - self.base) // self.slot] = k

    def round(self, positions: list[int]) -> dict:
        """One eviction batch of the keys at positions and the put into their slots."""
        enc = [self.by_pos[p].encoded for p in positions]
        self.dev.sync()
        c0 = _counters(self.core)
        t0 = time.perf_counter()
        ok = self.core.delete_many(enc)
        t1 = time.perf_counter()
        self.core.checkpoint_now()
        t2 = time.perf_counter()
        d = _delta(c0, _counters(self.core))
        if not all(ok):
            raise RuntimeError(f"{self.mode}: delete_many missed {ok.count(False)} of {len(ok)} keys")
        new = self._new_keys(len(positions))
        self.dev.sync()
        put_s = self._put(new)
        self._place(new, positions)
        return {"delete_s": t1 - t0, "checkpoint_s": t2 - t1, "batch_s": t2 - t0, "put_s": put_s, "counters": d}


def _positions(layout: str, n: int) -> list[int]:
    return list(range(n)) if layout == "adjacent" else list(range(0, 2 * n, 2))


def _expected(layout: str, n: int, slot: int, mode: str) -> dict:
    if mode == "off":
        return {"dealloc_slots": 0, "dealloc_ranges": 0, "dealloc_bytes": 0, "dealloc_failures": 0}
    return {"dealloc_slots": n, "dealloc_ranges": n if layout == "scattered" else None, "dealloc_bytes": n * slot,
            "dealloc_failures": 0}


def _merged(layout: str, n: int, ranges: int) -> bool:
    """Adjacent slots merged: one range per deallocation batch of the core (rb_core_dealloc.c takes
    at most RB_DEALLOC_BATCH = 8192 pending slots at a time), so a few ranges for thousands of
    slots; scattered slots: one range each (checked in _expected)."""
    return layout == "scattered" or 1 <= ranges <= -(-n // 4096)


def measure_layout(sides: dict[str, _Side], layout: str, plan: DeallocPlan, medium: str, s: DeallocSettings) -> dict:
    n = plan.keys
    pos = _positions(layout, n)
    row: dict[str, Any] = {"medium": medium, "kind": sides["on"].kind, "layout": layout, "keys": n,
                           "slot_bytes": s.slot_bytes, "payload_bytes": s.slot_bytes - BLOCK}
    for rnd in range(plan.warmup):
        for mode in MODES:
            sides[mode].round(pos)
    samples: dict[str, dict[str, list[float]]] = {m: {"batch_s": [], "delete_s": [], "checkpoint_s": [],
                                                      "put_s": [], "dealloc_s": []} for m in MODES}
    counters: dict[str, list[dict]] = {m: [] for m in MODES}
    gc.collect()
    gc_was = gc.isenabled()
    gc.disable()
    t_start = time.perf_counter()
    try:
        for rnd in range(plan.rounds):
            for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
                r = sides[mode].round(pos)
                for k in ("batch_s", "delete_s", "checkpoint_s", "put_s"):
                    samples[mode][k].append(r[k])
                samples[mode]["dealloc_s"].append(r["counters"]["dealloc_seconds"])
                counters[mode].append(r["counters"])
    finally:
        if gc_was:
            gc.enable()
    row["cell_s"] = time.perf_counter() - t_start
    row["rounds"] = plan.rounds
    # What each batch deallocated: on, exactly the freed slots (adjacent ones merged); off, nothing.
    verified = True
    for mode in MODES:
        want = _expected(layout, n, s.slot_bytes, mode)
        for c in counters[mode]:
            if any(v is not None and c[k] != v for k, v in want.items()):
                verified = False
            if mode == "on" and not _merged(layout, n, c["dealloc_ranges"]):
                verified = False
    row["deallocated_as_freed"] = verified
    row["counters_per_batch"] = {m: {k: median([c[k] for c in counters[m]]) for k in _COUNTERS} for m in MODES}
    on, off = samples["on"], samples["off"]
    ratios = [a / b for a, b in zip(on["batch_s"], off["batch_s"]) if b > 0]
    put_ratios = [a / b for a, b in zip(on["put_s"], off["put_s"]) if b > 0]
    q1, q3 = _quartiles(ratios)
    pq1, pq3 = _quartiles(put_ratios)
    med = {m: {k: median(v) for k, v in samples[m].items()} for m in MODES}
    cpb = row["counters_per_batch"]["on"]
    row.update({
        "off_batch_s": med["off"]["batch_s"], "on_batch_s": med["on"]["batch_s"],
        "off_per_key_s": med["off"]["batch_s"] / n, "on_per_key_s": med["on"]["batch_s"] / n,
        "off_delete_s": med["off"]["delete_s"], "on_delete_s": med["on"]["delete_s"],
        "off_checkpoint_s": med["off"]["checkpoint_s"], "on_checkpoint_s": med["on"]["checkpoint_s"],
        "ratio": median(ratios), "ratio_q1": q1, "ratio_q3": q3,
        "dealloc_s": med["on"]["dealloc_s"], "dealloc_per_key_s": med["on"]["dealloc_s"] / n,
        "dealloc_commands": cpb["dealloc_commands"], "dealloc_ranges": cpb["dealloc_ranges"],
        "dealloc_slots": cpb["dealloc_slots"], "dealloc_bytes": cpb["dealloc_bytes"],
        "dealloc_per_command_s": (med["on"]["dealloc_s"] / cpb["dealloc_commands"]
                                  if cpb["dealloc_commands"] else None),
        "off_put_s": med["off"]["put_s"], "on_put_s": med["on"]["put_s"],
        "off_put_per_key_s": med["off"]["put_s"] / n, "on_put_per_key_s": med["on"]["put_s"] / n,
        "put_ratio": median(put_ratios), "put_ratio_q1": pq1, "put_ratio_q3": pq3,
        "samples_s": samples, "ratios": ratios, "put_ratios": put_ratios,
    })
    return row


def measure_cell(medium: str, work: str, plan: DeallocPlan, s: DeallocSettings, bar: Any, out: dict) -> None:
    """Both layouts of one (medium, N) on one pair of devices; rows and errors into out."""
    arena = Arena(BUFFERS, s.slot_bytes - BLOCK)
    sides: dict[str, _Side] = {}
    try:
        for mode in MODES:
            sides[mode] = _Side(mode, medium, work, plan.keys, s, arena)
        for layout in s.layouts:
            label = f"{medium}/{plan.keys}/{layout}"
            bar.set_description_str(f"dealloc {label}")
            try:
                out["rows"].append(measure_layout(sides, layout, plan, medium, s))
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                out["errors"][label] = f"{type(exc).__name__}: {exc}"
            bar.update(1)
    except Exception as exc:  # noqa: BLE001 - the cell's setup failed: reported, the run goes on
        out["errors"][f"{medium}/{plan.keys}"] = f"{type(exc).__name__}: {exc}"
        bar.update(len(s.layouts))
    finally:
        for side in sides.values():
            if side.core is not None:
                close_core(side.core)
        for side in sides.values():
            side.dev.remove()


# --------------------------------------------------------------------------- the part


def run_dealloc(s: DeallocSettings, bar: Any) -> dict:
    """Every cell of the grid; a cell that fails is reported under errors and the run goes on."""
    out: dict[str, Any] = {"settings": s.describe(), "rows": [], "errors": {}, "notes": [], "media": {}}
    d, why = (s.directory, None) if s.directory else device_dir("disk")
    if d is None:
        out["notes"].append(f"not measured: {why}")
        bar.update(steps(s))
        return out
    work = tempfile.mkdtemp(prefix="lmcache-rawblock-dealloc-", dir=d)
    try:
        for medium in s.media:
            why = can_loop() if medium == "loop device" else None
            if why:
                out["notes"].append(f"{medium}: not measured: {why}")
                bar.update(sum(p.runs_on(medium) for p in s.plans) * len(s.layouts))
                continue
            out["media"][medium] = {"directory": d, **mount_of(d)}
            for plan in s.plans:
                if plan.runs_on(medium):
                    measure_cell(medium, work, plan, s, bar, out)
                else:
                    out["notes"].append(f"{medium}, {plan.keys:,} keys: not measured: not in this suite")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


