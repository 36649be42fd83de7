"""lmcache_rawblock: a C core for LMCache's raw-block SSD tier.

* ``RawBlockDevice``: drop-in for ``lmcache_rust_raw_block_io.RawBlockDevice``
  (``lmcache_rawblock.compat.install()`` makes LMCache's own code import it under that name).
* ``RawBlockCore`` and friends: drop-in for LMCache's ``lmcache.v1.storage_backend.raw_block``.
* ``RustRawBlockBackend``: drop-in for LMCache's raw-block storage plugin
  (``storage_plugin.<name>.module_path: lmcache_rawblock.plugin``).
"""

from __future__ import annotations

from typing import Any

from . import raw_block as _raw_block
from ._native import RawBlockDevice, __version__
from .raw_block import *  # noqa: F403  (the raw_block package's __all__: LMCache's API)

__all__ = ["RawBlockDevice", "RustRawBlockBackend", "__version__", *_raw_block.__all__]


def __getattr__(name: str) -> Any:
    # The plugin imports LMCache's plugin interface when available, which is heavy: load it
    # only when asked for.
    if name == "RustRawBlockBackend":
        from .plugin import RustRawBlockBackend

        return RustRawBlockBackend
    raise AttributeError(f"module 'lmcache_rawblock' has no attribute {name!r}")
