"""One passthrough request of 4x the transfer limit against one of 1x, per scheduler, beside
LMCache's Rust device: does a request past the limit keep its commands in flight together?

Run in the NVMe guest (tools/nvme_guest/rig.py) on /dev/ng0n1. For each implementation (ours
with io_scheduler fifo, ours with loads_first, the Rust wheel's RawBlockDevice when it imports:
LMCache's core splits a request past the limit into views submitted in one batch) and each
operation, one request at a time of 1x and 4x the kernel's transfer limit, interleaved, median
seconds per request; the figure is t(4x) / t(1x) (1.0: the four commands ran as one; 4.0: one
after another). Writes a JSON file with --out.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time
from typing import Any, Callable


def open_dev(impl: str, path: str) -> Any:
    kw = dict(writable=True, use_odirect=False, alignment=4096, io_engine="io_uring", iouring_queue_depth=64,
              use_uring_cmd=True)
    if impl == "rust":
        import lmcache_rust_raw_block_io as rust  # type: ignore[import-not-found]

        return rust.RawBlockDevice(path, **kw)
    from lmcache_rawblock import RawBlockDevice

    return RawBlockDevice(path, **kw, io_scheduler=impl.split(":")[1])


def request_fn(impl: str, dev: Any, op: str, n: int, limit: int, off: int) -> Callable[[], None]:
    buf = mmap.mmap(-1, n)
    buf[:] = bytes([7]) * n
    if impl == "rust" and n > limit:  # LMCache's core: views of the limit, one batch
        view = memoryview(buf)
        offs = [off + p for p in range(0, n, limit)]
        bufs = [view[p:p + limit] for p in range(0, n, limit)]
        lens = [limit] * len(bufs)
    else:
        offs, bufs, lens = [off], [buf], [n]

    def run() -> None:
        bid = dev.batched_write(offs, bufs, lens) if op == "write" else dev.batched_read(offs, bufs, lens)
        ok, errs = dev.wait_iouring(bid)
        if errs or not all(ok):
            raise RuntimeError(f"{impl} {op} {n}: {errs[:2]}")

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="/dev/ng0n1")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    impls = ["ours:fifo", "ours:loads_first"]
    try:
        import lmcache_rust_raw_block_io  # noqa: F401  # type: ignore[import-not-found]

        impls.append("rust")
    except ImportError:
        print("the Rust wheel does not import here: ours only", file=sys.stderr)
    import lmcache_rawblock

    probe = open_dev("ours:fifo", a.device)
    limit = probe.max_data_transfer_size()
    probe.close()
    rows = []
    for op in ("write", "read"):
        devs = {i: open_dev(i, a.device) for i in impls}
        fns = {(i, k): request_fn(i, devs[i], op, k * limit, limit, (64 << 20) + k * (16 << 20))
               for i in impls for k in (1, 4)}
        for f in fns.values():
            f()
        times: dict[tuple[str, int], list[float]] = {key: [] for key in fns}
        for r in range(a.reps):
            order = list(fns) if r % 2 == 0 else list(reversed(fns))
            for key in order:
                t0 = time.perf_counter()
                fns[key]()
                times[key].append(time.perf_counter() - t0)
        for i in impls:
            t1, t4 = statistics.median(times[(i, 1)]), statistics.median(times[(i, 4)])
            rows.append({"impl": i, "op": op, "limit": limit, "t1x_ms": t1 * 1e3, "t4x_ms": t4 * 1e3,
                         "ratio": t4 / t1})
            print(f"{op:5s} {i:18s} 1x {t1 * 1e3:7.2f} ms  4x {t4 * 1e3:7.2f} ms  ratio {t4 / t1:.2f}")
        for d in devs.values():
            d.close()
    out = {"device": a.device, "limit": limit, "reps": a.reps, "rows": rows,
           "ours": lmcache_rawblock.__file__, "kernel": os.uname().release}
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "passthrough_split.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
