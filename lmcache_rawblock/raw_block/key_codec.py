"""Key codec of the raw-block tier: encoded index keys and the u64 slot identity written in
each slot header. Same functions and outputs as LMCache's ``raw_block.key_codec``.

* legacy namespace: ``CacheEngineKey.to_string()``; identity = ``chunk_hash & (2**64-1)``.
* object namespace, LMCache releases whose ``ObjectKey`` has ``object_group_id`` (0.5.6):
  ``quote(model, safe="")@<kv_rank as #010x>@<object_group_id hex>@<chunk_hash hex>[@salt]``;
  older releases (no ``object_group_id``): the same without the group field. A key is
  encoded in the form its own class has; both forms decode.
  Identity = BLAKE2b with an 8-byte digest of the UTF-8 key, read little-endian.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, unquote

from ._lmcache import CacheEngineKey, LayerCacheEngineKey, ObjectKey, parse_cache_key

RawBlockKeyNamespace = Literal["legacy", "object"]

_SEP = "@"
_UINT64_MASK = (1 << 64) - 1
_HEX = frozenset(string.hexdigits)


def _has_group_field(cls: Any) -> bool:
    fields = getattr(cls, "__dataclass_fields__", None)
    if fields is not None:
        return "object_group_id" in fields
    return hasattr(cls, "object_group_id")


# True when the ObjectKey of the LMCache in use carries object_group_id (the 0.5.6 form).
OBJECT_KEYS_HAVE_GROUP = _has_group_field(ObjectKey)


@dataclass(frozen=True)
class RawBlockKeySpec:
    """``encoded`` is the index key; ``slot_identity`` the u64 written in the slot header."""

    encoded: str
    slot_identity: int

    @classmethod
    def for_object(cls, model_name: str, kv_rank: int, chunk_hash: bytes, **fields: Any) -> RawBlockKeySpec:
        """The spec of the LMCache object key with these fields (``object_group_id``,
        ``cache_salt`` among ``fields``): what :func:`encode_object_key` gives for the
        ``ObjectKey`` of the LMCache in use, without importing that class. For a core opened
        with ``key_namespace="object"``."""
        return encode_object_key(ObjectKey(chunk_hash=bytes(chunk_hash), model_name=model_name,
                                           kv_rank=int(kv_rank), **fields))


def object_key_to_string(key: Any) -> str:
    parts = [quote(key.model_name, safe=""), format(int(key.kv_rank), "#010x")]
    group = getattr(key, "object_group_id", None)
    if group is not None:
        group = int(group)
        if group < 0:
            raise ValueError(f"object_group_id must be >= 0, got {group}")
        parts.append(format(group, "x"))
    parts.append(bytes(key.chunk_hash).hex())
    salt = getattr(key, "cache_salt", "") or ""
    if salt:
        parts.append(salt)
    return _SEP.join(parts)


def _object_slot_identity(encoded: str) -> int:
    return int.from_bytes(hashlib.blake2b(encoded.encode("utf-8"), digest_size=8).digest(), "little")


def encode_object_key(key: Any) -> RawBlockKeySpec:
    encoded = object_key_to_string(key)
    return RawBlockKeySpec(encoded=encoded, slot_identity=_object_slot_identity(encoded))


def _is_hex(s: str, *, even: bool = False) -> bool:
    return bool(s) and _HEX.issuperset(s) and (not even or len(s) % 2 == 0)


def decode_object_key(encoded: str) -> Any:
    """An ObjectKey back from either encoding.

    5 fields: model, rank, group, chunk, salt. 3 fields: model, rank, chunk (the form without
    groups, unsalted). 4 fields are either the grouped form without salt or the ungrouped form
    with one: when only one reading has hex where the chunk hash (and group) must be, that
    one; otherwise the form of the LMCache in use, as LMCache itself reads them (where only
    the other reading fits, LMCache raises ValueError).
    """
    parts = encoded.split(_SEP)
    if len(parts) == 5:
        grouped = True
    elif len(parts) == 3:
        grouped = False
    elif len(parts) == 4:
        can_be_grouped = _is_hex(parts[2]) and _is_hex(parts[3], even=True)
        can_be_salted = _is_hex(parts[2], even=True)
        grouped = can_be_grouped if can_be_grouped != can_be_salted else OBJECT_KEYS_HAVE_GROUP
    else:
        raise ValueError(f"Invalid raw-block ObjectKey encoding: {encoded!r}")
    if grouped:
        model, rank, group_s, chunk = parts[:4]
        salt = parts[4] if len(parts) == 5 else ""
        group = int(group_s, 16)
    else:
        model, rank, chunk = parts[:3]
        salt = parts[3] if len(parts) == 4 else ""
        group = 0
    kw: dict[str, Any] = {"chunk_hash": bytes.fromhex(chunk), "model_name": unquote(model),
                          "kv_rank": int(rank, 16), "cache_salt": salt}
    if OBJECT_KEYS_HAVE_GROUP:
        kw["object_group_id"] = group
    elif group:
        raise ValueError(f"raw-block ObjectKey {encoded!r} has object_group_id {group}, which this LMCache's "
                         "ObjectKey cannot hold")
    return ObjectKey(**kw)


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
