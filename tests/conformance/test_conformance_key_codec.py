"""Object-key codec against LMCache 0.5.6: ``object_group_id`` is part of the encoded key and
of the slot identity; the form without groups (older LMCache) still decodes.

The tests marked ``lmcache`` compare with LMCache's own codec and exchange devices with its
own core in the object namespace (``make test-lmcache``); the others run everywhere.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import pytest

from core_helpers import Obj, make_core, make_device, payload
from helpers import lmcache_imports
from lmcache_rawblock import lmcache_paths
from lmcache_rawblock.raw_block import decode_object_key, encode_object_key, key_codec, object_key_to_string
from lmcache_rawblock.raw_block._lmcache import ObjectKey


def _k(chunk=b"\x01\x02", model="m", rank=0, group=0, salt=""):
    return ObjectKey(chunk_hash=chunk, model_name=model, kv_rank=rank, object_group_id=group, cache_salt=salt)


def _blake(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little")


def test_group_is_encoded_between_rank_and_chunk():
    assert object_key_to_string(_k(b"\xab\xcd", "org/model", 3, 0x1f)) == "org%2Fmodel@0x00000003@1f@abcd"
    assert object_key_to_string(_k(b"\x00", "m", 1, 0, "s")) == "m@0x00000001@0@00@s"
    spec = encode_object_key(_k(group=0xABCDEF12345))
    assert spec.encoded == "m@0x00000000@abcdef12345@0102"
    assert spec.slot_identity == _blake(spec.encoded)


def test_keys_differing_only_in_group_do_not_collide():
    a, b = encode_object_key(_k(group=0)), encode_object_key(_k(group=1))
    assert a.encoded != b.encoded
    assert a.slot_identity != b.slot_identity


@pytest.mark.parametrize("salt", ["", "user-1"])
@pytest.mark.parametrize("group", [0, 1, 0x7FFF_FFFF_FFFF])
def test_round_trip_keeps_the_group(group, salt):
    key = _k(bytes(range(16)), "org/sub-model", 5, group, salt)
    back = decode_object_key(encode_object_key(key).encoded)
    assert back == key


def test_form_without_groups_still_decodes():
    # written by an LMCache whose ObjectKey had no object_group_id
    assert decode_object_key("org%2Fm@0x00000002@abcd") == _k(b"\xab\xcd", "org/m", 2, 0)
    # four fields whose last one cannot be a chunk hash: the ungrouped form with a salt
    assert decode_object_key("m@0x00000002@abcd@user-1") == _k(b"\xab\xcd", "m", 2, 0, "user-1")
    # four hex fields: the grouped form, as LMCache 0.5.6 reads them
    assert decode_object_key("m@0x00000002@a@abcd") == _k(b"\xab\xcd", "m", 2, 10)
    assert decode_object_key("m@0x00000002@ab@cd") == _k(b"\xcd", "m", 2, 0xAB)


def test_negative_group_is_refused_naming_it():
    @dataclass(frozen=True)
    class Loose:  # an ObjectKey-like object without LMCache's own validation
        chunk_hash: bytes
        model_name: str
        kv_rank: int
        object_group_id: int
        cache_salt: str = ""

    with pytest.raises(ValueError, match="object_group_id must be >= 0, got -1"):
        object_key_to_string(Loose(b"\x00", "m", 0, -1))


def test_group_less_lmcache_keeps_its_own_form(monkeypatch):
    """With an LMCache whose ObjectKey has no object_group_id, keys encode and decode in that
    release's form, and a grouped key with a non-zero group is refused rather than merged."""

    @dataclass(frozen=True)
    class OldObjectKey:
        chunk_hash: bytes
        model_name: str
        kv_rank: int
        cache_salt: str = ""

    monkeypatch.setattr(key_codec, "ObjectKey", OldObjectKey)
    monkeypatch.setattr(key_codec, "OBJECT_KEYS_HAVE_GROUP", False)
    old = OldObjectKey(b"\xab\xcd", "m", 2, "s1")
    assert object_key_to_string(old) == "m@0x00000002@abcd@s1"
    assert decode_object_key("m@0x00000002@abcd@s1") == old
    assert decode_object_key("m@0x00000002@0@abcd@s1") == old
    with pytest.raises(ValueError, match="object_group_id 3, which this LMCache's ObjectKey cannot hold"):
        decode_object_key("m@0x00000002@3@abcd")  # only the grouped reading fits
    with pytest.raises(ValueError, match="object_group_id 3, which this LMCache's ObjectKey cannot hold"):
        decode_object_key("m@0x00000002@3@abcd@s1")
    # both readings fit: this release's own (salted) form
    assert decode_object_key("m@0x00000002@ab@cd") == OldObjectKey(b"\xab", "m", 2, "cd")


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_core_serves_each_group_its_own_bytes(tmp_path, engine):
    core = make_core(make_device(tmp_path), io_engine=engine)
    try:
        keys = [encode_object_key(_k(b"\x10" * 8, "same", 0, g)) for g in range(3)]
        src = [Obj(payload(g, 3000)) for g in range(3)]
        assert core.put_many(keys, src).results == [True] * 3
        assert core.indexed_key_count() == 3
        out = [Obj(3000) for _ in range(3)]
        assert core.load_many_into([k.encoded for k in keys], out) == [True] * 3
        assert [o.bytes() for o in out] == [s.bytes() for s in src]
        assert sorted(decode_object_key(e).object_group_id for e in core.snapshot_indexed_keys()) == [0, 1, 2]
    finally:
        core.close()


# ---- against LMCache 0.5.6 itself ------------------------------------------------------------

with lmcache_imports() as lmc:
    import torch
    from lmcache.v1.distributed.api import ObjectKey as LmcObjectKey
    from lmcache.v1.memory_allocators.host_memory_allocator import HostMemoryAllocator
    from lmcache.v1.memory_management import MemoryFormat
    lmc_rb = lmcache_paths.import_raw_block()  # where the installed LMCache version has it

lmcache_only = lmc.skip
logging.getLogger("LMCache").setLevel(logging.ERROR)


def _lmc_keys():
    out = []
    for i, (model, rank, group, salt) in enumerate([
            ("raw_block_ci", 0, 0, ""), ("raw_block_ci", 0, 1, ""), ("raw_block_ci", 0, 0xFFFF_FFFF, ""),
            ("org/model-SEP-x", 3, 2, "tenant-a"), ("org/model-SEP-x", 0x1_0000_0000, 0, "tenant-a"),
            ("ünï", 7, 0x1234, "")]):
        for c in range(3):
            out.append(LmcObjectKey(chunk_hash=(i * 100 + c).to_bytes(4, "big"), model_name=model, kv_rank=rank,
                                    object_group_id=group, cache_salt=salt))
    return out


@pytest.mark.lmcache
@lmcache_only
def test_same_strings_and_identities_as_lmcache():
    for key in _lmc_keys():
        theirs = lmc_rb.encode_object_key(key)
        ours = encode_object_key(key)
        assert ours == key_codec.RawBlockKeySpec(theirs.encoded, theirs.slot_identity)
        assert decode_object_key(theirs.encoded) == lmc_rb.decode_object_key(theirs.encoded) == key
        assert key_codec.slot_identity_from_encoded_key(theirs.encoded, "object") == \
            lmc_rb.slot_identity_from_encoded_key(theirs.encoded, "object")


def _cfg_kwargs(dev, **kw):
    from core_helpers import make_config

    base = dict(make_config(dev).__dict__)
    for k in list(base):
        if k not in lmc_rb.RawBlockCoreConfig.__dataclass_fields__:
            base.pop(k)
    base.update(kw)
    return base


def _lmc_core(dev, **kw):
    return lmc_rb.RawBlockCore(lmc_rb.RawBlockCoreConfig(**_cfg_kwargs(dev, **kw)), key_namespace="object")


def _our_core(dev, **kw):
    from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig

    # format v1: these devices are handed to LMCache's own core
    return RawBlockCore(RawBlockCoreConfig(**_cfg_kwargs(dev, **kw), meta_format="v1"), key_namespace="object")


def _objs(alloc, n, seed):
    g = torch.Generator().manual_seed(seed)
    objs = []
    for i in range(n):
        o = alloc.allocate(torch.Size([1000 + 97 * i]), torch.uint8, fmt=MemoryFormat.BINARY)
        memoryview(o.byte_array).cast("B")[:] = torch.randint(0, 256, (o.get_size(),), dtype=torch.uint8,
                                                              generator=g).numpy().tobytes()
        objs.append(o)
    return objs


def _bytes(o):
    return bytes(memoryview(o.byte_array).cast("B"))


@pytest.mark.lmcache
@lmcache_only
@pytest.mark.parametrize("direction", ["lmcache_writes", "we_write"])
@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_object_namespace_devices_interchange_with_lmcache(tmp_path, engine, direction):
    """A device one core wrote in the object namespace (keys with groups and salts) is fully
    readable by the other after a restart: every key found through the reader's own codec,
    same bytes, same sizes, the same decoded keys."""
    dev = make_device(tmp_path)
    alloc = HostMemoryAllocator(64 << 20)
    keys = _lmc_keys()
    objs = _objs(alloc, len(keys), seed=len(direction))
    writer, reader = (_lmc_core, _our_core) if direction == "lmcache_writes" else (_our_core, _lmc_core)
    write_codec = lmc_rb.encode_object_key if direction == "lmcache_writes" else encode_object_key
    read_codec = encode_object_key if direction == "lmcache_writes" else lmc_rb.encode_object_key
    w = writer(dev, io_engine=engine)
    try:
        res = w.put_many([write_codec(k) for k in keys], objs)
        assert list(res.results) == [True] * len(keys)
    finally:
        w.close()
    r = reader(dev, io_engine=engine)
    try:
        enc = [read_codec(k).encoded for k in keys]
        assert r.exists_many(enc) == [True] * len(keys)
        assert sorted(r.snapshot_indexed_keys()) == sorted(enc)
        assert sorted(map(repr, map(decode_object_key, r.snapshot_indexed_keys()))) == sorted(map(repr, keys))
        assert [m.size for m in r.get_metadata_many(enc)] == [o.get_size() for o in objs]
        outs = [alloc.allocate(o.metadata.shape, torch.uint8, fmt=MemoryFormat.BINARY) for o in objs]
        assert r.load_many_into(enc, outs) == [True] * len(keys)
        assert [_bytes(o) for o in outs] == [_bytes(o) for o in objs]
    finally:
        r.close()

