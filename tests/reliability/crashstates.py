"""Crash-state enumeration (in the spirit of CrashMonkey / ALICE): record every device write
and flush of a fixed workload (_native._set_write_log, csrc/core/rb_wlog.h), then build the
device images a power loss could leave and recover each one with a fresh RawBlockCore.

Model: a write is durable once a flush that began after it completed (the flush record's
barrier). A crash in flush epoch e (after flush e, before flush e+1) leaves every write
before flush e's barrier plus any subset of the writes issued since, each write whole and
applied in issue order. Per epoch the states are every prefix of its writes and every
subset when it has at most MAX_EXHAUSTIVE writes, else RANDOM_SUBSETS seeded random subsets.
With --tear BYTES each write is split into BYTES-sized blocks that persist independently
(torn writes).

Each image is recovered and checked like the kill loop does: every served key returns the
bytes of a put attempted for it; every key durable in that epoch is served. Each engine
recovers every image twice: with slot headers validated at open (meta_verify_on_load) and with
that off, where the header check of every load is the only line between a torn slot and its
bytes being served. A key is durable
in epoch e when a checkpoint_now() that included it returned before the epoch began and no
delete of it was attempted before the epoch ended.

Run: python3 tests/reliability/crashstates.py [--engine posix|io_uring] [-v]
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
    from reliability.common import Config, Obj, key, make_device, open_core, payload, verify_served
else:
    from .common import Config, Obj, key, make_device, open_core, payload, verify_served

from lmcache_rawblock import _native

NSLOTS = 24
MAX_EXHAUSTIVE = 10
RANDOM_SUBSETS = 48
REC = struct.Struct("<IIQQQQQ")  # kind, 0, st_dev, st_ino, offset|barrier, length, sequence
WRITE, FLUSH = 1, 2

# Setup (not recorded, ends with a checkpoint and a clean close): keys 0-5, version 1.
SETUP = [("put", [0, 1, 2, 3, 4, 5])]
# Recorded: deletes free slots that the next put can take (LIFO) while the freed key is still
# in the last checkpoint; versions 2+ of re-put keys have other lengths.
WORKLOAD = [
    ("delete", [0, 1]), ("put", [6, 7]), ("checkpoint", []),
    ("delete", [2, 6]), ("put", [8, 0]), ("checkpoint", []),
    ("delete", [3]), ("put", [9, 1]), ("checkpoint", []),
    ("delete", [7, 8]), ("put", [10, 2]),
]


@dataclass
class Rec:
    seq: int
    kind: int
    off: int        # write offset, or a flush's barrier
    data: bytes
    end: int        # byte offset of the record's end in the log file


@dataclass
class Op:
    kind: str
    keys: list
    log_before: int
    log_after: int
    live_after: set


@dataclass
class Result:
    recorded: str
    recovered: str
    epochs: int = 0
    flushes: int = 0
    writes: int = 0
    states: int = 0
    keys_checked: int = 0
    wrong_states: int = 0
    lost_states: int = 0
    failures: list[str] = field(default_factory=list)

    def row(self) -> str:
        return (f"recorded {self.recorded:8s} recovered {self.recovered:13s} writes={self.writes:3d} "
                f"flushes={self.flushes:3d} epochs={self.epochs:3d} states={self.states:5d} "
                f"keys_checked={self.keys_checked:6d} wrong_byte_states={self.wrong_states} "
                f"lost_durable_states={self.lost_states}")


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
        if (sdev, sino) == (st.st_dev, st.st_ino):
            out.append(Rec(seq, kind, off, data, pos))
    return out


@dataclass
class Recording:
    dev: str            # device path (images are recovered here: the checkpoint names its device)
    pre: bytes          # image before the recorded workload
    final: bytes        # image when recording stopped
    recs: list          # write log records of this device
    ops: list           # workload operations with their log positions
    versions: dict      # key id -> {version: length} of every put attempted
    durable0: set       # keys durable before the workload


def random_workload(rng: random.Random, rounds: int = 5, nkeys: int = 16) -> list:
    """Rounds of: delete 1-3 keys, put 1-3 keys (new or deleted ones again), and mostly a
    checkpoint; keys are drawn from the setup keys and nkeys more."""
    live = {k for _, kids in SETUP for k in kids}
    ops = []
    for _ in range(rounds):
        dels = rng.sample(sorted(live), min(len(live), rng.randint(1, 3)))
        live.difference_update(dels)
        free = [k for k in range(nkeys) if k not in live]
        puts = rng.sample(free, min(len(free), rng.randint(1, 3)))
        live.update(puts)
        ops += [("delete", dels), ("put", puts)]
        if rng.random() < 0.7:
            ops.append(("checkpoint", []))
    return ops


def record_workload(engine: str, workdir: str, workload: list | None = None) -> Recording:
    """Run SETUP (unrecorded) then workload (default WORKLOAD; recorded) on a fresh device."""
    cfg = Config(engine, False, False, True)
    dev = make_device(os.path.join(workdir, f"record-{engine}.img"), NSLOTS)
    versions: dict[int, dict[int, int]] = {}
    core = open_core(dev, cfg, load=False)
    for _, kids in SETUP:
        for k in kids:
            versions.setdefault(k, {})[1] = _length(k, 1)
        assert all(core.put_many([key(k) for k in kids], [Obj(payload(k, 1, _length(k, 1))) for k in kids]).results)
    core.checkpoint_now()
    core.close()
    live = {k for _, kids in SETUP for k in kids}
    durable0 = set(live)
    with open(dev, "rb") as f:
        pre = f.read()
    logp = dev + ".wlog"
    ops: list[Op] = []
    ver = 1
    core = open_core(dev, cfg)
    _native._set_write_log(logp)
    try:
        for kind, kids in (WORKLOAD if workload is None else workload):
            before = os.path.getsize(logp)
            if kind == "put":
                ver += 1
                for k in kids:
                    versions.setdefault(k, {})[ver] = _length(k, ver)
                res = core.put_many([key(k) for k in kids], [Obj(payload(k, ver, _length(k, ver))) for k in kids])
                live.update(k for k, x in zip(kids, res.results) if x)
            elif kind == "delete":
                res = core.delete_many([key(k).encoded for k in kids])
                live.difference_update(k for k, x in zip(kids, res) if x)
            else:
                core.checkpoint_now()
            ops.append(Op(kind, kids, before, os.path.getsize(logp), set(live)))
    finally:
        _native._set_write_log(None)
        with open(dev, "rb") as f:
            final = f.read()   # before close: the image the recorded writes must rebuild
        core.close()
    return Recording(dev, pre, final, parse_log(logp, dev), ops, versions, durable0)


def replay_all(rec: "Recording") -> bytes:
    img = bytearray(rec.pre)
    for r in rec.recs:
        if r.kind == WRITE:
            apply(img, r)
    return bytes(img)


def epochs_of(recs: list[Rec]) -> list[tuple[int, int, int, int]]:
    """[(barrier, first record index, end record index, log offset where the epoch starts)]:
    epoch e holds the writes with seq >= barrier up to the next flush record."""
    bounds = [(0, 0, 8)]
    for i, r in enumerate(recs):
        if r.kind == FLUSH:
            bounds.append((r.off, i + 1, r.end))
    out = []
    for j, (barrier, first, start_off) in enumerate(bounds):
        nxt = bounds[j + 1][1] - 1 if j + 1 < len(bounds) else len(recs)
        out.append((barrier, first, nxt, start_off))
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
        out.append(Rec(w.seq, WRITE, w.off + pos, w.data[pos:pos + n], w.end))
        pos += n
    return out


def check_recorded(engine: str, recovered_with: list[str], workdir: str, rng_seed: int = 1,
                   verbose: bool = False, tear: int = 0, workload: list | None = None) -> list[Result]:
    """Record the workload with engine, then recover every crash state with each engine of
    recovered_with. tear > 0 also lets each write persist partly, in tear-byte blocks."""
    logging.getLogger("lmcache.v1.storage_backend.raw_block.core").setLevel(logging.CRITICAL)
    rec = record_workload(engine, workdir, workload)
    dev, pre, recs, ops, versions, durable0 = rec.dev, rec.pre, rec.recs, rec.ops, rec.versions, rec.durable0
    allkeys = sorted(versions)
    ep = epochs_of(recs)
    results = []
    img_path = dev  # images are recovered at the recorded path (the checkpoint names its device)
    for rengine, at_open in [(r, v) for r in recovered_with for v in (True, False)]:
        rcfg = Config(rengine, False, False, at_open)
        res = Result(engine, f"{rengine}{'' if at_open else '/load'}", epochs=len(ep), flushes=len(ep) - 1,
                     writes=sum(r.kind == WRITE for r in recs))
        rng = random.Random(f"{rng_seed}/{engine}/{rengine}")
        for e, (barrier, first, nxt, start_off) in enumerate(ep):
            base = bytearray(pre)
            for r in recs:
                if r.kind == WRITE and r.seq < barrier:
                    apply(base, r)
            pend = [r for r in recs[first:nxt] if r.kind == WRITE] + \
                   [r for r in recs[:first] if r.kind == WRITE and r.seq >= barrier]
            pend.sort(key=lambda r: r.seq)
            if tear:
                pend = [p for w in pend for p in torn(w, tear)]
            end_off = recs[nxt].end if nxt < len(recs) else float("inf")
            # durable: the last checkpoint acknowledged by the start of the epoch, minus deletes
            # attempted before its end
            durable = set(durable0)
            for op in ops:
                if op.kind == "checkpoint" and op.log_after <= start_off:
                    durable = set(op.live_after)
            for op in ops:
                if op.kind == "delete" and op.log_before < end_off:
                    durable.difference_update(op.keys)
            for subset in states_of(len(pend), rng):
                img = bytearray(base)
                for i in subset:
                    apply(img, pend[i])
                with open(img_path, "wb") as f:
                    f.write(img)
                core = open_core(img_path, rcfg)
                try:
                    got = verify_served(core, versions, allkeys)
                finally:
                    core.close()
                res.states += 1
                res.keys_checked += len(got["served"]) + len(got["wrong"])
                wrong_keys = {k for k, _ in got["wrong"]}
                lost = sorted(k for k in durable if k not in got["served"] and k not in wrong_keys)
                what = f"epoch {e} writes {[pend[i].seq for i in subset]} of {[w.seq for w in pend]}"
                if got["wrong"]:
                    res.wrong_states += 1
                    res.failures.append(f"{what}: wrong bytes {got['wrong']}")
                if lost:
                    res.lost_states += 1
                    res.failures.append(f"{what}: durable keys missing {lost}")
        if verbose:
            print(res.row(), flush=True)
        results.append(res)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", action="append", choices=["posix", "io_uring"],
                    help="engine that records the workload (repeatable); default both")
    ap.add_argument("--rng-seed", type=int, default=1)
    ap.add_argument("--show", type=int, default=5)
    ap.add_argument("--random-workloads", type=int, default=0, metavar="N",
                    help="instead of the fixed workload, N random ones (rounds of delete/put/checkpoint)")
    ap.add_argument("--tear", type=int, default=0, metavar="BYTES",
                    help="also let writes persist partly, in blocks of BYTES (e.g. 4096)")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    bad = False
    with tempfile.TemporaryDirectory(prefix="rb-crashstates-") as d:
        for eng in a.engine or ["posix", "io_uring"]:
            wrng = random.Random(f"{a.rng_seed}/workloads/{eng}")
            workloads = [random_workload(wrng) for _ in range(a.random_workloads)] or [None]
            for wl in workloads:
                for r in check_recorded(eng, ["posix", "io_uring"], d, a.rng_seed, tear=a.tear, workload=wl):
                    print(r.row(), flush=True)
                    for f in r.failures[:a.show]:
                        print("    " + f, flush=True)
                    bad |= bool(r.failures)
    print(f"elapsed {time.monotonic() - t0:.1f} s; {'FAIL' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
