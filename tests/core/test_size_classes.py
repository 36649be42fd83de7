"""Size classes (size_classes > 1, the log format with extents): each extent holds slots of one
class, class c's slot holding (slot_bytes - header_bytes) / 2^c payload bytes rounded up to
block_align; an object goes to the smallest class it fits; the slot ids of an extent are those
of its smallest class, a larger class using the first of them; the class count is recorded in
the superblock; recovery gives an extent the class of its first entry and drops (and counts)
entries that contradict it; format v1 refuses the setting.

Real files in tmp_path; the layout is the log format's only, so these tests set it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from core_helpers import BLOCK, HEADER, META, SLOT, Obj, make_core, make_device, okey, payload
from helpers import TESTS

PER = 8
EXT = PER * SLOT  # 512 KiB; data_base (1 MiB) a multiple: extent 0 at META
PAY = SLOT - HEADER  # 60 KiB: class 0's payload


def cls_slot(c: int) -> int:
    pay = PAY >> c
    return HEADER + (pay + BLOCK - 1) // BLOCK * BLOCK


def sc_core(path: str, n: int = 3, **kw):
    kw.setdefault("meta_format", "log")
    kw.setdefault("extent_bytes", EXT)
    return make_core(path, size_classes=n, **kw)


def put(core, ids, sizes) -> list:
    keys = [okey(i) for i in ids]
    for k, i, n in zip(keys, ids, sizes):  # one call per key: slots in the order of the puts
        r = core.put_many([k], [Obj(payload(i, n))])
        assert r.results == [True], (i, r.failure)
    return keys


def served(core, ids, sizes) -> list[int]:
    """ids whose load returns their own bytes; any other bytes served fail the test."""
    ok = []
    for i, n in zip(ids, sizes):
        o = Obj(n)
        if core.load_many_into([okey(i).encoded], [o]) == [True]:
            assert o.bytes() == payload(i, n), f"key {i} served other bytes"
            ok.append(i)
    return ok


def run_child(dev: str, body: str, **cfg) -> None:
    """body in a child process over a core on dev, then the child dies without closing it."""
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(TESTS)!r})
        from core_helpers import Obj, make_core, okey, payload
        c = make_core({dev!r}, meta_enable_periodic=False, meta_format="log", **{cfg!r})
    """) + textwrap.dedent(body) + "\nos._exit(0)\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_objects_go_to_extents_of_their_class_at_its_offsets_and_survive_a_reopen(tmp_path):
    path = make_device(tmp_path)
    sizes = [PAY, PAY // 2, PAY // 4, PAY - 1, 20000, 100, 40000]
    # classes: 0, 1, 2, 0, 1 (20000 <= 30720), 2, 0 (40000 > 30720)
    want = [META, META + EXT, META + 2 * EXT, META + SLOT, META + EXT + cls_slot(1), META + 2 * EXT + cls_slot(2),
            META + 2 * SLOT]
    ids = list(range(len(sizes)))
    core = sc_core(path)
    try:
        keys = put(core, ids, sizes)
        assert [core.entry_offset(k.encoded) for k in keys] == want
        assert served(core, ids, sizes) == ids
        st = core._native.status()
        assert st["size_classes"] == 3 and st["size_class_slot_bytes"] == [SLOT, cls_slot(1), cls_slot(2)]
        assert st["size_class_extents"] == [1, 1, 1]
        n_ext = (128 * 1024 * 1024 - META) // EXT
        assert st["extents_total"] == n_ext and st["max_slots"] == n_ext * (EXT // cls_slot(2))
    finally:
        core.close()
    core = sc_core(path)
    try:
        assert [core.entry_offset(k.encoded) for k in keys] == want
        assert served(core, ids, sizes) == ids
        st = core._native.status()
        assert st["size_class_extents"] == [1, 1, 1] and st["size_class_dropped"] == 0
        keys += put(core, [100, 101], [PAY // 4, PAY])  # clean extents first, each taking its class
        assert [core.entry_offset(k.encoded) for k in keys[-2:]] == [META + 3 * EXT, META + 4 * EXT]
        assert core._native.status()["size_class_extents"] == [2, 1, 2]
    finally:
        core.close()


def test_half_size_objects_fill_a_device_twice_over_with_two_classes(tmp_path):
    # 16 extents of 8 full slots: one class stores 128 half-size objects, two classes 16 * 15.
    stored = {}
    for n in (1, 2):
        path = make_device(tmp_path, size=META + 16 * EXT, name=f"dev{n}.img")
        core = sc_core(path, n) if n > 1 else make_core(path, meta_format="log", extent_bytes=EXT)
        try:
            i = 0
            while core.put_many([okey(i)], [Obj(payload(i, PAY // 2))]).results == [True]:
                i += 1
            stored[n] = i
            assert served(core, range(0, i, 17), [PAY // 2] * len(range(0, i, 17))) == list(range(0, i, 17))
        finally:
            core.close()
    assert stored == {1: 16 * PER, 2: 16 * (EXT // cls_slot(1))}


def test_a_put_that_finds_no_slot_names_its_class_and_counts_ids_as_ids(tmp_path):
    """With size classes the slot ids count the smallest class's slots: a device full of
    full-size objects holds far fewer keys than ids, and the failure says which is which."""
    path = make_device(tmp_path, size=META + 2 * EXT)
    core = sc_core(path, 3)
    try:
        put(core, range(2 * PER), [PAY] * (2 * PER))
        r = core.put_many([okey(99)], [Obj(payload(99, PAY))])
        ids = core._native.status()["max_slots"]
        assert ids > 2 * PER and not r.results[0]
        assert str(r.failure).startswith(
            f"no free slot of size class 0 ({SLOT}-byte slots): {ids} slot ids (counted in the smallest class's "
            f"slots), {2 * PER} indexed"), r.failure
    finally:
        core.close()


def test_a_wholly_freed_extent_is_taken_by_another_class(tmp_path):
    path = make_device(tmp_path, size=META + 2 * EXT)
    core = sc_core(path, 2)
    try:
        big = put(core, range(2 * PER), [PAY] * (2 * PER))  # both extents class 0
        assert not core.put_many([okey(99)], [Obj(payload(99, 1000))]).results[0]  # no extent of class 1
        ext, victims, _hot = core._native.extent_victim()
        assert ext == 0 and sorted(victims) == sorted(k.encoded for k in big[:PER])
        assert core.delete_many(victims) == [True] * PER
        core.checkpoint_now()  # the FREE records durable: the extent is wholly free
        small = list(range(100, 100 + EXT // cls_slot(1)))
        put(core, small, [1000] * len(small))
        assert core.entry_offset(okey(100).encoded) == META and core.entry_offset(okey(101).encoded) == META + cls_slot(1)
        assert core._native.status()["size_class_extents"] == [1, 1]
        assert served(core, small, [1000] * len(small)) == small
        assert served(core, range(PER, 2 * PER), [PAY] * PER) == list(range(PER, 2 * PER))
    finally:
        core.close()


def test_a_device_opens_only_with_the_size_classes_it_was_written_with(tmp_path):
    path = make_device(tmp_path)
    core = sc_core(path, 3)
    put(core, [1], [1000])
    core.close()
    for n in (2, 1):
        with pytest.raises(ValueError, match=f"size_classes=3.*size_classes={n}"):
            sc_core(path, n)
    core = sc_core(path, 3)
    assert served(core, [1], [1000]) == [1]
    core.close()


@pytest.mark.parametrize("kw,msg", [
    (dict(meta_format="v1", extent_bytes=EXT), "size_classes=2 needs meta_format='log'"),
    (dict(extent_bytes=0), "size_classes=2 needs extents"),
])
def test_size_classes_are_refused_without_extents_in_the_log_format(tmp_path, kw, msg):
    with pytest.raises(ValueError, match=msg):
        sc_core(make_device(tmp_path), 2, **kw)


def test_a_state_document_is_refused_with_size_classes(tmp_path):
    core = sc_core(make_device(tmp_path), 2)
    try:
        put(core, [1], [1000])
        with pytest.raises(ValueError, match="apply_state_json is not available with size_classes=2"):
            core._native.apply_state_json(b'{"version": 1, "entries": {}}')
        assert served(core, [1], [1000]) == [1]
    finally:
        core.close()


def test_too_many_size_classes_are_refused_naming_the_setting(tmp_path):
    # 60 KiB of payload halves to 4 KiB after 4 classes: a fifth rounds up to the same slot
    with pytest.raises(ValueError, match="size_classes=6 is too many"):
        sc_core(make_device(tmp_path), 6)
    with pytest.raises(ValueError, match="size_classes"):
        sc_core(make_device(tmp_path), 9)


def contradicting_device(tmp_path) -> str:
    """One extent. Three full objects (class 0: ids 0..2), deleted, then two small ones (class
    1) at ids 0 and 1 of the freed extent (its open stream let go of it); the group of the
    deletes is damaged, so recovery replays a full object at id 2 and two small ones (keys 10
    and 11) in one extent."""
    dev = make_device(tmp_path, size=META + EXT)
    run_child(dev, f"""
        big = [okey(i) for i in range(3)]
        assert all(c.put_many(big, [Obj(payload(i, {PAY})) for i in range(3)]).results)
        c.checkpoint_now()
        c.delete_many([k.encoded for k in big])
        c.checkpoint_now()
        assert all(c.put_many([okey(10), okey(11)], [Obj(payload(i, 1000)) for i in (10, 11)]).results)
        assert c.entry_offset(okey(11).encoded) == {META + cls_slot(1)}
        c.checkpoint_now()
    """, extent_bytes=EXT, size_classes=2)
    ring_off = META // 2 - (META // 2) // 4
    with open(dev, "r+b") as f:  # the first group (the first checkpoint wrote a base): the deletes
        f.seek(ring_off + 48)
        f.write(b"\xff" * 8)
    return dev


def test_an_entry_contradicting_its_extents_class_is_dropped_and_counted(tmp_path):
    # The extent takes its first entry's class and the entries of the other are dropped,
    # counted, never served.
    dev = contradicting_device(tmp_path)
    core = sc_core(dev, 2)
    try:
        st = core._native.status()
        assert st["recovery_outcome"] == "damaged"
        assert st["size_class_dropped"] == 2 and st["recovery_dropped_entries"] >= 2
        assert served(core, [10, 11], [1000, 1000]) == []
        assert served(core, [2], [PAY]) == [2]
        assert st["size_class_extents"] == [1, 0]
    finally:
        core.close()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_device_full_of_full_size_objects_reports_its_whole_capacity_used(tmp_path, n):
    # LMCache's MP accounting charges each stored key slot_bytes against usable_capacity_bytes
    # and evicts at a watermark of it: the capacity must be what full-size objects fill, or a
    # full device reads as half (or less) used and LMCache never evicts.
    path = make_device(tmp_path, size=META + 16 * EXT)
    core = sc_core(path, n) if n > 1 else make_core(path, meta_format="log", extent_bytes=EXT)
    try:
        i = 0
        while core.put_many([okey(i)], [Obj(payload(i, PAY))]).results == [True]:
            i += 1
        assert i == 16 * PER
        assert core.report_status()["usable_capacity_bytes"] == i * SLOT
    finally:
        core.close()


def test_entries_dropped_by_class_stay_dropped_until_a_whole_base_forgets_them(tmp_path):
    # The dropped entries stay listed on the device until the next checkpoint writes a whole
    # base. A core that dies before it, after a put over the dropped entries' bytes (key 20 at
    # id 0, where key 10's header was), recovers the same state: the same entries dropped and
    # counted again, none of them live or served, the put (not durable) gone. The checkpoint
    # after that writes a base without them: the next open drops nothing.
    dev = contradicting_device(tmp_path)
    run_child(dev, f"""
        st = c._native.status()
        assert (st["recovery_outcome"], st["size_class_dropped"]) == ("damaged", 2), st
        assert c.put_many([okey(20)], [Obj(payload(20, {PAY}))]).results == [True]
        assert c.entry_offset(okey(20).encoded) == {META}
    """, extent_bytes=EXT, size_classes=2)
    core = sc_core(dev, 2)
    try:
        st = core._native.status()
        assert (st["recovery_outcome"], st["size_class_dropped"]) == ("damaged", 2), st
        assert core.exists_many([okey(i).encoded for i in (2, 10, 11, 20)]) == [True, False, False, False]
        assert served(core, [10, 11], [1000, 1000]) == [] and served(core, [2], [PAY]) == [2]
        core.checkpoint_now()
    finally:
        core.close()
    core = sc_core(dev, 2)
    try:
        st = core._native.status()
        assert (st["recovery_outcome"], st["size_class_dropped"], st["recovery_dropped_entries"]) == ("loaded", 0, 0)
        assert core.exists_many([okey(i).encoded for i in (2, 10, 11)]) == [True, False, False]
        assert served(core, [2], [PAY]) == [2]
    finally:
        core.close()


def test_status_under_failing_allocations_raises_memoryerror_or_reports_whole_lists(tmp_path):
    # Every allocation status() makes fails in turn (CPython's test hook): each call either
    # raises MemoryError or returns the whole size-class lists, never a list with holes or a
    # result with an exception left set (which CPython reports as SystemError).
    _testcapi = pytest.importorskip("_testcapi", reason="the allocation-failure hook is CPython's _testcapi")
    core = sc_core(make_device(tmp_path), 3)
    try:
        want = core._native.status()["size_class_slot_bytes"]
        assert want == [cls_slot(c) for c in range(3)]
        outcomes = {"MemoryError": 0, "whole": 0}
        k = 0
        while outcomes["whole"] < 20:  # past the last allocation status() makes
            st = None
            _testcapi.set_nomemory(k, k + 1)
            try:
                st = core._native.status()
            except MemoryError:
                pass
            finally:
                _testcapi.remove_mem_hooks()
            if st is None:
                outcomes["MemoryError"] += 1
            else:
                lists = st["size_class_slot_bytes"], st["size_class_extents"]
                assert all(len(x) == 3 and all(type(v) is int for v in x) for x in lists), k
                assert lists[0] == want, k
                outcomes["whole"] += 1
            k += 1
        assert outcomes["MemoryError"] > 0, outcomes
    finally:
        core.close()
