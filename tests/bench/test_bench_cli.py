"""The bench command line: end-to-end smoke run, --device safety checks, argument errors.

No test asserts on timings: the machine is shared, so only shapes and fields are checked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmcache_rawblock.__main__ import main
from lmcache_rawblock_bench import common, device, limit
from lmcache_rawblock_bench.common import Competitor, parse_size

from helpers import rust_module, sha256_file as sha

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
SMOKE = ["bench", "--suite", "smoke", "--no-progress"]


@pytest.fixture(autouse=True)
def _no_competitor_dir(tmp_path, monkeypatch):
    """A bench run in these tests must not pull LMCache (installed by --install-competitors
    into a directory of its own) into the test process."""
    monkeypatch.setenv("LMCACHE_RAWBLOCK_COMPETITORS", str(tmp_path / "no-competitors"))


def run_cli(args, capsys):
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def load(out_dir: Path) -> dict:
    with open(out_dir / "results.json", encoding="utf-8") as f:
        return json.load(f)


def mkfs_ext4(path: str) -> None:
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed (e2fsprogs), cannot make a file-system signature")
    subprocess.run(["mkfs.ext4", "-q", "-F", path], check=True, capture_output=True)


# --------------------------------------------------------------------------- end to end


def test_smoke_run_writes_results_json(tmp_path, capsys, monkeypatch):
    created = []
    real_mkdtemp = __import__("tempfile").mkdtemp

    def spy_mkdtemp(*a, **kw):
        d = real_mkdtemp(*a, **kw)
        created.append(d)
        return d

    monkeypatch.setattr("tempfile.mkdtemp", spy_mkdtemp)
    out = tmp_path / "out"
    rc, stdout, err = run_cli([*SMOKE, "--size", "8M", "--out", str(out), "--no-plots"], capsys)
    assert rc == 0, err
    res = load(out)

    assert res["schema"] == 2
    m = res["machine"]
    for key in ("kernel", "cpu_model", "cores", "memory_bytes", "debian_version", "python", "packages",
                "command", "timestamp"):
        assert key in m, key
    assert m["cores"] >= 1 and m["memory_bytes"] > 0
    assert m["command"][-1] == "--no-plots" and "--suite" in m["command"]
    assert m["packages"]["lmcache-rawblock"]

    assert res["settings"]["suite"] == "smoke"
    assert res["settings"]["sizes"] == [4096]
    assert res["target"]["kind"] == "sparse-file"
    assert res["target"]["size_bytes"] == 8 * MiB
    # The temporary directory of the sparse file is gone afterwards.
    assert created and not os.path.exists(res["target"]["path"]) and not os.path.exists(created[0])

    rows = res["device"]["results"]
    assert {(r["op"], r["mode"]) for r in rows} == {
        (op, mode) for op in device.SYNC_OPS for mode in device.MODES
    }
    have_rust = rust_module() is not None
    assert res["competitors"]["rust"]["available"] is have_rust
    for r in rows:
        assert r["size"] == 4096 and r["calls"] >= 1
        assert r["ours_s"] > 0
        assert len(r["samples_s"]["ours"]) == 1
        if have_rust:
            assert r["rust_s"] > 0
            assert r["ratio"] == pytest.approx(r["ours_s"] / r["rust_s"])
        else:
            assert r["rust_s"] is None and r["ratio"] is None

    uring = res["uring"]
    if not uring["available"]["ours"]:
        assert uring["errors"]["ours"].startswith("io_uring engine not available: ")
        assert "io_uring engine not available" in stdout

    if uring["available"]["ours"]:
        assert {(r["op"], r["mode"]) for r in uring["results"]} == {
            (op, mode) for op in device.BATCH_OPS for mode in device.MODES
        }

    lim = res["limit"]
    if shutil.which("fio") and uring["available"]["ours"]:
        assert lim["available"] is True, lim
        assert [(r["rw"], r["size"], r["depth"]) for r in lim["results"]] == device.SUITES["smoke"].limit_cases
        assert all(r["ours_bytes_per_s"] > 0 and r["fio_bytes_per_s"] > 0 for r in lim["results"])
        assert all(r["ratio"] == pytest.approx(r["ours_bytes_per_s"] / r["fio_bytes_per_s"]) for r in lim["results"])
    elif not shutil.which("fio"):
        assert lim["available"] is False and "fio" in lim["error"]

    # The terminal summary has the table and the ratio convention; summary.txt holds the same.
    assert "pread_into" in stdout and "ratio = our time / Rust's" in stdout
    assert (out / "summary.txt").read_text(encoding="utf-8").strip() == stdout.split("wrote: ")[0].strip()


def test_smoke_run_writes_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib not installed: plots are skipped by design")
    out = tmp_path / "out"
    rc, stdout, err = run_cli([*SMOKE, "--size", "8M", "--out", str(out), "--parts", "device"], capsys)
    assert rc == 0, err
    for name in ("latency_vs_size.png",) + (("ratio.png",) if rust_module() else ()):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name


def test_module_entry_point_help():
    proc = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "bench", "--help"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for opt in ("--device", "--size", "--engines", "--suite", "--out", "--install-competitors"):
        assert opt in proc.stdout
    assert "smoke" not in proc.stdout  # the test-only suite stays hidden


def test_existing_plain_file_is_used_and_kept(tmp_path, capsys):
    img = tmp_path / "scratch.img"
    with open(img, "wb") as f:
        f.truncate(8 * MiB)
    out = tmp_path / "out"
    rc, _, err = run_cli([*SMOKE, "--device", str(img), "--out", str(out), "--parts", "device", "--no-plots"], capsys)
    assert rc == 0, err
    res = load(out)
    assert res["target"]["kind"] == "file" and res["target"]["path"] == str(img)
    assert res["target"]["temporary"] is False
    assert img.exists() and img.stat().st_size == 8 * MiB


def test_missing_competitor_reported_and_install_failure_tolerated(tmp_path, capsys, monkeypatch):
    missing = Competitor(name="rust", dist=common.RUST_DIST, module=common.RUST_MODULE,
                         error="not installed (ImportError: nope)", install=common.RUST_PIP)
    monkeypatch.setattr(common, "rust", lambda: missing)
    calls = []

    def failing_install():
        calls.append(1)
        return False, "pip exited 1: no network"

    monkeypatch.setattr(common, "install_competitors", failing_install)
    out = tmp_path / "out"
    rc, stdout, err = run_cli([*SMOKE, "--size", "8M", "--out", str(out), "--parts", "device",
                               "--install-competitors", "--no-plots"], capsys)
    assert rc == 0, err
    assert calls == [1]
    assert "not installed" in stdout and "pip install lmcache-rust-raw-block-io" in stdout
    res = load(out)
    assert res["competitors"]["rust"]["available"] is False
    assert any("no network" in n for n in res["notes"])
    assert all(r["rust_s"] is None for r in res["device"]["results"])


def test_install_competitors_runs_pip_with_this_python(monkeypatch):
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: boom")

    ok, msg = common.install_competitors(run=fake_run)
    assert ok is False and "boom" in msg
    assert seen["cmd"][:4] == [sys.executable, "-m", "pip", "install"]
    assert seen["cmd"][-1] == f"lmcache-rust-raw-block-io=={common.RUST_VERSION}"


# --------------------------------------------------------------------------- --device checks


def test_missing_device_path_is_refused(tmp_path, capsys):
    missing = tmp_path / "nope" / "dev.img"
    rc, _, err = run_cli([*SMOKE, "--device", str(missing), "--out", str(tmp_path / "out")], capsys)
    assert rc == 2
    assert str(missing) in err and "no such file" in err
    assert not (tmp_path / "out" / "results.json").exists()


def test_file_with_filesystem_signature_is_refused(tmp_path, capsys):
    img = tmp_path / "fs.img"
    with open(img, "wb") as f:
        f.truncate(16 * MiB)
    mkfs_ext4(str(img))
    before = sha(str(img))
    rc, _, err = run_cli([*SMOKE, "--device", str(img), "--out", str(tmp_path / "out")], capsys)
    assert rc == 2
    assert str(img) in err and "ext4 file system" in err and "--force" in err
    assert sha(str(img)) == before  # nothing was written


def test_force_overrides_filesystem_signature(tmp_path, capsys):
    img = tmp_path / "fs.img"
    with open(img, "wb") as f:
        f.truncate(16 * MiB)
    mkfs_ext4(str(img))
    out = tmp_path / "out"
    rc, _, err = run_cli([*SMOKE, "--device", str(img), "--force", "--out", str(out), "--parts", "device",
                          "--no-plots"], capsys)
    assert rc == 0, err
    assert any("ext4 file system" in n for n in load(out)["target"]["notes"])


def test_block_device_with_filesystem_is_refused(loop_device, tmp_path, capsys):
    dev = loop_device(16 * MiB)
    mkfs_ext4(dev)
    rc, _, err = run_cli([*SMOKE, "--device", dev, "--out", str(tmp_path / "out")], capsys)
    assert rc == 2
    assert dev in err and "ext4" in err


def test_directory_is_refused(tmp_path, capsys):
    rc, _, err = run_cli([*SMOKE, "--device", str(tmp_path), "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and "not a regular file or a block device" in err


# --------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize("value", ["abc", "0", "-1", "4x", "12kk", "", "1.3k", "4ki"])
def test_bad_size_is_a_clear_error(value, tmp_path, capsys):
    rc, _, err = run_cli([*SMOKE, "--size", value, "--out", str(tmp_path / "out")], capsys)
    assert rc == 2
    assert "--size" in err and f"invalid size {value!r}" in err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--engines", "posix,spdk"], "unknown engine 'spdk'"),
        (["--suite", "huge"], "invalid suite 'huge'"),
        (["--sizes", "4k,1000"], "invalid block size '1000'"),
        (["--repeats", "0"], "invalid count '0'"),
        (["--parts", "bogus"], "unknown part 'bogus'"),
        (["--engines", "io_uring", "--parts", "device"], "nothing to run"),
    ],
)
def test_bad_arguments_name_parameter_and_value(args, needle, tmp_path, capsys):
    rc, _, err = run_cli(["bench", *args, "--out", str(tmp_path / "out")], capsys)
    assert rc == 2
    assert args[0] in err and needle in err


def test_size_too_small_for_block_sizes(tmp_path, capsys):
    rc, _, err = run_cli([*SMOKE, "--size", "4k", "--sizes", "64k", "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and "--size" in err and "no block size fits" in err


@pytest.mark.parametrize(
    "text, value",
    [("4096", 4096), ("4k", 4096), ("4K", 4096), ("4KiB", 4096), ("4kb", 4096), ("64K", 65536),
     ("256M", 256 * MiB), ("1G", 1 << 30), ("4G", 4 << 30), ("1.5G", 3 << 29), ("1T", 1 << 40)],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


# --------------------------------------------------------------------------- pieces


def test_uring_unavailable_is_reported_and_run_continues(tmp_path):
    class NoUring:
        def __init__(self, path, writable, **kw):
            raise RuntimeError("io_uring init failed: engine not supported in this build")

    img = tmp_path / "f.img"
    with open(img, "wb") as f:
        f.truncate(4 * MiB)
    comps = [Competitor(name="ours", dist="x", module="x", cls=NoUring)]
    res = device.run_uring(str(img), comps, device.SUITES["smoke"], common._NullBar())
    assert res["available"] == {"ours": False}
    assert res["errors"]["ours"] == (
        "io_uring engine not available: RuntimeError: io_uring init failed: engine not supported in this build"
    )
    assert res["results"] == []


def test_interleaving_alternates_order():
    assert common.interleaved_order(0, ["ours", "rust"]) == ["ours", "rust"]
    assert common.interleaved_order(1, ["ours", "rust"]) == ["rust", "ours"]


def test_parse_fio_json_skips_leading_warnings():
    doc = {
        "fio version": "fio-3.33",
        "jobs": [{"error": 0, "read": {"bw_bytes": 1048576, "iops": 256.0, "io_bytes": 4096,
                                       "lat_ns": {"mean": 3000.0}}}],
    }
    text = "fio: some warning\n" + json.dumps(doc)
    got = limit.parse_fio_json(text, "read")
    assert got["bw_bytes"] == 1048576 and got["iops"] == 256 and got["lat_mean_us"] == 3.0
    with pytest.raises(ValueError):
        limit.parse_fio_json("no json here", "read")


class _FakeUringDevice:
    """Completes every batch at once: enough for the stream loop's bookkeeping."""

    opened: list = []

    def __init__(self, path, writable, **kw):
        self.kw = kw
        _FakeUringDevice.opened.append(kw)

    def batched_read(self, offsets, bufs, lens):
        assert len(offsets) == len(bufs) == len(lens)
        return len(offsets)

    batched_write = batched_read

    def wait_iouring(self, token):
        return [True] * token, []

    def close(self):
        pass


def test_limit_interleaves_fio_and_our_stream(tmp_path, monkeypatch):
    img = tmp_path / "f.img"
    with open(img, "wb") as f:
        f.truncate(8 * MiB)
    monkeypatch.setattr(limit.shutil, "which", lambda name: "/usr/bin/fio")
    calls = []

    def fake_fio(cmd, **kw):
        rw = next(a for a in cmd if a.startswith("--rw=")).split("=")[1]
        calls.append(cmd)
        doc = {"jobs": [{"error": 0, "write" if "write" in rw else "read":
                         {"bw_bytes": 1000.0 * len(calls), "iops": 1.0, "lat_ns": {"mean": 1000.0}}}]}
        return subprocess.CompletedProcess(cmd, 0, "fio: warning\n" + json.dumps(doc), "")

    _FakeUringDevice.opened = []
    cases = [("randread", 4096, 4), ("write", 1 << 20, 8), ("read", 1 << 20, 16)]
    res = limit.run_limit(str(img), _FakeUringDevice, cases, 8 * MiB, 0.01, 3, common._NullBar(), run=fake_fio)
    assert res["available"] and res["errors"] == []
    assert [(r["rw"], r["size"], r["depth"]) for r in res["results"]] == cases[:2]  # 16 MiB in flight: skipped
    # three rounds per case, fio and ours alternating which goes first
    assert len(calls) == 6 and len(_FakeUringDevice.opened) == 6
    assert all(o == {"use_odirect": True, "io_engine": "io_uring", "iouring_queue_depth": d}
               for o, d in zip(_FakeUringDevice.opened, [4, 4, 4, 8, 8, 8]))
    assert "--runtime=10ms" in calls[0] and "--time_based" in calls[0] and "--direct=1" in calls[0]
    first = res["results"][0]
    assert first["fio_bytes_per_s"] == 2000.0  # median of 1000, 2000, 3000
    assert first["ratio"] == pytest.approx(first["ours_bytes_per_s"] / 2000.0)
    assert first["fio_lat_mean_us"] == 1.0


def test_limit_without_fio_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(limit.shutil, "which", lambda name: None)
    res = limit.run_limit(str(tmp_path / "x"), _FakeUringDevice, [("read", 4096, 1)], MiB, 0.1, 1,
                          common._NullBar())
    assert res == {"available": False, "error": "fio not installed (apt-get install fio)", "results": []}


# --------------------------------------------------------------------------- core, recovery and plugin parts


def _no_lmcache(monkeypatch):
    from lmcache_rawblock_bench import core

    missing = Competitor(name="lmcache", dist="lmcache", module=core.LMCACHE_MODULE, error="not installed",
                         install=core.LMCACHE_PIP)
    monkeypatch.setattr(core, "lmcache_core", lambda: missing)
    monkeypatch.setattr(core, "activate_competitor_dir", lambda path=None: False)
    return core


def test_core_recovery_plugin_smoke_without_lmcache(tmp_path, capsys, monkeypatch):
    bench_core = _no_lmcache(monkeypatch)
    out = tmp_path / "out"
    rc, stdout, err = run_cli([*SMOKE, "--size", "8M", "--out", str(out), "--parts", "core,recovery,plugin",
                               "--no-plots"], capsys)
    assert rc == 0, err
    res = load(out)
    assert res["settings"]["parts"] == ["core", "recovery", "plugin"]
    assert "device" not in res and "uring" not in res
    lmc = res["competitors"]["lmcache"]
    assert lmc["available"] is False and lmc["install"] == bench_core.LMCACHE_PIP
    assert bench_core.LMCACHE_PIP in stdout and f"lmcache=={common.LMCACHE_VERSION}" in bench_core.LMCACHE_PIP
    core = res["core"]
    assert [r["op"] for r in core["rows"]] == ["put_many", "exists_many", "load_many_into", "checkpoint",
                                               "open_recovery", "delete_many"]
    assert all(r["ours_s"] > 0 and r["lmcache_s"] is None and r["speedup"] is None for r in core["rows"])
    assert core["index"][0]["bytes_per_entry_without_keys"] > 0
    assert {(r["op"], r["medium"]) for r in core["cpu"]} == {("put_many", "page cache"),
                                                             ("load_many_into", "page cache")}
    assert all(r["ours_cpu_per_key_s"] > 0 and r["speedup"] is None for r in core["cpu"])
    assert core["floor"]["available"] is False  # the smoke suite does not build the floor program
    assert {(r["medium"], r["entries"]) for r in core["flush"]} == {("page cache", 64), ("O_DIRECT", 64)}
    assert all(r["with_flush_wall_s"] > 0 and r["without_flush_wall_s"] > 0 for r in core["flush"])
    assert core["errors"] == {}
    plugin = res["plugin"]
    assert [(r["backend"], r["n"]) for r in plugin["remove"]] == [("ours", 10)]
    assert plugin["remove"][0]["fanout_s"] > 0 and plugin["remove"][0]["override_s"] > 0
    assert plugin["errors"] == {}
    rec = res["recovery"]["rows"][0]
    assert rec["slots"] == 100 and rec["drops_agree"] is True
    assert rec["drops"] == {"ours sequential": 2, "ours batched": 2}
    assert res["recovery"]["errors"] == {}
    # The summary lists what this run measured against a goal; without LMCache there is no
    # LMCache-relative row, and batched_remove was measured at 10 keys only.
    assert "Measured against the goals" in stdout and "index memory, 64 entries" in stdout
    goals = stdout.split("Measured against the goals")[1]
    assert "LMCache's sequential reader" not in goals
    # the floor needs no LMCache: our batched reader against the bare read loop of the same headers
    floor = rec["floor"]
    assert floor["floor_s"]["pread"] > 0 and floor["floor_s"]["io_uring"] > 0, floor
    assert floor["batched_vs_floor"] == rec["times_s"]["ours batched"] / floor["floor_s"]["io_uring"]
    assert "our batched reader / a bare batched-read loop" in goals
    assert "Recovery against the floor" in stdout
    assert "batched_remove, 1,000 keys" not in stdout


def test_install_competitors_installs_lmcache_only_for_core_parts(tmp_path, capsys, monkeypatch):
    core = _no_lmcache(monkeypatch)
    calls = []
    monkeypatch.setattr(core, "install_lmcache", lambda: calls.append(1) or (False, "pip exited 1: offline"))
    out = tmp_path / "out"
    rc, _, err = run_cli([*SMOKE, "--size", "8M", "--out", str(out), "--parts", "device",
                          "--install-competitors", "--no-plots"], capsys)
    assert rc == 0, err
    assert calls == []
    rc, _, err = run_cli([*SMOKE, "--size", "8M", "--out", str(out), "--parts", "plugin",
                          "--install-competitors", "--no-plots"], capsys)
    assert rc == 0, err
    assert calls == [1]
    assert any("offline" in n and "continuing without LMCache" in n for n in load(out)["notes"])


def test_install_lmcache_one_command_pins_cpu_torch_into_separate_dir(tmp_path):
    from lmcache_rawblock_bench import core

    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    ok, msg = core.install_lmcache(run=fake_run, target=str(tmp_path / "comp"))
    assert ok, msg
    # one resolver run: lmcache's torch requirement is met by the pinned CPU build, not a second torch
    assert len(seen) == 1 and seen[0][-2:] == ["torch==2.13.0", f"lmcache=={common.LMCACHE_VERSION}"]
    c = seen[0]
    assert c[:4] == [sys.executable, "-m", "pip", "install"]
    assert c[c.index("--target") + 1] == str(tmp_path / "comp")
    seen.clear()
    ok, msg = core.install_lmcache(run=lambda cmd, **kw: seen.append(cmd) or subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: no torch"), target=str(tmp_path / "c2"))
    assert not ok and "no torch" in msg and len(seen) == 1


def test_uring_cmd_engine_is_reported_not_measured(tmp_path, capsys, monkeypatch):
    _no_lmcache(monkeypatch)
    out = tmp_path / "out"
    rc, _, err = run_cli([*SMOKE, "--size", "8M", "--out", str(out), "--parts", "device",
                          "--engines", "posix,uring_cmd", "--no-plots"], capsys)
    assert rc == 0, err
    assert any(n.startswith("uring_cmd: not measured") for n in load(out)["notes"])


def test_core_plots_written(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib not installed: plots are skipped by design")
    _no_lmcache(monkeypatch)
    out = tmp_path / "out"
    rc, _, err = run_cli([*SMOKE, "--size", "8M", "--out", str(out), "--parts", "core,recovery,plugin"], capsys)
    assert rc == 0, err
    assert (out / "core_latency_vs_entries.png").read_bytes()[:4] == b"\x89PNG"
