"""On-disk format v1 compatibility both ways, checked with an independent reader/writer
(struct + json + zlib) written from the documented format."""

import json
import struct

import pytest

from core_helpers import (
    BLOCK, HEADER, META, SLOT, Obj, base_state, make_core, make_device, newest_state, okey, payload,
    read_containers, read_slot, write_container, write_slot,
)
from lmcache_rawblock._native import xxh3_64
from lmcache_rawblock.raw_block import encode_legacy_key, encode_object_key
from lmcache_rawblock.raw_block._lmcache import CacheEngineKey, ObjectKey

# Reads format v1's containers or relies on its slot-reuse rule.
pytestmark = pytest.mark.v1_layout


def _entry(slot, size, shape=None, dtype=None, fmt=None, pos=None):
    return {"offset": META + slot * SLOT, "size": size, "shape": shape, "dtype": dtype, "fmt": fmt,
            "cached_positions": pos}


def test_image_built_from_v1_format_opens_with_every_entry(tmp_path):
    dev = make_device(tmp_path)
    keys = [okey(i) for i in range(6)]
    entries = {}
    for i, k in enumerate(keys):
        data = payload(i, 1000 + i)
        write_slot(dev, META + i * SLOT, k.slot_identity, data)
        entries[k.encoded] = _entry(i, len(data), shape=[1000 + i], dtype="uint8", fmt="BINARY",
                                    pos=[i, i + 1] if i % 2 else None)
    # LMCache writes free_slots in older versions; it is ignored.
    older = base_state(dev, 6, dict(list(entries.items())[:2]))
    newer = base_state(dev, 8, entries, free_slots=[7, 6])
    write_container(dev, 0, 3, older)
    write_container(dev, 1, 4, newer)
    c = make_core(dev)
    try:
        assert c.exists_many([k.encoded for k in keys]) == [True] * 6
        assert c.snapshot_indexed_keys() == [k.encoded for k in keys]
        outs = [Obj(1000 + i) for i in range(6)]
        assert c.load_many_into([k.encoded for k in keys], outs) == [True] * 6
        assert all(o.bytes() == payload(i, 1000 + i) for i, o in enumerate(outs))
        assert list(outs[1].metadata.cached_positions) == [1, 2]
        st = c.report_status()
        assert (st["metadata_seq"], st["next_slot"], st["free_slot_count"]) == (4, 8, 2)
        m = c.get_metadata_many([keys[3].encoded])[0]
        assert tuple(m.shape) == (1003,) and m.fmt.name == "BINARY"
        # The older container (not read at open) may list any slot: the first put replaces it
        # (container 0, seq 5) before it takes one; the next checkpoint is seq 6 in container 1.
        c.put_many([okey(50)], [Obj(10)])
        assert newest_state(dev)[:2] == (0, 5)
        c.checkpoint_now()
        assert newest_state(dev)[:2] == (1, 6)
    finally:
        c.close()


def test_torn_newer_checkpoint_falls_back_to_older(tmp_path):
    dev = make_device(tmp_path)
    a, b = okey(1), okey(2)
    write_slot(dev, META, a.slot_identity, b"a" * 10)
    write_slot(dev, META + SLOT, b.slot_identity, b"b" * 10)
    write_container(dev, 0, 1, base_state(dev, 1, {a.encoded: _entry(0, 10)}))
    write_container(dev, 1, 2, base_state(dev, 2, {a.encoded: _entry(0, 10), b.encoded: _entry(1, 10)}),
                    crc=12345)
    c = make_core(dev)
    try:
        assert c.exists_many([a.encoded, b.encoded]) == [True, False]
        assert c.report_status()["next_slot"] == 1
    finally:
        c.close()


def test_wrong_magic_or_version_or_length_is_ignored(tmp_path):
    dev = make_device(tmp_path)
    a = okey(1)
    write_slot(dev, META, a.slot_identity, b"a" * 10)
    st = base_state(dev, 1, {a.encoded: _entry(0, 10)})
    write_container(dev, 0, 9, st, magic=b"OTHERMAG")
    write_container(dev, 1, 8, st, version=2)
    c = make_core(dev)
    try:
        assert c.indexed_key_count() == 0
    finally:
        c.close()


def test_verify_on_load_drops_bad_headers(tmp_path):
    dev = make_device(tmp_path)
    keys = [okey(i) for i in range(5)]
    write_slot(dev, META + 0 * SLOT, keys[0].slot_identity, b"0" * 10)           # good
    write_slot(dev, META + 1 * SLOT, keys[1].slot_identity ^ 1, b"1" * 10)       # wrong identity
    write_slot(dev, META + 2 * SLOT, keys[2].slot_identity, b"2" * 11)           # wrong length
    # slot 3: no header at all
    write_slot(dev, META + 4 * SLOT, keys[4].slot_identity, b"4" * 10)           # good
    entries = {k.encoded: _entry(i, 10) for i, k in enumerate(keys)}
    write_container(dev, 0, 1, base_state(dev, 5, entries))
    for verify, want in ((False, [True] * 5), (True, [True, False, False, False, True])):
        c = make_core(dev, meta_verify_on_load=verify, load_checkpoint_on_init=True)
        try:
            assert c.exists_many([k.encoded for k in keys]) == want
            st = c.report_status()
            if verify:
                # the dropped entries' slots stay out of use while the checkpoint lists them
                assert st["checkpoint_held_slots"] == 3 and st["metadata_dirty_total"] == 1
        finally:
            c._native.close()


def test_device_written_by_us_decodes_with_independent_reader(tmp_path):
    dev = make_device(tmp_path)
    c = make_core(dev)
    specs = [okey(1), encode_object_key(ObjectKey(b"\x01\x02", "org/m\u00fc", 3, cache_salt="s\u00e9l\U0001F600\"\\\n"))]
    objs = [Obj(payload(1, 5000), shape=(5000,)), Obj(payload(2, 77), shape=(7, 11))]
    objs[1].metadata.cached_positions = [5, 6, 7]
    objs[1].metadata.fmt = "KV_2LTD"
    objs[1].metadata.dtype = "bfloat16"
    c.put_many(specs, objs)
    c.checkpoint_now()
    c._native.close()
    found = read_containers(dev)
    assert len(found) == 1
    k, seq, state, body = found[0]
    assert (k, seq) == (0, 1)
    # byte-identical to Python's json.dumps(separators=(",", ":"), ensure_ascii=True)
    assert body == json.dumps(state, separators=(",", ":"), ensure_ascii=True).encode()
    assert list(state) == ["version", "device_path", "capacity_bytes", "block_align", "header_bytes",
                           "slot_bytes", "meta_total_bytes", "meta_magic", "meta_version", "data_base_offset",
                           "next_slot", "entries"]
    assert state["version"] == 1 and state["device_path"] == dev and state["meta_magic"] == "LMCIDX01"
    assert (state["block_align"], state["header_bytes"], state["slot_bytes"], state["meta_total_bytes"],
            state["data_base_offset"], state["next_slot"]) == (BLOCK, HEADER, SLOT, META, META, 2)
    assert list(state["entries"]) == [s.encoded for s in specs]
    e0, e1 = state["entries"][specs[0].encoded], state["entries"][specs[1].encoded]
    assert list(e0) == ["offset", "size", "shape", "dtype", "fmt", "cached_positions"]
    assert e0 == {"offset": META, "size": 5000, "shape": [5000], "dtype": "uint8", "fmt": "BINARY",
                  "cached_positions": None}
    assert e1 == {"offset": META + SLOT, "size": 77, "shape": [7, 11], "dtype": "bfloat16", "fmt": "KV_2LTD",
                  "cached_positions": [5, 6, 7]}
    for spec, obj, ent in zip(specs, objs, (e0, e1)):
        magic, ident, plen, hdr, data = read_slot(dev, ent["offset"])
        assert magic == b"LMCBLK01" and ident == spec.slot_identity and plen == ent["size"]
        # LMCache writes zeros from byte 24 and never reads them; ours (checksum off) holds the
        # xxh3-64 of the whole encoded key at 40..48 and zeros elsewhere
        assert hdr[24:40] == bytes(16) and hdr[48:] == bytes(HEADER - 48)
        assert struct.unpack_from("<Q", hdr, 40)[0] == (xxh3_64(spec.encoded.encode()) or 1)
        assert data == obj.bytes()


def test_checkpoint_containers_alternate(tmp_path):
    dev = make_device(tmp_path)
    c = make_core(dev)
    try:
        for i in range(3):
            c.put_many([okey(i)], [Obj(10)])
            c.checkpoint_now()
        got = sorted((k, seq) for k, seq, st, _ in read_containers(dev))
        assert got == [(0, 3), (1, 2)]
        assert newest_state(dev)[2]["next_slot"] == 3
    finally:
        c.close()


def test_legacy_image_recovers(tmp_path):
    dev = make_device(tmp_path)
    spec = encode_legacy_key(CacheEngineKey("model", 2, 1, -12345, "half"))
    write_slot(dev, META, spec.slot_identity, b"x" * 64)
    write_container(dev, 0, 1, base_state(dev, 1, {spec.encoded: _entry(0, 64, dtype="uint8")}))
    c = make_core(dev, namespace="legacy")
    try:
        assert c.exists_many([spec.encoded]) == [True]
    finally:
        c.close()


@pytest.mark.parametrize("namespace", ["object", "legacy"])
def test_c_identity_matches_python_codec(namespace):
    from lmcache_rawblock import _native
    from lmcache_rawblock.raw_block import slot_identity_from_encoded_key

    keys = ([okey(i).encoded for i in range(50)] + ["x" * n for n in (0, 127, 128, 129, 256, 1000)]
            if namespace == "object" else
            [encode_legacy_key(CacheEngineKey("m", 1, 0, h, "half")).encoded
             for h in (0, 1, -1, 2**64 + 5, -(2**70), 0xDEADBEEF)])
    for k in keys:
        assert _native.Core._key_identity(k, namespace) == slot_identity_from_encoded_key(k, namespace)


def test_header_struct_layout():
    assert struct.calcsize("<8sIQQI") == 32
