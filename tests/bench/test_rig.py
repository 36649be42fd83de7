"""The drives rig (lmcache_rawblock_bench.rig): capped RAM devices in a blkio cgroup. What the
group's throttle accounted is asserted, never how long anything took: the bandwidth figures are
the drives part's (benchmarks/results/drives/)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace

import pytest

from lmcache_rawblock_bench import drives, rig
from lmcache_rawblock_bench.core import Arena, close_core, object_keys, open_core, ours_core

MiB = 1 << 20
FAST = 20_000 * rig.MB  # a cap that does not bind: the throttle accounts only devices with a rule
WHY = rig.why_unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"capped drives: {WHY}")


def _blkio_group_of_self() -> str:
    for line in open("/proc/self/cgroup").read().splitlines():
        _, ctl, path = line.split(":", 2)
        if "blkio" in ctl.split(","):
            return path
    return "/"


def _odirect_write(dev: str, nbytes: int) -> None:
    import mmap

    buf = mmap.mmap(-1, nbytes)
    buf.write(b"\x33" * nbytes)
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
    try:
        assert os.pwrite(fd, buf, 0) == nbytes
    finally:
        os.close(fd)


@pytest.mark.parametrize("backend", rig.BACKENDS)
def test_each_device_capped_and_its_direct_io_accounted_to_the_group(backend):
    why = rig.why_unavailable(rig.BLKIO, backend)
    if why:
        pytest.skip(why)
    with rig.CappedDrives(2, 16 * MiB, 300 * rig.MB, 200 * rig.MB, backend) as d:
        assert _blkio_group_of_self() == "/" + d.name
        assert d.caps() == {dev: {"read_bps": 300 * rig.MB, "write_bps": 200 * rig.MB} for dev in d.devices}
        _odirect_write(d.devices[1], 4 * MiB)
        acc = d.service_bytes()
        assert acc[d.devices[1]]["Write"] >= 4 * MiB
        assert acc[d.devices[0]]["Write"] == 0  # per device: nothing written there
    assert _blkio_group_of_self() == "/"


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_core_threads_inherit_the_group_and_its_io_is_accounted(engine):
    """The core's ring worker and io_uring's own workers start after the process joined the
    group: they are in it, and every byte the core moved was charged to the group."""
    with rig.CappedDrives(1, 64 * MiB, FAST, FAST) as d:
        dev = d.devices[0]
        core = open_core(ours_core(), dev, slot_bytes=MiB + 4096, meta_total_bytes=4 * MiB, io_engine=engine,
                         use_odirect=True, enable_zero_copy=True, iouring_queue_depth=8)
        try:
            arena = Arena(8, MiB)
            src = [arena.obj(i, 0x40 + i) for i in range(4)]
            dst = [arena.obj(4 + i, 0) for i in range(4)]
            keys = object_keys(4, "rig")
            before = d.service_bytes()[dev]
            assert all(core.put_many(keys, src).results)
            assert all(core.load_many_into([k.encoded for k in keys], dst))
            after = d.service_bytes()[dev]
            assert d.threads_outside() == []
        finally:
            close_core(core)
        assert after["Write"] - before["Write"] >= 4 * MiB
        assert after["Read"] - before["Read"] >= 4 * MiB
        assert [bytes(o.byte_array) for o in dst] == [bytes(o.byte_array) for o in src]


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed (apt-get install fio)")
def test_zram_charges_io_uring_with_fixed_buffers_once():
    """A registered 8 MiB buffer is one bio; zram takes it whole, so the throttle charges each
    byte once (a loop device splits it and charges the retry again)."""
    with rig.CappedDrives(1, 64 * MiB, FAST, FAST, "zram") as d:
        before = d.service_bytes()[d.devices[0]]
        r = rig.run_fio(d.devices, "write", 8 * MiB, 4, 0.5, "io_uring", size=64 * MiB, extra=["--fixedbufs"])
        charged = d.service_bytes()[d.devices[0]]["Write"] - before["Write"]
    assert r["io_bytes"] > 0
    assert r["io_bytes"] <= charged <= r["io_bytes"] + 4 * 8 * MiB  # what was in flight at the end, at most


def test_teardown_after_an_error_removes_group_devices_and_state():
    with pytest.raises(RuntimeError, match="inside"):
        with rig.CappedDrives(2, 4 * MiB, 100 * rig.MB, 100 * rig.MB) as d:
            made = (d.group, list(d.devices), list(d.zram), os.path.join(d.shm, f"{d.name}.json"))
            raise RuntimeError("inside")
    group, devices, zram, state = made
    assert not os.path.exists(group)
    assert not os.path.exists(state)
    assert all(not os.path.exists(f"/sys/block/zram{i}") for i in zram)
    assert _blkio_group_of_self() == "/"


KILLED = """
import os, signal, sys
from lmcache_rawblock_bench import rig
d = rig.CappedDrives(2, 4 << 20, backend=sys.argv[1]).__enter__()
print(d.name, " ".join(d.devices), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("backend", rig.BACKENDS)
def test_clean_stale_removes_what_a_killed_run_left(backend):
    why = rig.why_unavailable(rig.BLKIO, backend)
    if why:
        pytest.skip(why)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", KILLED, backend], capture_output=True, text=True, env=env)
    assert p.returncode == -signal.SIGKILL, p.stderr
    name, *devices = p.stdout.split()
    assert os.path.isdir(os.path.join(rig.BLKIO, name))
    assert all(os.path.exists(dev) for dev in devices)
    removed = rig.clean_stale()
    assert os.path.join(rig.BLKIO, name) in removed
    assert not os.path.exists(os.path.join(rig.BLKIO, name))
    assert not [f for f in os.listdir(rig.SHM) if f.startswith(name)]
    if backend == "loop":
        assert not [x for x in rig.loops_over(os.path.join(rig.SHM, name))]
    else:
        assert all(not os.path.exists(f"/sys/block/{os.path.basename(dev)}") for dev in devices)


def test_clean_stale_leaves_a_live_rig_alone():
    with rig.CappedDrives(1, 4 * MiB) as d:
        assert rig.clean_stale() == []
        assert os.path.isdir(d.group) and os.path.exists(d.devices[0])


def test_bad_settings_name_the_parameter():
    with pytest.raises(ValueError, match="n 0"):
        rig.CappedDrives(0)
    with pytest.raises(ValueError, match="size 1000"):
        rig.CappedDrives(1, 1000)
    with pytest.raises(ValueError, match="read_bps -1"):
        rig.CappedDrives(1, read_bps=-1)
    with pytest.raises(ValueError, match="backend 'nvme'"):
        rig.CappedDrives(1, backend="nvme")


class _Bar:
    def update(self, _n: int) -> None: ...

    def set_description_str(self, _t: str) -> None: ...


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed (apt-get install fio)")
def test_drives_part_rows_are_accounted_to_the_group():
    s = replace(drives.SUITES["smoke"], seconds=0.2, lat_samples=3, engines=["posix", "io_uring"])
    out = drives.run_drives([ours_core()], s, _Bar())
    assert out["errors"] == []
    ours = [r for r in out["rows"] if r["who"] == "ours"]
    assert {(r["n"], r["engine"]) for r in ours} == {(n, e) for n in s.ns for e in s.engines}
    assert all(r["accounted_covers_io"] and r["threads_outside_group"] == [] for r in ours)
    assert {r["n"] for r in out["rows"] if r["who"] == "fio"} == set(s.ns)
    # posix once, io_uring per ring depth and scheduler
    assert len(out["latency"]) == 1 + len(s.lat_depths) * len(out["io_schedulers"])
    assert all(r["busy_samples"] > 0 and r["idle_samples"] > 0 for r in out["latency"])
    json.dumps(out)  # results.json takes it as it is
    assert rig.clean_stale() == []
