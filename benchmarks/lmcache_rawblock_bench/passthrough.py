"""NVMe passthrough (io_uring_cmd) reads and writes, ours against LMCache's Rust device, on the
same namespace in one process.

    python -m lmcache_rawblock_bench.passthrough --device /dev/ng0n1 [--out DIR]

Cells: operation (write, read) x size (4 KiB, 1 MiB) x queue depth (1, 32). Queue depth d
means batches of d transfers submitted together and waited for together. Each cell runs
``--repeats`` rounds; in every round each implementation times ``--seconds`` worth of
batches, the order alternating between rounds; the figures are medians and the ratio is
ours / Rust per transfer (below 1: ours is faster).

The two are called as LMCache calls each: the Rust device takes no transfer larger than the
kernel's limit, so LMCache's core splits transfers into chunks of ``max_data_transfer_size``
in Python and submits the chunks; ours takes the whole transfer and splits it in C. Buffers
are page-aligned (no bounce on either side). Under emulation (QEMU TCG) absolute times say
little about a real SSD; the ratio says what each implementation adds per command.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

KiB = 1024
MiB = 1 << 20
SIZES = (4 * KiB, MiB)
DEPTHS = (1, 32)
OPS = ("write", "read")


def open_devices(path: str, depth: int) -> dict[str, Any]:
    from lmcache_rawblock import RawBlockDevice

    kw = dict(writable=True, use_odirect=False, alignment=4096, io_engine="io_uring", iouring_queue_depth=depth,
              use_uring_cmd=True)
    # Ours holds the device exclusively for the run (a core on it is refused); the Rust wheel's
    # device takes no lock and opens beside it.
    devs = {"ours": RawBlockDevice(path, **kw, lock="exclusive")}
    try:
        import lmcache_rust_raw_block_io as rust  # type: ignore[import-not-found]

        devs["rust"] = rust.RawBlockDevice(path, **kw)
    except ImportError:
        pass
    return devs


def batch_fn(name: str, dev: Any, op: str, size: int, depth: int, chunk: int, region: int) -> Callable[[int], None]:
    """A callable running batch number b: depth transfers of size bytes, as the caller would."""
    bufs = [mmap.mmap(-1, size) for _ in range(depth)]
    for i, b in enumerate(bufs):
        b[:] = bytes([(i * 7 + 1) & 0xFF]) * size
    slots = max(depth, region // size)
    split = name == "rust" and size > chunk
    if split:  # LMCache's core: chunk views of max_data_transfer_size, submitted together
        views = [memoryview(b) for b in bufs]
        pieces = [(j, p) for j in range(depth) for p in range(0, size, chunk)]
        lens = [min(chunk, size - p) for _, p in pieces]
        chunk_bufs = [views[j][p:p + ln] for (j, p), ln in zip(pieces, lens)]

    def run(b: int) -> None:
        base = [((b * depth + j) % slots) * size for j in range(depth)]
        if split:
            offs = [base[j] + p for j, p in pieces]
            bl, ls = chunk_bufs, lens
        else:
            offs, bl, ls = base, bufs, [size] * depth
        bid = dev.batched_write(offs, bl, ls) if op == "write" else dev.batched_read(offs, bl, ls)
        ok, errs = dev.wait_iouring(bid)
        if errs or not all(ok):
            raise RuntimeError(f"{name} {op} {size} x{depth}: {errs[:2]}")

    return run


def time_cell(run: Callable[[int], None], seconds: float) -> tuple[float, int]:
    """Seconds per batch over at least `seconds` of batches (and at least 3)."""
    n, t0 = 0, time.perf_counter()
    while True:
        run(n)
        n += 1
        el = time.perf_counter() - t0
        if n >= 3 and el >= seconds:
            return el / n, n


def measure(path: str, repeats: int, seconds: float, region: int) -> dict:
    from lmcache_rawblock import RawBlockDevice  # noqa: F401  (import cost outside the timing)

    rows = []
    for depth in DEPTHS:
        devs = open_devices(path, max(64, depth * 4))
        chunk = devs["ours"].max_data_transfer_size()
        try:
            for op in OPS:
                for size in SIZES:
                    fns = {n: batch_fn(n, d, op, size, depth, chunk, region) for n, d in devs.items()}
                    for f in fns.values():
                        f(0)  # warm: first touch of the buffers, the ring, the namespace region
                    per: dict[str, list[float]] = {n: [] for n in fns}
                    for r in range(repeats):
                        order = list(fns) if r % 2 == 0 else list(reversed(fns))
                        for n in order:
                            s, _ = time_cell(fns[n], seconds)
                            per[n].append(s / depth)
                    row = {"op": op, "size": size, "depth": depth, "chunk": chunk,
                           "us_per_transfer": {n: statistics.median(v) * 1e6 for n, v in per.items()},
                           "rounds": {n: [x * 1e6 for x in v] for n, v in per.items()}}
                    if "rust" in per:
                        row["ratio_ours_over_rust"] = statistics.median(per["ours"]) / statistics.median(per["rust"])
                    rows.append(row)
                    print(fmt_row(row), flush=True)
        finally:
            for d in devs.values():
                d.close()
    return {"device": path, "repeats": repeats, "seconds_per_round": seconds, "region_bytes": region,
            "kernel": platform.release(), "python": sys.version.split()[0], "rows": rows}


def fmt_row(row: dict) -> str:
    us = row["us_per_transfer"]
    size = f"{row['size'] // KiB} KiB" if row["size"] < MiB else f"{row['size'] // MiB} MiB"
    rust = f"{us['rust']:9.1f}" if "rust" in us else "      n/a"
    ratio = f"{row['ratio_ours_over_rust']:.2f}" if "ratio_ours_over_rust" in row else "n/a"
    return f"| {row['op']:5} | {size:>6} | {row['depth']:>2} | {us['ours']:9.1f} | {rust} | {ratio} |"


def markdown(res: dict, command: str) -> str:
    head = ("| op | size | QD | ours, us per transfer | Rust wheel, us | ours / Rust |\n"
            "|---|---|---|---|---|---|\n")
    lines = [fmt_row(r) for r in res["rows"]]
    return (f"# NVMe passthrough: ours against LMCache's Rust device\n\n"
            f"Command: `{command}`\n\n"
            f"Device {res['device']} (kernel {res['kernel']}, Python {res['python']}); "
            f"{res['repeats']} rounds of {res['seconds_per_round']} s per implementation and cell, "
            f"medians; transfer limit {res['rows'][0]['chunk'] if res['rows'] else '?'} bytes.\n\n"
            + head + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lmcache_rawblock_bench.passthrough", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", required=True, help="NVMe generic character device, e.g. /dev/ng0n1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.5, help="timed seconds per round and implementation")
    ap.add_argument("--region", type=int, default=256 * MiB, help="bytes at the start of the namespace used")
    ap.add_argument("--out", help="directory for passthrough.json and passthrough.md")
    a = ap.parse_args(argv)
    if not os.path.exists(a.device):
        ap.error(f"--device {a.device!r} does not exist")
    res = measure(a.device, a.repeats, a.seconds, a.region)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        cmd = "python -m lmcache_rawblock_bench.passthrough " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(os.path.join(a.out, "passthrough.json"), "w") as f:
            json.dump(res, f, indent=1)
        with open(os.path.join(a.out, "passthrough.md"), "w") as f:
            f.write(markdown(res, cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
