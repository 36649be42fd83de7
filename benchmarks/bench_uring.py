#!/usr/bin/env python3
"""io_uring engine benchmark: lmcache_rawblock against the Rust wheel and against fio.

Part A - batch latency, ours vs lmcache_rust_raw_block_io in the same process:
  256 x 4 KiB and 64 x 1 MiB batched_read / batched_write + wait_iouring, page cache and
  O_DIRECT, same file, same ring depth (256), same 4 KiB-aligned numpy buffers, same offsets.
  Repeats are interleaved (the order of the two engines alternates every round); the figure is
  the median per-batch time and the ratio ours/rust (targets: <= 0.7 for 4 KiB, <= 1.0 for 1 MiB).

Part B - physical limit, ours vs fio --ioengine=io_uring --direct=1 on the same file:
  1 MiB sequential reads and writes at queue depth 16 and 32 (target: >= 0.95x fio's bandwidth)
  and 4 KiB random reads at depth 64 (ratio reported). Our engine runs with a ring of exactly
  that depth and two batches kept in flight so the ring never drains between batches.

Usage: python3 benchmarks/bench_uring.py [--dir DIR] [--out benchmarks/results/uring.md]
The file is created in --dir (default: a temporary directory under the current directory,
which must be on a file system that supports O_DIRECT) and deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# numpy's OpenBLAS threads spin while idle: on a 2-core machine they steal a core from the I/O.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import lmcache_rawblock  # noqa: E402

try:
    import lmcache_rust_raw_block_io as rust  # type: ignore
except ImportError:  # pragma: no cover - reported in the output
    rust = None

KiB, MiB = 1024, 1024 * 1024


def aligned(n: int, align: int = 4096) -> np.ndarray:
    raw = np.empty(n + align, dtype=np.uint8)
    s = (align - raw.ctypes.data % align) % align
    return raw[s : s + n]


def make_file(path: str, size: int) -> None:
    chunk = np.random.default_rng(7).integers(0, 256, MiB, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        for _ in range(size // MiB):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def warm(path: str) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(8 * MiB):
            pass


def drop_dirty() -> None:
    os.sync()


def open_dev(mod, path, odirect, depth):
    return mod.RawBlockDevice(path, True, use_odirect=odirect, io_engine="io_uring", iouring_queue_depth=depth)


# --------------------------------------------------------------------------- part A


def batch_case(path, file_size, op, n, size, odirect, rounds, iters, sync_writes=True):
    rng = np.random.default_rng(1234 + n + size)
    slots = file_size // size
    offsets = [int(x) * size for x in rng.choice(slots, n, replace=False)]
    arena = aligned(n * size)
    arena[:] = 0x5A
    bufs = [arena[i * size : (i + 1) * size] for i in range(n)]
    lens = [size] * n
    engines = {"ours": lmcache_rawblock, "rust": rust}
    devs = {k: open_dev(m, path, odirect, 256) for k, m in engines.items()}
    samples: dict[str, list[float]] = {k: [] for k in devs}
    for dev in devs.values():  # warm-up: worker threads, io-wq, page cache
        for _ in range(2):
            fn = dev.batched_read if op == "read" else dev.batched_write
            ok, errs = dev.wait_iouring(fn(offsets, bufs, lens))
            assert not errs, errs[:3]
    for r in range(rounds):
        order = ["ours", "rust"] if r % 2 == 0 else ["rust", "ours"]
        for name in order:
            dev = devs[name]
            fn = dev.batched_read if op == "read" else dev.batched_write
            for _ in range(iters):
                t0 = time.perf_counter()
                ok, errs = dev.wait_iouring(fn(offsets, bufs, lens))
                samples[name].append(time.perf_counter() - t0)
                if errs or not all(ok):
                    raise RuntimeError(f"{name} {op} failed: {errs[:3]}")
        if op == "write" and not odirect and sync_writes:
            drop_dirty()  # keep writeback of one round out of the next one
    for dev in devs.values():
        dev.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "op": op,
        "batch": f"{n} x {size // KiB} KiB" if size < MiB else f"{n} x {size // MiB} MiB",
        "mode": "O_DIRECT" if odirect else "page cache",
        "ours_us": med["ours"] * 1e6,
        "rust_us": med["rust"] * 1e6,
        "ratio": med["ours"] / med["rust"],
        "target": 0.7 if size < MiB else 1.0,
        "samples": len(samples["ours"]),
    }


# --------------------------------------------------------------------------- part B


def ours_stream(path, file_size, op, bs, depth, seconds, random_offsets):
    """Keep the ring full for `seconds`: two batches in flight, each several rings deep."""
    per_batch = max(4 * depth, 16) if bs >= MiB else max(16 * depth, 256)
    dev = open_dev(lmcache_rawblock, path, True, depth)
    slots = file_size // bs
    rng = np.random.default_rng(99)
    arenas = [aligned(per_batch * bs) for _ in range(2)]
    bufs = [[a[i * bs : (i + 1) * bs] for i in range(per_batch)] for a in arenas]
    lens = [bs] * per_batch
    fn = dev.batched_read if op == "read" else dev.batched_write
    # Offsets are computed up front so the timed loop costs what an application's would.
    if random_offsets:
        plans = [[int(x) * bs for x in rng.integers(0, slots, per_batch)] for _ in range(16)]
    else:
        nplans = max(1, slots // per_batch)
        plans = [[((k * per_batch + i) % slots) * bs for i in range(per_batch)] for k in range(nplans)]
    plan_i = 0

    def next_offsets():
        nonlocal plan_i
        offs = plans[plan_i % len(plans)]
        plan_i += 1
        return offs

    inflight = []
    done_bytes = 0
    t0 = time.perf_counter()
    k = 0
    inflight.append(fn(next_offsets(), bufs[k % 2], lens))
    k += 1
    while True:
        if time.perf_counter() - t0 < seconds:
            inflight.append(fn(next_offsets(), bufs[k % 2], lens))
            k += 1
        if not inflight:
            break
        ok, errs = dev.wait_iouring(inflight.pop(0))
        if errs:
            raise RuntimeError(errs[:3])
        done_bytes += per_batch * bs
    elapsed = time.perf_counter() - t0
    dev.close()
    return {"bw_MiBps": done_bytes / elapsed / MiB, "iops": done_bytes / bs / elapsed}


def fio_stream(path, file_size, rw, bs, depth, seconds):
    cmd = [
        "fio", "--name=limit", f"--filename={path}", f"--size={file_size}", "--direct=1",
        f"--rw={rw}", f"--bs={bs}", "--ioengine=io_uring", f"--iodepth={depth}",
        f"--runtime={seconds}", "--time_based", "--group_reporting", "--output-format=json",
        "--randrepeat=0", "--norandommap",
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read"] if "read" in rw else job["write"]
    return {"bw_MiBps": side["bw_bytes"] / MiB, "iops": side["iops"], "cmd": shlex.join(cmd)}


def limit_case(path, file_size, name, op, rw, bs, depth, seconds, rounds, random_offsets):
    ours, fio = [], []
    fio_cmd = ""
    for r in range(rounds):
        first_ours = r % 2 == 0
        for which in ("ours", "fio") if first_ours else ("fio", "ours"):
            if which == "ours":
                ours.append(ours_stream(path, file_size, op, bs, depth, seconds, random_offsets))
            else:
                res = fio_stream(path, file_size, rw, bs, depth, seconds)
                fio_cmd = res.pop("cmd")
                fio.append(res)
    key = "iops" if bs < 64 * KiB else "bw_MiBps"
    o = statistics.median(x[key] for x in ours)
    f = statistics.median(x[key] for x in fio)
    return {
        "case": name,
        "metric": "IOPS" if key == "iops" else "MiB/s",
        "ours": o,
        "fio": f,
        "ratio": o / f,
        "target": 0.95 if bs >= MiB else None,
        "fio_cmd": fio_cmd,
        "rounds": rounds,
    }


# --------------------------------------------------------------------------- report


def sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"({e})"


def machine(path: str) -> dict:
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    return {
        "kernel": platform.release(),
        "os": "Debian " + sh("cat /etc/debian_version"),
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "memory": sh("free -g | awk '/Mem:/{print $2\" GiB\"}'"),
        "filesystem": sh(f"df -T {shlex.quote(os.path.dirname(path))} | awk 'NR==2{{print $2\" on \"$1}}'"),
        "python": platform.python_version(),
        "liburing": sh("dpkg-query -W -f='${Version}' liburing-dev"),
        "fio": sh("fio --version"),
        "rust_wheel": sh(f"{shlex.quote(sys.executable)} -m pip show lmcache-rust-raw-block-io 2>/dev/null | awk '/^Version/{{print $2}}'"),
        "lmcache_rawblock": lmcache_rawblock.__version__,
    }


def fmt_ratio(r, target, better_low=True):
    if target is None:
        return f"{r:.2f}"
    ok = r <= target if better_low else r >= target
    return f"{r:.2f} ({'meets' if ok else 'misses'} {'<=' if better_low else '>='} {target})"


def render(cmdline, mach, part_a, part_b) -> str:
    lines = ["# io_uring engine benchmark", "", "Command line:", "", "```", cmdline, "```", "", "Machine:", ""]
    lines += [f"- {k}: {v}" for k, v in mach.items()]
    lines += ["", "## A. Batch time, ours vs Rust wheel (median per batch, interleaved rounds)", ""]
    lines += ["| op | batch | mode | ours (us) | rust (us) | ours/rust | samples |", "|---|---|---|---:|---:|---|---:|"]
    for r in part_a:
        lines.append(
            f"| {r['op']} | {r['batch']} | {r['mode']} | {r['ours_us']:.0f} | {r['rust_us']:.0f} | "
            f"{fmt_ratio(r['ratio'], r['target'])} | {r['samples']} |"
        )
    lines += ["", "## B. Physical limit, ours vs fio (O_DIRECT, io_uring, median of rounds)", ""]
    lines += ["| case | metric | ours | fio | ours/fio |", "|---|---|---:|---:|---|"]
    for r in part_b:
        lines.append(
            f"| {r['case']} | {r['metric']} | {r['ours']:.0f} | {r['fio']:.0f} | "
            f"{fmt_ratio(r['ratio'], r['target'], better_low=False)} |"
        )
    if part_b:
        lines += ["", "fio command shape (per case the rw/bs/iodepth vary):", "", "```", part_b[0]["fio_cmd"], "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="directory for the test file (needs O_DIRECT)")
    ap.add_argument("--file-size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds for part A")
    ap.add_argument("--iters", type=int, default=10, help="batches per engine per round (part A)")
    ap.add_argument("--limit-seconds", type=int, default=4)
    ap.add_argument("--limit-rounds", type=int, default=3)
    ap.add_argument("--no-sync", action="store_true",
                    help="part A page-cache writes: do not sync between rounds (rewrites of dirty pages)")
    ap.add_argument("--skip-a", action="store_true")
    ap.add_argument("--skip-b", action="store_true")
    ap.add_argument("--out", default=None, help="write the markdown report here")
    ap.add_argument("--json", default=None, help="write raw results as JSON here")
    args = ap.parse_args()

    if rust is None and not args.skip_a:
        print("lmcache_rust_raw_block_io is not importable: pip install lmcache-rust-raw-block-io", file=sys.stderr)
        return 2
    if shutil.which("fio") is None and not args.skip_b:
        print("fio is not installed", file=sys.stderr)
        return 2

    tmpdir = tempfile.mkdtemp(prefix="bench_uring.", dir=args.dir or os.getcwd())
    path = os.path.join(tmpdir, "data.bin")
    file_size = args.file_size_mib * MiB
    part_a, part_b = [], []
    try:
        print(f"creating {file_size // MiB} MiB test file in {tmpdir}", flush=True)
        make_file(path, file_size)
        warm(path)
        mach = machine(path)
        if not args.skip_a:
            for odirect in (False, True):
                for op in ("read", "write"):
                    for n, size in ((256, 4 * KiB), (64, MiB)):
                        iters = args.iters if size < MiB else max(2, args.iters // 3)
                        r = batch_case(path, file_size, op, n, size, odirect, args.rounds, iters, not args.no_sync)
                        part_a.append(r)
                        print(
                            f"A {r['op']:5s} {r['batch']:12s} {r['mode']:10s} ours {r['ours_us']:9.0f} us "
                            f"rust {r['rust_us']:9.0f} us  ratio {r['ratio']:.2f} (target <= {r['target']})",
                            flush=True,
                        )
        if not args.skip_b:
            cases = [
                ("1 MiB seq read QD16", "read", "read", MiB, 16, False),
                ("1 MiB seq read QD32", "read", "read", MiB, 32, False),
                ("1 MiB seq write QD16", "write", "write", MiB, 16, False),
                ("1 MiB seq write QD32", "write", "write", MiB, 32, False),
                ("4 KiB rand read QD64", "read", "randread", 4 * KiB, 64, True),
            ]
            for name, op, rw, bs, depth, rnd in cases:
                r = limit_case(path, file_size, name, op, rw, bs, depth, args.limit_seconds, args.limit_rounds, rnd)
                part_b.append(r)
                print(
                    f"B {name:22s} ours {r['ours']:9.0f} fio {r['fio']:9.0f} {r['metric']}  ratio {r['ratio']:.2f}",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)

    cmdline = shlex.join(["python3", *sys.argv])
    report = render(cmdline, mach, part_a, part_b)
    print()
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": cmdline, "machine": mach, "batch": part_a, "limit": part_b}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
