"""How put_many / load_many_into reach a payload's bytes.

LMCache's TensorMemoryObj is read by the C side from ``raw_data.data_ptr()`` and
``get_size()`` (what its ``byte_array`` exposes) once the class is registered with
``_native._set_memobj_type``; anything else goes through the buffer protocol or
``byte_array``. These tests register a stand-in class with the same attributes, so they run
without torch; ``tests/conformance/test_core_lmcache.py`` covers the real class.
"""

from __future__ import annotations

import ctypes

import pytest

from core_helpers import Meta, Obj, make_core, make_device, okey, payload
from lmcache_rawblock import _native
from lmcache_rawblock.raw_block import _lmcache


class FakeTensor:
    """The few tensor attributes the C side reads, over a ctypes buffer."""

    def __init__(self, n: int, *, cpu=True, contiguous=True, nbytes=None):
        self.mem = (ctypes.c_ubyte * max(n, 1))()
        self.is_cpu = cpu
        self._contig = contiguous
        self.nbytes = n if nbytes is None else nbytes

    def is_contiguous(self):
        return self._contig

    def data_ptr(self):
        return ctypes.addressof(self.mem)


class FakeMemObj:
    def __init__(self, data: bytes | int, size=None, **tensor_kw):
        n = data if isinstance(data, int) else len(data)
        self.raw_data = FakeTensor(n, **tensor_kw)
        if not isinstance(data, int):
            ctypes.memmove(self.raw_data.mem, data, n)
        self._size = n if size is None else size
        self.metadata = Meta(shape=(n,))
        self.byte_array_calls = 0

    def get_size(self):
        return self._size

    @property
    def byte_array(self):
        self.byte_array_calls += 1
        return memoryview(self.raw_data.mem).cast("B")[: self._size]

    def bytes(self) -> bytes:
        return bytes(self.raw_data.mem)[: self._size]


@pytest.fixture
def registered():
    _native._set_memobj_type(FakeMemObj)
    try:
        yield FakeMemObj
    finally:
        # back to what the package registered at import (LMCache's class, or nothing)
        _native._set_memobj_type(_lmcache.TensorMemoryObj)


@pytest.fixture(params=["posix", "io_uring"])
def core(request, tmp_path):
    c = make_core(make_device(tmp_path), io_engine=request.param)
    yield c
    c.close()


def test_registered_memobj_round_trip_without_byte_array(core, registered):
    keys = [okey(i) for i in range(5)]
    src = [FakeMemObj(payload(i, 1000 + 37 * i)) for i in range(5)]
    assert core.put_many(keys, src).results == [True] * 5
    dst = [FakeMemObj(len(s.bytes())) for s in src]
    assert core.load_many_into([k.encoded for k in keys], dst) == [True] * 5
    assert [d.bytes() for d in dst] == [s.bytes() for s in src]
    # the fast path never built a byte_array
    assert sum(o.byte_array_calls for o in src + dst) == 0


def test_registered_memobj_uses_get_size_not_the_whole_tensor(core, registered):
    # The tensor is larger than the logical size (allocator padding): only get_size() bytes
    # are stored, as byte_array would expose.
    k = okey(1)
    src = FakeMemObj(payload(1, 4096), size=1000)
    assert core.put_many([k], [src]).results == [True]
    assert core.get_metadata_many([k.encoded])[0] is not None
    dst = FakeMemObj(1000)
    assert core.load_many_into([k.encoded], [dst]) == [True]
    assert dst.bytes() == payload(1, 4096)[:1000]


def test_unregistered_class_goes_through_byte_array(core):
    k = okey(2)
    src = FakeMemObj(payload(2, 3000))
    assert core.put_many([k], [src]).results == [True]
    assert src.byte_array_calls == 1


def test_replaced_byte_array_property_turns_the_fast_path_off(core, registered, monkeypatch):
    # A class whose byte_array was replaced after registration is read through the new one.
    monkeypatch.setattr(FakeMemObj, "byte_array", property(lambda self: memoryview(b"X" * self._size)))
    k = okey(3)
    src = FakeMemObj(payload(3, 512))
    assert core.put_many([k], [src]).results == [True]
    dst = Obj(512)
    assert core.load_many_into([k.encoded], [dst]) == [True]
    assert dst.bytes() == b"X" * 512


def test_subclass_is_not_taken_for_the_registered_class(core, registered):
    class Sub(FakeMemObj):
        @property
        def byte_array(self):
            self.byte_array_calls += 1
            return memoryview(b"S" * self._size)

    k = okey(4)
    src = Sub(payload(4, 256))
    assert core.put_many([k], [src]).results == [True]
    assert src.byte_array_calls == 1
    dst = Obj(256)
    assert core.load_many_into([k.encoded], [dst]) == [True]
    assert dst.bytes() == b"S" * 256


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(cpu=False), "payload 1: raw_data must be a contiguous tensor in host memory"),
        (dict(contiguous=False), "payload 1: raw_data must be a contiguous tensor in host memory"),
        (dict(nbytes=100), "payload 1: get_size() = 512 exceeds raw_data's 100 bytes"),
    ],
)
def test_unusable_tensor_is_refused_before_any_io(core, registered, kw, msg):
    keys = [okey(10), okey(11)]
    objs = [FakeMemObj(payload(10, 512)), FakeMemObj(payload(11, 512), **kw)]
    with pytest.raises(ValueError) as ei:
        core.put_many(keys, objs)
    assert str(ei.value) == msg
    # nothing was stored or left in flight
    assert core.exists_many([k.encoded for k in keys]) == [False, False]
    assert core.report_status()["inflight_key_count"] == 0
    with pytest.raises(ValueError) as ei:
        core.load_many_into([k.encoded for k in keys], objs)
    assert str(ei.value) == msg


def test_payload_without_buffer_or_byte_array_is_a_type_error(core):
    with pytest.raises(TypeError, match=r"payload 0: object has neither the buffer protocol nor byte_array"):
        core.put_many([okey(20)], [object()])
    with pytest.raises(TypeError, match=r"payload 0: object has neither the buffer protocol nor byte_array"):
        core.load_many_into([okey(20).encoded], [object()])


def test_buffer_protocol_objects_still_work(core):
    k = okey(30)
    data = payload(30, 777)

    class WithMeta(bytearray):
        metadata = Meta(shape=(777,))

    assert core.put_many([k], [WithMeta(data)]).results == [True]
    out = bytearray(777)
    assert core._native.load_many_into([k.encoded], [out])[0] == [True]
    assert bytes(out) == data


def test_set_memobj_type_rejects_non_classes():
    with pytest.raises(TypeError, match="_set_memobj_type expects a class or None, got int"):
        _native._set_memobj_type(3)


def test_shape_of_any_sequence_is_converted_with_int(core):
    # Only torch.Size goes to C as it is; other shapes keep int() per dimension.
    k = okey(40)
    src = Obj(payload(40, 600), shape=(2.0, "300"))
    assert core.put_many([k], [src]).results == [True]
    assert tuple(core.get_metadata_many([k.encoded])[0].shape) == (2, 300)


def test_metadata_classes_alternating_within_a_batch_stay_per_key(tmp_path):
    # Keys of a batch share their metadata class through a one-entry cache in the core; keys
    # whose shape, dtype or format differ in one field only (or are null) must each keep their
    # own, in the index and after a checkpoint and reopen.
    base = dict(shape=(2, 300), dtype="uint8", fmt="BINARY")
    changes = [dict(fmt="KV_2LTD"), dict(shape=(300, 2)), dict(dtype="int8"), dict(shape=None), dict(dtype=None),
               dict(fmt=None), dict(shape=(2, 300, 1)), dict(shape=(2, 301))]
    metas = [Meta(**base), Meta(**base)]
    for ch in changes:  # each differs from the key before it in one field, then back
        metas += [Meta(**{**base, **ch}), Meta(**base)]
    keys = [okey(100 + i) for i in range(len(metas))]
    objs = []
    for i, m in enumerate(metas):
        o = Obj(payload(100 + i, 600))
        o.metadata = m
        objs.append(o)
    dev = make_device(tmp_path)
    core = make_core(dev)
    assert core.put_many(keys, objs).results == [True] * len(keys)

    def seen(c):
        got = c.get_metadata_many([k.encoded for k in keys])
        return [(None if g.shape is None else tuple(g.shape), None if g.dtype is None else str(g.dtype),
                 getattr(g.fmt, "name", g.fmt)) for g in got]

    want = [(m.shape, m.dtype, m.fmt) for m in metas]
    assert seen(core) == want
    core.checkpoint_now()
    core.close()
    again = make_core(dev)
    try:
        assert seen(again) == want
    finally:
        again.close()
