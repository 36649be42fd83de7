"""Where the installed LMCache keeps the modules this package and its tests talk about.

LMCache moved modules between releases, with no alias left at the old path:

* the raw-block package (``RawBlockCore``, its config and key codec): under
  ``lmcache.v1.storage_backend.raw_block`` in 0.5.6, under
  ``lmcache.v1.distributed.l2_adapters.raw_block`` from 0.5.7;
* the in-process engine (``event_manager``, ``cache_engine``, ``manager``...): under
  ``lmcache.v1`` in 0.5.6, under ``lmcache.inprocess.v1`` from 0.5.7.

The storage plugin (``lmcache.v1.storage_backend.plugins.rust_raw_block_backend``), the MP
raw-block adapter (``lmcache.v1.distributed.l2_adapters.raw_block_l2_adapter``) and the rest
of ``lmcache.v1`` (``config``, ``metadata``, ``memory_management``, ``storage_backend``...)
stayed where they were.

The answer comes from the files of the installed ``lmcache`` package, found without importing
it (importing LMCache imports torch, which takes seconds): each location list is tried newest
first and the first that exists wins. Where LMCache is not installed, the newest layout is
the answer, so names (the core's logger) do not depend on whether LMCache is present in a
way that would change again on upgrade.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
from types import ModuleType

LMCACHE_DIST = "lmcache"

# Every layout of a moved module, newest first.
RAW_BLOCK_PACKAGES = (
    "lmcache.v1.distributed.l2_adapters.raw_block",  # 0.5.7 and later
    "lmcache.v1.storage_backend.raw_block",  # 0.5.6
)
INPROCESS_PREFIXES = (
    "lmcache.inprocess.v1",  # 0.5.7 and later (deprecated there in favour of MP mode)
    "lmcache.v1",  # 0.5.6
)

# Modules at the same path in every supported version.
PLUGIN_MODULE = "lmcache.v1.storage_backend.plugins.rust_raw_block_backend"
L2_ADAPTER_MODULE = "lmcache.v1.distributed.l2_adapters.raw_block_l2_adapter"
# MP mode's per-request serve-or-recompute hook: 0.5.7 and later only.
KV_LOAD_POLICY_MODULE = "lmcache.v1.multiprocess.kv_load_policy"


@functools.lru_cache(maxsize=1)
def _lmcache_roots() -> tuple[str, ...]:
    """The directories of the installed ``lmcache`` package, () when it is not installed."""
    try:
        spec = importlib.util.find_spec(LMCACHE_DIST)
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    return tuple(spec.submodule_search_locations)


def lmcache_installed() -> bool:
    """Whether an ``lmcache`` package is importable (its files exist; nothing is imported)."""
    return bool(_lmcache_roots())


def lmcache_version() -> str | None:
    """The installed ``lmcache`` distribution's version, None when it is not installed."""
    try:
        return importlib.metadata.version(LMCACHE_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None


def has_module(name: str) -> bool:
    """Whether the installed LMCache has module or package ``name`` (``lmcache.<...>``), by its
    files: a package directory with ``__init__``, a ``.py`` file or a compiled extension."""
    if name != LMCACHE_DIST and not name.startswith(LMCACHE_DIST + "."):
        raise ValueError(f"has_module: name must be lmcache or lmcache.<module>, got {name!r}")
    parts = name.split(".")[1:]
    for root in _lmcache_roots():
        base = os.path.join(root, *parts)
        if not parts or os.path.isfile(os.path.join(base, "__init__.py")) or os.path.isfile(base + ".py"):
            return True
        folder, leaf = os.path.split(base)
        if os.path.isdir(folder) and any(f.startswith(leaf + ".") and f.endswith((".so", ".pyd"))
                                         for f in os.listdir(folder)):
            return True
    return False


def _first_present(candidates: tuple[str, ...]) -> str:
    for name in candidates:
        if has_module(name):
            return name
    return candidates[0]


def raw_block_package() -> str:
    """The dotted name of LMCache's raw-block package in the installed version."""
    return _first_present(RAW_BLOCK_PACKAGES)


def raw_block_module(sub: str) -> str:
    """A module of LMCache's raw-block package, e.g. ``raw_block_module("core")``."""
    if not sub or not sub.replace("_", "a").replace(".", "a").isalnum():
        raise ValueError(f"raw_block_module: sub must be a dotted module name, got {sub!r}")
    return f"{raw_block_package()}.{sub}"


def raw_block_core_logger() -> str:
    """The logger name of LMCache's raw-block core in the installed version; our core logs under it."""
    return raw_block_module("core")


def inprocess_module(name: str) -> str:
    """The dotted name of an in-process engine module, e.g. ``inprocess_module("event_manager")``
    is ``lmcache.inprocess.v1.event_manager`` on 0.5.7 and ``lmcache.v1.event_manager`` on 0.5.6."""
    if not name or name.startswith(".") or not name.replace("_", "a").replace(".", "a").isalnum():
        raise ValueError(f"inprocess_module: name must be a dotted module name under v1, got {name!r}")
    return _first_present(tuple(f"{prefix}.{name}" for prefix in INPROCESS_PREFIXES))


def import_raw_block(sub: str | None = None) -> ModuleType:
    """Import LMCache's raw-block package (or its module ``sub``) from where the installed version has it."""
    return importlib.import_module(raw_block_module(sub) if sub else raw_block_package())


def import_inprocess(name: str) -> ModuleType:
    """Import an in-process engine module from where the installed version has it."""
    return importlib.import_module(inprocess_module(name))


def import_kv_load_policy() -> ModuleType:
    """LMCache's MP load-policy module (``KVLoadPolicy``); ImportError naming the installed
    version where it has none (0.5.6 and before)."""
    if not has_module(KV_LOAD_POLICY_MODULE):
        raise ImportError(f"the installed LMCache ({lmcache_version()}) has no {KV_LOAD_POLICY_MODULE}: "
                          "MP load policies need LMCache 0.5.7 or later")
    return importlib.import_module(KV_LOAD_POLICY_MODULE)


def layout() -> dict[str, str | None]:
    """What this module resolved, for reports and diagnostics."""
    return {
        "lmcache": lmcache_version(),
        "raw_block": raw_block_package() if lmcache_installed() else None,
        "plugin": PLUGIN_MODULE if has_module(PLUGIN_MODULE) else None,
        "l2_adapter": L2_ADAPTER_MODULE if has_module(L2_ADAPTER_MODULE) else None,
        "inprocess": inprocess_module("event_manager").rpartition(".")[0] if lmcache_installed() else None,
    }


def clear_cache() -> None:
    """Forget where LMCache was found (after installing or removing it in a running process)."""
    _lmcache_roots.cache_clear()


__all__ = [
    "INPROCESS_PREFIXES",
    "KV_LOAD_POLICY_MODULE",
    "L2_ADAPTER_MODULE",
    "LMCACHE_DIST",
    "PLUGIN_MODULE",
    "RAW_BLOCK_PACKAGES",
    "clear_cache",
    "has_module",
    "import_inprocess",
    "import_kv_load_policy",
    "import_raw_block",
    "inprocess_module",
    "layout",
    "lmcache_installed",
    "lmcache_version",
    "raw_block_core_logger",
    "raw_block_module",
    "raw_block_package",
]
