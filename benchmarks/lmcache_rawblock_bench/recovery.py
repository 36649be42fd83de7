"""Recovery part: start-up slot-header validation, the sequential reader against the batched one.

A device image of N slots (100 ... 3000) with one checkpoint listing them is written with plain
file I/O in on-disk format v1; every 97th slot header is corrupted, and every reader must drop
exactly those entries. Readers, timed over the same image:

* ours: the C validator with one pread per header on one thread (``sequential``), and the
  reader the core uses at start-up (``batched``: io_uring batches where reads wait for the
  device, i.e. O_DIRECT; from the page cache, where a read through the ring completes inline,
  preads on the calling thread), through
  ``RawBlockCore.hooks.revalidate_headers``; the dropped entries are put back (untimed) after
  each run;
* LMCache's core, when installed: its ``_read_slot_header`` per offset (one pread per header,
  the reader LMCache had before it batched them) and its io_uring ``_read_slot_headers``.

Media: page cache, and O_DIRECT on the same file. Each cell alternates the readers' order from
round to round; figures are medians.

Beside each row, what no reader can beat (``floor_rounds`` > 0): the bare read loops of
:mod:`.header_floor` over the same headers and bytes (one pread each; io_uring batches at the
core's queue depth), and with O_DIRECT fio's IOPS at the same block size, depth and stride
(``rw=read:<gap>``, time-based), against which our batched reader's headers per second are set.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import header_floor
from .common import MiB, Competitor, interleave, median, remove_file, sparse
from .core import BLOCK, _quiet, close_core, object_keys, open_core
from .limit import parse_fio_json

SLOT = 64 * 1024
CORRUPT_EVERY = 97
DEPTH = 256  # the io_uring queue depth the cores are opened with (bench.core.config_kwargs)
# Bytes of a header the core reads: the whole header block with O_DIRECT, else the first 64 bytes
# (RB_HDR_PROBE in csrc/core/rb_core_int.h), which hold every field of the record.
PROBE_BYTES = 64


@dataclass
class RecoverySettings:
    slots: list[int]
    repeats: int
    media: list[str] = field(default_factory=lambda: ["page cache"])
    floor_rounds: int = 0  # rounds of the bare read loops; 0: no floor
    fio_seconds: float = 0.0  # fio's run per O_DIRECT row; 0: no fio

    def describe(self) -> dict:
        return {"slots": list(self.slots), "repeats": self.repeats, "media": list(self.media),
                "slot_bytes": SLOT, "corrupt_every": CORRUPT_EVERY, "depth": DEPTH,
                "floor_rounds": self.floor_rounds, "fio_seconds": self.fio_seconds}


SUITES = {
    "smoke": RecoverySettings(slots=[100], repeats=1, floor_rounds=3),
    "quick": RecoverySettings(slots=[100, 1000, 3000], repeats=5, floor_rounds=21),
    "full": RecoverySettings(slots=[100, 200, 500, 1000, 3000], repeats=9, media=["page cache", "O_DIRECT"],
                             floor_rounds=41, fio_seconds=2.0),
}


def steps(s: RecoverySettings) -> int:
    return len(s.slots) * len(s.media)


def checkpoint_state(path: str, keys: list, slot: int, meta: int, payload_len: int) -> dict:
    entries = {k.encoded: {"offset": meta + i * slot, "size": payload_len, "shape": [payload_len],
                           "dtype": "uint8", "fmt": "BINARY", "cached_positions": None}
               for i, k in enumerate(keys)}
    return {"version": 1, "device_path": path, "capacity_bytes": os.path.getsize(path), "block_align": BLOCK,
            "header_bytes": BLOCK, "slot_bytes": slot, "meta_total_bytes": meta, "meta_magic": "LMCIDX01",
            "meta_version": 1, "data_base_offset": meta, "next_slot": len(keys), "entries": entries}


def write_image(path: str, keys: list, slot: int, meta: int, corrupt: set, payload_len: int = 100) -> dict:
    """Slot headers (the corrupt ones with a wrong magic) and one checkpoint (container 0,
    sequence 1); returns the checkpoint state."""
    fd = os.open(path, os.O_RDWR)
    try:
        blob = bytearray(BLOCK)
        for i, k in enumerate(keys):
            magic = b"BROKEN01" if i in corrupt else b"LMCBLK01"
            struct.pack_into("<8sQQ", blob, 0, magic, k.slot_identity, payload_len)
            os.pwrite(fd, bytes(blob), meta + i * slot)
        st = checkpoint_state(path, keys, slot, meta, payload_len)
        body = json.dumps(st, separators=(",", ":"), ensure_ascii=True).encode()
        if len(body) > meta // 2 - BLOCK:
            raise ValueError("metadata region too small for the checkpoint")
        hdr = struct.pack("<8sIQQI", b"LMCIDX01", 1, 1, len(body), zlib.crc32(body))
        os.pwrite(fd, body + bytes((-len(body)) % BLOCK), BLOCK)
        os.pwrite(fd, hdr + bytes(BLOCK - len(hdr)), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return st


def fio_command(path: str, n: int, depth: int, seconds: float) -> list[str]:
    """fio reading the n header blocks (BLOCK bytes every SLOT bytes from MiB) with O_DIRECT at
    ``depth``, over and over for ``seconds``."""
    return ["fio", "--name=headers", f"--filename={path}", "--ioengine=io_uring", "--direct=1",
            f"--rw=read:{SLOT - BLOCK}", f"--bs={BLOCK}", f"--iodepth={depth}", f"--offset={MiB}",
            f"--size={n * SLOT}", "--time_based", f"--runtime={seconds}", "--output-format=json"]


def floor_of(path: str, n: int, medium: str, s: "RecoverySettings") -> dict:
    """The bare loops' times and, with O_DIRECT, fio's IOPS over the same headers; what could
    not be measured is said in ``floor_error`` / ``fio_error``."""
    out: dict[str, Any] = {}
    odirect = medium == "O_DIRECT"
    if s.floor_rounds > 0:
        exe, why = header_floor.build()
        if exe is None:
            out["floor_error"] = why
        else:
            try:
                out["floor_s"] = header_floor.run(exe, path, odirect=odirect, n=n, stride=SLOT, base=MiB,
                                                  length=BLOCK if odirect else PROBE_BYTES, depth=DEPTH,
                                                  rounds=s.floor_rounds)
            except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as exc:
                out["floor_error"] = str(exc)
    if odirect and s.fio_seconds > 0:
        if shutil.which("fio") is None:
            out["fio_error"] = "fio not installed (apt-get install fio)"
        else:
            cmd = fio_command(path, n, DEPTH, s.fio_seconds)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60 + 2 * s.fio_seconds)
                if proc.returncode != 0:
                    raise RuntimeError(f"fio exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
                out["fio_iops"] = parse_fio_json(proc.stdout, "read")["iops"]
                out["fio_command"] = cmd
            except (OSError, RuntimeError, ValueError, KeyError, subprocess.SubprocessError) as exc:
                out["fio_error"] = str(exc)
    return out


def measure(comps: Sequence[Competitor], n: int, medium: str, repeats: int, workdir: str,
            s: "RecoverySettings | None" = None) -> dict:
    path = sparse(os.path.join(workdir, f"recovery-{n}.img"), MiB + (n + 1) * SLOT)
    keys = object_keys(n, f"rec{n}")
    corrupt = set(range(0, n, CORRUPT_EVERY))
    blob = json.dumps(write_image(path, keys, SLOT, MiB, corrupt), separators=(",", ":")).encode()
    offsets = [MiB + i * SLOT for i in range(n)]
    readers: dict[str, Any] = {}
    cores: list[Any] = []
    ours_core: list[Any] = []
    errors: dict[str, str] = {}
    kw = dict(slot_bytes=SLOT, meta_total_bytes=MiB, use_odirect=medium == "O_DIRECT", meta_verify_on_load=False)
    try:
        for c in comps:
            try:
                if c.name == "ours":
                    core = open_core(c, path, io_engine="io_uring", **kw)
                    cores.append(core)
                    ours_core.append(core)
                    readers["ours sequential"] = lambda _c=core: _c.hooks.revalidate_headers(True)
                    readers["ours batched"] = lambda _c=core: _c.hooks.revalidate_headers(False)
                else:
                    seq_core = open_core(c, path, io_engine="posix", **kw)
                    bat_core = open_core(c, path, io_engine="io_uring", **kw)
                    cores += [seq_core, bat_core]
                    readers[f"{c.name} sequential"] = lambda _c=seq_core: sum(
                        1 for o in offsets if _c._read_slot_header(o) is None)
                    readers[f"{c.name} batched"] = lambda _c=bat_core: sum(
                        1 for h in _c._read_slot_headers(offsets) if h is None)
            except Exception as exc:  # noqa: BLE001
                errors[c.name] = f"{type(exc).__name__}: {exc}"
        drops: dict[str, int] = {}

        def run(name: str, _r: int) -> float:
            t0 = time.perf_counter()
            drops[name] = readers[name]()
            dt = time.perf_counter() - t0
            if name.startswith("ours ") and drops[name]:
                ours_core[0].hooks.apply_state_json(blob)  # put the dropped entries back, untimed
            return dt

        samples = interleave(list(readers), repeats, run)
        floor = floor_of(path, n, medium, s) if s is not None else {}
    finally:
        for core in cores:
            close_core(core)
        remove_file(path)
    med = {k: median(v) for k, v in samples.items()}

    def speedup(slow: str, fast: str) -> float | None:
        return med[slow] / med[fast] if med.get(slow) and med.get(fast) else None

    bare = floor.get("floor_s") or {}
    ours_b = med.get("ours batched")
    floor["batched_vs_floor"] = ours_b / bare["io_uring"] if ours_b and bare.get("io_uring") else None
    floor["sequential_vs_floor"] = (med["ours sequential"] / bare["pread"]
                                    if med.get("ours sequential") and bare.get("pread") else None)
    floor["ours_iops"] = n / ours_b if ours_b else None
    floor["iops_vs_fio"] = n / ours_b / floor["fio_iops"] if ours_b and floor.get("fio_iops") else None

    return {"medium": medium, "slots": n, "repeats": repeats, "corrupted": len(corrupt),
            "times_s": med, "drops": drops, "drops_agree": all(d == len(corrupt) for d in drops.values()),
            "ours_speedup": speedup("ours sequential", "ours batched"),
            "lmcache_speedup": speedup("lmcache sequential", "lmcache batched"),
            "ours_batched_vs_lmcache_sequential": speedup("lmcache sequential", "ours batched"),
            "samples_s": samples, "errors": errors, "floor": floor}


def run_recovery(comps: Sequence[Competitor], s: RecoverySettings, workdir: str, bar: Any) -> dict:
    _quiet()
    comps = [c for c in comps if c.available]
    out: dict[str, Any] = {"settings": s.describe(), "rows": [], "errors": {}}
    for medium in s.media:
        for n in s.slots:
            bar.set_description_str(f"recovery {medium} {n} slots")
            row = measure(comps, n, medium, s.repeats, workdir, s)
            for k, v in row.pop("errors").items():
                out["errors"][f"{k}/{medium}/{n}"] = v
            out["rows"].append(row)
            bar.update(1)
    return out
