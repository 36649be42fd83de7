#!/usr/bin/env python3
"""Collect the issues' targets from the committed results into one table.

    python3 benchmarks/summarize.py [--results benchmarks/results] [--readme README.md]

Reads, in ``--results``:

* ``device.json`` (issue 2), ``uring.json`` (issue 3): JSON written by the bench scripts;
* ``core.json`` (issue 4) if present, else the markdown tables of ``core.md``;
* ``plugin.json`` (issue 5) if present, else the markdown tables of ``plugin.md``;
* ``cli-*.json``: snapshots of ``python -m lmcache_rawblock bench`` (targets evaluated by
  ``lmcache_rawblock.bench.report.targets``).

Writes ``SUMMARY.md`` there (issue, target, measured, ratio, met?, source file, command) and
rewrites README.md's text between ``<!-- results:start -->`` and ``<!-- results:end -->``
(the markers are added at the end of the "## Benchmark results" section when missing).
Nothing else in the README is touched.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from typing import Any, Callable, Iterable

START = "<!-- results:start -->"
END = "<!-- results:end -->"
SECTION = "## Benchmark results"
HEADERS = ["issue", "target", "measured", "ratio", "met?", "source", "command"]


def row(issue: str, target: str, measured: str, ratio: float | None, goal: float | None, higher: bool,
        source: str, command: str, met: str | None = None) -> dict:
    if met is None:
        if ratio is None:
            met = "not measured"
        elif goal is None:
            met = "reported"
        else:
            met = "met" if (ratio >= goal if higher else ratio <= goal) else "not met"
    return {"issue": issue, "target": target, "measured": measured, "ratio": ratio, "met": met,
            "source": source, "command": command}


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


# --------------------------------------------------------------------------- markdown tables


def md_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every pipe table in text: (header cells, body rows), cells stripped, ** removed."""
    tables = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|") and i + 1 < len(lines) and re.match(r"^\s*\|[\s:|-]+\|\s*$",
                                                                                 lines[i + 1]):
            head = _cells(lines[i])
            body = []
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                body.append(_cells(lines[i]))
                i += 1
            tables.append((head, body))
        else:
            i += 1
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]


def _num(cell: str) -> float | None:
    m = re.search(r"-?\d+(?:\.\d+)?", cell.replace(",", ""))
    return float(m.group(0)) if m else None


def _col(head: list[str], *needles: str) -> int:
    for i, h in enumerate(head):
        if all(n.lower() in h.lower() for n in needles):
            return i
    raise KeyError(f"no column with {needles} in {head}")


def md_command(text: str) -> str:
    m = re.search(r"Command[^`\n]*`([^`]+)`", text)
    if m:
        return m.group(1)
    m = re.search(r"Command line:\s*```\s*\n([^\n]+)", text)
    return m.group(1).strip() if m else ""


# --------------------------------------------------------------------------- sources


def from_device(d: dict, source: str) -> list[dict]:
    cmd = " ".join(d.get("machine", {}).get("command", []))
    out = []
    for r in d.get("rows", []):
        if r.get("target") is None:
            continue
        out.append(row("2", f"device {r['op']} {r['mode']} {_size(r['size'])}: ours/Rust ≤ {r['target']}x",
                       f"{r['ratio']:.3f}x ({r['ours_us']:.2f} vs {r['rust_us']:.2f} µs)", r["ratio"], r["target"],
                       False, source, cmd))
    return out


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def from_uring(d: dict, source: str) -> list[dict]:
    cmd = d.get("command", "")
    out = []
    for r in d.get("batch", []):
        out.append(row("3", f"io_uring {r['op']} {r['batch']} {r['mode']}: ours/Rust ≤ {r['target']}x",
                       f"{r['ratio']:.2f}x", r["ratio"], r["target"], False, source, cmd))
    for r in d.get("limit", []):
        goal = r.get("target")
        tgt = f"{r['case']} ({r['metric']}): ours/fio ≥ {goal}x" if goal is not None else \
            f"{r['case']} ({r['metric']}): ours/fio, report"
        out.append(row("3", tgt, f"{r['ratio']:.2f}x ({r['ours']:,.0f} vs {r['fio']:,.0f})", r["ratio"], goal, True,
                       source, cmd))
    return out


def from_core_md(text: str, source: str) -> list[dict]:
    cmd = md_command(text)
    out = []
    for head, body in md_tables(text):
        joined = " ".join(head).lower()
        if "slots" in joined and "ours batched vs lmcache seq" in joined:
            c = _col(head, "ours batched vs lmcache seq")
            drops = _col(head, "drops")
            for r in body:
                v = _num(r[c])
                out.append(row("4", f"recovery validation {r[1]} slots ({r[0]}): batched ≥ 8x sequential "
                                    "(ours batched vs LMCache seq)",
                               f"{_x(v)}; drops {r[drops]}", v, 8, True, source, cmd))
        elif head and head[0] == "keys" and "lmcache / ours" in joined:
            c = _col(head, "lmcache / ours")
            for r in body:
                if r[0] == "10000":
                    v = _num(r[c])
                    out.append(row("4", "delete_many 10000 keys: ≥ 30x faster than LMCache's core",
                                   f"{_x(v)} ({r[1]} vs {r[2]} µs)", v, 30, True, source, cmd))
        elif head and head[0] == "engine" and "op" not in head and "lmcache / ours" in joined:
            c = _col(head, "lmcache / ours")
            for r in body:
                v = _num(r[c])
                out.append(row("4", f"open/recovery 100k entries ({r[0]}): ≥ 10x faster than LMCache's",
                               f"{_x(v)} ({r[1]} vs {r[2]} s)", v, 10, True, source, cmd))
        elif head[:2] == ["engine", "op"] and "lmcache / ours" in joined:
            if "medium" in head:  # engine | op | medium | ours CPU | LMCache CPU | ratio | met? | wall ...
                c, o, lm = _col(head, "lmcache / ours", "cpu"), _col(head, "ours cpu"), _col(head, "lmcache cpu")
                m, w = head.index("medium"), _col(head, "lmcache / ours", "wall")
            else:  # the older form: engine | op | ours | LMCache core | ratio | met?
                c, o, lm, m, w = _col(head, "lmcache / ours"), 2, 3, None, None
            # newer form: the kernel floor of the same transfers and LMCache / floor beside it
            fl = next((i for i, h in enumerate(head) if "kernel floor" in h.lower()), None)
            best = next((i for i, h in enumerate(head) if "lmcache / floor" in h.lower()), None)
            for r in body:
                v = _num(r[c])
                where = r[0] if m is None else f"{r[0]}, {r[m]}"
                wall = "" if w is None else f"; wall {_x(_num(r[w]))}"
                floor = ""
                if fl is not None and best is not None and _num(r[fl]) is not None:
                    floor = f"; kernel floor {r[fl]} µs, best possible {r[best]}"
                out.append(row("4", f"per-key CPU {r[1]} 64x64KiB ({where}): ≥ 5x lower than LMCache's",
                               f"{_x(v)} ({r[o]} vs {r[lm]} µs/key CPU{wall}{floor})", v, 5, True, source, cmd))
    m = re.search(r"\*\*([\d.]+) bytes/entry\*\*", text)
    if m:
        v = float(m.group(1))
        out.append(row("4", "index memory: ≤ 150 bytes/entry + key bytes", f"{v:.1f} B/entry + keys", v, 150, False,
                       source, cmd))
    return out


def from_plugin_md(text: str, source: str) -> list[dict]:
    cmd = md_command(text)
    out = []
    for head, body in md_tables(text):
        if head[:2] == ["backend", "N"] and any("fan-out / override" in h for h in head):
            c = _col(head, "fan-out / override")
            for r in body:
                if r[0] == "ours" and r[1] == "1000":
                    v = _num(r[c])
                    out.append(row("5", "batched_remove N=1000: override ≥ 10x the fan-out (ours)",
                                   f"{_x(v)} ({r[2]} vs {r[3]})", v, 10, True, source, cmd))
    return out


def from_cli(d: dict, source: str) -> list[dict]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from lmcache_rawblock.bench.report import targets

    cmd = " ".join(d.get("machine", {}).get("command", []))
    py = d.get("machine", {}).get("python_executable", "")
    comps = d.get("competitors", {})
    lmc = comps.get("lmcache", {})
    where = source + ("" if not lmc else " (LMCache " + (lmc.get("version") or "?") + ")" if lmc.get("available")
                      else " (LMCache not installed)")
    out = []
    for t in targets(d):
        if t["ratio"] is None:
            continue  # a competitor was missing: nothing measured
        out.append(row(t["issue"], t["target"], t["measured"], t["ratio"], t["goal"], t["higher_is_better"], where,
                       cmd + (f"  [{py}]" if py and "venv" in py else ""), met=t["met"]))
    return out


def collect(results_dir: str) -> tuple[list[dict], list[str]]:
    """All target rows found in results_dir, sorted by issue; plus notes on sources missing."""
    rows: list[dict] = []
    notes: list[str] = []

    def load(name: str, fn: Callable[[Any, str], list[dict]], kind: str) -> bool:
        path = os.path.join(results_dir, name)
        if not os.path.exists(path):
            return False
        with open(path, encoding="utf-8") as f:
            data = json.load(f) if kind == "json" else f.read()
        rows.extend(fn(data, name))
        return True

    load("device.json", from_device, "json")
    load("uring.json", from_uring, "json")
    for base, md_fn in (("core", from_core_md), ("plugin", from_plugin_md)):
        if not load(f"{base}.json", lambda d, s: from_cli(d, s) if "schema" in d else [], "json"):
            if not load(f"{base}.md", md_fn, "md"):
                notes.append(f"{base}.md/json: not found")
    for path in sorted(glob.glob(os.path.join(results_dir, "cli-*.json"))):
        load(os.path.basename(path), from_cli, "json")
    rows.sort(key=lambda r: int(re.sub(r"\D", "", r["issue"]) or 0))
    return rows, notes


def _esc(s: str) -> str:
    return s.replace("|", "\\|")


def table(rows: Iterable[dict]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for r in rows:
        met = {"met": "**met**", "not met": "not met"}.get(r["met"], r["met"])
        cmd = f"`{_esc(r['command'])}`" if r["command"] else ""
        ratio = f"{r['ratio']:.1f} B" if "B/entry" in r["measured"] and r["ratio"] is not None else _x(r["ratio"])
        lines.append(f"| {r['issue']} | {_esc(r['target'])} | {_esc(r['measured'])} | {ratio} | {met} | "
                     f"`{r['source']}` | {cmd} |")
    return "\n".join(lines)


def summary_md(rows: list[dict], notes: list[str]) -> str:
    met = sum(1 for r in rows if r["met"] == "met")
    judged = sum(1 for r in rows if r["met"] in ("met", "not met"))
    text = ["# Targets of the issues: measured against target", "",
            "Generated by `python3 benchmarks/summarize.py` from the result files in this directory; "
            "do not edit by hand. Ratios: for *ours/Rust* and *ours/fio* rows as in the row's target "
            "(time ratios lower is better, bandwidth ratios higher is better); *≥ Nx faster/lower* rows "
            "give the speed-up (other / ours). Each row names the file it comes from and the command that "
            "produced that file; the machine is described in that file.", "",
            f"{met} of {judged} targets met.", "", table(rows), ""]
    for n in notes:
        text.append(f"- note: {n}")
    return "\n".join(text).rstrip() + "\n"


def readme_block(rows: list[dict]) -> str:
    met = sum(1 for r in rows if r["met"] == "met")
    judged = sum(1 for r in rows if r["met"] in ("met", "not met"))
    lines = [START, "",
             f"Generated from `benchmarks/results/` by `python3 benchmarks/summarize.py` ({met} of {judged} "
             "targets met; commands and sources in "
             "[`benchmarks/results/SUMMARY.md`](benchmarks/results/SUMMARY.md)).", "",
             "| issue | target | measured | met? | source |", "|---|---|---|---|---|"]
    for r in rows:
        met_s = {"met": "**met**"}.get(r["met"], r["met"])
        lines.append(f"| {r['issue']} | {_esc(r['target'])} | {_esc(r['measured'])} | {met_s} | `{r['source']}` |")
    lines += ["", END]
    return "\n".join(lines)


def update_readme(text: str, block: str) -> str:
    """Replace the text between the markers; add the markers at the end of the benchmark
    section when they are missing. Raises ValueError if neither markers nor section exist."""
    if START in text and END in text:
        a = text.index(START)
        b = text.index(END, a) + len(END)
        return text[:a] + block + text[b:]
    if START in text or END in text:
        raise ValueError("README has only one of the results markers")
    m = re.search(r"^" + re.escape(SECTION) + r"[^\n]*\n", text, re.MULTILINE)
    if not m:
        raise ValueError(f"README has no '{SECTION}' section")
    nxt = re.search(r"^## ", text[m.end():], re.MULTILINE)
    end = m.end() + nxt.start() if nxt else len(text)
    before = text[:end].rstrip("\n")
    after = text[end:]
    return before + "\n\n" + block + "\n" + ("\n" + after if after else "")


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=os.path.join(here, "results"))
    ap.add_argument("--readme", default=os.path.join(os.path.dirname(here), "README.md"))
    ap.add_argument("--no-readme", action="store_true", help="only write SUMMARY.md")
    args = ap.parse_args(argv)
    rows, notes = collect(args.results)
    with open(os.path.join(args.results, "SUMMARY.md"), "w", encoding="utf-8") as f:
        f.write(summary_md(rows, notes))
    if not args.no_readme:
        with open(args.readme, encoding="utf-8") as f:
            text = f.read()
        new = update_readme(text, readme_block(rows))
        if new != text:
            with open(args.readme, "w", encoding="utf-8") as f:
                f.write(new)
    print(f"{len(rows)} target rows -> {os.path.join(args.results, 'SUMMARY.md')}"
          + ("" if args.no_readme else f", {args.readme}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
