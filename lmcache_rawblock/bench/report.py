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
              f"({'best of ' + str(limit['passes']) + ' passes' if limit.get('passes', 1) > 1 else 'one pass'}, "
              "run after the other parts: fractions are indicative)")
            for e in limit.get("errors", []):
                p(f"  {e}")
            rows = [[r["rw"], fmt_size(r["size"]), str(r["depth"]), fmt_rate(r["bw_bytes"]),
                     f"{r['iops']:,.0f}", "-" if r["lat_mean_us"] is None else f"{r['lat_mean_us']:.1f}"]
                    for r in limit["results"]]
            if rows:
                p(table(["rw", "size", "depth", "bandwidth", "IOPS", "lat µs"], rows,
                        [False, True, True, True, True, True]))
    core = results.get("core")
    if core is not None:
        p("")
        print_core(core, p)
    seeds = results.get("seeds")
    if seeds is not None:
        p("")
        print_seeds(seeds, p)
    trows = targets(results)
    if trows:
        p("")
        p("Targets of the issues measured in this run:")
        p(table(["issue", "target", "measured", "met?", "where"],
                [[t["issue"], t["target"], t["measured"], t["met"], t["where"]] for t in trows]))
    if any(" ~" in r[6] for r in device_rows(device or {})) or any(" ~" in r[5] for r in uring_rows(uring or {})):
        p("")
        p(f"~ marks cells whose rounds spread by more than {NOISY:.0%} (IQR/median): rerun for firmer figures")
    p("")
    p(f"elapsed: {results.get('elapsed_s', 0):.1f} s")


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _t(sec: float | None) -> str:
    if sec is None:
        return "-"
    if sec < 1e-3:
        return f"{sec * 1e6:.1f} µs"
    if sec < 1:
        return f"{sec * 1e3:.2f} ms"
    return f"{sec:.2f} s"


def print_core(core: dict, p: Any) -> None:
    comps = core.get("competitors", [])
    p("Core suite: RawBlockCore, ours vs LMCache's (" + ("both" if "lmcache" in comps else "LMCache not installed")
      + f"), median of {core['settings']['repeats']} interleaved rounds; speed-up = LMCache time / our time, "
      "higher is better")
    for k, v in core.get("errors", {}).items():
        p(f"  {k}: {v}")
    rows = [[r["op"], f"{r['entries']:,}", r["engine"], _t(r["ours_s"]), _t(r["lmcache_s"]),
             _t(r["ours_per_key_s"]), _x(r["speedup"])] for r in core.get("rows", [])]
    if rows:
        p(table(["op", "entries", "engine", "ours", "LMCache", "ours/key", "speed-up"], rows,
                [False, True, False, True, True, True, True]))
    for ix in core.get("index", []):
        if ix.get("bytes_per_entry_without_keys") is not None:
            p(f"index memory ({ix['engine']}, {ix['entries']:,} entries): "
              f"{ix['bytes_per_entry_without_keys']:.1f} bytes/entry + key bytes")
    cpu = [[r["op"], r["engine"], _t(r["ours_cpu_per_key_s"]), _t(r["lmcache_cpu_per_key_s"]), _x(r["speedup"])]
           for r in core.get("cpu", [])]
    if cpu:
        p("per-key CPU (process_time), 64 x 64 KiB:")
        p(table(["op", "engine", "ours/key", "LMCache/key", "speed-up"], cpu, [False, False, True, True, True]))


def print_seeds(seeds: dict, p: Any) -> None:
    for k, v in seeds.get("errors", {}).items():
        p(f"  {k}: {v}")
    rem = seeds.get("remove", [])
    if rem:
        p("Seed: batched_remove(keys), base-class fan-out vs the backend's override "
          "(speed-up = fan-out / override time)")
        p(table(["backend", "N", "fan-out", "override", "speed-up"],
                [[r["backend"], f"{r['n']:,}", _t(r["fanout_s"]), _t(r["override_s"]), _x(r["speedup"])]
                 for r in rem], [False, True, True, True, True]))
    rec = seeds.get("recovery", [])
    if rec:
        p("")
        p("Seed: recovery slot-header validation, sequential vs batched (speed-up = sequential / batched)")
        rows = []
        for r in rec:
            t = r["times_s"]
            rows.append([r["mode"], f"{r['slots']:,}", _t(t.get("ours sequential")), _t(t.get("ours batched")),
                         _x(r.get("ours_speedup")), _t(t.get("lmcache sequential")), _t(t.get("lmcache batched")),
                         _x(r.get("lmcache_speedup")), _x(r.get("ours_batched_vs_lmcache_sequential")),
                         "yes" if r.get("drops_agree") else "NO"])
        p(table(["medium", "slots", "ours seq", "ours batched", "ours", "LMCache seq", "LMCache batched", "LMCache",
                 "ours b. vs LMC seq", "same drops"], rows,
                [False, True, True, True, True, True, True, True, True, False]))


def _met(v: float | None, goal: float, higher: bool) -> str:
    if v is None:
        return "not measured"
    return "met" if (v >= goal if higher else v <= goal) else "not met"


def targets(results: dict) -> list[dict]:
    """Issue targets that this run measured: issue, target, measured, ratio, met, where."""
    out: list[dict] = []

    def add(issue: str, target: str, ratio: float | None, goal: float, higher: bool, where: str,
            measured: str | None = None) -> None:
        out.append({"issue": issue, "target": target, "ratio": ratio, "goal": goal, "higher_is_better": higher,
                    "measured": measured or _x(ratio), "met": _met(ratio, goal, higher), "where": where})

    for r in (results.get("device") or {}).get("results", []):
        if r["size"] in (4096, 1 << 20) and r.get("ratio") is not None:
            goal = 0.8 if r["size"] == 4096 else 1.0
            add("2", f"{r['op']} {r['mode']} {fmt_size(r['size'])}: ours/Rust ≤ {goal}x", r["ratio"], goal, False,
                "device")
    core = results.get("core") or {}
    for r in core.get("rows", []):
        if r["op"] == "delete_many" and r["entries"] == 10000:
            add("4", f"delete_many 10000 ({r['engine']}): ≥ 30x faster than LMCache", r["speedup"], 30, True, "core")
        if r["op"] == "open_recovery" and r["entries"] == 100000:
            add("4", f"open/recovery 100k ({r['engine']}): ≥ 10x faster than LMCache", r["speedup"], 10, True, "core")
    for ix in core.get("index", []):
        v = ix.get("bytes_per_entry_without_keys")
        if v is not None and ix["entries"] == max(i["entries"] for i in core["index"]):
            add("4", f"index memory ({ix['engine']}, {ix['entries']:,} entries): ≤ 150 B/entry + keys", v, 150,
                False, "core", measured=f"{v:.1f} B/entry")
    for r in core.get("cpu", []):
        add("4", f"per-key CPU {r['op']} 64x64KiB ({r['engine']}): ≥ 5x lower than LMCache", r["speedup"], 5, True,
            "core")
    seeds = results.get("seeds") or {}
    for r in seeds.get("recovery", []):
        # The seed compares the batched reader with the sequential one LMCache had (its
        # pre-batching `_read_slot_header` loop), as benchmarks/bench_core.py does; without
        # LMCache only our own sequential reader is there to compare with.
        vs_lmc = r.get("ours_batched_vs_lmcache_sequential")
        if vs_lmc is not None:
            add("4", f"recovery validation {r['slots']} slots ({r['mode']}): batched ≥ 8x sequential "
                     "(ours batched vs LMCache seq)", vs_lmc, 8, True, "seeds")
        else:
            add("4", f"recovery validation {r['slots']} slots ({r['mode']}): batched ≥ 8x sequential "
                     "(ours batched vs ours seq; LMCache not installed)", r.get("ours_speedup"), 8, True, "seeds")
    for r in seeds.get("remove", []):
        if r["backend"] == "ours" and r["n"] == 1000:
            add("5", "batched_remove N=1000: override ≥ 10x the fan-out (ours)", r["speedup"], 10, True, "seeds")
    return out


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
    crows = (results.get("core") or {}).get("rows", [])
    if crows:
        files.append(_plot_core(plt, crows, out_dir))
    bars = _speedup_bars(results)
    if bars:
        files.append(_plot_speedups(plt, bars, out_dir))
    return files, None


def _plot_core(plt: Any, rows: list[dict], out_dir: str) -> str:
    ops = [op for op in dict.fromkeys(r["op"] for r in rows)]
    fig, axes = plt.subplots(1, len(ops), figsize=(3.6 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for engine, style in (("posix", "-"), ("io_uring", "--")):
            sel = sorted((r for r in rows if r["op"] == op and r["engine"] == engine), key=lambda r: r["entries"])
            if not sel:
                continue
            xs = [r["entries"] for r in sel]
            for impl, marker in (("ours", "o"), ("lmcache", "s")):
                ys = [(r[f"{impl}_s"] or float("nan")) * 1e3 for r in sel]
                if not all(math.isnan(y) for y in ys):
                    ax.plot(xs, ys, style, marker=marker, label=f"{impl} {engine}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("entries")
        ax.set_ylabel("ms per call (median)")
        ax.set_title(op, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("RawBlockCore: latency vs index size (lower is better)")
    fig.tight_layout()
    path = os.path.join(out_dir, "core_latency_vs_entries.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _speedup_bars(results: dict) -> list[tuple[str, float, float]]:
    """(label, speed-up, target) for every target row measured as a speed-up."""
    return [(f"#{t['issue']} {t['target'].split(':')[0]}", t["ratio"], t["goal"])
            for t in targets(results) if t["higher_is_better"] and t["ratio"] is not None]


def _plot_speedups(plt: Any, bars: list[tuple[str, float, float]], out_dir: str) -> str:
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(bars) + 2), 4.8))
    vals = [b[1] for b in bars]
    ax.bar(range(len(bars)), vals, color=["tab:green" if v >= g else "tab:red" for _, v, g in bars])
    ax.scatter(range(len(bars)), [b[2] for b in bars], marker="_", s=400, color="black", label="target", zorder=3)
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.set_yscale("log")
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b[0] for b in bars], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("speed-up (higher is better)")
    ax.set_title("Measured speed-ups against the issues' targets")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "ratio_targets.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


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
