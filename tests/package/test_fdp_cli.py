"""``python -m lmcache_rawblock fdp-status DEVICE [--json]``: errors for paths that are not NVMe
namespaces, and the report's text and JSON forms (from a report shaped as the native query
returns it; the real device is read in tests/nvme)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lmcache_rawblock import _native, tools
from lmcache_rawblock.__main__ import main

REPORT = {
    "nsid": 1, "lba_size": 4096, "size_bytes": 1 << 30, "endgid": 1, "fdp_enabled": True,
    "config": {"index": 0, "fdpa": 0x80, "nrg": 1, "nruh": 4, "maxpids": 128, "nnss": 1, "runs": 64 << 20},
    "ruhs": [{"pid": p, "ruhid": p, "earutr": 0, "ruamw": 16384 - 256 * p} for p in range(4)],
    "stats": {"hbmw": 1 << 20, "mbmw": 1 << 20, "mbe": 0},
}


def run(*args):
    return subprocess.run([sys.executable, "-m", "lmcache_rawblock", "fdp-status", *args], capture_output=True,
                          text=True, timeout=60)


def test_a_file_that_is_not_a_namespace(tmp_path):
    path = tmp_path / "plain.img"
    path.write_bytes(b"\0" * 4096)
    r = run(str(path))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"error: '{path}' is not an NVMe namespace (the NVMe ioctls are not supported)"


def test_a_missing_path(tmp_path):
    missing = tmp_path / "no" / "ng9n9"
    r = run(str(missing), "--json")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"error: {missing}: ") and os.strerror(2) in r.stderr


def test_a_character_device_that_is_not_nvme():
    r = run("/dev/null")
    assert r.returncode == 2 and "'/dev/null' is not an NVMe namespace" in r.stderr


def test_usage_without_a_device():
    r = run()
    assert r.returncode == 2 and "the following arguments are required: device" in r.stderr


@pytest.fixture
def fake_report(monkeypatch):
    monkeypatch.setattr(_native, "nvme_fdp_report", lambda path: dict(REPORT))


def test_text_report(fake_report, capsys):
    assert main(["fdp-status", "/dev/ng0n1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "/dev/ng0n1: namespace 1, endurance group 1, 4096-byte blocks, 1073741824 bytes"
    assert out[1] == ("FDP: enabled, configuration 0: 1 reclaim group(s), 4 reclaim unit handle(s), reclaim unit "
                      "67108864 bytes (64.0 MiB), up to 128 placement ids per namespace")
    assert out[2].split() == ["placement", "id", "handle", "available", "media", "writes", "est.", "time", "left"]
    assert out[3].split() == ["0", "0", "16384", "blocks", "(64.0", "MiB)", "0", "s"]
    assert out[5].split()[:3] == ["2", "2", "15872"]
    assert out[-1] == ("endurance group: host bytes with metadata written 1048576, media bytes with metadata written "
                       "1048576, media bytes erased 0")


def test_json_report(fake_report, capsys):
    assert main(["fdp-status", "/dev/ng0n1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"device": "/dev/ng0n1", **REPORT}


def test_fdp_off(monkeypatch):
    monkeypatch.setattr(_native, "nvme_fdp_report",
                        lambda path: dict(REPORT, fdp_enabled=False, config=None, ruhs=[], stats=None))
    text = tools.format_fdp_status(tools.fdp_status("/dev/ng0n1"))
    assert text.splitlines()[1] == "FDP: not enabled on this endurance group (writes cannot be placed)"


def test_runtime_error_from_the_query(monkeypatch, capsys):
    def fail(path):
        raise RuntimeError("FDP log page: NVMe status 0x2 (Invalid Field in Command)")

    monkeypatch.setattr(_native, "nvme_fdp_report", fail)
    assert main(["fdp-status", "/dev/ng0n1"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: /dev/ng0n1: FDP log page: NVMe status 0x2 (Invalid Field in Command)"
