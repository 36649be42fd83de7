"""Freed slots given back to the device (deallocate_freed): punched holes in a file, discards
on a loop device (which punches holes in its backing file), a file system and a block device
that cannot deallocate, and the put path, which never waits for a deallocation.

What is checked on each: the ranges deallocated are exactly the freed slots' (adjacent slots
merged), the space really comes back (allocated blocks of the file, or of the loop device's
backing file), a deallocated slot reads back as zeros and its key misses, the keys still
indexed load intact, and nothing is deallocated before its slot is reusable.
"""

from __future__ import annotations

import os

import pytest

from core_helpers import BLOCK, HEADER, MiB, SLOT, Obj, make_core, make_device, okey, payload
from core_helpers import merged_ranges as merged

FULL = SLOT - HEADER  # a payload that fills its slot: every block of the slot is allocated
FORMATS = ["v1", "log"]


def allocated(path: str) -> int:
    """Bytes the file system has allocated to path."""
    return os.stat(path).st_blocks * 512


def dealloc_status(core) -> dict:
    return {k: v for k, v in core._native.status().items() if k.startswith("dealloc")}


def fill(core, n: int, size: int = FULL):
    keys = [okey(i) for i in range(n)]
    res = core.put_many(keys, [Obj(payload(i, size)) for i in range(n)])
    assert all(res.results)
    return keys


def make_reusable(core, fmt: str, extra_key: int = 10_000) -> None:
    """Checkpoints after deletes that make the freed slots reusable: the log format's FREE
    record needs one; format v1 needs both containers rewritten without them, and the second
    checkpoint is written only when something changed (one more put)."""
    core.checkpoint_now()
    if fmt == "v1":
        assert all(core.put_many([okey(extra_key)], [Obj(payload(extra_key, 100))]).results)
        core.checkpoint_now()


def check_loads(core, keys, live: set[int], size: int = FULL) -> None:
    outs = [Obj(size) for _ in keys]
    got = core.load_many_into([k.encoded for k in keys], outs)
    for i, (ok, o) in enumerate(zip(got, outs)):
        assert ok == (i in live), i
        if ok:
            assert o.bytes() == payload(i, size), i


def is_hole(path: str, off: int, n: int) -> bool:
    """Whether [off, off + n) of the file holds no allocated block (SEEK_DATA skips past it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, off, os.SEEK_DATA) >= off + n
    except OSError:  # ENXIO: no data after off
        return True
    finally:
        os.close(fd)


# The checkpoints in a test allocate a few metadata blocks of a sparse file as they go.
META_SLACK = 64 * 1024


def read_raw(path: str, off: int, n: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, n, off)
    finally:
        os.close(fd)


def assert_given_back(core, offsets: list[int], before: int, space_path: str, read_path: str,
                      read_len: int = SLOT) -> None:
    """The freed slots at offsets were given back: space_path (the file, or a loop device's
    backing file) has that much less allocated, less one slot the v1 round's extra put may take
    again and the metadata blocks checkpoints allocate; each slot is a hole in it and reads
    zeros through read_path."""
    os.sync()
    reput = core.entry_offset(okey(10_000).encoded)
    assert before - allocated(space_path) >= (len(offsets) - (reput in offsets)) * SLOT - META_SLACK
    for off in offsets:
        if off != reput:
            assert is_hole(space_path, off, SLOT)
            assert read_raw(read_path, off, read_len) == bytes(read_len)


# ---- a file -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_file_gets_holes_punched_for_exactly_the_freed_slots(tmp_path, fmt, engine):
    path = make_device(tmp_path)
    core = make_core(path, meta_format=fmt, io_engine=engine, deallocate_freed="on")
    try:
        assert dealloc_status(core)["dealloc_state"] == "on"
        assert dealloc_status(core)["dealloc_kind"] == "punch_hole"
        keys = fill(core, 24)
        core.checkpoint_now()
        gone = [1, 2, 3, 7, 11, 12, 20]  # runs of adjacent slots and single ones
        offsets = [core.entry_offset(keys[i].encoded) for i in gone]
        before = allocated(path)
        core._native.set_dealloc_log(True)
        assert all(core.delete_many([keys[i].encoded for i in gone]))
        # nothing is deallocated while a durable record may still list the slots
        assert dealloc_status(core)["dealloc_slots"] == 0
        make_reusable(core, fmt)
        st = dealloc_status(core)
        assert st["dealloc_slots"] == len(gone)
        assert sorted(core._native.take_dealloc_log()) == merged(offsets, SLOT)
        assert st["dealloc_ranges"] == len(merged(offsets, SLOT)) == st["dealloc_commands"]
        assert st["dealloc_bytes"] == len(gone) * SLOT
        assert st["dealloc_failures"] == 0 and st["dealloc_pending_slots"] == 0
        assert_given_back(core, offsets, before, path, path)
        check_loads(core, keys, set(range(24)) - set(gone))
    finally:
        core.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_slots_reused_after_deallocation_hold_their_new_keys_across_a_reopen(tmp_path, fmt):
    path = make_device(tmp_path)
    core = make_core(path, meta_format=fmt, deallocate_freed="on")
    keys = fill(core, 16)
    core.checkpoint_now()
    assert all(core.delete_many([k.encoded for k in keys[:8]]))
    make_reusable(core, fmt)
    assert dealloc_status(core)["dealloc_slots"] == 8
    new = [okey(100 + i) for i in range(8)]
    assert all(core.put_many(new, [Obj(payload(100 + i, FULL)) for i in range(8)]).results)
    core.close()
    core = make_core(path, meta_format=fmt, deallocate_freed="on")
    try:
        check_loads(core, keys, set(range(8, 16)))
        outs = [Obj(FULL) for _ in new]
        assert all(core.load_many_into([k.encoded for k in new], outs))
        assert [o.bytes() for o in outs] == [payload(100 + i, FULL) for i in range(8)]
    finally:
        core.close()


def test_auto_leaves_files_alone_and_off_deallocates_nothing(tmp_path):
    for mode in ("auto", "off"):
        path = make_device(tmp_path, name=f"{mode}.img")
        core = make_core(path, meta_format="log", deallocate_freed=mode)
        try:
            assert dealloc_status(core)["dealloc_state"] == "off"
            keys = fill(core, 8)
            core.checkpoint_now()
            before = allocated(path)
            assert all(core.delete_many([k.encoded for k in keys[:4]]))
            core.checkpoint_now()
            st = dealloc_status(core)
            assert st["dealloc_slots"] == st["dealloc_commands"] == 0
            assert allocated(path) >= before
            assert core._native.status()["free_slot_count"] == 4
        finally:
            core.close()


def test_a_put_that_needs_room_takes_freed_slots_without_deallocating_them(tmp_path):
    """The put path never waits for a deallocation: on a full cache a put whose room comes
    from a checkpoint it writes itself takes the freed slots as they are."""
    path = make_device(tmp_path, size=META_PLUS(12))
    core = make_core(path, meta_format="log", deallocate_freed="on", meta_total_bytes=1 * MiB)
    try:
        n = core._native.status()["max_slots"]
        keys = fill(core, n)
        core.checkpoint_now()
        assert all(core.delete_many([k.encoded for k in keys[:4]]))
        # no periodic thread here: the FREE records are not durable until a checkpoint
        new = [okey(500 + i) for i in range(4)]
        assert all(core.put_many(new, [Obj(payload(500 + i, FULL)) for i in range(4)]).results)
        st = dealloc_status(core)
        assert st["dealloc_skipped"] == 4 and st["dealloc_slots"] == 0
        check_loads(core, keys, set(range(4, n)))
    finally:
        core.close()


def META_PLUS(slots: int) -> int:
    return 1 * MiB + slots * SLOT


def test_the_periodic_thread_deallocates_after_a_delete(tmp_path):
    """In the log format a delete wakes the periodic thread, whose small record makes the slot
    reusable; the deallocation follows on that thread, not on the caller's."""
    import time

    path = make_device(tmp_path)
    core = make_core(path, meta_format="log", deallocate_freed="on", meta_enable_periodic=True,
                     meta_checkpoint_interval_sec=3600)
    try:
        keys = fill(core, 6)
        core.checkpoint_now()
        assert all(core.delete_many([k.encoded for k in keys[:3]]))
        deadline = time.monotonic() + 20
        while dealloc_status(core)["dealloc_slots"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dealloc_status(core)["dealloc_slots"] == 3
    finally:
        core.close()


# ---- file systems and block devices that cannot deallocate ---------------------------------


@pytest.fixture
def ramfs(rig):
    """A ramfs mount: a file system without fallocate (so no punched holes) and no O_DIRECT."""
    return rig.ramfs()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_system_without_punch_hole_turns_the_feature_off_once(ramfs, fmt, caplog):
    path = make_device(ramfs, size=16 * MiB)
    core = make_core(path, meta_format=fmt, deallocate_freed="on")
    try:
        assert dealloc_status(core)["dealloc_state"] == "on"  # a file: its file system answers the first punch
        keys = fill(core, 12)
        core.checkpoint_now()
        assert all(core.delete_many([k.encoded for k in keys[:4]]))
        make_reusable(core, fmt)
        st = dealloc_status(core)
        assert st["dealloc_state"] == "unsupported"
        assert st["dealloc_failures"] == 1 and st["dealloc_slots"] == 0
        assert "fallocate(PUNCH_HOLE)" in st["dealloc_unsupported_reason"]
        faults = core._native.status()["faults"]
        assert faults and faults[-1]["op"] == "deallocate" and faults[-1]["errno"] in (95,)  # EOPNOTSUPP
        # the slots were not lost: later deletes and puts go on without further attempts
        assert all(core.delete_many([k.encoded for k in keys[4:8]]))
        make_reusable(core, fmt, extra_key=10_001)
        assert dealloc_status(core)["dealloc_failures"] == 1
        new = [okey(200 + i) for i in range(8)]
        assert all(core.put_many(new, [Obj(payload(200 + i, FULL)) for i in range(8)]).results)
        check_loads(core, keys, set(range(8, 12)))
    finally:
        core.close()


def test_a_block_device_without_discard_is_known_unsupported_at_open(ramfs, rig):
    dev = rig.attach(make_device(ramfs, size=16 * MiB))
    core = make_core(dev, meta_format="log")  # auto: on for block devices, where supported
    try:
        st = dealloc_status(core)
        assert st["dealloc_state"] == "unsupported"
        assert st["dealloc_kind"] == "discard"
        assert "discard_max_bytes" in st["dealloc_unsupported_reason"]
        keys = fill(core, 6)
        assert all(core.delete_many([k.encoded for k in keys[:3]]))
        core.checkpoint_now()
        assert dealloc_status(core)["dealloc_failures"] == 0  # never attempted
        check_loads(core, keys, {3, 4, 5})
    finally:
        core.close()


# ---- a loop device: discards punch holes in its backing file -------------------------------


def uring_discard_expected() -> bool:
    """Whether this kernel takes a block device's discard through io_uring (Linux 6.12+, with
    io_uring not disabled by the administrator)."""
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    try:
        with open("/proc/sys/kernel/io_uring_disabled") as f:
            disabled = int(f.read()) != 0
    except OSError:
        disabled = False
    return (major, minor) >= (6, 12) and not disabled


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode,path", [("auto", "io_uring"), ("auto", "ioctl"), ("off", "")])
def test_loop_device_discards_free_the_backing_files_blocks(tmp_path, loop_device, fmt, mode, path):
    dev = loop_device(size=32 * MiB)
    backing = str(tmp_path / "loop0.img")
    core = make_core(dev, meta_format=fmt, deallocate_freed=mode)
    try:
        st = dealloc_status(core)
        assert st["dealloc_kind"] == "discard"
        assert st["dealloc_state"] == ("on" if mode == "auto" else "off")
        assert st["dealloc_discard_path"] == ""  # nothing discarded yet
        if path == "ioctl":
            core._native.discard_force_ioctl()
        keys = fill(core, 40)
        core.checkpoint_now()
        gone = list(range(0, 40, 3))  # 14 single slots
        offsets = [core.entry_offset(keys[i].encoded) for i in gone]
        os.sync()
        before = allocated(backing)
        core._native.set_dealloc_log(True)
        assert all(core.delete_many([k.encoded for k in (keys[i] for i in gone)]))
        make_reusable(core, fmt)
        log = core._native.take_dealloc_log()
        if mode == "off":
            os.sync()
            assert log == [] and allocated(backing) >= before
        else:
            assert sorted(log) == merged(offsets, SLOT)
            assert_given_back(core, offsets, before, backing, dev, BLOCK)
        taken = dealloc_status(core)["dealloc_discard_path"]
        if path == "io_uring":
            assert taken == ("io_uring" if uring_discard_expected() else "ioctl")
        else:
            assert taken == path
        check_loads(core, keys, set(range(40)) - set(gone))
    finally:
        core.close()


# ---- after a restart, and in large batches -------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_free_slots_found_at_open_are_deallocated_at_the_first_checkpoint(tmp_path, fmt):
    """A crash (or a run with deallocation off) can leave freed slots with their old bytes: the
    next process deallocates every free slot below the recovered high-water mark once."""
    path = make_device(tmp_path)
    core = make_core(path, meta_format=fmt, deallocate_freed="off")
    keys = fill(core, 20)
    core.checkpoint_now()
    offsets = [core.entry_offset(keys[i].encoded) for i in range(0, 10, 2)]
    assert all(core.delete_many([k.encoded for k in keys[:10:2]]))
    make_reusable(core, fmt)
    reput = core.entry_offset(okey(10_000).encoded)
    core.close()
    assert not any(is_hole(path, off, SLOT) for off in offsets)
    core = make_core(path, meta_format=fmt, deallocate_freed="on")
    try:
        freed = [off for off in offsets if off != reput]
        assert dealloc_status(core)["dealloc_pending_slots"] == len(freed)
        core._native.set_dealloc_log(True)
        core.checkpoint_now()
        assert sorted(core._native.take_dealloc_log()) == merged(freed, SLOT)
        assert all(is_hole(path, off, SLOT) for off in freed)
        check_loads(core, keys, set(range(20)) - set(range(0, 10, 2)))
    finally:
        core.close()


def test_a_large_free_runs_in_batches_and_merges_adjacent_slots(tmp_path):
    """More freed slots than one batch takes (8,192 slots in at most 256 ranges), and more
    ranges than one checkpoint deallocates (4,096): the rest wait for the next checkpoints,
    and in the end every slot is deallocated, adjacent ones merged, scattered ones one range
    each."""
    n = 20_000
    path = make_device(tmp_path, size=META_PLUS(n + 16))
    core = make_core(path, meta_format="log", deallocate_freed="on", meta_total_bytes=1 * MiB)
    try:
        keys = [okey(i) for i in range(n)]
        for lo in range(0, n, 2000):
            assert all(core.put_many(keys[lo:lo + 2000], [Obj(payload(i, 64)) for i in range(lo, lo + 2000)]).results)
        core.checkpoint_now()
        offsets = [core.entry_offset(k.encoded) for k in keys]
        core._native.set_dealloc_log(True)
        # every other slot of the first half, and the whole second half
        gone = list(range(0, n // 2, 2)) + list(range(n // 2, n))
        assert all(core.delete_many([keys[i].encoded for i in gone]))
        core.checkpoint_now()
        st = dealloc_status(core)
        assert st["dealloc_ranges"] <= 16 * 256 and st["dealloc_pending_slots"] > 0
        calls = 1
        while dealloc_status(core)["dealloc_pending_slots"] and calls < 10:
            core.checkpoint_now()
            calls += 1
        st = dealloc_status(core)
        assert calls > 1 and st["dealloc_pending_slots"] == 0
        assert st["dealloc_slots"] == len(gone) and st["dealloc_failures"] == 0
        log = core._native.take_dealloc_log()
        covered = sum(length for _, length in log)
        assert covered == len(gone) * SLOT == st["dealloc_bytes"]
        # ranges never overlap and each lies on freed slots only
        want = {offsets[i] for i in gone}
        for off, length in log:
            assert all(off + j * SLOT in want for j in range(length // SLOT))
        assert len(log) == st["dealloc_ranges"] < len(gone)
        check_loads(core, keys[:64], {i for i in range(1, 64, 2)}, size=64)
    finally:
        core.close()


def test_the_periodic_thread_works_off_a_backlog_between_its_checkpoints(tmp_path):
    """More scattered freed slots than one call deallocates (4,096 ranges): the periodic thread
    comes back for the rest at once, without an explicit checkpoint or a new delete."""
    import time

    n = 12_000
    path = make_device(tmp_path, size=META_PLUS(n + 16))
    core = make_core(path, meta_format="log", deallocate_freed="on", meta_total_bytes=1 * MiB,
                     meta_enable_periodic=True, meta_checkpoint_interval_sec=3600)
    try:
        keys = [okey(i) for i in range(n)]
        for lo in range(0, n, 2000):
            assert all(core.put_many(keys[lo:lo + 2000], [Obj(payload(i, 64)) for i in range(lo, lo + 2000)]).results)
        core.checkpoint_now()
        gone = [keys[i].encoded for i in range(0, n, 2)]  # 6,000 ranges
        assert all(core.delete_many(gone))
        deadline = time.monotonic() + 60
        while dealloc_status(core)["dealloc_slots"] < len(gone) and time.monotonic() < deadline:
            time.sleep(0.02)
        st = dealloc_status(core)
        assert st["dealloc_slots"] == len(gone) == st["dealloc_ranges"]
        assert st["dealloc_pending_slots"] == 0
    finally:
        core.close()
