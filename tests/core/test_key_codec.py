"""Key codec: encodings, decodings and slot identities (LMCache's formats)."""

import hashlib

import pytest

from lmcache_rawblock.raw_block import (
    decode_legacy_key,
    decode_object_key,
    encode_legacy_key,
    encode_object_key,
    object_key_to_string,
    slot_identity_from_encoded_key,
)
from lmcache_rawblock.raw_block._lmcache import CacheEngineKey, LayerCacheEngineKey, ObjectKey


def _ok(h=b"\x01\x02", model="m", rank=0, salt=""):
    return ObjectKey(chunk_hash=h, model_name=model, kv_rank=rank, cache_salt=salt)


def test_object_key_string_format():
    # LMCache 0.5.6: model@rank@object_group_id@chunk[@salt]
    assert object_key_to_string(_ok(b"\xab\xcd", "org/model", 3)) == "org%2Fmodel@0x00000003@0@abcd"
    assert object_key_to_string(_ok(b"\x00", "m", 0x1234, "s1")) == "m@0x00001234@0@00@s1"
    # wider than 8 hex digits when the rank needs it
    assert object_key_to_string(_ok(b"\x00", "m", 0x1_0000_0000)) == "m@0x100000000@0@00"
    # '@' in a model name is escaped, '-' kept
    assert object_key_to_string(_ok(b"\x00", "a@b-c", 0)) == "a%40b-c@0x00000000@0@00"


@pytest.mark.parametrize("model", ["model-SEP-name", "org/sub/model", "plain", "ünï"])
def test_object_key_round_trip(model):
    key = _ok(bytes(range(16)), model, 7, "salt")
    spec = encode_object_key(key)
    if "/" in model:
        assert "%2F" in spec.encoded
    back = decode_object_key(spec.encoded)
    assert (back.chunk_hash, back.model_name, back.kv_rank, back.cache_salt) == (
        key.chunk_hash, key.model_name, key.kv_rank, key.cache_salt)


def test_object_slot_identity_is_blake2b64_le():
    spec = encode_object_key(_ok(b"\x11" * 8, "m", 1))
    want = int.from_bytes(hashlib.blake2b(spec.encoded.encode(), digest_size=8).digest(), "little")
    assert spec.slot_identity == want
    assert slot_identity_from_encoded_key(spec.encoded, "object") == want


@pytest.mark.parametrize("bad", ["a@b", "a@b@c@d@e@f", "nosep"])
def test_decode_object_key_rejects_bad_part_counts(bad):
    with pytest.raises(ValueError, match="Invalid raw-block ObjectKey encoding"):
        decode_object_key(bad)


def test_legacy_key_encoding_and_identity():
    key = CacheEngineKey("test_model", 1, 0, 12345, "bfloat16")
    spec = encode_legacy_key(key)
    assert spec.encoded == "test_model@1@0@3039@bfloat16"
    assert spec.slot_identity == 12345
    assert slot_identity_from_encoded_key(spec.encoded, "legacy") == 12345
    big = CacheEngineKey("m", 1, 0, (1 << 70) + 5, "half")
    assert encode_legacy_key(big).slot_identity == ((1 << 70) + 5) & ((1 << 64) - 1)
    assert decode_legacy_key(spec.encoded).chunk_hash == 12345


def test_legacy_layer_keys_share_identity():
    a = LayerCacheEngineKey("m", 1, 0, 99, "half", {}, 0)
    b = LayerCacheEngineKey("m", 1, 0, 99, "half", {}, 1)
    assert encode_legacy_key(a).encoded != encode_legacy_key(b).encoded
    assert encode_legacy_key(a).slot_identity == encode_legacy_key(b).slot_identity == 99


def test_unknown_namespace():
    with pytest.raises(ValueError, match="Unsupported raw-block key namespace"):
        slot_identity_from_encoded_key("x", "other")
