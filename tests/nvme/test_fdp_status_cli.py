"""`python -m lmcache_rawblock fdp-status` on the emulated FDP namespace: what an operator reads
before pointing the cache at a drive."""

from __future__ import annotations

import json
import subprocess
import sys


def fdp_status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmcache_rawblock", "fdp-status", *args], capture_output=True,
                          text=True, timeout=120)


def test_json_lists_every_handle_with_its_available_writes(nvme_char):
    r = fdp_status(nvme_char, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["fdp_enabled"] is True and rep["nsid"] == 1
    assert sorted(h["pid"] for h in rep["ruhs"]) == list(range(16))
    assert all(h["ruamw"] > 0 for h in rep["ruhs"])


def test_text_names_the_configuration_and_handles(nvme_block):
    r = fdp_status(nvme_block)
    assert r.returncode == 0, r.stderr
    assert "FDP: enabled" in r.stdout and "16 reclaim unit handle(s)" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [int(row[0]) for row in rows] == list(range(16))  # placement ids 0..15, one row each
    assert "media bytes with metadata written" in r.stdout
