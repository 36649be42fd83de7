"""Key codec of the raw-block tier: encoded index keys and the u64 slot identity written in
each slot header. Same functions and outputs as LMCache's ``raw_block.key_codec``.

* legacy namespace: ``CacheEngineKey.to_string()``; identity = ``chunk_hash & (2**64-1)``.
* object namespace: ``quote(model, safe="")@<kv_rank as #010x>@<chunk_hash hex>[@salt]``;
  identity = BLAKE2b with an 8-byte digest of the UTF-8 key, read little-endian.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, unquote

from ._lmcache import CacheEngineKey, LayerCacheEngineKey, ObjectKey, parse_cache_key

RawBlockKeyNamespace = Literal["legacy", "object"]

_SEP = "@"
_UINT64_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class RawBlockKeySpec:
    """``encoded`` is the index key; ``slot_identity`` the u64 written in the slot header."""

    encoded: str
    slot_identity: int


def object_key_to_string(key: Any) -> str:
    parts = [quote(key.model_name, safe=""), format(int(key.kv_rank), "#010x"), bytes(key.chunk_hash).hex()]
    salt = getattr(key, "cache_salt", "") or ""
    if salt:
        parts.append(salt)
    return _SEP.join(parts)


def _object_slot_identity(encoded: str) -> int:
    return int.from_bytes(hashlib.blake2b(encoded.encode("utf-8"), digest_size=8).digest(), "little")


def encode_object_key(key: Any) -> RawBlockKeySpec:
    encoded = object_key_to_string(key)
    return RawBlockKeySpec(encoded=encoded, slot_identity=_object_slot_identity(encoded))


def decode_object_key(encoded: str) -> Any:
    parts = encoded.split(_SEP)
    if len(parts) not in (3, 4):
        raise ValueError(f"Invalid raw-block ObjectKey encoding: {encoded!r}")
    model, rank, chunk = parts[0], parts[1], parts[2]
    salt = parts[3] if len(parts) == 4 else ""
    return ObjectKey(chunk_hash=bytes.fromhex(chunk), model_name=unquote(model), kv_rank=int(rank, 16),
                     cache_salt=salt)


def encode_legacy_key(key: Any) -> RawBlockKeySpec:
    return RawBlockKeySpec(encoded=key.to_string(), slot_identity=int(key.chunk_hash) & _UINT64_MASK)


def decode_legacy_key(encoded: str) -> Any:
    key = parse_cache_key(encoded)
    if not isinstance(key, (CacheEngineKey, LayerCacheEngineKey)):
        raise TypeError(f"Raw-block legacy key did not decode to a CacheEngineKey: {encoded!r}")
    return key


def slot_identity_from_encoded_key(encoded: str, namespace: str) -> int:
    if namespace == "legacy":
        return int(decode_legacy_key(encoded).chunk_hash) & _UINT64_MASK
    if namespace == "object":
        return _object_slot_identity(encoded)
    raise ValueError(f"Unsupported raw-block key namespace: {namespace!r}")
