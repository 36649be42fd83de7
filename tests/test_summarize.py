"""benchmarks/summarize.py on a temporary copy of a results directory and README.

Every test builds its own inputs, so it fails if the parser, the target judgement or the
README rewrite changes behaviour; no timing is measured here.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("summarize", REPO / "benchmarks" / "summarize.py")
summarize = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summarize)

README = """# Project

Intro.

## Benchmark results

Committed in `benchmarks/results/`.

## Licence

MIT.
"""

CORE_MD = """# Native RawBlockCore vs LMCache's RawBlockCore

Command: `.venv/bin/python benchmarks/bench_core.py --reps 3`

## delete_many

| keys | ours | LMCache core | dict loop | LMCache / ours (target ≥ 30× at 10000) | met? | dict loop / ours |
|---|---|---|---|---|---|---|
| 1000 | 87.0 | 1413.2 | 110.3 | 16.3× | – | 1.27× |
| 10000 | 100.0 | 4000.0 | 764.2 | 40.0× | yes | 0.79× |

## Open

| engine | ours (s) | LMCache core (s) | LMCache / ours (target ≥ 10×) | met? |
|---|---|---|---|---|
| posix | 0.810 | 2.459 | 3.0× | no |

Index memory: **160.5 bytes/entry** (target ≤ 150 + key bytes: not met).

## Per-key CPU cost, 64 × 64 KiB

| engine | op | medium | ours CPU | LMCache CPU | LMCache / ours CPU (target ≥ 5×) | met? | ours wall | LMCache wall | LMCache / ours wall |
|---|---|---|---|---|---|---|---|---|---|
| posix | put | page cache | 20.0 | 44.0 | 2.2× | no | 21.0 | 40.0 | 1.9× |
| io_uring | load | O_DIRECT | 10.0 | 60.0 | 6.0× | yes | 70.0 | 77.0 | 1.1× |
"""

CPU_MD_OLD = """Command: `python benchmarks/bench_core.py`

| engine | op | ours | LMCache core | LMCache / ours (target ≥ 5×) | met? |
|---|---|---|---|---|---|
| posix | put | 20.6 | 45.0 | 2.2× | no |
"""

PLUGIN_MD = """# Plugin

Command (repository root): `.venv/bin/python benchmarks/bench_plugin.py --md x.md`

| backend | N | fan-out | override | fan-out / override | per key (override) |
|---|---:|---:|---:|---:|---:|
| ours | 100 | 303.4 µs | 214.9 µs | **1.41x** | 2.1 µs |
| ours | 1000 | 3.39 ms | 0.30 ms | **11.30x** | 0.3 µs |
| lmcache | 1000 | 5.80 ms | 4.19 ms | **1.38x** | 4.2 µs |
"""

DEVICE = {"machine": {"command": ["python3", "benchmarks/bench_device.py"]},
          "rows": [{"op": "pread_into", "mode": "buffered", "size": 4096, "ours_us": 1.0, "rust_us": 1.5,
                    "ratio": 0.6667, "target": 0.8},
                   {"op": "pread_into", "mode": "odirect", "size": 1 << 20, "ours_us": 2.0, "rust_us": 1.0,
                    "ratio": 2.0, "target": 1.0}]}

URING = {"command": "python3 benchmarks/bench_uring.py",
         "batch": [{"op": "read", "batch": "256 x 4 KiB", "mode": "page cache", "ratio": 0.75, "target": 0.7}],
         "limit": [{"case": "1 MiB seq read QD16", "metric": "MiB/s", "ours": 990.0, "fio": 1000.0,
                    "ratio": 0.99, "target": 0.95},
                   {"case": "4 KiB rand read QD64", "metric": "IOPS", "ours": 8.0, "fio": 10.0, "ratio": 0.8,
                    "target": None}]}


def cli_snapshot(lmcache: bool) -> dict:
    return {
        "schema": 1,
        "machine": {"command": ["python -m lmcache_rawblock", "bench", "--parts", "core,seeds"],
                    "python_executable": "/usr/bin/python3"},
        "competitors": {"lmcache": {"available": lmcache, "version": "0.5.6" if lmcache else None}},
        "core": {"rows": [{"op": "delete_many", "entries": 10000, "engine": "posix",
                           "speedup": 12.0 if lmcache else None}],
                 "index": [{"entries": 10000, "engine": "posix", "bytes_per_entry_without_keys": 90.0}],
                 "cpu": []},
        "seeds": {"remove": [{"backend": "ours", "n": 1000, "speedup": 2.5}],
                  "recovery": [{"mode": "page cache", "slots": 3000, "ours_speedup": 9.0}]},
    }


@pytest.fixture
def tree(tmp_path):
    res = tmp_path / "results"
    res.mkdir()
    (res / "device.json").write_text(json.dumps(DEVICE))
    (res / "uring.json").write_text(json.dumps(URING))
    (res / "core.md").write_text(CORE_MD)
    (res / "plugin.md").write_text(PLUGIN_MD)
    (res / "cli-lmcache-full.json").write_text(json.dumps(cli_snapshot(True)))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    return res, readme


def by_target(rows, needle, source=None):
    hits = [r for r in rows if needle in r["target"] and (source is None or r["source"].startswith(source))]
    assert len(hits) == 1, (needle, [r["target"] for r in rows])
    return hits[0]


def test_collect_judges_each_source(tree):
    res, _ = tree
    rows, notes = summarize.collect(str(res))
    assert notes == []
    assert by_target(rows, "pread_into buffered 4 KiB")["met"] == "met"
    assert by_target(rows, "pread_into odirect 1 MiB")["met"] == "not met"
    assert by_target(rows, "256 x 4 KiB")["met"] == "not met"  # 0.75 > 0.7
    assert by_target(rows, "1 MiB seq read QD16")["met"] == "met"  # bandwidth: higher is better
    assert by_target(rows, "4 KiB rand read QD64")["met"] == "reported"
    d = by_target(rows, "delete_many 10000 keys")
    assert d["ratio"] == 40.0 and d["met"] == "met" and d["source"] == "core.md"
    assert d["command"] == ".venv/bin/python benchmarks/bench_core.py --reps 3"
    assert by_target(rows, "open/recovery 100k entries (posix)")["ratio"] == 3.0
    mem = by_target(rows, "index memory:", "core.md")
    assert mem["ratio"] == 160.5 and mem["met"] == "not met"
    rem = by_target(rows, "override ≥ 10x", "plugin.md")
    assert rem["ratio"] == 11.3 and rem["met"] == "met"  # the ours row, not LMCache's 1.38x
    assert [r["issue"] for r in rows] == sorted((r["issue"] for r in rows), key=int)


def test_per_key_cpu_rows_name_the_medium_and_carry_wall():
    rows = summarize.from_core_md(CORE_MD, "core.md")
    pc = by_target(rows, "per-key CPU put 64x64KiB (posix, page cache)")
    assert pc["ratio"] == 2.2 and pc["met"] == "not met"
    assert pc["measured"] == "2.20x (20.0 vs 44.0 µs/key CPU; wall 1.90x)"
    od = by_target(rows, "per-key CPU load 64x64KiB (io_uring, O_DIRECT)")
    assert od["ratio"] == 6.0 and od["met"] == "met"
    # the older table without medium and wall columns still reads
    old = by_target(summarize.from_core_md(CPU_MD_OLD, "core.md"), "per-key CPU put 64x64KiB (posix)")
    assert old["ratio"] == 2.2 and old["measured"] == "2.20x (20.6 vs 45.0 µs/key CPU)"


def test_cli_snapshot_rows_carry_competitor_and_skip_unmeasured(tree):
    res, _ = tree
    (res / "cli-quick.json").write_text(json.dumps(cli_snapshot(False)))
    rows, _ = summarize.collect(str(res))
    full = by_target(rows, "delete_many 10000 (posix)", "cli-lmcache-full.json")
    assert full["ratio"] == 12.0 and full["met"] == "not met"
    assert "LMCache 0.5.6" in full["source"]
    # Without LMCache the delete_many speed-up is not measured and gets no row from cli-quick.
    assert not [r for r in rows if r["source"].startswith("cli-quick") and "delete_many" in r["target"]]
    rec = by_target(rows, "recovery validation 3000 slots", "cli-quick.json")
    assert rec["met"] == "met" and "LMCache not installed" in rec["source"]


def test_json_sidecar_preferred_over_markdown(tree):
    res, _ = tree
    (res / "plugin.json").write_text(json.dumps(cli_snapshot(True)))
    rows, _ = summarize.collect(str(res))
    assert not [r for r in rows if r["source"] == "plugin.md"]
    assert [r for r in rows if r["source"].startswith("plugin.json")]


def test_missing_source_is_noted(tree):
    res, _ = tree
    (res / "core.md").unlink()
    rows, notes = summarize.collect(str(res))
    assert notes == ["core.md/json: not found"]
    assert not [r for r in rows if r["source"] == "core.md"]


def test_main_writes_summary_and_readme_block_idempotently(tree):
    res, readme = tree
    assert summarize.main(["--results", str(res), "--readme", str(readme)]) == 0
    summary = (res / "SUMMARY.md").read_text()
    assert "| issue | target | measured | ratio | met? | source | command |" in summary
    assert "40.00x" in summary and "160.5 B" in summary
    text = readme.read_text()
    # The block sits at the end of the benchmark section, before the next section, and the
    # rest of the README is untouched.
    assert text.index("## Benchmark results") < text.index(summarize.START) < text.index(summarize.END) \
        < text.index("## Licence")
    assert text.replace(text[text.index(summarize.START):text.index(summarize.END) + len(summarize.END)], "") \
        .replace("\n", "") == README.replace("\n", "")
    assert "11.30x" in text
    first = text
    assert summarize.main(["--results", str(res), "--readme", str(readme)]) == 0
    assert readme.read_text() == first  # a second run changes nothing


def test_readme_rewrite_replaces_only_between_markers(tree):
    res, readme = tree
    readme.write_text(README.replace("MIT.", f"MIT.\n\n{summarize.START}\nold\n{summarize.END}\n\nTail."))
    summarize.main(["--results", str(res), "--readme", str(readme)])
    text = readme.read_text()
    assert "old" not in text and text.endswith("Tail.\n") and text.count(summarize.START) == 1


def test_readme_without_section_or_with_one_marker_is_refused():
    with pytest.raises(ValueError, match="no '## Benchmark results'"):
        summarize.update_readme("# x\n", "B")
    with pytest.raises(ValueError, match="only one"):
        summarize.update_readme(f"## Benchmark results\n{summarize.START}\n", "B")


def test_md_tables_parses_pipes_and_bold():
    tables = summarize.md_tables("x\n| a | b |\n|---|--:|\n| **1.5x** | 2 |\n\ny")
    assert tables == [(["a", "b"], [["1.5x", "2"]])]


CPU_MD_FLOOR = """# x

Command: `python benchmarks/bench_core.py --parts cpu`

| engine | op | medium | ours CPU | LMCache CPU | LMCache / ours CPU (target ≥ 5×) | met? | kernel floor | LMCache / floor (best possible) | ours wall | LMCache wall | LMCache / ours wall |
|---|---|---|---|---|---|---|---|---|---|---|---|
| posix | load | page cache | 12.5 | 18.1 | 1.5× | no | 8.2 | 2.2× | 12.5 | 18.1 | 1.5× |
| io_uring | load | O_DIRECT | 13.4 | 30.8 | 2.3× | no | – | – | 68.1 | 77.8 | 1.1× |
"""


def test_per_key_cpu_rows_carry_the_kernel_floor_when_measured():
    rows = summarize.from_core_md(CPU_MD_FLOOR, "core.md")
    pc = by_target(rows, "per-key CPU load 64x64KiB (posix, page cache)")
    assert pc["ratio"] == 1.5 and pc["met"] == "not met"
    assert pc["measured"] == ("1.50x (12.5 vs 18.1 µs/key CPU; wall 1.50x; kernel floor 8.2 µs, "
                              "best possible 2.2×)")
    od = by_target(rows, "per-key CPU load 64x64KiB (io_uring, O_DIRECT)")
    assert od["measured"] == "2.30x (13.4 vs 30.8 µs/key CPU; wall 1.10x)"  # floor not measured: left out
