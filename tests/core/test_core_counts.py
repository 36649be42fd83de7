"""The light counter read (_native.Core.counts()) behind RawBlockCore.slot_counts() and
extent_counts(): the same figures as status() under the documented names, with extents off,
on (after deletes, a deallocation and evictions), in the strided layout, and once closed.

Real files in tmp_path, both metadata formats (the strided layout needs the log format).
"""

from __future__ import annotations

import pytest

from core_helpers import META, SLOT, Obj, make_core, make_device, okey, payload
from lmcache_rawblock.raw_block.core import SlotCounts

FORMATS = ["v1", "log"]
PER = 4
EXTENT_KEYS = {"extent_slots", "extents_total", "extents_clean", "extents_open", "extents_pending_dealloc",
               "extents_opened", "extent_fallbacks", "extents_evicted", "extent_deallocs", "extent_dealloc_skipped",
               "extent_base_offset", "extent_stride", "extent_tail_bytes", "extent_bytes",
               "extent_reclaim_unit_bytes", "closed"}


def from_status(core) -> tuple[SlotCounts, dict]:
    """The counts as derived from the whole status() (how they were read before the light call)."""
    st = core._native.status()
    usable = st["usable_slots"]
    slots = SlotCounts(usable=usable, indexed=st["indexed_key_count"], inflight=st["inflight_key_count"],
                       free=st["free_slot_count"], fresh=max(0, usable - st["next_slot"]),
                       held=st["checkpoint_held_slots"], locked=st["locked_key_count"],
                       room_checkpoints=st["checkpoints_for_room"], closed=bool(st["closed"]))
    ext = {k: v for k, v in st.items() if k.startswith(("extent_", "extents_")) and isinstance(v, int)}
    ext["closed"] = int(bool(st["closed"]))
    return slots, ext


def assert_counts_match(core) -> tuple[SlotCounts, dict]:
    slots, ext = from_status(core)
    got_slots, got_ext = core.slot_counts(), core.extent_counts()
    assert got_slots == slots
    assert got_ext == ext
    assert set(got_ext) == EXTENT_KEYS and all(type(v) is int for v in got_ext.values())
    return got_slots, got_ext


def put(core, ids: list[int]) -> list:
    keys = [okey(i) for i in ids]
    for k, i in zip(keys, ids):
        assert core.put_many([k], [Obj(payload(i, 1000))]).results == [True], i
    return keys


@pytest.mark.parametrize("fmt", FORMATS)
def test_slot_counts_equal_the_status_figures_without_extents(tmp_path, fmt):
    core = make_core(make_device(tmp_path, size=META + 40 * SLOT), meta_format=fmt)
    try:
        keys = put(core, list(range(9)))
        assert core.exists_many([k.encoded for k in keys[:2]], lock=True) == [True, True]
        assert core.delete_many([keys[5].encoded, keys[6].encoded, keys[7].encoded]) == [True] * 3
        slots, ext = assert_counts_match(core)
        # distinct figures, so a swapped pair of fields could not match by chance
        assert (slots.usable, slots.indexed, slots.locked) == (40, 6, 2)
        assert slots.fresh == 40 - 9 and slots.held + slots.free == 3
        assert ext["extent_bytes"] == 0 and ext["extents_total"] == 0 and ext["closed"] == 0
        core.unlock_many([k.encoded for k in keys[:2]])
        core.checkpoint_now()
        assert_counts_match(core)
    finally:
        core.close()
    slots, ext = assert_counts_match(core)
    assert slots.closed and ext["closed"] == 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_extent_counts_equal_the_status_figures_after_deletes_and_evictions(tmp_path, fmt):
    core = make_core(make_device(tmp_path), meta_format=fmt, extent_bytes=PER * SLOT)
    try:
        _, ext = assert_counts_match(core)
        assert ext["extent_slots"] == PER and ext["extents_open"] == 0
        keys = put(core, list(range(3 * PER + 1)))
        _, ext = assert_counts_match(core)
        assert ext["extents_opened"] == 4 and ext["extents_open"] == 1
        assert core.delete_many([k.encoded for k in keys[:PER]]) == [True] * PER  # extent 0 wholly free
        core.checkpoint_now()
        for _ in range(2):  # two evictions: victims taken and deleted
            victim = core.extent_victim()
            assert victim is not None
            assert all(core.delete_many(victim[1]))
        core.checkpoint_now()
        put(core, [100])
        core.checkpoint_now()
        _, ext = assert_counts_match(core)
        assert ext["extents_evicted"] == 2 and ext["extents_clean"] < ext["extents_total"]
    finally:
        core.close()
    _, ext = assert_counts_match(core)
    assert ext["closed"] == 1 and ext["extent_slots"] == PER


def test_extent_counts_carry_the_strided_layout(tmp_path):
    tail = 32 * 1024
    core = make_core(make_device(tmp_path), meta_format="log", extent_bytes=PER * SLOT + tail)
    try:
        put(core, list(range(PER + 1)))
        _, ext = assert_counts_match(core)
        assert (ext["extent_stride"], ext["extent_tail_bytes"]) == (PER * SLOT + tail, tail)
        assert ext["extent_base_offset"] > 0
    finally:
        core.close()
