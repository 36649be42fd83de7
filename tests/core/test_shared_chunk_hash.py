"""Two legacy keys that share a chunk hash (the same chunk under two ``lmcache.tag.*`` tenants,
two dtypes, two layers) share the slot identity LMCache's header carries. Our writer also puts
the hash of the whole encoded key in the slot header (bytes 40..48), and every load and start-up
validation checks it: when metadata that lists one key is brought back over a slot the other key
reused, a load is a miss, never the other key's bytes, with payload checksums off. A header
without the field (LMCache's, or an older version of ours: zeros there) is judged on the chunk
hash as before."""

from __future__ import annotations

import struct

import pytest

from core_helpers import (
    HEADER, META, SLOT, Obj, base_state, make_core, make_device, odirect_ok, payload, read_slot, write_container,
    write_slot,
)
from lmcache_rawblock import _native
from lmcache_rawblock.raw_block import RawBlockKeySpec

CHUNK = 0x5EED0123456789AB
N = 5000  # both keys store the same length: only the key hash tells their headers apart


def _legacy(tenant: str, chunk: int = CHUNK) -> RawBlockKeySpec:
    """A CacheEngineKey.to_string() of one chunk with a tenant tag (LMCache's layout)."""
    return RawBlockKeySpec(encoded=f"org/model@1@0@{chunk:x}@half@tenant%{tenant}", slot_identity=chunk)


A, B = _legacy("alpha"), _legacy("beta")


def _key_hash_field(dev: str, off: int) -> int:
    return struct.unpack_from("<Q", read_slot(dev, off)[3], 40)[0]


def _expected_key_hash(key: RawBlockKeySpec) -> int:
    h = _native.xxh3_64(key.encoded.encode())
    return h or 1


def _core(dev, fmt, **kw):
    return make_core(dev, namespace="legacy", meta_format=fmt, verify_payload_checksum=False, **kw)


def _metadata(dev) -> bytes:
    with open(dev, "rb") as f:
        return f.read(META)


def _put_back_metadata(dev, region: bytes) -> None:
    with open(dev, "r+b") as f:
        f.write(region)


def _b_over_a_slot(dev, fmt, engine="posix"):
    """A stored and listed by the metadata; then A deleted and B stored in A's reused slot.
    Returns (A's slot offset, the metadata region as it was while it listed A there)."""
    c = _core(dev, fmt, io_engine=engine)
    try:
        assert c.put_many([A], [Obj(payload(1, N))]).results == [True]
        off = c.entry_offset(A.encoded)
        c.checkpoint_now()
        listing_a = _metadata(dev)
        assert c.delete_many([A.encoded]) == [True]
        # one slot: B's put writes the metadata that frees A's slot, then takes it
        assert c.put_many([B], [Obj(payload(2, N))]).results == [True]
        assert c.entry_offset(B.encoded) == off  # the slot was reused
        c.checkpoint_now()
    finally:
        c.close()
    magic, ident, plen, _hdr, data = read_slot(dev, off)
    assert (magic, ident, plen, data) == (b"LMCBLK01", CHUNK, N, payload(2, N))
    return off, listing_a


FORMATS = ["v1", "log"]
ENGINES = [("posix", False), ("io_uring", False), ("posix", True), ("io_uring", True)]
ENGINE_IDS = ["posix", "io_uring", "posix-odirect", "io_uring-odirect"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_headers_of_keys_sharing_a_chunk_hash_carry_different_key_hashes(tmp_path, fmt):
    dev = make_device(tmp_path)
    c = _core(dev, fmt)
    try:
        assert c.put_many([A, B], [Obj(payload(1, N)), Obj(payload(2, N))]).results == [True, True]
        offs = [c.entry_offset(k.encoded) for k in (A, B)]
    finally:
        c.close()
    for k, off in zip((A, B), offs):
        magic, ident, plen, hdr, _data = read_slot(dev, off)
        assert (magic, ident, plen) == (b"LMCBLK01", CHUNK, N)
        assert _key_hash_field(dev, off) == _expected_key_hash(k)
        # what LMCache reads (0..24) is its own layout; beyond the key hash, zeros
        assert hdr[24:40] == bytes(16) and hdr[48:] == bytes(HEADER - 48)
    assert _key_hash_field(dev, offs[0]) != _key_hash_field(dev, offs[1])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("engine,odirect", ENGINES, ids=ENGINE_IDS)
def test_metadata_brought_back_over_a_reused_slot_is_a_miss(tmp_path, fmt, engine, odirect):
    dev = make_device(tmp_path, size=META + SLOT)  # one slot
    if odirect and not odirect_ok(dev):
        pytest.skip("the temporary directory's file system refuses O_DIRECT")
    off, listing_a = _b_over_a_slot(dev, fmt, engine)
    _put_back_metadata(dev, listing_a)  # damaged metadata: it lists A in the slot B now holds

    # fast start-up: A is listed, unverified; its first load judges the header
    c = _core(dev, fmt, io_engine=engine, use_odirect=odirect, meta_verify_on_load=False)
    try:
        assert c.exists_many([A.encoded, B.encoded]) == [True, False]
        out = Obj(b"\xee" * N)
        assert c.load_many_into([A.encoded], [out]) == [False]  # a miss, not B's bytes
        assert out.bytes() != payload(2, N)
        st = c.report_status()
        assert st["load_rejected_entries"] == 1 and c.exists_many([A.encoded]) == [False]
    finally:
        c._native.close()

    # eager start-up validation drops A before any load
    _put_back_metadata(dev, listing_a)
    c = _core(dev, fmt, io_engine=engine, use_odirect=odirect, meta_verify_on_load=True)
    try:
        assert c.load_many_into([A.encoded], [Obj(N)]) == [False]
        assert c.exists_many([A.encoded]) == [False]
    finally:
        c._native.close()
    assert read_slot(dev, off)[4] == payload(2, N)  # B's bytes are untouched


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("verify", [False, True])
def test_a_state_pointing_a_key_at_its_twins_slot_is_refused(tmp_path, fmt, verify):
    dev = make_device(tmp_path)
    c = _core(dev, fmt, meta_verify_on_load=verify, load_checkpoint_on_init=False)
    try:
        assert c.put_many([A, B], [Obj(payload(1, N)), Obj(payload(2, N))]).results == [True, True]
        off_b = c.entry_offset(B.encoded)
        entry = {"offset": off_b, "size": N, "shape": None, "dtype": None, "fmt": None, "cached_positions": None}
        assert c.apply_loaded_state(base_state(dev, 2, {A.encoded: entry}))
        out = Obj(b"\xee" * N)
        assert c.load_many_into([A.encoded], [out]) == [False]
        assert out.bytes() != payload(2, N)
        assert c.exists_many([A.encoded]) == [False]
    finally:
        c.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_header_without_the_key_hash_is_judged_on_the_chunk_hash(tmp_path, fmt):
    """Zeros where the key hash goes (an older version of ours): the header is accepted on
    its chunk hash, at start-up and at load."""
    dev = make_device(tmp_path)
    c = _core(dev, fmt)
    try:
        assert c.put_many([A], [Obj(payload(1, N))]).results == [True]
        off = c.entry_offset(A.encoded)
    finally:
        c.close()
    with open(dev, "r+b") as f:
        f.seek(off + 40)
        f.write(bytes(8))
    for verify in (True, False):
        c = _core(dev, fmt, meta_verify_on_load=verify)
        try:
            out = Obj(N)
            assert c.load_many_into([A.encoded], [out]) == [True] and out.bytes() == payload(1, N)
        finally:
            c._native.close()


def test_a_device_written_by_lmcache_loads(tmp_path):
    """LMCache's header (zeros from byte 24) under a format v1 checkpoint LMCache wrote: every
    key loads, with start-up validation and without."""
    dev = make_device(tmp_path)
    keys = [A, B, _legacy("gamma", 0x77)]
    entries = {}
    for i, k in enumerate(keys):
        write_slot(dev, META + i * SLOT, k.slot_identity, payload(i, N))
        entries[k.encoded] = {"offset": META + i * SLOT, "size": N, "shape": [N], "dtype": "uint8",
                              "fmt": "BINARY", "cached_positions": None}
    write_container(dev, 0, 1, base_state(dev, len(keys), entries))
    for verify in (True, False):
        c = _core(dev, "v1", meta_verify_on_load=verify)
        try:
            for i, k in enumerate(keys):
                out = Obj(N)
                assert c.load_many_into([k.encoded], [out]) == [True] and out.bytes() == payload(i, N)
        finally:
            c._native.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_damaged_key_hash_is_a_miss(tmp_path, fmt):
    """A key hash that is neither this key's nor zero (another writer's, a flipped bit) is not
    this key's header."""
    dev = make_device(tmp_path)
    c = _core(dev, fmt)
    try:
        assert c.put_many([A], [Obj(payload(1, N))]).results == [True]
        off = c.entry_offset(A.encoded)
    finally:
        c.close()
    with open(dev, "r+b") as f:
        f.seek(off + 40)
        f.write(struct.pack("<Q", _expected_key_hash(A) ^ 1))
    c = _core(dev, fmt, meta_verify_on_load=False)
    try:
        assert c.load_many_into([A.encoded], [Obj(N)]) == [False]
    finally:
        c._native.close()
    c = _core(dev, fmt)
    try:
        assert c.exists_many([A.encoded]) == [False]
    finally:
        c._native.close()
