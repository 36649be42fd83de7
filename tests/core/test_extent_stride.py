"""The strided layout (log format, extent_bytes not a multiple of slot_bytes): extent k at the
first extent_bytes boundary past the metadata region plus k * extent_bytes, floor(extent_bytes
/ slot_bytes) slots each, the tail unused; recorded in the superblock, so a device opens only
with the layout it was written with; format v1 (LMCache's layout) keeps whole slots.

Real files in tmp_path; the layout is the log format's only, so these tests set it.
"""

from __future__ import annotations

import pytest

from core_helpers import META, SLOT, Obj, make_core, make_device, okey, payload
from lmcache_rawblock import tools

PER = 4
TAIL = 32 * 1024
EXT = PER * SLOT + TAIL  # 288 KiB: not whole slots
BASE = (META + EXT - 1) // EXT * EXT  # extent 0: the first boundary past the 1 MiB region


def offset_of(slot: int, ext: int = EXT, per: int = PER) -> int:
    base = (META + ext - 1) // ext * ext
    return base + slot // per * ext + slot % per * SLOT


def put(core, ids: list[int], size: int = 3000) -> list:
    keys = [okey(i) for i in ids]
    for k, i in zip(keys, ids):  # one call per key: slots in the order of the puts
        assert core.put_many([k], [Obj(payload(i, size))]).results == [True], i
    return keys


def loads(core, keys: list, ids: list[int], size: int = 3000) -> list[bool]:
    out = []
    for k, i in zip(keys, ids):
        o = Obj(size)
        out.append(core.load_many_into([k.encoded], [o]) == [True] and o.bytes() == payload(i, size))
    return out


def strided(path: str, **kw):
    return make_core(path, meta_format="log", extent_bytes=EXT, **kw)


def test_slots_sit_at_the_strided_offsets_and_round_trip_across_extents(tmp_path):
    path = make_device(tmp_path)
    core = strided(path)
    ids = list(range(3 * PER + 1))
    try:
        keys = put(core, ids)
        assert [core.entry_offset(k.encoded) for k in keys] == [offset_of(i) for i in ids]
        assert offset_of(PER) % EXT == 0 and offset_of(PER) - offset_of(PER - 1) == SLOT + TAIL
        assert all(loads(core, keys, ids))
        st = core.extent_counts()
        assert (st["extent_stride"], st["extent_tail_bytes"], st["extent_base_offset"]) == (EXT, TAIL, BASE)
        n = (128 * 1024 * 1024 - BASE) // EXT
        assert st["extents_total"] == n and core._native.status()["max_slots"] == n * PER
        rs = core.report_status()
        assert rs["extent_stride"] == EXT and rs["extent_unused_bytes"] == n * TAIL
    finally:
        core.close()
    core = strided(path)
    try:
        assert all(loads(core, keys, ids)), "after a reopen with the same extent_bytes"
        assert [core.entry_offset(k.encoded) for k in keys] == [offset_of(i) for i in ids]
    finally:
        core.close()


@pytest.mark.parametrize("other", [5 * SLOT + 4096, PER * SLOT, 0])
def test_a_strided_device_opened_with_another_layout_is_refused_naming_both(tmp_path, other):
    path = make_device(tmp_path)
    core = strided(path)
    put(core, [1, 2, 3])
    core.close()
    with pytest.raises(ValueError, match=f"laid out for extent_bytes={EXT}, the configuration says "
                                         f"extent_bytes={other}"):
        make_core(path, meta_format="log", extent_bytes=other)
    core = strided(path)  # refused, not overwritten: the device still opens as written
    try:
        assert all(loads(core, [okey(i) for i in (1, 2, 3)], [1, 2, 3]))
    finally:
        core.close()


def test_a_device_of_back_to_back_slots_is_refused_by_a_strided_configuration(tmp_path):
    path = make_device(tmp_path)
    core = make_core(path, meta_format="log", extent_bytes=PER * SLOT)  # whole slots: the identity layout
    put(core, [1, 2])
    core.close()
    with pytest.raises(ValueError, match=f"laid out for extent_bytes=0, the configuration says extent_bytes={EXT}"):
        strided(path)
    core = make_core(path, meta_format="log")  # extents off: the same layout, opens as today
    try:
        assert all(loads(core, [okey(1), okey(2)], [1, 2]))
    finally:
        core.close()


def test_format_v1_keeps_whole_slots(tmp_path):
    with pytest.raises(ValueError, match=r"extent_bytes must be a multiple of slot_bytes with meta_format='v1'.*"
                                         rf"extent_bytes={EXT}, slot_bytes={SLOT}"):
        make_core(make_device(tmp_path), meta_format="v1", extent_bytes=EXT)


@pytest.mark.parametrize("value, message", [
    (PER * SLOT + 512, r"extent_bytes must be a multiple of block_align \(extent_bytes=262656, block_align=4096\)"),
    (SLOT + TAIL, r"extent_bytes must hold at least 2 slots \(extent_bytes=98304, slot_bytes=65536\)"),
])
def test_bad_strided_extent_bytes_is_refused_naming_it(tmp_path, value, message):
    with pytest.raises(ValueError, match=message):
        make_core(make_device(tmp_path), meta_format="log", extent_bytes=value)


def test_a_whole_extent_is_deallocated_as_one_range_of_extent_bytes_on_its_boundary(tmp_path):
    core = strided(make_device(tmp_path), deallocate_freed="on")
    try:
        keys = put(core, list(range(3 * PER)))
        core.checkpoint_now()
        core._native.set_dealloc_log(True)
        assert all(core.delete_many([k.encoded for k in keys[:2 * PER]]))
        core.checkpoint_now()
        got = sorted(core._native.take_dealloc_log())
        assert got == [(BASE, EXT), (BASE + EXT, EXT)]
        assert all(off % EXT == 0 for off, _ in got)
        st = core._native.status()
        assert st["dealloc_slots"] == 2 * PER and st["extent_deallocs"] == 2
        assert all(loads(core, keys[2 * PER:], list(range(2 * PER, 3 * PER))))
    finally:
        core.close()


def test_verify_and_inspect_read_a_strided_device_at_its_offsets(tmp_path):
    path = make_device(tmp_path)
    core = strided(path, verify_payload_checksum=True)
    ids = list(range(2 * PER + 2))
    keys = put(core, ids)
    want = {k.encoded: offset_of(i) for k, i in zip(keys, ids)}
    core.close()
    res = tools.verify_device(path)
    assert res["checked"] == len(ids) and res["ok"] == len(ids) and res["checksums_checked"] == len(ids)
    rep = tools.read_device(path)
    assert {k: e["offset"] for k, e in rep.state["entries"].items()} == want
    assert rep.geometry["extent_stride"] == EXT
    assert "extent_stride=294912" in tools.format_inspect(tools.inspect_device(path))
    with open(path, "r+b") as f:  # a payload byte of the first slot of extent 1
        f.seek(offset_of(PER) + 4096 + 5)
        f.write(b"\x00" if payload(PER, 3000)[5] else b"\x01")
    res = tools.verify_device(path)
    assert [m["offset"] for m in res["mismatches"]] == [offset_of(PER)]


def test_a_shrunk_device_keeps_the_slots_that_still_fit(tmp_path):
    path = make_device(tmp_path)
    core = strided(path)
    try:
        ids = list(range(2 * PER))
        keys = put(core, ids)
        # cut the device inside extent 1's third slot: extent 0 and two slots of extent 1 fit
        with open(path, "r+b") as f:
            f.truncate(offset_of(PER + 2) + SLOT // 2)
        assert loads(core, keys[-1:], ids[-1:]) == [False]  # past the end: a miss, the shrink seen
        st = core._native.status()
        assert st["usable_slots"] == PER + 2 and st["shrink_dropped_entries"] == 2
        assert all(loads(core, keys[:PER + 2], ids[:PER + 2]))
    finally:
        core.close()
