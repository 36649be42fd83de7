"""The wear study's goal cells driven by the product's own allocator: ``waf replay`` runs the
real core (log format, strided extents one reclaim unit each; or format v1, extents of the whole
slots one reclaim unit holds; extent eviction with its clean reserve, deallocation) with its
write journal on, and the recorded stream goes to the flash
model (:func:`.cli.simulate_stream`) on a drive whose logical space the core's span fills.

The scale (a real 1 GiB- or 16 GiB-RU drive's replay would write terabytes): a reclaim unit
holds as many slots as the real one (1 GiB / (8 MiB + 4 KiB) = 127.94: 127 slots and a tail of
0.94 slot; 16 GiB: 2047 slots and a tail of one 4 KiB block), the drive has as many reclaim
units as the simulated study's (256 of 1 GiB, 128 of 16 GiB) and the same spare; only the bytes
shrink: a slot is 64 KiB (4 KiB header + 60 KiB chunk, 16 pages of 4 KiB) at 1 GiB RUs and
8 KiB (2 pages) at 16 GiB. WAF depends on the layout in slots and RUs and on the spare
fraction, not on the byte size, except through the metadata's share of the writes, which the
small slots raise (a log record per put is ~1/1000 of a 64 KiB slot and ~1/100000 of an 8 MiB
one): each cell reports that share, and the WAF of the same stream without its metadata
writes as the bound for a real drive. The workload's prefixes and conversations in flight scale
with the logical slots, as in the simulated study (:func:`.study.workload_for`).

    python -m lmcache_rawblock_bench.waf.replaystudy --out benchmarks/results/waf/replay-product \\
        --ru 1G --util 1.0 --concurrency 8 --op 0.07 --seeds 1,2 --dir /dev/shm/wafreplay

``--out`` appends each cell to results.json and rewrites summary.md's table of runs; what stands
below summary.md's marker line (sections written by hand) is kept. ``--rewrite-summary`` only
rewrites it. The doc's tables: :mod:`.tables`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from typing import Optional

from .ftl import Geometry
from .tables import runs_table

PAGE = 4096
# RU size -> (slot bytes, RU pages, simulated RUs): the real slots-per-RU ratio at a small slot
SCALES = {
    "1G": (64 << 10, 2047, 256),  # 127 slots of 16 pages + 15 pages of tail (0.94 slot, as 7.5 MiB of 8 MiB)
    "16G": (8 << 10, 4095, 128),  # 2047 slots of 2 pages + 1 page of tail (4 KiB, as on the real RU)
    # a diagnostic: 128 slots fill a 1 GiB-like RU exactly (no tail: an extent's data is one RU)
    "1G-notail": (64 << 10, 2048, 256),
}
# The metadata region: the smallest that holds the log format's base at this slot count (a real
# device's 128 MiB default is 0.05 % of a 256 GiB drive and 0.006 % of a 2 TiB one; the part of
# it never written is spare to the drive, so a region sized for the real device would flatter)
META_BYTES = {"1G": 2 << 20, "16G": 16 << 20, "1G-notail": 2 << 20}
REF_SLOTS = 30385  # logical slots of the simulated study's headline drive (study.REF_SLOTS at 7 % spare)
BASE_FAMILIES, BASE_CONCURRENCY = 2000, 32


def geometry(ru: str, op: float, util: float = 1.0) -> tuple[Geometry, int, int]:
    """(drive, span bytes the core gets, slot bytes) for ``ru`` at spare ``op``: the span is
    ``util`` of the drive's logical space."""
    slot, ru_pages, n_rus = SCALES[ru]
    g = Geometry(ru_pages=ru_pages, n_rus=n_rus, op=op, max_handles=1, page_bytes=PAGE)
    span = int(g.logical_pages * util) * PAGE
    return g, span, slot


def replay_argv(dev: str, span: int, slot: int, ru_bytes: int, *, concurrency: int, seed: int, eviction: str,
                record: Optional[str], warmup: float, measure: float, reserve: int = 0,
                meta_bytes: int = 0, hit_trace: Optional[str] = None, workload: str = "lmcache_defaults",
                meta_format: str = "log") -> list[str]:
    k = span / slot / REF_SLOTS
    argv = ["--device", dev, "--size", str(span), "--destroy-data", "--workload", workload,
            "--chunk-bytes", str(2 * (slot - 4096)), "--families", str(max(1, round(BASE_FAMILIES * k))),
            "--concurrency", str(max(1, round(BASE_CONCURRENCY * k * concurrency))), "--seed", str(seed),
            "--meta-format", meta_format, "--extent-bytes", str(ru_bytes), "--eviction", eviction, "--load",
            "--dealloc", "on", "--warmup", str(warmup), "--measure", str(measure), "--json"]
    argv += ["--extent-reserve", str(reserve)] if reserve else []
    argv += ["--meta-bytes", str(meta_bytes)] if meta_bytes else []
    argv += ["--hit-trace", hit_trace] if hit_trace else []
    return argv + (["--record", record] if record else [])


def same_lookups(ext: dict, ext_trace: bytes, lru_trace: bytes) -> Optional[float]:
    """Key-level LRU's hit ratio over the lookups of the extent run's window (the same get
    events of the same workload: both runs see the lookups in the same order). The windows
    are set in bytes written, and reinsertion's puts again make the extent run's window reach
    fewer events than LRU's: on this workload, whose hit ratio drifts along the stream, LRU's
    own window would be compared with an earlier stretch. None when the LRU run ended first."""
    a = int(ext["warmup_ops"]["lookups"])
    b = a + int(ext["ops"]["lookups"])
    return None if len(ext_trace) < b else window_ratio(lru_trace, a, b)


def window_ratio(trace: bytes, a: int, b: int) -> Optional[float]:
    """The hit ratio of lookups ``a`` to ``b`` (excluded) of a hit trace; None when it ended first."""
    if b > len(trace) or b <= a:
        return None
    return sum(trace[a:b]) / (b - a)


def lru_run(dev: str, span: int, slot: int, ru_bytes: int, common: dict, trace: str, upto: int) -> tuple[dict, bytes]:
    """Key-level LRU on the same core and capacity: (its run, its hit trace, which goes on past its
    window until it holds ``upto`` lookups, the end of the extent run's window)."""
    # format v1 checkpoints its whole index at every key-level eviction: a window in bytes
    # written would end after a few thousand lookups; counted in the chunks' bytes it covers the
    # workload's puts as the extent run does (and more). The log format keeps its window in bytes
    # written (LRU's own-window figure as before); where LRU writes more metadata per put than
    # extent eviction (the study's pattern at 16 GiB RUs), the trace reaches on past it.
    window = "data" if common["meta_format"] == "v1" else "all"
    run = _replay(replay_argv(dev, span, slot, ru_bytes, eviction="lru", record=None, hit_trace=trace, **common)
                  + ["--window-bytes", window, "--trace-lookups", str(upto)])
    with open(trace, "rb") as f:
        hits = f.read()
    os.unlink(trace)
    return run, hits


def _replay(argv: list[str]) -> dict:
    from lmcache_rawblock.__main__ import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli_main(["waf", "replay", *argv])
    if rc != 0:
        raise RuntimeError(f"waf replay {' '.join(argv)}: exit {rc}: {err.getvalue()[-2000:]}")
    return json.loads(out.getvalue())[0]


def data_only(record: str, meta_end: int, out: str) -> None:
    """The stream without its metadata writes (those below ``meta_end``)."""
    with open(record) as f, open(out, "w") as g:
        for line in f:
            r = json.loads(line)
            if r["op"] != "write" or r["offset"] >= meta_end:
                g.write(line)


def extent_bytes_for(meta_format: str, ru_bytes: int, slot: int) -> int:
    """The core's ``extent_bytes`` for one RU: the RU itself in the log format (strided slots, the
    tail unused), the whole slots that fit in it in format v1 (LMCache's layout has no stride, so
    an extent is a whole number of slots and its boundaries drift across the RUs')."""
    return ru_bytes if meta_format == "log" else ru_bytes // slot * slot


def cell(ru: str, util: float, concurrency: int, op: float, seed: int, work: str, *, warmup: float = 1.5,
         measure: float = 1.5, lru: bool = True, reserve: int = 0, workload: str = "lmcache_defaults",
         meta_format: str = "log") -> dict:
    """One cell: the extent-eviction run recorded and simulated, and key-level LRU's hit ratio
    at the same capacity (the same core and extents, keys evicted one by one)."""
    from .cli import simulate_stream

    g, span, slot = geometry(ru, op, util)
    ru_bytes = extent_bytes_for(meta_format, g.ru_pages * PAGE, slot)
    os.makedirs(work, exist_ok=True)
    dev, rec = os.path.join(work, f"dev-{ru}.img"), os.path.join(work, f"stream-{ru}.jsonl")
    t0 = time.time()
    # format v1 checkpoints its whole index: its region is the replay's default size for the slots
    common = dict(concurrency=concurrency, seed=seed, warmup=warmup, measure=measure,
                  meta_bytes=META_BYTES[ru] if meta_format == "log" else 0, workload=workload,
                  meta_format=meta_format)
    tr_ext, tr_lru = os.path.join(work, f"hits-{ru}-extent.bin"), os.path.join(work, f"hits-{ru}-lru.bin")
    ext = _replay(replay_argv(dev, span, slot, ru_bytes, eviction="extent", record=rec, reserve=reserve,
                              hit_trace=tr_ext, **common))
    t1 = time.time()
    sim = simulate_stream(rec, g, warmup=warmup)
    meta_end = int(ext["recorded"]["data_base_offset"])
    nometa = rec + ".data"
    data_only(rec, meta_end, nometa)
    sim_data = simulate_stream(nometa, g, warmup=warmup * (1 - (ext["recorded"]["meta_share"] or 0)))
    os.unlink(nometa)
    t2 = time.time()
    hit_lru, lru_same, lru_window = None, None, None
    if lru:
        upto = int(ext["warmup_ops"]["lookups"]) + int(ext["ops"]["lookups"])
        run, lru_trace = lru_run(dev, span, slot, ru_bytes, common, tr_lru, upto)
        hit_lru, lru_window = run["ops"], run["window_bytes"]
        with open(tr_ext, "rb") as f_ext:
            lru_same = same_lookups(ext, f_ext.read(), lru_trace)
    os.unlink(tr_ext)
    os.unlink(rec)
    os.unlink(dev)
    return {
        "workload_name": workload, "meta_format": meta_format, "ru": ru, "util": util, "concurrency": concurrency, "op": op, "seed": seed, "geometry": g.to_dict(),
        "span_bytes": span, "slot_bytes": slot, "extent_bytes": ru_bytes, "slots": ext["max_slots"],
        "extent_reserve": ext["extent_reserve"], "workload": ext["workload"],
        "waf": sim["window_waf"], "waf_from_start": sim["waf"], "waf_without_metadata": sim_data["window_waf"],
        "window": sim["window"], "recorded": ext["recorded"], "core": ext["core"],
        "hit_ratio_extent": ext["ops"]["hit_ratio"], "hit_ratio_lru_same_lookups": lru_same,
        "hit_ratio_lru": hit_lru["hit_ratio"] if hit_lru else None, "lru_window_bytes": lru_window,
        "lookups_window": [ext["warmup_ops"]["lookups"], ext["warmup_ops"]["lookups"] + ext["ops"]["lookups"]],
        "reinsert": ext.get("reinsert"),
        "ops_extent": ext["ops"], "ops_lru": hit_lru,
        "replay_argv": replay_argv(dev, span, slot, ru_bytes, eviction="extent", record=rec, reserve=reserve,
                                   **common),
        "seconds": {"replay": round(t1 - t0, 1), "simulate": round(t2 - t1, 1), "lru": round(time.time() - t2, 1)},
    }


def refill_lru(c: dict, work: str) -> dict:
    """A cell whose LRU run ended before the extent run's window did (no same-lookups figure):
    the LRU run again, its trace on to the window's end; the cell with that figure filled in."""
    argv = c["replay_argv"]
    warmup, measure = (float(argv[argv.index(o) + 1]) for o in ("--warmup", "--measure"))
    g, span, slot = geometry(c["ru"], c["op"], c["util"])
    common = {"concurrency": c["concurrency"], "seed": c["seed"], "warmup": warmup, "measure": measure,
              "meta_bytes": META_BYTES[c["ru"]] if c["meta_format"] == "log" else 0,
              "workload": c["workload_name"], "meta_format": c["meta_format"]}
    os.makedirs(work, exist_ok=True)
    dev = os.path.join(work, f"dev-{c['ru']}.img")
    a, b = c["lookups_window"]
    t0 = time.time()
    run, trace = lru_run(dev, span, slot, c["extent_bytes"], common, os.path.join(work, "hits-lru.bin"), b)
    os.unlink(dev)
    same = window_ratio(trace, a, b)
    return {**c, "hit_ratio_lru_same_lookups": same,
            "lru_refill": {"hit_ratio_lru": run["ops"]["hit_ratio"], "window_bytes": run["window_bytes"],
                           "seconds": round(time.time() - t0, 1)}}


# The line of summary.md after which its hand-kept sections (earlier runs, diagnostics) stand: a
# rewrite (at every cell of a run) regenerates what is above it from results.json and keeps the rest
KEEP_MARKER = "<!-- replaystudy --out rewrites the part above this line only; what follows is kept -->"


def markdown(cells: list[dict], argv: list[str], kept: str = "") -> str:
    """summary.md: every run's row, then ``kept`` (the hand-kept sections) after the marker."""
    commands = {c.get("command") for c in cells} - {None}
    command = next(iter(commands)) if len(commands) == 1 else (" ".join(argv) if not commands else "see COMMAND")
    L = ["# WAF driven by the product's allocator (recorded write journal on the flash model)", "",
         f"Command: `{command}`", "",
         "Each row: `waf replay` of the store pattern (`lmcache_defaults`: LMCache's default, full chunks only; "
         "`study`: decode and partial chunks stored too) through the real core, "
         "`meta_format: log` and `extent_bytes` = the RU (strided slots of 4 KiB + chunk), or format v1 and "
         "`extent_bytes` = the RU's whole slots (no stride: extents drift across RU boundaries), `eviction extent` "
         "(the closed extent filled longest ago, its keys loaded since their put put again, at most half of it, "
         "`extent_reserve` 5 % of the extents kept clean ahead), `deallocate_freed: on`, loads of every hit; the "
         "core's write journal (every data and metadata write and every deallocation) replayed on the flash model "
         "with greedy GC; WAF over 1.5 drive writes after 1.5 of warm-up. LRU: the same core and capacity with "
         "key-level LRU eviction; its hit ratio over the same lookups as the extent run's window (the same get "
         "events: the windows are set in bytes written, reinsertion's puts make the extent run's reach fewer "
         "events, and this workload's hit ratio drifts along the stream), and over its own window.", "",
         *runs_table(cells)]
    text = "\n".join(L) + "\n"
    return text + ("\n" + KEEP_MARKER + "\n" + kept.lstrip("\n") if kept.strip() else "")


def kept_sections(summary: str) -> str:
    """What a rewrite of ``summary`` keeps: everything after the marker line; in a summary
    written before the marker, everything from its first second-level heading on (the
    generated part has none)."""
    lines = summary.split("\n")
    if KEEP_MARKER in lines:
        return "\n".join(lines[lines.index(KEEP_MARKER) + 1:])
    at = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    return "\n".join(lines[at:])


def write_summary(out: str, cells: list[dict], argv: list[str]) -> None:
    """``out``/summary.md from ``cells``, its hand-kept sections carried over."""
    path = os.path.join(out, "summary.md")
    kept = ""
    if os.path.exists(path):
        with open(path) as f:
            kept = kept_sections(f.read())
    with open(path + ".tmp", "w") as f:
        f.write(markdown(cells, argv, kept))
    os.replace(path + ".tmp", path)


def _save(out: str, res_path: str, cells: list[dict], cmd: list[str]) -> None:
    os.makedirs(out, exist_ok=True)
    with open(res_path + ".tmp", "w") as f:
        json.dump({"cells": cells}, f, indent=1)
    os.replace(res_path + ".tmp", res_path)
    write_summary(out, cells, cmd)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lmcache_rawblock_bench.waf.replaystudy",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ru", default="1G", help="comma-separated: 1G, 16G (default 1G)")
    p.add_argument("--util", default="1.0", help="comma-separated utilisations (default 1.0)")
    p.add_argument("--concurrency", default="8", help="comma-separated multiples of the study's (default 8)")
    p.add_argument("--op", default="0.07", help="comma-separated drive spare fractions (default 0.07)")
    p.add_argument("--seeds", default="1,2", help="comma-separated workload seeds (default 1,2)")
    p.add_argument("--warmup", type=float, default=1.5)
    p.add_argument("--measure", type=float, default=1.5)
    p.add_argument("--workload", default="lmcache_defaults", choices=("lmcache_defaults", "study"),
                   help="store pattern (default lmcache_defaults: full chunks only; study: decode and partial chunks)")
    p.add_argument("--meta-format", default="log", choices=("log", "v1"),
                   help="the core's metadata format (default log; v1: LMCache's layout, extents of whole slots)")
    p.add_argument("--no-lru", action="store_true", help="skip the key-level LRU run (hit ratio)")
    p.add_argument("--extent-reserve", type=int, default=0,
                   help="clean extents kept ahead (default 0: the plugin's default, 5%% of the extents, at least 2)")
    p.add_argument("--dir", default="/dev/shm/wafreplay", help="where the device file and stream go")
    p.add_argument("--out", help="directory: results.json (appended to) and summary.md")
    p.add_argument("--refill-lru", action="store_true",
                   help="run key-level LRU again for --out's cells that have no same-lookups figure (their LRU "
                        "run ended before the extent run's window), its hit trace on to that window's end")
    p.add_argument("--rewrite-summary", action="store_true",
                   help="rewrite --out's summary.md from its results.json (its hand-kept sections kept); run nothing")
    a = p.parse_args(argv)
    if (a.rewrite_summary or a.refill_lru) and not (a.out and os.path.exists(os.path.join(a.out, "results.json"))):
        p.error("--rewrite-summary and --refill-lru need --out DIR with a results.json")
    for r in a.ru.split(","):
        if r not in SCALES:
            p.error(f"--ru {r!r}: choose from {', '.join(SCALES)}")
    res_path = os.path.join(a.out, "results.json") if a.out else None
    cells = []
    if res_path and os.path.exists(res_path):
        with open(res_path) as f:
            cells = json.load(f)["cells"]
    cmd = ["python -m lmcache_rawblock_bench.waf.replaystudy"] + list(argv if argv is not None else sys.argv[1:])
    if a.rewrite_summary:
        write_summary(a.out, cells, cmd)
        return 0
    if a.refill_lru:
        for i, c in enumerate(cells):
            if c.get("hit_ratio_lru_same_lookups") is None and c.get("ops_lru") and c.get("lookups_window"):
                cells[i] = refill_lru(c, a.dir)
                cells[i]["lru_refill"]["command"] = " ".join(cmd)
                print(f"{c['workload_name']} {c['meta_format']} {c['ru']} util {c['util']} {c['concurrency']}x op "
                      f"{c['op']} seed {c['seed']}: LRU same lookups {cells[i]['hit_ratio_lru_same_lookups']}, "
                      f"{cells[i]['lru_refill']}", file=sys.stderr, flush=True)
                _save(a.out, res_path, cells, cmd)
        return 0
    for ru in a.ru.split(","):
        for util in (float(x) for x in a.util.split(",")):
            for conc in (int(x) for x in a.concurrency.split(",")):
                for op in (float(x) for x in a.op.split(",")):
                    for seed in (int(x) for x in a.seeds.split(",")):
                        c = cell(ru, util, conc, op, seed, a.dir, warmup=a.warmup, measure=a.measure,
                                 lru=not a.no_lru, reserve=a.extent_reserve, workload=a.workload,
                                 meta_format=a.meta_format)
                        c["command"] = " ".join(cmd)
                        cells.append(c)
                        print(f"{a.meta_format} {ru} util {util} {conc}x op {op} seed {seed}: WAF {c['waf']:.3f} (without metadata "
                              f"{c['waf_without_metadata']:.3f}), hit ratio extent {c['hit_ratio_extent']:.3f} "
                              f"LRU same lookups {c['hit_ratio_lru_same_lookups']} own window {c['hit_ratio_lru']}, "
                              f"{c['seconds']}", file=sys.stderr, flush=True)
                        if a.out:
                            _save(a.out, res_path, cells, cmd)
    print(markdown(cells, cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
