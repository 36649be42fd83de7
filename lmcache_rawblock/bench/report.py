"""Terminal tables, results.json and PNG plots of a benchmark run."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import IO, Any, Sequence

from .common import fmt_rate, fmt_ratio, fmt_size, fmt_us, machine_summary

NOISY = 0.25  # relative IQR above which a cell is flagged as noisy


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """A plain aligned text table."""
    right = right or [False] * len(headers)
    widths = [len(h) for h in headers]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if rj else c.ljust(w) for c, w, rj in zip(cells, widths, right)).rstrip()

    out = [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def _noisy(*spreads: float | None) -> str:
    return " ~" if any(s is not None and s > NOISY for s in spreads) else ""


def device_rows(device: dict) -> list[list[str]]:
    rows = []
    for r in device.get("results", []):
        rows.append([
            r["op"], r["mode"], fmt_size(r["size"]), str(r["calls"]),
            fmt_us(r["ours_s"]), fmt_us(r["rust_s"]),
            fmt_ratio(r["ratio"]) + _noisy(r.get("ours_spread"), r.get("rust_spread")),
            _pct(r.get("ours_fraction_of_fio")),
        ])
    return rows


def uring_rows(uring: dict) -> list[list[str]]:
    rows = []
    for r in uring.get("results", []):
        rows.append([
            r["op"], fmt_size(r["size"]), str(r["depth"]),
            fmt_rate(r.get("ours_bytes_per_s")), fmt_rate(r.get("rust_bytes_per_s")),
            fmt_ratio(r.get("ratio")) + _noisy(r.get("ours_spread"), r.get("rust_spread")),
            fmt_rate(r.get("fio_bytes_per_s")),
            _pct(r.get("ours_fraction_of_fio")), _pct(r.get("rust_fraction_of_fio")),
        ])
    return rows


def print_summary(results: dict, file: IO[str] | None = None) -> None:
    out = file or sys.stdout
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p("")
    p(f"lmcache_rawblock bench --suite {results['settings']['suite']}")
    p(f"machine: {machine_summary(results['machine'])}")
    t = results["target"]
    p(f"target:  {t['path']} ({t['kind']}, {fmt_size(t['size_bytes'])}, region used "
      f"{fmt_size(results['settings']['region_bytes'])})")
    for c in results["competitors"].values():
        if c["available"]:
            p(f"{c['name']:>5}: {c['distribution']} {c['version'] or ''}".rstrip())
        else:
            how = f" -- add it with: {c['install']}" if c.get("install") else ""
            p(f"{c['name']:>5}: {c['distribution']} not installed{how}" if c.get("install")
              else f"{c['name']:>5}: unavailable: {c['error']}")
    for note in results.get("notes", []):
        p(f"note: {note}")

    device = results.get("device")
    if device is not None:
        p("")
        p(f"Device suite: time per call in µs (median of {results['settings']['repeats']} interleaved rounds); "
          "ratio = ours/rust time, lower is better")
        for k, v in device.get("errors", {}).items():
            p(f"  {k}: {v}")
        if device["results"]:
            p(table(["op", "mode", "size", "calls", "ours µs", "rust µs", "ratio", "of fio qd1"],
                    device_rows(device), [False, False, True, True, True, True, True, True]))
    uring = results.get("uring")
    if uring is not None:
        p("")
        p("io_uring batched throughput, O_DIRECT (batched_write/batched_read + wait_iouring); "
          "ratio = ours/rust time")
        for name, err in uring.get("errors", {}).items():
            p(f"  {name}: {err}")
        if uring["results"]:
            p(table(["op", "size", "depth", "ours", "rust", "ratio", "fio", "ours/fio", "rust/fio"],
                    uring_rows(uring), [False, True, True, True, True, True, True, True, True]))
    limit = results.get("limit")
    if limit is not None:
        p("")
        if not limit.get("available"):
            p(f"limit (fio): {limit.get('error')}")
        else:
            p("limit: fio --ioengine=io_uring --direct=1, sequential, same file/region/block sizes "
              f"(best of {limit.get('passes', 1)} passes, run after the other parts: fractions are indicative)")
            for e in limit.get("errors", []):
                p(f"  {e}")
            rows = [[r["rw"], fmt_size(r["size"]), str(r["depth"]), fmt_rate(r["bw_bytes"]),
                     f"{r['iops']:,.0f}", "-" if r["lat_mean_us"] is None else f"{r['lat_mean_us']:.1f}"]
                    for r in limit["results"]]
            if rows:
                p(table(["rw", "size", "depth", "bandwidth", "IOPS", "lat µs"], rows,
                        [False, True, True, True, True, True]))
    if any(" ~" in r[6] for r in device_rows(device or {})) or any(" ~" in r[5] for r in uring_rows(uring or {})):
        p("")
        p(f"~ marks cells whose rounds spread by more than {NOISY:.0%} (IQR/median): rerun for firmer figures")
    p("")
    p(f"elapsed: {results.get('elapsed_s', 0):.1f} s")


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(results: dict, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "results.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(_clean(results), f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def write_plots(results: dict, out_dir: str) -> tuple[list[str], str | None]:
    """Write PNG plots; returns (files, note). The note says why plots were skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "matplotlib is not installed: plots skipped (pip install matplotlib)"
    os.makedirs(out_dir, exist_ok=True)
    files: list[str] = []
    rows = (results.get("device") or {}).get("results", [])
    if rows:
        files.append(_plot_latency(plt, rows, out_dir))
        if any(r.get("ratio") is not None for r in rows):
            files.append(_plot_ratio(plt, rows, out_dir))
    urows = (results.get("uring") or {}).get("results", [])
    if urows:
        files.append(_plot_uring(plt, urows, out_dir))
    return files, None


def _plot_latency(plt: Any, rows: list[dict], out_dir: str) -> str:
    ops = sorted({r["op"] for r in rows})
    fig, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for mode, style in (("buffered", "-"), ("odirect", "--")):
            sel = sorted((r for r in rows if r["op"] == op and r["mode"] == mode), key=lambda r: r["size"])
            if not sel:
                continue
            xs = [r["size"] for r in sel]
            for impl, marker in (("ours", "o"), ("rust", "s")):
                ys = [r[f"{impl}_s"] * 1e6 if r[f"{impl}_s"] else float("nan") for r in sel]
                if all(math.isnan(y) for y in ys):
                    continue
                ax.plot(xs, ys, style, marker=marker, label=f"{impl} posix {mode}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["size"] for r in rows}))
        ax.set_xticklabels([fmt_size(s) for s in sorted({r["size"] for r in rows})])
        ax.set_xlabel("transfer size")
        ax.set_ylabel("time per call (µs, median)")
        ax.set_title(op)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Per-call latency vs size (lower is better)")
    fig.tight_layout()
    path = os.path.join(out_dir, "latency_vs_size.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_ratio(plt: Any, rows: list[dict], out_dir: str) -> str:
    sel = [r for r in rows if r.get("ratio") is not None]
    labels = [f"{r['op'].split('_')[0]} {r['mode'][:4]} {fmt_size(r['size'])}" for r in sel]
    vals = [r["ratio"] for r in sel]
    colors = ["tab:green" if v <= 1.0 else "tab:red" for v in vals]
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(sel) + 2), 4.5))
    ax.bar(range(len(sel)), vals, color=colors)
    ax.axhline(1.0, color="black", linewidth=1, label="parity")
    ax.axhline(0.8, color="tab:blue", linewidth=1, linestyle="--", label="4 KiB target 0.8x")
    ax.set_xticks(range(len(sel)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("ours / rust time per call")
    ax.set_title("Time ratio ours/rust (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "ratio.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_uring(plt: Any, rows: list[dict], out_dir: str) -> str:
    ops = sorted({r["op"] for r in rows})
    fig, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for depth in sorted({r["depth"] for r in rows}):
            sel = sorted((r for r in rows if r["op"] == op and r["depth"] == depth), key=lambda r: r["size"])
            xs = [r["size"] for r in sel]
            for key, label, style in (("ours_bytes_per_s", "ours", "-o"), ("rust_bytes_per_s", "rust", "-s"),
                                      ("fio_bytes_per_s", "fio", ":^")):
                ys = [(r.get(key) or float("nan")) / (1 << 20) for r in sel]
                if all(math.isnan(y) for y in ys):
                    continue
                ax.plot(xs, ys, style, label=f"{label} qd{depth}")
        ax.set_xscale("log", base=2)
        sizes = sorted({r["size"] for r in rows})
        ax.set_xticks(sizes)
        ax.set_xticklabels([fmt_size(s) for s in sizes])
        ax.set_xlabel("block size")
        ax.set_ylabel("MiB/s (median)")
        ax.set_title(f"io_uring {op}, O_DIRECT")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "uring_throughput.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
