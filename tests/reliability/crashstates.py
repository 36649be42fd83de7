"""Crash-state enumeration (in the spirit of CrashMonkey / ALICE): record every device write
and flush of a fixed workload (_native._set_write_log, csrc/core/rb_wlog.h), then build the
device images a power loss could leave and recover each one with a fresh RawBlockCore.

Model: a write is durable once a flush that began after it completed (the flush record's
barrier). A crash in flush epoch e (after flush e, before flush e+1) leaves every write
before flush e's barrier plus any subset of the writes issued since, each write whole and
applied in issue order. Per epoch the states are every prefix of its writes and every
subset when it has at most MAX_EXHAUSTIVE writes, else RANDOM_SUBSETS seeded random subsets.
With --tear BYTES each write is split into BYTES-sized blocks that persist independently
(torn writes). A write synced by itself (RWF_DSYNC: a log group; a kind-5 record after it) is
durable from its record on, and only it: an epoch holding synced records is crashed before the
first, between two and after the last (crash_points), the writes logged before a synced one
staying optional.

Deallocations (deallocate_freed="on"; on these device files, punched holes) are kind-3 records
of the write log: an offset and a length, no bytes. Each is modelled as a write of zeros over
its range: durable after a flush that began after it, before that lost or landed
independently of the other writes of its epoch, applied in issue order, and torn like a data
write with --tear (a drive may deallocate part of a range).

Each image is recovered and checked like the kill loop does: every served key returns the
bytes of a put attempted for it; every key durable in that epoch is served; no key comes back
in a version the last acknowledged checkpoint no longer lists (a delete that a checkpoint made
durable stays deleted) unless a put of that version was attempted since; no crash state is
recovered as damage (recovery_outcome "damaged": each log group is durable before the next is
written, so a crash tears only the log's tail). Each engine
recovers every image twice: with slot headers validated at open (meta_verify_on_load) and with
that off, where the header check of every load is the only line between a torn slot and its
bytes being served. A key is durable in epoch e when a checkpoint_now() (or a
compact_metadata() that wrote a base) that included it returned before the epoch began and
no delete of it was attempted after that checkpoint and before the epoch ended.

Workloads (WORKLOADS): "v1", LMCache's format v1 throughout; "log", the log-structured format
(docs/metadata-log.md): records appended by checkpoints after puts and after deletes, a freed
slot taken by another key after one small record, the ring filled and compacted by a
checkpoint, compact_metadata() twice (the base switching areas); "move" and "move-c1", a device
set up in format v1 (its newest checkpoint in container 0, or in container 1) reopened with
meta_format='log', which moves it to the log format at its first checkpoint. Each of these
again with deallocation on ("+dealloc"), and the workloads written for it: "reuse" and
"reuse-log" (slots freed, deallocated once no durable metadata lists their keys, then taken by
puts; in v1 also a key no container listed, freed and deallocated by its delete), "full" and
"full-log" (an 8-slot device on which a put makes room itself and takes freed slots before
their deallocation ran), "lane-log" (the same device in the log format, deletes' FREE records
written ahead of pending puts without their payloads' flush, by a put's room and by
reclaim_held_slots, whose op kind is "reclaim"), and "lane-log-roomy" (the same on a device
with room to spare, nothing deallocated: a slot freed keeps its key's bytes).

Run: python3 tests/reliability/crashstates.py [--workload NAME] [--engine posix|io_uring]
     [--tear BYTES] [--tear-meta BYTES] [--random-workloads N] [--second-crash N] [--show N]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from itertools import combinations

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from reliability.common import META, Config, Obj, key, make_device, open_core, payload, verify_served
else:
    from .common import META, Config, Obj, key, make_device, open_core, payload, verify_served

from lmcache_rawblock import _native
from lmcache_rawblock.lmcache_paths import raw_block_core_logger

NSLOTS = 24
MAX_EXHAUSTIVE = 10
RANDOM_SUBSETS = 48
REC = struct.Struct("<IIQQQQQ")  # kind, 0, st_dev, st_ino, offset|barrier, length, sequence
WRITE, FLUSH, DEALLOC, SYNCED = 1, 2, 3, 5  # SYNCED: the write before it is durable by itself (RWF_DSYNC)

# Setup (not recorded, ends with a clean close): keys 0-5, version 1, and a checkpoint after
# each put step.
SETUP = [("put", [0, 1, 2, 3, 4, 5])]
# Recorded: deletes free slots that the next put can take (LIFO) while the freed key is still
# in the last checkpoint; versions 2+ of re-put keys have other lengths.
WORKLOAD = [
    ("delete", [0, 1]), ("put", [6, 7]), ("checkpoint", []),
    ("delete", [2, 6]), ("put", [8, 0]), ("checkpoint", []),
    ("delete", [3]), ("put", [9, 1]), ("checkpoint", []),
    ("delete", [7, 8]), ("put", [10, 2]),
]
# The log format (16 KiB ring: four one-block groups). Crash points fall around each group,
# around a put into a slot whose FREE record is one small durable group old (0's slot to 6,
# then 1's and 6's to 9 and 1), around the compaction the fifth group forces (the ring is
# full), and around two compact_metadata() calls (a base into the other area, a superblock
# switch, and back).
LOG_WORKLOAD = [
    ("delete", [0]), ("checkpoint", []),                    # one FREE record
    ("put", [6]),                                           # 6 takes 0's slot
    ("checkpoint", []),                                     # one PUT record
    ("put", [7, 8]), ("delete", [1, 6]), ("checkpoint", []),
    ("put", [9, 1]), ("checkpoint", []),                    # into the slots of 1 and 6
    ("delete", [2, 9]), ("checkpoint", []),                 # the ring is full: compacted first
    ("put", [0, 10]), ("compact", []),                      # base into the other area
    ("delete", [3, 7]), ("put", [2]), ("checkpoint", []),
    ("compact", []),                                        # and back
    ("delete", [4]), ("checkpoint", []), ("put", [11, 3]),
]
# A format v1 device (SETUP written with meta_format='v1') reopened with 'log': the first
# checkpoint moves it (the newest v1 checkpoint made sure to be in container 1, container 0's
# header cleared, the first base, both superblocks); then records and a compaction, whose
# base goes over v1 container 1.
MOVE_WORKLOAD = [
    ("delete", [0]), ("put", [6]), ("checkpoint", []),      # the move
    ("delete", [1]), ("checkpoint", []),
    ("put", [7, 0]), ("checkpoint", []),                    # 7 into a slot a v1 checkpoint listed
    ("compact", []),
    ("delete", [2, 6]), ("checkpoint", []), ("put", [8]),
]
# Deallocation (deallocate_freed="on"; on a file a punched hole): a freed slot is deallocated
# once no durable metadata lists its old key, then goes back to the allocator, and the next
# put (LIFO) takes it. Crash points all around: between the metadata that frees a slot and its
# deallocation, between the deallocation and a put into the slot, between that put's writes and
# the checkpoint that lists it. Format v1: both containers list the setup's keys, so a deleted
# key's slot is deallocated after the second checkpoint that excludes it; a key no container
# lists is freed and deallocated by its delete.
REUSE_WORKLOAD = [
    ("delete", [0, 1]), ("checkpoint", []),                 # one container excludes 0 and 1
    ("put", [6]),
    ("put", [7]), ("delete", [7]),                          # 7 listed nowhere: deallocated by the delete
    ("put", [8]),                                           # into 7's slot, in the same flush epoch
    ("checkpoint", []),                                     # both exclude 0 and 1: deallocated
    ("put", [9, 0]),                                        # into their slots
    ("delete", [6, 2]), ("checkpoint", []),
    ("put", [11]), ("checkpoint", []),                      # 6 and 2 deallocated
    ("put", [1, 10]),                                       # into their slots
    ("delete", [9]), ("checkpoint", []), ("put", [2]),
]
# The log format: a checkpoint's FREE group makes slots reusable (deallocated right after it),
# a compaction's base does (deallocated after the compaction); a key whose PUT record was never
# written is freed by its delete.
REUSE_LOG_WORKLOAD = [
    ("delete", [0, 1]), ("checkpoint", []),                 # FREE group durable: deallocated
    ("put", [6]),                                           # into a deallocated slot
    ("put", [7]), ("delete", [7]),                          # 7 never in a group
    ("put", [8]),
    ("checkpoint", []),
    ("delete", [6, 2]), ("compact", []),                    # the base without them
    ("put", [9, 0]),                                        # into the deallocated slots
    ("checkpoint", []),
    ("delete", [9]), ("checkpoint", []), ("put", [1, 10]),
]

# A full device (8 slots): a put that finds no free slot writes the metadata that makes freed
# slots reusable itself and takes them before any deallocation ran (dealloc_skipped); the slots
# it did not take go back to the allocator undeallocated. Later frees are deallocated again.
FULL_WORKLOAD = [
    ("put", [6, 7]), ("checkpoint", []),                    # every slot holds a key
    ("delete", [0, 1]), ("put", [8]),                       # 8 makes room, takes a freed slot
    ("checkpoint", []),
    ("delete", [2, 8]), ("checkpoint", []), ("put", [9]), ("checkpoint", []),
    ("put", [0, 10]),                                       # into deallocated slots
    ("delete", [3]), ("checkpoint", []), ("put", [2]),
]


# The deletes' lane (log format, a full 8-slot device): the FREE record of a deleted key whose
# PUT record is durable goes ahead of the puts' pending records, in a group synced by itself
# with no flush of their payloads; a put that makes room writes that group alone. A FREE of a
# key whose PUT is still pending waits in line (the reclaim then writes a whole checkpoint).
LANE_WORKLOAD = [
    ("put", [6, 7]), ("checkpoint", []),                    # every slot holds a durable key
    ("delete", [0, 1]), ("put", [8, 11]),                   # their room: the FREE group alone
    ("delete", [2, 8]),                                     # 2 ahead; 8's PUT pending: in line
    ("reclaim", []),                                        # 2's FREE group, then a checkpoint
    ("put", [9, 0]), ("delete", [3]), ("put", [1]),         # 1's room: 3's FREE alone, 9 and 0 pending
    ("checkpoint", []),
    ("delete", [4, 9]), ("reclaim", []), ("put", [2, 10]),  # the FREE group alone frees both
]


# The lane with room to spare and nothing deallocated: a freed slot keeps its key's bytes until a
# put takes it, so a FREE group that went ahead of its key's pending PUT (which replay would then
# apply after it) would bring the deleted key back.
LANE_ROOMY_WORKLOAD = [
    ("put", [6, 7]), ("checkpoint", []),
    ("put", [8]), ("delete", [0, 8]),                       # 0's FREE ahead; 8's PUT pending: in line
    ("reclaim", []),                                        # 0's group, then a checkpoint for 8's slot
    ("checkpoint", []),                                     # no put between: the slots keep their bytes
    ("delete", [1]), ("put", [9]), ("reclaim", []), ("checkpoint", []),
    ("delete", [2, 9]), ("put", [10]),
]


# Extents of 4 slots on a 12-slot device (extent_bytes, deallocation on): an extent's keys
# deleted together are deallocated as one range once no durable metadata lists them, then the
# extent is clean and refilled in slot order; a partly freed extent's slots wait until no clean
# extent is left.
EXTENT_WORKLOAD = [
    ("delete", [0, 1, 2, 3]), ("checkpoint", []),           # extent 0 wholly free
    ("put", [6]), ("checkpoint", []),                       # v1: the second container excludes them
    ("put", [7, 8, 9]), ("checkpoint", []),
    ("delete", [4, 6]), ("put", [0, 1, 2]), ("checkpoint", []),  # into the deallocated extent
    ("delete", [7, 8, 9, 5]), ("checkpoint", []), ("put", [3, 10]), ("checkpoint", []),
    ("delete", [0]), ("put", [4, 11]),
]


@dataclass(frozen=True)
class Workload:
    name: str
    ops: list              # recorded operations: (kind, key ids), kind put|delete|checkpoint|compact
    meta_format: str       # the format the recorded workload (and every recovery) uses
    setup: list = field(default_factory=lambda: list(SETUP))  # unrecorded put steps
    setup_format: str = ""  # the format the setup writes ("" = meta_format); a checkpoint follows each step
    dealloc: bool = False   # deallocate_freed "on" while recording and recovering (files: punched holes)
    nslots: int = NSLOTS    # slots of the device
    extent: bool = False    # extent_bytes common.EXTENT (4 slots) while recording and recovering
    stride: bool = False    # with extent: common.EXTENT_STRIDED (4 slots and a tail; log format only)
    classes: bool = False   # with extent: size_classes common.SIZE_CLASSES (log format only)

    def with_dealloc(self) -> "Workload":
        return Workload(self.name + "+dealloc", self.ops, self.meta_format, self.setup, self.setup_format, True,
                        self.nslots, self.extent, self.stride, self.classes)


WORKLOADS = {
    "v1": Workload("v1", WORKLOAD, "v1"),
    "log": Workload("log", LOG_WORKLOAD, "log"),
    "move": Workload("move", MOVE_WORKLOAD, "log", setup_format="v1"),
    "move-c1": Workload("move-c1", MOVE_WORKLOAD, "log", setup=[("put", [0, 1, 2]), ("put", [3, 4, 5])],
                        setup_format="v1"),
    "reuse": Workload("reuse", REUSE_WORKLOAD, "v1", dealloc=True),
    "reuse-log": Workload("reuse-log", REUSE_LOG_WORKLOAD, "log", dealloc=True),
    "full": Workload("full", FULL_WORKLOAD, "v1", dealloc=True, nslots=8),
    "full-log": Workload("full-log", FULL_WORKLOAD, "log", dealloc=True, nslots=8),
    "lane-log": Workload("lane-log", LANE_WORKLOAD, "log", dealloc=True, nslots=8),
    # room to spare, nothing deallocated: a freed slot keeps its old bytes unless a put takes it
    "lane-log-roomy": Workload("lane-log-roomy", LANE_ROOMY_WORKLOAD, "log"),
    "extent": Workload("extent", EXTENT_WORKLOAD, "v1", dealloc=True, nslots=12, extent=True),
    "extent-log": Workload("extent-log", EXTENT_WORKLOAD, "log", dealloc=True, nslots=12, extent=True),
    "extent-stride": Workload("extent-stride", EXTENT_WORKLOAD, "log", dealloc=True, nslots=12, extent=True,
                              stride=True),
    "extent-classes": Workload("extent-classes", EXTENT_WORKLOAD, "log", dealloc=True, nslots=12, extent=True,
                               classes=True),
}
# The workloads above without deallocation (the core's default on a file) again with it on.
for _name in ("v1", "log", "move", "move-c1"):
    WORKLOADS[_name + "+dealloc"] = WORKLOADS[_name].with_dealloc()
del _name


@dataclass
class Rec:
    seq: int
    kind: int
    off: int        # write offset, or a flush's barrier
    data: bytes
    end: int        # byte offset of the record's end in the log file
    length: int = 0  # a synced record's: the length of the write it makes durable


@dataclass
class Op:
    kind: str
    keys: list
    log_before: int
    log_after: int
    live_after: dict        # key id -> version of every live key when the operation returned
    version: int = 0        # the version a put attempted
    synced: bool = False    # a checkpoint, or a compaction that wrote a base: what was live is durable
    slots: dict = field(default_factory=dict)  # put: key id -> slot offset of each key stored
    freed_all: bool = False  # reclaim: no freed slot waits after it (every delete before it is durable)


@dataclass
class Result:
    recorded: str
    recovered: str
    workload: str = "v1"
    epochs: int = 0
    flushes: int = 0
    writes: int = 0
    deallocs: int = 0       # deallocation records (kind 3) in the recorded log
    states: int = 0
    keys_checked: int = 0
    wrong_states: int = 0
    lost_states: int = 0
    stale_states: int = 0   # a key served in a version the durable state no longer lists
    damage_states: int = 0  # a crash state recovered as damage (recovery_outcome "damaged")
    failures: list[str] = field(default_factory=list)

    def row(self) -> str:
        return (f"{self.workload:7s} recorded {self.recorded:8s} recovered {self.recovered:13s} "
                f"writes={self.writes:3d} deallocs={self.deallocs:2d} flushes={self.flushes:3d} "
                f"epochs={self.epochs:3d} states={self.states:5d} "
                f"keys_checked={self.keys_checked:6d} wrong_byte_states={self.wrong_states} "
                f"lost_durable_states={self.lost_states} stale_states={self.stale_states} "
                f"damage_states={self.damage_states}")


def _length(kid: int, version: int) -> int:
    return 512 + (kid * 2654435761 + version * 40503) % 11000


def parse_log(path: str, dev_path: str) -> list[Rec]:
    st = os.stat(dev_path)
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:8] != b"RBWLOG01":
        raise ValueError(f"{path}: not a write log")
    out, pos = [], 8
    while pos + REC.size <= len(raw):
        kind, _, sdev, sino, off, ln, seq = REC.unpack_from(raw, pos)
        pos += REC.size
        data = raw[pos:pos + ln] if kind == WRITE else b""
        pos += len(data)
        if kind == DEALLOC:
            data = bytes(ln)   # a deallocated range reads back as zeros (punched hole, discard, DSM)
        if (sdev, sino) == (st.st_dev, st.st_ino):
            out.append(Rec(seq, kind, off, data, pos, ln if kind == SYNCED else 0))
    return out


def lands(r: Rec) -> bool:
    """A record that changes the device's bytes once durable: a write, or a deallocation
    (zeros over its range)."""
    return r.kind == WRITE or r.kind == DEALLOC


def describe(w: Rec) -> tuple:
    return (w.seq, w.off, len(w.data)) + (("dealloc",) if w.kind == DEALLOC else ())


@dataclass
class Recording:
    dev: str            # device path (images are recovered here: the checkpoint names its device)
    pre: bytes          # image before the recorded workload
    final: bytes        # image when recording stopped
    recs: list          # write log records of this device
    ops: list           # workload operations with their log positions
    versions: dict      # key id -> {version: length} of every put attempted
    durable0: dict      # key id -> version of the keys durable before the workload
    workload: Workload = WORKLOADS["v1"]
    status: dict = field(default_factory=dict)  # the core's status() when recording stopped
    setup_slots: dict = field(default_factory=dict)  # slot offset -> key id the setup stored there


def random_workload(rng: random.Random, rounds: int = 5, nkeys: int = 16, compact: bool = False) -> list:
    """Rounds of: delete 1-3 keys, put 1-3 keys (new or deleted ones again), and mostly a
    checkpoint (with compact, now and then a compact_metadata() instead); keys are drawn from
    the setup keys and nkeys more."""
    live = {k for _, kids in SETUP for k in kids}
    ops = []
    for _ in range(rounds):
        dels = rng.sample(sorted(live), min(len(live), rng.randint(1, 3)))
        live.difference_update(dels)
        free = [k for k in range(nkeys) if k not in live]
        puts = rng.sample(free, min(len(free), rng.randint(1, 3)))
        live.update(puts)
        ops += [("delete", dels), ("put", puts)]
        r = rng.random()
        if compact and r < 0.25:
            ops.append(("compact", []))
        elif r < 0.7:
            ops.append(("checkpoint", []))
    return ops


def record_workload(engine: str, workdir: str, workload: list | Workload | None = None) -> Recording:
    """Run the workload's setup (unrecorded) then its operations (recorded) on a fresh device.
    workload: a Workload, or a list of operations in format v1 (default: WORKLOADS["v1"])."""
    if workload is None:
        workload = WORKLOADS["v1"]
    elif not isinstance(workload, Workload):
        workload = Workload("random", workload, "v1")
    wl = workload
    cfg = Config(engine, False, False, True, wl.meta_format, wl.dealloc, wl.extent, wl.stride, wl.classes)
    dev = make_device(os.path.join(workdir, f"record-{engine}-{wl.name}.img"), wl.nslots, wl.stride)
    versions: dict[int, dict[int, int]] = {}
    core = open_core(dev, cfg, load=False, meta_format=wl.setup_format or wl.meta_format)
    live: dict[int, int] = {}
    for _, kids in wl.setup:
        for k in kids:
            versions.setdefault(k, {})[1] = _length(k, 1)
        assert all(core.put_many([key(k) for k in kids], [Obj(payload(k, 1, _length(k, 1))) for k in kids]).results)
        live.update((k, 1) for k in kids)
        core.checkpoint_now()
    setup_slots = {core.entry_offset(key(k).encoded): k for k in live}
    core.close()
    durable0 = dict(live)
    with open(dev, "rb") as f:
        pre = f.read()
    logp = dev + ".wlog"
    core = open_core(dev, cfg)
    _native._set_write_log(logp)
    try:
        ops = run_ops(core, wl.ops, logp, versions, live, 1)
    finally:
        _native._set_write_log(None)
        with open(dev, "rb") as f:
            final = f.read()   # before close: the image the recorded writes must rebuild
        status = core._native.status()
        core.close()
    return Recording(dev, pre, final, parse_log(logp, dev), ops, versions, durable0, wl, status, setup_slots)


def run_ops(core, wl_ops: list, logp: str, versions: dict, live: dict, ver: int) -> list[Op]:
    """Run operations on core, each noted with the write log's size before and after it; a
    put's version is ver + its number among the puts. versions and live are updated."""
    ops: list[Op] = []
    for kind, kids in wl_ops:
        before = os.path.getsize(logp)
        op = Op(kind, kids, before, 0, {})
        if kind == "put":
            ver += 1
            op.version = ver
            for k in kids:
                versions.setdefault(k, {})[ver] = _length(k, ver)
            res = core.put_many([key(k) for k in kids], [Obj(payload(k, ver, _length(k, ver))) for k in kids])
            for k, x in zip(kids, res.results):
                if x and k not in live:
                    live[k] = ver
                    op.slots[k] = core.entry_offset(key(k).encoded)
        elif kind == "delete":
            res = core.delete_many([key(k).encoded for k in kids])
            for k, x in zip(kids, res):
                if x:
                    live.pop(k, None)
        elif kind == "reclaim":  # deletes durable (freed_all), puts only when it writes a checkpoint: not synced
            core.reclaim_held_slots()
            op.freed_all = core.slot_counts().held == 0
        elif kind == "compact":
            op.synced = bool(core._native.compact_metadata())
        else:
            core.checkpoint_now()
            op.synced = True
        op.log_after = os.path.getsize(logp)
        op.live_after = dict(live)
        ops.append(op)
    return ops


def expectations(rec: Recording, start_off: float, end_off: float) -> tuple[set, dict]:
    """(durable keys, key id -> versions a crash may serve) for a crash whose image holds
    every write logged before start_off and may hold any logged before end_off.

    Durable: live when the last checkpoint acknowledged by start_off returned (or the setup's,
    when none was), and not deleted since (a delete attempted before end_off may have landed).
    Allowed: a key's version at that checkpoint, and any version a put attempted since (before
    end_off) wrote, except the versions a delete removed before a reclaim that returned by
    start_off with no freed slot left waiting (its FREE records are durable)."""
    state = dict(rec.durable0)
    last = -1
    for i, op in enumerate(rec.ops):
        if op.synced and op.log_after <= start_off:
            state, last = dict(op.live_after), i
    durable = set(state)
    allowed = {k: {v} for k, v in state.items()}
    deleted: dict = {}  # key id -> the versions its deletes since `last` removed
    for op in rec.ops[last + 1:]:
        if op.log_before >= end_off:
            break
        if op.kind == "delete":
            durable.difference_update(op.keys)
            for k in op.keys:
                deleted.setdefault(k, set()).update(allowed.get(k, ()))
        elif op.kind == "put":
            for k in op.keys:
                allowed.setdefault(k, set()).add(op.version)
        elif op.kind == "reclaim" and op.freed_all and op.log_after <= start_off:
            for k, vs in deleted.items():
                allowed[k] = allowed.get(k, set()) - vs
            deleted = {}
    return durable, allowed


def replay_all(rec: "Recording") -> bytes:
    img = bytearray(rec.pre)
    for r in rec.recs:
        if lands(r):
            apply(img, r)
    return bytes(img)


def epochs_of(recs: list[Rec], synced_as_flush: bool = True) -> list[tuple[int, int, int, int]]:
    """[(barrier, first record index, end record index, log offset where the epoch starts)]:
    epoch e holds the writes with seq >= barrier up to the next flush record. With
    synced_as_flush a synced write's record counts as a flush of everything logged before it
    (more durable than a FUA write makes it: the multi-device and second-crash models); without,
    it stays in its epoch (crash_points)."""
    bounds = [(0, 0, 8)]
    for i, r in enumerate(recs):
        if r.kind == FLUSH or (synced_as_flush and r.kind == SYNCED):
            bounds.append((r.off if r.kind == FLUSH else r.seq, i + 1, r.end))
    out = []
    for j, (barrier, first, start_off) in enumerate(bounds):
        nxt = bounds[j + 1][1] - 1 if j + 1 < len(bounds) else len(recs)
        out.append((barrier, first, nxt, start_off))
    return out


def synced_writes(recs: list[Rec]) -> dict[int, Rec]:
    """Synced record seq -> the write it makes durable: the last write logged before it at its
    offset and of its length."""
    out, last = {}, {}
    for r in recs:
        if r.kind == WRITE:
            last[(r.off, len(r.data))] = r
        elif r.kind == SYNCED:
            out[r.seq] = last[(r.off, r.length)]
    return out


def crash_points(recs: list[Rec], epoch: tuple[int, int, int, int], end_off: float,
                 synced: dict[int, Rec]) -> list[tuple[list[Rec], list[Rec], float, float]]:
    """The crash points of one epoch (epochs_of without synced_as_flush): before its first
    synced write's record, between two, after the last. Each as (writes durable there beyond
    the epoch's barrier, in seq order; writes that may have landed, in seq order; log offset
    every checkpoint acknowledged before it returned by; log offset no operation attempted
    before it began at or after). A synced write is durable from its record on, and only it:
    the writes logged before it stay optional."""
    barrier, first, nxt, start_off = epoch
    earlier = {synced[r.seq].seq for r in recs[:first] if r.kind == SYNCED and synced[r.seq].seq >= barrier}
    pend = sorted([r for r in recs[first:nxt] if lands(r)] +
                  [r for r in recs[:first] if lands(r) and r.seq >= barrier and r.seq not in earlier],
                  key=lambda r: r.seq)
    base = sorted([r for r in recs[:first] if r.kind == WRITE and r.seq in earlier], key=lambda r: r.seq)
    syncs = [r for r in recs[first:nxt] if r.kind == SYNCED]
    out = []
    for j in range(len(syncs) + 1):
        must = {synced[s.seq].seq for s in syncs[:j]}
        cut = syncs[j].seq if j < len(syncs) else float("inf")
        out.append((base + [w for w in pend if w.seq in must], [w for w in pend if w.seq < cut and w.seq not in must],
                    start_off if j == 0 else syncs[j - 1].end, syncs[j].end if j < len(syncs) else end_off))
    return out


def states_of(n: int, rng: random.Random) -> list[tuple[int, ...]]:
    """Index subsets of an epoch's n writes: all of them when n <= MAX_EXHAUSTIVE, else every
    prefix plus RANDOM_SUBSETS random subsets."""
    if n <= MAX_EXHAUSTIVE:
        return [c for m in range(n + 1) for c in combinations(range(n), m)]
    seen = {tuple(range(m)) for m in range(n + 1)}
    out = sorted(seen, key=len)
    while len(out) < n + 1 + RANDOM_SUBSETS:
        c = tuple(i for i in range(n) if rng.random() < 0.5)
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def apply(img: bytearray, w: Rec) -> None:
    img[w.off:w.off + len(w.data)] = w.data


def torn(w: Rec, block: int) -> list[Rec]:
    """A write split into its aligned blocks, each of which may persist on its own."""
    out, pos = [], 0
    while pos < len(w.data):
        n = min(block - (w.off + pos) % block, len(w.data) - pos)
        out.append(Rec(w.seq, w.kind, w.off + pos, w.data[pos:pos + n], w.end))
        pos += n
    return out


def judge(got: dict, durable: set, allowed: dict) -> tuple[list, list, list]:
    """(wrong bytes, durable keys missing, stale versions served) of one recovered image."""
    wrong_keys = {k for k, _ in got["wrong"]}
    lost = sorted(k for k in durable if k not in got["served"] and k not in wrong_keys)
    stale = sorted((k, v) for k, v in got["served"].items() if v not in allowed.get(k, ()))
    return got["wrong"], lost, stale


def recover_image(img: bytes, img_path: str, rcfg: Config, versions: dict, allkeys: list) -> dict:
    with open(img_path, "wb") as f:
        f.write(img)
    core = open_core(img_path, rcfg)
    try:
        got = verify_served(core, versions, allkeys)
        st = core.report_status()
        got["outcome"], got["error"] = st["recovery_outcome"], st["checkpoint_last_error"]
        return got
    finally:
        core.close()


def _judge_state(res: Result, got: dict, durable: set, allowed: dict, what: str) -> None:
    """Count one recovered crash state's faults into res (what: the state, for the failures)."""
    wrong, lost, stale = judge(got, durable, allowed)
    if wrong:
        res.wrong_states += 1
        res.failures.append(f"{what}: wrong bytes {wrong}")
    if lost:
        res.lost_states += 1
        res.failures.append(f"{what}: durable keys missing {lost} (served {got['served']})")
    if stale:
        res.stale_states += 1
        res.failures.append(f"{what}: (key, version) served but no longer durable nor put since {stale}")
    if got["outcome"] == "damaged":  # a crash tears the log's tail only, never its middle
        res.damage_states += 1
        res.failures.append(f"{what}: a crash state recovered as damage: {got['error']}")


def check_recorded(engine: str, recovered_with: list[str], workdir: str, rng_seed: int = 1,
                   verbose: bool = False, tear: int = 0, workload: list | Workload | None = None,
                   rec: Recording | None = None, tear_meta: int = 0, recover_dealloc: bool = False) -> list[Result]:
    """Record the workload with engine (or take rec), then recover every crash state with each
    engine of recovered_with. tear > 0 also lets each write persist partly, in tear-byte
    blocks; tear_meta > 0 does so for writes into the metadata region (checkpoint containers,
    superblocks, bases, log groups) in tear_meta-byte blocks instead.

    The recovering cores run with deallocation off unless recover_dealloc (and the workload has
    it on): a core deallocates nothing before its first checkpoint, delete or close, and what it
    serves is judged before that, so the outcome is the same; with it on, the close that ends
    each check punches the holes of every free slot and costs about three times as long. (The
    kill loop's checkers and the second-crash follow-up runs deallocate.)"""
    logging.getLogger(raw_block_core_logger()).setLevel(logging.CRITICAL)
    if rec is None:
        rec = record_workload(engine, workdir, workload)
    dev, pre, recs, versions = rec.dev, rec.pre, rec.recs, rec.versions
    allkeys = sorted(versions)
    ep = epochs_of(recs, synced_as_flush=False)
    synced = synced_writes(recs)
    results = []
    img_path = dev  # images are recovered at the recorded path (the checkpoint names its device)
    for rengine, at_open in [(r, v) for r in recovered_with for v in (True, False)]:
        rcfg = Config(rengine, False, False, at_open, rec.workload.meta_format,
                      rec.workload.dealloc and recover_dealloc, rec.workload.extent, rec.workload.stride,
                      rec.workload.classes)
        res = Result(engine, f"{rengine}{'' if at_open else '/load'}", rec.workload.name, epochs=len(ep),
                     flushes=len(ep) - 1, writes=sum(r.kind == WRITE for r in recs),
                     deallocs=sum(r.kind == DEALLOC for r in recs))
        rng = random.Random(f"{rng_seed}/{engine}/{rengine}/{rec.workload.name}")
        for e, epoch in enumerate(ep):
            barrier, _first, nxt, _start = epoch
            base = bytearray(pre)
            for r in recs:
                if lands(r) and r.seq < barrier:
                    apply(base, r)
            end_off = recs[nxt].end if nxt < len(recs) else float("inf")
            for must, pend, start_off, cut_off in crash_points(recs, epoch, end_off, synced):
                img0 = bytearray(base)
                for w in must:
                    apply(img0, w)
                if tear or tear_meta:
                    pend = [p for w in pend
                            for p in ((torn(w, tear_meta) if tear_meta else [w]) if w.off < META else
                                      (torn(w, tear) if tear else [w]))]
                durable, allowed = expectations(rec, start_off, cut_off)
                for subset in states_of(len(pend), rng):
                    img = bytearray(img0)
                    for i in subset:
                        apply(img, pend[i])
                    got = recover_image(img, img_path, rcfg, versions, allkeys)
                    res.states += 1
                    res.keys_checked += len(got["served"]) + len(got["wrong"])
                    what = (f"epoch {e} durable {[describe(w)[:2] for w in must]} writes "
                            f"{[describe(pend[i])[:2] for i in subset]} of {[describe(w) for w in pend]}")
                    _judge_state(res, got, durable, allowed, what)
        if verbose:
            print(res.row(), flush=True)
        results.append(res)
    return results


# After a first crash and recovery: the next writer's operations, crashed into again. Puts of
# keys new and old, deletes, checkpoints; the first group lands where recovery found the log's
# end, over whatever the first crash left there (a torn group, a group of the dead writer).
FOLLOW_UP = [
    ("put", [20, 21]), ("checkpoint", []),
    ("delete", [20]), ("put", [22]), ("checkpoint", []),
    ("put", [23]), ("compact", []), ("delete", [21, 22]), ("checkpoint", []), ("put", [24]),
]
FOLLOW_UP_VERSION = 1000


class WrongAtFirstRecovery(Exception):
    """The core that recovered a first crash served wrong bytes before the follow-up began."""


def first_crash_images(rec: Recording, tear_meta: int, per_epoch: int, rng: random.Random) -> list[tuple[str, bytes]]:
    """A few images a first crash may leave, per epoch: the epoch's writes (metadata writes
    torn in tear_meta blocks) cut after a random point, or a random subset of them."""
    out = []
    for e, (barrier, first, nxt, _start) in enumerate(epochs_of(rec.recs)):
        base = bytearray(rec.pre)
        for r in rec.recs:
            if lands(r) and r.seq < barrier:
                apply(base, r)
        pend = sorted([r for r in rec.recs[first:nxt] if lands(r)] +
                      [r for r in rec.recs[:first] if lands(r) and r.seq >= barrier], key=lambda r: r.seq)
        if tear_meta:
            pend = [p for w in pend for p in (torn(w, tear_meta) if w.off < META else [w])]
        if not pend:
            continue
        picks = {tuple(range(len(pend) - 1))}   # all but the last piece
        while len(picks) < min(per_epoch, 2 ** len(pend) - 1):
            if rng.random() < 0.5:
                picks.add(tuple(range(rng.randrange(len(pend)))))
            else:
                picks.add(tuple(i for i in range(len(pend)) if rng.random() < 0.5))
        for subset in sorted(picks):
            img = bytearray(base)
            for i in subset:
                apply(img, pend[i])
            out.append((f"first crash in epoch {e}, writes {[describe(pend[i])[:2] for i in subset]} of "
                        f"{[describe(w) for w in pend]}", bytes(img)))
    return out


def record_follow_up(rec: Recording, image: bytes, engine: str, ops: list | None = None) -> Recording:
    """The image of a first crash recovered by a core that then runs ops (FOLLOW_UP), every
    write from its open on recorded. The keys it serves before ops are the durable start."""
    wl = Workload(rec.workload.name + "+2", FOLLOW_UP if ops is None else ops, rec.workload.meta_format,
                  dealloc=rec.workload.dealloc, extent=rec.workload.extent, stride=rec.workload.stride,
                  classes=rec.workload.classes)
    cfg = Config(engine, False, False, True, wl.meta_format, wl.dealloc, wl.extent, wl.stride, wl.classes)
    with open(rec.dev, "wb") as f:
        f.write(image)
    versions = {k: dict(v) for k, v in rec.versions.items()}
    logp = rec.dev + ".wlog2"
    if os.path.exists(logp):
        os.unlink(logp)
    _native._set_write_log(logp)
    try:
        core = open_core(rec.dev, cfg)
        try:
            got = verify_served(core, versions, sorted(set(versions) | {k for _, ks in wl.ops for k in ks}))
            if got["wrong"]:
                raise WrongAtFirstRecovery(got["wrong"])
            live = dict(got["served"])
            ops_done = run_ops(core, wl.ops, logp, versions, live, FOLLOW_UP_VERSION)
            with open(rec.dev, "rb") as f:
                final = f.read()
            status = core._native.status()
        finally:
            _native._set_write_log(None)
            core.close()
    finally:
        _native._set_write_log(None)
    return Recording(rec.dev, image, final, parse_log(logp, rec.dev), ops_done, versions, dict(got["served"]), wl,
                     status)


def check_second_crash(engine: str, workdir: str, workload: Workload, rng_seed: int = 1, tear_meta: int = 1024,
                       per_epoch: int = 2, second_tear_meta: int = 0, limit: int = 0) -> Result:
    """Record workload, take first_crash_images() of it, recover each and run FOLLOW_UP on it
    (recorded), then check every crash state of that second run (whole writes, or metadata
    writes torn in second_tear_meta blocks) with the same engine, slot headers validated at
    open and not. One Result for all of them; its failures name both crashes."""
    logging.getLogger(raw_block_core_logger()).setLevel(logging.CRITICAL)
    rng = random.Random(f"{rng_seed}/second/{engine}/{workload.name}")
    rec = record_workload(engine, workdir, workload)
    firsts = first_crash_images(rec, tear_meta, per_epoch, rng)
    if limit:
        firsts = rng.sample(firsts, min(limit, len(firsts)))
    total = Result(engine, f"{engine}, twice", workload.name + "+2")
    for what, image in firsts:
        try:
            rec2 = record_follow_up(rec, image, engine)
        except WrongAtFirstRecovery as e:
            total.wrong_states += 1
            total.failures.append(f"{what}: recovered, wrong bytes {e.args[0]}")
            continue
        for r in check_recorded(engine, [engine], workdir, rng_seed, rec=rec2, tear_meta=second_tear_meta):
            total.epochs += r.epochs
            total.flushes += r.flushes
            total.writes += r.writes
            total.deallocs += r.deallocs
            total.states += r.states
            total.keys_checked += r.keys_checked
            total.wrong_states += r.wrong_states
            total.lost_states += r.lost_states
            total.stale_states += r.stale_states
            total.damage_states += r.damage_states
            total.failures += [f"{what}; recovered, follow-up run, second crash: {f}" for f in r.failures]
    total.recovered = f"{engine} x{len(firsts)} first crashes"
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS),
                    help="recorded workload (repeatable); default all")
    ap.add_argument("--engine", action="append", choices=["posix", "io_uring"],
                    help="engine that records the workload (repeatable); default both")
    ap.add_argument("--rng-seed", type=int, default=1)
    ap.add_argument("--show", type=int, default=5)
    ap.add_argument("--random-workloads", type=int, default=0, metavar="N",
                    help="instead of each fixed workload, N random ones (rounds of delete/put/checkpoint, "
                         "and compactions in the log format) in its format and setup")
    ap.add_argument("--tear", type=int, default=0, metavar="BYTES",
                    help="also let writes persist partly, in blocks of BYTES (e.g. 4096)")
    ap.add_argument("--second-crash", type=int, default=0, metavar="N",
                    help="also crash twice: N first-crash images per epoch (metadata writes torn in 1 KiB), each "
                         "recovered and followed by FOLLOW_UP, whose every crash state is checked (log format)")
    ap.add_argument("--recover-dealloc", action="store_true",
                    help="recover the images of workloads with deallocation with it on as well (slower, same outcome)")
    ap.add_argument("--tear-meta", type=int, default=None, metavar="BYTES",
                    help="blocks of writes into the metadata region (default: --tear's), e.g. 1024 to tear a "
                         "one-block log group or superblock write")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    bad = False
    states = 0
    with tempfile.TemporaryDirectory(prefix="rb-crashstates-") as d:
        for name in a.workload or list(WORKLOADS):
            fixed = WORKLOADS[name]
            for eng in a.engine or ["posix", "io_uring"]:
                if a.random_workloads:
                    wrng = random.Random(f"{a.rng_seed}/workloads/{eng}/{name}")
                    workloads = [Workload(f"{name}-r{i}", random_workload(wrng, compact=fixed.meta_format == "log"),
                                          fixed.meta_format, fixed.setup, fixed.setup_format, fixed.dealloc,
                                          fixed.nslots, fixed.extent, fixed.stride, fixed.classes)
                                 for i in range(a.random_workloads)]
                else:
                    workloads = [fixed]
                for wl in workloads:
                    for r in check_recorded(eng, ["posix", "io_uring"], d, a.rng_seed, tear=a.tear, workload=wl,
                                            tear_meta=a.tear if a.tear_meta is None else a.tear_meta,
                                            recover_dealloc=a.recover_dealloc):
                        print(r.row(), flush=True)
                        for f in r.failures[:a.show]:
                            print("    " + f, flush=True)
                        bad |= bool(r.failures)
                        states += r.states
                    if a.second_crash and wl.meta_format == "log":
                        r = check_second_crash(eng, d, wl, a.rng_seed, per_epoch=a.second_crash,
                                               second_tear_meta=a.tear_meta or 0)
                        print(r.row(), flush=True)
                        for f in r.failures[:a.show]:
                            print("    " + f, flush=True)
                        bad |= bool(r.failures)
                        states += r.states
    print(f"{states} states; elapsed {time.monotonic() - t0:.1f} s; {'FAIL' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
