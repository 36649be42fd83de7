"""The MP bench part (benchmarks/lmcache_rawblock_bench/mp.py): its sizing in the default run, the
skip without LMCache 0.5.7's workload, and, marked ``lmcache`` (make test-lmcache), one small run
of both adapters inside the real LMCache checking the rows and that every loaded chunk held its own
bytes. No timing is asserted."""

from __future__ import annotations

import pytest

from lmcache_rawblock_bench import common, mp, report
from lmcache_rawblock_bench.target import supports_odirect


def test_pool_is_the_workloads_sizing():
    s = mp.MPSettings(l1_chunks=64, overflow=2.0, context_tokens=1024, chunk_tokens=256, docs_per_request=4)
    assert s.chunks_per_doc == 4 and s.pool_size == 32  # ceil(2 x 64 / 4)
    assert s.chunk_bytes == 4 * 2 * 256 * 4 * 64 * 2
    small = mp.MPSettings(l1_chunks=2, docs_per_request=4)
    assert small.pool_size == 4  # never fewer documents than a request carries


def test_without_the_workload_the_part_says_so_and_skips(monkeypatch, tmp_path):
    why = mp.NO_WORKLOAD.format(module=mp.WORKLOAD_MODULE, why="ModuleNotFoundError: x")
    monkeypatch.setattr(mp, "workload", lambda: (None, why))
    out = mp.run_mp(mp.SUITES["smoke"], str(tmp_path), common._NullBar())
    assert out["rows"] == [] and "kv-tier-pressure workload" in out["skipped"] and "0.5.7" in out["skipped"]
    lines: list[str] = []
    report.print_mp({"mp": out}, lines.append)
    assert lines[0].startswith("MP L2 tier: skipped: LMCache's kv-tier-pressure workload")


def test_ratios_pair_the_adapters_of_a_configuration():
    rows = [{"config": "c", "adapter": "ours", **{k: 2.0 for k in mp.RATIO_KEYS}},
            {"config": "c", "adapter": "lmcache", **{k: 4.0 for k in mp.RATIO_KEYS}},
            {"config": "d", "adapter": "ours", **{k: 1.0 for k in mp.RATIO_KEYS}}]
    assert mp.ratios(rows) == [{"config": "c", **{k: 0.5 for k in mp.RATIO_KEYS}}]


@pytest.mark.lmcache
def test_small_run_in_lmcache_fills_every_row_with_the_right_bytes(tmp_path):
    wl, why = mp.workload()
    if wl is None:
        pytest.skip(why)
    s = mp.MPSettings(rounds=2, l1_chunks=8, requests=6, docs_per_request=2, context_tokens=512, layers=1,
                      kv_heads=2, head_dim=32)
    if not supports_odirect(str(tmp_path)):
        s.configs = ["buffered_posix"]  # a file system refusing O_DIRECT still measures the page cache
    out = mp.run_mp(s, str(tmp_path), common._NullBar())
    assert out["skipped"] is None and out["errors"] == {}, out["errors"]
    assert sorted((r["config"], r["adapter"]) for r in out["rows"]) == sorted(
        (c, a) for c in s.configs for a in mp.ADAPTERS)
    for r in out["rows"]:
        assert r["bytes_match"] is True and r["l2_misses"] == 0 and r["rounds"] == 2
        assert 0 < r["l2_share"] < 1  # the pool overflows L1: some chunks come from L2, not all
        assert r["device"] == "lmcache_rawblock" if r["adapter"] == "ours" else r["device"].endswith("Rust wheel")
        for k in mp.RATIO_KEYS:
            assert r[k] is not None and r[k] > 0, k
    assert [r["config"] for r in out["ratios"]] == s.configs
    lines: list[str] = []
    report.print_mp({"mp": out}, lines.append)
    text = "\n".join(lines)
    assert "ours / LMCache's raw-block adapter" in text and " NO" not in text
    assert not list(tmp_path.iterdir()), "the part removes its device files"
