"""Shared pieces of the crash harnesses: a small geometry that makes slot reuse frequent,
self-describing payloads, the key universe, and opening a RawBlockCore on a device file in
either metadata format (v1: LMCache's JSON checkpoint in two containers; log: superblocks,
bases and a ring of log groups, docs/metadata-log.md)."""

from __future__ import annotations

import itertools
import random
import struct
from dataclasses import dataclass
from typing import Any

from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig, encode_object_key
from lmcache_rawblock.raw_block._lmcache import ObjectKey

BLOCK = 4096
HEADER = 4096
SLOT = 16 * 1024
META = 128 * 1024               # v1: two 64 KiB checkpoint containers; log: two superblocks,
                                # two 44 KiB base areas and a 16 KiB ring (4 one-block groups),
                                # so the ring fills and is compacted every few checkpoints
MAX_PAYLOAD = SLOT - HEADER     # 12 KiB
MIN_PAYLOAD = 64
PAYLOAD_TAG = struct.Struct("<QQ")  # (key id, version) at the start of every payload
META_FORMATS = ("v1", "log")


@dataclass(frozen=True)
class Config:
    engine: str            # "posix" | "io_uring"
    odirect: bool
    checksum: bool         # verify_payload_checksum
    verify_on_load: bool   # meta_verify_on_load
    meta_format: str = "v1"
    dealloc: bool = False  # deallocate_freed "on" (on a file: freed slots become punched holes), else "off"
    extent: bool = False   # extent_bytes EXTENT (slots handed out and deallocated by extent), else 0
    stride: bool = False   # with extent: EXTENT_STRIDED (the log format's strided layout) instead
    classes: bool = False  # with extent, log format: size_classes SIZE_CLASSES (else 1)

    @property
    def name(self) -> str:
        return "/".join([self.engine, "odirect" if self.odirect else "buffered",
                         "sum" if self.checksum else "nosum", "verify" if self.verify_on_load else "noverify",
                         self.meta_format] + (["dealloc"] if self.dealloc else []) + (["extent"] if self.extent else [])
                        + (["stride"] if self.stride else []) + (["classes"] if self.classes else []))


# Deallocation of freed slots is on in half of the configurations: for each format, engine,
# O_DIRECT and validation setting exactly one of the two checksum settings (and the other way
# round), so every other axis meets it on and off without doubling the matrix.
ALL_CONFIGS = [Config(e, d, s, v, f, d ^ s ^ v) for f, e, d, s, v in itertools.product(
    META_FORMATS, ("posix", "io_uring"), (False, True), (False, True), (True, False))]
# Extents (extent_bytes) with deallocation on, where whole extents are given back: one
# configuration per format and engine, their writers also evicting whole victim extents.
EXTENT = 4 * SLOT
# The strided layout (log format only): 4 slots and a 16 KiB tail per extent, extent 0 on the
# first EXTENT_STRIDED boundary past the metadata region.
EXTENT_STRIDED = 4 * SLOT + 16 * 1024
EXTENT_CONFIGS = [Config(e, False, False, True, f, True, True) for f in META_FORMATS for e in ("posix", "io_uring")]
EXTENT_CONFIGS += [Config(e, False, False, True, "log", True, True, True) for e in ("posix", "io_uring")]
# Size classes (log format only): slots of 16, 12 and 8 KiB (12, 8 and 4 KiB of payload), so the
# payloads of MIN_PAYLOAD to MAX_PAYLOAD fall in all three; 4, 5 and 8 slots an extent.
SIZE_CLASSES = 3
EXTENT_CONFIGS += [Config(e, False, False, True, "log", True, True, False, True) for e in ("posix", "io_uring")]


def config_by_name(name: str) -> Config:
    """A configuration by name, engine/io/sum/verify[/format][/dealloc][/extent]: a name without
    the format means v1, one without "dealloc" has deallocation off, one without "extent" no
    extents. Any combination is accepted, not only the ones in ALL_CONFIGS."""
    parts = name.split("/")
    classes = parts[-1] == "classes"
    if classes:
        parts.pop()
    stride = parts[-1] == "stride"
    if stride:
        parts.pop()
    extent = parts[-1] == "extent"
    if extent:
        parts.pop()
    dealloc = parts[-1] == "dealloc"
    if dealloc:
        parts.pop()
    if len(parts) == 4:
        parts.append("v1")
    cfg = None
    if len(parts) == 5:
        e, io, s, v, f = parts
        if (e in ("posix", "io_uring") and io in ("buffered", "odirect") and s in ("sum", "nosum")
                and v in ("verify", "noverify") and f in META_FORMATS):
            cfg = Config(e, io == "odirect", s == "sum", v == "verify", f, dealloc, extent, stride and extent,
                         classes and extent)
    if cfg is None:
        raise ValueError(f"unknown configuration {name!r}: engine/io/sum/verify[/format][/dealloc], e.g. "
                         f"{ALL_CONFIGS[0].name} or {ALL_CONFIGS[-1].name}")
    return cfg


def device_size(nslots: int, stride: bool = False) -> int:
    """Bytes for nslots slots; strided: whole extents of EXTENT_STRIDED from its first boundary
    past the metadata region, as many as nslots needs."""
    if not stride:
        return META + nslots * SLOT
    base = (META + EXTENT_STRIDED - 1) // EXTENT_STRIDED * EXTENT_STRIDED
    return base + (nslots + 3) // 4 * EXTENT_STRIDED


def make_device(path: str, nslots: int, stride: bool = False) -> str:
    with open(path, "wb") as f:
        f.truncate(device_size(nslots, stride))
    return path


def open_core(path: str, cfg: Config, *, load: bool = True, meta_format: str | None = None) -> RawBlockCore:
    """A core on path with cfg (meta_format, when given, instead of cfg's)."""
    return RawBlockCore(core_config(path, cfg, load=load, meta_format=meta_format), key_namespace="object")


def core_config(path: str, cfg: Config, *, load: bool = True, meta_format: str | None = None) -> RawBlockCoreConfig:
    """The core configuration open_core opens path with."""
    return RawBlockCoreConfig(
        device_path=path, capacity_bytes=0, block_align=BLOCK, header_bytes=HEADER, slot_bytes=SLOT,
        use_odirect=cfg.odirect, enable_zero_copy=False, meta_total_bytes=META, meta_magic=b"LMCIDX01",
        meta_version=1, meta_checkpoint_interval_sec=3600, meta_idle_quiet_ms=0, meta_enable_periodic=False,
        meta_verify_on_load=cfg.verify_on_load, load_checkpoint_on_init=load, io_engine=cfg.engine,
        iouring_queue_depth=16, verify_payload_checksum=cfg.checksum, meta_format=meta_format or cfg.meta_format,
        deallocate_freed="on" if cfg.dealloc else "off", extent_bytes=_extent_bytes(cfg, meta_format or cfg.meta_format),
        size_classes=SIZE_CLASSES if cfg.classes and cfg.extent and (meta_format or cfg.meta_format) == "log" else 1)


def _extent_bytes(cfg: Config, meta_format: str) -> int:
    """extent_bytes of cfg; strided ones are the log format's only (format v1 setups: off)."""
    if not cfg.extent:
        return 0
    if cfg.stride:
        return EXTENT_STRIDED if meta_format == "log" else 0
    return EXTENT


_KEYS: dict[int, Any] = {}


def key(i: int):
    """RawBlockKeySpec of key id i (cached)."""
    k = _KEYS.get(i)
    if k is None:
        k = _KEYS[i] = encode_object_key(ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="crash", kv_rank=0))
    return k


def payload(kid: int, version: int, length: int) -> bytes:
    """Bytes of (key id, version): a tag naming both, then pseudo-random bytes from them, so a
    payload of another key, another version or a mix of two is recognised."""
    body = random.Random((kid << 40) ^ version).randbytes(length - PAYLOAD_TAG.size)
    return PAYLOAD_TAG.pack(kid, version) + body


def payload_tag(data: bytes) -> tuple[int, int]:
    return PAYLOAD_TAG.unpack_from(data) if len(data) >= PAYLOAD_TAG.size else (-1, -1)


class Obj:
    """Minimal MemoryObj: a writable byte_array and a metadata record."""

    class _Meta:
        def __init__(self, n: int):
            self.shape = (n,)
            self.dtype = "uint8"
            self.fmt = "BINARY"
            self.cached_positions = None

    def __init__(self, data: bytes | int):
        self._buf = bytearray(data)
        self.byte_array = memoryview(self._buf)
        self.metadata = Obj._Meta(len(self._buf))

    def bytes(self, n: int) -> bytes:
        return bytes(self._buf[:n])


def verify_served(core: RawBlockCore, versions: dict[int, dict[int, int]], kids) -> dict:
    """Load every key in kids the core says it holds and judge its bytes against versions
    (key id -> {version: length} of every put ever attempted for it).

    Returns {"served": {kid: version}, "wrong": [(kid, description)], "dropped": [kid] (indexed,
    but the load was a miss: e.g. the first load's header check rejected an unverified entry),
    "errors": [(kid, exception)] (the load failed, e.g. a payload checksum mismatch)}."""
    kids = list(kids)
    enc = [key(k).encoded for k in kids]
    held = [k for k, e in zip(kids, core.exists_many(enc)) if e]
    out = {"served": {}, "wrong": [], "dropped": [], "errors": []}
    if not held:
        return out
    henc = [key(k).encoded for k in held]
    metas = core.get_metadata_many(henc)
    objs = [Obj(MAX_PAYLOAD) for _ in held]
    ok, _positions, errors = core._native.load_many_into(henc, objs)
    for kid, m, o, good, exc in zip(held, metas, objs, ok, errors):
        if not good:
            if exc is None:
                out["dropped"].append(kid)
            else:
                out["errors"].append((kid, exc))
            continue
        size = m.size if m is not None else -1
        data = o.bytes(size) if size > 0 else b""
        tk, tv = payload_tag(data)
        known = versions.get(kid, {})
        if tk != kid:
            out["wrong"].append((kid, f"{size} bytes tagged as key {tk} version {tv}"))
        elif tv not in known:
            out["wrong"].append((kid, f"tagged with version {tv}, never put for this key"))
        elif known[tv] != size:
            out["wrong"].append((kid, f"version {tv} was {known[tv]} bytes, served {size}"))
        elif data != payload(kid, tv, size):
            out["wrong"].append((kid, f"version {tv}: {size} bytes differ from what was put (torn or mixed)"))
        else:
            out["served"][kid] = tv
    return out
