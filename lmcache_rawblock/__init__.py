"""lmcache_rawblock: a C core for LMCache's raw-block SSD tier.

``RawBlockDevice`` is a drop-in for ``lmcache_rust_raw_block_io.RawBlockDevice``;
``lmcache_rawblock.compat.install()`` makes LMCache's own code import it under that name.
"""

from __future__ import annotations

from ._native import RawBlockDevice, __version__

__all__ = ["RawBlockDevice", "__version__"]
