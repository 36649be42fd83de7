"""The MP eviction-over-extents bench part (benchmarks/lmcache_rawblock_bench/mpevict.py): the
skip without LMCache, the stream's determinism and, marked ``lmcache``, one small run of the
three arms inside the real LMCache checking the rows. Counts only; no timing is asserted."""

from __future__ import annotations

import pytest

from lmcache_rawblock_bench import common, mpevict, report


def test_without_lmcache_the_part_says_so_and_skips(monkeypatch):
    monkeypatch.setattr(mpevict, "_lmcache", lambda: (None, "LMCache's MP mode and torch are not importable here"))
    out = mpevict.run_mpevict(mpevict.SUITES["smoke"], common._NullBar())
    assert out["rows"] == [] and "not importable" in out["skipped"]
    lines: list[str] = []
    report.print_mpevict({"mpevict": out}, lines.append)
    assert lines[0].startswith("MP eviction over extents: skipped")


def test_stream_is_fixed_by_its_seed_and_follows_popularity():
    s = mpevict.MPEvictSettings(docs=50, requests=400)
    a, b = mpevict._stream(s), mpevict._stream(s)
    assert a == b and len(a) == 400 and all(len(r) == s.docs_per_request for r in a)
    counts = sorted((sum(r.count(d) for r in a) for d in range(s.docs)), reverse=True)
    assert counts[0] > 4 * counts[len(counts) // 2]  # Zipf: the most popular far above the median


@pytest.mark.lmcache
def test_small_run_in_lmcache_frees_whole_extents_only_under_extent_eviction():
    ok, why = mpevict._lmcache()
    if not ok:
        pytest.skip(why)
    out = mpevict.run_mpevict(mpevict.SUITES["smoke"], common._NullBar())
    assert out["skipped"] is None and out["errors"] == {}, out["errors"]
    rows = {r["arm"]: r for r in out["rows"]}
    assert set(rows) == set(mpevict.ARMS)
    for r in rows.values():
        assert r["bad_bytes"] == 0 and r["stores_refused"] == 0 and 0 < r["hit_ratio"] < 1
    ext, lru = rows["extent"], rows["lmcache-lru-0.95"]
    assert ext["deleted_by_lmcache"] == 0 and ext["deleted_by_extent"] > 0 and lru["deleted_by_extent"] == 0
    pre = rows["extent_prefix"]  # the same evictor, its victims weighed by reachable chunks
    assert pre["deleted_by_lmcache"] == 0 and pre["deleted_by_extent"] > 0
    # key-level deletes leave holes that stores fill; whole-extent eviction frees extents whole
    # (a store racing the background pass may still open a partly live one: compared, not zero)
    share = {n: r["opened_without_clean"] / r["extents_opened"] for n, r in (("extent", ext), ("lru", lru))}
    assert share["extent"] < share["lru"] / 2, share
    assert ext["extents_deallocated"] > lru["extents_deallocated"]
    lines: list[str] = []
    report.print_mpevict({"mpevict": out}, lines.append)
    text = "\n".join(lines)
    assert "\nextent " in text and "hit ratio, extent - lmcache-lru-0.95:" in text
    assert "\nextent_prefix " in text and "hit ratio, extent_prefix - extent:" in text
