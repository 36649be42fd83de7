"""Terminal tables, the goals a run measured, results.json, summary.txt and PNG plots."""

from __future__ import annotations

import io
import json
import math
import os
import sys
from typing import IO, Any, Callable, Sequence

from .common import fmt_rate, fmt_ratio, fmt_size, fmt_time, fmt_us, fmt_x, machine_summary

NOISY = 0.25  # relative IQR above which a cell is flagged as noisy
MEDIUM = {"buffered": "page cache", "odirect": "O_DIRECT"}


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


def _noisy(*spreads: float | None) -> str:
    return " ~" if any(s is not None and s > NOISY for s in spreads) else ""


def _us_key(sec: float | None) -> str:
    return "-" if sec is None else f"{sec * 1e6:.1f}"


def _right(n: int, left: int = 1) -> list[bool]:
    return [False] * left + [True] * (n - left)


# --------------------------------------------------------------------------- part tables


def device_rows(device: dict) -> list[list[str]]:
    return [[r["op"], MEDIUM[r["mode"]], fmt_size(r["size"]), str(r["calls"]), fmt_us(r["ours_s"]),
             fmt_us(r["rust_s"]), fmt_ratio(r["ratio"]) + _noisy(r.get("ours_spread"), r.get("rust_spread"))]
            for r in device.get("results", [])]


def uring_rows(uring: dict) -> list[list[str]]:
    return [[r["op"], MEDIUM[r["mode"]], f"{r['depth']} x {fmt_size(r['size'])}", fmt_time(r.get("ours_batch_s")),
             fmt_time(r.get("rust_batch_s")), fmt_rate(r.get("ours_bytes_per_s")),
             fmt_ratio(r.get("ratio")) + _noisy(r.get("ours_spread"), r.get("rust_spread"))]
            for r in uring.get("results", [])]


def _part(p: Callable[..., None], title: str, part: dict, headers: list[str], rows: list[list[str]],
          right: list[bool]) -> None:
    p(title)
    for k, v in part.get("errors", {}).items():
        p(f"  {k}: {v}")
    if rows:
        p(table(headers, rows, right))


def print_device(results: dict, p: Callable[..., None]) -> None:
    _part(p, f"Device: time per call in µs, ours vs LMCache's Rust device (median of {results['settings']['repeats']} "
             "interleaved rounds); ratio = our time / Rust's, lower is better", results["device"],
          ["op", "medium", "size", "calls", "ours µs", "Rust µs", "ratio"], device_rows(results["device"]), _right(7, 3))


def print_uring(results: dict, p: Callable[..., None]) -> None:
    _part(p, "io_uring batches: time per batch of batched_read / batched_write + wait_iouring, ours vs LMCache's "
             "Rust device; ratio = our time / Rust's, lower is better", results["uring"],
          ["op", "medium", "batch", "ours", "Rust", "ours rate", "ratio"], uring_rows(results["uring"]), _right(7, 3))


def print_limit(results: dict, p: Callable[..., None]) -> None:
    limit = results["limit"]
    if not limit.get("available"):
        p(f"Limit (fio): {limit.get('error')}")
        return
    s = results["settings"]
    p(f"Limit: our io_uring engine streaming vs fio --ioengine=io_uring, O_DIRECT, same region, "
      f"{s['limit_seconds']:g} s per run (median of {s['limit_rounds']} interleaved rounds); "
      "ratio = our throughput / fio's, higher is better")
    for e in limit.get("errors", []):
        p(f"  {e}")
    rows = [[r["rw"], fmt_size(r["size"]), str(r["depth"]), fmt_rate(r["ours_bytes_per_s"]),
             fmt_rate(r["fio_bytes_per_s"]), f"{r['ours_iops']:,.0f}", f"{r['fio_iops']:,.0f}", fmt_ratio(r["ratio"])]
            for r in limit["results"]]
    if rows:
        p(table(["rw", "size", "depth", "ours", "fio", "ours IOPS", "fio IOPS", "ratio"], rows, _right(8)))


def print_core(results: dict, p: Callable[..., None]) -> None:
    core = results["core"]
    have = "lmcache" in core.get("competitors", [])
    p("Core: RawBlockCore, ours vs LMCache's" + ("" if have else " (LMCache not installed: ours only)")
      + f", median of {core['settings']['repeats']} interleaved rounds; speed-up = LMCache's time / ours, "
      "higher is better")
    for k, v in core.get("errors", {}).items():
        p(f"  {k}: {v}")
    rows = [[r["op"], f"{r['entries']:,}", r["engine"], fmt_time(r["ours_s"]), fmt_time(r["lmcache_s"]),
             fmt_time(r["ours_per_key_s"]), fmt_x(r["speedup"])] for r in core.get("rows", [])]
    if rows:
        p(table(["op", "entries", "engine", "ours", "LMCache", "ours/key", "speed-up"], rows, _right(7, 3)))
        if any(r["op"] == "checkpoint" for r in core["rows"]):
            p("checkpoint: ours flushes the device before, inside and after writing the checkpoint so that it is "
              "durable; LMCache's core does not flush (cost of the flushes below)")
    for ix in core.get("index", []):
        if ix.get("bytes_per_entry_without_keys") is not None:
            p(f"index memory ({ix['engine']}, {ix['entries']:,} entries): "
              f"{ix['bytes_per_entry_without_keys']:.1f} bytes/entry + key bytes")
    cpu = [[r["op"], r["engine"], r["medium"], _us_key(r["ours_cpu_per_key_s"]), _us_key(r["lmcache_cpu_per_key_s"]),
            fmt_x(r["speedup"]), _us_key(r["floor_cpu_per_key_s"]), fmt_x(r["best_possible"]),
            fmt_x(r["wall_speedup"])] for r in core.get("cpu", [])]
    if cpu:
        p("")
        p("Per-key CPU (process_time, all threads), 64 x 64 KiB, µs per key; kernel floor = the same transfers "
          "from a bare C loop, best possible = LMCache / floor")
        floor = core.get("floor") or {}
        if not floor.get("available"):
            p(f"  kernel floor not measured: {floor.get('error')}")
        p(table(["op", "engine", "medium", "ours", "LMCache", "speed-up", "floor", "best possible", "wall speed-up"],
                cpu, _right(9, 3)))
    flush = [[r["engine"], r["medium"], f"{r['entries']:,}",
              f"{fmt_time(r['with_flush_wall_s'])} / {fmt_time(r['with_flush_cpu_s'])}",
              f"{fmt_time(r['without_flush_wall_s'])} / {fmt_time(r['without_flush_cpu_s'])}", fmt_x(r["wall_ratio"])]
             for r in core.get("flush", [])]
    if flush:
        p("")
        p("Checkpoint with and without its device flushes (ours; each after 64 new 64 KiB payloads): "
          "wall / CPU per checkpoint")
        p(table(["engine", "medium", "entries", "with flushes", "without", "wall ratio"], flush, _right(6, 2)))


def print_recovery(results: dict, p: Callable[..., None]) -> None:
    rec = results["recovery"]
    p("Recovery: slot-header validation at start-up, sequential readers (one pread per header) vs batched "
      "(LMCache: io_uring; ours: the start-up reader, io_uring batches with O_DIRECT, preads from the page "
      "cache); speed-up = sequential time / batched")
    for k, v in rec.get("errors", {}).items():
        p(f"  {k}: {v}")
    rows = []
    for r in rec.get("rows", []):
        t = r["times_s"]
        rows.append([r["medium"], f"{r['slots']:,}", fmt_time(t.get("ours sequential")), fmt_time(t.get("ours batched")),
                     fmt_x(r.get("ours_speedup")), fmt_time(t.get("lmcache sequential")),
                     fmt_time(t.get("lmcache batched")), fmt_x(r.get("ours_batched_vs_lmcache_sequential")),
                     "yes" if r.get("drops_agree") else "NO"])
    if rows:
        p(table(["medium", "headers", "ours seq", "ours batched", "ours", "LMCache seq", "LMCache batched",
                 "LMCache seq / ours batched", "same drops"], rows, _right(9, 1)[:-1] + [False]))
    floors = [r for r in rec.get("rows", []) if (r.get("floor") or {}).get("floor_s") or
              (r.get("floor") or {}).get("fio_iops")]
    if floors:
        p("")
        p("Recovery against the floor: bare C loops reading the same headers (one pread each; io_uring batches at "
          f"depth {rec['settings'].get('depth')}), and with O_DIRECT fio's IOPS at the same block size, depth and "
          "stride; ours / floor: lower is better, ours / fio: higher is better")
        frows = []
        for r in floors:
            f, t = r["floor"], r["times_s"]
            bare = f.get("floor_s") or {}
            frows.append([r["medium"], f"{r['slots']:,}", fmt_time(bare.get("pread")), fmt_time(t.get("ours sequential")),
                          fmt_x(f.get("sequential_vs_floor")), fmt_time(bare.get("io_uring")),
                          fmt_time(t.get("ours batched")), fmt_x(f.get("batched_vs_floor")),
                          "-" if f.get("fio_iops") is None else f"{f['fio_iops']:,.0f}",
                          "-" if f.get("ours_iops") is None else f"{f['ours_iops']:,.0f}", fmt_x(f.get("iops_vs_fio"))])
        p(table(["medium", "headers", "bare pread", "ours seq", "ours / floor", "bare io_uring", "ours batched",
                 "ours / floor", "fio IOPS", "ours IOPS", "ours / fio"], frows, _right(11)))
    for r in rec.get("rows", []):
        for k in ("floor_error", "fio_error"):
            if (r.get("floor") or {}).get(k):
                p(f"  {r['medium']} {r['slots']:,}: {r['floor'][k]}")


def print_plugin(results: dict, p: Callable[..., None]) -> None:
    plug = results["plugin"]
    for k, v in plug.get("errors", {}).items():
        p(f"  {k}: {v}")
    if plug.get("remove"):
        p("Plugin: batched_remove(keys), the base class's per-key fan-out vs the backend's one locked batch; "
          "speed-up = fan-out time / batch time")
        p(table(["backend", "keys", "fan-out", "one batch", "speed-up"],
                [[r["backend"], f"{r['n']:,}", fmt_time(r["fanout_s"]), fmt_time(r["override_s"]), fmt_x(r["speedup"])]
                 for r in plug["remove"]], _right(5)))
    if plug.get("breakdown"):
        p("")
        p("batched_remove of 1,000 keys, step by step (median per call)")
        p(table(["backend", "step", "per call", "per key"],
                [[r["backend"], r["step"], fmt_time(r["time_s"]), fmt_time(r["per_key_s"])] for r in plug["breakdown"]],
                _right(4, 2)))
    if plug.get("contention"):
        c0 = plug["contention"][0]
        p("")
        p(f"Eviction under contention: {c0['contenders']} threads loop contains/pin/unpin while one evicts "
          f"{c0['victims']:,} keys in batches of {c0['batch']} (idle: nobody evicts)")
        p(table(["backend", "evictor", "evicted keys/s", "contender ops/s", "op p99"],
                [[r["backend"], r["evictor"], "-" if r["evicted_per_s"] is None else f"{r['evicted_per_s']:,.0f}",
                  f"{r['ops_per_s']:,.0f}", fmt_time(r["p99_s"])] for r in plug["contention"]], _right(5, 2)))


def _gbs(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e9:.2f}"


def _frac(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def print_mp(results: dict, p: Callable[..., None]) -> None:
    mp = results["mp"]
    if mp.get("skipped"):
        p(f"MP L2 tier: skipped: {mp['skipped']}")
        return
    s = mp["settings"]
    p(f"MP L2 tier under LMCache's kv-tier-pressure requests: {s['pool_size']} documents of {s['context_tokens']} "
      f"tokens, {s['docs_per_request']} per request, {s['requests']} requests, L1 {s['l1_chunks']} chunks of "
      f"{fmt_size(s['chunk_bytes'])} (pool = {s['overflow']}x L1); median of {s['rounds']} interleaved rounds. "
      "store: the warm-up sweep's store tasks; load: L2 loads of the measured requests; request p50/p99: "
      "one request's L2 time (lookup, load, unlock, recompute stores); L2 share: chunks served by L2")
    for k, v in mp.get("errors", {}).items():
        p(f"  {k}: {v}")
    rows = [[r["config"], r["adapter"], r["device"], _gbs(r["store_bytes_per_s"]), _gbs(r["load_bytes_per_s"]),
             fmt_time(r["request_p50_s"]), fmt_time(r["request_p99_s"]), fmt_time(r["measured_s"]),
             _frac(r["l2_share"]), str(r["l2_misses"]), "yes" if r["bytes_match"] else "NO"]
            for r in mp.get("rows", [])]
    if rows:
        p(table(["config", "adapter", "core / device", "store GB/s", "load GB/s", "req p50", "req p99", "requests",
                 "L2 share", "L2 misses", "bytes ok"], rows, [False, False, False] + _right(7, 0) + [False]))
    if mp.get("ratios"):
        p("")
        p("ours / LMCache's raw-block adapter (GB/s: higher is better; times: lower is better)")
        p(table(["config", "store GB/s", "load GB/s", "req p50", "req p99", "requests"],
                [[r["config"]] + [fmt_x(r[k]) for k in ("store_bytes_per_s", "load_bytes_per_s", "request_p50_s",
                                                        "request_p99_s", "measured_s")] for r in mp["ratios"]],
                _right(6, 1)))


def print_e2e(results: dict, p: Callable[..., None]) -> None:
    e2e = results["e2e"]
    if e2e.get("skipped"):
        p(f"End to end: skipped: {e2e['skipped']}")
        return
    s = e2e["settings"]
    p(f"End to end: LMCache's plugin API (batched_submit_put_task, batched_get_blocking) with its LocalCPUBackend "
      f"and MemoryObjs, {s['tokens']}-token bfloat16 KV chunks, {s['batch']} chunks per call (median of "
      f"{s['rounds']} interleaved rounds); GB/s (10^9 B); p50/p99: one chunk on its own; remove: batched_remove "
      "of a round's keys and the background work it starts; CPU: process CPU s per GB; "
      "of fio: share of fio at the same block size and depth on the same file")
    for k, v in e2e.get("errors", {}).items():
        p(f"  {k}: {v}")
    for c in e2e.get("cases", []):
        if c.get("fio_error"):
            p(f"  fio, {c['model']} {c['config']}: {c['fio_error']}")
    rows = [[r["model"], fmt_size(r["chunk_bytes"]), r["config"], r["backend"], _gbs(r["store_bytes_per_s"]),
             _gbs(r["retrieve_bytes_per_s"]), fmt_time(r["store_p50_s"]), fmt_time(r["store_p99_s"]),
             fmt_time(r["retrieve_p50_s"]), fmt_time(r["retrieve_p99_s"]), fmt_time(r.get("remove_p50_s")),
             f"{r['store_cpu_s_per_gb']:.3f}",
             f"{r['retrieve_cpu_s_per_gb']:.3f}", _frac(r["store_of_limit"]), _frac(r["retrieve_of_limit"]),
             "yes" if r["bytes_match"] else "NO"] for r in e2e.get("rows", [])]
    if rows:
        p(table(["model", "chunk", "config", "plugin", "store GB/s", "retr GB/s", "store p50", "store p99",
                 "retr p50", "retr p99", "remove p50", "store CPU/GB", "retr CPU/GB", "store of fio", "retr of fio",
                 "bytes ok"], rows, _right(16, 4)[:-1] + [False]))
    if e2e.get("ratios"):
        p("")
        p("ours / LMCache's plugin (GB/s: higher is better; p50 and CPU per GB: lower is better)")
        p(table(["model", "config", "store GB/s", "retr GB/s", "store p50", "retr p50", "store CPU/GB", "retr CPU/GB"],
                [[r["model"], r["config"]] + [fmt_x(r[k]) for k in ("store_bytes_per_s", "retrieve_bytes_per_s",
                                                                     "store_p50_s", "retrieve_p50_s",
                                                                     "store_cpu_s_per_gb", "retrieve_cpu_s_per_gb")]
                 for r in e2e["ratios"]], _right(8, 2)))


def _r3(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _signed_us(sec: float | None) -> str:
    return "-" if sec is None else f"{sec * 1e6:+.2f}"


def _range(pair: Sequence[float | None]) -> str:
    return "-" if None in pair else f"{pair[0]:.3f}-{pair[1]:.3f}"


def loadcheck_rows(lc: dict) -> list[list[str]]:
    return [[r["engine"], r["medium"], r["device"], fmt_size(r["chunk_bytes"]), str(r["keys"]), str(r["rounds"]),
             fmt_time(r["off_s"]),
             fmt_time(r["on_s"]), _r3(r["ratio"]), _range(r.get("ratio_ci95") or [None, None]),
             _range([r["ratio_q1"], r["ratio_q3"]]),
             _range([r["ratio_min"], r["ratio_max"]]), _signed_us(r["added_per_key_s"]),
             "yes" if r.get("bytes_verified") else "NO"] for r in lc.get("rows", [])]


def print_loadcheck(results: dict, p: Callable[..., None]) -> None:
    lc = results["loadcheck"]
    s = lc["settings"]
    def plan(c: dict) -> str:
        most = c.get("max_rounds") or c["rounds"]
        rounds = f"{c['rounds']} rounds" if most == c["rounds"] else \
            f"{c['rounds']}-{most} rounds within {c['budget_s']:g} s"
        return f"{fmt_size(c['chunk_bytes'])}: {c['keys']} keys x {c['calls']} call(s), {rounds}"

    rounds = "; ".join(plan(c) for c in s["chunks"])
    p("Load check: load_many_into with the slot-header check on (the product) and off (benchmark hook), one core, "
      f"modes alternating inside each round ({rounds}); time per call (median); on/off = median of the "
      "per-round ratios, lower is better, 1.000 = free; its 95 % confidence interval; IQR and min-max of the "
      "ratios; added µs per key")
    for k, v in lc.get("errors", {}).items():
        p(f"  {k}: {v}")
    for note in lc.get("notes", []):
        p(f"  note: {note}")
    for name, d in lc.get("devices", {}).items():
        p(f"  {name}: {d['directory']} ({d.get('fs_type')} on {d.get('source')}"
          + ("" if d.get("odirect") else ", no O_DIRECT") + ")")
    rows = loadcheck_rows(lc)
    if rows:
        p(table(["engine", "medium", "device", "chunk", "keys", "rounds", "check off", "check on", "on/off", "CI95",
                 "IQR", "min-max", "µs/key added", "bytes ok"], rows, _right(14, 3)[:-1] + [False]))


def _us(sec: float | None) -> str:
    if sec is None:
        return "-"
    us = sec * 1e6
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 1000 else f"{us:,.0f}"


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def dealloc_rows(dl: dict) -> list[list[str]]:
    return [[r["medium"], r["layout"], f"{r['keys']:,}", str(r["rounds"]), _us(r["off_per_key_s"]),
             _us(r["on_per_key_s"]), _f2(r["ratio"]), _range([r["ratio_q1"], r["ratio_q3"]]),
             _us(r["dealloc_per_key_s"]), _n(r["dealloc_commands"]), _n(r["dealloc_ranges"]),
             _us(r["off_put_per_key_s"]), _us(r["on_put_per_key_s"]), _f2(r["put_ratio"]),
             "yes" if r.get("deallocated_as_freed") else "NO"] for r in dl.get("rows", [])]


def print_dealloc(results: dict, p: Callable[..., None]) -> None:
    dl = results["dealloc"]
    s = dl["settings"]
    plans = "; ".join(f"{q['keys']:,} keys: {q['rounds']} round{'s' if q['rounds'] != 1 else ''}"
                      + (f" (+{q['warmup']} warm-up)" if q["warmup"] else "")
                      + (f", {' and '.join(q['media'])} only" if q.get("media") else "") for q in s["plans"])
    p(f"Dealloc: an eviction batch (delete_many of N keys + the checkpoint that makes their slots reusable, "
      f"log format) and the put of N keys into those slots, deallocate_freed on against off, one core each, "
      f"order alternating per round ({plans}); {fmt_size(s['slot_bytes'])} slots, "
      f"{fmt_size(s['payload_bytes'])} payloads, O_DIRECT, posix engine; µs per key (medians); on/off = median "
      "of the per-round ratios and their IQR; dealloc = the deallocation's own time (dealloc_seconds) per key; "
      "commands and ranges per batch; adjacent: N slots in a row, scattered: every other slot")
    for k, v in dl.get("errors", {}).items():
        p(f"  {k}: {v}")
    for note in dl.get("notes", []):
        p(f"  {note}")
    for name, d in dl.get("media", {}).items():
        p(f"  {name}: in {d['directory']} ({d.get('fs_type')} on {d.get('source')})")
    rows = dealloc_rows(dl)
    if rows:
        p(table(["medium", "layout", "N", "rounds", "batch off", "batch on", "on/off", "IQR", "dealloc", "cmds",
                 "ranges", "put off", "put on", "put on/off", "freed = deallocated"], rows,
                _right(14, 2) + [False]))


def _kb(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / (1 << 20):.2f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def _f1(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _f2(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pct_s(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.2f} %"


_VARIANT_ORDER = {"ours log": 0, "ours v1": 1, "lmcache": 2}


def _vkey(r: dict) -> int:
    return _VARIANT_ORDER.get(r.get("variant", r.get("impl")), 9)


def scale_rows(sc: dict) -> list[list[str]]:
    rows = []
    for r in sorted(sc.get("rows", []), key=lambda r: (r["entries"], _vkey(r))):
        base = r.get("base") or {}
        fio = r.get("fio") or {}
        found = "" if not r.get("reopen_incomplete") else f" ({r.get('reopen_found'):,} found)"
        rows.append([r.get("variant", r["impl"]), f"{r['entries']:,}", _kb(r.get("meta_total_bytes")),
                     _kb(r.get("ckpt_bytes")), fmt_time(r.get("ckpt_s")), fmt_time(r.get("ckpt_cpu_s")),
                     _kb(base.get("bytes")), fmt_time(base.get("wall_s")), _pct_s(r.get("ckpt_vs_base_bytes")),
                     _pct_s(r.get("ckpt_vs_base_s")), _f1(r.get("bytes_per_entry")),
                     fmt_time(r.get("reopen_s")) + found, fmt_time(r.get("reopen_verify_s")) + found,
                     f"{fio['iops'] / 1e3:,.0f}k" if fio.get("iops") else "-",
                     _f2(fio.get("ours_vs_fio")), _f1(r.get("index_memory_per_entry")),
                     _f1(r.get("index_memory_per_entry_without_keys"))])
    return rows


def _fx(v: float | None) -> str:
    return fmt_x(v) if v is None or v >= 0.1 else f"{v:.4f}x"


def scale_side_rows(sc: dict) -> list[list[str]]:
    """Per index size: the log format over v1 and over LMCache's core, for each cost."""
    by = {(r["entries"], r.get("variant", r["impl"])): r for r in sc.get("rows", [])}
    out = []
    for n in sorted({r["entries"] for r in sc.get("rows", [])}):
        log, v1, lmc = by.get((n, "ours log")), by.get((n, "ours v1")), by.get((n, "lmcache"))
        if not log or not (v1 or lmc):
            continue
        for label, key in (("checkpoint bytes after churn", "ckpt_bytes"), ("checkpoint wall", "ckpt_s"),
                           ("bytes per entry", "bytes_per_entry"), ("reopen", "reopen_s"),
                           ("reopen verify", "reopen_verify_s"), ("index memory", "index_memory_per_entry")):
            lv = log.get(key)
            if log.get("reopen_incomplete") and key.startswith("reopen"):
                lv = None
            out.append([f"{n:,}", label, _fx(lv / v1[key] if lv and v1 and v1.get(key) else None),
                        _fx(lv / lmc[key] if lv and lmc and lmc.get(key) else None)])
    return out


def scale_limit_rows(sc: dict) -> list[list[str]]:
    lim = sc.get("limit") or {}
    rows = []
    for p in lim.get("probes", []):
        rows.append([p.get("variant", p["impl"]), f"{p.get('max_entries', 0):,}", f"{p['factor']:.2f}",
                     f"{p['entries']:,}", p["outcome"], _kb(p.get("ckpt_bytes"))])
    return rows


def scale_put_rows(sc: dict) -> list[list[str]]:
    from .scale import put_ratios

    ratios = {(p["path"], p["variant"], p["slots"], p["threads"]): p for p in put_ratios(sc)}
    rows = []
    order = {"plugin": 0, "core": 1, "each": 2}
    for r in sorted(sc.get("puts", []), key=lambda r: (r["slots"], r["threads"], order.get(r["path"], 3), _vkey(r),
                                                       r["full"])):
        how = {"plugin": "plugin LRU", "each": "core, delete oldest + put"}.get(
            r["path"], "core, batch delete + put" if r["full"] else "core")
        pr = ratios.get((r["path"], r.get("variant", r["impl"]), r["slots"], r["threads"])) if r["full"] else None
        done = f"{r.get('puts_done', r['puts'])}" + ("*" if r.get("budget_hit") else "")
        rows.append([how, r.get("variant", r["impl"]), f"{r['slots']:,}", str(r["threads"]),
                     "full" if r["full"] else "room", done, fmt_us(r.get("p50_s")), fmt_us(r.get("p99_s")),
                     fmt_us(r.get("max_s")), str(r.get("failed")), fmt_x(pr["p50_ratio"]) if pr else "-",
                     fmt_x(pr["p99_ratio"]) if pr else "-", _f2(r.get("ckpts_per_put")),
                     _f2(r.get("room_ckpts_per_put")),
                     fmt_time(r.get("delete_s")) + (f" ({r['delete_keys']:,})" if r.get("delete_keys") else "")
                     if r.get("delete_s") is not None else fmt_time(r.get("delete_p50_s"))])
    return rows


def print_scale(results: dict, p: Callable[..., None]) -> None:
    sc = results["scale"]
    s = sc["settings"]
    p(f"Scale: metadata against index size, formats v1 and log of our core and LMCache's core; {s['slot_bytes']} B "
      f"slots ({s['header_bytes']} B header, {s['payload_bytes']} B payloads), LMCache-shaped object keys "
      f"({s['chunk_hash_bytes']}-byte chunk hashes), posix, page cache; checkpoint after {s['churn'] * 100:g} % churn "
      f"(median of {s['ckpt_rounds']}): its bytes on the device, wall and CPU time; full base (log: "
      "compact_metadata()) and the churn checkpoint over it; bytes per entry on the device; reopen with "
      "meta_verify_on_load off / on; fio's random-read IOPS at the core's header-reader depth over the same file, "
      "and our headers per second over it; index memory per entry, with and without the key")
    for k, v in sc.get("errors", {}).items():
        p(f"  {k}: {v}")
    for note in sc.get("notes", []):
        p(f"  note: {note}")
    for sk in sc.get("skipped", []):
        p(f"  skipped: {sk['variant']} at {sk['entries']:,} entries: {sk['why']}")
    for r in sc.get("rows", []):
        if r.get("reopen_incomplete"):
            p(f"  {r.get('variant')} {r['entries']:,}: {r['reopen_incomplete']}")
    rows = scale_rows(sc)
    if rows:
        p(table(["variant", "entries", "region", "ckpt bytes", "ckpt wall", "ckpt CPU", "base bytes", "base wall",
                 "ckpt/base B", "ckpt/base t", "B/entry", "reopen", "reopen verify", "fio IOPS", "hdr/s / fio",
                 "index B/entry", "w/o key"], rows, _right(17)))
    side = scale_side_rows(sc)
    if side:
        p("Scale: the log format's figures over v1's and over LMCache's core (lower is better)")
        p(table(["entries", "figure", "log / v1", "log / lmcache"], side, [True, False, True, True]))
    lim = sc.get("limit") or {}
    if lim.get("probes"):
        p(f"Scale: the default metadata region ({fmt_size(lim['meta_total_bytes'])}: v1 checkpoints of at most "
          f"{fmt_size(lim['payload_capacity'])}); entries it holds at v1's bytes per entry of the largest N, and "
          "one checkpoint at a fraction of that (log format: the same counts)")
        p(table(["variant", "v1 max entries", "factor", "entries", "checkpoint", "bytes"], scale_limit_rows(sc),
                [False, True, True, True, False, True]))
    rows = scale_put_rows(sc)
    if rows:
        p(f"Scale: one-key puts into a cache of S entries with room, and full (every slot taken; a checkpoint "
          f"written after the fill); plugin: eviction_policy lru; core: one delete_many of the oldest "
          f"{s.get('eviction_ratio', 0) * 100:g} % (LMCache's L2 eviction_ratio), then the puts (delete: that "
          "batch); core, delete oldest + put: the plugin's one-at-a-time eviction without the plugin (delete: p50 "
          "per key; full/room over the core's room row); µs per put; "
          "full/room of p50 and p99; checkpoints written per put, and those written to free a slot; "
          f"* = stopped after {s.get('put_budget_s', 0):g} s")
        p(table(["path", "variant", "slots", "threads", "cache", "puts", "p50 µs", "p99 µs", "max µs", "failed",
                 "p50 full/room", "p99 full/room", "ckpts/put", "room ckpts/put", "delete"], rows,
                _right(15, 2)))
    tg = sc.get("targets") or []
    if tg:
        p("Scale: the log format against its targets")
        p(table(["figure (ours log)", "measured", "target", "met", "detail"],
                [[t["label"], t["shown"], t["goal_text"], "yes" if t["met"] else "NO", t["detail"]] for t in tg],
                [False, True, False, False, False]))


def print_histcost(results: dict, p: Callable[..., None]) -> None:
    hc = results["histcost"]
    s = hc["settings"]
    p(f"Histogram cost: put_many / load_many_into with the core's histograms on and off, one core, modes "
      f"alternating inside each round ({s['rounds']} rounds x {s['calls']} calls, {hc['directory']}); CPU of the "
      "process per call (median), on/off = median of the per-round CPU ratios and its 95 % confidence interval")
    rows = []
    for r in hc.get("rows", []):
        for op in ("put", "load"):
            f = r[op]
            rows.append([r["engine"], op, fmt_size(r["chunk_bytes"]), str(r["keys"]), fmt_time(f["cpu_s_off"]),
                         fmt_time(f["cpu_s_on"]), _r3(f["cpu_ratio_median"]), _range(f["cpu_ratio_ci95"]),
                         fmt_time(f["wall_s_off"]), fmt_time(f["wall_s_on"])])
    if rows:
        p(table(["engine", "op", "chunk", "keys", "CPU off", "CPU on", "on/off", "CI95", "wall off", "wall on"], rows,
                [False, False] + _right(8, 0)))
    for r in hc.get("rows", []):
        p(f"  recording, timed in a C loop ({r['engine']}, {fmt_size(r['chunk_bytes'])}): "
          f"{r['recording_ns_per_call']} ns per call of {r['keys']} keys, {r['recording_ns_one_key_call']} ns per "
          "call of one key")
    v = hc.get("verdict") or {}
    for eng, share in (v.get("load_64k_batch_share") or {}).items():
        one = (v.get("load_64k_one_key_share") or {}).get(eng)
        p(f"  {eng}: recording costs {100 * share:.3f} % of a 64 KiB load call's CPU (batch), "
          f"{100 * one:.2f} % of a one-key call's (goal ≤ {100 * v['goal']:g} %)")
    if v.get("worst") is not None:
        p("  goal " + ("met" if v["met"] else "NOT met") + " for batched 64 KiB loads")


def print_prefix(results: dict, p: Callable[..., None]) -> None:
    px = results["prefix"]
    t, s = px["trace"], px["settings"]
    p(f"Prefix-aware eviction against LRU: {t['requests']:,} requests of multi-turn conversations "
      f"({t['working_set_chunks']:,} distinct chunks, {t['chunks_looked_up']:,} looked up) replayed through the "
      f"plugin on a sparse file, vLLM's prefix cache in front holding {s['gpu_share']:g} of the working set; "
      "served = chunks the tier loaded past vLLM's; reachable = stored chunks whose predecessors are all stored")
    rows = []
    for r in px.get("rows", []):
        for pol in ("lru", "prefix"):
            c = r[pol]
            rows.append([f"{100 * r['capacity']:g} %", pol, f"{c['slots']:,}", f"{c['tokens_served']:,}",
                         f"{c['hit_ratio']:.3f}", f"{c['tokens_per_device_byte']:.3f}",
                         f"{c['reachable_bytes_mean'] / 2**20:.1f} MiB", f"{c['reachable_share_mean']:.3f}",
                         f"{c['evicted']:,}"])
        q = r["ratios"]
        rows.append(["", "prefix/lru", "", _r3(q["tokens_served"]), _r3(q["hit_ratio"]),
                     _r3(q["tokens_per_device_byte"]), _r3(q["reachable_bytes"]), "", ""])
    p(table(["capacity", "policy", "slots", "tokens served", "hit ratio", "tokens/device B", "reachable",
             "reachable share", "evicted"], rows, [False, False] + _right(7, 0)))
    bk, pc = px["bookkeeping"], px["put_cpu"]
    p(f"  per-put CPU, whole put (median of {len(pc['rounds']['lru'])} replays at 50 %): lru "
      f"{fmt_time(pc['cpu_s_per_chunk']['lru'])}, prefix {fmt_time(pc['cpu_s_per_chunk']['prefix'])} per chunk, "
      f"prefix/lru {_r3(pc['ratio'])}")
    p(f"  bookkeeping alone (best of {len(bk['rounds']['lru'])}): lru {fmt_time(bk['cpu_s_per_put']['lru'])}, "
      f"prefix {fmt_time(bk['cpu_s_per_put']['prefix'])} per chunk, prefix/lru {_r3(bk['ratio'])}")
    if bk.get("phases"):
        ph = bk["phases"]
        p("    by phase (per stored chunk, lru → prefix): " + ", ".join(
            f"{k} {fmt_time(ph['lru'][k])} → {fmt_time(ph['prefix'][k])} ({_r3(bk['phase_ratios'][k])}x)"
            for k in ("store", "pick", "forget")))
    ext = px.get("extent_rows") or []
    if ext:
        p(f"  with extents of {s.get('extent_slots')} slots: plain extent eviction (least recently used extent) "
          "against extent_prefix (of the 4 least recently used, the one losing the fewest reachable chunks)")
        rows = []
        for r in ext:
            for pol in ("extent", "extent_prefix"):
                c = r[pol]
                rows.append([f"{100 * r['capacity']:g} %", pol, f"{c['slots']:,}", f"{c['tokens_served']:,}",
                             f"{c['hit_ratio']:.3f}", f"{c['tokens_per_device_byte']:.3f}",
                             f"{c['reachable_share_mean']:.3f}", f"{c.get('evicted_extents') or 0:,}",
                             f"{c['put_failures']:,}"])
            q = r["ratios"]
            rows.append(["", "ext_prefix/extent", "", _r3(q["tokens_served"]), _r3(q["hit_ratio"]),
                         _r3(q["tokens_per_device_byte"]), "", "", ""])
        p(table(["capacity", "policy", "slots", "tokens served", "hit ratio", "tokens/device B", "reachable share",
                 "extents evicted", "put failures"], rows, [False, False] + _right(7, 0)))
    v = px["verdict"]
    p(f"  goals: tokens served at 50 % {_r3(v['tokens_served_50'])}x (≥ {v['goal_50']:g}: "
      f"{'met' if v['met_50'] else 'NOT met'}); worst capacity {_r3(v['tokens_served_worst'])}x "
      f"({'never worse' if v['never_worse'] else 'WORSE somewhere'}); whole-put CPU {_r3(v['put_cpu_ratio_50'])}x "
      f"(≤ {v['goal_cpu']:g}: {'met' if v['met_cpu'] else 'NOT met'})")


def _mbs(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e6:,.1f}"


def drives_rows(dr: dict) -> list[list[str]]:
    return [[str(r["n"]), fmt_size(r["chunk"]), r["who"], r["engine"], r["driver"],
             _mbs(r.get("store_bytes_per_s")), _f2(r.get("store_share_of_cap")),
             _mbs(r.get("load_bytes_per_s")), _f2(r.get("load_share_of_cap")),
             _f2(r.get("cpu_s_per_gb")) if r.get("cpu_s_per_gb") is not None else "-",
             "-" if "accounted_covers_io" not in r else "yes" if r["accounted_covers_io"] else "NO"]
            for r in dr.get("rows", [])]


def drives_latency_rows(dr: dict) -> list[list[str]]:
    ms = lambda v: "-" if v is None else f"{v * 1e3:,.1f}"  # noqa: E731
    return [[r["engine"], "-" if r.get("queue_depth") is None else str(r["queue_depth"]), r["io_scheduler"],
             fmt_size(r["load_chunk"]), fmt_size(r["store_chunk"]),
             ms(r["idle_p50_s"]), ms(r["idle_p99_s"]), ms(r["busy_p50_s"]), ms(r["busy_p99_s"]), _f2(r["p99_ratio"]),
             _mbs(r["store_bytes_per_s_during"]), f"{r['idle_samples']}/{r['busy_samples']}"]
            for r in dr.get("latency", [])]


def print_drives(results: dict, p: Callable[..., None]) -> None:
    dr = results["drives"]
    s = dr["settings"]
    if not dr.get("available"):
        p(f"Drives: not measured: {dr.get('error')}")
        return
    rg = dr.get("rig", {})
    p(f"Drives: the cache over N capped devices ({rg.get('backing')}, blkio throttle {_mbs(s['read_bps'])} MB/s "
      f"read and {_mbs(s['write_bps'])} MB/s write per device), {s['per_call']} chunks per device per call, "
      f"{s['seconds']:g} s per figure after {WARMUP_NOTE}; share = bandwidth / (N x cap); CPU = the process's "
      "CPU seconds per GB stored and loaded; accounted = the group's throttle counted at least the bytes "
      f"moved on every device. fio: N jobs, io_uring, QD{s['fio_depth']}, the same block size.")
    for e in dr.get("errors", []):
        p(f"  {e}")
    p(table(["N", "chunk", "who", "engine", "driver", "store MB/s", "share", "load MB/s", "share", "CPU s/GB",
             "accounted"], drives_rows(dr), _right(2, 0)[:2] + [False] * 3 + [True] * 5 + [False]))
    cv = dr.get("cpu_per_gb_vs_n", [])
    if cv:
        p("CPU per GB against N (ours; vs N=1 of the same engine and chunk):")
        p(table(["engine", "chunk", "N", "CPU s/GB", "vs N=1"],
                [[c["engine"], fmt_size(c["chunk"]), str(c["n"]), _f2(c["cpu_s_per_gb"]), _f2(c["vs_n1"])]
                 for c in cv], [False, True, True, True, True]))
    if dr.get("latency"):
        rd = s.get("lat_read_bps") or 0
        p("Load latency on one device (reads " + (f"capped at {_mbs(rd)} MB/s" if rd else "uncapped") + ", writes "
          f"at {_mbs(s['write_bps'])} MB/s), one chunk per load_many_into, idle and while another thread's stores "
          "(4 chunks per put_many) keep the write budget busy; QD = the io_uring ring's depth, 4 being one "
          "put_many's worth (ms):")
        p(table(["engine", "QD", "io_scheduler", "load", "stores", "idle p50", "idle p99", "busy p50", "busy p99",
                 "p99 busy/idle", "stores MB/s", "samples"], drives_latency_rows(dr),
                [False, True, False] + [True] * 9))


def print_loadcost(results: dict, p: Callable[..., None]) -> None:
    from .loadcost import describe_rig, print_rows

    lc = results["loadcost"]
    if not lc.get("available"):
        p(f"Cost-aware loads: not measured: {lc.get('error')}")
        return
    s = lc["settings"]
    p(f"Cost-aware loads ({describe_rig(s)}): requests for the first k chunks of a stored prompt "
      f"(k in {s['prefixes']}), each asked without and with the priced prefix lookup; a refused or truncated "
      "chunk is recomputed (modelled: tokens / recompute rate). Late = a load that finished after the "
      "recompute of what it loaded; time to data over all requests (ms)")
    p(table(["phase", "mode", "requests", "loads", "refused", "truncated", "late loads", "mean time to data"],
            print_rows(lc), [False, False] + _right(6, 0)))
    p(f"  stores during the busy phase: {_mbs(lc.get('store_bytes_per_s_during'))} MB/s")


def print_mpevict(results: dict, p: Callable[..., None]) -> None:
    me = results["mpevict"]
    if me.get("skipped"):
        p(f"MP eviction over extents: skipped: {me['skipped']}")
        return
    s = me["settings"]
    p(f"MP eviction over extents (our adapter, {s['docs']} documents of {s['chunks_per_doc']} chunks, "
      f"{s['requests']} requests of {s['docs_per_request']} Zipf({s['zipf']:g})-popular documents, the device "
      f"{100 * s['capacity']:g} % of the working set, extents of {s['extent_slots']} slots): hit ratio = chunks "
      "served by L2 / chunks asked; opened without clean = extents opened with none clean left (puts then "
      "fill a partly live extent's holes)")
    for k, v in me.get("errors", {}).items():
        p(f"  {k}: {v}")
    rows = [[r["arm"], _r3(r["hit_ratio"]), f"{r['served']:,}", f"{r['extents_deallocated']:,}",
             f"{r['opened_without_clean']:,} of {r['extents_opened']:,}", f"{r['deleted_by_lmcache']:,}",
             f"{r['deleted_by_extent']:,}", f"{r['reinserted']:,}", f"{r.get('victims_not_oldest', 0):,}",
             f"{r['stores_refused']:,}", "ok" if r["bad_bytes"] == 0 else "BAD"]
            for r in me.get("rows", [])]
    p(table(["arm", "hit ratio", "chunks served", "extents freed whole", "opened without clean", "LMCache deleted",
             "extent evictor deleted", "put back", "victims not oldest", "stores refused", "bytes"], rows,
            [False] + _right(10, 0)))
    for arm, d in (me.get("hit_ratio_delta") or {}).items():
        p(f"  hit ratio, extent - {arm}: {d:+.4f}")
    for arm, d in (me.get("prefix_hit_ratio_delta") or {}).items():
        p(f"  hit ratio, extent_prefix - {arm}: {d:+.4f}")


WARMUP_NOTE = "an untimed half second"


PRINTERS = {"device": print_device, "uring": print_uring, "limit": print_limit, "core": print_core,
            "recovery": print_recovery, "plugin": print_plugin, "e2e": print_e2e, "mp": print_mp, "mpevict": print_mpevict,
            "loadcheck": print_loadcheck, "dealloc": print_dealloc, "scale": print_scale, "histcost": print_histcost,
            "prefix": print_prefix, "drives": print_drives, "loadcost": print_loadcost}


def print_summary(results: dict, file: IO[str] | None = None) -> None:
    out = file or sys.stdout
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p("")
    p(f"lmcache_rawblock bench --suite {results['settings']['suite']}")
    p(f"machine: {machine_summary(results['machine'])}")
    src = results["machine"].get("source") or {}
    if src.get("commit"):
        p(f"source:  commit {src['commit'][:12]}"
          + (f" with uncommitted changes in {len(src['modified'])} files" if src.get("modified") else ""))
    t = results["target"]
    p(f"target:  {t['path']} ({t['kind']}, {fmt_size(t['size_bytes'])}, region used "
      f"{fmt_size(results['settings']['region_bytes'])})")
    for c in results["competitors"].values():
        if c["available"]:
            p(f"{c['name']:>7}: {c['distribution']} {c['version'] or ''}".rstrip())
        elif c.get("install"):
            p(f"{c['name']:>7}: {c['distribution']} not installed -- add it with: {c['install']}")
        else:
            p(f"{c['name']:>7}: unavailable: {c['error']}")
    for note in results.get("notes", []):
        p(f"note: {note}")
    for part, printer in PRINTERS.items():
        if results.get(part) is not None:
            p("")
            printer(results, p)
    rows = goals(results)
    if rows:
        p("")
        met = sum(1 for g in rows if g["met"])
        p(f"Measured against the goals set for this implementation ({met} of {len(rows)} met):")
        p(table(["measurement", "result", "goal", "met", "figures"],
                [[g["label"], g["shown"], g["goal_text"], "met" if g["met"] else "NOT met", g["detail"]]
                 for g in rows], [False, True, False, False, False]))
    if any(" ~" in r[-1] for r in device_rows(results.get("device") or {}) + uring_rows(results.get("uring") or {})):
        p("")
        p(f"~ marks cells whose rounds spread by more than {NOISY:.0%} (IQR/median): rerun for firmer figures")
    p("")
    p(f"elapsed: {results.get('elapsed_s', 0):.1f} s")


def summary_text(results: dict) -> str:
    buf = io.StringIO()
    print_summary(results, buf)
    return buf.getvalue()


# --------------------------------------------------------------------------- goals


def goals(results: dict) -> list[dict]:
    """Each measurement of this run that has a goal: label (what is measured and what it is
    compared with), value, how it is shown, the goal and which way is better."""
    out: list[dict] = []

    def add(part: str, label: str, value: float | None, goal: float, higher: bool, detail: str = "",
            unit: str = "x", digits: int = 2) -> None:
        if value is None:
            return
        g = f"{goal:g}" + (".0" if goal <= 1 and "." not in f"{goal:g}" else "")
        out.append({"part": part, "label": label, "value": value, "goal": goal, "higher_is_better": higher,
                    "shown": f"{value:.1f} B" if unit == " B" else f"{value:.{digits}f}x", "detail": detail,
                    "goal_text": f"{'≥' if higher else '≤'} {g}{unit}", "met": value >= goal if higher else value <= goal})

    for r in (results.get("device") or {}).get("results", []):
        if r["size"] in (4096, 1 << 20):
            add("device", f"{r['op']}, {fmt_size(r['size'])}, {MEDIUM[r['mode']]}: time per call, ours / "
                          "LMCache's Rust device", r.get("ratio"), 0.8 if r["size"] == 4096 else 1.0, False,
                f"{fmt_us(r['ours_s'])} vs {fmt_us(r['rust_s'])} µs per call")
    for r in (results.get("uring") or {}).get("results", []):
        if (r["size"], r["depth"]) in ((4096, 256), (1 << 20, 64)):
            add("uring", f"io_uring {r['op']}, {r['depth']} x {fmt_size(r['size'])}, {MEDIUM[r['mode']]}: time per "
                         "batch, ours / LMCache's Rust device", r.get("ratio"), 0.7 if r["size"] == 4096 else 1.0,
                False, f"{fmt_time(r['ours_batch_s'])} vs {fmt_time(r['rust_batch_s'])} per batch")
    for r in (results.get("limit") or {}).get("results", []):
        if r["size"] >= 1 << 20 and "rand" not in r["rw"]:
            add("limit", f"io_uring stream, {r['rw']} {fmt_size(r['size'])} QD{r['depth']}, O_DIRECT: our throughput "
                         "/ fio's", r.get("ratio"), 0.95, True,
                f"{fmt_rate(r['ours_bytes_per_s'])} vs {fmt_rate(r['fio_bytes_per_s'])}")
    core = results.get("core") or {}
    for r in core.get("rows", []):
        shown = f"{fmt_time(r['lmcache_s'])} vs {fmt_time(r['ours_s'])}"
        if r["op"] == "delete_many" and r["entries"] == 10000:
            add("core", f"delete_many, 10,000 keys ({r['engine']}): LMCache's core time / ours", r["speedup"], 30,
                True, shown)
        if r["op"] == "open_recovery" and r["entries"] == 100000:
            add("core", f"open with recovery, 100,000 entries ({r['engine']}): LMCache's core time / ours",
                r["speedup"], 10, True, shown)
    largest = max((ix["entries"] for ix in core.get("index", [])), default=None)
    for ix in core.get("index", []):
        v = ix.get("bytes_per_entry_without_keys")
        if ix["entries"] == largest:
            add("core", f"index memory, {ix['entries']:,} entries ({ix['engine']}): bytes per entry besides the key",
                v, 150, False, "index, in-flight table and slot allocator", unit=" B")
    for r in core.get("cpu", []):
        floor = "" if r["floor_cpu_per_key_s"] is None else \
            f"; kernel floor {_us_key(r['floor_cpu_per_key_s'])} µs, best possible {fmt_x(r['best_possible'])}"
        add("core", f"{r['op']} CPU per key, 64 x 64 KiB ({r['engine']}, {r['medium']}): LMCache's core / ours",
            r["speedup"], 5, True, f"{_us_key(r['lmcache_cpu_per_key_s'])} vs {_us_key(r['ours_cpu_per_key_s'])} "
                                   f"µs{floor}")
    for r in (results.get("recovery") or {}).get("rows", []):
        t = r["times_s"]
        add("recovery", f"slot-header validation, {r['slots']:,} headers ({r['medium']}): LMCache's sequential reader "
                        "/ our batched reader", r.get("ours_batched_vs_lmcache_sequential"), 8, True,
            f"{fmt_time(t.get('lmcache sequential'))} vs {fmt_time(t.get('ours batched'))}")
        f = r.get("floor") or {}
        if f.get("batched_vs_floor") is not None:
            add("recovery", f"slot-header validation, {r['slots']:,} headers ({r['medium']}): our batched reader / a "
                            "bare batched-read loop", f["batched_vs_floor"], 1.5, False,
                f"{fmt_time(t.get('ours batched'))} vs {fmt_time(f['floor_s']['io_uring'])}")
        if f.get("iops_vs_fio") is not None:
            add("recovery", f"slot-header validation, {r['slots']:,} headers ({r['medium']}): our headers per second "
                            "/ fio's IOPS", f["iops_vs_fio"], 0.9, True,
                f"{f['ours_iops']:,.0f} vs {f['fio_iops']:,.0f} per s")
    lc = results.get("loadcheck") or {}
    for r in lc.get("rows", []):
        if r["chunk_bytes"] >= lc["settings"]["target_from_chunk_bytes"]:
            add("loadcheck", f"load_many_into, {r['keys']} x {fmt_size(r['chunk_bytes'])} ({r['engine']}, "
                             f"{r['medium']}, {r['device']}): time with the slot-header check / without",
                r.get("ratio"), lc["settings"]["target_ratio"], False,
                f"{fmt_time(r['on_s'])} vs {fmt_time(r['off_s'])} per call; IQR {_r3(r['ratio_q1'])}-"
                f"{_r3(r['ratio_q3'])}", digits=3)
    for r in (results.get("histcost") or {}).get("rows", []):
        if r["chunk_bytes"] == 64 * 1024:
            ld = r["load"]
            if ld["cpu_s_off"]:
                add("histcost", f"load_many_into, {r['keys']} x 64 KiB ({r['engine']}): (CPU + the histograms' "
                                "recording) / CPU", 1 + r["recording_ns_per_call"] * 1e-9 / ld["cpu_s_off"], 1.01,
                    False, f"{r['recording_ns_per_call']} ns per call (C loop) on {fmt_time(ld['cpu_s_off'])}; "
                           f"measured on/off {_r3(ld['cpu_ratio_median'])}", digits=4)
    px = results.get("prefix") or {}
    for r in px.get("rows", []):
        add("prefix", f"tokens served at {100 * r['capacity']:g} % of the working set: prefix / lru",
            r["ratios"]["tokens_served"],
            px["verdict"]["goal_50"] if r["capacity"] == 0.5 else px["verdict"].get("goal_never_worse", 1.0), True,
            f"hit ratio {r['prefix']['hit_ratio']:.3f} vs {r['lru']['hit_ratio']:.3f}")
    if px.get("put_cpu", {}).get("ratio") is not None:
        add("prefix", "per-put CPU (whole put, 50 %): prefix / lru", px["put_cpu"]["ratio"], px["verdict"]["goal_cpu"],
            False, f"bookkeeping alone {_r3(px['bookkeeping']['ratio'])}x")
    if px.get("bookkeeping", {}).get("ratio") is not None:
        add("prefix", "per-put CPU (bookkeeping alone): prefix / lru", px["bookkeeping"]["ratio"],
            px["verdict"]["goal_cpu"], False, "the order's own methods, no I/O")
    for r in px.get("extent_rows", []):
        add("prefix", f"tokens served with extents at {100 * r['capacity']:g} %: extent_prefix / extent",
            r["ratios"]["tokens_served"], px["verdict"].get("goal_never_worse", 1.0), True,
            f"hit ratio {r['extent_prefix']['hit_ratio']:.3f} vs {r['extent']['hit_ratio']:.3f}")
    dr = results.get("drives") or {}
    for r in dr.get("rows", []):
        if r["who"] != "ours":
            continue
        for side in ("store", "load"):
            add("drives", f"{side}, N={r['n']} x {fmt_size(r['chunk'])} ({r['engine']}, {r['driver']}): bandwidth / "
                          "(N x cap)", r.get(f"{side}_share_of_cap"), 0.95, True,
                f"{_mbs(r.get(f'{side}_bytes_per_s'))} MB/s")
    for c in dr.get("cpu_per_gb_vs_n", []):
        if c["n"] > 1:
            add("drives", f"CPU per GB, N={c['n']} / N=1 ({c['engine']}, {fmt_size(c['chunk'])})", c["vs_n1"], 1.1,
                False, f"{_f2(c['cpu_s_per_gb'])} s/GB")
    for r in dr.get("latency", []):
        qd = "" if r.get("queue_depth") is None else f", QD{r['queue_depth']}"
        add("drives", f"load p99 under stores / idle p99 ({r['engine']}{qd}, {r['io_scheduler']})", r["p99_ratio"], 1.5,
            False, f"{r['busy_p99_s'] * 1e3:.1f} vs {r['idle_p99_s'] * 1e3:.1f} ms")
    lcost = results.get("loadcost") or {}
    if lcost.get("available"):
        busy = lcost["busy"]
        add("loadcost", "mean time to data under stores, priced prefix lookup / without", busy["ttd_ratio"], 1.0,
            False, f"{busy['policy']['mean_ttd_s'] * 1e3:.1f} vs {busy['no_policy']['mean_ttd_s'] * 1e3:.1f} ms; "
                   f"late loads {100 * busy['policy']['late_share']:.0f} % vs "
                   f"{100 * busy['no_policy']['late_share']:.0f} %")
    for r in (results.get("plugin") or {}).get("remove", []):
        if r["backend"] == "ours" and r["n"] == 1000:
            add("plugin", "batched_remove, 1,000 keys: per-key fan-out time / one locked batch (our plugin)",
                r["speedup"], 10, True, f"{fmt_time(r['fanout_s'])} vs {fmt_time(r['override_s'])}")
    return out


# --------------------------------------------------------------------------- files


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _write(path: str, text: str) -> str:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def write_json(results: dict, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    return _write(os.path.join(out_dir, "results.json"), json.dumps(_clean(results), indent=2) + "\n")


def write_summary(results: dict, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    return _write(os.path.join(out_dir, "summary.txt"), summary_text(results).lstrip("\n"))


# --------------------------------------------------------------------------- plots


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
    erows = (results.get("e2e") or {}).get("rows", [])
    if erows:
        files.append(_plot_e2e(plt, erows, out_dir))
    lrows = (results.get("loadcheck") or {}).get("rows", [])
    if lrows:
        files.append(_plot_loadcheck(plt, lrows, results["loadcheck"]["settings"], out_dir))
    curves = latency_curves(results)
    if curves:
        files.append(_plot_latency_cdf(plt, curves, out_dir))
    drows = (results.get("dealloc") or {}).get("rows", [])
    if drows:
        files.append(_plot_dealloc(plt, drows, results["dealloc"]["settings"], out_dir))
    bars = [g for g in goals(results) if g["higher_is_better"]]
    if bars:
        files.append(_plot_speedups(plt, bars, out_dir))
    return files, None


def _save(plt: Any, fig: Any, out_dir: str, name: str) -> str:
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _log_axes(ax: Any, xs: list[int], xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([fmt_size(x) for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _core_bars(ax: Any, sel: list[dict], op: str) -> None:
    """One index size in the run: a bar per implementation and engine (a line needs two)."""
    bars = [(f"{impl}\n{r['engine']}", (r[f"{impl}_s"] or float("nan")) * 1e3, color)
            for r in sel for impl, color in (("ours", "tab:green"), ("lmcache", "tab:blue"))]
    ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b[0] for b in bars], fontsize=7)
    vals = [b[1] for b in bars if b[1] == b[1] and b[1] > 0]
    if vals and max(vals) / min(vals) > 20:  # a linear axis from 0 unless the bars span decades
        ax.set_yscale("log")
    ax.set_ylabel("ms per call (median)")
    ax.set_title(f"{op}, {sel[0]['entries']:,} entries", fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.3)


def _plot_core(plt: Any, rows: list[dict], out_dir: str) -> str:
    ops = list(dict.fromkeys(r["op"] for r in rows))
    fig, axes = plt.subplots(1, len(ops), figsize=(3.6 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        if len({r["entries"] for r in rows if r["op"] == op}) == 1:
            _core_bars(ax, [r for r in rows if r["op"] == op], op)
            continue
        for engine, style in (("posix", "-"), ("io_uring", "--")):
            sel = sorted((r for r in rows if r["op"] == op and r["engine"] == engine), key=lambda r: r["entries"])
            for impl, marker in (("ours", "o"), ("lmcache", "s")):
                ys = [(r[f"{impl}_s"] or float("nan")) * 1e3 for r in sel]
                if sel and not all(math.isnan(y) for y in ys):
                    ax.plot([r["entries"] for r in sel], ys, style, marker=marker, label=f"{impl} {engine}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("entries")
        ax.set_ylabel("ms per call (median)")
        ax.set_title(op, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    one = all(len({r["entries"] for r in rows if r["op"] == op}) == 1 for op in ops)
    fig.suptitle("RawBlockCore, ours vs LMCache's: time per call " + ("at the run's one index size" if one else
                                                                      "vs index size") + " (lower is better)")
    return _save(plt, fig, out_dir, "core_latency_vs_entries.png")


def _plot_loadcheck(plt: Any, rows: list[dict], settings: dict, out_dir: str) -> str:
    sizes = sorted({r["chunk_bytes"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.5 * len(sizes), 5.5), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        sel = [r for r in rows if r["chunk_bytes"] == size]
        ys = [r["ratio"] for r in sel]
        ci = [r.get("ratio_ci95") or [None, None] for r in sel]
        err = [[y - (c[0] if c[0] is not None else y) for y, c in zip(ys, ci)],
               [(c[1] if c[1] is not None else y) - y for y, c in zip(ys, ci)]]
        ax.bar(range(len(sel)), [y - 1 for y in ys], bottom=1, yerr=err, capsize=3,
               color=["tab:blue" if r["engine"] == "posix" else "tab:orange" for r in sel])
        for engine, color in (("posix", "tab:blue"), ("io_uring", "tab:orange")):
            if any(r["engine"] == engine for r in sel):
                ax.bar([0], [0], bottom=1, color=color, label=f"{engine} engine")  # legend entry only
        if size >= settings["target_from_chunk_bytes"]:
            ax.axhline(settings["target_ratio"], color="tab:red", linestyle="--", linewidth=1, label="goal")
        ax.axhline(1.0, color="black", linewidth=1, label="1.0: the check is free")
        ax.legend(fontsize=7)
        ax.set_xticks(range(len(sel)))
        ax.set_xticklabels([f"{r['engine']}, {r['medium']}, {r['device']}" for r in sel], fontsize=7, rotation=60,
                           ha="right")
        ax.set_ylabel("time with the check / without (median, 95 % CI)")
        ax.set_title(f"{fmt_size(size)} chunks, {sel[0]['keys']} per load_many_into", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("What the load-time slot-header check costs a load\n(lower is better, 1.0 = free; colour: engine)",
                 fontsize=10)
    return _save(plt, fig, out_dir, "loadcheck_ratio.png")


def _plot_dealloc(plt: Any, rows: list[dict], settings: dict, out_dir: str) -> str:
    media = list(dict.fromkeys(r["medium"] for r in rows))
    fig, axes = plt.subplots(2, len(media), figsize=(5.5 * len(media), 8), squeeze=False)
    for col, medium in enumerate(media):
        sel = [r for r in rows if r["medium"] == medium]
        xs = range(len(sel))
        labels = [f"{r['layout']}\nN={r['keys']:,}" for r in sel]
        for row, (what, title) in enumerate((("", "eviction batch: delete_many + checkpoint"),
                                             ("put_", "put of N keys into the freed slots"))):
            ax = axes[row][col]
            w = 0.38
            off = [r[f"off_{what}per_key_s"] * 1e6 for r in sel]
            on = [r[f"on_{what}per_key_s"] * 1e6 for r in sel]
            ax.bar([x - w / 2 for x in xs], off, w, label="deallocate_freed off", color="tab:blue")
            ax.bar([x + w / 2 for x in xs], on, w, label="deallocate_freed on", color="tab:orange")
            if not what:
                ax.scatter([x + w / 2 for x in xs], [r["dealloc_per_key_s"] * 1e6 for r in sel], marker="_", s=200,
                           color="black", zorder=3, label="of which the deallocation")
            # the label is the ratio of the two bars drawn (not the median of per-round ratios,
            # which can lie on the other side of 1 when rounds are noisy)
            for x, a, b in zip(xs, off, on):
                if a > 0:
                    q = b / a
                    ax.annotate(f"{q:,.0f}x" if q >= 10 else f"{q:.2f}x", (x + w / 2, b), ha="center",
                                va="bottom", fontsize=7)
            ax.set_yscale("log")
            ax.set_xticks(list(xs))
            ax.set_xticklabels(labels, fontsize=7)
            ax.set_ylabel("µs per key (median)")
            ax.set_title(f"{medium}: {title}", fontsize=9)
            ax.grid(True, axis="y", which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"Deallocating freed slots, on against off ({fmt_size(settings['slot_bytes'])} slots, "
                 "log format)\nlower is better; label: the orange bar over the blue one", fontsize=10)
    return _save(plt, fig, out_dir, "dealloc_per_key.png")


def latency_curves(results: dict) -> list[tuple[str, str, dict]]:
    """(panel, curve label, native histogram) of every part that kept its core's call-latency
    histograms (histcost: puts and loads with recording on; loadcheck: its cells' loads)."""
    out = []
    for r in (results.get("histcost") or {}).get("rows", []):
        for op, call in (("put", "put_many"), ("load", "load_many_into")):
            h = (r.get("latency") or {}).get(f"{op}_ns")
            if h and h["count"]:
                out.append((f"{call}, {fmt_size(r['chunk_bytes'])} x {r['keys']} (histcost)", r["engine"], h))
    for r in (results.get("loadcheck") or {}).get("rows", []):
        h = (r.get("latency") or {}).get("load_ns")
        if h and h["count"]:
            out.append((f"load_many_into, {fmt_size(r['chunk_bytes'])} x {r['keys']} (loadcheck)",
                        f"{r['engine']}, {r['medium']}, {r['device']}", h))
    return out


def cdf_points(hist: dict) -> tuple[list[float], list[float]]:
    """(µs, cumulative fraction) at each bucket's upper edge of a native histogram (ns)."""
    total, acc, xs, ys = hist["count"], 0, [], []
    for up, c in sorted((int(u), int(c)) for u, c in hist["buckets"]):
        acc += c
        xs.append(up / 1e3)
        ys.append(acc / total)
    return xs, ys


def _plot_latency_cdf(plt: Any, curves: list[tuple[str, str, dict]], out_dir: str) -> str:
    panels = list(dict.fromkeys(c[0] for c in curves))
    cols = min(3, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 4 * nrows), squeeze=False)
    for k, panel in enumerate(panels):
        ax = axes[k // cols][k % cols]
        for _, label, h in (c for c in curves if c[0] == panel):
            xs, ys = cdf_points(h)
            ax.step(xs, ys, where="post", label=f"{label} ({h['count']:,} calls)")
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle=":")
        ax.axhline(0.99, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        ax.set_ylim(0, 1.01)
        ax.set_xlabel("time per call (µs; bucket upper edges, within 25 %)")
        ax.set_ylabel("fraction of calls at most")
        ax.set_title(panel, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for k in range(len(panels), nrows * cols):
        axes[k // cols][k % cols].set_visible(False)
    fig.suptitle("Latency distribution of our core's calls (the core's own histograms; dotted: p50, p99)")
    return _save(plt, fig, out_dir, "latency_cdf.png")


def _plot_speedups(plt: Any, bars: list[dict], out_dir: str) -> str:
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(bars) + 2), 7))
    xs = range(len(bars))
    ax.bar(xs, [b["value"] for b in bars], color=["tab:green" if b["met"] else "tab:red" for b in bars])
    ax.scatter(xs, [b["goal"] for b in bars], marker="_", s=400, color="black", label="goal", zorder=3)
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.set_yscale("log")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([b["label"].split(":")[0] for b in bars], rotation=70, ha="right", fontsize=6)
    ax.set_ylabel("speed-up (higher is better)")
    ax.set_title("Speed-ups measured in this run, each beside its goal")
    ax.legend(fontsize=8)
    return _save(plt, fig, out_dir, "speedups.png")


def _plot_latency(plt: Any, rows: list[dict], out_dir: str) -> str:
    ops = sorted({r["op"] for r in rows})
    sizes = sorted({r["size"] for r in rows})
    fig, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for mode, style in (("buffered", "-"), ("odirect", "--")):
            sel = sorted((r for r in rows if r["op"] == op and r["mode"] == mode), key=lambda r: r["size"])
            for impl, marker in (("ours", "o"), ("rust", "s")):
                ys = [r[f"{impl}_s"] * 1e6 if r[f"{impl}_s"] else float("nan") for r in sel]
                if sel and not all(math.isnan(y) for y in ys):
                    ax.plot([r["size"] for r in sel], ys, style, marker=marker, label=f"{impl} {MEDIUM[mode]}")
        ax.set_yscale("log")
        _log_axes(ax, sizes, "transfer size", "time per call (µs, median)", op)
    fig.suptitle("Per-call time vs size, ours vs LMCache's Rust device (lower is better)")
    return _save(plt, fig, out_dir, "latency_vs_size.png")


def _plot_ratio(plt: Any, rows: list[dict], out_dir: str) -> str:
    sel = [r for r in rows if r.get("ratio") is not None]
    vals = [r["ratio"] for r in sel]
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(sel) + 2), 4.5))
    ax.bar(range(len(sel)), vals, color=["tab:green" if v <= 1.0 else "tab:red" for v in vals])
    ax.bar([0], [0], color="tab:green", label="ours as fast or faster (≤ 1)")  # legend entries only
    ax.bar([0], [0], color="tab:red", label="ours slower (> 1)")
    ax.axhline(1.0, color="black", linewidth=1, label="parity")
    ax.axhline(0.8, color="tab:blue", linewidth=1, linestyle="--", label="goal at 4 KiB: 0.8x")
    ax.set_xticks(range(len(sel)))
    ax.set_xticklabels([f"{r['op'].split('_')[0]} {MEDIUM[r['mode']]} {fmt_size(r['size'])}" for r in sel],
                       rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("our time / Rust device's, per call")
    ax.set_title("Time per call, ours / LMCache's Rust device (lower is better)")
    ax.legend(fontsize=8)
    return _save(plt, fig, out_dir, "ratio.png")


def _plot_uring(plt: Any, rows: list[dict], out_dir: str) -> str:
    panels = sorted({(r["op"], r["mode"]) for r in rows})
    sizes = sorted({r["size"] for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for ax, (op, mode) in zip(axes[0], panels):
        for i, depth in enumerate(sorted({r["depth"] for r in rows})):
            sel = sorted((r for r in rows if (r["op"], r["mode"], r["depth"]) == (op, mode, depth)),
                         key=lambda r: r["size"])
            for impl, style in (("ours", "-o"), ("rust", "--s")):
                ys = [(r.get(f"{impl}_bytes_per_s") or float("nan")) / (1 << 20) for r in sel]
                if sel and not all(math.isnan(y) for y in ys):
                    ax.plot([r["size"] for r in sel], ys, style, color=f"C{i}", label=f"{impl} {depth} per batch")
        _log_axes(ax, sizes, "block size", "MiB/s (median)", f"io_uring {op}, {MEDIUM[mode]}")
    fig.suptitle("io_uring batches, ours vs LMCache's Rust device (higher is better)")
    return _save(plt, fig, out_dir, "uring_throughput.png")


def _plot_e2e(plt: Any, rows: list[dict], out_dir: str) -> str:
    cases = list(dict.fromkeys((r["model"], r["config"]) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(cases) + 4), 4.5), squeeze=False)
    width = 0.38
    for ax, op, limit in zip(axes[0], ("store", "retrieve"), ("fio_write", "fio_read")):
        for j, (backend, color) in enumerate((("ours", "tab:green"), ("lmcache", "tab:blue"))):
            ys = []
            for case in cases:
                r = next((r for r in rows if (r["model"], r["config"]) == case and r["backend"] == backend), None)
                ys.append((r or {}).get(f"{op}_bytes_per_s") or float("nan"))
            ax.bar([i + (j - 0.5) * width for i in range(len(cases))], [y / 1e9 for y in ys], width,
                   color=color, label="ours" if backend == "ours" else "LMCache's plugin")
        for i, case in enumerate(cases):
            fio = next((r[f"{limit}_bytes_per_s"] for r in rows if (r["model"], r["config"]) == case), None)
            if fio:
                ax.hlines(fio / 1e9, i - 0.45, i + 0.45, colors="black", linestyles="--",
                          label="fio, same block size and depth" if i == 0 else None)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels([f"{m} {fmt_size(next(r['chunk_bytes'] for r in rows if r['model'] == m))}\n{c}"
                            for m, c in cases], fontsize=7)
        ax.set_ylabel("GB/s (median)")
        ax.set_title(f"{op}, {rows[0]['batch']} chunks per call", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("LMCache plugin path end to end, ours vs LMCache's plugin (higher is better)")
    return _save(plt, fig, out_dir, "e2e_throughput.png")
