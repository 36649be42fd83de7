"""The loadcost part (lmcache_rawblock_bench.loadcost): its summary of requests with and without
the priced prefix lookup, its report lines, and (slow, root) one smoke run on the capped drives
rig whose figures are not asserted, only their shape and that the rig left nothing behind."""

from __future__ import annotations

import io
import json

import pytest

from lmcache_rawblock_bench import loadcost, report, rig


def row(policy, k, loaded, load_s, per_chunk=0.01):
    return {"policy": policy, "k": k, "loaded": loaded, "decide_s": 0.0, "load_s": load_s,
            "recompute_loaded_s": loaded * per_chunk, "late": bool(loaded and load_s > loaded * per_chunk),
            "ttd_s": load_s + (k - loaded) * per_chunk, "recompute_all_s": k * per_chunk}


def test_summary_counts_late_loads_and_time_to_data_over_every_request():
    rows = [row(False, 1, 1, 0.05), row(True, 1, 0, 0.0), row(False, 8, 8, 0.05), row(True, 8, 8, 0.05),
            row(False, 4, 4, 0.05), row(True, 4, 2, 0.01)]
    s = loadcost.summarize(rows)
    off, on = s["no_policy"], s["policy"]
    assert (off["loads"], off["late_loads"], off["refused"]) == (3, 2, 0)
    assert off["late_share"] == pytest.approx(2 / 3)
    assert (on["loads"], on["late_loads"], on["refused"], on["truncated"]) == (2, 0, 1, 1)
    assert on["mean_ttd_s"] == pytest.approx((0.01 + 0.05 + 0.03) / 3)
    assert off["mean_ttd_s"] == pytest.approx(0.05)
    assert s["ttd_ratio"] == pytest.approx(on["mean_ttd_s"] / 0.05)
    assert on["by_prefix"]["4"]["mean_loaded"] == 2


def test_report_says_why_when_the_rig_is_missing():
    out = io.StringIO()
    report.print_loadcost({"loadcost": {"available": False, "error": "no blkio"}}, lambda *a: print(*a, file=out))
    assert "not measured: no blkio" in out.getvalue()


class _Bar:
    def update(self, _n: int) -> None: ...

    def set_description_str(self, _t: str) -> None: ...


@pytest.mark.slow
@pytest.mark.skipif(rig.why_unavailable() is not None, reason=f"capped drives: {rig.why_unavailable()}")
def test_smoke_run_on_the_rig():
    out = loadcost.run_loadcost(loadcost.SUITES["smoke"], _Bar())
    s = loadcost.SUITES["smoke"]
    assert out["available"]
    assert out["busy"]["no_policy"]["requests"] == s.busy_requests
    assert out["busy"]["no_policy"]["loads"] == s.busy_requests, "without the policy every request loads"
    assert out["idle"]["policy"]["requests"] == s.idle_requests
    text = io.StringIO()
    report.print_loadcost({"loadcost": out}, lambda *a: print(*a, file=text))
    assert "busy   policy" in text.getvalue()
    json.dumps(out)
    assert rig.clean_stale() == []
