"""The product replay's tables, from the cells ``replaystudy --out`` keeps in ``results.json``:
every run (one row a run, in the order they ran), the operator table (one row a cell of the
log format: the runs of its seeds as ranges) and format v1's table, in the layout of
``docs/waf-study.md``; with ``--doc`` the doc's tables are rewritten in place (each found by its
header line), and the figures its text quotes (cells, runs, ranges) are printed beside.

    python -m lmcache_rawblock_bench.waf.tables --product benchmarks/results/waf/replay-product \\
        --v1 benchmarks/results/waf/replay-product-v1 --doc docs/waf-study.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable

PATTERN = {"lmcache_defaults": "LMCache's default", "study": "the study's"}
DRIVE = {"1G": "1 GiB RUs", "16G": "16 GiB RUs"}

RUNS_HEADER = ("| workload | format | RU | util | spare | concurrency | seed | slots / extents | WAF | WAF without "
               "metadata | metadata share | reserve | hit ratio extent | LRU, same lookups | LRU - extent | "
               "LRU, own window |")
OPERATOR_HEADER = ("| store pattern | drive | spare | utilisation | concurrency | `extent_reserve` | seeds | WAF | "
                   "WAF without metadata writes | hit ratio extents | key-level LRU, same lookups | LRU - extents |")
V1_HEADER = ("| store pattern | drive | spare | utilisation | concurrency | WAF | WAF without metadata writes | "
             "metadata share of the writes |")


def _rule(header: str) -> str:
    return "|" + "---|" * (header.count("|") - 1)


def _f3(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def workload_of(c: dict) -> str:
    return c.get("workload_name", "lmcache_defaults")


def format_of(c: dict) -> str:
    return c.get("meta_format", "log")


def lru_minus_extent(c: dict) -> float | None:
    hs = c.get("hit_ratio_lru_same_lookups")
    return None if hs is None else hs - c["hit_ratio_extent"]


def runs_table(cells: Iterable[dict]) -> list[str]:
    """Every run, in the order of ``cells``."""
    L = [RUNS_HEADER, _rule(RUNS_HEADER)]
    for c in cells:
        d = lru_minus_extent(c)
        L.append(f"| {workload_of(c)} | {format_of(c)} | {c['ru']} | {c['util']:.0%} | {c['op']:.0%} | "
                 f"{c['concurrency']}x | {c['seed']} | {c['slots']} / {c['core'].get('extents_total')} | "
                 f"{c['waf']:.3f} | {c['waf_without_metadata']:.3f} | "
                 f"{100 * (c['recorded']['meta_share'] or 0):.2f}% | {c['extent_reserve']} | "
                 f"{c['hit_ratio_extent']:.3f} | {_f3(c.get('hit_ratio_lru_same_lookups'))} | "
                 f"{'-' if d is None else f'{d:+.3f}'} | {_f3(c.get('hit_ratio_lru'))} |")
    return L


def cell_key(c: dict) -> tuple:
    """A cell's place in the tables: store pattern, RU, spare, utilisation (100% first), concurrency."""
    return (list(PATTERN).index(workload_of(c)), list(DRIVE).index(c["ru"]), c["op"], -c["util"], c["concurrency"])


def group(cells: Iterable[dict], meta_format: str) -> list[list[dict]]:
    """The runs of each cell of ``meta_format`` (the seeds of one configuration), in table order;
    scales other than the tables' RUs (diagnostics) are left out."""
    by: dict[tuple, list[dict]] = {}
    for c in cells:
        if format_of(c) == meta_format and c["ru"] in DRIVE and workload_of(c) in PATTERN:
            by.setdefault(cell_key(c), []).append(c)
    return [by[k] for k in sorted(by)]


def span(values: list[float], fmt: str, sep: str) -> str:
    """``lo{sep}hi`` of the formatted values, one value where both read the same; "-" when none."""
    if not values:
        return "-"
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}{sep}{hi}"


def _values(runs: list[dict], f: Callable[[dict], float | None]) -> list[float]:
    return [v for v in (f(c) for c in runs) if v is not None]


def _joined(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in sorted(set(values)))


def _head(c: dict) -> str:
    return (f"| {PATTERN[workload_of(c)]} | {DRIVE[c['ru']]} | {c['op']:.0%} | {c['util']:.0%} | "
            f"{c['concurrency']}x |")


def operator_table(cells: Iterable[dict]) -> list[str]:
    """One row per log-format cell: its seeds' WAF and hit ratios as ranges."""
    L = [OPERATOR_HEADER, _rule(OPERATOR_HEADER)]
    for runs in group(cells, "log"):
        L.append(f"{_head(runs[0])} {_joined(c['extent_reserve'] for c in runs)} | "
                 f"{_joined(c['seed'] for c in runs)} | **{span([c['waf'] for c in runs], '{:.3f}', '-')}** | "
                 f"{span([c['waf_without_metadata'] for c in runs], '{:.3f}', '-')} | "
                 f"{span([c['hit_ratio_extent'] for c in runs], '{:.3f}', '-')} | "
                 f"{span(_values(runs, lambda c: c.get('hit_ratio_lru_same_lookups')), '{:.3f}', '-')} | "
                 f"{span(_values(runs, lru_minus_extent), '{:+.3f}', ' to ')} |")
    return L


def v1_table(cells: Iterable[dict]) -> list[str]:
    """One row per format-v1 cell: WAF with and without the metadata writes, the metadata's share."""
    L = [V1_HEADER, _rule(V1_HEADER)]
    for runs in group(cells, "v1"):
        share = [100.0 * (c["recorded"]["meta_share"] or 0) for c in runs]
        L.append(f"{_head(runs[0])} {span([c['waf'] for c in runs], '{:.3f}', '-')} | "
                 f"**{span([c['waf_without_metadata'] for c in runs], '{:.3f}', '-')}** | "
                 f"{span(share, '{:.1f}%', '-')} |")
    return L


def facts(cells: list[dict]) -> dict:
    """The figures the doc's text quotes about the log-format runs: how many runs and cells, the
    WAF's range, LRU - extent's range (positive: extent eviction below LRU) and the cells where
    extent eviction came out above LRU, the seeds per cell by pattern and RU."""
    log = [c for c in cells if format_of(c) == "log" and c["ru"] in DRIVE and workload_of(c) in PATTERN]
    groups = group(log, "log")
    diffs = [(round(d, 3), c) for c in log for d in [lru_minus_extent(c)] if d is not None]
    seeds: dict[str, list[int]] = {}
    for runs in groups:
        k = f"{workload_of(runs[0])} {runs[0]['ru']}"
        seeds.setdefault(k, []).append(len({c["seed"] for c in runs}))
    return {
        "runs": len(log), "cells": len(groups),
        "waf": span([c["waf"] for c in log], "{:.3f}", "-"),
        "waf_without_metadata": span([c["waf_without_metadata"] for c in log], "{:.3f}", "-"),
        "lru_minus_extent": span([d for d, _ in diffs], "{:+.3f}", " to "),
        "extent_above_lru": sorted({f"{workload_of(c)} {c['ru']} {c['util']:.0%} {c['op']:.0%} {c['concurrency']}x "
                                    f"seed {c['seed']} ({d:+.3f})" for d, c in diffs if d < 0}),
        "seeds_per_cell": {k: f"{span([float(n) for n in v], '{:.0f}', '-')} over {len(v)} cells"
                           for k, v in seeds.items()},
    }


def replace_table(text: str, header: str, rows: list[str]) -> str:
    """``text`` with the table whose header line is ``header`` (it and the table lines after it)
    replaced by ``rows``; ValueError unless exactly one such table."""
    lines = text.split("\n")
    at = [i for i, line in enumerate(lines) if line == header]
    if len(at) != 1:
        raise ValueError(f"{len(at)} tables with the header {header[:60]!r}...")
    end = at[0]
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[:at[0]] + rows + lines[end:])


def load(directory: str) -> list[dict]:
    with open(os.path.join(directory, "results.json")) as f:
        return json.load(f)["cells"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lmcache_rawblock_bench.waf.tables",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--product", default="benchmarks/results/waf/replay-product",
                   help="the log-format replays' directory (results.json)")
    p.add_argument("--v1", default="benchmarks/results/waf/replay-product-v1",
                   help="format v1's replays' directory (results.json); '' for none")
    p.add_argument("--doc", help="rewrite this file's tables in place (found by their header lines), print none")
    a = p.parse_args(argv)
    cells = load(a.product)
    tables = [(OPERATOR_HEADER, operator_table(cells)), (RUNS_HEADER, runs_table(cells))]
    if a.v1:
        tables.insert(1, (V1_HEADER, v1_table(load(a.v1))))
    if a.doc:
        with open(a.doc) as f:
            text = f.read()
        for header, rows in tables:
            text = replace_table(text, header, rows)
        with open(a.doc, "w") as f:
            f.write(text)
    else:
        print("\n\n".join("\n".join(rows) for _, rows in tables))
    print(json.dumps(facts(cells), indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
