"""The live-stats files of processes that are gone: the test suite publishes into a directory of
its own session (never /dev/shm), and a publisher that starts removes the files of writers it can
tell are dead (same boot and pid namespace, pid gone), and no other file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import helpers
from core_helpers import make_core, make_device
from lmcache_rawblock import livestats

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60  # how long to wait for something to appear (a bound, not a measurement)

# A writer that publishes, says so, and ends without closing its core or stopping its publisher,
# as the MP adapter's and the FDP tests' processes did.
ABANDONING_WRITER = r"""
import os, sys, time
sys.path.insert(0, {tests!r})
from core_helpers import make_core
from lmcache_rawblock import livestats
dev = sys.argv[1]
core = make_core(dev)
pub = livestats.publish(core, dev, interval=60)
assert pub.publish_now()
print(livestats.snapshot_path(dev), flush=True)
os._exit(0)
"""


def test_the_suite_publishes_into_its_own_directory(tmp_path_factory):
    given = helpers.STATS_DIR_GIVEN
    d = livestats.stats_dir()
    if given:
        assert d == given, "a directory set before the session is kept"
    else:
        assert d != livestats.DEFAULT_DIR
        assert Path(d).parent == tmp_path_factory.getbasetemp(), d
    r = subprocess.run([sys.executable, "-c", "from lmcache_rawblock import livestats; print(livestats.stats_dir())"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == d, "a child process of a test publishes into the same directory"


def test_a_directory_set_before_the_session_is_kept(tmp_path):
    given = str(tmp_path / "given")
    env = dict(os.environ, RB_STATS_DIR=given)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                        str(tmp_path / "inner"), f"{__file__}::test_the_suite_publishes_into_its_own_directory"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "1 passed" in r.stdout


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", ""])
    p.wait()
    return p.pid


def _plant(d: Path, name: str, **fields) -> Path:
    p = d / name
    p.write_text(json.dumps({"version": 1, "time": time.time(), "device": "/nowhere", "interval_s": 1.0,
                             "snapshot": {}, **fields}))
    return p


def test_a_publisher_removes_the_files_of_dead_writers_only(tmp_path, monkeypatch):
    d = tmp_path / "stats"
    d.mkdir()
    monkeypatch.setenv("RB_STATS_DIR", str(d))
    me = livestats.writer_identity()
    assert me["boot_id"] and me["pid_ns"], f"this machine tells its boot and pid namespace: {me}"
    dead = _dead_pid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        gone = _plant(d, "a.json", pid=dead, **me)
        alive = _plant(d, "b.json", pid=sleeper.pid, **me)
        other_ns = _plant(d, "c.json", pid=dead, **dict(me, pid_ns="pid:[1]"))
        other_boot = _plant(d, "d.json", pid=dead, **dict(me, boot_id="00000000-0000-0000-0000-000000000000"))
        unknown = _plant(d, "e.json", pid=dead)  # an earlier version's file: no boot or namespace recorded
        mine = _plant(d, "f.json", pid=os.getpid(), **me)
        (d / "g.json").write_text("{not json")
        (d / "h.txt").write_text(json.dumps({"pid": dead, **me}))
        old_tmp = d / f"a.json.{dead}.tmp"
        young_tmp = d / f"b.json.{_dead_pid()}.tmp"
        live_tmp = d / f"c.json.{sleeper.pid}.tmp"
        for t in (old_tmp, young_tmp, live_tmp):
            t.write_text("{")
        hour_ago = time.time() - 3600
        os.utime(old_tmp, (hour_ago, hour_ago))
        os.utime(live_tmp, (hour_ago, hour_ago))
        dev = make_device(tmp_path)
        core = make_core(dev)
        try:
            pub = livestats.publish(core, dev, interval=60)
            try:
                assert not gone.exists(), "the file of a dead writer of this boot and pid namespace is removed"
                assert not old_tmp.exists(), "a dead writer's temporary file, untouched for long, is removed"
                kept = [alive, other_ns, other_boot, unknown, mine, d / "g.json", d / "h.txt", young_tmp, live_tmp]
                assert [p.name for p in kept if not p.exists()] == []
                assert pub.publish_now()
                doc = json.loads(Path(livestats.snapshot_path(dev)).read_text())
                assert doc["pid"] == os.getpid() and doc["boot_id"] == me["boot_id"]
                assert doc["pid_ns"] == me["pid_ns"] and doc["host"] == me["host"]
            finally:
                pub.stop()
        finally:
            core.close()
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait(30)


def test_the_file_an_ended_writer_left_goes_when_the_next_publisher_starts(tmp_path, monkeypatch):
    d = tmp_path / "stats"
    monkeypatch.setenv("RB_STATS_DIR", str(d))
    script = tmp_path / "writer.py"
    script.write_text(ABANDONING_WRITER.format(tests=str(REPO / "tests")))
    first = make_device(tmp_path, name="first.img")
    r = subprocess.run([sys.executable, str(script), first], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, RB_STATS_DIR=str(d),
                                             PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))))
    assert r.returncode == 0, r.stderr
    left = Path(r.stdout.strip())
    assert left.parent == d and left.exists(), "the writer ended without removing its file"
    second = make_device(tmp_path, name="second.img")
    core = make_core(second)
    try:
        pub = livestats.publish(core, second, interval=60)
        try:
            assert not left.exists(), "the next publisher removed the ended writer's file"
            assert pub.publish_now()
            assert os.listdir(d) == [os.path.basename(livestats.snapshot_path(second))]
        finally:
            pub.stop()
    finally:
        core.close()
    assert os.listdir(d) == []
