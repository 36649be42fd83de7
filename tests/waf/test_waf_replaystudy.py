"""The product-replay study's hit-ratio comparison: key-level LRU's hits over the lookups of the
extent run's window (the same get events), not over LRU's own window; and its summary.md, whose
hand-kept sections survive a rewrite."""

from __future__ import annotations

import json

import pytest

from lmcache_rawblock.extent_evict import reinsert_choice
from lmcache_rawblock_bench.waf import replay, replaystudy, tables
from lmcache_rawblock_bench.waf.replaystudy import same_lookups


def _run(warm: int, window: int) -> dict:
    return {"warmup_ops": {"lookups": warm}, "ops": {"lookups": window}}


def test_lru_hit_ratio_is_taken_over_the_extent_runs_window_of_lookups():
    ext_trace = bytes([0] * 4 + [1, 0, 1, 0])
    # LRU hits everything after its 4th lookup but misses the extent window's last two: 2 of 4
    lru_trace = bytes([1] * 4 + [1, 1, 0, 0] + [1] * 8)
    assert same_lookups(_run(4, 4), ext_trace, lru_trace) == 0.5


def test_lru_run_that_ended_before_the_extent_window_gives_no_figure():
    assert same_lookups(_run(4, 4), bytes(8), bytes(7)) is None
    assert same_lookups(_run(4, 0), bytes(8), bytes(8)) is None


def test_reinsertion_puts_back_hot_keys_in_slot_order_at_most_half_the_extent():
    keys = [("a", True), ("b", False), ("c", True), ("d", True), ("e", True), ("f", False)]
    assert reinsert_choice(keys) == ["a", "c", "d"]
    assert reinsert_choice([("a", True)]) == []  # a one-key extent is freed, not kept
    assert reinsert_choice([("a", False), ("b", False)]) == []
    # the wear study's replay evicts by the product's rule
    assert replay.reinsert_choice is reinsert_choice


def test_a_cell_records_waf_and_both_lru_hit_ratios(tmp_path):
    """One cell end to end at a sliver of its window (a few seconds): the extent run recorded
    and simulated, key-level LRU over the extent window's lookups and over its own."""
    from lmcache_rawblock_bench.waf.replaystudy import cell

    c = cell("1G", 1.0, 1, 0.07, 1, str(tmp_path), warmup=0.01, measure=0.01)
    assert c["waf"] >= 1.0 and c["waf_without_metadata"] >= 1.0 and c["geometry"]["n_rus"] == 256
    assert c["lookups_window"][1] > c["lookups_window"][0]
    assert c["hit_ratio_lru_same_lookups"] is not None and c["hit_ratio_lru"] is not None
    assert c["workload_name"] == "lmcache_defaults"
    assert not list(tmp_path.iterdir())  # device, stream and traces removed


def test_format_v1_extents_are_the_whole_slots_of_one_reclaim_unit():
    """LMCache's layout has no stride: an extent is a whole number of slots, so in format v1 it
    is the slots that fit in one RU and its boundaries drift across the RUs'."""
    from lmcache_rawblock_bench.waf.replaystudy import extent_bytes_for, geometry

    g, _span, slot = geometry("1G", 0.07)
    ru = g.ru_pages * 4096
    assert extent_bytes_for("log", ru, slot) == ru
    v1 = extent_bytes_for("v1", ru, slot)
    assert v1 % slot == 0 and v1 // slot == 127 and ru - v1 < slot


def test_a_format_v1_cell_runs_the_core_in_format_v1(tmp_path):
    from lmcache_rawblock_bench.waf.replaystudy import cell

    c = cell("1G", 1.0, 1, 0.07, 1, str(tmp_path), warmup=0.01, measure=0.01, lru=False, meta_format="v1")
    assert c["meta_format"] == "v1" and c["extent_bytes"] == 127 * c["slot_bytes"]
    assert "--meta-format" in c["replay_argv"] and c["replay_argv"][c["replay_argv"].index("--meta-format") + 1] == "v1"
    assert c["waf"] >= 1.0 and c["core"].get("extents_total")


def _cells() -> list[dict]:
    cell = {"workload_name": "lmcache_defaults", "meta_format": "log", "ru": "1G", "util": 1.0, "op": 0.07,
            "concurrency": 8, "seed": 1, "slots": 29972, "core": {"extents_total": 236}, "waf": 1.0,
            "waf_without_metadata": 1.0, "recorded": {"meta_share": 0.0008}, "extent_reserve": 12,
            "hit_ratio_extent": 0.832, "hit_ratio_lru_same_lookups": 0.835, "hit_ratio_lru": 0.84,
            "command": "python -m x --seeds 1"}
    return [cell, {**cell, "seed": 2, "hit_ratio_extent": 0.834}, {**cell, "concurrency": 1}]


_CELLS = _cells()
HAND_KEPT = "## Earlier runs\n\n| RU |\n|---|\n| 1G |\n\n- a note written by hand\n"


@pytest.mark.parametrize("marker", [True, False], ids=["marker", "summary-before-the-marker"])
def test_a_summary_rewrite_keeps_the_hand_kept_sections(tmp_path, marker):
    old = replaystudy.markdown(_CELLS[:1], ["x"]) + "\n"
    old += (replaystudy.KEEP_MARKER + "\n" if marker else "") + HAND_KEPT
    (tmp_path / "summary.md").write_text(old)
    replaystudy.write_summary(str(tmp_path), _CELLS, ["x"])
    new = (tmp_path / "summary.md").read_text()
    assert new.endswith("\n" + replaystudy.KEEP_MARKER + "\n" + HAND_KEPT)
    assert "\n".join(tables.runs_table(_CELLS)) in new
    replaystudy.write_summary(str(tmp_path), _CELLS, ["x"])
    assert (tmp_path / "summary.md").read_text() == new  # a second rewrite changes nothing


def test_rewrite_summary_runs_nothing_and_keeps_the_sections(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"cells": _CELLS}))
    (tmp_path / "summary.md").write_text("# stale\n\n" + HAND_KEPT)
    assert replaystudy.main(["--out", str(tmp_path), "--rewrite-summary", "--dir", str(tmp_path / "none")]) == 0
    new = (tmp_path / "summary.md").read_text()
    assert new.endswith(HAND_KEPT) and "# stale" not in new and not (tmp_path / "none").exists()
    assert "Command: `python -m x --seeds 1`" in new  # the cells' one command


def test_a_format_v1_cells_lru_run_counts_its_window_in_data_bytes(tmp_path):
    """In format v1 each key-level eviction checkpoints the whole index: the LRU run's window
    is set in the chunks' bytes so that it reaches the extent run's lookups; the log format's
    LRU run keeps the window in every byte written."""
    from lmcache_rawblock_bench.waf.replaystudy import cell

    v1 = cell("1G", 1.0, 1, 0.07, 1, str(tmp_path), warmup=0.01, measure=0.01, meta_format="v1")
    assert v1["lru_window_bytes"] == "data" and v1["hit_ratio_lru_same_lookups"] is not None
    log = cell("1G", 1.0, 1, 0.07, 1, str(tmp_path), warmup=0.01, measure=0.01)
    assert log["lru_window_bytes"] == "all"


def test_refill_lru_gives_a_cell_without_its_same_lookups_figure_the_one_a_full_run_gives(tmp_path):
    """A cell whose LRU trace ended before the extent window's end: the LRU run again, its trace
    carried on to that end, gives the figure the cell's own run gave (the runs are repeatable)."""
    from lmcache_rawblock_bench.waf.replaystudy import cell, refill_lru

    c = cell("1G", 1.0, 1, 0.07, 1, str(tmp_path), warmup=0.01, measure=0.01)
    assert c["hit_ratio_lru_same_lookups"] is not None
    r = refill_lru({**c, "hit_ratio_lru_same_lookups": None}, str(tmp_path))
    assert r["hit_ratio_lru_same_lookups"] == c["hit_ratio_lru_same_lookups"]
    assert r["lru_refill"]["hit_ratio_lru"] == c["hit_ratio_lru"] and not list(tmp_path.iterdir())


def test_rewrite_summary_without_results_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        replaystudy.main(["--out", str(tmp_path / "none"), "--rewrite-summary"])
    assert e.value.code == 2 and "results.json" in capsys.readouterr().err and not (tmp_path / "none").exists()
