"""Read-only inspection of a raw-block device: ``inspect`` and ``verify``.

Both work on any device in LMCache's on-disk format v1, whoever wrote it (our core or
LMCache's), and never open the device for writing. The geometry is discovered from the
device itself: container 0's header sits at offset 0, its payload one ``block_align`` later
(found by trying the usual alignments against the header's CRC), and the checkpoint JSON
names ``meta_total_bytes``, which places container 1. ``--block-align`` and
``--meta-total-bytes`` override the discovery (needed only when container 0 is damaged and
the region is not LMCache's default size).

Both hold a shared lock on the device (``RawBlockDevice(lock="shared")``) while they read it.
A device a raw-block writer holds (a running core) is refused, since its checkpoint may be
half-written: the message names the path and the writer's pid, and the exit status is
``EXIT_BUSY``. ``--ignore-lock`` reads it anyway, with a warning. While they read, a core
cannot open the device (it waits briefly for readers, then is refused).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import struct
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ._native import RawBlockDevice, container_bytes, read_metadata_log, xxh3_64
from .raw_block.key_codec import slot_identity_from_encoded_key

CONTAINER_HEADER = struct.Struct("<8sIQQI")  # magic, version, seq, payload_len, crc32
SLOT_HEADER = struct.Struct("<8sQQ")  # magic, slot identity, payload length
SLOT_MAGIC = b"LMCBLK01"
CHECKSUM_MAGIC = b"RBXXH3v1"  # ours, at slot-header bytes 24..40
KEY_HASH = struct.Struct("<Q")  # ours, at slot-header bytes 40..48: xxh3-64 of the key (0: not written)
KEY_HASH_OFF = 40
CANDIDATE_ALIGNS = (4096, 512, 1024, 2048, 8192, 16384, 65536)
DEFAULT_META_TOTALS = (128 << 20, 256 << 20, 64 << 20, 32 << 20, 16 << 20, 8 << 20, 4 << 20, 2 << 20, 1 << 20)


U63 = 1 << 63  # offsets and lengths are signed 64-bit on the device side
MAX_CONTAINER_PAYLOAD = 1 << 30  # larger payload_len fields are damage (override: --meta-total-bytes)
MAX_HEADER_BYTES = 16 << 20  # a slot header the tool will read per entry
ENTRY_INT_FIELDS = ("offset", "size")
ENTRY_STR_FIELDS = ("dtype", "fmt")
ENTRY_LIST_FIELDS = ("shape", "cached_positions")


EXIT_BUSY = 3  # a raw-block writer holds the device (see --ignore-lock)


class NotARawBlockDevice(Exception):
    """The device holds no valid LMCache raw-block checkpoint, or cannot be opened as a device."""


class BadCheckpoint(ValueError):
    """A CRC-valid checkpoint whose JSON does not have the v1 state's types and ranges."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(where: str, v: Any, lo: int = 0, hi: int = U63) -> int:
    if not _is_int(v):
        raise BadCheckpoint(f"{where} must be an integer, got {type(v).__name__} {_short(v)}")
    if not lo <= v < hi:
        raise BadCheckpoint(f"{where} = {_short(v)} is out of range [{lo}, {hi})")
    return v


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def check_state(st: Any) -> dict:
    """Check every field of a decoded state v1 checkpoint for type and range (the fields the
    tools use or print); return it, or raise BadCheckpoint naming the first bad field.
    Missing geometry fields are allowed (LMCache treats them as unchanged); present ones
    must be sane, so nothing downstream can divide by zero, allocate without bound or
    print a traceback."""
    if not isinstance(st, dict):
        raise BadCheckpoint(f"the checkpoint is a JSON {type(st).__name__}, not an object")
    if "version" not in st:
        raise BadCheckpoint("version is missing")
    if _check_int("version", st["version"], 0) != 1:
        raise BadCheckpoint(f"version = {st['version']} is not the supported state version 1")
    _check_geometry(st)
    entries = st.get("entries")
    if entries is None:
        return st
    if not isinstance(entries, dict):
        raise BadCheckpoint(f"entries must be an object (key -> entry), got {type(entries).__name__}")
    for key, e in entries.items():
        _check_entry(f"entry {_short(key)}", e)
    return st


def _check_geometry(st: dict) -> None:
    """BadCheckpoint for the first geometry field of a state v1 document present with a wrong
    type or range (absent ones are allowed)."""
    for k in ("capacity_bytes", "data_base_offset", "next_slot", "meta_version"):
        if st.get(k) is not None:
            _check_int(k, st[k])
    if st.get("block_align") is not None:
        a = _check_int("block_align", st["block_align"], 1, 1 << 30)
        if a & (a - 1):
            raise BadCheckpoint(f"block_align = {a} is not a power of two")
    if st.get("header_bytes") is not None:
        _check_int("header_bytes", st["header_bytes"], 24, MAX_HEADER_BYTES + 1)
    if st.get("slot_bytes") is not None:
        sb = _check_int("slot_bytes", st["slot_bytes"], 25)
        if st.get("header_bytes") is not None and sb <= st["header_bytes"]:
            raise BadCheckpoint(f"slot_bytes = {sb} is not larger than header_bytes = {st['header_bytes']}")
    if st.get("meta_total_bytes") is not None:
        _check_int("meta_total_bytes", st["meta_total_bytes"], 2)
    for k in ("device_path", "meta_magic"):
        if st.get(k) is not None and not isinstance(st[k], str):
            raise BadCheckpoint(f"{k} must be a string, got {type(st[k]).__name__} {_short(st[k])}")


def _check_entry(where: str, e: Any) -> None:
    """BadCheckpoint for the first field of one index entry with a wrong type or range
    (``where`` names the entry); offset and size are required."""
    if not isinstance(e, dict):
        raise BadCheckpoint(f"{where} must be an object, got {type(e).__name__} {_short(e)}")
    for f in ENTRY_INT_FIELDS:
        if f not in e:
            raise BadCheckpoint(f"{where}: {f} is missing")
        _check_int(f"{where}: {f}", e[f])
    for f in ENTRY_STR_FIELDS:
        if e.get(f) is not None and not isinstance(e[f], str):
            raise BadCheckpoint(f"{where}: {f} must be a string or null, got {type(e[f]).__name__}")
    for f in ENTRY_LIST_FIELDS:
        v = e.get(f)
        if v is None:
            continue
        if not isinstance(v, list):
            raise BadCheckpoint(f"{where}: {f} must be a list of integers or null, got {type(v).__name__}")
        for x in v:
            _check_int(f"{where}: {f} element", x, -U63)


@dataclass
class Container:
    index: int
    offset: int
    magic: bytes
    version: int
    seq: int
    payload_len: int
    crc: int
    crc_ok: bool
    state: dict | None = None
    error: str | None = None

    def as_dict(self) -> dict:
        return {
            "index": self.index, "offset": self.offset, "magic": self.magic.decode("ascii", "replace"),
            "version": self.version, "seq": self.seq, "payload_len": self.payload_len,
            "crc32": f"{self.crc:08x}", "crc_ok": self.crc_ok,
            "entries": len(self.state.get("entries") or {}) if self.state else None, "error": self.error,
        }


@dataclass
class DeviceReport:
    path: str
    size_bytes: int
    block_align: int
    meta_total_bytes: int
    containers: list[Container]
    chosen: Container | None
    geometry: dict = field(default_factory=dict)
    metadata_format: str = "v1"
    log: dict | None = None  # the log format's reading (read_metadata_log), when that is the format
    log_state: dict | None = None  # its entries as a state v1 document would list them

    @property
    def state(self) -> dict:
        if self.log_state is not None:
            return self.log_state
        return self.chosen.state if self.chosen and self.chosen.state else {}


def _log_state(r: dict) -> dict:
    """The entries a log-format region replays to, shaped as a state v1 document's."""
    sb = r["superblock"]
    classes = {}
    for cid, frag in r["classes"].items():
        try:
            cls = json.loads("{" + frag + "}")
        except (ValueError, RecursionError):  # a fragment the core would refuse: its entries are shown bare
            cls = {}
        classes[cid] = cls if isinstance(cls, dict) else {}
    entries = {}
    for key, e in r["entries"].items():
        c = classes.get(e["class"], {})
        d = {"offset": e["offset"], "size": e["size"], "shape": c.get("shape"), "dtype": c.get("dtype"),
             "fmt": c.get("fmt"), "cached_positions": e["cached_positions"]}
        if e["checksum"] is not None:
            d["xxh3"] = f"{e['checksum']:016x}"
        entries[key] = d
    top = max((e["slot"] + 1 for e in r["entries"].values()), default=0)
    return {"version": 2, "capacity_bytes": sb["capacity_bytes"], "block_align": sb["block_align"],
            "header_bytes": sb["header_bytes"], "slot_bytes": sb["slot_bytes"],
            "meta_total_bytes": sb["meta_total_bytes"], "data_base_offset": sb["data_base_offset"],
            "next_slot": max(top, sb["base"]["next_slot"]), "entries": entries}


def _read_log_format(path: str, size: int, block_align: int | None, meta_total_bytes: int | None
                     ) -> DeviceReport | None:
    """The log format's reading of the device, or None when no superblock of ours is there."""
    r = read_metadata_log(path, block_align or 0, meta_total_bytes or 0)
    if not r.get("found"):
        if any(s in ("valid", "damaged", "no-base") for s in r.get("superblock_states", ())):
            why = "; ".join(e for e in r.get("superblock_errors", ()) if e)
            raise NotARawBlockDevice(f"{path}: log-format metadata superblocks found but none is usable ({why})")
        return None
    ba = r["superblock"]["block_align"]
    st = _log_state(r)
    sb = r["superblock"]
    geometry = {k: st.get(k) for k in ("capacity_bytes", "block_align", "header_bytes", "slot_bytes",
                                       "meta_total_bytes", "data_base_offset", "next_slot")}
    geometry["version"] = "log"
    geometry["max_slots"] = sb["max_slots"]
    geometry["extent_stride"] = sb.get("extent_stride", 0)  # 0: slots back to back from data_base_offset
    geometry["entries"] = len(st["entries"])
    geometry["used_slots"] = len(st["entries"])
    geometry["free_slots"] = sb["max_slots"] - len(st["entries"])
    log = {k: r[k] for k in ("superblock_used", "fallback", "superblock_states", "superblock_errors", "base",
                             "log", "damage")}
    log["superblock"] = sb
    return DeviceReport(path, size, ba, sb["meta_total_bytes"], [], None, geometry, "log", log, st)


def _read(dev: RawBlockDevice, offset: int, n: int) -> bytes | None:
    if offset < 0 or offset + n > dev.size_bytes():
        return None
    buf = bytearray(n)
    try:
        dev.pread_into(offset, buf, n)
    except (OSError, RuntimeError):
        return None
    return bytes(buf)


def _parse_container(dev: RawBlockDevice, index: int, offset: int, align: int,
                     magic: bytes | None, max_payload: int = MAX_CONTAINER_PAYLOAD) -> Container | None:
    raw = _read(dev, offset, CONTAINER_HEADER.size)
    if raw is None:
        return None
    m, version, seq, plen, crc = CONTAINER_HEADER.unpack(raw)
    if (magic is not None and m != magic) or (magic is None and not m.startswith(b"LMC")) or plen == 0:
        return None
    c = Container(index, offset, m, version, seq, plen, crc, False)
    if plen > max_payload or offset + align + plen > dev.size_bytes():
        c.error = f"payload_len {plen} does not fit the metadata region"
        return c
    payload = _read(dev, offset + align, plen)
    if payload is None:
        c.error = "payload unreadable"
        return c
    c.crc_ok = (zlib.crc32(payload) & 0xFFFFFFFF) == crc
    if not c.crc_ok:
        c.error = "CRC mismatch"
        return c
    try:
        c.state = check_state(json.loads(payload.decode("utf-8")))
    except BadCheckpoint as e:
        c.error = f"checkpoint JSON is not a valid state: {e}"
    except RecursionError:
        c.error = "JSON: nested too deeply"
    except ValueError as e:  # UnicodeDecodeError, JSONDecodeError, integers too long to convert
        c.error = f"JSON: {e}"
    return c


_warned_unlocked: set[str] = set()


def _open(path: str, *, ignore_lock: bool = False, **kw: Any) -> RawBlockDevice:
    """Open read-only under a shared lock; a path that is not a device (FIFO, directory) is
    NotARawBlockDevice. A device a writer holds is OSError(EBUSY), or with ``ignore_lock`` opened
    without a lock after a warning on stderr (once per path)."""
    try:
        try:
            return RawBlockDevice(path, False, lock="shared", **kw)
        except OSError as e:
            if e.errno != errno.EBUSY or not ignore_lock:
                raise
            if path not in _warned_unlocked:
                _warned_unlocked.add(path)
                print(f"warning: {e.strerror}; reading it anyway (--ignore-lock): what the writer changes "
                      "meanwhile may read inconsistent", file=sys.stderr)
            return RawBlockDevice(path, False, lock="none", **kw)
    except ValueError as e:
        raise NotARawBlockDevice(str(e)) from None


def read_device(path: str, *, block_align: int | None = None, meta_total_bytes: int | None = None,
                magic: bytes | None = b"LMCIDX01", ignore_lock: bool = False) -> DeviceReport:
    """Find and decode both checkpoint containers; raises NotARawBlockDevice if neither is valid,
    OSError(EBUSY) if a raw-block writer holds the device (unless ``ignore_lock``)."""
    _check_overrides(block_align, meta_total_bytes)
    max_payload = max(MAX_CONTAINER_PAYLOAD, meta_total_bytes // 2) if meta_total_bytes else MAX_CONTAINER_PAYLOAD
    with _open(path, ignore_lock=ignore_lock) as dev:
        size = dev.size_bytes()
        # The log format first: its superblocks replaced the v1 container headers.
        rep = _read_log_format(path, size, block_align, meta_total_bytes)
        if rep is not None:
            return rep
        aligns = (block_align,) if block_align else CANDIDATE_ALIGNS
        first, align_used = _find_container0(dev, aligns, magic, max_payload)
        metas, align_used = _meta_totals(meta_total_bytes, first, align_used)
        second, meta_used, align_used = _find_container1(
            dev, metas, (align_used,) if first is not None else aligns, magic, max_payload)
    return _v1_report(path, size, magic, [first, second], meta_used, align_used)


def _check_overrides(block_align: int | None, meta_total_bytes: int | None) -> None:
    """NotARawBlockDevice for a --block-align or --meta-total-bytes no device can have."""
    if block_align is not None and (block_align <= 0 or block_align & (block_align - 1) or block_align > 1 << 30):
        raise NotARawBlockDevice(f"--block-align must be a power of two between 1 and 2^30, got {block_align}")
    if meta_total_bytes is not None and not 2 <= meta_total_bytes < U63:
        raise NotARawBlockDevice(f"--meta-total-bytes must be >= 2, got {meta_total_bytes}")


def _better(c: Container | None, best: Container | None) -> bool:
    """Whether reading ``c`` replaces ``best``: it is the first header found, or the first
    CRC-valid one."""
    return c is not None and (best is None or (c.crc_ok and not best.crc_ok))


def _find_container0(dev: RawBlockDevice, aligns: tuple[int, ...], magic: bytes | None,
                     max_payload: int) -> tuple[Container | None, int]:
    """Container 0 (header at offset 0, payload one alignment later) tried with each alignment
    of ``aligns``: the first CRC-valid reading, else the first header found (None: no header),
    and the alignment that reading used (``aligns[0]`` when there is none)."""
    first: Container | None = None
    align_used = aligns[0]
    for a in aligns:
        c = _parse_container(dev, 0, 0, a, magic, max_payload)
        if c is None:
            break  # no header at offset 0: alignment does not matter
        if _better(c, first):
            first, align_used = c, a
        if c.crc_ok:
            break
    return first, align_used


def _meta_totals(meta_total_bytes: int | None, first: Container | None,
                 align_used: int) -> tuple[tuple[int, ...], int]:
    """The metadata region sizes to look for container 1 with, and the alignment: the
    override, else what container 0's checkpoint says, else LMCache's usual sizes."""
    if meta_total_bytes:
        return (meta_total_bytes,), align_used
    if first is not None and first.state and first.state.get("meta_total_bytes") is not None:
        return (first.state["meta_total_bytes"],), first.state.get("block_align") or align_used
    return DEFAULT_META_TOTALS, align_used


def _find_container1(dev: RawBlockDevice, metas: tuple[int, ...], aligns: tuple[int, ...], magic: bytes | None,
                     max_payload: int) -> tuple[Container | None, int, int]:
    """Container 1 (one copy's size in) tried with each region size of ``metas`` and each
    alignment of ``aligns``: the first CRC-valid reading, else the first header found (None:
    no header), with the region size and alignment it used (the first of each when none)."""
    second: Container | None = None
    meta_used, align_used = metas[0], aligns[0]
    for mt in metas:
        for a in aligns:
            c = _parse_container(dev, 1, container_bytes(mt, a), a, magic, max_payload)
            if _better(c, second):
                second, meta_used, align_used = c, mt, a
            if second is not None and second.crc_ok:
                return second, meta_used, align_used
    return second, meta_used, align_used


def _v1_report(path: str, size: int, magic: bytes | None, found: list[Container | None], meta_used: int,
               align_used: int) -> DeviceReport:
    """The reading of a format v1 device from its containers: the valid one with the highest
    sequence is in use; NotARawBlockDevice when none is valid."""
    containers = [c for c in found if c is not None]
    valid = [c for c in containers if c.crc_ok and c.state is not None]
    if not valid:
        found_text = ", ".join(f"container {c.index}: {c.error}" for c in containers) or "no container header"
        raise NotARawBlockDevice(
            f"{path}: no valid LMCache raw-block checkpoint (magic {magic!r}) found ({found_text}); "
            f"this device was not written by LMCache's raw-block tier or lmcache_rawblock")
    chosen = max(valid, key=lambda c: (c.seq, -c.index))
    st = chosen.state or {}
    meta_total = st.get("meta_total_bytes") or meta_used
    return DeviceReport(path, size, st.get("block_align") or align_used, meta_total, containers, chosen,
                        _v1_geometry(st, size, meta_total))


def _v1_geometry(st: dict, size: int, meta_total: int) -> dict:
    """The geometry a state v1 checkpoint names, with the slot counts it gives a device of
    ``size`` bytes (None when it names no slot size)."""
    geometry = {k: st.get(k) for k in ("version", "device_path", "capacity_bytes", "block_align", "header_bytes",
                                       "slot_bytes", "meta_total_bytes", "meta_magic", "meta_version",
                                       "data_base_offset", "next_slot")}
    slot_bytes = st.get("slot_bytes") or 0
    base = st.get("data_base_offset") or meta_total
    cap = st.get("capacity_bytes") or size
    geometry["max_slots"] = max(0, (min(cap, size) - base) // slot_bytes) if slot_bytes else None
    entries = st.get("entries", {}) or {}
    geometry["entries"] = len(entries)
    if geometry["max_slots"] is not None:
        used = len(entries)
        geometry["used_slots"] = used
        geometry["free_slots"] = geometry["max_slots"] - used
    return geometry


def inspect_device(path: str, *, sample: int = 5, **kw: Any) -> dict:
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise ValueError(f"sample must be an integer >= 0, got {sample!r}")
    rep = read_device(path, **kw)
    entries = rep.state.get("entries", {}) or {}
    sample_rows = []
    for key, e in list(entries.items())[:sample]:
        sample_rows.append({"key": key, **{k: e.get(k) for k in ("offset", "size", "shape", "dtype", "fmt")}})
    out = {
        "device": path,
        "size_bytes": rep.size_bytes,
        "metadata_format": rep.metadata_format,
        "geometry": rep.geometry,
        "containers": [c.as_dict() for c in rep.containers],
        # the copy in use: a v1 container, or in the log format the superblock recovery takes
        "checkpoint_in_use": rep.chosen.index if rep.chosen else (rep.log or {}).get("superblock_used"),
        "sample_entries": sample_rows,
    }
    if rep.log is not None:
        out["metadata_log"] = rep.log
    return out


def _namespace_of(key: str) -> str:
    parts = key.split("@")
    if len(parts) >= 5 and parts[1].isdigit() and parts[2].isdigit():
        return "legacy"
    return "object"


@dataclass
class VerifyResult:
    checked: int = 0
    ok: int = 0
    mismatches: list[dict] = field(default_factory=list)
    checksums_checked: int = 0

    def as_dict(self) -> dict:
        return {"checked": self.checked, "ok": self.ok, "mismatch_count": len(self.mismatches),
                "checksums_checked": self.checksums_checked, "mismatches": self.mismatches}


def _header_batches(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def verify_device(path: str, *, checksums: bool = True, progress: bool = False, batch: int = 256,
                  ignore_lock: bool = False, **kw: Any) -> dict:
    """Read every indexed slot's header (batched through io_uring when available) and compare
    magic, identity and length with the checkpoint; with ``checksums``, re-read payloads whose
    header carries our xxh3-64 record and compare it. Locking as read_device."""
    rep = read_device(path, ignore_lock=ignore_lock, **kw)
    st = rep.state
    entries = list((st.get("entries") or {}).items())
    bar = _progress_bar(len(entries)) if progress else None
    with _open_for_headers(path, ignore_lock, batch) as dev:
        check = _SlotCheck(dev, st.get("header_bytes") or 4096, checksums, dev.size_bytes())
        for chunk in _header_batches(entries, batch):
            check.check(chunk)
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return {"device": path, "geometry": rep.geometry, **check.res.as_dict(),
            "metadata_damage": metadata_damage(rep.log)}


def _progress_bar(total: int) -> Any:
    """A tqdm progress bar on stderr counting slots, or None when tqdm is not installed."""
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="slot", desc="verify", file=sys.stderr)
    except ImportError:
        return None


def _open_for_headers(path: str, ignore_lock: bool, batch: int) -> RawBlockDevice:
    """The device opened for verify: through io_uring (``batch`` header reads at a time) where
    it can be, else for plain reads; a device a writer holds (EBUSY) is not retried."""
    try:
        return _open(path, ignore_lock=ignore_lock, io_engine="io_uring", iouring_queue_depth=min(batch, 256))
    except (RuntimeError, OSError) as e:
        if isinstance(e, OSError) and e.errno == errno.EBUSY:
            raise
        return _open(path, ignore_lock=ignore_lock)


@dataclass
class _SlotCheck:
    """verify's pass over an open device: reads the slot headers of a batch of entries and
    records in ``res`` what each says against its entry."""

    dev: RawBlockDevice
    header_bytes: int
    checksums: bool
    dev_size: int
    res: VerifyResult = field(default_factory=VerifyResult)

    def check(self, chunk: list[tuple[str, dict]]) -> None:
        """Reads the headers of ``chunk`` ((key, entry) pairs) and records each one's result."""
        inside, ok, bufs = self._read_headers(chunk)
        for (key, e), good, hdr, within in zip(chunk, ok, bufs, inside):
            self.res.checked += 1
            problem = self._slot_problem(key, e, within, good, hdr)
            if problem:
                self.res.mismatches.append({"key": key, "offset": e.get("offset"), "problem": problem})
            else:
                self.res.ok += 1

    def _read_headers(self, chunk: list[tuple[str, dict]]) -> tuple[list[bool], list[bool], list[bytearray]]:
        """Per entry of ``chunk``: whether its header lies inside the device, whether it was
        read, and its bytes. Headers (partly) past the end of the device are not read."""
        hb = self.header_bytes
        inside = [e["offset"] + hb <= self.dev_size for _k, e in chunk]
        rd = [(e["offset"], i) for i, (_k, e) in enumerate(chunk) if inside[i]]
        bufs = [bytearray(hb) for _ in chunk]
        ok = [False] * len(chunk)
        if self.dev.io_engine == "io_uring" and rd:
            got, _errs = self.dev.wait_iouring(self.dev.batched_read([o for o, _i in rd], [bufs[i] for _o, i in rd],
                                                                     [hb] * len(rd)))
            if len(got) == len(rd):
                for (_o, i), g in zip(rd, got):
                    ok[i] = g
        else:
            for off, i in rd:
                try:
                    self.dev.pread_into(off, bufs[i], hb)
                    ok[i] = True
                except (OSError, RuntimeError):
                    pass
        return inside, ok, bufs

    def _slot_problem(self, key: str, e: dict, within: bool, good: bool, hdr: bytearray) -> str | None:
        """What is wrong with one entry's slot (None: nothing): its header out of the device
        or unreadable, or what the header says against the entry."""
        size = e["size"]
        if not within:
            return f"slot header at {e['offset']} lies beyond the end of the device ({self.dev_size} bytes)"
        if not good:
            return "header unreadable"
        magic, ident, plen = SLOT_HEADER.unpack_from(hdr)
        try:
            expected = slot_identity_from_encoded_key(key, _namespace_of(key))
        except Exception as ex:  # noqa: BLE001 - a key the codec refuses is a mismatch to report
            return f"cannot derive identity from key: {ex}"
        if magic != SLOT_MAGIC:
            return "no slot header (magic)"
        if ident != expected:
            return f"identity {ident:#x} != expected {expected:#x}"
        if plen != size:
            return f"payload length {plen} != checkpoint size {size}"
        problem = _key_hash_problem(key, hdr)
        if problem:
            return problem
        if self.checksums and len(hdr) >= 40 and hdr[24:32] == CHECKSUM_MAGIC:
            return self._checksum_problem(e, hdr)
        return None

    def _checksum_problem(self, e: dict, hdr: bytearray) -> str | None:
        """Re-reads the payload of a slot whose header carries our xxh3-64 record and compares
        it (counted in ``res.checksums_checked``)."""
        want = struct.unpack_from("<Q", hdr, 32)[0]
        data = _read(self.dev, e["offset"] + self.header_bytes, e["size"])
        self.res.checksums_checked += 1
        if data is None or xxh3_64(data) != want:
            return "payload checksum mismatch"
        return None


def _key_hash_problem(key: str, hdr: bytearray) -> str | None:
    """A slot header's key hash (ours; 0 where LMCache or an older writer left none) that is
    not the one of ``key``: another key of the same slot identity wrote the slot."""
    if len(hdr) < KEY_HASH_OFF + KEY_HASH.size:
        return None
    got = KEY_HASH.unpack_from(hdr, KEY_HASH_OFF)[0]
    if not got:
        return None
    try:
        raw = key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # not the bytes the core hashed: nothing to compare with
        return None
    want = xxh3_64(raw) or 1
    return None if got == want else f"key hash {got:#x} != expected {want:#x} (another key's slot)"


def _printable(v: Any) -> str:
    """Text from the device as it may go to a terminal: control characters escaped."""
    s = str(v)
    return s if s.isprintable() else repr(s)


def format_inspect(info: dict) -> str:
    g = info["geometry"]
    lines = [f"device {info['device']}  ({info['size_bytes']} bytes)"]
    lines.append("geometry: " + ", ".join(f"{k}={g[k]}" for k in (
        "block_align", "header_bytes", "slot_bytes", "meta_total_bytes", "data_base_offset", "extent_stride",
        "max_slots", "next_slot", "used_slots", "free_slots") if k in g))
    for c in info["containers"]:
        lines.append(f"container {c['index']} @ {c['offset']}: seq={c['seq']} payload={c['payload_len']} B "
                     f"crc={c['crc32']} {'ok' if c['crc_ok'] else 'BAD'}"
                     + (f" entries={c['entries']}" if c["entries"] is not None else "")
                     + (f" ({_printable(c['error'])})" if c["error"] else ""))
    ml = info.get("metadata_log")
    if ml is not None:
        sb, b, lg = ml["superblock"], ml["base"], ml["log"]
        lines.append(f"metadata format: log (superblock {ml['superblock_used']}, sequence {sb['sb_seq']}"
                     + (", FALLBACK: the other one is unusable" if ml["fallback"] else "") + ")")
        lines.append(f"base: {b['entries']} entries in {b['chunks_ok']} chunks ({sb['base']['bytes']} bytes, area "
                     f"{sb['base']['area']}), covers log sequence {sb['base']['log_seq']}"
                     + ("" if b["complete"]
                        else f"; DAMAGED: {b['chunks_bad']} chunks, {b['entries_lost']} entries lost"))
        lines.append(f"log: {lg['groups']} groups, {lg['records']} records ({lg['puts']} puts, {lg['frees']} frees), "
                     f"{lg['live_bytes']} of {sb['ring']['bytes']} ring bytes live, ends: {lg['end']}"
                     + (f" ({_printable(lg['why'])})" if lg["end"] in ("torn", "io-error") else ""))
        if lg["gaps"]:
            lines.append("log: DAMAGED: " + _log_damage_text(lg))
        if lg["end"] == "io-error":
            lines.append("log: DAMAGED: " + _log_read_error_text(lg))
        lines.append(f"index: {g.get('entries')} entries")
    else:
        lines.append(f"checkpoint in use: container {info['checkpoint_in_use']}, {g.get('entries')} entries")
    for e in info["sample_entries"]:
        lines.append(f"  {_printable(e['key'])}  offset={e['offset']} size={e['size']} shape={e['shape']} "
                     f"dtype={_printable(e['dtype'])} fmt={_printable(e['fmt'])}")
    return "\n".join(lines)


def _log_damage_text(lg: dict) -> str:
    """What a log walk that went on past damage lost (read_metadata_log's "log" dict)."""
    recs = "uncounted" if lg["records_lost"] < 0 else str(lg["records_lost"])
    return (f"group {lg['gap_seq']} at ring offset {lg['gap_at']} failed ({_printable(lg['gap_why'])}) and later "
            f"groups follow: {lg['groups_lost']} groups lost in {lg['gaps']} places (records: {recs})")


def _log_read_error_text(lg: dict) -> str:
    """A log walk that ended at a group it could not read (no later group found)."""
    return (f"cut short by a read error: group {lg['last_seq'] + 1} at ring offset {lg['head']} unreadable "
            f"({_printable(lg['why'])})")


def metadata_damage(log: dict | None) -> list[str]:
    """What a log-format reading says was lost to damage: log groups skipped with later ones
    after them, a log cut short by a read error, damaged base chunks. Empty for format v1 and for
    an intact region. (A newest superblock that does not read is no loss by itself: a crash
    during its write leaves one.)"""
    if log is None:
        return []
    out = []
    if log["log"]["gaps"]:
        out.append("metadata log damaged: " + _log_damage_text(log["log"]))
    if log["log"]["end"] == "io-error":
        out.append("metadata log " + _log_read_error_text(log["log"]))
    if log["base"]["chunks_bad"]:
        out.append(f"metadata base damaged: {log['base']['chunks_bad']} chunks, "
                   f"{log['base']['entries_lost']} entries lost")
    return out


def format_verify(res: dict) -> str:
    lines = [f"verified {res['checked']} slot headers on {res['device']}: {res['ok']} ok, "
             f"{res['mismatch_count']} mismatched; {res['checksums_checked']} payload checksums checked"]
    for m in res["mismatches"][:50]:
        lines.append(f"  {_printable(m['key'])} @ {m['offset']}: {_printable(m['problem'])}")
    if res["mismatch_count"] > 50:
        lines.append(f"  ... and {res['mismatch_count'] - 50} more")
    lines += [f"DAMAGED: {_printable(d)}" for d in res.get("metadata_damage", ())]
    return "\n".join(lines)


def _run_cli(args: Any, work: Any) -> tuple[int, Any]:
    """Run work(); map the expected failures to a one-line message: exit code 2 (not a raw-block
    device, cannot open it), EXIT_BUSY (a raw-block writer holds it)."""
    try:
        return 0, work()
    except NotARawBlockDevice as e:
        print(f"error: {e}", file=sys.stderr)
    except OSError as e:
        if e.errno == errno.EBUSY:
            print(f"error: {args.device}: {e.strerror or e}; pass --ignore-lock to read it anyway "
                  "(what the writer changes meanwhile may read inconsistent)", file=sys.stderr)
            return EXIT_BUSY, None
        print(f"error: cannot open {args.device}: {e.strerror or e}", file=sys.stderr)
    return 2, None


def main_inspect(args: Any) -> int:
    rc, info = _run_cli(args, lambda: inspect_device(args.device, sample=args.sample, block_align=args.block_align,
                                                     meta_total_bytes=args.meta_total_bytes,
                                                     ignore_lock=args.ignore_lock))
    if rc == 0:
        print(json.dumps(info, indent=2) if args.json else format_inspect(info))
    return rc


def main_verify(args: Any) -> int:
    rc, res = _run_cli(args, lambda: verify_device(args.device, checksums=not args.no_checksums,
                                                   progress=not args.json and os.isatty(2),
                                                   block_align=args.block_align,
                                                   meta_total_bytes=args.meta_total_bytes,
                                                   ignore_lock=args.ignore_lock))
    if rc:
        return rc
    print(json.dumps(res, indent=2) if args.json else format_verify(res))
    return 1 if res["mismatch_count"] or res["metadata_damage"] else 0


def _count_arg(text: str) -> int:
    """argparse type of a count (--sample): an integer >= 0; anything else is refused with the
    value (argparse names the option)."""
    try:
        n = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def add_arguments(p: Any, verify: bool) -> None:
    p.add_argument("device", help="raw block device or file written by LMCache's raw-block tier (opened read-only)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--block-align", type=int, default=None, help="override the discovered block_align")
    p.add_argument("--meta-total-bytes", type=int, default=None, help="override the discovered meta_total_bytes")
    p.add_argument("--ignore-lock", action="store_true",
                   help=f"read the device even while a raw-block writer holds it (a running core), with a "
                        f"warning: what it writes meanwhile may read inconsistent. Without it such a device is "
                        f"refused with exit status {EXIT_BUSY}")
    if verify:
        p.add_argument("--no-checksums", action="store_true", help="skip payload checksum re-reads")
    else:
        p.add_argument("--sample", type=_count_arg, default=5, help="how many entries to list (default 5)")


# --------------------------------------------------------------------------- fdp-status


def fdp_status(path: str) -> dict:
    """A namespace's FDP configuration, reclaim unit handles and media counters
    (``_native.nvme_fdp_report``); OSError, ValueError or RuntimeError when ``path`` is not an
    NVMe namespace the kernel lets us query."""
    from ._native import nvme_fdp_report

    return {"device": path, **nvme_fdp_report(path)}


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def format_fdp_status(r: dict) -> str:
    lba = int(r.get("lba_size") or 0)
    lines = [f"{r['device']}: namespace {r['nsid']}, endurance group {r['endgid']}, {lba}-byte blocks, "
             f"{r['size_bytes']} bytes"]
    cfg = r.get("config")
    if not r.get("fdp_enabled"):
        lines.append("FDP: not enabled on this endurance group (writes cannot be placed)")
        return "\n".join(lines)
    if cfg:
        lines.append(f"FDP: enabled, configuration {cfg.get('index')}: {cfg['nrg']} reclaim group(s), "
                     f"{cfg['nruh']} reclaim unit handle(s), reclaim unit {cfg['runs']} bytes "
                     f"({_mib(int(cfg['runs']))})" + (f", up to {cfg['maxpids']} placement ids per namespace"
                                                     if "maxpids" in cfg else ""))
    else:
        lines.append("FDP: enabled (configuration not readable)")
    ruhs = r.get("ruhs") or []
    if ruhs:
        # Available media writes count logical blocks: what the handle's current reclaim unit
        # still takes before the device moves the handle to a fresh one.
        lines.append(f"{'placement id':>12}  {'handle':>6}  {'available media writes':>34}  {'est. time left':>14}")
        for h in ruhs:
            amw = int(h["ruamw"])
            lines.append(f"{h['pid']:>12}  {h['ruhid']:>6}  {f'{amw} blocks ({_mib(amw * lba)})':>34}  "
                         f"{str(h['earutr']) + ' s':>14}")
    else:
        lines.append("reclaim unit handle status: not readable")
    st = r.get("stats")
    if st:
        lines.append(f"endurance group: host bytes with metadata written {st['hbmw']}, media bytes with metadata "
                     f"written {st['mbmw']}, media bytes erased {st['mbe']}")
    return "\n".join(lines)


def main_fdp_status(args: Any) -> int:
    try:
        r = fdp_status(args.device)
    except OSError as e:
        msg = e.strerror or str(e)
        if e.errno and os.strerror(e.errno) not in msg:
            msg += f": {os.strerror(e.errno)}"
        print(f"error: {args.device}: {msg}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as e:
        msg = str(e)
        print(f"error: {msg}" if args.device in msg else f"error: {args.device}: {msg}", file=sys.stderr)
        return 2
    print(json.dumps(r, indent=2) if args.json else format_fdp_status(r))
    return 0


def add_fdp_status_arguments(p: Any) -> None:
    p.add_argument("device", help="NVMe namespace: character device /dev/ngXnY or block device /dev/nvmeXnY")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
