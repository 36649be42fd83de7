"""The end-to-end bench part (benchmarks/lmcache_rawblock_bench/e2e.py): its grid and fio commands in the
default run, and, marked ``lmcache`` (make test-lmcache), one tiny run of both plugins inside the
real LMCache checking the row structure and that the bytes come back. No timing is asserted."""

from __future__ import annotations

import json
import subprocess

import pytest

from lmcache_rawblock_bench import common, e2e, report
from lmcache_rawblock_bench.target import supports_odirect

MiB = 1 << 20


def test_chunk_sizes_are_those_of_the_models():
    assert e2e.MODELS["1B"].chunk_bytes(256) == 8 * MiB
    assert e2e.MODELS["8B"].chunk_bytes(256) == 32 * MiB
    assert e2e.SUITES["full"].models == ["1B", "8B"]
    assert e2e.SUITES["full"].configs == ["odirect_uring", "buffered_posix"]
    assert e2e.SUITES["quick"].models == ["1B"]


def test_percentile_is_nearest_rank():
    vals = [float(i) for i in range(1, 101)]
    assert e2e.percentile(vals, 50) == 50.0 and e2e.percentile(vals, 99) == 99.0
    assert e2e.percentile([3.0], 99) == 3.0 and e2e.percentile([], 50) is None


def test_fio_reference_matches_each_configuration():
    direct = e2e.fio_command("/x.img", "odirect_uring", "read", 8 * MiB, 8, 16 * MiB, 2)
    assert {"--ioengine=io_uring", "--direct=1", "--fixedbufs", "--iodepth=8", f"--bs={8 * MiB}",
            f"--offset={16 * MiB}", f"--size={64 * MiB}"} <= set(direct)
    buffered = e2e.fio_command("/x.img", "buffered_posix", "write", 8 * MiB, 8, 16 * MiB, 2)
    assert {"--ioengine=psync", "--direct=0", "--iodepth=1", "--invalidate=0"} <= set(buffered)


def test_without_lmcache_the_part_says_so_and_skips(monkeypatch, tmp_path):
    monkeypatch.setattr(e2e, "lmcache_modules", lambda: (None, e2e.NOT_INSTALLED.format(why="ImportError: x")))
    out = e2e.run_e2e(e2e.SUITES["smoke"], str(tmp_path), common._NullBar())
    assert out["rows"] == [] and "LMCache is not importable" in out["skipped"]
    lines: list[str] = []
    report.print_e2e({"e2e": out}, lines.append)
    assert lines[0].startswith("End to end: skipped: LMCache is not importable")


def _fake_fio(calls):
    def run(cmd, **_kw):
        calls.append(cmd)
        rw = next(a.split("=", 1)[1] for a in cmd if a.startswith("--rw="))
        side = {"bw_bytes": 2e9, "iops": 100.0, "lat_ns": {"mean": 1000.0}}
        job = {"error": 0, "read": side if rw == "read" else {}, "write": side if rw == "write" else {}}
        return subprocess.CompletedProcess(cmd, 0, json.dumps({"fio version": "fio-test", "jobs": [job]}), "")
    return run


@pytest.mark.lmcache
def test_tiny_grid_in_lmcache_round_trips_and_fills_every_row(tmp_path):
    mods, why = e2e.lmcache_modules()
    if mods is None:
        pytest.skip(why)
    s = e2e.E2ESettings(models=["tiny"], batch=2, rounds=2, latency_samples=1, fio_loops=1, tokens=16)
    if not supports_odirect(str(tmp_path)):
        s.configs = ["buffered_posix"]  # a file system refusing O_DIRECT still measures the page cache
    calls: list = []
    out = e2e.run_e2e(s, str(tmp_path), common._NullBar(), run=_fake_fio(calls))
    assert out["skipped"] is None and out["errors"] == {}, out["errors"]
    chunk = e2e.MODELS["tiny"].chunk_bytes(16)
    assert sorted((r["config"], r["backend"]) for r in out["rows"]) == sorted(
        (c, b) for c in s.configs for b in ("ours", "lmcache"))
    for r in out["rows"]:
        assert r["bytes_match"] is True and r["chunk_bytes"] == chunk and r["model"] == "tiny"
        for k in ("store_bytes_per_s", "retrieve_bytes_per_s", "store_p50_s", "store_p99_s", "retrieve_p50_s",
                  "retrieve_p99_s", "remove_p50_s", "store_cpu_s_per_gb", "retrieve_cpu_s_per_gb"):
            assert r[k] is not None and r[k] >= 0, k
        assert r["store_p99_s"] >= r["store_p50_s"] and r["latency_samples"] == 2
        assert r["fio_write_bytes_per_s"] == 2e9 and r["store_of_limit"] == pytest.approx(r["store_bytes_per_s"] / 2e9)
    assert len(calls) == 2 * s.rounds * len(s.configs)  # write and read once per round
    assert [(r["model"], r["config"]) for r in out["ratios"]] == [("tiny", c) for c in s.configs]
    lines: list[str] = []
    report.print_e2e({"e2e": out}, lines.append)
    text = "\n".join(lines)
    assert "ours / LMCache's plugin" in text and " NO" not in text
    assert not list(tmp_path.iterdir()), "the part removes its device files"
