"""Kill loop over several devices: a writer process doing random put_many / delete_many /
checkpoint_now on a MultiDeviceCore over NDEV small device files is killed with SIGKILL at a
random moment (one cycle in ten while it opens the devices and recovers them). The checker then
opens each device alone, as a RawBlockCore with nothing but its own metadata, and holds every
load to killloop.py's promise (a served key returns exactly the bytes of one of the puts
attempted for it, or is a miss; a key made durable by an acknowledged checkpoint_now, which
checkpoints every device, is served by some device; no version comes back that the last
acknowledged checkpoint no longer listed and no put attempted since). A key may be found on two
devices after a crash (deleted from one, stored again on another, and only the second device's
checkpoint written): both copies must pass the same checks, and the MultiDeviceCore the checker
opens next keeps the first device's, which its close makes durable for the next writer.

Run: python3 tests/reliability/killloop_multi.py [--cycles N] [--config NAME ...]
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
    _TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [os.path.dirname(_TESTS), _TESTS]  # this checkout's package, then the test helpers
    from reliability import killloop
    from reliability.common import (MAX_PAYLOAD, MIN_PAYLOAD, Config, Obj, config_by_name, core_config, key,
                                    make_device, open_core, payload, verify_served)
else:
    from . import killloop
    from .common import (MAX_PAYLOAD, MIN_PAYLOAD, Config, Obj, config_by_name, core_config, key, make_device,
                         open_core, payload, verify_served)

from lmcache_rawblock.raw_block import MultiDeviceCore

NDEV = 3
NSLOTS = 6  # per device: few slots, so slot reuse is frequent and devices fill unevenly
NKEYS = 30
# Both formats, both engines; buffered I/O, header validation at open.
CONFIGS = [config_by_name(n) for n in ("posix/buffered/nosum/verify/v1", "io_uring/buffered/nosum/verify/v1",
                                       "posix/buffered/nosum/verify/log", "io_uring/odirect/sum/noverify/log")]


@dataclass
class Stats:
    config: str
    cycles: int = 0
    ops: int = 0
    stored: int = 0
    keys_checked: int = 0
    wrong_bytes: int = 0
    lost: int = 0  # durable keys no device served
    stale: int = 0
    on_two_devices: int = 0
    failures: list[str] = field(default_factory=list)

    def row(self) -> str:
        return (f"multidev {self.config:36s} devices={NDEV} cycles={self.cycles:4d} ops={self.ops:6d} "
                f"stored={self.stored} keys_checked={self.keys_checked:6d} wrong_bytes={self.wrong_bytes} "
                f"lost_durable={self.lost} stale_versions={self.stale} on_two_devices={self.on_two_devices}")


def _open_multi(paths: list[str], cfg: Config) -> MultiDeviceCore:
    return MultiDeviceCore([core_config(p, cfg) for p in paths], key_namespace="object")


def _writer(paths: list[str], cfg: Config, logfd: int, ready_fd: int, rng_seed: int, live: set[int], v0: int) -> None:
    def log(line: str) -> None:
        os.write(logfd, line.encode() + b"\n")

    core = _open_multi(paths, cfg)
    os.write(ready_fd, b"r")
    rng = random.Random(rng_seed)
    ver = v0
    while True:
        r = rng.random()
        if r < 0.5:
            free = [k for k in range(NKEYS) if k not in live]
            if not free:
                continue
            kids = rng.sample(free, min(len(free), rng.randint(1, 5)))
            items = []
            for k in kids:
                ver += 1
                items.append((k, ver, rng.randint(MIN_PAYLOAD, MAX_PAYLOAD)))
            log("P " + " ".join(f"{k}:{v}:{n}" for k, v, n in items))
            res = core.put_many([key(k) for k in kids], [Obj(payload(k, v, n)) for k, v, n in items])
            log("p " + " ".join(f"1@{core.device_of(key(k).encoded)}:{core.entry_offset(key(k).encoded)}" if x
                                else "0" for k, x in zip(kids, res.results)))
            live.update(k for k, x in zip(kids, res.results) if x)
        elif r < 0.85:
            pool = sorted(live)
            if not pool:
                continue
            kids = list(dict.fromkeys(rng.sample(pool, min(len(pool), rng.randint(1, 3)))))
            log("D " + " ".join(map(str, kids)))
            res = core.delete_many([key(k).encoded for k in kids])
            log("d " + " ".join("1" if x else "0" for x in res))
            live.difference_update(k for k, x in zip(kids, res) if x)
        else:
            log("C")
            core.checkpoint_now()
            log("c")


def _child(*args) -> None:
    code = 0
    try:
        _writer(*args)
    except BaseException:
        try:
            os.write(args[2], b"E " + traceback.format_exc().replace("\n", " | ").encode() + b"\n")
        finally:
            code = 3
    os._exit(code)


def _await_checkpoint(logpath: str, timeout_s: float = 60.0) -> None:
    """Wait until the writer's log shows an acknowledged checkpoint (a "c" line) while a key it
    stored is live, at most timeout_s: on a loaded machine the random kill may otherwise come
    before any."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        live: set[str] = set()
        asked: list[str] = []
        with open(logpath) as f:
            for line in f.read().split("\n")[:-1]:  # whole lines only
                op, _, rest = line.partition(" ")
                if op in ("P", "D"):
                    asked = [item.split(":")[0] for item in rest.split()]
                elif op == "p":
                    live.update(k for k, x in zip(asked, rest.split()) if x != "0")
                elif op == "d":
                    live.difference_update(k for k, x in zip(asked, rest.split()) if x == "1")
                elif op == "c" and live:
                    return
        time.sleep(0.01)


def _kill_writer(paths: list[str], cfg: Config, logpath: str, rng: random.Random, durable: dict[int, int],
                 v0: int, max_kill_ms: float, after_checkpoint: bool = False) -> tuple[list[str], int]:
    """Fork a writer, kill it; its log lines (the last, cut short, dropped) and wait status.
    after_checkpoint: the kill comes as soon as the writer acknowledged a checkpoint of a
    live key, instead of at a random time."""
    logfd = os.open(logpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    rfd, wfd = os.pipe()
    seed = rng.getrandbits(64)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        _child(paths, cfg, logfd, wfd, seed, set(durable), v0)
    os.close(wfd)
    os.close(logfd)
    early = rng.random() < killloop.EARLY_KILL_SHARE
    if early and not after_checkpoint:
        time.sleep(rng.uniform(0, killloop.EARLY_KILL_MS) / 1000.0)  # while it opens and recovers
    elif select.select([rfd], [], [], 60)[0] and os.read(rfd, 1) == b"r":
        wait_ms = rng.uniform(0, max_kill_ms)
        if after_checkpoint:
            _await_checkpoint(logpath)  # then kill at once, while its keys are still live
        else:
            time.sleep(wait_ms / 1000.0)
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
        lines.pop()
    return lines, status


def _check_devices_alone(paths: list[str], cfg: Config, versions: dict, allowed: dict, st: Stats, cyc: int
                         ) -> dict[int, int]:
    """Each device opened alone: every key it serves is checked. Returns key -> version served
    by the first device (in the list's order) that serves it."""
    served: dict[int, int] = {}
    for p in paths:
        core = open_core(p, cfg)
        try:
            res = verify_served(core, versions, range(NKEYS))
        finally:
            core.close()
        st.keys_checked += len(res["served"]) + len(res["wrong"])
        for kid, what in res["wrong"]:
            st.wrong_bytes += 1
            st.failures.append(f"cycle {cyc}: {p}: key {kid} served wrong bytes: {what}")
        for kid, v in res["served"].items():
            if v not in allowed.get(kid, ()):
                st.stale += 1
                st.failures.append(f"cycle {cyc}: {p}: key {kid} served in version {v}, not durable, not put since")
            if kid in served:
                st.on_two_devices += 1
            else:
                served[kid] = v
    return served


def _check_multi(paths: list[str], cfg: Config, versions: dict, served: dict[int, int], st: Stats, cyc: int) -> None:
    """The cache over the devices serves what the first device serving each key holds; its close
    makes that (duplicates dropped) durable for the next writer."""
    core = _open_multi(paths, cfg)
    try:
        kids = sorted(served)
        if kids:
            outs = [Obj(MAX_PAYLOAD) for _ in kids]
            metas = core.get_metadata_many([key(k).encoded for k in kids])
            got = core.load_many_into([key(k).encoded for k in kids], outs)
            for k, m, o, ok in zip(kids, metas, outs, got):
                n = versions[k][served[k]]
                if not ok or m is None or m.size != n or o.bytes(n) != payload(k, served[k], n):
                    st.wrong_bytes += 1
                    st.failures.append(f"cycle {cyc}: the cache over the devices did not serve key {k} "
                                       f"version {served[k]}")
    finally:
        core.close()


def run_config(cfg: Config, cycles: int, rng_seed: int, workdir: str, *, max_kill_ms: float = killloop.MAX_KILL_MS
               ) -> Stats:
    st = Stats(cfg.name)
    logging.getLogger("lmcache.v1.storage_backend.raw_block.core").setLevel(logging.CRITICAL)
    rng = random.Random(f"{rng_seed}/multi/{cfg.name}")
    stem = os.path.join(workdir, "multi-" + cfg.name.replace("/", "-"))
    paths = [make_device(f"{stem}-{i}.img", NSLOTS) for i in range(NDEV)]
    versions: dict[int, dict[int, int]] = {}
    durable: dict[int, int] = {}
    for cyc in range(cycles):
        # The last cycle of a run that has checked no key yet waits for a checkpoint before its
        # kill, so every run checks recovered keys however slow the machine is.
        last_chance = cyc == cycles - 1 and st.keys_checked == 0
        lines, status = _kill_writer(paths, cfg, stem + ".log", rng, durable,
                                     (cyc + 1) * killloop.VERSIONS_PER_CYCLE, max_kill_ms, last_chance)
        counts = {"put_keys": 0, "stored": 0, "reused": 0, "compactions": 0}
        allowed: dict[int, set[int]] = {}
        durable_now, acked, err = killloop.replay(lines, durable, versions, {}, counts, allowed)
        st.ops += acked
        st.stored += counts["stored"]
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            st.failures.append(f"cycle {cyc}: writer ended by itself (status {status}): {err or 'no error logged'}")
            break
        served = _check_devices_alone(paths, cfg, versions, allowed, st, cyc)
        missing = sorted(k for k in durable_now if k not in served)
        if missing:
            st.lost += len(missing)
            st.failures.append(f"cycle {cyc}: durable keys no device served: {missing}")
        _check_multi(paths, cfg, versions, served, st, cyc)
        st.cycles += 1
        durable = served
    return st


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=10, help="kill cycles per configuration")
    ap.add_argument("--config", action="append", help="configuration name (repeatable); default: "
                    + ", ".join(c.name for c in CONFIGS))
    ap.add_argument("--rng-seed", type=int, default=1)
    a = ap.parse_args(argv)
    configs = [config_by_name(n) for n in a.config] if a.config else CONFIGS
    bad = False
    with tempfile.TemporaryDirectory(prefix="rb-killloop-multi-") as d:
        for c in configs:
            s = run_config(c, a.cycles, a.rng_seed, d)
            print(s.row(), flush=True)
            for f in s.failures[:5]:
                print("    " + f, flush=True)
            bad |= bool(s.failures)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
