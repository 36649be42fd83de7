"""Pieces of the benchmark harness that the CLI runs do not pin down: the kernel-floor program
(compiled on demand from the package), its mapping onto the per-key CPU media, the load-check
part and the dealloc part on tiny grids, and the wording of what the harness prints. No timing is asserted."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from lmcache_rawblock_bench import common, cpu, dealloc, floor, loadcheck, report, scale
from lmcache_rawblock_bench.core import ours_core
from lmcache_rawblock_bench.target import supports_odirect

PKG = Path(__file__).resolve().parents[2] / "lmcache_rawblock"


def _have_liburing_headers() -> bool:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return False
    proc = subprocess.run([cc, "-E", "-x", "c", "-"], input="#include <liburing.h>\n", capture_output=True,
                          text=True)
    return proc.returncode == 0


@pytest.mark.skipif(not _have_liburing_headers(), reason="no C compiler with liburing headers")
def test_floor_program_compiles_into_the_cache_dir_and_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    exe, why = floor.build()
    assert why is None and exe.startswith(str(tmp_path / "cache" / "lmcache-rawblock"))
    assert floor.build() == (exe, None)  # cached: the same binary, not compiled again
    img = cpu.written(str(tmp_path / "f.img"), floor.FILE_BYTES)
    res = floor.run(exe, img, odirect=False, rounds=2)
    assert set(res) == {(e, op, fixed) for e in ("posix", "io_uring") for op in ("put", "load")
                        for fixed in (False, True) if e == "io_uring" or not fixed}
    assert all(v >= 0 for v in res.values())


def test_floor_build_failure_names_the_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "false")
    exe, why = floor.build(str(tmp_path))
    assert exe is None and why.startswith("false failed")
    assert not [p for p in os.listdir(tmp_path) if p.startswith("io_floor")]


def test_kernel_floor_maps_rows_onto_media(tmp_path, monkeypatch):
    seen = []

    def fake_run(exe, path, odirect, rounds):
        seen.append((odirect, os.path.getsize(path)))
        base = 10e-6 if odirect else 5e-6
        return {("posix", "put", False): base, ("io_uring", "put", False): base / 2,
                ("io_uring", "put", True): base / 4}

    monkeypatch.setattr(floor, "build", lambda: ("/bin/true", None))
    monkeypatch.setattr(floor, "run", fake_run)
    res = cpu.kernel_floor(list(cpu.MEDIA), 3, str(tmp_path))
    assert res["available"] and seen == [(False, floor.FILE_BYTES), (True, floor.FILE_BYTES)]
    assert cpu.floor_of(res, "page cache", "posix", "put") == 5e-6
    assert cpu.floor_of(res, "O_DIRECT", "io_uring", "put") == 5e-6
    assert cpu.floor_of(res, cpu.REGISTERED, "io_uring", "put") == 2.5e-6
    assert cpu.floor_of(res, cpu.REGISTERED, "posix", "put") is None
    assert not os.listdir(tmp_path)  # the floor's file is removed
    assert cpu.kernel_floor(["page cache"], 0, str(tmp_path))["error"] == "not measured in this suite"


def test_loadcheck_part_times_both_modes_on_verified_bytes(tmp_path):
    s = replace(loadcheck.SUITES["smoke"], devices=["disk"], dirs={"disk": str(tmp_path)})
    out = loadcheck.run_loadcheck(s, common._NullBar())
    assert out["errors"] == {}
    media = [m for m in loadcheck.MEDIA if not loadcheck.MEDIA[m] or supports_odirect(str(tmp_path))]
    assert [(r["engine"], r["medium"]) for r in out["rows"]] == [(e, m) for m in media for e in loadcheck.ENGINES]
    plan = s.chunks[0]
    for r in out["rows"]:
        assert r["bytes_verified"] is True and r["device"] == "disk"
        assert (r["chunk_bytes"], r["keys"], r["rounds"]) == (plan.size, plan.keys, plan.rounds)
        assert len(r["samples_s"]["on"]) == len(r["samples_s"]["off"]) == len(r["ratios"]) == plan.rounds
        assert r["on_s"] > 0 and r["off_s"] > 0 and r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
        # With the check, each key's header is read too: more bytes than the payloads alone.
        io = r["io_per_call"]
        assert io["off"]["read_submitted_bytes"] == plan.keys * plan.size
        assert io["on"]["read_submitted_bytes"] > io["off"]["read_submitted_bytes"]
        assert io["on"]["bounce_attempts"] == io["off"]["bounce_attempts"] == 0
    assert out["devices"]["disk"]["directory"] == str(tmp_path)
    assert os.listdir(tmp_path) == []  # its files and directory are gone
    text: list[str] = []
    report.print_loadcheck({"loadcheck": out}, text.append)
    assert "check on" in text[-1] and text[-1].count("\n") == len(out["rows"]) + 1


def test_dealloc_part_on_rows_deallocate_exactly_what_each_batch_freed(tmp_path):
    s = replace(dealloc.SUITES["smoke"], directory=str(tmp_path))
    out = dealloc.run_dealloc(s, common._NullBar())
    assert out["errors"] == {} and out["notes"] == []
    got = [(r["medium"], r["keys"], r["layout"]) for r in out["rows"]]
    assert got == [("file", p.keys, lay) for p in s.plans for lay in dealloc.LAYOUTS]
    for r in out["rows"]:
        n, plan = r["keys"], next(p for p in s.plans if p.keys == r["keys"])
        assert r["kind"] == "punch_hole" and r["deallocated_as_freed"] is True
        assert r["rounds"] == plan.rounds and r["slot_bytes"] == s.slot_bytes
        for mode in dealloc.MODES:
            assert all(len(v) == plan.rounds for v in r["samples_s"][mode].values())
        assert len(r["ratios"]) == len(r["put_ratios"]) == plan.rounds
        # "on": every batch deallocated its N slots, merged into one range when adjacent
        on, off = r["counters_per_batch"]["on"], r["counters_per_batch"]["off"]
        ranges = 1 if r["layout"] == "adjacent" else n
        assert (on["dealloc_slots"], on["dealloc_ranges"], on["dealloc_bytes"]) == (n, ranges, n * s.slot_bytes)
        assert on["dealloc_commands"] >= 1 and on["dealloc_failures"] == 0 and on["dealloc_seconds"] > 0
        assert (r["dealloc_slots"], r["dealloc_ranges"]) == (n, ranges)
        # "off": nothing
        assert off["dealloc_slots"] == off["dealloc_commands"] == off["dealloc_bytes"] == 0
        assert off["dealloc_seconds"] == 0
        for k in ("off_per_key_s", "on_per_key_s", "off_put_per_key_s", "on_put_per_key_s", "ratio", "put_ratio"):
            assert r[k] > 0
    assert os.listdir(tmp_path) == []  # its files and directory are gone
    text: list[str] = []
    report.print_dealloc({"dealloc": out}, text.append)
    assert "batch on" in text[-1] and text[-1].count("\n") == len(out["rows"]) + 1


def test_dealloc_part_reports_a_medium_it_cannot_set_up(tmp_path, monkeypatch):
    monkeypatch.setattr(dealloc, "can_loop", lambda: "loop devices need root")
    s = replace(dealloc.SUITES["smoke"], directory=str(tmp_path), media=["loop device"],
                plans=[dealloc.DeallocPlan(4, 1)])
    out = dealloc.run_dealloc(s, common._NullBar())
    assert out["rows"] == [] and out["errors"] == {}
    assert out["notes"] == ["loop device: not measured: loop devices need root"]
    s = replace(s, media=["file"], plans=[dealloc.DeallocPlan(4, 1, media=["loop device"])])
    assert dealloc.steps(s) == 0
    out = dealloc.run_dealloc(s, common._NullBar())
    assert out["rows"] == [] and out["notes"] == ["file, 4 keys: not measured: not in this suite"]
    assert os.listdir(tmp_path) == []


def test_scale_part_smoke_both_formats_side_by_side(tmp_path):
    s = replace(scale.SUITES["smoke"], sizes=[300, 1000])
    out = scale.run_scale([ours_core()], s, str(tmp_path), common._NullBar())
    assert out["errors"] == {} and out["competitors"] == ["ours"] and out["variants"] == ["ours v1", "ours log"]
    rows = {(r["variant"], r["entries"]): r for r in out["rows"]}
    assert sorted(rows) == [(v, n) for v in ("ours log", "ours v1") for n in (300, 1000)]
    for (v, n), r in rows.items():
        assert r["churn_keys"] == max(1, n // 100) and not r.get("reopen_incomplete")
        assert r["ckpt_s"] > 0 and r["reopen_s"] > 0 and r["reopen_verify_s"] > 0
        assert r["index_memory_per_entry"] > r["index_memory_per_entry_without_keys"] > 0
    assert rows[("ours v1", 1000)]["ckpt_bytes"] > 2 * rows[("ours v1", 300)]["ckpt_bytes"]  # the whole index
    for n in (300, 1000):
        log = rows[("ours log", n)]
        assert 100 < rows[("ours v1", n)]["bytes_per_entry"] < 400 and log["bytes_per_entry"] < 100
        assert log["ckpt_bytes"] < log["base"]["bytes"] and log["meta_total_bytes"] == scale.DEFAULT_META
    probes = {p["variant"]: p for p in out["limit"]["probes"]}  # past what a 1 MiB v1 region holds
    assert probes["ours v1"]["outcome"] == "refused" and "too large" in probes["ours v1"]["error"]
    assert probes["ours log"]["outcome"] == "written"
    got = {(r["path"], r["variant"], r["full"]) for r in out["puts"]}
    assert got == {(p, v, f) for p in ("plugin", "core") for v in ("ours v1", "ours log") for f in (False, True)} | {
        ("each", v, True) for v in ("ours v1", "ours log")}
    for r in out["puts"]:
        assert r["failed"] == 0 and r["p50_s"] <= r["p99_s"] and r["threads"] == 1
        # a full cache: the evictor frees the slots (not the put), by checkpoints, or in the log
        # format by groups of the deletes' FREE records written ahead of the pending puts
        assert r["room_ckpts_per_put"] == 0 if not r["full"] else (
            r["ckpts_per_put"] > 0 or (r.get("free_groups_per_put") or 0) > 0)
    assert {t["label"].split(",")[0] for t in out["targets"]} >= {"put p50 full / room", "failed puts"}
    assert os.listdir(tmp_path) == []  # its files are gone
    text: list[str] = []
    report.print_scale({"scale": out}, text.append)
    assert any("ckpt bytes" in t for t in text) and any("refused" in t for t in text)
    assert any("log / v1" in t for t in text) and any("against its targets" in t for t in text)


def test_scale_log_region_matches_the_core_sizing_rule():
    # the smallest region (>= 128 MiB, whole MiB) whose base areas hold 64 B per slot
    assert scale.meta_log_for(20_000) == scale.DEFAULT_META
    for slots in (2_000_000, 10_030_000):
        m = scale.meta_log_for(slots)
        assert scale._log_area(m) // 64 >= slots > scale._log_area(m - (1 << 20)) // 64


def test_loadcheck_goal_covers_large_chunks_only():
    def row(size: int, ratio: float) -> dict:
        return {"engine": "posix", "medium": "page cache", "device": "tmpfs", "chunk_bytes": size, "keys": 8,
                "ratio": ratio, "ratio_q1": ratio, "ratio_q3": ratio, "on_s": ratio, "off_s": 1.0}

    lc = {"settings": loadcheck.SUITES["full"].describe(),
          "rows": [row(64 << 10, 1.2), row(8 << 20, 1.01), row(32 << 20, 1.03)]}
    got = [(g["value"], g["met"], g["goal_text"]) for g in report.goals({"loadcheck": lc})]
    assert got == [(1.01, True, "≤ 1.02x"), (1.03, False, "≤ 1.02x")]


def test_median_ci_brackets_the_median():
    assert loadcheck.median_ci([1.0] * 5) == (None, None)
    vals = [1.0 + i / 100 for i in range(41)]
    lo, hi = loadcheck.median_ci(vals)
    assert lo < common.median(vals) < hi and (lo, hi) == (vals[14], vals[27])


# Words of the project's own bookkeeping, which the product does not speak.
TRACKING = re.compile(r"\b(issues?|seeds?|sessions?|tickets?)\b|#\d", re.IGNORECASE)


def test_bench_speaks_of_measurements_not_of_work_tracking():
    files = sorted((PKG / "bench").glob("*.py")) + [PKG / "__main__.py"]
    hits = [f"{f.name}:{n}: {line.strip()}" for f in files
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if TRACKING.search(line)]
    assert hits == []
