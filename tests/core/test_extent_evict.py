"""The extent evictor's pass in one native call (``extent_evict``): victims taken in order
until the reserve of clean extents is met (at least ``batch`` of them), their keys deleted but
those a pin or a load holds, hot keys kept for the caller when asked, the deleted keys listed
when asked, and the reclaim that makes their slots reusable. Both metadata formats; nothing
timed."""

from __future__ import annotations

import pytest

from core_helpers import Obj, make_core, make_device
from core.test_extents import EXT, FORMATS, PER, extents, put


def clean(counts: dict) -> int:
    return counts["extents_clean"] + counts["extents_pending_dealloc"]


@pytest.fixture(params=FORMATS)
def full(request, tmp_path):
    """(core, fmt, encoded keys): every extent but the last closed and full, the last clean."""
    core = make_core(make_device(tmp_path), meta_format=request.param, extent_bytes=EXT)
    try:
        n = extents(core)["extents_total"]
        yield core, request.param, [k.encoded for k in put(core, list(range((n - 1) * PER)))]
    finally:
        core.close()


def test_a_pass_deletes_the_oldest_extents_keys_keeping_the_pinned_and_the_hot(full):
    core, _, enc = full
    assert core.load_many_into([enc[0]], [Obj(1000)]) == [True]  # extent 0's first key: hot
    assert core.exists_many([enc[PER + 1]], lock=True) == [True]  # a pin in extent 1
    got = core.extent_evict(3, keep_hot=True, keys=True, reclaim=True)  # one clean: two missing
    assert got.extents == 2 and got.error is None
    assert got.hot == [enc[0]], "the hot key is kept for the caller to put again"
    gone = set(enc[1:2 * PER]) - {enc[PER + 1]}
    assert sorted(got.gone) == sorted(gone) and got.deleted == len(gone)
    assert got.reclaimed == -1, "the caller deletes the hot keys first, then reclaims"
    assert all(core.exists_many([enc[0], enc[PER + 1]])), "hot and pinned keys are still stored"
    assert not any(core.exists_many(sorted(gone)))
    assert got.counts["extents_evicted"] == 2 == extents(core)["extents_evicted"]


def test_a_pass_stops_at_the_reserve_and_reclaims_what_it_freed(full):
    core, fmt, enc = full
    core.checkpoint_now()
    got = core.extent_evict(3, reclaim=True)
    assert got.extents == 2 and got.deleted == 2 * PER and got.gone is None and got.hot == []
    assert got.reclaimed >= 1 and got.error is None
    assert not any(core.exists_many(enc[:2 * PER])) and all(core.exists_many(enc[2 * PER:]))
    if fmt == "log":  # format v1's second container still lists the slots until a change
        assert clean(got.counts) == 3 == clean(core.extent_counts())
        again = core.extent_evict(3, reclaim=True)
        assert again.extents == 0 and again.deleted == 0, "the reserve is met: nothing more goes"


def test_a_pass_that_evicts_takes_at_least_batch_extents_and_none_when_the_reserve_is_met(full):
    core, _, enc = full
    assert core.extent_evict(1, batch=3).extents == 0, "the reserve is met: the batch does not apply"
    got = core.extent_evict(2, batch=3)  # one extent missing, three taken
    assert got.extents == 3 and got.deleted == 3 * PER
    assert not any(core.exists_many(enc[:3 * PER])) and all(core.exists_many(enc[3 * PER:]))


def test_a_pass_without_extents_or_with_a_bad_reserve_or_batch_says_so(tmp_path):
    core = make_core(make_device(tmp_path))
    try:
        with pytest.raises(RuntimeError, match="extent eviction needs extents: extent_bytes is 0"):
            core.extent_evict(1)
        for bad in (-1, 1 << 32, "2"):
            with pytest.raises((ValueError, TypeError), match=r"extent_evict takes a reserve in \[0, \d+\], got"):
                core.extent_evict(bad)
            with pytest.raises((ValueError, TypeError), match=r"extent_evict takes a batch in \[0, \d+\], got"):
                core.extent_evict(1, batch=bad)
    finally:
        core.close()
