"""What the core serves and lists when its device fails or changes under it, on real devices
and real processes: a thin-provisioned loop device that runs out of space during buffered
write-back, a file or loop device truncated (and grown back) under an open core, a full file
system, and another key's slot header over a key's slot.

The rigs need root (tmpfs mounts, loop devices); elsewhere these tests skip with the reason.
Every rig is torn down by the test that made it: loop devices detached, tmpfs unmounted.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core_helpers import CORE_LOGGER, Obj, make_core, newest_state, odirect_ok, okey
from helpers import REPO, TESTS, Rig, why_no_losetup, why_no_mount
from lmcache_rawblock.plugin import RustRawBlockBackend
from lmcache_rawblock.raw_block import RawBlockCore
from plugin_fakes import FakeEngineConfig, FakeLocalCPUBackend, FakeMetadata, LoopThread, base_extra, make_key, make_obj

MiB = 1 << 20
KiB = 1 << 10
BLOCK = 4096
SLOT = MiB
META = 4 * MiB  # two containers of 2 MiB
CONTAINER = META // 2
PAYLOAD = 900 * KiB


# ---- rigs ----------------------------------------------------------------------------------


def sparse(path: Path, size: int) -> str:
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


def thin_loop(rig: Rig, fs_mib: int = 24, dev_mib: int = 256) -> tuple[str, Path]:
    """A loop device over a sparse dev_mib file on a fs_mib tmpfs: buffered writes succeed into
    its page cache and fail at write-back once the tmpfs is full."""
    why = why_no_mount("tmpfs") or why_no_losetup()
    if why:
        pytest.skip(why)
    fs = rig.tmpfs(fs_mib)
    return rig.attach(sparse(fs / "backing.img", dev_mib * MiB)), fs


def drop_cached_pages(path: str) -> None:
    """Drop the clean cached pages of a device or file, so later reads come from below it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)  # what is still dirty (our reads must not see it cached either)
    except OSError:
        pass  # a write-back error: the core's own flush reports it, this one only wants pages clean
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---- payloads and checks -------------------------------------------------------------------


def blob(i: int, v: int = 0, n: int = PAYLOAD) -> bytes:
    """Key i's payload in its v-th version: distinct for every (i, v)."""
    return random.Random(i * 1_000_003 + v).randbytes(n)


def core_on(dev: str, **kw) -> RawBlockCore:
    base = dict(slot_bytes=SLOT, meta_total_bytes=META, allow_foreign_device=True)
    base.update(kw)
    return make_core(dev, **base)


def status(core: RawBlockCore) -> dict:
    """report_status() over the native status (which carries the trust counters and faults)."""
    return {**core._native.status(), **core.report_status()}


def put_all(core: RawBlockCore, expected: dict, items: list[tuple[int, int]]) -> None:
    """Put key i with version v for each (i, v), one call each, and record what was stored."""
    for i, v in items:
        k = okey(i)
        r = core.put_many([k], [Obj(blob(i, v))])
        assert r.results == [True], r.failure
        expected[k.encoded] = (i, v)


def load_all(core: RawBlockCore, expected: dict, others=()) -> tuple[set[str], list[str]]:
    """Load every key of expected (key -> (i, v) of its last put) and others in one call:
    (keys that loaded, keys that loaded bytes other than their own)."""
    keys = list(expected) + [k for k in others if k not in expected]
    outs = [Obj(b"\xee" * PAYLOAD) for _ in keys]
    res = core.load_many_into(keys, outs)
    loaded = {k for k, ok in zip(keys, res) if ok}
    wrong = [k for k, ok, o in zip(keys, res, outs) if ok and (k not in expected or o.bytes() != blob(*expected[k]))]
    return loaded, wrong


def listed_on_device(dev: str) -> set[str]:
    """The keys the newest intact checkpoint on the device lists (format v1 read independently;
    the log format through the tools' reader)."""
    st = newest_state(dev, container=CONTAINER, block=BLOCK)
    if st is None:
        from lmcache_rawblock.tools import NotARawBlockDevice, read_device
        try:
            return set(read_device(dev, ignore_lock=True).state["entries"])
        except NotARawBlockDevice:
            pass
    assert st is not None, "no intact checkpoint on the device"
    return set(st[2]["entries"])


# ---- thin provisioning: write-back fails after the puts returned ---------------------------

# verify_payload_checksum off is the hard case: only the slot header guards a load.
TRUST_CFGS = [(False, False), (False, True), (True, False), (True, True)]
TRUST_IDS = ["sum-off-verify-off", "sum-off-verify-on", "sum-on-verify-off", "sum-on-verify-on"]


def _writeback_story(core: RawBlockCore, fs: Path, rig: Rig, expected: dict) -> set[str]:
    """Durable keys, then puts the tmpfs cannot hold, a failed checkpoint, more room, more puts
    and a checkpoint that succeeds. Returns the keys that checkpoint lists."""
    put_all(core, expected, [(i, 0) for i in range(8)])
    core.checkpoint_now()
    durable = set(expected)
    assert listed_on_device(core.device_path) == durable
    put_all(core, expected, [(i, 0) for i in range(8, 60)])  # ~46 MiB more on a 24 MiB tmpfs
    with pytest.raises(OSError) as ei:
        core.checkpoint_now()
    assert ei.value.errno in (errno.EIO, errno.ENOSPC)
    st = status(core)
    assert st["writeback_failures"] >= 1
    # Every key put since the last flush that succeeded is dropped; the proven ones stay.
    assert st["writeback_dropped_entries"] == 52
    assert set(core.snapshot_indexed_keys()) == durable
    assert st["checkpoint_last_error"]
    assert st["faults_total"] >= 1 and st["faults"][-1]["op"] == "flush"
    assert set(st["fault_counts"]) <= {errno.EIO, errno.ENOSPC}
    assert listed_on_device(core.device_path) == durable  # the failed checkpoint wrote nothing
    faults_before = (st["faults_total"], dict(st["fault_counts"]), st["checkpoint_last_error"])

    rig.remount(fs, 512)
    # New keys, and keys whose first put was lost put again with other bytes.
    put_all(core, expected, [(i, 0) for i in range(60, 64)] + [(i, 1) for i in (9, 30, 59)])
    core.checkpoint_now()  # the error was reported once: this flush succeeds, on what it proves
    listed = set(core.snapshot_indexed_keys())
    assert listed == durable | {okey(i).encoded for i in (60, 61, 62, 63, 9, 30, 59)}
    assert listed_on_device(core.device_path) == listed
    st = status(core)
    # A later success clears nothing.
    assert (st["faults_total"], st["fault_counts"], st["checkpoint_last_error"]) == faults_before
    assert st["writeback_dropped_entries"] == 52
    return listed


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
@pytest.mark.parametrize("sums,verify", TRUST_CFGS, ids=TRUST_IDS)
def test_writeback_failure_on_thin_loop_device(rig, sums, verify, engine):
    dev, fs = thin_loop(rig)
    cfg = dict(io_engine=engine, verify_payload_checksum=sums, meta_verify_on_load=verify)
    expected: dict = {}
    core = core_on(dev, **cfg)
    try:
        listed = _writeback_story(core, fs, rig, expected)
        drop_cached_pages(dev)  # reads now come from the backing file
        loaded, wrong = load_all(core, expected)
        assert wrong == []
        assert loaded == listed  # nothing durable lost; nothing dropped served
    finally:
        core.close()
    drop_cached_pages(dev)
    core = core_on(dev, **cfg)
    try:
        assert status(core)["recovery_outcome"] == "loaded"
        assert set(core.snapshot_indexed_keys()) == listed
        loaded, wrong = load_all(core, expected)
        assert wrong == [] and loaded == listed
    finally:
        core.close()


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_odirect_puts_on_a_full_thin_loop_device_fail_at_once(rig, engine):
    # With O_DIRECT the loop device's write fails when the tmpfs below it is full: the put
    # says so, and nothing it began is indexed or listed. One write can be acknowledged without
    # being performed: Linux's loop driver completes a short write (the tmpfs filled during it)
    # as a success. Only the payload checksum can tell (the header was written whole), so it is
    # on here: that key is a miss, never its zeros.
    dev, fs = thin_loop(rig)
    cfg = dict(io_engine=engine, use_odirect=True, verify_payload_checksum=True, meta_verify_on_load=False)
    expected: dict = {}
    failed: list[str] = []
    core = core_on(dev, **cfg)
    try:
        for i in range(40):  # ~36 MiB on a 24 MiB tmpfs
            r = core.put_many([okey(i)], [Obj(blob(i))])
            if r.results == [True]:
                expected[okey(i).encoded] = (i, 0)
                continue
            assert isinstance(r.failure, OSError) and r.failure.errno in (errno.ENOSPC, errno.EIO), r.failure
            assert dev in str(r.failure)
            failed.append(okey(i).encoded)
        assert failed and len(expected) >= 8
        assert set(core.snapshot_indexed_keys()) == set(expected)
        st = status(core)
        assert sum(st["fault_counts"].values()) >= len(failed) and st["writeback_failures"] == 0
        rig.remount(fs, 512)
        core.checkpoint_now()
        assert listed_on_device(dev) == set(expected)
    finally:
        core.close()
    drop_cached_pages(dev)
    core = core_on(dev, **cfg)
    try:
        loaded, wrong = load_all(core, expected, failed)
        assert wrong == [] and loaded <= set(expected) and len(set(expected) - loaded) <= 1
    finally:
        core.close()


_CHILD = r"""
import json, os, sys, time
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import reliability.test_trust_faults as t
dev, fs, out, sums, verify = sys.argv[3], Path(sys.argv[4]), sys.argv[5], sys.argv[6] == "1", sys.argv[7] == "1"

expected = {}
core = t.core_on(dev, verify_payload_checksum=sums, meta_verify_on_load=verify)
listed = t._writeback_story(core, fs, t.Rig(Path("/")), expected)
# puts after the last checkpoint: written, never listed
after = {}
t.put_all(core, after, [(i, 2) for i in (0, 61, 70)])
with open(out + ".tmp", "w") as f:
    json.dump({"listed": sorted(listed), "expected": expected, "after": after}, f)
os.rename(out + ".tmp", out)
print("checkpointed", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sums,verify", [(False, False), (True, True)], ids=["sum-off-verify-off", "sum-on-verify-on"])
def test_writeback_failure_then_kill_9_on_thin_loop_device(rig, tmp_path, sums, verify):
    dev, fs = thin_loop(rig)
    out = tmp_path / "child.json"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(REPO), str(TESTS), dev, str(fs), str(out),
                             "1" if sums else "0", "1" if verify else "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else ""
        assert line.strip() == "checkpointed", proc.stderr.read() if proc.poll() is not None else "no answer"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    got = json.loads(out.read_text())
    listed = set(got["listed"])
    expected = {k: tuple(v) for k, v in got["expected"].items()}
    after = {k: tuple(v) for k, v in got["after"].items()}
    drop_cached_pages(dev)
    core = core_on(dev, verify_payload_checksum=sums, meta_verify_on_load=verify)
    try:
        assert status(core)["recovery_outcome"] == "loaded"
        assert set(core.snapshot_indexed_keys()) == listed
        # A key put again after the checkpoint may hold its newer bytes in its new slot, but
        # the checkpoint names the older slot, which still holds the older bytes.
        loaded, wrong = load_all(core, expected, after)
        assert wrong == [] and loaded == listed
    finally:
        core.close()


# ---- a device truncated under an open core -------------------------------------------------


def _slot_of(core: RawBlockCore, key: str) -> int:
    return (core.entry_offset(key) - META) // SLOT


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
@pytest.mark.parametrize("cut_in", ["slot-boundary", "slot-header"])
def test_file_truncated_and_grown_back(tmp_path, caplog, engine, cut_in):
    dev = sparse(tmp_path / "dev.img", 64 * MiB)
    cfg = dict(io_engine=engine, verify_payload_checksum=False)
    expected: dict = {}
    core = core_on(dev, **cfg)
    try:
        put_all(core, expected, [(i, 0) for i in range(20)])
        core.checkpoint_now()
        assert [_slot_of(core, okey(i).encoded) for i in range(20)] == list(range(20))
        # Slots 12 and up lose their bytes; a cut inside slot 12's header leaves its magic
        # and half of its key identity.
        cut = META + 12 * SLOT + (12 if cut_in == "slot-header" else 0)
        os.truncate(dev, cut)
        os.truncate(dev, 64 * MiB)
        intact = {okey(i).encoded for i in range(12)}
        lost = [okey(i).encoded for i in range(12, 20)]
        out = Obj(b"\xee" * PAYLOAD)
        with caplog.at_level(logging.WARNING, logger=CORE_LOGGER):
            assert core.load_many_into([lost[0]], [out], raise_on_error=True) == [False]  # a miss
        assert out.bytes() == bytes(PAYLOAD)  # nothing of what was read is handed out
        assert not core.contains_key(lost[0])
        assert [r.levelno for r in caplog.records if "refused" in r.getMessage()] == [logging.WARNING]
        loaded, wrong = load_all(core, expected)
        assert wrong == [] and loaded == intact
        st = status(core)
        # the size is whole again, so the headers tell: no entry counted as past the end
        assert (st["load_rejected_entries"], st["shrink_dropped_entries"]) == (8, 0)
        assert set(core.snapshot_indexed_keys()) == intact
        core.checkpoint_now()
        assert listed_on_device(dev) == intact
    finally:
        core.close()
    core = core_on(dev, **cfg)
    try:
        assert set(core.snapshot_indexed_keys()) == intact
        loaded, wrong = load_all(core, expected)
        assert wrong == [] and loaded == intact
    finally:
        core.close()


def test_file_truncated_inside_a_payload_is_caught_by_the_checksum(tmp_path):
    # With checksums off only the slot header guards a load, so a payload cut short under an
    # intact header would read as zeros; with checksums on the load fails and serves nothing.
    dev = sparse(tmp_path / "dev.img", 64 * MiB)
    expected: dict = {}
    core = core_on(dev, verify_payload_checksum=True)
    try:
        put_all(core, expected, [(i, 0) for i in range(4)])
        core.checkpoint_now()
        cut = META + 2 * SLOT + BLOCK + PAYLOAD // 2  # half of slot 2's payload
        os.truncate(dev, cut)
        os.truncate(dev, 64 * MiB)
        outs = [Obj(b"\xee" * PAYLOAD) for _ in range(4)]
        res = core.load_many_into([okey(i).encoded for i in range(4)], outs)
        assert res == [True, True, False, False]  # slot 3 lies wholly in the lost range
        assert outs[2].bytes() == bytes(PAYLOAD) and outs[3].bytes() == bytes(PAYLOAD)
        assert [outs[i].bytes() == blob(i) for i in (0, 1)] == [True] * 2
        st = status(core)
        assert st["payload_checksum_failures"] == 1 and st["payload_checksum_dropped_entries"] == 1
        assert st["load_rejected_entries"] == 1  # slot 3: its header is zeros
        assert core.exists_many([okey(i).encoded for i in range(4)]) == [True, True, False, False]
    finally:
        core.close()


def _shrink(rig: Rig, kind: str, backing: str, dev: str, size: int) -> None:
    os.truncate(backing, size)
    if kind == "loop":
        rig.reread_size(dev)


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
@pytest.mark.parametrize("kind", ["file", "loop"])
def test_device_truncated_for_good(rig, tmp_path, kind, engine):
    backing = sparse(tmp_path / "dev.img", 64 * MiB)
    dev = rig.attach(backing) if kind == "loop" else backing
    cfg = dict(io_engine=engine, verify_payload_checksum=False)
    expected: dict = {}
    core = core_on(dev, **cfg)
    try:
        put_all(core, expected, [(i, 0) for i in range(20)])
        deleted = [okey(i).encoded for i in range(4)]
        assert core.delete_many(deleted) == [True] * 4
        for i in range(4):
            del expected[okey(i).encoded]
        core.checkpoint_now()
        assert status(core)["free_slot_count"] == 4  # slots 0-3
        cut = META + 14 * SLOT
        _shrink(rig, kind, backing, dev, cut)
        intact = {okey(i).encoded for i in range(4, 14)}
        lost = [okey(i).encoded for i in range(14, 20)]
        out = Obj(b"\xee" * PAYLOAD)
        # past the end: a miss, not an error; every entry past the end goes at once
        assert core.load_many_into([lost[-1]], [out], raise_on_error=True) == [False]
        assert out.bytes() == bytes(PAYLOAD)
        st = status(core)
        assert (st["shrink_dropped_entries"], st["load_rejected_entries"]) == (6, 0)
        assert st["usable_slots"] == 14 and st["device_size_bytes"] == cut
        assert set(core.snapshot_indexed_keys()) == intact
        loaded, wrong = load_all(core, expected)
        assert wrong == [] and loaded == intact
        core.checkpoint_now()
        assert listed_on_device(dev) == intact
        # Puts go on into the slots that remain, and only there.
        put_all(core, expected, [(i, 0) for i in range(100, 104)])
        assert sorted(_slot_of(core, okey(i).encoded) for i in range(100, 104)) == [0, 1, 2, 3]
        r = core.put_many([okey(104)], [Obj(blob(104))])
        assert r.results == [False] and "no free slot" in str(r.failure)
        assert status(core)["device_size_bytes"] == cut
        if kind == "file":
            assert os.path.getsize(dev) == cut  # nothing written past the end
        intact |= {okey(i).encoded for i in range(100, 104)}
        loaded, wrong = load_all(core, expected)
        assert wrong == [] and loaded == intact
        core.checkpoint_now()
        assert listed_on_device(dev) == intact
    finally:
        core.close()
    core = core_on(dev, **cfg)
    try:
        st = status(core)
        assert st["recovery_outcome"] == "loaded", st["checkpoint_last_error"]
        assert set(core.snapshot_indexed_keys()) == intact
        loaded, wrong = load_all(core, expected, lost + deleted)
        assert wrong == [] and loaded == intact
    finally:
        core.close()


# ---- disk full -----------------------------------------------------------------------------


def fill(fs: Path) -> Path:
    """Take every free byte of the file system at fs with a ballast file (removed to make room)."""
    ballast = fs / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (b"\xba" * MiB, b"\xba" * 4096):  # then the last pages one at a time
            try:
                while os.write(fd, chunk) == len(chunk):
                    pass
            except OSError as e:
                assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return ballast


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == CORE_LOGGER and r.levelno == logging.ERROR]


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_disk_full_puts_fail_with_enospc(rig, caplog, engine):
    fs = rig.tmpfs(8)
    dev = sparse(fs / "dev.img", 64 * MiB)
    expected: dict = {}
    core = core_on(dev, io_engine=engine)
    try:
        put_all(core, expected, [(0, 0), (1, 0)])
        ballast = fill(fs)
        caplog.set_level(logging.INFO, logger=CORE_LOGGER)
        r = core.put_many([okey(2)], [Obj(blob(2))])
        assert r.results == [False] and r.stored_keys == []
        assert isinstance(r.failure, OSError) and r.failure.errno == errno.ENOSPC
        assert "(ENOSPC)" in str(r.failure) and str(r.failure).endswith(f"device_path='{dev}'")
        assert not core.contains_key(okey(2).encoded)
        lines = _errors(caplog)
        assert len(lines) == 1 and "(ENOSPC)" in lines[0] and dev in lines[0]
        st = status(core)
        assert set(st["fault_counts"]) == {errno.ENOSPC}
        last = st["faults"][-1]
        assert (last["op"], last["errno"]) == ("write", errno.ENOSPC)
        assert dev in last["text"] and "(ENOSPC)" in last["text"] and f"offset {last['offset']}: " in last["text"]
        # A burst of failing puts: each fails and is counted, the log says it once per burst.
        caplog.clear()
        for i in range(3, 53):
            r = core.put_many([okey(i)], [Obj(blob(i, n=64 * KiB))])
            assert r.results == [False] and r.failure.errno == errno.ENOSPC
        assert len(_errors(caplog)) <= 2
        st = status(core)
        assert st["fault_counts"][errno.ENOSPC] >= 51 and st["faults_total"] == sum(st["fault_counts"].values())
        rs = core.report_status()  # the facade names the errno
        assert rs["io_error_counts"] == {"ENOSPC": st["fault_counts"][errno.ENOSPC]}
        assert rs["io_errors_total"] == st["faults_total"] and dev in rs["io_errors"][-1]["text"]
        seen = (st["faults_total"], st["fault_counts"], st["faults"])
        # Room again: puts succeed, and the journal still tells what happened.
        ballast.unlink()
        put_all(core, expected, [(2, 0), (60, 0)])
        st = status(core)
        assert (st["faults_total"], st["fault_counts"], st["faults"]) == seen
        assert core.report_status()["io_error_counts"] == rs["io_error_counts"]
        core.checkpoint_now()
        loaded, wrong = load_all(core, expected)
        assert wrong == [] and loaded == set(expected)
    finally:
        core.close()
    core = core_on(dev, io_engine=engine)
    try:
        loaded, wrong = load_all(core, expected, [okey(i).encoded for i in range(3, 53)])
        assert wrong == [] and loaded == set(expected)
    finally:
        core.close()


def test_disk_full_plugin_error_names_the_cause(rig):
    fs = rig.tmpfs(8)
    dev = sparse(fs / "dev.img", 64 * MiB)
    lt = LoopThread()
    be = RustRawBlockBackend(config=FakeEngineConfig(base_extra(dev)), metadata=FakeMetadata(),
                             local_cpu_backend=FakeLocalCPUBackend(), loop=lt.loop)
    try:
        futs = be.batched_submit_put_task([make_key(1)], [make_obj(1)])
        futs[0].result(30)
        ballast = fill(fs)
        obj = make_obj(2)
        futs = be.batched_submit_put_task([make_key(2)], [obj])
        with pytest.raises(RuntimeError) as ei:
            futs[0].result(30)
        msg = str(ei.value)
        assert re.fullmatch(r"Failed to persist raw-block key \S+: \[Errno 28\] write failed at offset \d+: "
                            r".*: No space left on device \(ENOSPC\); device_path='" + re.escape(dev) + "'", msg), msg
        assert isinstance(ei.value.__cause__, OSError) and ei.value.__cause__.errno == errno.ENOSPC
        assert obj.get_ref_count() == 1 and not be.contains(make_key(2))
        st = be._core._native.status()
        assert st["fault_counts"].get(errno.ENOSPC, 0) >= 1 and dev in st["faults"][-1]["text"]
        ballast.unlink()
        futs = be.batched_submit_put_task([make_key(2)], [make_obj(2)])
        futs[0].result(30)
        assert be.get_blocking(make_key(2)).tobytes() == make_obj(2).tobytes()
        assert be._core._native.status()["fault_counts"] == st["fault_counts"]
    finally:
        be.close()
        lt.stop()


# ---- another key's slot header over a key's slot -------------------------------------------

ENGINES = [("posix", False), ("io_uring", False), ("posix", True), ("io_uring", True)]
ENGINE_IDS = ["posix", "io_uring", "posix-odirect", "io_uring-odirect"]



def overwrite_header(dev: str, src_off: int, dst_off: int, header: int = BLOCK) -> None:
    """Copy the slot header at src_off over the one at dst_off (what a second writer or a
    stale slot leaves), durable before the core reads it."""
    fd = os.open(dev, os.O_RDWR)
    try:
        hdr = os.pread(fd, header, src_off)
        assert hdr[:8] == b"LMCBLK01"
        assert os.pwrite(fd, hdr, dst_off) == header
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("engine,odirect", ENGINES, ids=ENGINE_IDS)
def test_another_keys_header_in_the_slot_is_a_miss(tmp_path, caplog, engine, odirect):
    dev = sparse(tmp_path / "dev.img", 32 * MiB)
    if odirect and not odirect_ok(dev):
        pytest.skip("the temporary directory's file system refuses O_DIRECT")
    n = 100 * KiB + 123  # both keys the same length: only the identity tells them apart
    core = core_on(dev, io_engine=engine, use_odirect=odirect, verify_payload_checksum=False)
    try:
        a, b = okey(1), okey(2)
        assert core.put_many([a, b], [Obj(blob(1, n=n)), Obj(blob(2, n=n))]).results == [True, True]
        overwrite_header(dev, core.entry_offset(b.encoded), core.entry_offset(a.encoded))
        caplog.set_level(logging.INFO, logger=CORE_LOGGER)
        outs = [Obj(b"\xee" * n), Obj(b"\xee" * n)]
        assert core.load_many_into([a.encoded, b.encoded], outs, raise_on_error=True) == [False, True]
        assert outs[0].bytes() == bytes(n)  # A's bytes were read, and are not handed out
        assert outs[1].bytes() == blob(2, n=n)
        st = status(core)
        assert st["load_rejected_entries"] == 1 and st["faults_total"] == 0
        assert core.exists_many([a.encoded, b.encoded]) == [False, True]
        out = Obj(b"\xee" * n)
        assert core.load_many_into([a.encoded], [out]) == [False]  # now simply not indexed
        assert out.bytes() == b"\xee" * n
        assert status(core)["load_rejected_entries"] == 1
        warned = [r for r in caplog.records if r.name == CORE_LOGGER and r.levelno >= logging.WARNING]
        assert len(warned) == 1 and warned[0].levelno == logging.WARNING
        assert "refused 1 load" in warned[0].getMessage() and dev in warned[0].getMessage()
        core.checkpoint_now()
        assert listed_on_device(dev) == {b.encoded}
    finally:
        core.close()
