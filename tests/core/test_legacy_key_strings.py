"""_native.encode_legacy_keys / delete_legacy_keys: LMCache's CacheEngineKey.to_string() in C.

The C fast path only applies to classes named ``lmcache.utils.CacheEngineKey`` /
``LayerCacheEngineKey`` whose ``to_string`` is their own; everything else goes through
``to_string()``. Without LMCache, the fast path is exercised with look-alike classes defined
here under the module name ``lmcache.utils`` (their ``to_string`` written from the documented
format, see ``_FAKE_SOURCE``); the tests marked ``lmcache`` (``make test-lmcache``) compare
against the real classes. Whether the fast path ran is observed by counting ``to_string``
calls with ``sys.setprofile``: the fast path calls it once per class and key shape (its check,
remembered across calls until the class changes or ``_native._forget_key_plans()``), the
fallback once per key.
"""

from __future__ import annotations

import random
import sys
import warnings

import pytest

from core_helpers import Obj, make_core, make_device
from lmcache_rawblock import _native
from lmcache_rawblock.raw_block import RawBlockKeySpec
from lmcache_rawblock.raw_block import _lmcache as standin

DTYPES = ["half", "bfloat16", "float", "double", "int8", "uint8", "int16", "int32", "int64", "bool",
          "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_e5m2", "fp8_e5m2fnuz"]

# Look-alikes of LMCache's key classes: same module and class names, slots dataclasses with the
# same fields; to_string implements the documented layout
# model@world@worker@<hash hex>@<dtype>[@layer][@k%v...].
_FAKE_SOURCE = '''
from dataclasses import dataclass, field

def _hash_hex(h):
    return h.hex() if isinstance(h, bytes) else format(h, "x")

def _tail(tags):
    if tags is None or len(tags) == 0:
        return ""
    return "".join("@" + str(k) + "%" + str(v) for k, v in tags)

@dataclass(slots=SLOTS)
class CacheEngineKey:
    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: int
    dtype: str
    request_configs: dict = None
    tags: tuple = field(init=False, default=None)
    _dtype_str: str = field(init=False, default="")

    def __post_init__(self):
        self._dtype_str = self.dtype
        cfg = self.request_configs or {}
        tags = [(k[len("lmcache.tag."):], v) for k, v in cfg.items() if k.startswith("lmcache.tag.")]
        self.tags = tuple(tags) if tags else None

    def to_string(self):
        return "@".join([str(self.model_name), str(self.world_size), str(self.worker_id),
                         _hash_hex(self.chunk_hash), str(self._dtype_str)]) + _tail(self.tags)

@dataclass(slots=SLOTS)
class LayerCacheEngineKey(CacheEngineKey):
    layer_id: int = 0

    def to_string(self):
        return "@".join([str(self.model_name), str(self.world_size), str(self.worker_id),
                         _hash_hex(self.chunk_hash), str(self._dtype_str), str(self.layer_id)]) + _tail(self.tags)
'''


def _fake_classes(slots: bool):
    ns = {"__name__": "lmcache.utils"}
    exec(compile(_FAKE_SOURCE.replace("SLOTS", str(slots)), "<fake lmcache.utils>", "exec", dont_inherit=True), ns)
    return ns["CacheEngineKey"], ns["LayerCacheEngineKey"]


FakeKey, FakeLayerKey = _fake_classes(slots=True)
DictFakeKey, DictFakeLayerKey = _fake_classes(slots=False)


class CountToString:
    """Counts Python-level calls of functions named to_string while active."""

    def __init__(self):
        self.n = 0

    def _prof(self, frame, event, arg):
        if event == "call" and frame.f_code.co_name == "to_string":
            self.n += 1

    def __enter__(self):
        self._old = sys.getprofile()
        sys.setprofile(self._prof)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._old)
        return False


def expected(keys):
    return [k if isinstance(k, str) else k.to_string() for k in keys]


def check(keys):
    got = _native.encode_legacy_keys(keys)
    exp = expected(keys)
    assert got == exp
    assert all(type(g) is type(e) for g, e in zip(got, exp))
    return got


# --------------------------------------------------------------------------- random keys

_ALPHABET = ["a", "Z", "0", "-", "_", "/", ".", "@", "%", " ", "é", "ß", "中", "文", "🙂", "\u0301", "\x00"]


def rand_model(rng):
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 24)))


def rand_hash(rng):
    kind = rng.randrange(8)
    if kind == 0:
        return rng.getrandbits(64)
    if kind == 1:
        return -rng.getrandbits(63) - 1
    if kind == 2:
        return rng.choice([0, 1, 15, 16, -1, 2**63 - 1, -2**63, 2**63, 2**64 - 1, 2**64, -2**64 - 1])
    if kind == 3:
        return rng.getrandbits(rng.randint(65, 300)) * rng.choice([1, -1])
    if kind == 4:
        return rng.randbytes(rng.choice([0, 1, 8, 32]))
    return rng.getrandbits(rng.randint(1, 64))


def rand_int(rng):
    return rng.choice([0, 1, 7, 9, 10, 255, -1, -10, 2**40, 2**63 - 1, -2**63, 2**63, 2**70, -2**70])


def rand_configs(rng):
    if rng.random() < 0.5:
        return rng.choice([None, {}, {"other": 1}])
    cfg = {}
    for _ in range(rng.randint(1, 3)):
        v = rng.choice([rand_model(rng), rand_model(rng), 7, None])
        cfg["lmcache.tag." + rand_model(rng)] = v
    return cfg


def rand_fake_keys(rng, n, key_cls=FakeKey, layer_cls=FakeLayerKey):
    keys = []
    for _ in range(n):
        args = (rand_model(rng), rand_int(rng), rand_int(rng), rand_hash(rng), rng.choice(DTYPES), rand_configs(rng))
        if rng.random() < 0.3:
            keys.append(layer_cls(*args, layer_id=rand_int(rng)))
        else:
            keys.append(key_cls(*args))
    return keys


@pytest.mark.parametrize("seed", range(4))
def test_fake_lmcache_keys_random(seed):
    check(rand_fake_keys(random.Random(seed), 800))


@pytest.mark.parametrize("seed", range(2))
def test_fake_lmcache_keys_without_slots_random(seed):
    check(rand_fake_keys(random.Random(100 + seed), 400, DictFakeKey, DictFakeLayerKey))


def test_fast_path_is_taken_for_lmcache_shaped_keys():
    _native._forget_key_plans()
    keys = [FakeKey("m", 1, 0, i, "bfloat16") for i in range(50)]
    with CountToString() as c:
        got = _native.encode_legacy_keys(keys)
    assert got == expected(keys)
    assert c.n == 1, "one to_string() to check the first key, none for the others"
    # each (type, hash kind, tags or not) combination is checked once: here the three new ones
    mixed = keys + [FakeKey("m", 1, 0, b"\x01\x02", "half"),
                    FakeKey("m", 1, 0, 5, "half", {"lmcache.tag.a": "b"}),
                    FakeLayerKey("m", 1, 0, 5, "half", layer_id=3)] * 3
    with CountToString() as c:
        got = _native.encode_legacy_keys(mixed)
    assert got == expected(mixed)
    assert c.n == 3
    # later calls reuse the checked plans
    want = expected(mixed)
    with CountToString() as c:
        got = _native.encode_legacy_keys(mixed)
    assert got == want
    assert c.n == 0
    _native._forget_key_plans()
    with CountToString() as c:
        got = _native.encode_legacy_keys(mixed)
    assert got == want
    assert c.n == 4


def test_cached_plan_is_rechecked_when_the_class_changes():
    """A plan is reused only while the class (its version tag) and to_string's code are the
    ones it was checked against."""
    ns = {"__name__": "lmcache.utils"}
    exec(compile(_FAKE_SOURCE.replace("SLOTS", "True"), "<own lmcache.utils>", "exec", dont_inherit=True), ns)
    K = ns["CacheEngineKey"]
    keys = [K("m", 1, 0, i, "half") for i in range(4)]
    want = expected(keys)
    with CountToString() as c:
        got = [_native.encode_legacy_keys(keys), _native.encode_legacy_keys(keys)]
    assert got == [want, want]
    assert c.n == 1
    K.unrelated = 1  # any change to the class invalidates its version tag
    with CountToString() as c:
        got = _native.encode_legacy_keys(keys)
    assert got == want
    assert c.n == 1
    # same function object, different code: re-checked, the mismatch is found and warned
    alt = {"__name__": "lmcache.utils"}
    exec(compile(_FAKE_SOURCE.replace("SLOTS", "True").replace('"@".join([', '"#".join(['),
                 "<alt lmcache.utils>", "exec", dont_inherit=True), alt)
    K.to_string.__code__ = alt["CacheEngineKey"].to_string.__code__
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = _native.encode_legacy_keys(keys)
    assert got == [f"m#1#0#{i:x}#half" for i in range(4)]
    assert any(issubclass(x.category, RuntimeWarning) for x in w)
    with CountToString() as c:
        got = _native.encode_legacy_keys(keys)
    assert got == [f"m#1#0#{i:x}#half" for i in range(4)]
    assert c.n == 4, "the class now stays on to_string()"


def test_known_values():
    assert check([FakeKey("llama", 2, 1, 0x1f, "bfloat16")]) == ["llama@2@1@1f@bfloat16"]
    assert check([FakeKey("m", 1, 0, -0x1f, "half")]) == ["m@1@0@-1f@half"]
    assert check([FakeKey("m", 1, 0, -2**63, "half")]) == ["m@1@0@-8000000000000000@half"]
    assert check([FakeKey("m", 1, 0, 2**64, "half")]) == ["m@1@0@10000000000000000@half"]
    assert check([FakeKey("m", 1, 0, b"\x00\xab", "half")]) == ["m@1@0@00ab@half"]
    assert check([FakeKey("m", 1, 0, b"", "half")]) == ["m@1@0@@half"]
    assert check([FakeLayerKey("m", 1, 0, 10, "half", {"lmcache.tag.t": "v", "lmcache.tag.u": "w"}, layer_id=7)]) \
        == ["m@1@0@a@half@7@t%v@u%w"]
    assert check([FakeKey("m@é", 1, 0, 0, "half", {"lmcache.tag.ü": "%@"})]) == ["m@é@1@0@0@half@ü%%@"]


def test_tags_empty_tuple_and_odd_shapes_fall_back_correctly():
    k = FakeKey("m", 1, 0, 1, "half")
    k.tags = ()
    check([k])
    k2 = FakeKey("m", 1, 0, 1, "half")
    k2.tags = (("a", 1), ("b", None))  # not str: to_string() formats them
    k3 = FakeKey("m", 1, 0, 1, "half")
    k3.tags = [("a", "b")]  # a list, not a tuple
    k4 = FakeKey("m", 1, 0, 1, "half")
    k4.tags = (("a", "b", "c"),)  # to_string() raises on unpacking
    check([k, k2, k3])
    with pytest.raises(ValueError):
        _native.encode_legacy_keys([k4])


class StrSub(str):
    pass


class IntSub(int):
    def __format__(self, spec):
        return "sub"

    def __str__(self):
        return "sub"


def test_unusual_field_types_take_to_string():
    keys = [FakeKey(StrSub("m"), 1, 0, 1, "half"), FakeKey("m", True, 0, 1, "half"),
            FakeKey("m", 1, IntSub(3), 1, "half"), FakeKey("m", 1, 0, IntSub(3), "half"),
            FakeKey("m", 1, 0, 1, StrSub("half")),
            FakeLayerKey("m", 1, 0, 1, "half", layer_id=False), FakeKey("m", 1.5, 0, 1, "half"),
            FakeKey(3, 1, 0, 1, "half")]
    check(keys)
    with pytest.raises(TypeError):  # format(bytearray, "x"), as in to_string()
        _native.encode_legacy_keys([FakeKey("m", 1, 0, bytearray(b"\x01"), "half")])


def test_surrogates_in_model_name_give_to_strings_result():
    k = FakeKey("bad\udc80", 1, 0, 1, "half")
    assert check([k]) == ["bad\udc80@1@0@1@half"]


def test_str_keys_pass_through():
    s = StrSub("already@encoded")
    got = _native.encode_legacy_keys(["a", s, FakeKey("m", 1, 0, 1, "half")])
    assert got[0] == "a" and got[1] is s and got[2] == "m@1@0@1@half"


def test_any_iterable_and_empty():
    assert _native.encode_legacy_keys([]) == []
    assert _native.encode_legacy_keys(iter([FakeKey("m", 1, 0, 2, "half")])) == ["m@1@0@2@half"]
    assert _native.encode_legacy_keys((k for k in ["x"])) == ["x"]
    with pytest.raises(TypeError):
        _native.encode_legacy_keys(5)


# --------------------------------------------------------------------------- fallback


def test_standin_classes_take_the_fallback():
    """The stand-ins' _dtype_str is a method: only to_string() knows their layout."""
    if standin.HAVE_LMCACHE:
        pytest.skip("lmcache is installed: _lmcache re-exports the real classes")
    rng = random.Random(7)
    keys = []
    for i in range(200):
        cfg = rng.choice([None, {}, {"lmcache.tag.x": "y"}])
        if i % 3:
            keys.append(standin.CacheEngineKey(rand_model(rng), 1, i % 4, rng.getrandbits(64), "bfloat16", cfg))
        else:
            keys.append(standin.LayerCacheEngineKey(rand_model(rng), 1, 0, i, "half", cfg, i))
    with CountToString() as c:
        check(keys)
    assert c.n == 2 * len(keys), "fallback: one call by encode_legacy_keys, one by check()"


class Other:
    def __init__(self, s):
        self.s = s

    def to_string(self):
        return "other:" + self.s


class NotStr:
    def to_string(self):
        return 42


class Boom:
    def to_string(self):
        raise RuntimeError("boom")


def test_unknown_objects_use_their_to_string():
    assert _native.encode_legacy_keys([Other("a"), FakeKey("m", 1, 0, 1, "half"), Other("b")]) == \
        ["other:a", "m@1@0@1@half", "other:b"]
    assert _native.encode_legacy_keys([NotStr()]) == [42]


def test_errors_propagate():
    with pytest.raises(RuntimeError, match="boom"):
        _native.encode_legacy_keys([FakeKey("m", 1, 0, 1, "half"), Boom()])
    with pytest.raises(AttributeError):
        _native.encode_legacy_keys([object()])
    k = FakeKey.__new__(FakeKey)  # slots never set: to_string() raises AttributeError
    with pytest.raises(AttributeError):
        _native.encode_legacy_keys([k])


def test_subclass_and_patched_to_string_are_respected():
    class Sub(FakeKey):
        __slots__ = ()

        def to_string(self):
            return "sub:" + FakeKey.to_string(self)

    assert _native.encode_legacy_keys([Sub("m", 1, 0, 1, "half")]) == ["sub:m@1@0@1@half"]
    k = FakeKey("m", 1, 0, 1, "half")
    orig = FakeKey.to_string
    try:
        FakeKey.to_string = lambda self: "patched"
        assert _native.encode_legacy_keys([k, k]) == ["patched", "patched"]
    finally:
        FakeKey.to_string = orig
    assert _native.encode_legacy_keys([k]) == ["m@1@0@1@half"]


def test_layout_change_is_detected_and_warned():
    """A to_string() with a different layout (a future LMCache) wins over the fast path."""
    ns = {"__name__": "lmcache.utils"}
    exec(compile(_FAKE_SOURCE.replace("SLOTS", "True").replace('"@".join([', '"#".join(['),
                 "<changed lmcache.utils>", "exec", dont_inherit=True), ns)
    keys = [ns["CacheEngineKey"]("m", 1, 0, i, "half") for i in range(5)]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = _native.encode_legacy_keys(keys)
    assert got == [f"m#1#0#{i:x}#half" for i in range(5)]
    assert any(issubclass(x.category, RuntimeWarning) for x in w)


def test_list_mutated_by_to_string_is_safe():
    keys = []

    class Mutator:
        def to_string(self):
            keys.clear()
            keys.extend(Other(str(i)) for i in range(100))
            return "mut"

    keys.extend([Mutator(), FakeKey("m", 1, 0, 1, "half"), Other("z")])
    assert _native.encode_legacy_keys(keys) == ["mut", "m@1@0@1@half", "other:z"]


# --------------------------------------------------------------------------- delete_legacy_keys


def _legacy_identity(encoded):
    try:
        return _native.Core._key_identity(encoded, "legacy")
    except ValueError:
        return None  # e.g. a model name with '@': no chunk hash where a load looks for it


def test_legacy_key_that_does_not_name_its_identity_is_refused(tmp_path):
    core = make_core(make_device(tmp_path), namespace="legacy")
    try:
        good, bad = "m@1@0@1f@half", "m@1@0@2f@half"
        res = core.put_many([RawBlockKeySpec(encoded=good, slot_identity=0x1F),
                             RawBlockKeySpec(encoded=bad, slot_identity=0x1F),
                             RawBlockKeySpec(encoded="m@odel@1@0@3f@half", slot_identity=0x3F)],
                            [Obj(64) for _ in range(3)])
        assert res.results == [True, False, False]
        assert isinstance(res.failure, ValueError) and "is not the chunk hash its encoded form names" in str(res.failure)
        out = Obj(64)
        assert core.load_many_into([good], [out]) == [True]
    finally:
        core.close()


def _legacy_core(tmp_path, keys):
    core = make_core(make_device(tmp_path), namespace="legacy")
    enc = [k.to_string() for k in keys]
    # each key under the identity its encoded form names (the core refuses any other)
    ids = [_legacy_identity(e) for e in enc]
    res = core.put_many([RawBlockKeySpec(encoded=e, slot_identity=i) for i, e in zip(ids, enc)],
                        [Obj(64) for _ in enc])
    assert all(res.results), res.failure
    return core, enc


def test_delete_legacy_keys_matches_delete_many(tmp_path):
    rng = random.Random(3)
    keys = [k for k in rand_fake_keys(rng, 150) if _legacy_identity(k.to_string()) is not None]
    keys = list({k.to_string(): k for k in keys}.values())  # distinct encodings
    stored, absent = keys[:100], keys[100:]
    core, enc = _legacy_core(tmp_path, stored)
    try:
        probe = stored[:60] + absent + [Other("nope")]
        assert _native.delete_legacy_keys(core._native, probe, True) == 60
        assert core.exists_many(enc) == [False] * 60 + [True] * 40
        # locked entries survive without force, go with force
        assert core.exists_many(enc[60:62], lock=True) == [True, True]
        assert _native.delete_legacy_keys(core._native, stored[60:], force=False) == 38
        assert core.exists_many(enc[60:62]) == [True, True]
        assert _native.delete_legacy_keys(core._native, keys=stored[60:62], force=True) == 2
        assert core.indexed_key_count() == 0
        assert _native.delete_legacy_keys(core._native, []) == 0
    finally:
        core.close()


def test_delete_legacy_keys_errors(tmp_path):
    core, _ = _legacy_core(tmp_path, [FakeKey("m", 1, 0, 1, "half")])
    try:
        with pytest.raises(TypeError, match="_native.Core"):
            _native.delete_legacy_keys(object(), [])
        with pytest.raises(TypeError, match="must be str"):
            _native.delete_legacy_keys(core._native, [FakeKey("m", 1, 0, 1, "half"), NotStr()])
        with pytest.raises(RuntimeError, match="boom"):
            _native.delete_legacy_keys(core._native, [FakeKey("m", 1, 0, 1, "half"), Boom()])
        with pytest.raises(UnicodeEncodeError):
            _native.delete_legacy_keys(core._native, [FakeKey("bad\udc80", 1, 0, 1, "half")])
        with pytest.raises(TypeError):
            _native.delete_legacy_keys(core._native)
        # nothing was deleted by the failed calls
        assert core.indexed_key_count() == 1
    finally:
        core.close()


# --------------------------------------------------------------------------- real LMCache


@pytest.fixture
def lmc():
    pytest.importorskip("torch")
    utils = pytest.importorskip("lmcache.utils")
    return utils


@pytest.mark.lmcache
@pytest.mark.parametrize("seed", range(3))
def test_real_lmcache_keys_random(lmc, seed):
    rng = random.Random(seed)
    dtypes = list(lmc.TORCH_DTYPE_TO_STR_DTYPE)
    keys = []
    for i in range(1500):
        args = (rand_model(rng), rng.choice([1, 2, 8]), rng.choice([0, 1, 7]), rand_hash(rng), rng.choice(dtypes),
                rand_configs(rng))
        if i % 4 == 0:
            keys.append(lmc.LayerCacheEngineKey(*args, layer_id=rng.choice([0, 1, 31, 80])))
        else:
            keys.append(lmc.CacheEngineKey(*args))
    check(keys)


@pytest.mark.lmcache
def test_real_lmcache_every_dtype_and_shape_takes_the_fast_path(lmc):
    import torch

    for dtype in lmc.TORCH_DTYPE_TO_STR_DTYPE:
        for cls, extra in ((lmc.CacheEngineKey, {}), (lmc.LayerCacheEngineKey, {"layer_id": 5})):
            for h in (0x1234, -5, 2**64 + 3, b"\x01\xfe"):
                for cfg in (None, {"lmcache.tag.user": "alice", "lmcache.tag.é": "@%"}):
                    keys = [cls("model/é@x", 4, 2, h, dtype, cfg, **extra) for _ in range(3)]
                    _native._forget_key_plans()
                    with CountToString() as c:
                        got = _native.encode_legacy_keys(keys)
                    assert c.n == 1, (dtype, cls, h, cfg)
                    assert got == [k.to_string() for k in keys]
    keys = lmc.CacheEngineKey("m", 1, 0, 7, torch.bfloat16).split_layers(4)
    check(keys)


@pytest.mark.lmcache
def test_real_lmcache_keys_with_odd_tags_fall_back(lmc):
    import torch

    keys = [lmc.CacheEngineKey("m", 1, 0, 1, torch.half, {"lmcache.tag.n": 5}),
            lmc.CacheEngineKey("m", 1, 0, 2, torch.half, {"lmcache.tag.n": None})]
    with CountToString() as c:
        check(keys)
    assert c.n == 4


@pytest.mark.lmcache
def test_real_lmcache_from_string_round_trip(lmc):
    import torch

    keys = [lmc.CacheEngineKey("m", 2, 1, 2**63 + i, torch.float8_e4m3fn, {"lmcache.tag.t": "v"}) for i in range(20)]
    for enc in _native.encode_legacy_keys(keys):
        assert lmc.CacheEngineKey.from_string(enc).to_string() == enc


def test_unsigned_64_bit_hashes_take_the_fast_path():
    """vLLM's sha256_cbor_64bit hashes are unsigned 64-bit ints: half of them do not fit a C
    long long. They are encoded in C all the same (to_string() only for the one check)."""
    _native._forget_key_plans()
    hashes = [2**63, 2**64 - 1, 2**63 + 12345, 2**63 - 1, -2**63, 0, -1, 0xDEADBEEFCAFEBABE]
    keys = [FakeKey("m", 1, 0, h, "bfloat16") for h in hashes] * 3
    want = expected(keys)
    with CountToString() as c:
        got = _native.encode_legacy_keys(keys)
    assert got == want
    assert c.n == 1
    assert check([FakeKey("m", 1, 0, 2**64, "half"), FakeKey("m", 1, 0, -2**63 - 1, "half")])  # general path


def test_delete_legacy_keys_deallocates_what_it_frees_as_delete_many_does(tmp_path):
    """Format v1 makes a slot no checkpoint lists reusable at its delete; both deletes then
    deallocate it in the same call (a file: its blocks are punched)."""
    ranges = {}
    for how in ("delete_many", "delete_legacy_keys"):
        core = make_core(make_device(tmp_path, name=f"{how}.img"), namespace="legacy", meta_format="v1",
                         deallocate_freed="on")
        try:
            keys = [FakeKey("m", 1, 0, 0x100 + i, "half") for i in range(80)]  # more than the GIL threshold
            enc = [k.to_string() for k in keys]
            res = core.put_many([RawBlockKeySpec(encoded=e, slot_identity=_legacy_identity(e)) for e in enc],
                                [Obj(64) for _ in enc])
            assert all(res.results), res.failure
            core._native.set_dealloc_log(True)
            if how == "delete_many":
                assert all(core.delete_many(enc))
            else:
                assert _native.delete_legacy_keys(core._native, keys, False) == len(keys)
            st = core._native.status()
            assert st["dealloc_pending_slots"] == 0 and st["dealloc_slots"] == len(keys), st
            ranges[how] = sorted(core._native.take_dealloc_log())
        finally:
            core.close()
    assert ranges["delete_legacy_keys"] == ranges["delete_many"] != []
