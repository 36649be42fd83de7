"""``inspect`` and ``verify``: read-only views of a device in format v1."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from core_helpers import Obj, make_core, make_device, okey, payload
from helpers import sha256_file
from lmcache_rawblock import tools

# Reads format v1's containers or relies on its slot-reuse rule.
pytestmark = pytest.mark.v1_layout


def _populated(tmp_path, n=12, **kw):
    path = make_device(tmp_path)
    core = make_core(path, **kw)
    res = core.put_many([okey(i) for i in range(n)], [Obj(payload(i, 9000)) for i in range(n)])
    assert all(res.results)
    core.close()
    return path


def _two_checkpoints(tmp_path):
    """A device with one key checkpointed into each of the two v1 containers, in turn."""
    path = make_device(tmp_path)
    core = make_core(path)
    core.put_many([okey(1)], [Obj(payload(1, 100))])
    core.checkpoint_now()
    core.put_many([okey(2)], [Obj(payload(2, 100))])
    core.checkpoint_now()
    core.close()
    return path


def test_inspect_reports_geometry_containers_and_sample(tmp_path):
    path = _populated(tmp_path)
    before = sha256_file(path)
    info = tools.inspect_device(path, sample=3)
    g = info["geometry"]
    assert g["block_align"] == 4096 and g["slot_bytes"] == 65536 and g["meta_total_bytes"] == 1 << 20
    assert g["entries"] == 12 and g["used_slots"] == 12 and g["free_slots"] == g["max_slots"] - 12
    assert info["containers"][0]["crc_ok"] and info["containers"][0]["entries"] == 12
    assert len(info["sample_entries"]) == 3 and info["sample_entries"][0]["size"] == 9000
    assert sha256_file(path) == before, "inspect must not write"


def test_inspect_picks_the_newest_container(tmp_path):
    path = _two_checkpoints(tmp_path)
    info = tools.inspect_device(path)
    seqs = {c["index"]: c["seq"] for c in info["containers"]}
    assert len(seqs) == 2
    newest = max(seqs, key=seqs.get)
    assert info["checkpoint_in_use"] == newest and info["geometry"]["entries"] == 2


def test_verify_clean_and_corrupted(tmp_path):
    path = _populated(tmp_path, verify_payload_checksum=True, header_bytes=4096)
    res = tools.verify_device(path)
    assert res["checked"] == 12 and res["ok"] == 12 and res["checksums_checked"] == 12
    entries = list(tools.read_device(path).state["entries"].items())
    with open(path, "r+b") as f:
        f.seek(entries[0][1]["offset"] + 4096 + 17)  # a payload byte
        f.write(b"\x00" if payload(0, 9000)[17] else b"\x01")
        f.seek(entries[1][1]["offset"] + 8)  # the identity
        f.write(struct.pack("<Q", 7))
        f.seek(entries[2][1]["offset"] + 16)  # the length
        f.write(struct.pack("<Q", 1))
        f.seek(entries[3][1]["offset"])  # the magic
        f.write(b"XXXXXXXX")
        f.seek(entries[4][1]["offset"] + 40)  # the key hash: another key's
        f.write(struct.pack("<Q", 9))
        f.seek(entries[5][1]["offset"] + 40)  # no key hash (LMCache's header): fine
        f.write(bytes(8))
    res = tools.verify_device(path)
    problems = {m["key"]: m["problem"] for m in res["mismatches"]}
    assert res["ok"] == 7 and len(problems) == 5
    assert problems[entries[0][0]] == "payload checksum mismatch"
    assert problems[entries[1][0]].startswith("identity 0x7 != expected")
    assert problems[entries[2][0]] == "payload length 1 != checkpoint size 9000"
    assert problems[entries[3][0]] == "no slot header (magic)"
    assert problems[entries[4][0]].startswith("key hash 0x9 != expected")
    assert tools.verify_device(path, checksums=False)["checksums_checked"] == 0


def test_not_ours_is_refused(tmp_path):
    path = make_device(tmp_path, size=8 << 20, name="blank.img")
    with open(path, "r+b") as f:
        f.write(b"\x53\xef" * 2048)  # something else's bytes
    with pytest.raises(tools.NotARawBlockDevice, match="no valid LMCache raw-block checkpoint"):
        tools.inspect_device(path)


def test_torn_newest_container_falls_back(tmp_path):
    path = _two_checkpoints(tmp_path)
    info = tools.inspect_device(path)
    assert len(info["containers"]) == 2
    newest = max(info["containers"], key=lambda c: c["seq"])
    with open(path, "r+b") as f:  # tear the newest payload
        f.seek(newest["offset"] + 4096)
        f.write(b"}")
    info2 = tools.inspect_device(path)
    assert info2["checkpoint_in_use"] != newest["index"]
    assert info2["geometry"]["entries"] == 1, "the older checkpoint (one entry) is the valid one"
    assert any(c["error"] == "CRC mismatch" for c in info2["containers"])


def test_damaged_container0_still_finds_container1(tmp_path):
    path = _two_checkpoints(tmp_path)
    with open(path, "r+b") as f:  # container 0's payload is torn: geometry must be rediscovered
        f.seek(4096)
        f.write(b"}")
    info = tools.inspect_device(path)
    assert info["checkpoint_in_use"] == 1 and info["geometry"]["meta_total_bytes"] == 1 << 20


@pytest.mark.parametrize("cmd", ["inspect", "verify"])
def test_cli_json_and_exit_codes(tmp_path, cmd):
    path = _populated(tmp_path, n=3)
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", cmd, path, "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["geometry"]["entries"] == 3
    blank = make_device(tmp_path, size=4 << 20, name="blank.img")
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", cmd, blank], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "no valid LMCache raw-block checkpoint" in r.stderr
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", cmd, str(tmp_path / "missing")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot open" in r.stderr and "missing" in r.stderr


def test_a_negative_sample_is_refused_naming_the_option_and_the_value(tmp_path):
    path = _populated(tmp_path, n=20)
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "inspect", path, "--sample", "-3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert "--sample" in r.stderr and "-3" in r.stderr, r.stderr
    with pytest.raises(ValueError, match=r"sample must be an integer >= 0, got -3"):
        tools.inspect_device(path, sample=-3)
    assert len(tools.inspect_device(path, sample=0)["sample_entries"]) == 0
