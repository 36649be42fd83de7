"""Read-only inspection of a raw-block device: ``inspect`` and ``verify``.

Both work on any device in LMCache's on-disk format v1, whoever wrote it (our core or
LMCache's), and never open the device for writing. The geometry is discovered from the
device itself: container 0's header sits at offset 0, its payload one ``block_align`` later
(found by trying the usual alignments against the header's CRC), and the checkpoint JSON
names ``meta_total_bytes``, which places container 1. ``--block-align`` and
``--meta-total-bytes`` override the discovery (needed only when container 0 is damaged and
the region is not LMCache's default size).
"""

from __future__ import annotations

import json
import os
import struct
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ._native import RawBlockDevice, xxh3_64
from .raw_block.key_codec import slot_identity_from_encoded_key

CONTAINER_HEADER = struct.Struct("<8sIQQI")  # magic, version, seq, payload_len, crc32
SLOT_HEADER = struct.Struct("<8sQQ")  # magic, slot identity, payload length
SLOT_MAGIC = b"LMCBLK01"
CHECKSUM_MAGIC = b"RBXXH3v1"  # ours, at slot-header bytes 24..40
CANDIDATE_ALIGNS = (4096, 512, 1024, 2048, 8192, 16384, 65536)
DEFAULT_META_TOTALS = (128 << 20, 256 << 20, 64 << 20, 32 << 20, 16 << 20, 8 << 20, 4 << 20, 2 << 20, 1 << 20)


class NotARawBlockDevice(Exception):
    """The device holds no valid LMCache raw-block checkpoint."""


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
            "entries": len(self.state.get("entries", {})) if self.state else None, "error": self.error,
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

    @property
    def state(self) -> dict:
        return self.chosen.state if self.chosen and self.chosen.state else {}


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
                     magic: bytes | None) -> Container | None:
    raw = _read(dev, offset, CONTAINER_HEADER.size)
    if raw is None:
        return None
    m, version, seq, plen, crc = CONTAINER_HEADER.unpack(raw)
    if (magic is not None and m != magic) or (magic is None and not m.startswith(b"LMC")) or plen == 0:
        return None
    c = Container(index, offset, m, version, seq, plen, crc, False)
    payload = _read(dev, offset + align, plen)
    if payload is None:
        c.error = "payload unreadable"
        return c
    c.crc_ok = (zlib.crc32(payload) & 0xFFFFFFFF) == crc
    if not c.crc_ok:
        c.error = "CRC mismatch"
        return c
    try:
        c.state = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        c.error = f"JSON: {e}"
    return c


def read_device(path: str, *, block_align: int | None = None, meta_total_bytes: int | None = None,
                magic: bytes | None = b"LMCIDX01") -> DeviceReport:
    """Find and decode both checkpoint containers; raises NotARawBlockDevice if neither is valid."""
    with RawBlockDevice(path, False) as dev:
        size = dev.size_bytes()
        aligns = (block_align,) if block_align else CANDIDATE_ALIGNS
        first: Container | None = None
        align_used = aligns[0]
        for a in aligns:
            c = _parse_container(dev, 0, 0, a, magic)
            if c is None:
                break  # no header at offset 0: alignment does not matter
            if first is None or (c.crc_ok and not first.crc_ok):
                first, align_used = c, a
            if c.crc_ok:
                break
        metas: tuple[int, ...]
        if meta_total_bytes:
            metas = (meta_total_bytes,)
        elif first is not None and first.state and "meta_total_bytes" in first.state:
            metas = (int(first.state["meta_total_bytes"]),)
            align_used = int(first.state.get("block_align", align_used))
        else:
            metas = DEFAULT_META_TOTALS
        second: Container | None = None
        meta_used = metas[0]
        for mt in metas:
            for a in ((align_used,) if first else aligns):
                off = ((mt // 2) // a) * a
                c = _parse_container(dev, 1, off, a, magic)
                if c is not None and (second is None or (c.crc_ok and not second.crc_ok)):
                    second, meta_used = c, mt
                    if first is None:
                        align_used = a
                if second is not None and second.crc_ok:
                    break
            if second is not None and second.crc_ok:
                break
    containers = [c for c in (first, second) if c is not None]
    valid = [c for c in containers if c.crc_ok and c.state is not None]
    if not valid:
        found = ", ".join(f"container {c.index}: {c.error}" for c in containers) or "no container header"
        raise NotARawBlockDevice(
            f"{path}: no valid LMCache raw-block checkpoint (magic {magic!r}) found ({found}); "
            f"this device was not written by LMCache's raw-block tier or lmcache_rawblock")
    chosen = max(valid, key=lambda c: (c.seq, -c.index))
    st = chosen.state or {}
    meta_total = int(st.get("meta_total_bytes", meta_used))
    geometry = {k: st.get(k) for k in ("version", "device_path", "capacity_bytes", "block_align", "header_bytes",
                                       "slot_bytes", "meta_total_bytes", "meta_magic", "meta_version",
                                       "data_base_offset", "next_slot")}
    slot_bytes = int(st.get("slot_bytes") or 0)
    base = int(st.get("data_base_offset") or meta_total)
    cap = int(st.get("capacity_bytes") or size)
    geometry["max_slots"] = (min(cap, size) - base) // slot_bytes if slot_bytes else None
    entries = st.get("entries", {}) or {}
    geometry["entries"] = len(entries)
    if geometry["max_slots"] is not None:
        used = len(entries)
        geometry["used_slots"] = used
        geometry["free_slots"] = geometry["max_slots"] - used
    return DeviceReport(path, size, int(st.get("block_align", align_used)), meta_total, containers, chosen, geometry)


def inspect_device(path: str, *, sample: int = 5, **kw: Any) -> dict:
    rep = read_device(path, **kw)
    entries = rep.state.get("entries", {}) or {}
    sample_rows = []
    for key, e in list(entries.items())[:sample]:
        sample_rows.append({"key": key, **{k: e.get(k) for k in ("offset", "size", "shape", "dtype", "fmt")}})
    return {
        "device": path,
        "size_bytes": rep.size_bytes,
        "geometry": rep.geometry,
        "containers": [c.as_dict() for c in rep.containers],
        "checkpoint_in_use": rep.chosen.index if rep.chosen else None,
        "sample_entries": sample_rows,
    }


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
                  **kw: Any) -> dict:
    """Read every indexed slot's header (batched through io_uring when available) and compare
    magic, identity and length with the checkpoint; with ``checksums``, re-read payloads whose
    header carries our xxh3-64 record and compare it."""
    rep = read_device(path, **kw)
    st = rep.state
    header_bytes = int(st.get("header_bytes") or 4096)
    entries = list((st.get("entries") or {}).items())
    res = VerifyResult()
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(entries), unit="slot", desc="verify", file=sys.stderr)
        except ImportError:
            bar = None
    try:
        dev = RawBlockDevice(path, False, io_engine="io_uring", iouring_queue_depth=min(batch, 256))
    except (RuntimeError, OSError):
        dev = RawBlockDevice(path, False)
    with dev:
        for chunk in _header_batches(entries, batch):
            bufs = [bytearray(header_bytes) for _ in chunk]
            offsets = [int(e.get("offset", 0)) for _k, e in chunk]
            if dev.io_engine == "io_uring":
                ok, _errs = dev.wait_iouring(dev.batched_read(offsets, bufs, [header_bytes] * len(chunk)))
            else:
                ok = []
                for off, b in zip(offsets, bufs):
                    try:
                        dev.pread_into(off, b, header_bytes)
                        ok.append(True)
                    except (OSError, RuntimeError):
                        ok.append(False)
            for (key, e), good, hdr in zip(chunk, ok, bufs):
                res.checked += 1
                problem = None
                size = int(e.get("size", -1))
                if not good:
                    problem = "header unreadable"
                else:
                    magic, ident, plen = SLOT_HEADER.unpack_from(hdr)
                    try:
                        expected = slot_identity_from_encoded_key(key, _namespace_of(key))
                    except Exception as ex:  # noqa: BLE001
                        expected, problem = None, f"cannot derive identity from key: {ex}"
                    if problem is None and magic != SLOT_MAGIC:
                        problem = "no slot header (magic)"
                    elif problem is None and ident != expected:
                        problem = f"identity {ident:#x} != expected {expected:#x}"
                    elif problem is None and plen != size:
                        problem = f"payload length {plen} != checkpoint size {size}"
                    elif problem is None and checksums and hdr[24:32] == CHECKSUM_MAGIC:
                        want = struct.unpack_from("<Q", hdr, 32)[0]
                        data = _read(dev, int(e["offset"]) + header_bytes, size)
                        res.checksums_checked += 1
                        if data is None or xxh3_64(data) != want:
                            problem = "payload checksum mismatch"
                if problem:
                    res.mismatches.append({"key": key, "offset": e.get("offset"), "problem": problem})
                else:
                    res.ok += 1
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return {"device": path, "geometry": rep.geometry, **res.as_dict()}


def format_inspect(info: dict) -> str:
    g = info["geometry"]
    lines = [f"device {info['device']}  ({info['size_bytes']} bytes)"]
    lines.append("geometry: " + ", ".join(f"{k}={g[k]}" for k in (
        "block_align", "header_bytes", "slot_bytes", "meta_total_bytes", "data_base_offset", "max_slots",
        "next_slot", "used_slots", "free_slots") if k in g))
    for c in info["containers"]:
        lines.append(f"container {c['index']} @ {c['offset']}: seq={c['seq']} payload={c['payload_len']} B "
                     f"crc={c['crc32']} {'ok' if c['crc_ok'] else 'BAD'}"
                     + (f" entries={c['entries']}" if c["entries"] is not None else "")
                     + (f" ({c['error']})" if c["error"] else ""))
    lines.append(f"checkpoint in use: container {info['checkpoint_in_use']}, {g.get('entries')} entries")
    for e in info["sample_entries"]:
        lines.append(f"  {e['key']}  offset={e['offset']} size={e['size']} shape={e['shape']} "
                     f"dtype={e['dtype']} fmt={e['fmt']}")
    return "\n".join(lines)


def format_verify(res: dict) -> str:
    lines = [f"verified {res['checked']} slot headers on {res['device']}: {res['ok']} ok, "
             f"{res['mismatch_count']} mismatched; {res['checksums_checked']} payload checksums checked"]
    for m in res["mismatches"][:50]:
        lines.append(f"  {m['key']} @ {m['offset']}: {m['problem']}")
    if res["mismatch_count"] > 50:
        lines.append(f"  ... and {res['mismatch_count'] - 50} more")
    return "\n".join(lines)


def _run_cli(args: Any, work: Any) -> tuple[int, Any]:
    """Run work(); map the two expected failures to exit code 2 with a one-line message."""
    try:
        return 0, work()
    except NotARawBlockDevice as e:
        print(f"error: {e}", file=sys.stderr)
    except OSError as e:
        print(f"error: cannot open {args.device}: {e.strerror or e}", file=sys.stderr)
    return 2, None


def main_inspect(args: Any) -> int:
    rc, info = _run_cli(args, lambda: inspect_device(args.device, sample=args.sample, block_align=args.block_align,
                                                     meta_total_bytes=args.meta_total_bytes))
    if rc == 0:
        print(json.dumps(info, indent=2) if args.json else format_inspect(info))
    return rc


def main_verify(args: Any) -> int:
    rc, res = _run_cli(args, lambda: verify_device(args.device, checksums=not args.no_checksums,
                                                   progress=not args.json and os.isatty(2),
                                                   block_align=args.block_align,
                                                   meta_total_bytes=args.meta_total_bytes))
    if rc:
        return rc
    print(json.dumps(res, indent=2) if args.json else format_verify(res))
    return 1 if res["mismatch_count"] else 0


def add_arguments(p: Any, verify: bool) -> None:
    p.add_argument("device", help="raw block device or file written by LMCache's raw-block tier (opened read-only)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--block-align", type=int, default=None, help="override the discovered block_align")
    p.add_argument("--meta-total-bytes", type=int, default=None, help="override the discovered meta_total_bytes")
    if verify:
        p.add_argument("--no-checksums", action="store_true", help="skip payload checksum re-reads")
    else:
        p.add_argument("--sample", type=int, default=5, help="how many entries to list (default 5)")
