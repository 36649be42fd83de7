# What a block device's discards cost buffered writes to other parts of it, without the product:
# discard-write-interference.c (built here with cc) run for each discard mode, interleaved, 3 runs
# each, under a kernel dirty limit of 256 MiB as in the latency harness, with this guest's free
# page reporting held (as the harness's --page-reporting hold). Root.
# Usage: PYTHONPATH=benchmarks python3 discard-write-interference.py DEVICE [ROUNDS]
import os, subprocess, sys, tempfile
from lmcache_rawblock_bench.extent_latency import dirty_limit, page_reporting

here = os.path.dirname(os.path.abspath(__file__))
dev = sys.argv[1]; rounds = sys.argv[2] if len(sys.argv) > 2 else "3"
exe = os.path.join(tempfile.mkdtemp(), "dwi")
subprocess.run(["cc", "-O2", "-pthread", "-o", exe, os.path.join(here, "discard-write-interference.c"), "-luring"],
               check=True)
modes = ("uring", "none", "ioctl")
res = {m: [] for m in modes}
with dirty_limit(256 << 20), page_reporting("hold"):
    for rep in range(3):
        for m in modes:
            out = subprocess.run([exe, dev, m, rounds], check=True, capture_output=True, text=True).stdout.split()
            p50, p99, mean = map(float, out[1:])
            res[m].append((p50, p99, mean))
            print(f"{dev} discards {m:5s}: 8 MiB buffered write p50 {p50:8.1f} us p99 {p99:8.1f} us mean {mean:8.1f} us",
                  flush=True)
for i, k in enumerate(("p50", "p99", "mean")):
    med = {m: sorted(r[i] for r in res[m])[1] for m in modes}
    print(f"median of 3 runs, {k}: " + ", ".join(f"{m} {med[m]:.1f} us" for m in modes)
          + f"; io_uring discards / none {med['uring'] / med['none']:.2f}, BLKDISCARD / none {med['ioctl'] / med['none']:.2f}")
