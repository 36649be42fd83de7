"""The ``limit`` part: our io_uring engine streaming against fio on the same file or device.

For each case (fio ``rw``, block size, queue depth) both run for the same time over the same
region with O_DIRECT: fio with ``--ioengine=io_uring``, ours with a ring of exactly that
depth and two batches kept in flight, so the ring never drains between batches. Rounds
alternate which one goes first; figures are medians. ``ratio`` is our throughput / fio's
(higher is better; 1.0 is what the kernel and the device give a bare C program).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import time
from typing import Any, Callable

from .common import MiB, aligned_buffer, fmt_size, interleave, median
from .target import settle

FIO_INSTALL = "fio not installed (apt-get install fio)"


def fio_command(path: str, rw: str, size: int, depth: int, region: int, seconds: float) -> list[str]:
    return [
        "fio", "--name=limit", f"--filename={path}", "--ioengine=io_uring", "--direct=1", f"--rw={rw}",
        f"--bs={size}", f"--iodepth={depth}", f"--size={region}", "--offset=0", "--numjobs=1", "--thread",
        "--time_based", f"--runtime={max(1, round(seconds * 1000))}ms", "--randrepeat=0", "--norandommap",
        "--output-format=json",
    ]


def parse_fio_json(text: str, rw: str) -> dict:
    """Bandwidth, IOPS and mean latency of job 0 out of fio's JSON output."""
    start = text.find("{")  # fio may print warnings before the JSON document
    if start < 0:
        raise ValueError("no JSON document in fio output")
    data = json.loads(text[start:])
    job = data["jobs"][0]
    if job.get("error"):
        raise ValueError(f"fio job error {job['error']}")
    side = job["write" if "write" in rw else "read"]
    lat = side.get("lat_ns") or side.get("clat_ns") or {}
    return {
        "bw_bytes": float(side["bw_bytes"]),
        "iops": float(side["iops"]),
        "lat_mean_us": float(lat["mean"]) / 1000 if lat.get("mean") is not None else None,
        "fio_version": data.get("fio version"),
    }


def run_fio(cmd: list[str], rw: str, run: Callable[..., subprocess.CompletedProcess]) -> dict:
    proc = run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise ValueError(f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:300]}")
    return parse_fio_json(proc.stdout, rw)


def stream(dev_cls: Any, path: str, rw: str, size: int, depth: int, region: int, seconds: float) -> float:
    """Our engine for *seconds*: batches several rings deep, two in flight; returns bytes/s."""
    per_batch = max(4 * depth, 16) if size >= MiB else max(16 * depth, 256)
    slots = max(1, region // size)
    if "rand" in rw:
        rng = random.Random(99)
        plans = [[rng.randrange(slots) * size for _ in range(per_batch)] for _ in range(16)]
    else:
        plans = [[((k * per_batch + i) % slots) * size for i in range(per_batch)]
                 for k in range(max(1, slots // per_batch))]
    arenas = [aligned_buffer(per_batch * size) for _ in range(2)]
    bufs = [[a[i * size:(i + 1) * size] for i in range(per_batch)] for a in arenas]
    lens = [size] * per_batch
    dev = dev_cls(path, True, use_odirect=True, io_engine="io_uring", iouring_queue_depth=depth)
    try:
        submit = dev.batched_write if "write" in rw else dev.batched_read
        done = 0
        t0 = time.perf_counter()
        inflight = [submit(plans[0], bufs[0], lens)]
        k = 1
        while inflight:
            if time.perf_counter() - t0 < seconds:
                inflight.append(submit(plans[k % len(plans)], bufs[k % 2], lens))
                k += 1
            _ok, errors = dev.wait_iouring(inflight.pop(0))
            if errors:
                raise RuntimeError(f"io_uring {rw} failed: {errors[:3]}")
            done += per_batch * size
        return done / (time.perf_counter() - t0)
    finally:
        dev.close()


def run_limit(path: str, ours_cls: Any, cases: list[tuple[str, int, int]], region: int, seconds: float,
              rounds: int, bar: Any, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> dict:
    """Each case: fio and our stream, interleaved over *rounds*; medians and ours / fio."""
    if shutil.which("fio") is None:
        return {"available": False, "error": FIO_INSTALL, "results": []}
    settle(path, region)
    rows: list[dict] = []
    errors: list[str] = []
    for rw, size, depth in cases:
        bar.set_description_str(f"limit {rw} {fmt_size(size)} qd{depth}")
        if size * depth > region:
            bar.update(1)
            continue
        cmd = fio_command(path, rw, size, depth, region, seconds)
        fio_runs: list[dict] = []

        def measure(name: str, _r: int) -> float:
            if name == "ours":
                return stream(ours_cls, path, rw, size, depth, region, seconds)
            fio_runs.append(run_fio(cmd, rw, run))
            return fio_runs[-1]["bw_bytes"]

        try:
            samples = interleave(["ours", "fio"], rounds, measure)
        except (OSError, RuntimeError, subprocess.SubprocessError, ValueError, KeyError) as exc:
            errors.append(f"{rw} {fmt_size(size)} qd{depth}: {type(exc).__name__}: {exc}")
            bar.update(1)
            continue
        ours, fio = median(samples["ours"]), median(samples["fio"])
        rows.append({"rw": rw, "size": size, "depth": depth, "rounds": rounds, "seconds": seconds,
                     "ours_bytes_per_s": ours, "fio_bytes_per_s": fio,
                     "ours_iops": ours / size, "fio_iops": fio / size,
                     "ratio": ours / fio if fio else None, "samples_bytes_per_s": samples,
                     "fio_lat_mean_us": median([r["lat_mean_us"] for r in fio_runs]),
                     "fio_version": fio_runs[0]["fio_version"], "fio_command": cmd})
        bar.update(1)
    return {"available": True, "errors": errors, "results": rows}
