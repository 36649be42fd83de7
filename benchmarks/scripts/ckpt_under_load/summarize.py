"""Side-by-side tables of fill.py runs (their --out JSON files).

    python3 benchmarks/scripts/ckpt_under_load/summarize.py before.json after.json [...]

Prints the summary of each run as a column, then the timeline of each run (changes made and
made durable, checkpoints, the journal) at every 10 s of the fill.
"""

from __future__ import annotations

import json
import sys

ROWS = [
    ("entries put", "entries_put", "{:,}"),
    ("fill seconds", "fill_seconds", "{:.1f}"),
    ("puts per second", "puts_per_second", "{:,}"),
    ("checkpoints written during the fill", "checkpoints_written_during_fill", "{:,}"),
    ("changes made durable during the fill", "persisted_during_fill", "{:,}"),
    ("changes made durable per minute", "persisted_per_minute", "{:,}"),
    ("changes pending at the end of the fill", "pending_records_at_end_of_fill", "{:,}"),
    ("most changes pending at a sample", "max_pending_records", "{:,}"),
    ("most journal bytes at a sample", "max_journal_bytes", "{:,}"),
    ("checkpoint after the fill, s", "final_checkpoint_seconds", "{:.2f}"),
    ("close, s", "close_seconds", "{:.2f}"),
]


def _fmt(fmt: str, v) -> str:
    return "n/a" if v is None else fmt.format(v)


def main(paths: list[str]) -> None:
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    print("| figure | " + " | ".join(paths) + " |")
    print("|---|" + "---:|" * len(runs))
    for label, key, fmt in ROWS:
        print(f"| {label} | " + " | ".join(_fmt(fmt, r["summary"].get(key)) for r in runs) + " |")
    for label, get in (("reopen, new process (constructor), s", lambda s: s["reopen_fresh_process"]["constructor_s"]),
                       ("reopen, same process, s", lambda s: s["reopen_same_process_s"])):
        vals = []
        for r in runs:
            try:
                vals.append(f"{get(r['summary']):.2f}")
            except (KeyError, TypeError):
                vals.append("n/a")
        print(f"| {label} | " + " | ".join(vals) + " |")
    for p, r in zip(paths, runs):
        print(f"\n{p}: every 10 s of the fill\n")
        print("| t (s) | changes made | made durable | checkpoints | pending pages | journal MiB |")
        print("|---:|---:|---:|---:|---:|---:|")
        nxt = 0.0
        for s in r["samples"]:
            if s["t"] + 0.5 < nxt:
                continue
            jb = s.get("journal_bytes")
            jm = "n/a" if jb is None else f"{jb / 2**20:.1f}"
            print(f"| {s['t']:.0f} | {s['changes']:,} | {s['persisted']:,} | {s['checkpoints_written']} | "
                  f"{s['pending_pages']} | {jm} |")
            nxt = s["t"] + 10


if __name__ == "__main__":
    main(sys.argv[1:])
