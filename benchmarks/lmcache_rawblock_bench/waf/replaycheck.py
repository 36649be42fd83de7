"""The product's own allocator decisions on the simulated drive, against the simulator's model
of them.

``waf replay --record FILE --json`` runs the workload through the real core and records its
device write stream: the slots the core chose, its checkpoints and the ranges it deallocated.
:func:`check` feeds that stream to the flash model (:func:`.cli.simulate_stream`, on a drive
sized so the replay's span is ``util`` of its logical space) and runs the simulator's cache
model (:mod:`.stream`) with the same workload, slot size, metadata format, deallocation and
eviction batch on the same drive, so the two WAFs differ only by what the model gets wrong
about the core.

    python -m lmcache_rawblock_bench.waf.replaycheck --record stream.jsonl --replay-json run.json \\
        --page-bytes 8192 --ru-pages 128 --op 0.07 --util 0.95 --warmup 2 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from typing import Optional

from .ftl import Geometry
from .workload import WorkloadSpec


def check(record: str, replay: dict, geometry: Geometry, *, util: float = 0.95, warmup: float = 2.0,
          evict_ahead: Optional[tuple] = None) -> dict:
    """The recorded stream's WAF and the model's, on the same simulated drive (see the module).
    ``replay`` is one run of ``waf replay --json``; ``evict_ahead`` the model's eviction
    (default: the replay's ``--evict-batch`` as a (1.0, batch) evict-ahead, or on demand)."""
    from .cli import simulate_stream
    from .run import meta_bytes_for, simulate_lmcache

    rec = simulate_stream(record, geometry, fit_util=util, warmup=warmup)
    g = Geometry(**{k: rec["geometry"][k] for k in ("ru_pages", "n_rus", "n_groups", "op", "max_handles",
                                                    "page_bytes", "count_reserve")})
    total = rec["counters"]["host_pages"] / g.logical_pages
    spec = WorkloadSpec.from_dict(replay["workload"])
    spec = replace(spec, requests=0, seed=replay.get("workload_seed") or spec.seed)
    batch = replay.get("evict_batch") or 0.0
    if evict_ahead is None and batch:
        evict_ahead = (1.0, batch)
    # the model's cache gets the replay's slot count (the real core's metadata region differs)
    slot = replay["slot_bytes"]
    meta = meta_bytes_for("v1", replay["span_bytes"], slot, g.page_bytes)
    cache_util = (meta + replay["max_slots"] * slot + slot // 2) / g.logical_bytes
    model = simulate_lmcache(g, spec, util=cache_util, mode="no_fdp", dealloc=replay["dealloc"] != "off",
                             evict_ahead=evict_ahead, meta_format="v1", warmup=warmup, measure=total - warmup,
                             checkpoint_every=replay.get("checkpoint_every", 2000))
    ops = replay["ops"]
    return {
        "record": record, "geometry": rec["geometry"], "util": util, "warmup_drive_writes": warmup,
        "stream_drive_writes": total,
        "replay": {"waf": rec["window_waf"], "waf_from_start": rec["waf"], "slot_bytes": replay["slot_bytes"],
                   "slots": replay["max_slots"], "hit_ratio": ops.get("hit_ratio"), "evictions": ops.get("evictions"),
                   "checkpoints": ops.get("checkpoints"), "core": replay.get("core")},
        "model": {"waf": model["waf"], "waf_from_start": model["cumulative_waf"], "slots": model["slots"],
                  "slot_bytes": model["slot_bytes"], "evict_ahead": model["evict_ahead"],
                  "hit_ratio": model["cache"].get("hit_ratio"), "cache": model["cache"]},
    }


def markdown(res: list[dict], argv: list[str]) -> str:
    L = ["# The real core's recorded write stream on the simulated drive, against the simulator's model", "",
         f"Command: `{' '.join(argv)}`", "",
         "Each row: one `waf replay --record` run on a sparse file (the real core's slot choices, v1 checkpoints "
         "and deallocations), fed to the flash model on a drive whose logical space the span fills to the "
         "given utilisation; and the simulator's cache model of the same configuration (workload, slot size, "
         "format v1, deallocation, eviction batch as an evict-ahead from 100% of the slots) on the same drive. "
         "WAF over the window after the warm-up.", "",
         "| record | slots | RU (slots) | util | spare | replayed WAF | model WAF | difference | hit ratio replay / "
         "model |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res:
        g = r["geometry"]
        ru_slots = g["ru_pages"] * g["page_bytes"] // r["replay"]["slot_bytes"]
        a, b = r["replay"]["waf"], r["model"]["waf"]
        L.append(f"| {os.path.basename(r['record'])} | {r['replay']['slots']} | {ru_slots} | {r['util']:.0%} | "
                 f"{g['op']:.0%} | {a:.3f} | {b:.3f} | {100 * (b - a) / a:+.1f}% | "
                 f"{r['replay']['hit_ratio']:.3f} / {r['model']['hit_ratio']:.3f} |")
    return "\n".join(L) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lmcache_rawblock_bench.waf.replaycheck", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--record", action="append", required=True, help="a stream of waf replay --record (repeatable)")
    p.add_argument("--replay-json", action="append", required=True,
                   help="the waf replay --json output of the same run (one per --record)")
    p.add_argument("--page-bytes", type=int, default=8192)
    p.add_argument("--ru-pages", type=int, default=128)
    p.add_argument("--op", type=float, default=0.07)
    p.add_argument("--util", type=float, default=0.95)
    p.add_argument("--warmup", type=float, default=2.0, help="drive writes before the window (default 2)")
    p.add_argument("--out", help="directory for results.json and summary.md")
    a = p.parse_args(argv)
    if len(a.record) != len(a.replay_json):
        p.error(f"--record given {len(a.record)} times and --replay-json {len(a.replay_json)}: one each per run")
    g = Geometry(ru_pages=a.ru_pages, n_rus=64, op=a.op, max_handles=1, page_bytes=a.page_bytes)
    res = []
    for rec, rj in zip(a.record, a.replay_json):
        with open(rj) as f:
            runs = json.load(f)
        res.append(check(rec, runs[0] if isinstance(runs, list) else runs, g, util=a.util, warmup=a.warmup))
    cmd = ["python -m lmcache_rawblock_bench.waf.replaycheck"] + list(argv if argv is not None else sys.argv[1:])
    md = markdown(res, cmd)
    print(md)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(res, f, indent=1)
        with open(os.path.join(a.out, "summary.md"), "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
