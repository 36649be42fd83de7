"""Make ``import lmcache_rust_raw_block_io`` resolve to our C module.

LMCache's Python stack (``RawBlockCore``, ``RustRawBlockBackend``) imports the Rust PyO3
module ``lmcache_rust_raw_block_io`` and uses its ``RawBlockDevice``. After ``install()``
that import yields a module whose ``RawBlockDevice`` is ours. The published wheel is a
package with an inner extension module of the same name
(``lmcache_rust_raw_block_io.lmcache_rust_raw_block_io``); both names are registered.
"""

from __future__ import annotations

import sys
import types

RUST_MODULE = "lmcache_rust_raw_block_io"

_installed: dict[str, types.ModuleType | None] = {}


def _make_module(name: str) -> types.ModuleType:
    from . import _native

    mod = types.ModuleType(name, "lmcache_rawblock's C RawBlockDevice, registered by lmcache_rawblock.compat")
    mod.RawBlockDevice = _native.RawBlockDevice  # type: ignore[attr-defined]
    mod.__all__ = ["RawBlockDevice"]  # type: ignore[attr-defined]
    mod.__lmcache_rawblock__ = True  # type: ignore[attr-defined]
    return mod


def install(*, replace: bool = True) -> types.ModuleType:
    """Register our module as ``lmcache_rust_raw_block_io``.

    With ``replace=False`` an already imported Rust module is left in place and returned.
    Returns the module that ``import lmcache_rust_raw_block_io`` now yields.
    """
    current = sys.modules.get(RUST_MODULE)
    if current is not None and getattr(current, "__lmcache_rawblock__", False):
        return current
    if current is not None and not replace:
        return current
    outer = _make_module(RUST_MODULE)
    inner = _make_module(f"{RUST_MODULE}.{RUST_MODULE}")
    outer.__path__ = []  # type: ignore[attr-defined]  # a package, so the inner name imports
    outer.lmcache_rust_raw_block_io = inner  # type: ignore[attr-defined]
    for name, mod in ((RUST_MODULE, outer), (f"{RUST_MODULE}.{RUST_MODULE}", inner)):
        if name not in _installed:
            _installed[name] = sys.modules.get(name)
        sys.modules[name] = mod
    return outer


def uninstall() -> None:
    """Undo ``install()``, restoring whatever was imported before (or nothing)."""
    for name, previous in list(_installed.items()):
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
        del _installed[name]


def is_installed() -> bool:
    return getattr(sys.modules.get(RUST_MODULE), "__lmcache_rawblock__", False)
