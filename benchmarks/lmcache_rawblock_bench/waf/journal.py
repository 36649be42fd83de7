"""The core's own write journal, turned into the write stream the flash model replays.

``lmcache_rawblock._native._set_write_journal(path)`` makes every device write of the process
(its offset and length, not its bytes), every deallocated range and every flush land in a file
in the order they completed (``csrc/core/rb_wlog.h``: the test write log, without the bytes).
That is every write the core makes, whatever it writes: chunk slots, format v1's containers, the
log format's log groups, base chunks and superblocks. :func:`to_stream` keeps one device's
records (by the file's device and inode) and writes them in :mod:`.stream`'s JSON-lines format
(``write`` and ``deallocate`` records; flushes are left out: the flash model has no cache).

Journal format: the 8-byte magic ``RBWLOG01``, then 48-byte little-endian records
``u32 kind, u32 0, u64 st_dev, u64 st_ino, u64 offset (or barrier), u64 length, u64 sequence``;
kind 4 is a write without its bytes, 3 a deallocation, 2 a flush. A journal started with bytes
(kind 1, the crash-state tests' log) is refused: its bytes follow the header.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import IO, Iterator

MAGIC = b"RBWLOG01"
HEADER = struct.Struct("<IIQQQQQ")
WRITE_WITH_BYTES, FLUSH, DEALLOCATE, WRITE = 1, 2, 3, 4


@dataclass
class JournalCounts:
    """What :func:`to_stream` kept: writes and their bytes, deallocations and their bytes, and
    the bytes written below ``meta_end`` (the metadata region: superblocks, log, base, or
    format v1's containers)."""

    writes: int = 0
    write_bytes: int = 0
    deallocs: int = 0
    dealloc_bytes: int = 0
    meta_writes: int = 0
    meta_write_bytes: int = 0
    other_files: int = 0
    flushes: int = 0

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("writes", "write_bytes", "deallocs", "dealloc_bytes", "meta_writes",
                                           "meta_write_bytes", "other_files", "flushes")}
        d["meta_share"] = self.meta_write_bytes / self.write_bytes if self.write_bytes else None
        return d


def records(path: str) -> Iterator[tuple[int, int, int, int, int]]:
    """(kind, st_dev, st_ino, offset, length) of each record of the journal at ``path``."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{path}: not a write journal (no {MAGIC.decode()} magic)")
        while True:
            h = f.read(HEADER.size)
            if not h:
                return
            if len(h) < HEADER.size:
                raise ValueError(f"{path}: a truncated record at byte {f.tell() - len(h)}")
            kind, _, dev, ino, off, n, _ = HEADER.unpack(h)
            if kind == WRITE_WITH_BYTES:
                raise ValueError(f"{path}: a write with its bytes (a write log, not a journal) at byte "
                                 f"{f.tell() - HEADER.size}")
            if kind not in (FLUSH, DEALLOCATE, WRITE):
                raise ValueError(f"{path}: record kind {kind} at byte {f.tell() - HEADER.size}")
            yield kind, dev, ino, off, n


def to_stream(path: str, device: str, out: IO[str], *, meta_end: int = 0) -> JournalCounts:
    """The records of ``device`` (its st_dev and st_ino now) in the journal at ``path``, as a
    write stream on ``out``; writes that start below ``meta_end`` count as metadata."""
    st = os.stat(device)
    c = JournalCounts()
    for kind, dev, ino, off, n in records(path):
        if (dev, ino) != (st.st_dev, st.st_ino):
            c.other_files += 1
            continue
        if kind == FLUSH:
            c.flushes += 1
        elif kind == WRITE:
            out.write(json.dumps({"op": "write", "offset": off, "length": n, "pid": None}) + "\n")
            c.writes += 1
            c.write_bytes += n
            if off < meta_end:
                c.meta_writes += 1
                c.meta_write_bytes += n
        else:
            out.write(json.dumps({"op": "deallocate", "offset": off, "length": n}) + "\n")
            c.deallocs += 1
            c.dealloc_bytes += n
    return c
