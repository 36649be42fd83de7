"""put_many reading each payload's metadata in C, and load_many_into setting cached positions in C.

The facade hands the binding ``_meta_names`` instead of one ``_meta_of`` tuple per key; the C
side then reads ``metadata`` / ``dtype`` / ``fmt`` / ``shape`` / ``cached_positions`` itself.
These tests hold that path to the Python one (``_meta_of``, kept as the reference): the same
stored metadata for ordinary and odd objects, the same exception type and text for bad ones,
the namer's cache, and the positions load_many_into sets back on the objects.
"""

from __future__ import annotations

import enum
import gc
import sys

import pytest

from core_helpers import Meta, Obj, make_core, make_device, okey, payload
from lmcache_rawblock.raw_block import core as core_mod
from lmcache_rawblock.raw_block._lmcache import positions_from_list, torch

N = 512


@pytest.fixture
def core(tmp_path):
    c = make_core(make_device(tmp_path))
    yield c
    c.close()


class Fmt(enum.Enum):
    KV_2LTD = 1


class Unhashable:
    """A dtype stand-in without a hash: converted through str() on every put."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return self.name


class Positions:
    """cached_positions with a tolist(), as a tensor has."""

    def __init__(self, values):
        self.values = values

    def tolist(self):
        return list(self.values)


class NoMeta:
    """A payload without a metadata attribute."""

    def __init__(self, data: bytes):
        self.byte_array = memoryview(bytearray(data))


class Plain:
    """Any metadata object: only the attributes given exist."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def obj_with(meta) -> Obj:
    o = Obj(N)
    o.metadata = meta
    return o


def _stored(core, key):
    (t,) = core._native.get_metadata_many([key])
    return t[1:]  # without the offset


def _put_both(core, i, make):
    """Put make() under two keys, through the tuple path and through the namer path (a fresh
    object each); their stored metadata (size, shape, dtype, fmt, positions)."""
    ka, kb = ek(2 * i), ek(2 * i + 1)
    nat = core._native
    o = make()
    ra, _, _ = nat.put_many([ka], [1], [o], [None], [core_mod._meta_of(o)])
    rb, _, _ = nat.put_many([kb], [2], [make()], [None], core_mod._meta_names)
    assert ra == rb == [True]
    return _stored(core, ka), _stored(core, kb)


ODD = [
    pytest.param(lambda: Obj(N), id="plain"),
    pytest.param(lambda: NoMeta(b"x" * N), id="no-metadata-attribute"),
    pytest.param(lambda: obj_with(None), id="metadata-None"),
    pytest.param(lambda: obj_with(Plain()), id="metadata-without-fields"),
    pytest.param(lambda: obj_with(Meta(shape=[2, 3], dtype="float16", fmt=Fmt.KV_2LTD)), id="enum-fmt"),
    pytest.param(lambda: obj_with(Meta(shape=(4,), dtype="torch.bfloat16", fmt="KV_T2D")), id="torch-prefixed"),
    pytest.param(lambda: obj_with(Meta(shape=(1, 2, 3, 4, 5, 6, 7, 8), dtype=None, fmt=None)), id="8-dims"),
    pytest.param(lambda: obj_with(Meta(shape=tuple(range(1, 12)))), id="11-dims"),
    pytest.param(lambda: obj_with(Meta(shape=tuple(range(1, 40)))), id="39-dims"),
    pytest.param(lambda: obj_with(Meta(shape=())), id="0-dims"),
    pytest.param(lambda: obj_with(Meta(shape=iter([5, 6]))), id="shape-iterator"),
    pytest.param(lambda: obj_with(Meta(shape=[2.9, "7", True])), id="shape-int-conversions"),
    pytest.param(lambda: obj_with(Meta(shape=[-1, 2**63 - 1])), id="shape-extremes"),
    pytest.param(lambda: obj_with(Meta(dtype=Unhashable("odd"))), id="unhashable-dtype"),
    pytest.param(lambda: obj_with(Meta(dtype=3.5, fmt=7)), id="non-str-dtype-fmt"),
    pytest.param(lambda: obj_with(Meta(cached_positions=[3, 1, 2])), id="positions-list"),
    pytest.param(lambda: obj_with(Meta(cached_positions=())), id="positions-empty"),
    pytest.param(lambda: obj_with(Meta(cached_positions=Positions(range(300)))), id="positions-tolist"),
    pytest.param(lambda: obj_with(Meta(cached_positions=(7.0, "8"))), id="positions-int-conversions"),
]


@pytest.mark.parametrize("make", ODD)
def test_namer_path_stores_what_the_tuple_path_stores(core, make):
    a, b = _put_both(core, 0, make)
    assert a == b


def test_namer_path_stores_torch_metadata_like_the_tuple_path(core):
    if torch is None:
        pytest.skip("torch is not installed: torch.Size and tensor positions need it")
    m = Meta(shape=torch.Size([2, 16, 8]), dtype=torch.float16, fmt="KV_2LTD",
             cached_positions=torch.tensor([4, 5, 6], dtype=torch.int64))
    a, b = _put_both(core, 0, lambda: obj_with(m))
    assert a == b
    assert list(b[1]) == [2, 16, 8] and b[2] == "half" and b[4] == [4, 5, 6]


BAD = [
    pytest.param(lambda: Meta(shape=5), id="shape-not-iterable"),
    pytest.param(lambda: Meta(shape=[1, None]), id="shape-None-dimension"),
    pytest.param(lambda: Meta(shape=["x"]), id="shape-not-a-number"),
    pytest.param(lambda: Meta(shape=[2**64]), id="shape-overflow"),
    pytest.param(lambda: Meta(cached_positions=5), id="positions-not-iterable"),
    pytest.param(lambda: Meta(cached_positions=[object()]), id="positions-bad-item"),
    pytest.param(lambda: Meta(cached_positions=[-(2**63) - 1]), id="positions-overflow"),
]


@pytest.mark.parametrize("make", BAD)
def test_bad_metadata_raises_as_the_tuple_path(core, make):
    o = obj_with(make())
    with pytest.raises(Exception) as want:
        core._native.put_many([ek(1)], [1], [o], [None], [core_mod._meta_of(o)])
    with pytest.raises(Exception) as got:
        core.put_many([_spec(1)], [o])
    assert type(got.value) is type(want.value)
    assert str(got.value) == str(want.value)
    assert core.indexed_key_count() == 0 and core.report_status()["inflight_key_count"] == 0


def _spec(i):
    return okey(i)


def ek(i):
    return okey(i).encoded


class Raising:
    def __init__(self, exc):
        self.exc = exc
        self.byte_array = memoryview(bytearray(N))

    @property
    def metadata(self):
        raise self.exc


def test_metadata_property_errors_propagate_and_attribute_errors_mean_none(core):
    with pytest.raises(RuntimeError, match="boom"):
        core.put_many([_spec(1)], [Raising(RuntimeError("boom"))])
    assert core.indexed_key_count() == 0
    res = core.put_many([_spec(2)], [Raising(AttributeError("metadata"))])
    assert res.results == [True]
    assert _stored(core, ek(2)) == (N, None, None, None, None)


def test_bad_metadata_after_good_keys_stores_nothing_and_takes_no_payload(core):
    objs = [Obj(payload(i, N)) for i in range(3)] + [obj_with(Meta(shape=object()))]
    with pytest.raises(TypeError):
        core.put_many([_spec(i) for i in range(4)], objs)
    assert core.indexed_key_count() == 0
    res = core.put_many([_spec(i) for i in range(3)], objs[:3])
    assert res.results == [True] * 3


def test_namer_is_asked_once_per_cacheable_pair(core):
    calls = []

    def namer(dtype, fmt):
        calls.append((dtype, fmt))
        return core_mod._meta_names(dtype, fmt)

    objs = [obj_with(Meta(dtype="float16", fmt=Fmt.KV_2LTD)) for _ in range(8)]
    objs += [obj_with(Meta(dtype="int8", fmt=Fmt.KV_2LTD)) for _ in range(8)]
    nat = core._native
    for rnd in range(3):
        keys = [ek(100 * rnd + i) for i in range(len(objs))]
        assert nat.put_many(keys, list(range(len(objs))), objs, [None] * len(objs), namer)[0] == [True] * 16
    assert calls == [("float16", Fmt.KV_2LTD), ("int8", Fmt.KV_2LTD)]
    assert _stored(core, ek(215))[2:4] == ("int8", "KV_2LTD")


def test_uncacheable_pairs_are_named_every_time_and_kept_alive(core):
    calls = []

    def namer(dtype, fmt):
        calls.append(dtype)
        # fresh strings each time: only the call holds them while the core runs
        return "".join(["dt", str(len(calls))]), "".join(["fm", str(len(calls))]), False

    objs = [obj_with(Meta(dtype=Unhashable("u"))) for _ in range(5)]
    res, stored, _ = core._native.put_many([ek(i) for i in range(5)], list(range(5)), objs, [None] * 5, namer)
    assert res == [True] * 5 and len(calls) == 5
    gc.collect()
    assert [_stored(core, ek(i))[2:4] for i in range(5)] == [(f"dt{i}", f"fm{i}") for i in range(1, 6)]


def test_a_second_namer_is_not_answered_from_the_first_ones_names(core):
    nat = core._native
    o = obj_with(Meta(dtype="float16", fmt="KV_2LTD"))
    nat.put_many([ek(1)], [1], [o], [None], lambda d, f: ("first", "F", True))
    nat.put_many([ek(2)], [2], [o], [None], lambda d, f: ("second", "S", True))
    assert _stored(core, ek(1))[2:4] == ("first", "F")
    assert _stored(core, ek(2))[2:4] == ("second", "S")


@pytest.mark.parametrize("answer, exc", [
    (("a", "b"), TypeError),
    (["a", "b", True], TypeError),
    ((1, "b", True), TypeError),
    (("a", 2, True), TypeError),
])
def test_namer_answers_of_the_wrong_form_raise(core, answer, exc):
    with pytest.raises(exc):
        core._native.put_many([ek(1)], [1], [Obj(N)], [None], lambda d, f: answer)
    assert core.indexed_key_count() == 0


def test_namer_exceptions_propagate(core):
    def namer(d, f):
        raise KeyError("no name")

    with pytest.raises(KeyError, match="no name"):
        core._native.put_many([ek(1)], [1], [Obj(N)], [None], namer)
    assert core.indexed_key_count() == 0


class Shrinking:
    """A metadata property that empties the list of payloads it was passed in."""

    def __init__(self, victims):
        self.victims = victims
        self.byte_array = memoryview(bytearray(payload(9, N)))

    @property
    def metadata(self):
        self.victims.clear()
        return None


def test_payload_list_changed_by_metadata_reads_is_safe(core):
    objs = [Obj(payload(i, N)) for i in range(4)]
    objs.insert(1, Shrinking(objs))
    res, _, _ = core._native.put_many([ek(i) for i in range(5)], list(range(5)), objs, [None] * 5,
                                      core_mod._meta_names)
    assert res == [True] * 5
    assert objs == []


def test_namer_entries_survive_the_pairs_going_away(core):
    nat = core._native
    for rnd in range(40):  # more distinct pairs than the core keeps
        dt = "".join(["dtype", str(rnd)])
        o = obj_with(Meta(dtype=dt, fmt=Fmt.KV_2LTD))
        assert nat.put_many([ek(rnd)], [rnd], [o], [None], core_mod._meta_names)[0] == [True]
        del o, dt
        gc.collect()
    assert [_stored(core, ek(r))[2] for r in (0, 15, 16, 39)] == ["dtype0", "dtype15", "dtype16", "dtype39"]


# ---- load_many_into: positions set in C ---------------------------------------------------


def test_load_sets_positions_on_loaded_objects_only(core):
    objs = [obj_with(Meta(cached_positions=[9, 8, 7])), obj_with(Meta()), Obj(payload(2, N))]
    objs[2].byte_array[:] = payload(2, N)
    core.put_many([_spec(i) for i in range(3)], objs)
    dst = [obj_with(Meta(cached_positions="stale")) for _ in range(4)] + [NoMeta(bytes(N)), obj_with(None)]
    keys = [ek(0), ek(1), ek(2), ek(77), ek(0), ek(1)]
    got = core.load_many_into(keys, dst)
    assert got == [True, True, True, False, True, True]
    want = positions_from_list([9, 8, 7])
    p0 = dst[0].metadata.cached_positions
    assert (p0.tolist() if hasattr(p0, "tolist") else p0) == [9, 8, 7]
    assert type(p0) is type(want)
    assert dst[1].metadata.cached_positions is None
    assert dst[2].metadata.cached_positions is None
    assert dst[3].metadata.cached_positions == "stale"  # a miss leaves the object alone
    assert bytes(dst[2].byte_array) == payload(2, N)
    assert dst[5].metadata is None


def test_load_native_result_forms(core):
    o = obj_with(Meta(cached_positions=[1, 2]))
    core.put_many([_spec(1)], [o])
    nat = core._native
    d = [obj_with(Meta()), obj_with(Meta())]
    results, positions, errors = nat.load_many_into([ek(1), ek(2)], d)
    assert (results, positions, errors) == ([True, False], [[1, 2], None], [None, None])
    assert d[0].metadata.cached_positions is None  # the three-list form sets nothing
    assert nat.load_many_into([ek(1), ek(2)], d, lambda p: ("conv", p)) == ([True, False], None)
    assert d[0].metadata.cached_positions == ("conv", [1, 2])
    with pytest.raises(TypeError, match="set_positions"):
        nat.load_many_into([ek(1)], d[:1], 5)


def test_load_errors_are_listed_per_key(core):
    core.put_many([_spec(i) for i in range(2)], [Obj(payload(i, N)) for i in range(2)])
    small = obj_with(Meta())
    small.byte_array = memoryview(bytearray(N // 2))
    d = [obj_with(Meta()), small]
    results, errors = core._native.load_many_into([ek(0), ek(1)], d, positions_from_list)
    assert results == [True, False]
    assert errors[0] is None and isinstance(errors[1], ValueError) and "too small" in str(errors[1])
    with pytest.raises(ValueError, match="too small"):
        core.load_many_into([ek(0), ek(1)], d, raise_on_error=True)
    assert core.load_many_into([ek(0), ek(1)], d) == [True, False]


def test_load_positions_converter_errors_propagate_after_the_reads(core):
    core.put_many([_spec(1)], [obj_with(Meta(cached_positions=[5]))])
    d = [obj_with(Meta())]

    def conv(p):
        raise RuntimeError("conv failed")

    with pytest.raises(RuntimeError, match="conv failed"):
        core._native.load_many_into([ek(1)], d, conv)
    assert bytes(d[0].byte_array) == bytes(N)  # Obj(N) stored zeros; the read itself ran
    assert core.report_status()["inflight_io_count"] == 0


class FrozenMeta:
    __slots__ = ()


def test_load_positions_setattr_errors_propagate(core):
    core.put_many([_spec(1)], [Obj(N)])
    with pytest.raises(AttributeError):
        core.load_many_into([ek(1)], [obj_with(FrozenMeta())])


def test_put_and_load_hold_no_references(core):
    o = obj_with(Meta(shape=[3, 4], dtype="float16", fmt=Fmt.KV_2LTD, cached_positions=[1]))
    d = obj_with(Meta())
    for i in range(3):  # warm the name entries
        core.put_many([_spec(i)], [o])
    before = (sys.getrefcount(o), sys.getrefcount(o.metadata), sys.getrefcount(d), sys.getrefcount(d.metadata))
    for i in range(3, 50):
        core.put_many([_spec(i)], [o])
        core.load_many_into([ek(i)], [d])
    after = (sys.getrefcount(o), sys.getrefcount(o.metadata), sys.getrefcount(d), sys.getrefcount(d.metadata))
    assert after == before


# ---- the metadata shortcut: obj.meta read directly for a checked class ---------------------


class Locked:
    """A MemoryObj stand-in whose metadata property counts its calls (as LMCache's takes a lock)."""

    calls = 0

    def __init__(self, meta):
        self.meta = meta
        self.byte_array = memoryview(bytearray(payload(3, N)))

    @property
    def metadata(self):
        type(self).calls += 1
        return self.meta


class LockedChild(Locked):
    pass


@pytest.fixture
def shortcut_core(core):
    Locked.calls = 0
    core._native._set_metadata_shortcut(Locked, Locked.__dict__["metadata"], "meta")
    yield core
    core._native._set_metadata_shortcut(None, None, None)


def test_shortcut_reads_meta_without_the_property(shortcut_core):
    core = shortcut_core
    objs = [Locked(Meta(shape=[4, 2], dtype="float16", cached_positions=[i])) for i in range(3)]
    assert core.put_many([_spec(i) for i in range(3)], objs).results == [True] * 3
    dst = [Locked(Meta()) for _ in range(3)]
    assert core.load_many_into([ek(i) for i in range(3)], dst) == [True] * 3
    assert Locked.calls == 0
    assert [_stored(core, ek(i))[1:3] for i in range(3)] == [((4, 2), "float16")] * 3
    got = [d.meta.cached_positions for d in dst]
    assert [g.tolist() if hasattr(g, "tolist") else g for g in got] == [[0], [1], [2]]


def test_shortcut_falls_back_to_the_property(shortcut_core, monkeypatch):
    core = shortcut_core
    child = LockedChild(Meta(dtype="int8"))
    assert core.put_many([_spec(1)], [child]).results == [True]
    assert LockedChild.calls == 1  # a subclass: the property
    bare = Locked(Meta(dtype="int8"))
    del bare.meta
    bare.__dict__["other"] = 1
    calls = Locked.calls
    # no meta: the property is called, and its AttributeError means no metadata, as
    # getattr(obj, "metadata", None) has it
    assert core.put_many([_spec(2)], [bare]).results == [True]
    assert Locked.calls == calls + 1 and _stored(core, ek(2))[1:] == (None, None, None, None)
    monkeypatch.setattr(Locked, "metadata", property(lambda self: Meta(dtype="replaced")))
    assert core.put_many([_spec(3)], [Locked(Meta(dtype="int8"))]).results == [True]
    assert _stored(core, ek(3))[2] == "replaced"  # the class changed: the new property


def test_shortcut_is_offered_only_for_the_known_property_code(monkeypatch):
    class Same:
        @property
        def metadata(self):
            with self.lock:
                return self.meta

    class Other:
        @property
        def metadata(self):
            with self.lock:
                return self.meta_data

    monkeypatch.setattr(core_mod, "TensorMemoryObj", Same)
    assert core_mod._metadata_shortcut() == (Same, Same.__dict__["metadata"], "meta")
    monkeypatch.setattr(core_mod, "TensorMemoryObj", Other)
    assert core_mod._metadata_shortcut() is None
    monkeypatch.setattr(core_mod, "TensorMemoryObj", None)
    assert core_mod._metadata_shortcut() is None


def test_shortcut_argument_errors(core):
    with pytest.raises(TypeError):
        core._native._set_metadata_shortcut(Locked, None)
    with pytest.raises(TypeError):
        core._native._set_metadata_shortcut(5, None, "meta")
    with pytest.raises(TypeError):
        core._native._set_metadata_shortcut(Locked, None, 5)


def test_lmcache_tensor_memory_obj_gets_the_shortcut_and_round_trips(core):
    if core_mod.TensorMemoryObj is None:
        pytest.skip("LMCache is not installed: its TensorMemoryObj is what the shortcut is for")
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    assert core_mod._METADATA_SHORTCUT is not None

    def tobj(fill, pos=None):
        t = torch.full((N,), fill, dtype=torch.uint8)
        md = MemoryObjMetadata(shape=torch.Size([N]), dtype=torch.uint8, address=0, phy_size=N, ref_count=1,
                               fmt=MemoryFormat.KV_2LTD, cached_positions=pos)
        return TensorMemoryObj(raw_data=t, metadata=md, parent_allocator=None)

    src = [tobj(7, torch.tensor([3, 4], dtype=torch.int64)), tobj(9)]
    assert core.put_many([_spec(0), _spec(1)], src).results == [True, True]
    assert _stored(core, ek(0))[1:] == ((N,), "uint8", "KV_2LTD", [3, 4])
    dst = [tobj(0, torch.tensor([1])), tobj(0, torch.tensor([1]))]
    assert core.load_many_into([ek(0), ek(1)], dst) == [True, True]
    assert dst[0].metadata.cached_positions.tolist() == [3, 4]
    assert dst[1].metadata.cached_positions is None
    assert bytes(dst[1].byte_array) == bytes([9]) * N
