"""The benchmark table of docs/benchmarks.md, from one run's results.json.

    python -m lmcache_rawblock_bench.summary benchmarks/results/full/results.json [--doc docs/benchmarks.md]

Rewrites the document's text between ``<!-- results:start -->`` and ``<!-- results:end -->``
(the markers are added at the end of the "## Benchmark results" section when missing): one row
per measurement of that run that has a goal, and a line naming the command, the commit, the
date and the machine the figures come from; the link to results.json is relative to the
document. Nothing else in the document is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from .common import machine_summary
from .report import goals

START = "<!-- results:start -->"
END = "<!-- results:end -->"
SECTION = "## Benchmark results"


def _esc(s: str) -> str:
    return s.replace("|", "\\|")


def provenance(results: dict, source: str, base: str = ".", href: str | None = None) -> str:
    """Where the figures come from: file, command, commit, date, machine. The interpreter is
    named relative to *base* when it lives below it (a project virtualenv). The file is shown
    as *source* and linked as *href* (default *source*), relative to the document."""
    m = results.get("machine", {})
    cmd = " ".join(m.get("command") or [])
    py = m.get("python_executable") or ""
    if py and cmd.startswith("python -m"):
        rel = os.path.relpath(py, base)
        cmd = (rel if not rel.startswith("..") else "python") + cmd[len("python"):]
    src = m.get("source") or {}
    commit = f"commit `{src['commit'][:12]}`" if src.get("commit") else "an installed package (no commit recorded)"
    if src.get("modified"):
        commit += f" (with uncommitted changes in {', '.join(src['modified'])})"
    when = (m.get("timestamp") or "")[:10]
    return (f"From one run, [`{source}`]({href or source}): `{cmd}` on {commit}, {when}, "
            f"{machine_summary(m)}; {results.get('elapsed_s', 0) / 60:.0f} min.")


def readme_block(results: dict, source: str, base: str = ".", href: str | None = None) -> str:
    lines = [START, "", provenance(results, source, base, href), "",
             "| measurement | result | goal | met | figures |", "|---|---|---|---|---|"]
    for g in goals(results):
        met = "met" if g["met"] else "**not met**"
        lines.append(f"| {_esc(g['label'])} | {g['shown']} | {g['goal_text']} | {met} | {_esc(g['detail'])} |")
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
    ap = argparse.ArgumentParser(prog="python -m lmcache_rawblock_bench.summary",
                                 description="Write the benchmark table of docs/benchmarks.md from one run's results.json.")
    ap.add_argument("results", help="results.json of the run, e.g. benchmarks/results/full/results.json")
    ap.add_argument("--doc", "--readme", dest="readme", default="docs/benchmarks.md",
                    help="document to update (default ./docs/benchmarks.md); --readme is the older name")
    args = ap.parse_args(argv)
    with open(args.results, encoding="utf-8") as f:
        results = json.load(f)
    results_path = os.path.abspath(args.results)
    readme_dir = os.path.dirname(os.path.abspath(args.readme))
    # Shown relative to the tree both live in (the repository), linked relative to the document.
    root = os.path.commonpath([results_path, readme_dir])
    source = os.path.relpath(results_path, root)
    href = os.path.relpath(results_path, readme_dir)
    with open(args.readme, encoding="utf-8") as f:
        text = f.read()
    try:
        new = update_readme(text, readme_block(results, source, root, href))
    except ValueError as exc:
        print(f"error: {args.readme}: {exc}", file=sys.stderr)
        return 2
    if new != text:
        with open(args.readme, "w", encoding="utf-8") as f:
            f.write(new)
    print(f"{len(goals(results))} rows from {args.results} -> {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
