"""Shared helpers for the RawBlockCore tests: CI geometry, fake MemoryObj, and an
independent reader/writer of on-disk format v1 (struct + json + zlib only)."""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig, encode_object_key
from lmcache_rawblock.lmcache_paths import raw_block_core_logger
from lmcache_rawblock.raw_block._lmcache import ObjectKey

# Our core's logger: LMCache's raw-block core's logger name in the installed LMCache version.
CORE_LOGGER = raw_block_core_logger()
MiB = 1 << 20
BLOCK = 4096
HEADER = 4096
SLOT = 64 * 1024
META = 1 * MiB
DEV_SIZE = 128 * MiB
CONTAINER = META // 2
HDR_FMT = "<8sIQQI"


@dataclass
class Meta:
    shape: Any = None
    dtype: Any = "uint8"
    fmt: Any = "BINARY"
    cached_positions: Any = None


class Obj:
    """Minimal MemoryObj: byte_array (writable memoryview) + metadata."""

    def __init__(self, data: bytes | int, shape=None):
        if isinstance(data, int):
            self._buf = bytearray(data)
        else:
            self._buf = bytearray(data)
        self.byte_array = memoryview(self._buf)
        self.metadata = Meta(shape=shape if shape is not None else (len(self._buf),))

    def bytes(self) -> bytes:
        return bytes(self._buf)


def make_device(tmp_path, size=DEV_SIZE, name="dev.img") -> str:
    p = tmp_path / name
    with open(p, "wb") as f:
        f.truncate(size)
    return str(p)


# The metadata format the core tests open with unless a test names one: format v1 (LMCache's),
# whose containers many tests read back byte for byte; RB_TEST_META_FORMAT=log runs them over
# the log-structured format (the product default) instead.
TEST_META_FORMAT = os.environ.get("RB_TEST_META_FORMAT", "v1")


def make_config(path: str, **kw) -> RawBlockCoreConfig:
    base = dict(meta_format=TEST_META_FORMAT, device_path=path, capacity_bytes=0, block_align=BLOCK, header_bytes=HEADER, slot_bytes=SLOT,
                use_odirect=False, enable_zero_copy=False, meta_total_bytes=META, meta_magic=b"LMCIDX01",
                meta_version=1, meta_checkpoint_interval_sec=60, meta_idle_quiet_ms=0,
                meta_enable_periodic=False, meta_verify_on_load=True, io_engine="posix", iouring_queue_depth=8)
    base.update(kw)
    return RawBlockCoreConfig(**base)


def make_core(path: str, namespace="object", **kw) -> RawBlockCore:
    return RawBlockCore(make_config(path, **kw), key_namespace=namespace)


def okey(i: int, model="raw_block_ci"):
    return encode_object_key(ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name=model, kv_rank=0))


def payload(i: int, n: int) -> bytes:
    return bytes(((i * 31 + j) % 251) for j in range(n))


# ---- independent format v1 reader / writer -------------------------------------------------

def read_containers(path: str, magic=b"LMCIDX01", version=1, container=CONTAINER, block=BLOCK):
    """[(index, seq, state-dict or None if CRC bad)] for every container with a valid header."""
    out = []
    with open(path, "rb") as f:
        for k in range(2):
            f.seek(k * container)
            hdr = f.read(block)
            m, v, seq, plen, crc = struct.unpack_from(HDR_FMT, hdr)
            if m != magic or v != version or not (0 < plen <= container - block):
                continue
            assert hdr[32:] == bytes(block - 32)
            body = f.read(plen)
            state = json.loads(body.decode("ascii")) if zlib.crc32(body) == crc else None
            out.append((k, seq, state, body))
    return out


def newest_state(path: str, **kw):
    cands = [c for c in read_containers(path, **kw) if c[2] is not None]
    if not cands:
        return None
    return max(cands, key=lambda c: (c[1], -c[0]))


def write_container(path: str, k: int, seq: int, state_or_bytes, magic=b"LMCIDX01", version=1,
                    container=CONTAINER, block=BLOCK, crc=None):
    body = state_or_bytes if isinstance(state_or_bytes, bytes) else json.dumps(
        state_or_bytes, separators=(",", ":"), ensure_ascii=True).encode()
    hdr = struct.pack(HDR_FMT, magic, version, seq, len(body), zlib.crc32(body) if crc is None else crc)
    with open(path, "r+b") as f:
        f.seek(k * container + block)
        f.write(body + bytes((-len(body)) % block))
        f.seek(k * container)
        f.write(hdr + bytes(block - len(hdr)))


def write_slot(path: str, offset: int, identity: int, data: bytes, header=HEADER):
    hdr = b"LMCBLK01" + struct.pack("<QQ", identity, len(data))
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(hdr + bytes(header - len(hdr)))
        f.write(data)


def read_slot(path: str, offset: int, header=HEADER):
    with open(path, "rb") as f:
        f.seek(offset)
        hdr = f.read(header)
        magic = hdr[:8]
        ident, plen = struct.unpack_from("<QQ", hdr, 8)
        data = f.read(plen)
    return magic, ident, plen, hdr, data


def base_state(path: str, next_slot: int, entries: dict, **over) -> dict:
    st = {"version": 1, "device_path": path, "capacity_bytes": DEV_SIZE, "block_align": BLOCK,
          "header_bytes": HEADER, "slot_bytes": SLOT, "meta_total_bytes": META, "meta_magic": "LMCIDX01",
          "meta_version": 1, "data_base_offset": META, "next_slot": next_slot, "entries": entries}
    st.update(over)
    return st


def odirect_ok(path: str) -> bool:
    """Whether the file system under path takes O_DIRECT (tmpfs on older kernels does not)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    return True


def merged_ranges(offsets: list[int], length: int) -> list[tuple[int, int]]:
    """Sorted (offset, length) ranges of equal-sized slots at offsets, adjacent ones merged: the
    ranges a deallocation of those slots issues."""
    out: list[list[int]] = []
    for off in sorted(offsets):
        if out and out[-1][0] + out[-1][1] == off:
            out[-1][1] += length
        else:
            out.append([off, length])
    return [(o, n) for o, n in out]
