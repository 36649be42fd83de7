"""extent_bytes: auto, on the host's devices (no NVMe here: the FDP reclaim unit is tested in the
emulated guest, tests/nvme/test_extent_fdp_guest.py): a regular file turns extents off, a block
device without FDP (a loop device) takes the conventional default of 1 GiB (format v1: whole
slots), a device too small for 4 such extents turns them off, the value in effect and its source
are in the status and report, the word is parsed everywhere a setting is, and a strided device
opened with auto resolving to another value is refused naming both.
"""

from __future__ import annotations

import pytest

from core_helpers import META, MiB, Obj, make_config, make_core, make_device, okey, payload
from lmcache_rawblock import _native
from lmcache_rawblock.raw_block import RawBlockCore
from lmcache_rawblock.settings import parse_value

GiB = 1 << 30


def ext(core) -> dict:
    st = core._native.status()
    return {k: st[k] for k in ("extent_bytes", "extent_bytes_source", "extent_reclaim_unit_bytes", "extent_slots")}


def test_the_word_auto_is_parsed_by_every_entry_point(tmp_path):
    assert parse_value("extent_bytes", "auto") == "auto"
    assert parse_value("extent_bytes", " Auto ") == "auto"
    assert parse_value("extent_bytes", "1048576") == 1048576
    with pytest.raises(ValueError, match="extent_bytes must be an integer, got 'automatic'"):
        parse_value("extent_bytes", "automatic")
    assert make_config(make_device(tmp_path), extent_bytes="AUTO").extent_bytes == "auto"
    with pytest.raises(TypeError, match="extent_bytes"):
        _native.Core(device_path=make_device(tmp_path), slot_bytes=64 * 1024, extent_bytes="often")


@pytest.mark.parametrize("fmt", ["v1", "log"])
def test_auto_on_a_regular_file_is_off(tmp_path, fmt):
    core = make_core(make_device(tmp_path), meta_format=fmt, extent_bytes="auto")
    try:
        assert ext(core) == {"extent_bytes": 0, "extent_bytes_source": "off_regular_file",
                             "extent_reclaim_unit_bytes": 0, "extent_slots": 0}
        rep = core.report_status()
        assert rep["extent_bytes"] == 0 and rep["extent_bytes_source"] == "off_regular_file"
    finally:
        core.close()


def test_a_number_is_reported_as_the_setting(tmp_path):
    core = make_core(make_device(tmp_path), extent_bytes=256 * 1024)
    try:
        assert ext(core) == {"extent_bytes": 256 * 1024, "extent_bytes_source": "setting",
                             "extent_reclaim_unit_bytes": 0, "extent_slots": 4}
    finally:
        core.close()


@pytest.mark.parametrize("fmt,slot,want", [
    ("log", 3 * MiB, GiB),  # strided: 341 slots and a 1 MiB tail per extent
    ("v1", 3 * MiB, (GiB // (3 * MiB)) * 3 * MiB),  # whole slots: rounded down
    ("v1", 4 * MiB, GiB),
])
def test_auto_on_a_block_device_without_fdp_is_one_gib(loop_device, fmt, slot, want):
    dev = loop_device(size=6 * GiB)  # sparse: only the metadata is written
    core = make_core(dev, meta_format=fmt, slot_bytes=slot, extent_bytes="auto")
    try:
        got = ext(core)
        assert got == {"extent_bytes": want, "extent_bytes_source": "conventional_default",
                       "extent_reclaim_unit_bytes": 0, "extent_slots": want // slot}
        assert core._native.status()["extents_total"] >= 4
    finally:
        core.close()


def test_auto_on_a_small_block_device_is_off(loop_device):
    dev = loop_device(size=2 * GiB)  # fewer than 4 extents of 1 GiB
    core = make_core(dev, meta_format="log", slot_bytes=4 * MiB, extent_bytes="auto")
    try:
        assert ext(core)["extent_bytes"] == 0
        assert ext(core)["extent_bytes_source"] == "off_device_below_4_extents"
    finally:
        core.close()


def test_a_strided_device_opened_with_auto_resolving_elsewhere_is_refused(loop_device):
    dev = loop_device(size=6 * GiB)
    slot = 3 * MiB
    core = make_core(dev, meta_format="log", slot_bytes=slot, extent_bytes=512 * MiB)
    assert core.put_many([okey(1)], [Obj(payload(1, 1000))]).results == [True]
    core.close()
    with pytest.raises(ValueError) as info:
        RawBlockCore(make_config(dev, meta_format="log", slot_bytes=slot, extent_bytes="auto"),
                     key_namespace="object")
    text = str(info.value)
    assert f"extent_bytes={512 * MiB}" in text and f"extent_bytes={GiB} (resolved from auto)" in text, text
    core = make_core(dev, meta_format="log", slot_bytes=slot, extent_bytes=512 * MiB)  # its own value opens
    try:
        assert core.exists_many([okey(1).encoded]) == [True]
    finally:
        core.close()


def test_meta_sized_file_is_unchanged_by_auto_off(tmp_path):
    """auto resolving to off leaves the layout LMCache's: slot 0 right after the metadata."""
    core = make_core(make_device(tmp_path), extent_bytes="auto")
    try:
        assert core.put_many([okey(1)], [Obj(payload(1, 1000))]).results == [True]
        assert core.entry_offset(okey(1).encoded) == META
    finally:
        core.close()


def test_size_classes_with_auto_need_auto_to_keep_extents(tmp_path, loop_device):
    """size_classes needs extents: with extent_bytes=auto that is known only at open, so a
    device where auto turns extents off (a regular file) refuses the open, naming both
    settings and why; where auto keeps them (a block device), the classes work."""
    with pytest.raises(ValueError, match=r"size_classes=2 needs extents, but extent_bytes=auto turned them off "
                                         r"on .* \(off_regular_file\)"):
        make_core(make_device(tmp_path), meta_format="log", extent_bytes="auto", size_classes=2)
    dev = loop_device(size=6 * GiB)
    core = make_core(dev, meta_format="log", slot_bytes=4 * MiB, extent_bytes="auto", size_classes=2)
    try:
        st = core._native.status()
        assert st["extent_bytes"] == GiB and st["size_classes"] == 2
        key = okey(1)
        assert core.put_many([key], [Obj(payload(1, MiB))]).results == [True]  # a half-size object
        assert st["extent_slots"] > 0
    finally:
        core.close()
