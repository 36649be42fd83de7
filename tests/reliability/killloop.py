"""Kill loop: a writer process doing random put_many / delete_many / checkpoint_now on a small
device is killed with SIGKILL at a random moment; a checker reopens the device and holds every
load to the promise:

  * a served key returns exactly the bytes of one of the puts attempted for it (payloads name
    their key and version, so another key's bytes, another version's length or a torn mix
    are all caught), or it is a miss;
  * a key is durable once a checkpoint_now() that included it returned; it stays durable until
    a delete of it is attempted. Every durable key must be served after the crash. Keys put
    after the last acknowledged checkpoint may be missing; keys deleted after it may come
    back (with their own bytes). A durable key that is missing counts as "reported" when the
    core's counters (recovery_dropped_entries, load_dropped_entries,
    payload_checksum_failures) account for it, else as silently lost.

  * a key is never served in a version that the last acknowledged checkpoint no longer listed
    unless a put of that version was attempted since (a delete a checkpoint made durable
    stays deleted; an older version never comes back).

  * a crash is never reported as damage (recovery_outcome "damaged"): each log group is
    durable before the next is written, so a crash tears the log's tail only.

Both metadata formats (common.META_FORMATS). In the log format the ring is 16 KiB (four
one-block groups), so checkpoints fill it and compact it; the writer also calls
compact_metadata() now and then (a returned compaction that wrote a base counts like a
checkpoint), and every MOVE_EVERY cycles the device starts over in format v1 (written by the
parent with meta_format='v1'), so the next writer moves it to the log format at its first
checkpoint, and may be killed doing so.

Deallocation of freed slots (deallocate_freed="on": punched holes in the device file) is on
in half of the configurations (common.ALL_CONFIGS; names end in "/dealloc"). Its writers log
the core's dealloc_slots / dealloc_skipped counters after every delete, checkpoint and
compaction ("x" lines, statistics only), so a run shows that slots were deallocated and then
reused while it was being killed.

One cycle in ten is killed 0-40 ms after the fork instead, while the writer opens the device
and recovers. The writer logs each operation before starting it (intent) and after it returned (result)
with an unbuffered write(2) - what reached the kernel survives SIGKILL, so the log is exact
(RB_KILLLOOP_FSYNC=1 adds an fsync per record). Cycles continue on the same device: the next
writer opens what the checker recovered (the checker's close writes a final checkpoint, so
every key it served is durable for the next cycle).

Run: python3 tests/reliability/killloop.py [--cycles N] [--config NAME ...] [--rng-seed S]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import select
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from reliability.common import (ALL_CONFIGS, MAX_PAYLOAD, MIN_PAYLOAD, Config, Obj, config_by_name, key,
                                    make_device, open_core, payload, verify_served)
else:
    from .common import (ALL_CONFIGS, MAX_PAYLOAD, MIN_PAYLOAD, Config, Obj, config_by_name, key, make_device,
                         open_core, payload, verify_served)

from lmcache_rawblock.lmcache_paths import raw_block_core_logger  # noqa: E402

NSLOTS = 12        # few slots: LIFO reuse of a just-freed slot is the common case
NKEYS = 30
MAX_KILL_MS = 300.0        # after the writer opened its core
EARLY_KILL_SHARE = 0.1     # cycles killed 0-EARLY_KILL_MS after the fork instead (open, recovery)
EARLY_KILL_MS = 40.0
VERSIONS_PER_CYCLE = 1_000_000
COMPACT_SHARE = 0.04       # log format: writer operations that are a compact_metadata()
MOVE_EVERY = 10            # log format: cycles between starts over from a format v1 device
MOVE_KEYS = 8              # keys the format v1 device starts with


@dataclass
class Stats:
    config: str
    cycles: int = 0
    ops: int = 0               # acknowledged writer operations
    put_keys: int = 0          # keys offered to put_many
    stored: int = 0            # of which stored
    reused: int = 0            # of which stored in a slot that last held another key
    keys_checked: int = 0      # served keys whose bytes were verified
    wrong_bytes: int = 0
    lost_silent: int = 0       # durable keys missing with nothing in the core's counters
    lost_reported: int = 0     # durable keys missing, accounted for by the core's counters
    stale: int = 0             # keys served in a version no longer durable and not put since
    compactions: int = 0       # log format: acknowledged compact_metadata() calls that wrote a base
    base_switches: int = 0     # log format: superblock switches seen by the checkers (every base)
    moves: int = 0             # log format: cycles that began on a format v1 device
    recovery_dropped: int = 0  # stale entries dropped by header validation at open or first load
    load_dropped: int = 0      # indexed keys whose first load rejected them (unverified entries)
    load_errors: int = 0       # indexed keys whose load failed (e.g. payload checksum caught bad bytes)
    dealloc_slots: int = 0     # deallocate_freed on: slots the writers deallocated (last count each cycle logged)
    dealloc_skipped: int = 0   # of the reusable slots, taken by a put before their deallocation ran
    failures: list[str] = field(default_factory=list)

    def row(self) -> str:
        return (f"{self.config:44s} cycles={self.cycles:5d} ops={self.ops:7d} stored={self.stored}/{self.put_keys} "
                f"reused_slots={self.reused} keys_checked={self.keys_checked:7d} "
                f"wrong_bytes={self.wrong_bytes} lost_durable={self.lost_silent} lost_reported={self.lost_reported} "
                f"stale_versions={self.stale} stale_dropped={self.recovery_dropped} load_errors={self.load_errors}"
                + (f" compactions={self.compactions} base_switches={self.base_switches} moves={self.moves}"
                   if "/log" in self.config or self.config == "total" else "")
                + (f" dealloc_slots={self.dealloc_slots} dealloc_skipped={self.dealloc_skipped}"
                   if "/dealloc" in self.config or self.config == "total" else ""))


# ---- writer (child process) --------------------------------------------------------------

def _id_of(encoded: str) -> int:
    """The key id of an encoded key of the key universe."""
    for k in range(NKEYS):
        if key(k).encoded == encoded:
            return k
    raise KeyError(encoded)


def _writer(path: str, cfg: Config, logfd: int, ready_fd: int, rng_seed: int, live: set[int], v0: int) -> None:
    do_sync = os.environ.get("RB_KILLLOOP_FSYNC") == "1"

    def log(line: str) -> None:
        os.write(logfd, line.encode() + b"\n")
        if do_sync:
            os.fsync(logfd)

    def dealloc_counts() -> None:
        if cfg.dealloc:
            st = core._native.status()
            log(f"x {st['dealloc_slots']} {st['dealloc_skipped']}")

    core = open_core(path, cfg)
    os.write(ready_fd, b"r")
    rng = random.Random(rng_seed)
    ver = v0
    while True:
        r = rng.random()
        if r < 0.5:
            free = [k for k in range(NKEYS) if k not in live]
            if not free:
                continue
            kids = rng.sample(free, min(len(free), rng.randint(1, 4)))
            items = []
            for k in kids:
                ver += 1
                items.append((k, ver, rng.randint(MIN_PAYLOAD, MAX_PAYLOAD)))
            objs = [Obj(payload(k, v, n)) for k, v, n in items]
            log("P " + " ".join(f"{k}:{v}:{n}" for k, v, n in items))
            res = core.put_many([key(k) for k in kids], objs)
            # stored keys also log their slot offset, so the checker can count slot reuse
            log("p " + " ".join(f"1@{core.entry_offset(key(k).encoded)}" if x else "0"
                                for k, x in zip(kids, res.results)))
            live.update(k for k, x in zip(kids, res.results) if x)
        elif r < 0.85:
            pool = sorted(live)
            if not pool:
                continue
            kids = rng.sample(pool, min(len(pool), rng.randint(1, 3)))
            if cfg.extent and rng.random() < 0.5:  # extent eviction: the victim extent's keys
                victim = core.extent_victim()
                kids = [_id_of(enc) for enc in victim[1]] if victim and victim[1] else kids
            if rng.random() < 0.1:
                kids.append(rng.randrange(NKEYS))  # sometimes a key that may not be there
            kids = list(dict.fromkeys(kids))
            log("D " + " ".join(map(str, kids)))
            res = core.delete_many([key(k).encoded for k in kids])
            log("d " + " ".join("1" if x else "0" for x in res))
            live.difference_update(k for k, x in zip(kids, res) if x)
            dealloc_counts()
        elif cfg.meta_format == "log" and r < 0.85 + COMPACT_SHARE:
            log("K")
            done = core._native.compact_metadata()
            log(f"k {1 if done else 0}")
            dealloc_counts()
        else:
            log("C")
            core.checkpoint_now()
            log("c")
            dealloc_counts()


def _child(path, cfg, logfd, ready_fd, rng_seed, live, v0) -> None:
    code = 0
    try:
        _writer(path, cfg, logfd, ready_fd, rng_seed, live, v0)
    except BaseException:
        try:
            os.write(logfd, b"E " + traceback.format_exc().replace("\n", " | ").encode() + b"\n")
        finally:
            code = 3
    os._exit(code)


# ---- log replay --------------------------------------------------------------------------

def replay(lines: list[str], durable: set[int] | dict[int, int], versions: dict[int, dict[int, int]],
           slot_owner: dict[str, int] | None = None, counts: dict[str, int] | None = None,
           allowed: dict[int, set[int]] | None = None) -> tuple[set[int], int, str]:
    """Apply one writer's log to the set of durable keys (or key id -> version); record
    attempted versions, and in counts the keys put, stored, stored in a slot that last held
    another key, and compactions acknowledged. allowed, when given, is filled with key id ->
    the versions a crash after this log may serve: each durable key's version at the last
    acknowledged checkpoint, and every version a put attempted since.

    Returns (durable keys now, acknowledged operations, writer error or "")."""
    slot_owner = {} if slot_owner is None else slot_owner
    counts = {} if counts is None else counts
    for n in ("put_keys", "stored", "reused", "compactions"):
        counts.setdefault(n, 0)
    start = durable if isinstance(durable, dict) else dict.fromkeys(durable, None)
    live = dict(start)
    durable = set(start)
    ok_versions = {k: ({v} if v is not None else set()) for k, v in start.items()}
    acked = 0
    pending: tuple[str, list] | None = None
    err = ""
    for ln in lines:
        tag, _, rest = ln.partition(" ")
        if tag == "P":
            items = [tuple(map(int, t.split(":"))) for t in rest.split()]
            for k, v, n in items:
                versions.setdefault(k, {})[v] = n
                ok_versions.setdefault(k, set()).add(v)
            pending = ("P", items)
        elif tag == "p":
            for (k, v, _n), x in zip(pending[1], rest.split()):
                counts["put_keys"] += 1
                if x.startswith("1"):
                    live[k] = v
                    counts["stored"] += 1
                    off = x.partition("@")[2]
                    if off in slot_owner and slot_owner[off] != k:
                        counts["reused"] += 1
                    slot_owner[off] = k
            pending, acked = None, acked + 1
        elif tag == "D":
            kids = list(map(int, rest.split()))
            durable.difference_update(kids)   # attempted: the delete may or may not have happened
            pending = ("D", kids)
        elif tag == "d":
            for k, x in zip(pending[1], rest.split()):
                if x == "1":
                    live.pop(k, None)
            pending, acked = None, acked + 1
        elif tag in ("C", "K"):
            pending = (tag, [])
        elif tag == "c" or (tag == "k" and rest == "1"):
            # what was live is durable: versions no longer live may not come back
            durable = set(live)
            ok_versions = {k: {v} for k, v in live.items()}
            counts["compactions"] += tag == "k"
            pending, acked = None, acked + 1
        elif tag == "k":
            pending, acked = None, acked + 1
        elif tag == "E":
            err = rest
    if allowed is not None:
        allowed.clear()
        allowed.update(ok_versions)
    return durable, acked, err


# ---- one configuration -------------------------------------------------------------------

def run_config(cfg: Config, cycles: int, rng_seed: int, workdir: str, *, max_kill_ms: float = MAX_KILL_MS,
               verbose: bool = False) -> Stats:
    st = Stats(cfg.name)
    logging.getLogger(raw_block_core_logger()).setLevel(logging.CRITICAL)
    rng = random.Random(f"{rng_seed}/{cfg.name}")
    path = make_device(os.path.join(workdir, cfg.name.replace("/", "-") + ".img"), NSLOTS, cfg.stride)
    logpath = path + ".log"
    versions: dict[int, dict[int, int]] = {}
    slot_owner: dict[str, int] = {}   # slot offset -> key last stored there
    durable: dict[int, int] = {}      # key id -> version
    sb_seq = 0
    for cyc in range(cycles):
        # (not strided: format v1's slots lie back to back, the strided layout refuses them; nor
        # with size classes: a v1 entry has no class, so the move keeps none)
        if cfg.meta_format == "log" and not cfg.stride and not cfg.classes and cyc % MOVE_EVERY == 0:
            # start over from a format v1 device: this cycle's writer moves it to the log format
            make_device(path, NSLOTS, cfg.stride)
            slot_owner.clear()
            ver = (cyc + 1) * VERSIONS_PER_CYCLE - VERSIONS_PER_CYCLE // 2
            kids = rng.sample(range(NKEYS), MOVE_KEYS)
            items = [(k, ver + i, rng.randint(MIN_PAYLOAD, MAX_PAYLOAD)) for i, k in enumerate(kids)]
            for k, v, n in items:
                versions.setdefault(k, {})[v] = n
            core = open_core(path, cfg, load=False, meta_format="v1")
            try:
                res = core.put_many([key(k) for k, _v, _n in items], [Obj(payload(k, v, n)) for k, v, n in items])
                assert all(res.results), res.failure
                core.checkpoint_now()
            finally:
                core.close()
            durable = {k: v for k, v, _n in items}
            sb_seq = 0
            st.moves += 1
        logfd = os.open(logpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        rfd, wfd = os.pipe()
        child_seed = rng.getrandbits(64)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            _child(path, cfg, logfd, wfd, child_seed, set(durable), (cyc + 1) * VERSIONS_PER_CYCLE)
        os.close(wfd)
        os.close(logfd)
        if rng.random() < EARLY_KILL_SHARE:
            # a crash while the writer opens the device and recovers
            time.sleep(rng.uniform(0, EARLY_KILL_MS) / 1000.0)
        elif select.select([rfd], [], [], 60)[0] and os.read(rfd, 1) == b"r":
            time.sleep(rng.uniform(0, max_kill_ms) / 1000.0)
        os.close(rfd)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
        with open(logpath) as f:
            text = f.read()
        lines = text.splitlines()
        if text and not text.endswith("\n"):
            lines.pop()   # a record the kill cut short was never complete: the operation was not acknowledged
        counts = {"put_keys": 0, "stored": 0, "reused": 0, "compactions": 0}
        allowed: dict[int, set[int]] = {}
        durable_now, acked, err = replay(lines, durable, versions, slot_owner, counts, allowed)
        st.put_keys += counts["put_keys"]
        st.stored += counts["stored"]
        st.reused += counts["reused"]
        st.compactions += counts["compactions"]
        st.ops += acked
        xs = [ln.split() for ln in lines if ln.startswith("x ")]
        if xs:
            st.dealloc_slots += int(xs[-1][1])
            st.dealloc_skipped += int(xs[-1][2])
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            st.failures.append(f"cycle {cyc}: writer ended by itself (status {status}): {err or 'no error logged'}")
            break
        # checker: a fresh core recovers the device
        core = open_core(path, cfg)
        try:
            res = verify_served(core, versions, range(NKEYS))
            s = core.report_status()
        finally:
            core.close()
        if cfg.meta_format == "log":
            seq = int(s.get("recovery_seq") or 0)
            st.base_switches += max(0, seq - sb_seq)
            sb_seq = seq
        st.recovery_dropped += s["recovery_dropped_entries"] + s["load_dropped_entries"]
        st.load_dropped += len(res["dropped"])
        st.load_errors += len(res["errors"])
        st.cycles += 1
        st.keys_checked += len(res["served"]) + len(res["wrong"])
        if s["recovery_outcome"] == "damaged":  # a crash tears the log's tail only, never its middle
            st.failures.append(f"cycle {cyc}: a crash recovered as damage: {s['checkpoint_last_error']}")
        for kid, what in res["wrong"]:
            st.wrong_bytes += 1
            st.failures.append(f"cycle {cyc}: key {kid} served wrong bytes: {what}")
        wrong_keys = {k for k, _ in res["wrong"]}   # counted as wrong bytes, not again as lost
        missing = sorted(k for k in durable_now if k not in res["served"] and k not in wrong_keys)
        if missing:
            counted = sum(s.get(n, 0) for n in ("recovery_dropped_entries", "recovery_lost_entries",
                                                  "load_dropped_entries", "payload_checksum_failures"))
            rep = min(len(missing), counted)
            st.lost_reported += rep
            st.lost_silent += len(missing) - rep
            st.failures.append(f"cycle {cyc}: durable keys missing after recovery: {missing} "
                               f"(core counters account for {rep})")
        stale = sorted((k, v) for k, v in res["served"].items() if v not in allowed.get(k, ()))
        if stale:
            st.stale += len(stale)
            st.failures.append(f"cycle {cyc}: (key, version) served that the last acknowledged checkpoint no "
                               f"longer listed and no put attempted since: {stale}")
        if verbose:
            print(f"  cycle {cyc}: ops={acked} served={len(res['served'])} durable={len(durable_now)} "
                  f"wrong={len(res['wrong'])} missing={len(missing)} stale={len(stale)}", flush=True)
        # What the checker served is the next writer's starting (durable) state.
        durable = dict(res["served"])
    return st


def run(configs: list[Config], cycles_per_config: int, rng_seed: int, workdir: str | None = None,
        verbose: bool = False) -> list[Stats]:
    with tempfile.TemporaryDirectory(prefix="rb-killloop-", dir=workdir) as d:
        return [run_config(c, cycles_per_config, rng_seed, d, verbose=verbose) for c in configs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=int(os.environ.get("RB_KILLLOOP_CYCLES", "10")),
                    help="kill cycles per configuration")
    ap.add_argument("--config", action="append",
                    help="configuration name, engine/io/sum/verify[/format][/dealloc] (repeatable); default: all 32 "
                         "(deallocation on in half of them)")
    ap.add_argument("--format", action="append", choices=["v1", "log"],
                    help="only the configurations of this metadata format (repeatable)")
    ap.add_argument("--rng-seed", type=int, default=int(os.environ.get("RB_KILLLOOP_RNG_SEED", "1")))
    ap.add_argument("--workdir", default=None, help="directory for device files (default: $TMPDIR)")
    ap.add_argument("--show", type=int, default=5, help="failures listed per configuration")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    configs = [config_by_name(n) for n in a.config] if a.config else ALL_CONFIGS
    if a.format:
        configs = [c for c in configs if c.meta_format in a.format]
    t0 = time.monotonic()
    bad = False
    tot = Stats("total")
    with tempfile.TemporaryDirectory(prefix="rb-killloop-", dir=a.workdir) as d:
        for c in configs:
            s = run_config(c, a.cycles, a.rng_seed, d, verbose=a.verbose)
            print(s.row(), flush=True)
            for f in s.failures[:a.show]:
                print("    " + f, flush=True)
            bad |= bool(s.wrong_bytes or s.lost_silent or s.lost_reported or s.stale or s.failures)
            for n in ("cycles", "ops", "put_keys", "stored", "reused", "keys_checked", "wrong_bytes", "lost_silent",
                      "lost_reported", "stale", "recovery_dropped", "load_dropped", "load_errors", "compactions",
                      "base_switches", "moves", "dealloc_slots", "dealloc_skipped"):
                setattr(tot, n, getattr(tot, n) + getattr(s, n))
    print(tot.row())
    print(f"elapsed {time.monotonic() - t0:.1f} s; {'FAIL' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
