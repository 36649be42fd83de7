"""lmcache_rawblock: a C core for LMCache's raw-block SSD tier.

* ``RawBlockDevice``: drop-in for ``lmcache_rust_raw_block_io.RawBlockDevice``
  (``lmcache_rawblock.compat.install()`` makes LMCache's own code import it under that name).
* ``RawBlockCore`` and friends: drop-in for LMCache's raw-block package
  (``lmcache.v1.distributed.l2_adapters.raw_block``; ``lmcache.v1.storage_backend.raw_block``
  before 0.5.7: ``lmcache_rawblock.lmcache_paths`` resolves the installed one).
* ``RustRawBlockBackend``: drop-in for LMCache's raw-block storage plugin
  (``storage_plugin.<name>.module_path: lmcache_rawblock.plugin``).
"""

from __future__ import annotations

import importlib
from typing import Any

from ._native import RawBlockDevice, __version__

# LMCache's raw-block API, re-exported from .raw_block. That package uses LMCache's own
# classes (and torch) when they are installed, which takes seconds to import, so it is loaded
# on first use of one of these names: ``import lmcache_rawblock`` imports neither torch nor
# lmcache. tests/package/test_package.py checks this list against raw_block.__all__.
_RAW_BLOCK_NAMES = (
    "DEFAULT_IOURING_QUEUE_DEPTH", "MultiDeviceConfig", "MultiDeviceCore",
    "NativeQuiescence", "RAW_BLOCK_IO_ENGINES", "RawBlockCloseOutcome",
    "RawBlockCore", "RawBlockCoreConfig", "RawBlockKeyNamespace", "RawBlockKeySpec", "RawBlockPutManyResult",
    "decode_legacy_key", "decode_object_key", "encode_legacy_key", "encode_object_key",
    "normalize_raw_block_io_engine", "normalize_raw_block_placement_ids", "object_key_to_string", "round_up",
    "slot_identity_from_encoded_key", "validate_raw_block_io_options",
)

__all__ = ["RawBlockDevice", "RustRawBlockBackend", "__version__", *_RAW_BLOCK_NAMES]


def __getattr__(name: str) -> Any:
    if name in _RAW_BLOCK_NAMES:
        value = getattr(importlib.import_module(".raw_block", __name__), name)
    elif name == "RustRawBlockBackend":
        # The plugin imports LMCache's plugin interface when available.
        value = importlib.import_module(".plugin", __name__).RustRawBlockBackend
    else:
        raise AttributeError(f"module 'lmcache_rawblock' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
