"""lmcache_rawblock: a C core for LMCache's raw-block SSD tier.

* ``RawBlockDevice``: drop-in for ``lmcache_rust_raw_block_io.RawBlockDevice``
  (``lmcache_rawblock.compat.install()`` makes LMCache's own code import it under that name).
* ``RawBlockCore`` and friends: drop-in for LMCache's ``lmcache.v1.storage_backend.raw_block``.
* ``RustRawBlockBackend``: drop-in for LMCache's raw-block storage plugin
  (``storage_plugin.<name>.module_path: lmcache_rawblock.plugin``).
"""

from __future__ import annotations

from typing import Any

from ._native import RawBlockDevice, __version__
from .raw_block import (
    DEFAULT_IOURING_QUEUE_DEPTH,
    RAW_BLOCK_IO_ENGINES,
    NativeQuiescence,
    RawBlockCloseOutcome,
    RawBlockCore,
    RawBlockCoreConfig,
    RawBlockKeyNamespace,
    RawBlockKeySpec,
    RawBlockPutManyResult,
    decode_legacy_key,
    decode_object_key,
    encode_legacy_key,
    encode_object_key,
    normalize_raw_block_io_engine,
    normalize_raw_block_placement_ids,
    object_key_to_string,
    round_up,
    slot_identity_from_encoded_key,
    validate_raw_block_io_options,
)

__all__ = [
    "DEFAULT_IOURING_QUEUE_DEPTH",
    "NativeQuiescence",
    "RAW_BLOCK_IO_ENGINES",
    "RawBlockCloseOutcome",
    "RawBlockCore",
    "RawBlockCoreConfig",
    "RawBlockDevice",
    "RawBlockKeyNamespace",
    "RawBlockKeySpec",
    "RawBlockPutManyResult",
    "RustRawBlockBackend",
    "__version__",
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


def __getattr__(name: str) -> Any:
    # The plugin imports LMCache's plugin interface when available, which is heavy: load it
    # only when asked for.
    if name == "RustRawBlockBackend":
        from .plugin import RustRawBlockBackend

        return RustRawBlockBackend
    raise AttributeError(f"module 'lmcache_rawblock' has no attribute {name!r}")
