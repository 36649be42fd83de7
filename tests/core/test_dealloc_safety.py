"""Deallocation of freed slots (deallocate_freed, csrc/core/rb_core_dealloc.c) never reaches a
slot that metadata on the device may still list: a crash before the metadata that drops the
slot's key is durable must find the key's bytes where they were. The crash harnesses
(tests/reliability, tests/RELIABILITY.md) cover deletes; this covers a state applied at run
time (LMCache's apply_loaded_state), which leaves the device's metadata listing keys the new
index no longer holds until the next checkpoint."""

from __future__ import annotations

import shutil

import pytest

from core_helpers import META, SLOT, Obj, base_state, make_core, make_device, okey, payload


def _entry(off, size):
    return {"offset": off, "size": size, "shape": None, "dtype": None, "fmt": None, "cached_positions": None}


def _load(core, k, n):
    o = Obj(n)
    ok, _pos, _err = core._native.load_many_into([k.encoded], [o])
    return o.bytes() if ok[0] else None


@pytest.mark.parametrize("meta_format", ["v1", "log"])
def test_a_state_applied_at_run_time_is_not_deallocated_before_a_checkpoint_drops_it(meta_format, tmp_path):
    dev = make_device(tmp_path)
    a, b = okey(0), okey(1)
    core = make_core(dev, meta_format=meta_format, deallocate_freed="on", load_checkpoint_on_init=False)
    try:
        assert core.put_many([a, b], [Obj(payload(0, 5000)), Obj(payload(1, 6000))]).results == [True, True]
        core.checkpoint_now()   # the device lists a and b
        off_a, off_b = core.entry_offset(a.encoded), core.entry_offset(b.encoded)
        assert core.apply_loaded_state(base_state(dev, 2, {a.encoded: _entry(off_a, 5000)}))
        core.delete_many([okey(9).encoded])   # deletes nothing; ends with a deallocation run
        # b's slot is free in the index, but the metadata on the device still lists b there
        assert core._native.status()["dealloc_slots"] == 0
        shutil.copy(dev, dev + ".crash")   # a power loss now
        if meta_format == "log":
            core.checkpoint_now()   # a whole base without b, durable: now its slot may go
        else:
            # format v1 frees a slot once both containers exclude its key (and the applied state
            # is clean: a checkpoint is written once something changed)
            for k in (2, 3):
                assert core.put_many([okey(k)], [Obj(payload(k, 100))]).results == [True]
                core.checkpoint_now()
        st = core._native.status()
        assert st["dealloc_slots"] == 1 and st["dealloc_pending_slots"] == 0
        with open(dev, "rb") as f:
            f.seek(off_b)
            assert f.read(SLOT) == bytes(SLOT)
    finally:
        core.close()
    # after the crash, b comes back with its own bytes, like any key whose removal no durable
    # metadata recorded
    shutil.copy(dev + ".crash", dev)
    core = make_core(dev, meta_format=meta_format, deallocate_freed="on")
    try:
        assert _load(core, a, 5000) == payload(0, 5000)
        assert _load(core, b, 6000) == payload(1, 6000)
        assert core.report_status()["recovery_dropped_entries"] == 0
    finally:
        core.close()
    assert off_b >= META
