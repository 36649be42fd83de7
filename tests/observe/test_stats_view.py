"""``python -m lmcache_rawblock stats DEVICE`` against a live writer in another process: the
terminal view driven under tmux (send-keys / capture-pane) follows the writer's figures, the
one-shot ``--json`` agrees with them, and neither touches the device or its lock."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60  # how long to wait for something to appear (a bound, not a measurement)

WRITER = r"""
import os, sys, time
sys.path.insert(0, {tests!r})
from core_helpers import Obj, make_core, okey, payload
from lmcache_rawblock import livestats
dev, stop = sys.argv[1], sys.argv[2]
core = make_core(dev)
pub = livestats.publish(core, dev, interval=0.2)
i = 0
while not os.path.exists(stop):
    k = okey(i % 64)
    core.put_many([k], [Obj(payload(i, 4096))])
    core.load_many_into([k.encoded, okey(10_000 + i).encoded], [Obj(4096), Obj(4096)])
    i += 1
    time.sleep(0.002)
pub.stop()
core.close()
"""


def _wait_for(what: str, fn):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


@pytest.fixture
def writer(tmp_path, monkeypatch):
    dev = tmp_path / "dev.img"
    with open(dev, "wb") as f:
        f.truncate(64 << 20)
    env = dict(os.environ, RB_STATS_DIR=str(tmp_path / "stats"), PYTHONPATH=str(REPO))
    stop = tmp_path / "stop"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(tests=str(REPO / "tests")))
    proc = subprocess.Popen([sys.executable, str(script), str(dev), str(stop)], cwd=REPO, env=env)
    try:
        from lmcache_rawblock import livestats

        monkeypatch.setenv("RB_STATS_DIR", env["RB_STATS_DIR"])  # undone at teardown: the session's again
        _wait_for("the writer's first snapshot", lambda: os.path.exists(livestats.snapshot_path(str(dev))))
        yield str(dev), env, proc
    finally:
        stop.touch()
        proc.wait(30)


def _stats_json(dev: str, env: dict) -> dict:
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "stats", dev, "--json"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_json_once_follows_a_live_writer(writer):
    dev, env, proc = writer
    first = _wait_for("a snapshot with a put", lambda: (s := _stats_json(dev, env))["ops"]["put"]["count"] and s)
    assert first["live"] is True and first["pid"] == proc.pid and first["device"] == os.path.realpath(dev)
    assert first["ops"]["put"]["p50_s"] > 0
    later = _wait_for("the writer's counts to move", lambda: (s := _stats_json(dev, env))["ops"]["put"]["count"] >
                      first["ops"]["put"]["count"] and s)
    assert later["hits"] >= first["hits"] and later["misses"]["absent"] > 0
    assert later["slots"] > 0 and 0 <= later["fill"] <= 1
    assert proc.poll() is None, "the writer kept running: stats took nothing from it"


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (make apt-deps installs it)")
def test_the_terminal_view_under_tmux_follows_a_live_writer(writer):
    dev, env, proc = writer
    sock = f"rbstats-{os.getpid()}"
    tmux = ["tmux", "-L", sock]
    subprocess.run(tmux + ["-f", "/dev/null", "new-session", "-d", "-s", "v", "-x", "140", "-y", "40",
                           "-e", f"RB_STATS_DIR={env['RB_STATS_DIR']}", "-e", f"PYTHONPATH={REPO}", "-c", str(REPO)],
                   check=True)
    try:
        def pane() -> str:
            return subprocess.run(tmux + ["capture-pane", "-p", "-t", "v"], capture_output=True, text=True,
                                  check=True).stdout

        def put_count(text: str) -> int | None:
            m = re.search(r"^put\s+([\d,]+)\s", text, re.M)
            return int(m.group(1).replace(",", "")) if m and "live" in text else None

        subprocess.run(tmux + ["send-keys", "-t", "v", f"{sys.executable} -m lmcache_rawblock stats {dev} "
                               "--interval 0.3", "Enter"], check=True)
        first = _wait_for("the stats view", lambda: put_count(pane()))
        text = pane()
        assert f"writer pid {proc.pid}  live" in text
        for row in ("put", "load", "delete", "checkpoint", "io queue wait"):
            assert re.search(rf"^{row}\s+[\d,]+", text, re.M), (row, text)
        assert "load hits" in text and "evictions deleted" in text and "fill" in text
        _wait_for("the view to show more puts", lambda: (n := put_count(pane())) is not None and n > first)
        subprocess.run(tmux + ["send-keys", "-t", "v", "C-c"], check=True)
        _wait_for("the view to end on Ctrl-C", lambda: subprocess.run(
            tmux + ["display-message", "-p", "-t", "v", "#{pane_current_command}"], capture_output=True, text=True
        ).stdout.strip() in ("bash", "sh", "zsh", "dash"))
        assert proc.poll() is None, "the writer kept running beside the view"
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)


def test_no_live_figures_names_the_device_and_the_file(tmp_path):
    env = dict(os.environ, RB_STATS_DIR=str(tmp_path / "none"), PYTHONPATH=str(REPO))
    dev = str(tmp_path / "idle.img")
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "stats", dev, "--json"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"no live figures for {dev}" in r.stderr and str(tmp_path / "none") in r.stderr


def test_a_bad_interval_is_refused_by_name(tmp_path):
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "stats", str(tmp_path / "x"), "--interval", "0"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--interval must be > 0 seconds, got 0.0" in r.stderr
