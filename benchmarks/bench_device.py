#!/usr/bin/env python3
"""Device benchmark: per-call time of pread_into / pwrite_from_buffer, ours against the Rust wheel.

4 KiB and 1 MiB, buffered and O_DIRECT, on a sparse file in a temporary directory (or
--file). Both implementations run in this one process, alternating inside every repeat
round; each figure is the median over the rounds, and the whole sequence is run --runs
times (the reported figure is the median of the per-run medians, with the per-run ratio
range beside it). Targets: ours <= 0.8x Rust's time per 4 KiB call, <= 1.0x at 1 MiB.

    python3 benchmarks/bench_device.py                      # prints the table
    python3 benchmarks/bench_device.py --md benchmarks/results/device.md --json benchmarks/results/device.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lmcache_rawblock.bench import common, device  # noqa: E402
from lmcache_rawblock.bench.target import TargetError, open_target, prefill  # noqa: E402

TARGETS = {4 << 10: 0.8, 1 << 20: 1.0}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="independent runs of the whole sequence (default 3)")
    p.add_argument("--repeats", type=int, default=15, help="interleaved rounds per cell and run (default 15)")
    p.add_argument("--batch-ms", type=float, default=40.0, help="wall time of one timed batch (default 40 ms)")
    p.add_argument("--size", default="1G", help="size of the temporary sparse file (default 1G)")
    p.add_argument("--file", help="use this pre-sized scratch file instead of a temporary one (overwritten)")
    p.add_argument("--md", help="write the markdown report here")
    p.add_argument("--json", help="write the raw results here")
    p.add_argument("--notes", help="markdown file appended to the report (analysis written by hand)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    argv_full = [os.path.basename(sys.executable), *sys.argv] if argv is None else ["bench_device.py", *argv]
    comps = [common.ours(), common.rust()]
    if not comps[1].available:
        print(f"error: the Rust wheel is needed for ratios: {comps[1].error}; "
              f"{sys.executable} -m pip install {common.RUST_DIST}", file=sys.stderr)
        return 2
    try:
        target = open_target(args.file, common.parse_size(args.size) if not args.file else None)
    except (TargetError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = device.SuiteSettings(
        name="bench_device", sizes=sorted(TARGETS), repeats=args.repeats,
        target_batch_s=args.batch_ms / 1000, min_calls=5, max_calls=200000,
        region=min(256 * common.MiB, target.size),
    )
    t0 = time.perf_counter()
    runs: list[list[dict]] = []
    target_desc = target.describe()
    with target:
        prefill(target.path, settings.region)
        for i in range(args.runs):
            with common.progress(device.sync_steps(settings), f"run {i + 1}/{args.runs}",
                                 enabled=not args.no_progress) as bar:
                res = device.run_sync(target.path, comps, settings, bar)
            if res["errors"]:
                print(f"error: {res['errors']}", file=sys.stderr)
                return 1
            runs.append(res["results"])
    elapsed = time.perf_counter() - t0

    rows = summarize(runs)
    machine = common.machine_info(argv_full)
    md = markdown(rows, machine, settings, args, target_desc, elapsed)
    if args.notes:
        md += "\n" + Path(args.notes).read_text(encoding="utf-8")
    print(md)
    if args.md:
        Path(args.md).write_text(md, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "settings": settings.describe(),
                                               "runs": args.runs, "rows": rows, "raw": runs},
                                              indent=2) + "\n", encoding="utf-8")
    return 0


def verdict(r: float | None, run_ratios: list[float], target: float) -> str:
    """met / not met, or 'parity within noise' when the runs fall on both sides of the target."""
    if r is None:
        return "-"
    if r <= target:
        return "yes" if max(run_ratios) <= target or len(run_ratios) < 2 else "yes (within noise)"
    if min(run_ratios) <= target:
        return "no (within run-to-run noise)"
    return "**no**"


def summarize(runs: list[list[dict]]) -> list[dict]:
    rows = []
    for cells in zip(*runs):
        first = cells[0]
        ours_s = common.median([c["ours_s"] for c in cells])
        rust_s = common.median([c["rust_s"] for c in cells])
        ratios = [c["ratio"] for c in cells]
        target = TARGETS[first["size"]]
        r = common.ratio(ours_s, rust_s)
        rows.append({
            "op": first["op"], "mode": first["mode"], "size": first["size"], "calls": first["calls"],
            "ours_us": ours_s * 1e6, "rust_us": rust_s * 1e6, "ratio": r,
            "run_ratios": ratios, "target": target, "met": r is not None and r <= target,
            "verdict": verdict(r, ratios, target),
            "max_spread": max(max(c["ours_spread"] or 0, c["rust_spread"] or 0) for c in cells),
        })
    return rows


def build_info() -> str:
    """Which lmcache_rawblock the figures belong to: commit, dirty csrc, build time of the .so."""
    import subprocess

    import lmcache_rawblock._native as native

    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "csrc"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head, dirty = "", ""
    built = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.path.getmtime(native.__file__)))
    state = f"commit {head or '?'}" + (" with uncommitted csrc/ changes" if dirty else "")
    return f"lmcache_rawblock {state}, extension built {built} UTC"


def markdown(rows, machine, settings, args, target, elapsed) -> str:
    cmd = " ".join(shlex.quote(a) for a in machine["command"])
    mem = machine["memory_bytes"] / common.GiB if machine["memory_bytes"] else 0
    out = [
        "# Device benchmark: lmcache_rawblock vs lmcache-rust-raw-block-io",
        "",
        f"Command: `{cmd}`",
        "",
        f"- When: {machine['timestamp']}",
        f"- Machine: {machine['os']} (debian {machine['debian_version']}), kernel {machine['kernel']}, "
        f"{machine['cpu_model']}, {machine['cores']} cores, {mem:.0f} GiB RAM (shared with other jobs)",
        f"- Python {machine['python']}; lmcache-rawblock {machine['packages']['lmcache-rawblock']}, "
        f"lmcache-rust-raw-block-io {machine['packages'][common.RUST_DIST]}",
        f"- Build: {build_info()}",
        f"- Target: {target['kind']} on {'the temporary directory' if target['temporary'] else target['path']}, "
        f"{common.fmt_size(target['size_bytes'])}, {common.fmt_size(settings.region)} region prefilled; "
        "offsets walk on through the region batch after batch",
        f"- Method: both implementations in one process; {args.runs} runs x {settings.repeats} rounds per cell, "
        f"implementations alternate order every round; a round times one batch of `calls` calls "
        f"(~{settings.target_batch_s * 1000:.0f} ms) through the same Python loop; "
        "figure = median over runs of the per-run median time per call",
        f"- Total time: {elapsed:.0f} s",
        "",
        "Ratio = ours / rust time per call (lower is better). \"within noise\": the per-run ratios "
        "fall on both sides of the target.",
        "",
        "| op | mode | size | calls | ours µs | rust µs | ratio | per-run ratios | target | met? |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['op']} | {r['mode']} | {common.fmt_size(r['size'])} | {r['calls']} | {r['ours_us']:.2f} | "
            f"{r['rust_us']:.2f} | {r['ratio']:.3f} | {', '.join(f'{x:.2f}' for x in r['run_ratios'])} | "
            f"≤ {r['target']:.1f} | {r['verdict']} |"
        )
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
