"""lmcache_rawblock_bench.summary: the README's benchmark table from one run's results.json.

Every test builds its own inputs, so it fails if the goal judgement, the provenance line or
the README rewrite changes behaviour; no timing is measured here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmcache_rawblock_bench import report, summary

README = """# Project

Intro.

## Benchmark results

Committed in `benchmarks/results/`.

## Licence

MIT.
"""


def run_results() -> dict:
    """A results.json with one row of every part that carries a goal."""
    return {
        "schema": 2,
        "elapsed_s": 900.0,
        "machine": {"command": ["python -m lmcache_rawblock", "bench", "--suite", "full"],
                    "python_executable": "/repo/.venv-lmcache/bin/python", "timestamp": "2026-12-01T10:00:00+00:00",
                    "os": "Debian 12", "debian_version": "12.11", "kernel": "6.1", "cpu_model": "Xeon", "cores": 2,
                    "memory_bytes": 8 << 30, "python": "3.11.7",
                    "source": {"commit": "0123456789abcdef0123", "modified": []}},
        "device": {"results": [
            {"op": "pread_into", "mode": "buffered", "size": 4096, "ours_s": 1e-6, "rust_s": 1.5e-6, "ratio": 0.6667},
            {"op": "pread_into", "mode": "odirect", "size": 1 << 20, "ours_s": 2e-6, "rust_s": 1e-6, "ratio": 2.0},
            {"op": "pread_into", "mode": "odirect", "size": 65536, "ours_s": 2e-6, "rust_s": 1e-6, "ratio": 2.0}]},
        "uring": {"results": [
            {"op": "batched_read", "mode": "buffered", "size": 4096, "depth": 256, "ours_batch_s": 3e-4,
             "rust_batch_s": 4e-4, "ratio": 0.75},
            {"op": "batched_read", "mode": "buffered", "size": 4096, "depth": 64, "ours_batch_s": 1e-4,
             "rust_batch_s": 4e-4, "ratio": 0.25}]},
        "limit": {"available": True, "results": [
            {"rw": "read", "size": 1 << 20, "depth": 32, "ours_bytes_per_s": 990e6, "fio_bytes_per_s": 1000e6,
             "ratio": 0.99},
            {"rw": "randread", "size": 4096, "depth": 64, "ours_bytes_per_s": 8e6, "fio_bytes_per_s": 10e6,
             "ratio": 0.8}]},
        "core": {
            "rows": [{"op": "delete_many", "entries": 10000, "engine": "posix", "speedup": 40.0, "ours_s": 1e-4,
                      "lmcache_s": 4e-3},
                     {"op": "open_recovery", "entries": 100000, "engine": "io_uring", "speedup": 3.0, "ours_s": 1.0,
                      "lmcache_s": 3.0}],
            "index": [{"entries": 1000, "engine": "posix", "bytes_per_entry_without_keys": 300.0},
                      {"entries": 100000, "engine": "posix", "bytes_per_entry_without_keys": 94.6}],
            "cpu": [{"op": "put_many", "engine": "io_uring", "medium": "O_DIRECT", "speedup": 2.5,
                     "ours_cpu_per_key_s": 18.8e-6, "lmcache_cpu_per_key_s": 47.2e-6, "floor_cpu_per_key_s": 8.4e-6,
                     "best_possible": 5.6}]},
        "recovery": {"rows": [
            {"medium": "page cache", "slots": 3000, "ours_batched_vs_lmcache_sequential": 9.0,
             "times_s": {"lmcache sequential": 9e-3, "ours batched": 1e-3}},
            {"medium": "page cache", "slots": 100, "ours_batched_vs_lmcache_sequential": None, "times_s": {}}]},
        "plugin": {"remove": [{"backend": "ours", "n": 1000, "speedup": 11.9, "fanout_s": 2.06e-3,
                               "override_s": 1.73e-4},
                              {"backend": "lmcache", "n": 1000, "speedup": 1.2, "fanout_s": 1e-3, "override_s": 1e-3}]},
    }


def by_label(rows, needle):
    hits = [r for r in rows if needle in r["label"]]
    assert len(hits) == 1, (needle, [r["label"] for r in rows])
    return hits[0]


def test_goals_judge_each_part_and_name_what_is_compared():
    rows = report.goals(run_results())
    d = by_label(rows, "pread_into, 4 KiB, page cache")
    assert d["met"] and d["goal_text"] == "≤ 0.8x" and "ours / LMCache's Rust device" in d["label"]
    assert not by_label(rows, "pread_into, 1 MiB, O_DIRECT")["met"]
    assert not [r for r in rows if r["label"].startswith("pread_into, 64 KiB")]  # no goal at 64 KiB
    u = by_label(rows, "io_uring batched_read, 256 x 4 KiB")
    assert not u["met"] and u["goal_text"] == "≤ 0.7x"  # 0.75 > 0.7
    assert not [r for r in rows if "64 x 4 KiB" in r["label"]]  # goals are at depth 256 for 4 KiB
    lim = by_label(rows, "read 1 MiB QD32")
    assert lim["met"] and lim["higher_is_better"] and lim["goal_text"] == "≥ 0.95x"
    assert not [r for r in rows if "randread" in r["label"]]
    dm = by_label(rows, "delete_many, 10,000 keys (posix): LMCache's core time / ours")
    assert dm["met"] and dm["shown"] == "40.00x" and dm["detail"] == "4.00 ms vs 100.0 µs"
    assert not by_label(rows, "open with recovery, 100,000 entries (io_uring)")["met"]
    mem = by_label(rows, "index memory")
    assert "100,000 entries" in mem["label"] and mem["shown"] == "94.6 B" and mem["met"]  # the largest index only
    cpu = by_label(rows, "put_many CPU per key, 64 x 64 KiB (io_uring, O_DIRECT)")
    assert cpu["detail"] == "47.2 vs 18.8 µs; kernel floor 8.4 µs, best possible 5.60x"
    assert by_label(rows, "slot-header validation, 3,000 headers")["met"]
    assert not [r for r in rows if "100 headers" in r["label"]]  # LMCache was not measured there
    rem = by_label(rows, "batched_remove, 1,000 keys")
    assert rem["met"] and rem["shown"] == "11.90x" and "fan-out" in rem["label"]


def test_readme_block_names_the_run(tmp_path):
    block = summary.readme_block(run_results(), "benchmarks/results/full/results.json", base="/repo")
    lines = block.splitlines()
    assert lines[0] == summary.START and lines[-1] == summary.END
    head = lines[2]
    assert "`.venv-lmcache/bin/python -m lmcache_rawblock bench --suite full`" in head
    assert "commit `0123456789ab`" in head and "2026-12-01" in head and "Xeon" in head
    assert "[`benchmarks/results/full/results.json`](benchmarks/results/full/results.json)" in head
    assert "| measurement | result | goal | met | figures |" in block
    rows = [ln for ln in block.splitlines() if ln.startswith("| ") and not ln.startswith("| measurement")]
    assert rows and all(("| met |" in ln) != ("| **not met** |" in ln) for ln in rows)
    assert block.count("\n| ") == len(report.goals(run_results())) + 1


def write_tree(tmp_path: Path) -> tuple[Path, Path]:
    res = tmp_path / "benchmarks" / "results" / "full" / "results.json"
    res.parent.mkdir(parents=True)
    res.write_text(json.dumps(run_results()))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    return res, readme


def test_main_writes_readme_block_idempotently(tmp_path):
    res, readme = write_tree(tmp_path)
    assert summary.main([str(res), "--readme", str(readme)]) == 0
    text = readme.read_text()
    # The block sits at the end of the benchmark section, before the next section, and the
    # rest of the README is untouched.
    assert text.index("## Benchmark results") < text.index(summary.START) < text.index(summary.END) \
        < text.index("## Licence")
    assert text.replace(text[text.index(summary.START):text.index(summary.END) + len(summary.END)], "") \
        .replace("\n", "") == README.replace("\n", "")
    assert "(benchmarks/results/full/results.json)" in text and "11.90x" in text
    first = text
    assert summary.main([str(res), "--readme", str(readme)]) == 0
    assert readme.read_text() == first  # a second run changes nothing


def test_readme_rewrite_replaces_only_between_markers(tmp_path):
    res, readme = write_tree(tmp_path)
    readme.write_text(README.replace("MIT.", f"MIT.\n\n{summary.START}\nold\n{summary.END}\n\nTail."))
    summary.main([str(res), "--readme", str(readme)])
    text = readme.read_text()
    assert "old" not in text and text.endswith("Tail.\n") and text.count(summary.START) == 1


def test_readme_without_section_or_with_one_marker_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="no '## Benchmark results'"):
        summary.update_readme("# x\n", "B")
    with pytest.raises(ValueError, match="only one"):
        summary.update_readme(f"## Benchmark results\n{summary.START}\n", "B")
    res, readme = write_tree(tmp_path)
    readme.write_text("# x\n")
    assert summary.main([str(res), "--readme", str(readme)]) == 2
    assert "no '## Benchmark results'" in capsys.readouterr().err


def test_main_links_from_a_document_in_a_subdirectory(tmp_path):
    """docs/benchmarks.md (the default target): the run's file is shown from the tree's root and
    linked relative to the document."""
    res, readme = write_tree(tmp_path)
    doc = tmp_path / "docs" / "benchmarks.md"
    doc.parent.mkdir()
    doc.write_text(README)
    assert summary.main([str(res), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "[`benchmarks/results/full/results.json`](../benchmarks/results/full/results.json)" in text
