"""Recovery part: start-up slot-header validation, the sequential reader against the batched one.

A device image of N slots (100 ... 3000) with one checkpoint listing them is written with plain
file I/O in on-disk format v1; every 97th slot header is corrupted, and every reader must drop
exactly those entries. Readers, timed over the same image:

* ours: the C validator with one pread per header on one thread (``sequential``), and the
  io_uring validator (``batched``), through ``RawBlockCore.hooks.revalidate_headers``; the
  dropped entries are put back (untimed) after each run;
* LMCache's core, when installed: its ``_read_slot_header`` per offset (one pread per header,
  the reader LMCache had before it batched them) and its io_uring ``_read_slot_headers``.

Media: page cache, and O_DIRECT on the same file. Each cell alternates the readers' order from
round to round; figures are medians.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Sequence

from .common import MiB, Competitor, interleave, median, remove_file, sparse
from .core import BLOCK, _quiet, close_core, object_keys, open_core

SLOT = 64 * 1024
CORRUPT_EVERY = 97


@dataclass
class RecoverySettings:
    slots: list[int]
    repeats: int
    media: list[str] = field(default_factory=lambda: ["page cache"])

    def describe(self) -> dict:
        return {"slots": list(self.slots), "repeats": self.repeats, "media": list(self.media),
                "slot_bytes": SLOT, "corrupt_every": CORRUPT_EVERY}


SUITES = {
    "smoke": RecoverySettings(slots=[100], repeats=1),
    "quick": RecoverySettings(slots=[100, 1000, 3000], repeats=5),
    "full": RecoverySettings(slots=[100, 200, 500, 1000, 3000], repeats=9, media=["page cache", "O_DIRECT"]),
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


def measure(comps: Sequence[Competitor], n: int, medium: str, repeats: int, workdir: str) -> dict:
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
    finally:
        for core in cores:
            close_core(core)
        remove_file(path)
    med = {k: median(v) for k, v in samples.items()}

    def speedup(slow: str, fast: str) -> float | None:
        return med[slow] / med[fast] if med.get(slow) and med.get(fast) else None

    return {"medium": medium, "slots": n, "repeats": repeats, "corrupted": len(corrupt),
            "times_s": med, "drops": drops, "drops_agree": all(d == len(corrupt) for d in drops.values()),
            "ours_speedup": speedup("ours sequential", "ours batched"),
            "lmcache_speedup": speedup("lmcache sequential", "lmcache batched"),
            "ours_batched_vs_lmcache_sequential": speedup("lmcache sequential", "ours batched"),
            "samples_s": samples, "errors": errors}


def run_recovery(comps: Sequence[Competitor], s: RecoverySettings, workdir: str, bar: Any) -> dict:
    _quiet()
    comps = [c for c in comps if c.available]
    out: dict[str, Any] = {"settings": s.describe(), "rows": [], "errors": {}}
    for medium in s.media:
        for n in s.slots:
            bar.set_description_str(f"recovery {medium} {n} slots")
            row = measure(comps, n, medium, s.repeats, workdir)
            for k, v in row.pop("errors").items():
                out["errors"][f"{k}/{medium}/{n}"] = v
            out["rows"].append(row)
            bar.update(1)
    return out
