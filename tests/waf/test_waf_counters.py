"""Wear counters (lmcache_rawblock_bench.waf.counters) and `waf precondition` on the host: the window
arithmetic, the steady-state warning, a regular file (no counters) and preconditioning a small
sparse file. The NVMe side runs in the emulated guest (tests/nvme/test_waf_counters_guest.py)."""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmcache_rawblock import _native
from lmcache_rawblock_bench.waf import counters, precondition

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def snap(hbmw=0, mbmw=0, mbe=0, duw=0, dur=0, hwc=0, hrc=0, ev_host=0, ev_ctrl=0, t=0.0, fdp=True, nsid=1, endgid=1):
    return {
        "nsid": nsid, "endgid": endgid, "time": t, "fdp_enabled": fdp,
        "smart": {"data_units_written": duw, "data_units_read": dur, "host_write_commands": hwc,
                  "host_read_commands": hrc},
        "fdp_stats": {"hbmw": hbmw, "mbmw": mbmw, "mbe": mbe} if fdp else None,
        "fdp_events": {"host": ev_host, "controller": ev_ctrl, "by_type": {}} if fdp else None,
    }


# --- window() ---------------------------------------------------------------------------------

def test_window_deltas_and_waf():
    b = snap(hbmw=10 * MiB, mbmw=11 * MiB, mbe=0, duw=100, dur=7, hwc=1000, hrc=50, ev_host=1, t=5.0)
    a = snap(hbmw=30 * MiB, mbmw=61 * MiB, mbe=64 * MiB, duw=141, dur=9, hwc=1160, hrc=51, ev_host=4, ev_ctrl=2,
             t=7.5)
    w = counters.window(b, a)
    assert w["available"] is True and w["note"] == ""
    assert w["host_bytes"] == 20 * MiB and w["media_bytes"] == 50 * MiB and w["erased_bytes"] == 64 * MiB
    assert w["waf"] == pytest.approx(2.5)
    assert w["smart_written_bytes"] == 41 * 512_000  # data units of 1000 x 512 bytes
    assert w["smart_read_bytes"] == 2 * 512_000
    assert w["host_write_commands"] == 160 and w["host_read_commands"] == 1
    assert w["events_host"] == 3 and w["events_controller"] == 2
    assert w["seconds"] == pytest.approx(2.5)


def test_window_zero_host_bytes_has_no_waf():
    b = snap(hbmw=MiB, mbmw=2 * MiB)
    a = snap(hbmw=MiB, mbmw=3 * MiB)  # media moved (GC) but the host wrote nothing
    w = counters.window(b, a)
    assert w["available"] is True
    assert w["waf"] is None and w["media_bytes"] == MiB
    assert "wrote nothing" in w["note"]


@pytest.mark.parametrize("before_none", [True, False])
def test_window_missing_snapshot(before_none):
    s = snap(hbmw=MiB, mbmw=MiB)
    w = counters.window(None, s) if before_none else counters.window(s, None)
    assert w["available"] is False and w["waf"] is None
    assert w["host_bytes"] is None and w["smart_written_bytes"] is None
    assert "not an NVMe namespace" in w["note"]


def test_window_without_fdp_keeps_smart():
    b = snap(fdp=False, duw=10, hwc=5)
    a = snap(fdp=False, duw=12, hwc=9)
    w = counters.window(b, a)
    assert w["available"] is False and w["waf"] is None
    assert w["host_bytes"] is None and w["media_bytes"] is None and w["events_host"] is None
    assert w["smart_written_bytes"] == 2 * 512_000 and w["host_write_commands"] == 4
    assert "FDP" in w["note"]


def test_window_different_namespaces_gives_nothing():
    w = counters.window(snap(hbmw=0, mbmw=0, nsid=1), snap(hbmw=MiB, mbmw=MiB, nsid=2))
    assert w["available"] is False and w["waf"] is None and w["host_bytes"] is None
    assert "different namespaces" in w["note"]


def test_window_counter_going_backwards_is_not_a_waf():
    w = counters.window(snap(hbmw=5 * MiB, mbmw=5 * MiB), snap(hbmw=MiB, mbmw=MiB))
    assert w["available"] is False and w["waf"] is None
    assert "backwards" in w["note"]


def test_window_does_not_modify_its_inputs():
    b, a = snap(hbmw=1, mbmw=1), snap(hbmw=3, mbmw=5)
    b0, a0 = copy.deepcopy(b), copy.deepcopy(a)
    counters.window(b, a)
    assert (b, a) == (b0, a0)


# --- steady_state_warning() -------------------------------------------------------------------

@pytest.mark.parametrize("waf", [1.0, 0.96, 1.04, 0.951, 1.049])
def test_steady_state_warning_near_one(waf):
    msg = counters.steady_state_warning(waf)
    assert msg is not None
    assert "not in steady state" in msg and "QEMU" in msg and "WAF = 1" in msg


@pytest.mark.parametrize("waf", [None, 0.5, 0.94, 1.06, 1.5, 3.0])
def test_steady_state_warning_elsewhere(waf):
    assert counters.steady_state_warning(waf) is None


# --- reading counters from something that is not NVMe -----------------------------------------

def test_read_counters_on_a_regular_file_is_none(tmp_path):
    f = tmp_path / "plain.img"
    f.write_bytes(b"\0" * 4096)
    assert counters.read_counters(str(f)) is None


def test_native_wear_counters_on_a_regular_file_raises_value_error(tmp_path):
    f = tmp_path / "plain.img"
    f.write_bytes(b"\0" * 4096)
    with pytest.raises(ValueError, match=r"is not an NVMe namespace") as ei:
        _native.nvme_wear_counters(str(f))
    assert str(f) in str(ei.value)


def test_native_wear_counters_missing_path_is_oserror_with_the_path(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError) as ei:
        _native.nvme_wear_counters(missing)  # a PathLike works too
    assert ei.value.filename == str(missing)


# --- waf precondition -------------------------------------------------------------------------

def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="waf precondition")
    precondition.add_arguments(p)
    return p.parse_args(list(argv))


def sparse(tmp_path, size=8 * MiB):
    f = tmp_path / "dev.img"
    with open(f, "wb") as fh:
        fh.truncate(size)
    return str(f)


def test_precondition_writes_the_whole_span(tmp_path, capsys):
    dev = sparse(tmp_path)
    rc = precondition.main(parse("--device", dev, "--block", "64K", "--random-block", "4K", "--overwrite", "0.5",
                                 "--destroy-data", "--json"))
    out, err = capsys.readouterr()
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["span_bytes"] == 8 * MiB and rep["kind"] == "file"
    assert [p["name"] for p in rep["phases"]] == ["fill", "overwrite", "calibrate"]
    assert rep["phases"][0]["bytes"] == 8 * MiB
    assert rep["phases"][1]["bytes"] == 4 * MiB and rep["phases"][2]["bytes"] == 2 * MiB
    # a regular file has no wear counters, and the report says so
    assert rep["waf"] is None and rep["calibration"]["available"] is False
    assert "not an NVMe namespace" in rep["calibration"]["note"]
    assert "sequential fill" in err  # progress on stderr
    with open(dev, "rb") as fh:
        data = fh.read()
    assert len(data) == 8 * MiB
    for off in range(0, 8 * MiB, 64 * 1024):  # every fill block has data
        assert any(data[off:off + 4096]), f"block at {off} is still zero"
    assert any(data[:512]) and any(data[-512:])


def test_precondition_text_report_says_counters_are_unavailable(tmp_path, capsys):
    dev = sparse(tmp_path, 2 * MiB)
    rc = precondition.main(parse("--device", dev, "--block", "256K", "--random-block", "4K", "--overwrite", "0",
                                 "--destroy-data"))
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "WAF not available" in out and "not an NVMe namespace" in out
    assert "overwrite" not in out.split("calibration window")[0].split("\n", 1)[1]  # --overwrite 0: no pass


def test_precondition_extends_a_short_file_to_the_span(tmp_path, capsys):
    dev = sparse(tmp_path, 1 * MiB)
    rc = precondition.main(parse("--device", dev, "--span", "3M", "--block", "1M", "--random-block", "64K",
                                 "--calibrate", "0", "--destroy-data", "--json"))
    out, err = capsys.readouterr()
    assert rc == 0, err
    rep = json.loads(out)
    assert os.path.getsize(dev) == 3 * MiB and rep["span_bytes"] == 3 * MiB
    assert rep["calibration"] is None and rep["waf"] is None
    assert any("extended" in n for n in rep["notes"])
    with open(dev, "rb") as fh:
        fh.seek(3 * MiB - 4096)
        assert any(fh.read())


def test_precondition_refuses_without_destroy_data(tmp_path, capsys):
    dev = sparse(tmp_path)
    rc = precondition.main(parse("--device", dev))
    _, err = capsys.readouterr()
    assert rc == 2
    assert "--destroy-data" in err and dev in err
    with open(dev, "rb") as fh:
        assert not any(fh.read())  # nothing written


def test_precondition_refuses_a_file_system_without_force(tmp_path, capsys):
    dev = sparse(tmp_path, 8 * MiB)
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"mkfs.ext4 is not usable here: {exc}")
    rc = precondition.main(parse("--device", dev, "--destroy-data", "--block", "64K", "--random-block", "4K"))
    _, err = capsys.readouterr()
    assert rc == 2 and "ext4" in err and "--force" in err
    rc = precondition.main(parse("--device", dev, "--destroy-data", "--force", "--block", "64K",
                                 "--random-block", "4K", "--overwrite", "0", "--calibrate", "0", "--json"))
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert any("--force" in n for n in json.loads(out)["notes"])


def test_precondition_missing_device_is_a_clear_error(tmp_path, capsys):
    missing = str(tmp_path / "nope")
    rc = precondition.main(parse("--device", missing, "--destroy-data"))
    _, err = capsys.readouterr()
    assert rc == 2 and missing in err and "no such file" in err


def test_precondition_block_larger_than_span(tmp_path, capsys):
    dev = sparse(tmp_path, 1 * MiB)
    rc = precondition.main(parse("--device", dev, "--block", "2M", "--destroy-data"))
    _, err = capsys.readouterr()
    assert rc == 2 and "--block" in err and "larger than the span" in err


@pytest.mark.parametrize("argv, option, value", [
    (["--span", "5k"], "--span", "5k"),
    (["--span", "lots"], "--span", "lots"),
    (["--block", "1000"], "--block", "1000"),
    (["--random-block", "0"], "--random-block", "0"),
    (["--overwrite", "-1"], "--overwrite", "-1"),
    (["--overwrite", "many"], "--overwrite", "many"),
    (["--calibrate", "nan"], "--calibrate", "nan"),
    (["--depth", "0"], "--depth", "0"),
    (["--depth", "x"], "--depth", "x"),
])
def test_precondition_bad_arguments_name_option_and_value(argv, option, value, capsys):
    with pytest.raises(SystemExit) as ei:
        parse("--device", "/nonexistent", *argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and value in err


def test_precondition_is_a_waf_subcommand(tmp_path):
    dev = sparse(tmp_path, 1 * MiB)
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "waf", "precondition", "--device", dev,
                        "--block", "256K", "--random-block", "16K", "--destroy-data", "--json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                                       os.environ.get("PYTHONPATH")]))})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["span_bytes"] == 1 * MiB


def test_a_generic_char_device_is_written_through_its_block_device(tmp_path, capsys):
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null to stand in for a character device")
    ng = tmp_path / "ng3n2"
    ng.symlink_to("/dev/null")  # a character device named like an NVMe generic device
    assert precondition.write_path_for(str(ng)) == str(tmp_path / "nvme3n2")
    assert precondition.write_path_for("/dev/null") == "/dev/null"  # a char device, not ngXnY
    assert precondition.write_path_for(str(tmp_path / "plain")) == str(tmp_path / "plain")
    rc = precondition.main(parse("--device", str(ng), "--destroy-data"))
    _, err = capsys.readouterr()
    assert rc == 2 and str(tmp_path / "nvme3n2") in err and "does not exist" in err


def test_loop_device_has_no_counters_and_preconditions(loop_device, capsys):
    dev = loop_device(8 * MiB)
    assert counters.read_counters(dev) is None  # the loop driver answers the NVMe ioctl with EINVAL
    with pytest.raises(ValueError, match="is not an NVMe namespace"):
        _native.nvme_wear_counters(dev)
    rc = precondition.main(parse("--device", dev, "--block", "1M", "--random-block", "64K", "--destroy-data",
                                 "--json"))
    out, err = capsys.readouterr()
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["kind"] == "block-device" and rep["span_bytes"] == 8 * MiB and rep["waf"] is None
    with open(dev, "rb") as fh:
        data = fh.read()
    assert any(data[:4096]) and any(data[-4096:])


def test_precondition_falls_back_to_buffered_writes_without_o_direct(tmp_path, capsys, monkeypatch):
    dev = sparse(tmp_path, 2 * MiB)
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument")  # what a file system without O_DIRECT answers
        return real_open(path, flags, *args)

    monkeypatch.setattr(precondition.os, "open", no_direct)
    rc = precondition.main(parse("--device", dev, "--block", "256K", "--random-block", "4K", "--destroy-data",
                                 "--json"))
    out, err = capsys.readouterr()
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["o_direct"] is False and any("O_DIRECT not available" in n for n in rep["notes"])
    with open(dev, "rb") as fh:
        data = fh.read()
    assert any(data[:4096]) and any(data[-4096:])
