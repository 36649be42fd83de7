"""The ``limit`` suite: what fio gets out of the same file with io_uring and O_DIRECT.

fio runs sequential reads and writes over the same region of the same target, at the
same block sizes, at depth 1 (the limit for one synchronous O_DIRECT call at a time) and at
the io_uring suite's depths. ``attach_fractions`` then adds ``*_fraction_of_fio`` to the
device and io_uring rows: our throughput divided by fio's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any, Callable

from .common import fmt_size
from .target import settle

FIO_RW = {"read": "read", "write": "write"}
# Which fio direction bounds which of our operations.
OP_RW = {
    "pread_into": "read",
    "pwrite_from_buffer": "write",
    "batched_read": "read",
    "batched_write": "write",
}


def fio_command(path: str, rw: str, size: int, depth: int, region: int, runtime_s: float | None) -> list[str]:
    cmd = [
        "fio",
        "--name=limit",
        f"--filename={path}",
        "--ioengine=io_uring",
        "--direct=1",
        f"--rw={rw}",
        f"--bs={size}",
        f"--iodepth={depth}",
        f"--size={region}",
        "--offset=0",
        "--numjobs=1",
        "--thread",
        "--output-format=json",
    ]
    if runtime_s is None:
        cmd.append(f"--io_size={region}")
    else:
        cmd += ["--time_based", f"--runtime={max(1, round(runtime_s))}"]
    return cmd


def parse_fio_json(text: str, rw: str) -> dict:
    """Pull bandwidth, IOPS and mean latency of job 0 out of fio's JSON output."""
    start = text.find("{")  # fio may print warnings before the JSON document
    if start < 0:
        raise ValueError("no JSON document in fio output")
    data = json.loads(text[start:])
    job = data["jobs"][0]
    if job.get("error"):
        raise ValueError(f"fio job error {job['error']}")
    side = job[rw]
    lat = side.get("lat_ns") or side.get("clat_ns") or {}
    return {
        "bw_bytes": float(side["bw_bytes"]),
        "iops": float(side["iops"]),
        "lat_mean_us": float(lat["mean"]) / 1000 if lat.get("mean") is not None else None,
        "io_bytes": int(side.get("io_bytes", 0)),
        "fio_version": data.get("fio version"),
    }


def run_limit(
    path: str,
    sizes: list[int],
    depths: list[int],
    region: int,
    runtime_s: float | None,
    bar: Any,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    passes: int = 1,
) -> dict:
    """Run every fio job *passes* times (alternately forwards and backwards through the
    jobs) and keep each job's best pass: the limit is what fio *can* reach, and a shared
    virtual disk has stretches where it reaches much less."""
    if shutil.which("fio") is None:
        return {"available": False, "error": "fio not installed (apt-get install fio)", "results": []}
    jobs = [(size, depth, rw) for size in sizes for depth in depths for rw in ("write", "read")]
    best: dict[tuple, dict] = {}
    seen: dict[tuple, list[float]] = {}
    errors: list[str] = []
    settle(path, region)
    for p in range(passes):
        for size, depth, rw in jobs if p % 2 == 0 else jobs[::-1]:
            bar.set_description_str(f"fio {rw} {fmt_size(size)} qd{depth}")
            if size * depth > region or size > region:
                bar.update(1)
                continue
            cmd = fio_command(path, rw, size, depth, region, runtime_s)
            try:
                proc = run(cmd, capture_output=True, text=True, timeout=120)
                if proc.returncode != 0:
                    raise ValueError(f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:300]}")
                parsed = parse_fio_json(proc.stdout, rw)
            except (OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
                errors.append(f"fio {rw} bs={size} iodepth={depth}: {exc}")
                bar.update(1)
                continue
            key = (size, depth, rw)
            seen.setdefault(key, []).append(parsed["bw_bytes"])
            if key not in best or parsed["bw_bytes"] > best[key]["bw_bytes"]:
                best[key] = {"rw": rw, "size": size, "depth": depth, "command": cmd, **parsed}
            bar.update(1)
    rows = []
    for key in jobs:
        if key in best:
            rows.append({**best[key], "passes_bw_bytes": seen[key]})
    return {"available": True, "passes": passes, "errors": errors, "results": rows}


def limit_steps(sizes: list[int], depths: list[int], passes: int = 1) -> int:
    return len(sizes) * len(depths) * 2 * passes


def limit_depths(uring_depths: list[int]) -> list[int]:
    return sorted({1, *uring_depths})


def attach_fractions(results: dict) -> None:
    """Add fio throughput and our fraction of it to device (O_DIRECT, depth 1) and io_uring rows."""
    limit = results.get("limit") or {}
    fio = {(r["rw"], r["size"], r["depth"]): r["bw_bytes"] for r in limit.get("results", [])}
    if not fio:
        return
    for row in (results.get("device") or {}).get("results", []):
        if row.get("mode") != "odirect":
            continue
        _attach(row, fio.get((OP_RW[row["op"]], row["size"], 1)), depth=1)
    for row in (results.get("uring") or {}).get("results", []):
        _attach(row, fio.get((OP_RW[row["op"]], row["size"], row["depth"])), depth=row["depth"])


def _attach(row: dict, fio_bw: float | None, depth: int) -> None:
    row["fio_depth"] = depth
    row["fio_bytes_per_s"] = fio_bw
    for name in ("ours", "rust"):
        mine = row.get(f"{name}_bytes_per_s")
        row[f"{name}_fraction_of_fio"] = mine / fio_bw if mine and fio_bw else None
