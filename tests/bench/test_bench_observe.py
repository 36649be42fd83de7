"""The harness's histogram-cost part on a tiny grid, the latency-distribution curves it and the
load-check part feed to latency_cdf.png, and the plots that used to mislead: a single index
size drawn as bars, dealloc labels that are the ratio of the bars drawn, legends for colours.
No timing is asserted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lmcache_rawblock_bench import histcost, report

KiB = 1024


def test_histcost_part_times_both_modes_and_the_recording():
    s = replace(histcost.SUITES["smoke"], engines=["posix"])

    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar = Bar()
    res = histcost.run_histcost(s, bar)
    assert bar.n == histcost.steps(s) == 1
    (row,) = res["rows"]
    for op in ("put", "load"):
        assert row[op]["rounds"] == s.rounds and row[op]["cpu_s_off"] > 0 and row[op]["cpu_s_on"] > 0
    assert row["recording_ns_per_call"] > 0 and row["recording_ns_one_key_call"] > 0
    # recording was on for the "on" rounds only: each of those calls is in the histogram
    assert row["latency"]["load_ns"]["count"] == (s.rounds + s.warmup) * s.calls + 1
    v = res["verdict"]
    assert set(v["load_64k_batch_share"]) == {"posix"} and v["met"] == (v["worst"] <= histcost.GOAL)
    lines: list[str] = []
    report.print_histcost({"histcost": res}, lambda *a: lines.append(" ".join(map(str, a))))
    text = "\n".join(lines)
    assert "recording, timed in a C loop (posix, 64 KiB)" in text and "for batched 64 KiB loads" in text
    (g,) = report.goals({"histcost": res})
    assert g["goal"] == 1.01 and g["met"] == (g["value"] <= 1.01)


def test_cdf_points_rise_to_one_at_the_bucket_edges():
    xs, ys = report.cdf_points({"count": 4, "sum": 0, "buckets": [(5120, 1), (1280, 2), (20480, 1)]})
    assert xs == [1.28, 5.12, 20.48] and ys == [0.5, 0.75, 1.0]


def test_latency_curves_come_from_the_parts_that_keep_histograms():
    h = {"count": 2, "sum": 10, "buckets": [(8, 2)]}
    res = {"histcost": {"rows": [{"engine": "posix", "chunk_bytes": 64 * KiB, "keys": 64,
                                  "latency": {"put_ns": h, "load_ns": {"count": 0, "sum": 0, "buckets": []}}}]},
           "loadcheck": {"rows": [{"engine": "io_uring", "medium": "O_DIRECT", "device": "tmpfs",
                                   "chunk_bytes": 8 << 20, "keys": 8, "latency": {"load_ns": h}},
                                  {"engine": "posix", "medium": "O_DIRECT", "device": "disk", "chunk_bytes": 8 << 20,
                                   "keys": 8}]}}
    got = report.latency_curves(res)
    assert [(p, lab) for p, lab, _ in got] == [("put_many, 64 KiB x 64 (histcost)", "posix"),
                                              ("load_many_into, 8 MiB x 8 (loadcheck)", "io_uring, O_DIRECT, tmpfs")]


def _labels(ax):
    return [t.get_text() for t in ax.texts]


def test_plots_say_what_they_show(tmp_path):
    mpl = pytest.importorskip("matplotlib", reason="matplotlib is not installed: the plots are not drawn")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    saved = {}
    orig = report._save

    def keep(plt_, fig, out_dir, name):
        saved[name] = fig
        return orig(plt_, fig, out_dir, name)

    report._save = keep
    try:
        rows = [{"op": "put_many", "engine": "posix", "entries": 64, "ours_s": 1e-3, "lmcache_s": 2e-3}]
        report._plot_core(plt, rows, str(tmp_path))
        ax = saved["core_latency_vs_entries.png"].axes[0]
        assert len(ax.patches) == 2 and not ax.lines, "one index size: bars, not a one-point line"
        drows = [{"medium": "file", "layout": "adjacent", "keys": 100, "off_per_key_s": 2e-6, "on_per_key_s": 1e-6,
                  "dealloc_per_key_s": 5e-7, "ratio": 1.64, "off_put_per_key_s": 1e-6, "on_put_per_key_s": 3e-6,
                  "put_ratio": 0.5}]
        report._plot_dealloc(plt, drows, {"slot_bytes": 65536}, str(tmp_path))
        top, bottom = saved["dealloc_per_key.png"].axes[0], saved["dealloc_per_key.png"].axes[1]
        assert _labels(top) == ["0.50x"] and _labels(bottom) == ["3.00x"], "labels: orange bar over blue bar"
        report._plot_ratio(plt, [{"op": "pread_into", "mode": "buffered", "size": 4096, "ratio": 0.9},
                                 {"op": "pread_into", "mode": "odirect", "size": 4096, "ratio": 1.2}], str(tmp_path))
        legend = [t.get_text() for t in saved["ratio.png"].axes[0].get_legend().get_texts()]
        assert "ours as fast or faster (≤ 1)" in legend and "ours slower (> 1)" in legend
        lrows = [{"engine": e, "medium": "O_DIRECT", "device": "tmpfs", "chunk_bytes": 64 * KiB, "keys": 4,
                  "ratio": 1.01, "ratio_ci95": [1.0, 1.02]} for e in ("posix", "io_uring")]
        report._plot_loadcheck(plt, lrows, {"target_from_chunk_bytes": 8 << 20, "target_ratio": 1.02}, str(tmp_path))
        legend = [t.get_text() for t in saved["loadcheck_ratio.png"].axes[0].get_legend().get_texts()]
        assert "posix engine" in legend and "io_uring engine" in legend
    finally:
        report._save = orig
