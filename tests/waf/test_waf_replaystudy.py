"""The product-replay study's hit-ratio comparison: key-level LRU's hits over the lookups of the
extent run's window (the same get events), not over LRU's own window."""

from __future__ import annotations

from lmcache_rawblock.extent_evict import reinsert_choice
from lmcache_rawblock_bench.waf import replay
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
