"""Looking at victim extents before taking one (``extent_peek``, ``extent_take``): what prefix
weighted extent eviction chooses among. Both metadata formats; nothing timed."""

from __future__ import annotations

import pytest

from core_helpers import Obj, make_core, make_device
from core.test_extents import EXT, FORMATS, PER, extents, put


@pytest.mark.parametrize("fmt", FORMATS)
def test_peek_ranks_the_closed_extents_without_using_them_and_take_takes_one(tmp_path, fmt):
    core = make_core(make_device(tmp_path), meta_format=fmt, extent_bytes=EXT)
    try:
        keys = put(core, list(range(4 * PER)))  # extents 0, 1, 2 closed, 3 open
        assert core.load_many_into([keys[0].encoded], [Obj(1000)]) == [True]  # a hit: hot, not younger
        order = [e for e, _, _ in core.extent_peek(3)]
        assert order == [0, 1, 2], "extents rank by fill order; a load does not keep one"
        assert [e for e, _, _ in core.extent_peek(5)] == order, "the open extent is no candidate"
        assert [e for e, _, _ in core.extent_peek(2)] == [0, 1], "the oldest first, count of them"
        peeked = {e: (sorted(k), h) for e, k, h in core.extent_peek(3)}
        assert peeked[1] == (sorted(k.encoded for k in keys[PER:2 * PER]), [False] * PER)
        assert peeked[0][1].count(True) == 1, "the loaded key is marked hot"
        assert [e for e, _, _ in core.extent_peek(3)] == order, "a peek does not count as a fill"
        assert extents(core)["extents_evicted"] == 0
        ext, victims, hot = core.extent_take(1)
        assert ext == 1 and sorted(victims) == sorted(k.encoded for k in keys[PER:2 * PER])
        assert hot == [False] * PER
        assert extents(core)["extents_evicted"] == 1
        assert [e for e, _, _ in core.extent_peek(3)] == [0, 2, 1], "a taken extent counts as just filled"
        assert [e for e, _, _ in core.extent_peek(2)] == [0, 2], "the two oldest, not the two lowest"
        ext, _, hot = core.extent_victim()
        assert ext == 0 and hot[0] is True, "the victim is still the oldest; its loaded key is marked hot"
        assert core.extent_take(3) is None and core.extent_take(1 << 20) is None
        with pytest.raises(ValueError, match=r"extent_take takes an integer in \[0, .*got -1"):
            core.extent_take(-1)
        for bad in (0, 65, -1):
            with pytest.raises(ValueError, match=rf"extent_peek takes a count of candidates in \[1, 64\], got {bad}"):
                core.extent_peek(bad)
    finally:
        core.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_victim_order_use_lets_a_load_keep_its_extent(tmp_path, fmt):
    """extent_victim_order use: a load hit makes its extent the newest, as a put does (fill:
    it only marks the key hot; the test above)."""
    core = make_core(make_device(tmp_path), meta_format=fmt, extent_bytes=EXT, extent_victim_order="use")
    try:
        keys = put(core, list(range(4 * PER)))  # extents 0, 1, 2 closed, 3 open
        assert core.load_many_into([keys[0].encoded], [Obj(1000)]) == [True]  # extent 0 used last
        assert [e for e, _, _ in core.extent_peek(3)] == [1, 2, 0]
        assert core.extent_victim()[0] == 1
    finally:
        core.close()
    with pytest.raises(ValueError, match=r"extent_victim_order must be one of: fill, use; got 'lru'"):
        make_core(make_device(tmp_path, name="b.img"), extent_bytes=EXT, extent_victim_order="lru")


def test_peek_and_take_need_extents(tmp_path):
    core = make_core(make_device(tmp_path), meta_format="log")
    try:
        with pytest.raises(RuntimeError, match="extent_peek needs extents"):
            core.extent_peek(1)
        with pytest.raises(RuntimeError, match="extent_take needs extents"):
            core.extent_take(0)
    finally:
        core.close()
