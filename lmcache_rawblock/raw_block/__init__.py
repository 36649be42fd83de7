"""Drop-in for LMCache's raw-block package (``lmcache.v1.distributed.l2_adapters.raw_block``,
``lmcache.v1.storage_backend.raw_block`` before 0.5.7), backed by the C core in
``lmcache_rawblock._native``."""

from __future__ import annotations

from .config import (
    DEFAULT_IOURING_QUEUE_DEPTH,
    RAW_BLOCK_IO_ENGINES,
    RawBlockCoreConfig,
    RawBlockPutManyResult,
    normalize_raw_block_io_engine,
    normalize_raw_block_placement_ids,
    round_up,
    validate_raw_block_io_options,
)
from .core import NativeQuiescence, RawBlockCloseOutcome, RawBlockCore
from .key_codec import (
    RawBlockKeyNamespace,
    RawBlockKeySpec,
    decode_legacy_key,
    decode_object_key,
    encode_legacy_key,
    encode_object_key,
    object_key_to_string,
    slot_identity_from_encoded_key,
)
from .multi import MultiDeviceConfig, MultiDeviceCore

__all__ = [
    "DEFAULT_IOURING_QUEUE_DEPTH",
    "MultiDeviceConfig",
    "MultiDeviceCore",
    "NativeQuiescence",
    "RAW_BLOCK_IO_ENGINES",
    "RawBlockCloseOutcome",
    "RawBlockCore",
    "RawBlockCoreConfig",
    "RawBlockKeyNamespace",
    "RawBlockKeySpec",
    "RawBlockPutManyResult",
    "decode_legacy_key",
    "decode_object_key",
    "encode_legacy_key",
    "encode_object_key",
    "normalize_raw_block_io_engine",
    "normalize_raw_block_placement_ids",
    "object_key_to_string",
    "round_up",
    "slot_identity_from_encoded_key",
    "validate_raw_block_io_options",
]
