"""A writer killed with SIGKILL lets go of its device at once, whatever its engine and however
loaded the host: the next writer opens the device immediately after the kill, with no retry of
its own beyond what the core does. The lock lives on a descriptor of its own, which an io_uring
ring never holds, so the kernel's deferred teardown of the dead writer's ring (seconds later on
a loaded host) cannot keep it.

Each cycle forks a writer that puts through a core, kills it with SIGKILL while it puts, and
reopens the device at once, under CPU and I/O load (busy loops and direct-I/O dd writers
started and stopped by the test). Runs through `make test-reliability` (CI); the default suite
skips it: it forks and kills writers and loads the host for about a minute."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
import traceback

import pytest

from core_helpers import Obj, make_core, make_device, okey

ENABLED = os.environ.get("RB_CRASH_TESTS") == "1"
pytestmark = pytest.mark.skipif(not ENABLED, reason="crash harnesses run via `make test-reliability` "
                                                    "(RB_CRASH_TESTS=1): they fork and kill writer processes")
CYCLES = {"io_uring": int(os.environ.get("RB_LOCK_RESTART_CYCLES", "100")),
          "posix": int(os.environ.get("RB_LOCK_RESTART_POSIX_CYCLES", "30"))}
MiB = 1 << 20


class Load:
    """Two busy loops (the machine's two cores) and a direct-I/O writer looping dd over a file
    beside the device: processes of their own sessions, killed at exit."""

    def __init__(self, workdir: str, cpus: int = 2):
        busy = "while :; do :; done"
        io = (f"while :; do dd if=/dev/zero of={workdir}/load.img bs=1M count=64 oflag=direct conv=fsync "
              "status=none; done")
        self.procs = [subprocess.Popen(["sh", "-c", cmd], start_new_session=True, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL) for cmd in [busy] * cpus + [io]]

    def __enter__(self) -> "Load":
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=60)


def _writer(path: str, engine: str, ready_w: int) -> None:
    """The forked writer: open, put, say so once, then keep putting until it is killed."""
    code = 1
    try:
        core = make_core(path, io_engine=engine)
        data = Obj(os.urandom(12 * 1024))
        for i in range(1 << 30):
            core.put_many([okey(i % 512)], [data])
            if i == 8:
                os.write(ready_w, b"r")
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _lock_listed(path: str) -> bool:
    """Does /proc/locks list an flock on path's inode?"""
    st = os.stat(path)
    tag = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "
    with open("/proc/locks") as f:
        return any(" FLOCK " in line and tag in line for line in f)


def _cycle(path: str, engine: str) -> tuple[float, bool, str | None]:
    """One kill and reopen: (seconds from the kill's reaping to the reopened core, whether the
    dead writer's lock was still listed once it was reaped, refusal)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _writer(path, engine, w)
    os.close(w)
    try:
        got = os.read(r, 1)
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    assert got == b"r", f"writer failed before its first puts (status {status})"
    lingering = _lock_listed(path)  # the process is reaped: its files, and so its lock, are gone
    t0 = time.monotonic()
    try:
        core = make_core(path, io_engine=engine)
    except OSError as e:
        return time.monotonic() - t0, lingering, e.strerror
    dt = time.monotonic() - t0
    core.close()
    return dt, lingering, None


@pytest.mark.parametrize("engine", ["io_uring", "posix"])
def test_a_killed_writers_device_reopens_at_once_under_load(engine, tmp_path, capsys):
    path = make_device(tmp_path, size=64 * MiB)
    cycles = CYCLES[engine]
    times, refusals, lingering = [], [], 0
    with Load(str(tmp_path)):
        for _ in range(cycles):
            dt, left, refusal = _cycle(path, engine)
            times.append(dt)
            lingering += left
            if refusal:
                refusals.append(refusal)
    with capsys.disabled():
        print(f"\nlock restart {engine}: {cycles - len(refusals)}/{cycles} reopened at once; lock still listed "
              f"after the reaping {lingering}/{cycles}; reopen median {statistics.median(times) * 1000:.1f} ms, "
              f"max {max(times) * 1000:.1f} ms", flush=True)
    assert refusals == [], refusals[:3]
    assert lingering == 0
