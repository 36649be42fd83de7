"""One writer per device: a core holds flock LOCK_EX on its device (and O_EXCL on a block device)
for its lifetime; a second writer, in another process or this one, is refused with EBUSY and a
message naming the path and the holder. RawBlockDevice only checks (LMCache's low-level handle
may open a path twice, beside a core of its own process); inspect and verify read under a shared
lock; the raw writers of the benchmark and the waf tools hold the exclusive lock."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core_helpers import CORE_LOGGER, Obj, make_core, make_device, okey, payload
from helpers import TESTS
from lmcache_rawblock import RawBlockDevice, _native, tools

PKG_ROOT = Path(_native.__file__).resolve().parent.parent
# -P: the child imports the same lmcache_rawblock as this process, not one from its cwd.
PYTHON = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else [])]

HOLDER = r"""
import os, sys
kind, path, engine, lock = sys.argv[1:5]
if kind == "core":
    from core_helpers import make_core
    held = make_core(path, io_engine=engine, allow_foreign_device=True)
elif kind == "device":
    from lmcache_rawblock import RawBlockDevice
    held = RawBlockDevice(path, True, io_engine=engine, lock=lock)
else:  # an exclusive opener that takes no flock (as mkfs or a foreign tool would)
    held = os.open(path, os.O_RDONLY | os.O_EXCL)
print("ready", os.getpid(), flush=True)
sys.stdin.read()
"""


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), str(PKG_ROOT), env.get("PYTHONPATH")) if p)
    return env


class Holder:
    """Another process holding path open: a core, a RawBlockDevice, or a bare O_EXCL descriptor.
    It keeps it until stop() (stdin closed: a clean exit) or kill() (SIGKILL)."""

    def __init__(self, path: str, kind: str = "core", engine: str = "posix", lock: str = "check"):
        self.proc = subprocess.Popen([*PYTHON, "-c", HOLDER, kind, path, engine, lock], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        line = self.proc.stdout.readline().split()
        if line[:1] != ["ready"]:
            self.proc.kill()
            raise AssertionError(f"holder did not start: {self.proc.communicate()[1]}")
        self.pid = int(line[1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)

    def __enter__(self) -> "Holder":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=60)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f and not f.closed:
                f.close()


def _refused(exc: pytest.ExceptionInfo, path: str) -> str:
    assert exc.value.errno == errno.EBUSY, exc.value
    msg = exc.value.strerror
    assert f"device_path='{path}'" in msg, msg
    return msg


ENGINES = ["posix", "io_uring"]


# ---- files ------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_second_process_is_refused_and_told_the_path_and_the_holders_pid(tmp_path, engine):
    path = make_device(tmp_path)
    with Holder(path, engine=engine) as h:
        with pytest.raises(OSError) as exc:
            make_core(path, io_engine=engine)
        msg = _refused(exc, path)
        assert f"held by another raw-block writer (pid {h.pid})" in msg
        assert "corrupt each other's cache" in msg and "in this process" not in msg


@pytest.mark.parametrize("engine", ENGINES)
def test_a_second_core_in_the_same_process_is_refused_and_told_it_is_this_process(tmp_path, engine):
    path = make_device(tmp_path)
    core = make_core(path, io_engine=engine)
    try:
        with pytest.raises(OSError) as exc:
            make_core(path, io_engine=engine)
        msg = _refused(exc, path)
        assert f"in this process (pid {os.getpid()})" in msg and "close the other first" in msg
    finally:
        core.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_close_releases_the_lock_for_the_next_core(tmp_path, engine):
    path = make_device(tmp_path)
    for i in range(3):  # with io_uring the ring lets go of its file only later: close unlocks first
        core = make_core(path, io_engine=engine)
        assert core.report_status()["device_lock"] == "exclusive"
        assert all(core.put_many([okey(i)], [Obj(payload(i, 100))]).results)
        core.close()
        assert core.report_status()["device_lock"] == "released"
    core = make_core(path, io_engine=engine)
    assert core.contains_key(okey(2).encoded)
    core.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_killed_holders_lock_goes_with_it(tmp_path, engine):
    path = make_device(tmp_path)
    with Holder(path, engine=engine) as h:
        h.kill()  # with io_uring the kernel drops the lock as it tears the ring down, just after the exit
        core = make_core(path, io_engine=engine)
        assert core.report_status()["device_lock"] == "exclusive"
        core.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_writer_killed_an_instant_ago_is_waited_for(tmp_path, engine):
    """A supervisor that restarts right after kill -9, before it reaps the old writer: the old
    writer has a SIGKILL pending or is exiting, and its lock goes with it in a moment."""
    path = make_device(tmp_path)
    for _ in range(5):
        with Holder(path, engine=engine) as h:
            os.kill(h.pid, signal.SIGKILL)  # not reaped yet
            core = make_core(path, io_engine=engine)
            core.close()


def test_a_stopped_holder_releases_the_device(tmp_path):
    path = make_device(tmp_path)
    with Holder(path) as h:
        with pytest.raises(OSError):
            make_core(path)
        h.stop()
        make_core(path).close()


def test_raw_block_device_beside_a_core_of_the_same_process_is_allowed(tmp_path):
    path = make_device(tmp_path)
    core = make_core(path)
    try:
        for engine in ENGINES:  # LMCache's own tests open the path beside a core of theirs
            with RawBlockDevice(path, True, io_engine=engine) as dev:
                assert dev.device_lock == "none"
                buf = bytearray(4096)
                dev.pread_into(0, buf, 4096)
    finally:
        core.close()


def test_raw_block_device_is_refused_while_another_processs_core_holds_the_path(tmp_path):
    path = make_device(tmp_path)
    with Holder(path) as h:
        for kw in ({}, {"lock": "check"}, {"lock": "exclusive"}):
            with pytest.raises(OSError) as exc:
                RawBlockDevice(path, True, **kw)
            assert f"held by another raw-block writer (pid {h.pid})" in _refused(exc, path)
        with pytest.raises(OSError) as exc:
            RawBlockDevice(path, False, lock="shared")
        assert f"held by a raw-block writer (pid {h.pid})" in _refused(exc, path)
        # lock="none" is LMCache's device exactly: no check at all.
        RawBlockDevice(path, False, lock="none").close()


def test_a_core_is_refused_while_another_process_holds_an_exclusive_raw_block_device(tmp_path):
    path = make_device(tmp_path)
    with Holder(path, kind="device", lock="exclusive") as h:
        with pytest.raises(OSError) as exc:
            make_core(path)
        assert f"(pid {h.pid})" in _refused(exc, path)


def test_a_checking_raw_block_device_holds_no_lock(tmp_path):
    path = make_device(tmp_path)
    with Holder(path, kind="device", lock="check"):
        make_core(path).close()  # only writers that lock are seen


def test_readers_share_the_device_and_keep_a_core_out(tmp_path):
    path = make_device(tmp_path)
    a = RawBlockDevice(path, False, lock="shared")
    b = RawBlockDevice(path, False, lock="shared")
    assert a.device_lock == b.device_lock == "shared"
    with pytest.raises(OSError) as exc:  # readers are waited for briefly, then refused
        make_core(path)
    assert "being read in this process" in _refused(exc, path)
    a.close()
    b.close()
    assert a.device_lock == "released"
    make_core(path).close()


def test_lock_is_a_keyword_only_extension(tmp_path):
    path = make_device(tmp_path)
    with pytest.raises(ValueError, match="lock must be one of"):
        RawBlockDevice(path, True, lock="exclusively")
    with pytest.raises(ValueError, match="lock must be one of"):
        RawBlockDevice(path, True, lock=1)
    with pytest.raises(TypeError):
        RawBlockDevice(path, True, False, False, False, 4096, None, 256, None, "exclusive")
    with RawBlockDevice(path, True, lock=None) as dev:
        assert dev.device_lock == "none"
    with RawBlockDevice(path, True, lock="exclusive") as dev:
        assert dev.device_lock == "exclusive"
        with pytest.raises(OSError) as exc:
            make_core(path)
        assert "in this process" in _refused(exc, path)


@pytest.mark.parametrize("errnum", [errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL])
def test_a_file_system_without_flock_opens_unlocked_and_says_so(tmp_path, caplog, errnum):
    path = make_device(tmp_path)
    _native._inject_lock_errno(errnum)
    try:
        with caplog.at_level("WARNING", logger=CORE_LOGGER):
            core = make_core(path)
    finally:
        _native._inject_lock_errno(0)
    assert core.report_status()["device_lock"] == "unsupported"
    assert any("device lock unsupported on this file system" in r.getMessage() for r in caplog.records)
    core.close()
    _native._inject_lock_errno(errnum)
    try:
        dev = RawBlockDevice(path, True, lock="exclusive")
    finally:
        _native._inject_lock_errno(0)
    assert dev.device_lock == "unsupported"
    dev.close()


def test_another_flock_error_is_reported(tmp_path):
    path = make_device(tmp_path)
    _native._inject_lock_errno(errno.EIO)
    try:
        with pytest.raises(OSError) as exc:
            make_core(path)
    finally:
        _native._inject_lock_errno(0)
    assert exc.value.errno == errno.EIO and "flock failed" in str(exc.value)


# ---- inspect / verify -------------------------------------------------------------------------


def _populated(tmp_path) -> str:
    path = make_device(tmp_path)
    core = make_core(path)
    assert all(core.put_many([okey(i) for i in range(3)], [Obj(payload(i, 5000)) for i in range(3)]).results)
    core.close()
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PYTHON, "-m", "lmcache_rawblock", *args], capture_output=True, text=True, timeout=120,
                          env=_env())


@pytest.mark.parametrize("cmd", ["inspect", "verify"])
def test_inspect_and_verify_refuse_a_device_a_writer_holds_and_read_it_after(tmp_path, cmd):
    path = _populated(tmp_path)
    with Holder(path) as h:
        r = _cli(cmd, path, "--json")
        assert r.returncode == tools.EXIT_BUSY, r.stderr
        assert path in r.stderr and f"pid {h.pid}" in r.stderr and "--ignore-lock" in r.stderr
        assert r.stdout == ""
        r = _cli(cmd, path, "--json", "--ignore-lock")
        assert r.returncode == 0, r.stderr
        assert "warning:" in r.stderr and f"pid {h.pid}" in r.stderr
        assert json.loads(r.stdout)["geometry"]["entries"] == 3
        h.stop()
    r = _cli(cmd, path, "--json")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["geometry"]["entries"] == 3


def test_inspect_in_process_refuses_while_a_core_of_this_process_writes(tmp_path):
    path = _populated(tmp_path)
    core = make_core(path)
    try:
        with pytest.raises(OSError) as exc:
            tools.inspect_device(path)
        assert "held by a raw-block writer in this process" in _refused(exc, path)
        assert tools.verify_device(path, ignore_lock=True)["ok"] == 3
    finally:
        core.close()
    assert tools.verify_device(path)["ok"] == 3


# ---- raw writers outside a core ---------------------------------------------------------------


def test_benchmark_target_is_held_exclusively_and_refused_while_a_core_holds_it(tmp_path):
    from lmcache_rawblock_bench.target import TargetError, open_target

    path = make_device(tmp_path)
    with Holder(path) as h:
        with pytest.raises(TargetError, match=f"pid {h.pid}"):
            open_target(path, None)
    target = open_target(path, None)
    try:
        assert target.guard.device_lock == "exclusive"
        with RawBlockDevice(path, True) as dev:  # the benchmark's own devices open beside the guard
            dev.pwrite_from_buffer(0, b"x" * 4096)
        with pytest.raises(OSError):
            make_core(path)
        r = subprocess.run([*PYTHON, "-c", f"from lmcache_rawblock import RawBlockDevice as R; R({path!r}, True)"],
                           capture_output=True, text=True, timeout=60, env=_env())
        assert r.returncode != 0 and "Errno 16" in r.stderr
    finally:
        target.cleanup()
    make_core(path).close()


def test_waf_precondition_and_replay_refuse_a_device_a_core_holds(tmp_path):
    from lmcache_rawblock_bench.target import TargetError
    from lmcache_rawblock_bench.waf import precondition, replay

    path = make_device(tmp_path, size=8 << 20)
    before = open(path, "rb").read()
    with Holder(path) as h:
        with pytest.raises(TargetError, match=f"pid {h.pid}"):
            precondition.run(path, None, 1 << 20, 128 << 10, 0.0, 0.0, 1, 1, force=True)
        with pytest.raises(replay.ReplayError, match=f"pid {h.pid}"):
            replay.refuse_held(path)
    assert open(path, "rb").read() == before
    replay.refuse_held(path)


# ---- block devices ----------------------------------------------------------------------------


def test_a_loop_device_takes_one_writer(loop_device):
    dev = loop_device()
    with Holder(dev) as h:
        with pytest.raises(OSError) as exc:
            make_core(dev, allow_foreign_device=True)
        assert f"held by another raw-block writer (pid {h.pid})" in _refused(exc, dev)
        with pytest.raises(OSError) as exc:
            RawBlockDevice(dev, True)
        assert f"(pid {h.pid})" in _refused(exc, dev)
        h.kill()
        core = make_core(dev, allow_foreign_device=True)
    try:
        with pytest.raises(OSError) as exc:
            make_core(dev, allow_foreign_device=True)
        assert f"in this process (pid {os.getpid()})" in _refused(exc, dev)
        # An exclusive opener of the block device is refused by O_EXCL alone, without a flock.
        r = subprocess.run([*PYTHON, "-c", f"import os; os.open({dev!r}, os.O_RDONLY | os.O_EXCL)"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "Device or resource busy" in r.stderr
        with RawBlockDevice(dev, True) as raw:  # the low-level handle of this process still opens
            assert raw.device_lock == "none"
    finally:
        core.close()
    make_core(dev, allow_foreign_device=True).close()


def test_an_exclusive_opener_without_a_lock_is_named(loop_device):
    dev = loop_device()
    with Holder(dev, kind="excl") as h:
        with pytest.raises(OSError) as exc:
            make_core(dev, allow_foreign_device=True)
        msg = _refused(exc, dev)
        assert "opened exclusively by another process" in msg and f"pid {h.pid} has it open" in msg


@pytest.mark.skipif(not shutil.which("mkfs.ext4"), reason="mkfs.ext4 (e2fsprogs) is not installed")
def test_a_mounted_loop_device_is_refused(loop_device, tmp_path):
    dev = loop_device(size=32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True, capture_output=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", dev, str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount ext4 on a loop device here: {r.stderr.strip()}")
    try:
        # O_EXCL refuses it; with the foreign-device probe on, the mount is still what is reported.
        for allow in (True, False):
            with pytest.raises(OSError) as exc:
                make_core(dev, allow_foreign_device=allow)
            assert f"mounted on {mnt}" in _refused(exc, dev)
        # Readers neither claim the device nor see a raw-block writer: inspect says what it finds.
        with pytest.raises(tools.NotARawBlockDevice):
            tools.inspect_device(dev)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    with pytest.raises(ValueError, match="ext4"):
        make_core(dev)  # unmounted: the probe refuses its file system, as before


# ---- one backing store, whatever the path -------------------------------------------------------
# A file and every loop device over it reach the same bytes: one writer among them all. A loop
# device's writer locks its backing file too; a writer of a file or of a loop device checks the
# other loop devices over the same file.


def _held_by(path: str, pid: int, **kw) -> str:
    """A core opened on path is refused, naming pid as the writer that holds it; the message."""
    with pytest.raises(OSError) as exc:
        make_core(path, allow_foreign_device=True, **kw)
    msg = _refused(exc, path)
    assert f"held by another raw-block writer (pid {pid})" in msg, msg
    return msg


@pytest.mark.parametrize("first", ["file", "loop"])
def test_a_file_and_a_loop_device_over_it_take_one_writer(tmp_path, rig, first):
    img = make_device(tmp_path)
    loop = rig.attach(img)
    held, other = (img, loop) if first == "file" else (loop, img)
    with Holder(held, engine="io_uring") as h:
        msg = _held_by(other, h.pid)
        if first == "file":
            assert f"on its backing file {img}" in msg
        with pytest.raises(OSError) as exc:  # LMCache's handle checks the same way
            RawBlockDevice(other, True)
        assert f"(pid {h.pid})" in _refused(exc, other)
    make_core(other, allow_foreign_device=True).close()  # the holder gone, the other path opens


def test_two_loop_devices_over_one_file_take_one_writer(tmp_path, rig):
    img = make_device(tmp_path)
    a, b = rig.attach(img), rig.attach(img)
    with Holder(a) as h:
        assert f"on its backing file {img}" in _held_by(b, h.pid)
    core = make_core(b, allow_foreign_device=True)
    try:  # and the other way round, in one process
        with pytest.raises(OSError) as exc:
            make_core(a, allow_foreign_device=True)
        assert f"in this process (pid {os.getpid()})" in _refused(exc, a)
    finally:
        core.close()


def test_a_loop_devices_file_renamed_or_unlinked_is_still_the_same_device(tmp_path, rig):
    """The loop devices know their file by device and inode, not by the path they were given."""
    img = make_device(tmp_path)
    a, b = rig.attach(img), rig.attach(img)
    moved = str(tmp_path / "moved.img")
    os.rename(img, moved)
    with Holder(a) as h:
        assert f"on its backing file {moved}" in _held_by(b, h.pid)
        _held_by(moved, h.pid)
    os.unlink(moved)  # nobody can open the file by a path now: the other loop device is checked
    with Holder(a) as h:
        assert f"on loop device {a} over the same file" in _held_by(b, h.pid)
    with Holder(b) as h:
        assert f"on loop device {b} over the same file" in _held_by(a, h.pid)


def test_a_file_is_refused_while_a_loop_device_over_it_is_mounted(tmp_path, rig):
    if not shutil.which("mkfs.ext4"):
        pytest.skip("mkfs.ext4 (e2fsprogs) is not installed")
    img = make_device(tmp_path, size=32 << 20)
    loop = rig.attach(img)
    subprocess.run(["mkfs.ext4", "-q", "-F", loop], check=True, capture_output=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", loop, str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount ext4 on a loop device here: {r.stderr.strip()}")
    try:
        with pytest.raises(OSError) as exc:
            make_core(img, allow_foreign_device=True)
        assert f"mounted on {mnt} via {loop}" in _refused(exc, img)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    make_core(img, allow_foreign_device=True).close()


@pytest.mark.parametrize("how", ["symlink", "hard link"])
def test_another_name_of_the_file_is_the_same_device(tmp_path, how):
    img = make_device(tmp_path)
    other = str(tmp_path / "other.img")
    (os.symlink if how == "symlink" else os.link)(img, other)
    with Holder(img) as h:
        _held_by(other, h.pid)


def test_another_device_node_of_a_loop_device_is_the_same_device(tmp_path, loop_device):
    dev = loop_device()
    node = str(tmp_path / "node")
    rdev = os.stat(dev).st_rdev
    os.mknod(node, 0o600 | stat.S_IFBLK, rdev)
    with Holder(dev) as h:
        with pytest.raises(OSError) as exc:
            make_core(node, allow_foreign_device=True)
        assert "O_EXCL" in _refused(exc, node) or f"(pid {h.pid})" in exc.value.strerror


# ---- locks that die with their writer -------------------------------------------------------------

FORKER = r"""
import os, sys, time
path, engine, mode = sys.argv[1:4]
from core_helpers import make_core, okey, payload, Obj
core = make_core(path, io_engine=engine, allow_foreign_device=True)
core.put_many([okey(1)], [Obj(payload(1, 4096))])
core.checkpoint_now()
r, w = os.pipe()
child = os.fork()
if child == 0:  # an idle child: it never touches the device
    os.write(w, b"x")  # past the fork: the child's fork handlers have run
    if mode == "ring":  # ... but keeps the engine's ring alive: every descriptor but the ring's closed
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:[io_uring]":
                    os.close(fd)
            except OSError:
                pass
    time.sleep(600)
    os._exit(0)
os.read(r, 1)
print("ready", os.getpid(), child, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_a_forked_idle_child_does_not_keep_a_killed_writers_lock(tmp_path, engine):
    """The writer forks without exec and is killed; its child lives on. The child closed its copy
    of the lock's descriptor at the fork: the next writer opens at once."""
    path = make_device(tmp_path)
    _restart_after_kill(path, engine, "idle")


def test_a_ring_that_outlives_its_writer_does_not_keep_the_lock(tmp_path):
    """The io_uring ring of a killed writer still alive (here a child keeps it, as the kernel does
    for a while after a kill -9): the lock is on a descriptor the ring never had."""
    path = make_device(tmp_path)
    _restart_after_kill(path, "io_uring", "ring")


def _restart_after_kill(path: str, engine: str, mode: str) -> None:
    p = subprocess.Popen([*PYTHON, "-c", FORKER, path, engine, mode], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    child = 0
    try:
        line = p.stdout.readline().split()
        assert line[:1] == ["ready"], p.communicate()[1]
        pid, child = int(line[1]), int(line[2])
        os.kill(pid, signal.SIGKILL)
        p.wait(timeout=60)
        core = make_core(path, io_engine=engine)  # no retry here beyond the core's own
        try:
            assert core.report_status()["device_lock"] == "exclusive"
            assert core.contains_key(okey(1).encoded)
        finally:
            core.close()
        assert _alive(child)  # the child still lives, idle
    finally:
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)  # it holds the pipes too
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


PASSER = r"""
import os, subprocess, sys
path = sys.argv[1]
from core_helpers import make_core
core = make_core(path, allow_foreign_device=True)
ino = os.stat(path).st_ino
lock_fd = next(int(fd) for fd in os.listdir("/proc/self/fd")
               if any(l.startswith("lock:") and f":{ino} " in l
                      for l in open(f"/proc/self/fdinfo/{fd}").read().splitlines()))
keeper = subprocess.Popen(["sleep", "600"], pass_fds=[lock_fd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("ready", os.getpid(), keeper.pid, flush=True)
sys.stdin.read()
"""


def test_a_process_still_holding_an_exited_writers_lock_is_named(tmp_path):
    """A lock descriptor handed to another process (here on purpose) outlives the writer that took
    it: the refusal names the process that holds it now, not the exited one /proc/locks lists."""
    path = make_device(tmp_path)
    p = subprocess.Popen([*PYTHON, "-c", PASSER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env())
    keeper = 0
    try:
        line = p.stdout.readline().split()
        assert line[:1] == ["ready"], p.communicate()[1]
        pid, keeper = int(line[1]), int(line[2])
        os.kill(pid, signal.SIGKILL)
        p.wait(timeout=60)
        with pytest.raises(OSError) as exc:
            make_core(path)
        msg = _refused(exc, path)
        assert f"held by another raw-block writer (pid {keeper}, inherited from exited pid {pid})" in msg, msg
        os.kill(keeper, signal.SIGKILL)  # not our child: the core waits for it to finish exiting
        keeper = 0
        make_core(path).close()
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=60)
        if keeper:
            os.kill(keeper, signal.SIGKILL)


def test_partitions_of_a_loop_device_and_its_file(tmp_path, rig):
    """A partition holds part of the file: a writer of the file and a writer of a partition
    exclude each other; writers of two partitions do not."""
    if not shutil.which("sfdisk"):
        pytest.skip("sfdisk (util-linux) is not installed")
    img = make_device(tmp_path, size=32 << 20)
    r = subprocess.run(["sfdisk", "-q", img], input="label: dos\n,12M\n,12M\n", capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["losetup", "-f", "--show", "-P", img], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"losetup -P failed: {r.stderr.strip()}")
    loop = r.stdout.strip()
    rig.loops.append(loop)
    p1, p2 = f"{loop}p1", f"{loop}p2"
    if not (os.path.exists(p1) and os.path.exists(p2)):
        pytest.skip(f"the kernel made no partitions of {loop} (no support for DOS partition tables)")
    with Holder(p1) as h:
        assert f"on loop device {p1} over the same file" in _held_by(img, h.pid)
        make_core(p2, allow_foreign_device=True).close()  # another part of the file
    with Holder(img) as h:
        assert f"on its backing file {img}" in _held_by(p1, h.pid)


# ---- a dead writer's writes in flight ------------------------------------------------------------

WRITER = r"""
import os, sys
path, engine = sys.argv[1:3]
from core_helpers import make_core, okey, payload, Obj
core = make_core(path, io_engine=engine, allow_foreign_device=True)
core.put_many([okey(1)], [Obj(payload(1, 4096))])
core.checkpoint_now()
print("ready", os.getpid(), flush=True)
sys.stdin.read()
"""


def _data_fd_of(pid: int, path: str) -> int:
    """The writer's data descriptor: the one of path that carries an OFD lock (its drain mark)."""
    ino = os.stat(path).st_ino
    for fd in os.listdir(f"/proc/{pid}/fd"):
        lines = Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
        if any(line.startswith("lock:") and "OFDLCK" in line and f":{ino} " in line for line in lines):
            return int(fd)
    raise AssertionError(f"no descriptor of pid {pid} carries a drain mark on {path}")


def _grab_fd(pid: int, fd: int) -> int:
    """A descriptor of this process for pid's descriptor fd: the same open file description
    (pidfd_getfd), as a write still in flight holds it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        got = libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd on x86-64 and arm64
        if got < 0:
            err = ctypes.get_errno()
            pytest.skip(f"pidfd_getfd failed: {os.strerror(err)} (needs Linux 5.6 and ptrace rights)")
        return got
    finally:
        os.close(pidfd)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_killed_writers_late_write_lands_before_the_next_writer_opens(tmp_path, engine):
    """A writer killed with a write still in flight: that write holds its data descriptor's open
    file description, and lands when the device gets to it. Here this process holds that
    description for the dead writer, writes a marker through it a moment later and lets it go.
    The next writer's open waits for it (the drain mark), so the late write is on the device
    before the open returns: it can never land over what the new writer writes."""
    path = make_device(tmp_path)
    p = subprocess.Popen([*PYTHON, "-c", WRITER, path, engine], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env())
    try:
        line = p.stdout.readline().split()
        assert line[:1] == ["ready"], p.communicate()[1]
        pid = int(line[1])
        held = _grab_fd(pid, _data_fd_of(pid, path))
        os.kill(pid, signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=60)
    marker = b"late write of a dead writer".ljust(4096, b"\x01")
    where = os.path.getsize(path) - 4096

    def land_late() -> None:
        time.sleep(0.5)
        os.pwrite(held, marker, where)
        os.close(held)

    t = threading.Thread(target=land_late)
    t.start()
    try:
        core = make_core(path, io_engine=engine)
    finally:
        t.join()
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, where) == marker  # landed before the open returned
        finally:
            os.close(fd)
        assert core.contains_key(okey(1).encoded)
    finally:
        core.close()
