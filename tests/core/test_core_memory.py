"""Index memory of the C core: the key-blob pool keeps small and large indexes within the
budget (<= 150 bytes per entry plus the key bytes) and gives its slabs back when the index
empties, so put/delete cycles do not grow the process."""

from __future__ import annotations

import pytest

from core_helpers import Obj, make_core, make_device, okey

BUDGET = 150  # goal: bytes per entry, key bytes not counted


def _fill(core, keys):
    obj = Obj(64)
    for i in range(0, len(keys), 64):
        part = keys[i:i + 64]
        assert all(core.put_many(part, [obj] * len(part)).results)


@pytest.mark.parametrize("n", [1000, 4000])
def test_index_memory_per_entry_within_budget(tmp_path, n):
    core = make_core(make_device(tmp_path, size=8 << 20 | (n + 16) * 8192 + (8 << 20)), slot_bytes=8192,
                     meta_total_bytes=8 << 20)
    try:
        empty = core._native.mem_bytes()
        keys = [okey(i) for i in range(n)]
        _fill(core, keys)
        core.checkpoint_now()  # the index alone: the log format's journal of the puts is written
        key_bytes = sum(len(k.encoded) + 1 for k in keys)
        per_entry = (core._native.mem_bytes() - empty - key_bytes) / n
        assert per_entry <= BUDGET, per_entry
    finally:
        core.close()


@pytest.mark.v1_layout
def test_put_delete_cycles_do_not_grow_memory(tmp_path):
    core = make_core(make_device(tmp_path, size=8 << 20 | 2100 * 8192 + (8 << 20)), slot_bytes=8192,
                     meta_total_bytes=8 << 20)
    try:
        keys = [okey(i) for i in range(2000)]
        sizes = []
        for _ in range(5):
            _fill(core, keys)
            sizes.append(core._native.mem_bytes())
            assert core.delete_many([k.encoded for k in keys], force=True) == [True] * len(keys)
            # emptied: the slabs but the newest (at most 64 KiB) went back to the system
            assert core._native.mem_bytes() < sizes[-1] - 32 * 1024
        assert max(sizes) == min(sizes), sizes
        # half the keys deleted and put back again: blobs are reused, not added
        _fill(core, keys)
        full = core._native.mem_bytes()
        half = [k.encoded for k in keys[::2]]
        assert core.delete_many(half, force=True) == [True] * len(half)
        _fill(core, keys[::2])
        assert core._native.mem_bytes() <= full
        assert core.exists_many([k.encoded for k in keys]) == [True] * len(keys)
    finally:
        core.close()
