"""Load latency while stores stream, io_scheduler fifo against loads_first, on one capped drive.

The drive: a zram device (it takes bios whole, so the throttle charges every byte once) in a
cgroup v1 blkio group with a read and a write bandwidth cap; the process moves into the group.
Per round, for each scheduler in turn (interleaved): a core on the drive (io_uring, O_DIRECT,
8 MiB chunks); one-chunk loads while idle; then ``--writers`` threads each storing ``--per-call``
chunks per put_many without pause, and the same loads beside them (one at a time, ``--gap``
seconds apart, as the idle ones: the throttle passes a 100 ms slice's worth of bytes at once, so
back-to-back loads would measure its slices). Prints and writes (``--out``) p50 / p99 of each series and the stores' rate.

Needs root, /sys/fs/cgroup/blkio and zram. A one-off driver until the harness's drives part
measures the same; run: python3 benchmarks/scripts/sched_latency.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from lmcache_rawblock_bench.core import Arena, object_keys  # noqa: E402

from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig  # noqa: E402

MiB = 1 << 20
MB = 1000 * 1000
BLKIO = "/sys/fs/cgroup/blkio"


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class Drive:
    """A zram device of size bytes in its own blkio group, capped; the process moved in."""

    def __init__(self, size: int, read_bps: int, write_bps: int):
        self.idx = int(open("/sys/class/zram-control/hot_add").read())
        write(f"/sys/block/zram{self.idx}/disksize", str(size))
        self.path = f"/dev/zram{self.idx}"
        for _ in range(100):
            if os.path.exists(self.path):
                break
            time.sleep(0.01)
        mm = open(f"/sys/block/zram{self.idx}/dev").read().strip()
        self.group = os.path.join(BLKIO, f"rb-sched-{os.getpid()}")
        os.makedirs(self.group, exist_ok=True)
        write(os.path.join(self.group, "blkio.throttle.read_bps_device"), f"{mm} {read_bps}")
        write(os.path.join(self.group, "blkio.throttle.write_bps_device"), f"{mm} {write_bps}")
        write(os.path.join(self.group, "cgroup.procs"), str(os.getpid()))

    def close(self) -> None:
        write(os.path.join(BLKIO, "cgroup.procs"), str(os.getpid()))
        for _ in range(100):
            try:
                os.rmdir(self.group)
                break
            except OSError:
                time.sleep(0.05)
        write(f"/sys/block/zram{self.idx}/reset", "1")
        write("/sys/class/zram-control/hot_remove", str(self.idx))


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def open_core(path: str, sched: str, depth: int, chunk: int) -> RawBlockCore:
    cfg = RawBlockCoreConfig(device_path=path, capacity_bytes=0, block_align=4096, header_bytes=4096,
                             slot_bytes=chunk + 4096, use_odirect=True, enable_zero_copy=True,
                             meta_total_bytes=4 * MiB, meta_magic=b"LMCIDX01", meta_version=1,
                             meta_checkpoint_interval_sec=60, meta_idle_quiet_ms=0, meta_enable_periodic=False,
                             meta_verify_on_load=False, load_checkpoint_on_init=False, io_engine="io_uring",
                             iouring_queue_depth=depth, allow_foreign_device=True, io_scheduler=sched)
    return RawBlockCore(cfg, key_namespace="object")


def one_round(path: str, sched: str, a: argparse.Namespace, arena: Arena, rnd: int) -> dict:
    core = open_core(path, sched, a.depth, a.chunk)
    try:
        keys = object_keys(4, tag=f"load{rnd}{sched}")
        objs = [arena.obj(i, 0x30 + i) for i in range(4)]
        assert core.put_many(keys, objs).results == [True] * 4
        dst = [arena.obj(4, 0)]

        def load(i: int) -> float:
            t0 = time.perf_counter()
            ok = core.load_many_into([keys[i % 4].encoded], dst)
            dt = time.perf_counter() - t0
            assert ok == [True]
            return dt

        idle = []
        for i in range(a.samples):
            idle.append(load(i))
            time.sleep(a.gap)
        stop = threading.Event()
        stored = [0]
        lock = threading.Lock()

        def writer(w: int) -> None:
            n = 0
            src = [arena.obj(5 + w * a.per_call + j, 0x60 + j) for j in range(a.per_call)]
            while not stop.is_set():
                ks = object_keys(a.per_call + n, tag=f"st{rnd}{sched}{w}")[n:]
                n += a.per_call
                r = core.put_many(ks, src)
                with lock:
                    stored[0] += sum(r.results) * a.chunk
                core.delete_many([k.encoded for k in ks])
                core.checkpoint_now()

        ts = [threading.Thread(target=writer, args=(w,)) for w in range(a.writers)]
        for t in ts:
            t.start()
        time.sleep(a.warm)
        st0, t0 = stored[0], time.perf_counter()
        busy = []
        for i in range(a.samples):
            busy.append(load(i))
            time.sleep(a.gap)
        rate = (stored[0] - st0) / (time.perf_counter() - t0)
        stop.set()
        for t in ts:
            t.join()
        io = core.report_status()["rust_io"]
        return {"sched": sched, "round": rnd, "idle_ms": [x * 1e3 for x in idle], "busy_ms": [x * 1e3 for x in busy],
                "store_MBps": rate / MB, "peak_write_inflight_bytes": io["peak_write_inflight_bytes"],
                "peak_read_inflight_bytes": io["peak_read_inflight_bytes"]}
    finally:
        core.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--read-mbps", type=int, default=200)
    p.add_argument("--write-mbps", type=int, default=100)
    p.add_argument("--chunk", type=int, default=8 * MiB)
    p.add_argument("--depth", type=int, default=32)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--per-call", type=int, default=4)
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--gap", type=float, default=0.05)
    p.add_argument("--warm", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    size = (8 + a.writers * a.per_call * 2) * (a.chunk + 4096) + 8 * MiB
    drive = Drive(size, a.read_mbps * MB, a.write_mbps * MB)
    arena = Arena(5 + a.writers * a.per_call, a.chunk)
    rows = []
    try:
        for rnd in range(a.rounds):
            for sched in ("fifo", "loads_first"):
                rows.append(one_round(drive.path, sched, a, arena, rnd))
    finally:
        drive.close()
    summary = {}
    for sched in ("fifo", "loads_first"):
        rs = [r for r in rows if r["sched"] == sched]
        idle = [x for r in rs for x in r["idle_ms"]]
        busy = [x for r in rs for x in r["busy_ms"]]
        summary[sched] = {"idle_p50_ms": pct(idle, 0.5), "idle_p99_ms": pct(idle, 0.99),
                          "busy_p50_ms": pct(busy, 0.5), "busy_p99_ms": pct(busy, 0.99),
                          "busy_p99_over_idle_p99": pct(busy, 0.99) / pct(idle, 0.99),
                          "store_MBps": sum(r["store_MBps"] for r in rs) / len(rs),
                          "peak_write_inflight_MiB": max(r["peak_write_inflight_bytes"] for r in rs) / MiB,
                          "peak_read_inflight_MiB": max(r["peak_read_inflight_bytes"] for r in rs) / MiB}
    out = {"settings": vars(a), "summary": summary, "rows": rows}
    for sched, s in summary.items():
        print(f"{sched:12s} " + "  ".join(f"{k}={v:.1f}" for k, v in s.items()))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"results-depth{a.depth}.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
