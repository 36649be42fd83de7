"""Crash states of a cache over several devices (MultiDeviceCore): record every write and flush
of a workload run over NDEV device files (one write log, each record naming its device), then
build the images a crash could leave and recover them, each device's metadata alone and the
cache over all of them.

Two kinds of crash state:

- "one": one device stops at a crash point (its epochs and write subsets, as crashstates.py
  enumerates them for a single device) while the others complete the workload: a drive that
  lost power, or was pulled, while the rest of the node went on.
- "all": every device stops at once. A crash point is a window between two flushes of any
  device; each device keeps what its own last flush before the window made durable, plus its
  writes issued in the window, cut at one moment across all devices (every prefix in issue
  order) or landed independently per device (seeded random subsets).
- "mixed" (the fuzzing of several devices): each device stops at a crash point of its own,
  drawn at random (or completes), over seeded random workloads: a drive that failed first and
  a node that crashed later, in any order and combination.

Each device is judged against its own cut: the keys its metadata must list are the ones it held
at the last checkpoint_now() that returned before its cut (the facade checkpoints every
device) and that no delete attempted before the cut's end touched; a key may be served in that
version or any version a put attempted before the cut's end. Then:

- each device opened alone (a RawBlockCore with nothing but its own metadata): no wrong bytes,
  no durable key of its own missing, no version outside what its cut allows, no crash state
  recovered as damage;
- the cache over all devices (start-up): no wrong bytes, every key some device must hold is
  served, and a key two devices hold after the crash (deleted from one, stored again on
  another, and only one of the two devices' writes durable) is served in the version of the
  first device in the list that holds it, the other copy dropped, which the close makes
  durable (the cache opened again serves the same, each device alone holds no key another
  holds);
- the cut device returning while the others stay online ("one" states): the cache opened
  with the cut device missing, then reopen_device() once it is back: the copy on a device that
  stayed online wins, the returning device's copy is dropped.

Workloads: "moves" (fixed: keys deleted from one device and stored again on another, with and
without a checkpoint in between, so crash points leave a key on two devices) and seeded random
ones; each in format v1 and in the log format (with compactions).

Run: python3 tests/reliability/crashstates_multi.py [--devices N] [--format v1|log]
     [--engine posix|io_uring] [--random-workloads N] [--kind one|all|mixed] [--limit N] [--show N]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field

if __package__ in (None, ""):
    _TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [os.path.dirname(_TESTS), _TESTS]
    from reliability import crashstates as cs
    from reliability.common import MAX_PAYLOAD, Config, Obj, core_config, key, make_device, open_core, payload, \
        verify_served
else:
    from . import crashstates as cs
    from .common import MAX_PAYLOAD, Config, Obj, core_config, key, make_device, open_core, payload, verify_served

from lmcache_rawblock import _native
from lmcache_rawblock.lmcache_paths import raw_block_core_logger
from lmcache_rawblock.raw_block import MultiDeviceCore

NSLOTS = 10  # per device
RANDOM_JOINT = 6  # "all" states per window with each device's writes landing independently
INF = float("inf")

# Setup (unrecorded, a checkpoint after each step): keys 0-7 spread over the devices.
SETUP = [("put", [0, 1, 2, 3]), ("put", [4, 5, 6, 7])]
# "put@D" stores keys on device D directly (through its core: the facade would place them by
# room and queue), after their delete from another device: the crash points around it leave
# a key on two devices. "checkpoint@D" checkpoints device D alone (as its own periodic
# checkpoint does). "compact" compacts every device's metadata (log format).
MOVES = [
    ("delete", [0]), ("put@1", [0]),                        # moved in one flush epoch
    ("checkpoint@1", []),                                   # device 1 lists it, device 0 still does
    ("checkpoint", []),
    ("delete", [1, 4]), ("checkpoint", []), ("put@0", [1]), ("put@1", [4]),  # the deletes durable first
    ("put", [8, 9, 10]), ("checkpoint", []),
    ("delete", [2, 8]), ("put@1", [2]), ("put@0", [8]), ("compact", []),
    ("delete", [0, 5]), ("put@0", [0]), ("put", [11]), ("checkpoint", []),
    ("delete", [9]), ("put", [5, 12]), ("checkpoint", []), ("delete", [3]), ("put@1", [3]),
]


@dataclass(frozen=True)
class Workload:
    name: str
    ops: list
    meta_format: str


@dataclass
class MOp:
    kind: str
    keys: list
    log_before: int
    log_after: int
    live_after: dict          # key id -> version of every live key when the operation returned
    where_after: dict         # key id -> device index of every live key then
    version: int = 0
    synced: bool = False


@dataclass
class MRecording:
    paths: list
    pre: list                 # each device's image before the workload
    final: list               # each device's image when recording stopped
    recs: list                # each device's write log records
    ops: list
    versions: dict
    durable0: dict
    where0: dict
    workload: Workload
    moved: int = 0            # keys stored on another device than the one that held them before


@dataclass
class Result:
    workload: str
    devices: int
    recorded: str
    kind: str
    states: int = 0
    keys_checked: int = 0
    wrong: int = 0            # states with wrong bytes (a device alone or the cache)
    lost: int = 0             # states with a durable key not served
    stale: int = 0            # states with a version outside what the cut allows
    damage: int = 0           # states a device recovered as damage
    rule: int = 0             # states where a key on two devices was not served by the rule
    on_two: int = 0           # states with a key on two devices after the crash
    failures: list[str] = field(default_factory=list)

    def row(self) -> str:
        return (f"multidev {self.workload:10s} devices={self.devices} recorded {self.recorded:8s} "
                f"cut={self.kind:3s} states={self.states:5d} keys_checked={self.keys_checked:6d} "
                f"on_two_devices_states={self.on_two} wrong_byte_states={self.wrong} "
                f"lost_durable_states={self.lost} stale_states={self.stale} damage_states={self.damage} "
                f"rule_states={self.rule}")

    def add(self, other: Result) -> None:
        for f in ("states", "keys_checked", "wrong", "lost", "stale", "damage", "rule", "on_two"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.failures += other.failures


def random_workload(rng: random.Random, ndev: int, rounds: int = 5, nkeys: int = 16, compact: bool = False) -> list:
    """Rounds of: delete 1-3 keys, put 1-3 keys (through the facade, or now and then on a
    device of the draw), and mostly a checkpoint of every device, of one device, or (compact) a
    compaction."""
    live = {k for _, kids in SETUP for k in kids}
    ops: list = []
    for _ in range(rounds):
        dels = rng.sample(sorted(live), min(len(live), rng.randint(1, 3)))
        live.difference_update(dels)
        ops.append(("delete", dels))
        free = [k for k in range(nkeys) if k not in live]
        puts = rng.sample(free, min(len(free), rng.randint(1, 3)))
        live.update(puts)
        ops.append(("put" if rng.random() < 0.5 else f"put@{rng.randrange(ndev)}", puts))
        r = rng.random()
        if compact and r < 0.25:
            ops.append(("compact", []))
        elif r < 0.7:
            ops.append(("checkpoint", []))
        elif r < 0.85:
            ops.append((f"checkpoint@{rng.randrange(ndev)}", []))
    return ops


def _open_multi(paths: list[str], cfg: Config, *, load: bool = True, meta_format: str | None = None
                ) -> MultiDeviceCore:
    return MultiDeviceCore([core_config(p, cfg, load=load, meta_format=meta_format) for p in paths],
                           key_namespace="object")


def _where(core: MultiDeviceCore, live: dict) -> dict:
    idx = {p: i for i, p in enumerate(core.device_paths)}
    return {k: idx[core.device_of(key(k).encoded)] for k in live}


def _put(core: MultiDeviceCore, kind: str, kids: list, ver: int) -> list[bool]:
    specs = [key(k) for k in kids]
    objs = [Obj(payload(k, ver, cs._length(k, ver))) for k in kids]
    if kind == "put":
        return list(core.put_many(specs, objs).results)
    dev = core.device_cores()[int(kind.split("@")[1])]
    assert dev is not None and not any(core.exists_many([s.encoded for s in specs])), (kind, kids)
    return list(dev.put_many(specs, objs).results)


def _run_ops(core: MultiDeviceCore, ops: list, logp: str, versions: dict, live: dict) -> list[MOp]:
    out, ver = [], 1
    for kind, kids in ops:
        op = MOp(kind, kids, os.path.getsize(logp), 0, {}, {})
        if kind.startswith("put"):
            ver += 1
            op.version = ver
            for k in kids:
                versions.setdefault(k, {})[ver] = cs._length(k, ver)
            for k, ok in zip(kids, _put(core, kind, kids, ver)):
                if ok and k not in live:
                    live[k] = ver
        elif kind == "delete":
            for k, ok in zip(kids, core.delete_many([key(k).encoded for k in kids])):
                if ok:
                    live.pop(k, None)
        elif kind.startswith("checkpoint@"):
            dev = core.device_cores()[int(kind.split("@")[1])]
            assert dev is not None
            dev.checkpoint_now()  # durable for that device only: not counted as synced
        elif kind == "compact":
            op.synced = all([bool(c._native.compact_metadata()) for c in core.device_cores() if c is not None])
        else:
            core.checkpoint_now()
            op.synced = True
        op.log_after = os.path.getsize(logp)
        op.live_after, op.where_after = dict(live), _where(core, live)
        out.append(op)
    return out


def record(engine: str, workdir: str, wl: Workload, ndev: int) -> MRecording:
    """The setup (unrecorded), then the workload recorded, on ndev fresh device files."""
    cfg = Config(engine, False, False, True, wl.meta_format)
    paths = [make_device(os.path.join(workdir, f"multi-{engine}-{wl.name}-{i}.img"), NSLOTS) for i in range(ndev)]
    versions: dict[int, dict[int, int]] = {}
    live: dict[int, int] = {}
    core = _open_multi(paths, cfg, load=False)
    for _, kids in SETUP:
        for k in kids:
            versions.setdefault(k, {})[1] = cs._length(k, 1)
        assert all(_put(core, "put", kids, 1))
        live.update((k, 1) for k in kids)
        core.checkpoint_now()
    where0 = _where(core, live)
    core.close()
    pre = [open(p, "rb").read() for p in paths]
    logp = os.path.join(workdir, f"multi-{engine}-{wl.name}.wlog")
    core = _open_multi(paths, cfg)
    _native._set_write_log(logp)
    try:
        ops = _run_ops(core, wl.ops, logp, versions, live)
    finally:
        _native._set_write_log(None)
        final = [open(p, "rb").read() for p in paths]
        core.close()
    recs = [cs.parse_log(logp, p) for p in paths]
    os.unlink(logp)
    moved, prev = 0, dict(where0)
    for op in ops:
        moved += sum(1 for k, d in op.where_after.items() if k in prev and prev[k] != d)
        prev.update(op.where_after)
    return MRecording(paths, pre, final, recs, ops, versions, {k: 1 for k in where0}, where0, wl,
                      moved)


def expectations(rec: MRecording, dev: int, start_off: float, end_off: float) -> tuple[set, dict]:
    """(keys device dev must list, key id -> versions it may serve) for a cut of dev holding
    every write logged before start_off and maybe any logged before end_off."""
    state, where = dict(rec.durable0), dict(rec.where0)
    last = -1
    for i, op in enumerate(rec.ops):
        if op.synced and op.log_after <= start_off:
            state, where, last = dict(op.live_after), dict(op.where_after), i
    mine = {k: v for k, v in state.items() if where.get(k) == dev}
    durable = set(mine)
    allowed = {k: {v} for k, v in mine.items()}
    for op in rec.ops[last + 1:]:
        if op.log_before >= end_off:
            break
        if op.kind == "delete":
            durable.difference_update(op.keys)
        elif op.kind.startswith("put"):
            for k in op.keys:
                allowed.setdefault(k, set()).add(op.version)
    return durable, allowed


@dataclass
class State:
    what: str
    images: list              # each device's image
    cuts: list                # each device's (start_off, end_off)
    cut_dev: int = -1         # "one": the device cut


def _base(rec: MRecording, d: int, barrier: int) -> bytearray:
    img = bytearray(rec.pre[d])
    for r in rec.recs[d]:
        if cs.lands(r) and r.seq < barrier:
            cs.apply(img, r)
    return img


def one_states(rec: MRecording, d: int, rng: random.Random) -> list[State]:
    """Device d cut at every crash point crashstates.py enumerates for one device (whole
    writes); the other devices complete."""
    out = []
    recs = rec.recs[d]
    for e, (barrier, first, nxt, start_off) in enumerate(cs.epochs_of(recs)):
        base = _base(rec, d, barrier)
        pend = sorted([r for r in recs[first:nxt] if cs.lands(r)] +
                      [r for r in recs[:first] if cs.lands(r) and r.seq >= barrier], key=lambda r: r.seq)
        end_off = recs[nxt].end if nxt < len(recs) else INF
        for subset in cs.states_of(len(pend), rng):
            img = bytearray(base)
            for i in subset:
                cs.apply(img, pend[i])
            images = list(rec.final)
            images[d] = bytes(img)
            cuts = [(INF, INF)] * len(rec.paths)
            cuts[d] = (start_off, end_off)
            out.append(State(f"device {d} cut in its epoch {e}, writes {[cs.describe(pend[i])[:2] for i in subset]} "
                             f"of {[cs.describe(w) for w in pend]}; the others complete", images, cuts, d))
    return out


def mixed_states(rec: MRecording, rng: random.Random, n: int) -> list[State]:
    """n states in which each device stops at a crash point of its own, drawn at random (an
    epoch, then a prefix or a random subset of its writes; a device may also complete): a
    drive that failed first and a node that crashed later, in any order. The device that
    returns last (reopen_device) is drawn too."""
    ndev = len(rec.paths)
    per_dev = [cs.epochs_of(rec.recs[d]) for d in range(ndev)]
    out = []
    for _ in range(n):
        images, cuts, what = [], [], []
        for d in range(ndev):
            ep = per_dev[d]
            e = rng.randrange(len(ep) + 1)
            if e == len(ep):
                images.append(rec.final[d])
                cuts.append((INF, INF))
                what.append(f"device {d} complete")
                continue
            barrier, first, nxt, start_off = ep[e]
            recs = rec.recs[d]
            pend = sorted([r for r in recs[first:nxt] if cs.lands(r)] +
                          [r for r in recs[:first] if cs.lands(r) and r.seq >= barrier], key=lambda r: r.seq)
            if rng.random() < 0.5:
                subset = list(range(rng.randint(0, len(pend))))
            else:
                subset = [i for i in range(len(pend)) if rng.random() < 0.5]
            img = _base(rec, d, barrier)
            for i in subset:
                cs.apply(img, pend[i])
            images.append(bytes(img))
            cuts.append((start_off, recs[nxt].end if nxt < len(recs) else INF))
            what.append(f"device {d} cut in its epoch {e}, writes {[pend[i].seq for i in subset]} of "
                        f"{[r.seq for r in pend]}")
        out.append(State("; ".join(what), images, cuts, rng.randrange(ndev)))
    return out


def all_states(rec: MRecording, rng: random.Random) -> list[State]:
    """Every device cut at once, in each window between two flushes of any device."""
    ndev = len(rec.paths)
    # a synced write counts as a flush of its device (cs.epochs_of's synced_as_flush)
    flushes = sorted((r.end, d, r.off if r.kind == cs.FLUSH else r.seq) for d in range(ndev) for r in rec.recs[d]
                     if r.kind in (cs.FLUSH, cs.SYNCED))
    bounds = [8] + [end for end, _, _ in flushes] + [INF]
    out = []
    for w in range(len(bounds) - 1):
        start_off, end_off = bounds[w], bounds[w + 1]
        bases, pend = [], []
        for d in range(ndev):
            barrier = max([b for end, dd, b in flushes if dd == d and end <= start_off], default=0)
            bases.append(_base(rec, d, barrier))
            pend.append([r for r in rec.recs[d] if cs.lands(r) and r.seq >= barrier and r.end <= end_off])
        merged = sorted((r.seq, d, i) for d in range(ndev) for i, r in enumerate(pend[d]))
        picks = [{(d, i) for _, d, i in merged[:m]} for m in range(len(merged) + 1)]
        for _ in range(RANDOM_JOINT if merged else 0):
            picks.append({(d, i) for _, d, i in merged if rng.random() < 0.5})
        for n, pick in enumerate(picks):
            images = []
            for d in range(ndev):
                img = bytearray(bases[d])
                for i, r in enumerate(pend[d]):
                    if (d, i) in pick:
                        cs.apply(img, r)
                images.append(bytes(img))
            how = f"prefix of {n} writes in issue order" if n <= len(merged) else "writes landed per device at random"
            out.append(State(f"all devices cut in window {w} ({how}: "
                             f"{sorted((d, pend[d][i].seq) for d, i in pick)} of "
                             f"{[(d, s) for s, d, _ in merged]})", images, [(start_off, end_off)] * ndev))
    return out


def _write_images(rec: MRecording, st: State) -> None:
    for p, img in zip(rec.paths, st.images):
        with open(p, "wb") as f:
            f.write(img)


def _verify_multi(core: MultiDeviceCore, versions: dict, kids: list) -> dict:
    enc = [key(k).encoded for k in kids]
    held = [k for k, e in zip(kids, core.exists_many(enc)) if e]
    out: dict = {"served": {}, "wrong": []}
    if not held:
        return out
    henc = [key(k).encoded for k in held]
    metas = core.get_metadata_many(henc)
    objs = [Obj(MAX_PAYLOAD) for _ in held]
    oks = core.load_many_into(henc, objs)
    for k, m, o, ok in zip(held, metas, objs, oks):
        if not ok or m is None:
            continue
        data = o.bytes(m.size)
        v = next((v for v, n in versions.get(k, {}).items() if n == m.size and data == payload(k, v, n)), None)
        if v is None:
            out["wrong"].append((k, f"{m.size} bytes match no version put"))
        else:
            out["served"][k] = v
    return out


def check_state(rec: MRecording, st: State, cfg: Config, res: Result) -> None:
    """One crash state: each device alone, the cache at start-up (twice), and for a "one" state
    the cut device returning under a running cache."""
    kids = sorted(rec.versions)
    ndev = len(rec.paths)
    fails: list[str] = []
    _write_images(rec, st)
    alone: list[dict] = []
    must: set = set()
    allowed_all: dict = {}
    for d, p in enumerate(rec.paths):
        core = open_core(p, cfg)
        try:
            got = verify_served(core, rec.versions, kids)
            outcome = core.report_status()["recovery_outcome"]
        finally:
            core.close()
        durable, allowed = expectations(rec, d, *st.cuts[d])
        must |= durable
        for k, vs in allowed.items():
            allowed_all.setdefault(k, set()).update(vs)
        wrong, lost, stale = cs.judge(got, durable, allowed)
        res.keys_checked += len(got["served"]) + len(got["wrong"])
        if wrong:
            fails.append(f"wrong: device {d} alone served wrong bytes {wrong}")
        if lost:
            fails.append(f"lost: device {d} alone lacks durable keys {lost} (served {got['served']})")
        if stale:
            fails.append(f"stale: device {d} alone served (key, version) {stale}")
        if outcome == "damaged":
            fails.append(f"damage: device {d} recovered as damage")
        alone.append(got["served"])
    first: dict = {}
    for served in alone:
        for k, v in served.items():
            first.setdefault(k, v)
    two = [k for k in first if sum(k in s for s in alone) > 1]
    if two:
        res.on_two += 1
    _check_startup(rec, cfg, kids, first, must, fails)
    if st.cut_dev >= 0 and ndev > 1:
        _write_images(rec, st)
        _check_return(rec, cfg, kids, alone, st.cut_dev, fails)
    res.states += 1
    for tag, attr in (("wrong", "wrong"), ("lost", "lost"), ("stale", "stale"), ("damage", "damage"),
                      ("rule", "rule")):
        if any(f.startswith(tag + ":") for f in fails):
            setattr(res, attr, getattr(res, attr) + 1)
    res.failures += [f"{st.what}: {f}" for f in fails]


def _check_startup(rec: MRecording, cfg: Config, kids: list, first: dict, must: set, fails: list) -> None:
    """The cache opened over all devices serves, for each key, the first device's copy; the
    duplicates it dropped stay dropped after its close."""
    for attempt in ("at start-up", "opened again after the close"):
        core = _open_multi(rec.paths, cfg)
        try:
            got = _verify_multi(core, rec.versions, kids)
        finally:
            core.close()
        if got["wrong"]:
            fails.append(f"wrong: the cache {attempt} served wrong bytes {got['wrong']}")
        lost = sorted(must - set(got["served"]))
        if lost:
            fails.append(f"lost: the cache {attempt} lacks durable keys {lost}")
        off = {k: (v, first.get(k)) for k, v in got["served"].items() if first.get(k) != v}
        if off:
            fails.append(f"rule: the cache {attempt} served (version, first device's version) {off}")
    held: dict = {}
    for d, p in enumerate(rec.paths):
        core = open_core(p, cfg)
        try:
            for k, there in zip(kids, core.exists_many([key(k).encoded for k in kids])):
                if there:
                    held.setdefault(k, []).append(d)
        finally:
            core.close()
    dup = {k: ds for k, ds in held.items() if len(ds) > 1}
    if dup:
        fails.append(f"rule: after the cache's close keys are still on two devices {dup}")


def _check_return(rec: MRecording, cfg: Config, kids: list, alone: list, cut: int, fails: list) -> None:
    """The cut device missing at start-up (the others open alone and serve), then back through
    reopen_device: a key the others hold is served in their copy, the returning one's dropped."""
    away = rec.paths[cut] + ".away"
    os.rename(rec.paths[cut], away)
    try:
        core = _open_multi(rec.paths, cfg)
    finally:
        os.rename(away, rec.paths[cut])
    try:
        if core.device_states()[cut]["state"] != "failed":
            fails.append(f"rule: device {cut} missing at open is {core.device_states()[cut]['state']}, not failed")
            return
        online_first: dict = {}
        for d, served in enumerate(alone):
            if d != cut:
                for k, v in served.items():
                    online_first.setdefault(k, v)
        before = _verify_multi(core, rec.versions, kids)
        core.reopen_device(cut)
        got = _verify_multi(core, rec.versions, kids)
    finally:
        core.close()
    for name, g in (("without the cut device", before), ("after reopen_device", got)):
        if g["wrong"]:
            fails.append(f"wrong: the cache {name} served wrong bytes {g['wrong']}")
    expect = dict(alone[cut])
    expect.update(online_first)
    off = {k: (v, expect.get(k)) for k, v in got["served"].items() if expect.get(k) != v}
    missing = sorted(set(expect) - set(got["served"]))
    if off or missing:
        fails.append(f"rule: after reopen_device({cut}) served (version, expected) {off}, missing {missing}")


def check_recording(rec: MRecording, engine: str, kind: str, rng_seed: int = 1, limit: int = 0) -> Result:
    """Every crash state of kind ("one" for each device in turn, or "all"), or a seeded sample
    of limit of them ("mixed": limit random ones, default 50); recovered with engine, slot headers validated at open in every other
    state and only by the load's check in the rest."""
    logging.getLogger(raw_block_core_logger()).setLevel(logging.CRITICAL)
    logging.getLogger("lmcache.v1.storage_backend.raw_block.core").setLevel(logging.CRITICAL)
    rng = random.Random(f"{rng_seed}/{engine}/{rec.workload.name}/{kind}/{len(rec.paths)}")
    if kind == "one":
        states = [s for d in range(len(rec.paths)) for s in one_states(rec, d, rng)]
    elif kind == "mixed":
        states = mixed_states(rec, rng, limit or 50)
    else:
        states = all_states(rec, rng)
    if limit and len(states) > limit:
        states = rng.sample(states, limit)
    res = Result(rec.workload.name, len(rec.paths), engine, kind)
    for n, st in enumerate(states):
        cfg = Config(engine, False, False, n % 2 == 0, rec.workload.meta_format)
        check_state(rec, st, cfg, res)
    return res


def workloads(fmt: str, ndev: int, random_n: int, rng_seed: int) -> list[Workload]:
    out = [Workload(f"moves-{fmt}", [op for op in MOVES if fmt == "log" or op[0] != "compact"], fmt)]
    wrng = random.Random(f"{rng_seed}/multi-workloads/{fmt}/{ndev}")
    out += [Workload(f"r{i}-{fmt}", random_workload(wrng, ndev, compact=fmt == "log"), fmt) for i in range(random_n)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, action="append", help="devices of the cache (repeatable); default 2, 3")
    ap.add_argument("--format", action="append", choices=["v1", "log"], help="metadata format; default both")
    ap.add_argument("--engine", action="append", choices=["posix", "io_uring"], help="default both")
    ap.add_argument("--random-workloads", type=int, default=2, metavar="N", help="random workloads besides 'moves'")
    ap.add_argument("--kind", action="append", choices=["one", "all", "mixed"],
                    help="crash states (repeatable); default one and all")
    ap.add_argument("--limit", type=int, default=0,
                    help="sample at most N states per workload and kind (0: all; mixed: N random states, default 50)")
    ap.add_argument("--rng-seed", type=int, default=1)
    ap.add_argument("--show", type=int, default=5)
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    bad, states = False, 0
    with tempfile.TemporaryDirectory(prefix="rb-crashstates-multi-") as tmp:
        for ndev in a.devices or [2, 3]:
            for fmt in a.format or ["v1", "log"]:
                for eng in a.engine or ["posix", "io_uring"]:
                    for wl in workloads(fmt, ndev, a.random_workloads, a.rng_seed):
                        rec = record(eng, tmp, wl, ndev)
                        for kind in a.kind or ["one", "all"]:
                            r = check_recording(rec, eng, kind, a.rng_seed, a.limit)
                            print(r.row() + f" moved={rec.moved}", flush=True)
                            for f in r.failures[:a.show]:
                                print("    " + f, flush=True)
                            bad |= bool(r.failures)
                            states += r.states
    print(f"{states} states; elapsed {time.monotonic() - t0:.1f} s; {'FAIL' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
