"""The product replay's tables (``waf.tables``): a cell's seeds become ranges in table order,
and the doc's tables are replaced by their header lines."""

from __future__ import annotations

import json

import pytest

from lmcache_rawblock_bench.waf import tables


def _cell(workload="lmcache_defaults", ru="1G", util=1.0, op=0.07, conc=8, seed=1, *, waf=1.0, he=0.832,
          hs=0.835, fmt="log", share=0.0008, reserve=12) -> dict:
    return {"workload_name": workload, "meta_format": fmt, "ru": ru, "util": util, "op": op, "concurrency": conc,
            "seed": seed, "slots": 29972, "core": {"extents_total": 236}, "waf": waf, "waf_without_metadata": 1.0,
            "recorded": {"meta_share": share}, "extent_reserve": reserve, "hit_ratio_extent": he,
            "hit_ratio_lru_same_lookups": hs, "hit_ratio_lru": 0.84, "command": "python -m x --seeds 1"}


CELLS = [
    _cell("study", conc=1, seed=1, he=0.958, hs=0.957),
    _cell(conc=8, seed=2, he=0.834, hs=0.838),
    _cell(ru="16G", util=0.95, conc=1, reserve=6),
    _cell(conc=8, seed=1, he=0.832, hs=0.835, waf=1.0004),
    _cell(util=0.95, conc=2),
    _cell(op=0.28, conc=1, reserve=10),
    _cell(ru="1G-notail", waf=1.022),  # a diagnostic scale: in the runs' table, not the operator table
    _cell("study", conc=1, seed=2, he=0.962, hs=0.963),
]


def test_operator_table_gives_one_row_a_cell_its_seeds_as_ranges_in_table_order():
    rows = tables.operator_table(CELLS)
    assert rows[0] == tables.OPERATOR_HEADER and rows[1] == "|" + "---|" * 12
    assert [r.split(" | ")[:5] for r in rows[2:]] == [
        ["| LMCache's default", "1 GiB RUs", "7%", "100%", "8x"],
        ["| LMCache's default", "1 GiB RUs", "7%", "95%", "2x"],
        ["| LMCache's default", "1 GiB RUs", "28%", "100%", "1x"],
        ["| LMCache's default", "16 GiB RUs", "7%", "95%", "1x"],
        ["| the study's", "1 GiB RUs", "7%", "100%", "1x"],
    ]
    # two seeds: hit ratios as lo-hi, LRU - extent as "lo to hi", one figure where both read the same
    assert rows[2] == ("| LMCache's default | 1 GiB RUs | 7% | 100% | 8x | 12 | 1, 2 | **1.000** | 1.000 | "
                       "0.832-0.834 | 0.835-0.838 | +0.003 to +0.004 |")
    assert rows[6].endswith("| 12 | 1, 2 | **1.000** | 1.000 | 0.958-0.962 | 0.957-0.963 | -0.001 to +0.001 |")
    assert rows[3].endswith("| 12 | 1 | **1.000** | 1.000 | 0.832 | 0.835 | +0.003 |")


def test_a_run_without_its_lru_figure_leaves_the_cells_lru_columns_to_the_others():
    rows = tables.operator_table([_cell(seed=1, hs=None), _cell(seed=2, he=0.834, hs=0.838)])
    assert rows[2].endswith("| 1, 2 | **1.000** | 1.000 | 0.832-0.834 | 0.838 | +0.004 |")
    assert tables.operator_table([_cell(hs=None)])[2].endswith("| 0.832 | - | - |")


def test_v1_table_takes_the_format_v1_cells_only():
    v1 = [_cell(fmt="v1", conc=1, waf=1.5714, share=0.3738), _cell(fmt="v1", util=0.95, conc=8, waf=1.3844,
                                                                    share=0.3644)]
    rows = tables.v1_table(v1 + CELLS)
    assert rows[2:] == ["| LMCache's default | 1 GiB RUs | 7% | 100% | 1x | 1.571 | **1.000** | 37.4% |",
                        "| LMCache's default | 1 GiB RUs | 7% | 95% | 8x | 1.384 | **1.000** | 36.4% |"]
    assert len(tables.operator_table(v1 + CELLS)) == len(tables.operator_table(CELLS))


def test_facts_count_the_runs_and_cells_and_name_where_extents_beat_lru():
    f = tables.facts(CELLS)
    assert f["runs"] == 7 and f["cells"] == 5  # the diagnostic scale left out
    assert f["lru_minus_extent"] == "-0.001 to +0.004"
    assert f["extent_above_lru"] == ["study 1G 100% 7% 1x seed 1 (-0.001)"]
    assert f["seeds_per_cell"] == {"lmcache_defaults 1G": "1-2 over 3 cells", "lmcache_defaults 16G": "1 over 1 cells",
                                   "study 1G": "2 over 1 cells"}


def test_replace_table_swaps_the_table_under_its_header_and_nothing_else():
    doc = "\n".join(["text", "| a | b |", "|---|---|", "| 1 | 2 |", "", "after", "| c |", "|---|", "| 3 |", ""])
    out = tables.replace_table(doc, "| a | b |", ["| a | b |", "|---|---|", "| 5 | 6 |", "| 7 | 8 |"])
    assert out == doc.replace("| 1 | 2 |", "| 5 | 6 |\n| 7 | 8 |")
    with pytest.raises(ValueError):
        tables.replace_table(doc, "| x |", [])


def test_doc_mode_rewrites_the_docs_tables_in_place(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "results.json").write_text(json.dumps({"cells": CELLS}))
    doc = tmp_path / "doc.md"
    doc.write_text("\n".join(["intro", tables.OPERATOR_HEADER, "|---|", "| stale |", "", "middle",
                              tables.RUNS_HEADER, "|---|", "| stale |", "| stale |", "", "end", ""]))
    assert tables.main(["--product", str(tmp_path / "p"), "--v1", "", "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "stale" not in text and text.startswith("intro\n") and text.endswith("\nend\n")
    assert "\n".join(tables.operator_table(CELLS)) in text and "\n".join(tables.runs_table(CELLS)) in text
