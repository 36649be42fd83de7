"""Make ``import lmcache_rust_raw_block_io`` resolve to our C module.

LMCache's Python stack (``RawBlockCore``, ``RustRawBlockBackend``) imports the Rust PyO3
module ``lmcache_rust_raw_block_io`` and uses its ``RawBlockDevice``. After ``install()``
that import yields a module whose ``RawBlockDevice`` is ours. The published wheel is a
package with an inner extension module of the same name
(``lmcache_rust_raw_block_io.lmcache_rust_raw_block_io``); both names are registered.

The modules are real modules to importlib: each has a ``ModuleSpec`` whose loader is
``RawBlockShimLoader``, and a finder at the front of ``sys.meta_path`` answers
``importlib.util.find_spec`` for both names, before and after they are imported, and
``importlib.reload``. ``uninstall()`` removes the finder and restores ``sys.modules``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence

RUST_MODULE = "lmcache_rust_raw_block_io"
INNER_MODULE = f"{RUST_MODULE}.{RUST_MODULE}"
_NAMES = (RUST_MODULE, INNER_MODULE)

_installed: dict[str, types.ModuleType | None] = {}


class RawBlockShimLoader(importlib.abc.Loader):
    """Loads ``lmcache_rust_raw_block_io`` (and its inner module) as our C device module."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        from . import _native

        module.__doc__ = "lmcache_rawblock's C RawBlockDevice, registered by lmcache_rawblock.compat"
        # Attributes ModuleType does not declare go straight into the module's namespace.
        vars(module).update(RawBlockDevice=_native.RawBlockDevice, __all__=["RawBlockDevice"],
                            __lmcache_rawblock__=True)
        if module.__name__ == RUST_MODULE:
            inner = sys.modules.get(INNER_MODULE)
            if inner is not None and getattr(inner, "__lmcache_rawblock__", False):
                vars(module)[RUST_MODULE] = inner


class RawBlockShimFinder(importlib.abc.MetaPathFinder):
    """Finds the two shimmed names while the shim is installed."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _NAMES:
            return None
        return _spec(fullname)


_LOADER = RawBlockShimLoader()
_FINDER = RawBlockShimFinder()


def _spec(name: str) -> importlib.machinery.ModuleSpec:
    from . import _native

    spec = importlib.machinery.ModuleSpec(name, _LOADER, origin=getattr(_native, "__file__", None),
                                          is_package=name == RUST_MODULE)
    if name == RUST_MODULE:
        spec.submodule_search_locations = []
    spec.has_location = False  # the origin names the C module that provides it, not a source
    return spec


def _load(name: str) -> types.ModuleType:
    spec = _spec(name)
    mod = importlib.util.module_from_spec(spec)
    _LOADER.exec_module(mod)
    return mod


def _add_finder() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def _remove_finder() -> None:
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install(*, replace: bool = True) -> types.ModuleType:
    """Register our module as ``lmcache_rust_raw_block_io``.

    With ``replace=False`` an already imported Rust module is left in place and returned.
    Returns the module that ``import lmcache_rust_raw_block_io`` now yields.
    """
    current = sys.modules.get(RUST_MODULE)
    if current is not None and getattr(current, "__lmcache_rawblock__", False):
        _add_finder()
        return current
    if current is not None and not replace:
        return current
    inner = _load(INNER_MODULE)
    outer = _load(RUST_MODULE)
    vars(outer)[RUST_MODULE] = inner
    for name, mod in ((RUST_MODULE, outer), (INNER_MODULE, inner)):
        if name not in _installed:
            _installed[name] = sys.modules.get(name)
        sys.modules[name] = mod
    _add_finder()
    importlib.invalidate_caches()
    return outer


def uninstall() -> None:
    """Undo ``install()``, restoring whatever was imported before (or nothing); the finder
    is removed, so ``find_spec`` again answers as it did before ``install()``."""
    _remove_finder()
    for name, previous in list(_installed.items()):
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
        del _installed[name]
    for name in _NAMES:  # shim modules imported (again) through the finder after install()
        if getattr(sys.modules.get(name), "__lmcache_rawblock__", False):
            sys.modules.pop(name, None)
    importlib.invalidate_caches()


def is_installed() -> bool:
    return getattr(sys.modules.get(RUST_MODULE), "__lmcache_rawblock__", False)

