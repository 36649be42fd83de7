"""What the durability flushes cost a checkpoint: the same checkpoint with and without them.

Each round puts a batch of new payloads (what a checkpoint interval writes), then checkpoints;
rounds alternate between flushes on (the product) and off (the `_set_checkpoint_no_flush`
benchmark hook) on the same core, so both see the same machine. Reports median wall and CPU
time per checkpoint and the ratio.

    python3 benchmarks/bench_ckpt_flush.py [--entries 1000 10000] [--rounds 9] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from core_helpers import Obj, make_core, okey  # noqa: E402

MiB = 1 << 20
SLOT = 128 * 1024
BATCH, PAYLOAD = 64, 64 * 1024


def run(medium: str, engine: str, odirect: bool, entries: int, rounds: int, workdir: str) -> dict:
    dev = os.path.join(workdir, "dev.img")
    size = 256 * MiB + (entries + BATCH * (rounds * 2 + 2)) * SLOT
    with open(dev, "wb") as f:
        f.truncate(size)
    c = make_core(dev, io_engine=engine, use_odirect=odirect, slot_bytes=SLOT, meta_total_bytes=256 * MiB,
                  enable_zero_copy=True)
    try:
        for lo in range(0, entries, 256):
            keys = [okey(i) for i in range(lo, min(entries, lo + 256))]
            c.put_many(keys, [Obj(4096) for _ in keys])
        c.checkpoint_now()
        body = Obj(PAYLOAD)
        res = {True: [], False: []}
        nxt = entries
        for r in range(rounds * 2):
            flush = r % 2 == 0
            c._native._set_checkpoint_no_flush(not flush)
            keys = [okey(nxt + i) for i in range(BATCH)]
            nxt += BATCH
            assert c.put_many(keys, [body] * BATCH).results == [True] * BATCH
            w, t = time.perf_counter(), time.process_time()
            c.checkpoint_now()
            res[flush].append((time.perf_counter() - w, time.process_time() - t))
            c.delete_many([k.encoded for k in keys])
        flushes = c.report_status()["device_flushes"]
    finally:
        c._native._set_checkpoint_no_flush(False)
        c.close()
        os.unlink(dev)
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
    return {"medium": medium, "entries": entries, "on": med[True], "off": med[False], "flushes": flushes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--out")
    a = ap.parse_args()
    media = [("page cache, posix", "posix", False), ("page cache, io_uring", "io_uring", False),
             ("O_DIRECT, posix", "posix", True), ("O_DIRECT, io_uring", "io_uring", True)]
    lines = ["| medium | entries | checkpoint with flushes (ms, wall / CPU) | without (ms, wall / CPU) "
             "| wall ratio |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        for n in a.entries:
            for name, engine, odirect in media:
                r = run(name, engine, odirect, n, a.rounds, d)
                on, off = r["on"], r["off"]
                lines.append(f"| {name} | {n:,} | {on[0]*1e3:.2f} / {on[1]*1e3:.2f} | {off[0]*1e3:.2f} / "
                             f"{off[1]*1e3:.2f} | {on[0] / off[0]:.2f}x |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
