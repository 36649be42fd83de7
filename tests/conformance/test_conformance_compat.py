"""The compat shim's modules look like real modules to importlib: a ModuleSpec with a loader,
``importlib.util.find_spec`` before and after import (LMCache's own tests call it at import
time), ``importlib.reload``, and ``uninstall()`` restoring what was there."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import textwrap

import pytest

from lmcache_rawblock import RawBlockDevice, compat

NAMES = ("lmcache_rust_raw_block_io", "lmcache_rust_raw_block_io.lmcache_rust_raw_block_io")


def _spec_summary(name):
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # the inner name of a package that is not installed
        return ("missing",)
    return None if spec is None else (spec.name, spec.origin, type(spec.loader).__name__)


@pytest.fixture
def clean_modules():
    saved = {k: sys.modules.get(k) for k in NAMES}
    meta_path = list(sys.meta_path)
    compat.uninstall()
    yield
    compat.uninstall()
    for k, v in saved.items():
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v
    sys.meta_path[:] = meta_path


def test_find_spec_after_install_and_import(clean_modules):
    mod = compat.install()
    for name in NAMES:
        spec = importlib.util.find_spec(name)  # ValueError if __spec__ were None
        assert spec is not None and spec.name == name
        assert isinstance(spec.loader, compat.RawBlockShimLoader)
        assert sys.modules[name].__spec__ is spec or sys.modules[name].__spec__.name == name
        assert sys.modules[name].__loader__ is spec.loader
    assert mod.__spec__.submodule_search_locations == []
    assert mod.__path__ == []
    import lmcache_rust_raw_block_io as rbio

    assert rbio is mod and rbio.RawBlockDevice is RawBlockDevice
    assert importlib.util.find_spec(NAMES[0]).origin == compat._spec(NAMES[0]).origin


def test_find_spec_and_import_before_the_module_is_imported(clean_modules):
    compat.install()
    for name in NAMES:
        sys.modules.pop(name, None)
    # not imported yet: the finder answers
    spec = importlib.util.find_spec(NAMES[0])
    assert spec is not None and isinstance(spec.loader, compat.RawBlockShimLoader)
    inner = importlib.import_module(NAMES[1])
    outer = sys.modules[NAMES[0]]
    assert inner.RawBlockDevice is RawBlockDevice and outer.RawBlockDevice is RawBlockDevice
    assert outer.lmcache_rust_raw_block_io is inner
    assert compat.is_installed()


def test_reload_keeps_our_device(clean_modules):
    mod = compat.install()
    again = importlib.reload(mod)
    assert again is mod and again.RawBlockDevice is RawBlockDevice
    assert again.__spec__.name == NAMES[0]


def test_uninstall_restores_find_spec_and_modules(clean_modules):
    before = {name: _spec_summary(name) for name in NAMES}
    compat.install()
    compat.install()  # idempotent: one finder
    assert sum(f is compat._FINDER for f in sys.meta_path) == 1
    compat.uninstall()
    assert compat._FINDER not in sys.meta_path
    assert not any(getattr(sys.modules.get(n), "__lmcache_rawblock__", False) for n in NAMES)
    assert {name: _spec_summary(name) for name in NAMES} == before


def test_uninstall_puts_back_a_previously_imported_module(clean_modules):
    sentinel = type(sys)(NAMES[0])
    sentinel.__spec__ = importlib.machinery.ModuleSpec(NAMES[0], None)
    sys.modules[NAMES[0]] = sentinel
    assert compat.install(replace=False) is sentinel
    assert compat.install() is not sentinel
    compat.uninstall()
    assert sys.modules[NAMES[0]] is sentinel


def test_find_spec_at_import_time_in_a_fresh_interpreter():
    """What a test module written for the Rust wheel does at import, after the shim."""
    code = textwrap.dedent(
        """
        import importlib.util, sys
        import lmcache_rawblock.compat as c
        c.install()
        import lmcache_rust_raw_block_io
        spec = importlib.util.find_spec("lmcache_rust_raw_block_io")
        assert spec is not None and spec.loader is not None, spec
        assert importlib.util.find_spec("lmcache_rust_raw_block_io.lmcache_rust_raw_block_io") is not None
        from lmcache_rust_raw_block_io import RawBlockDevice
        import lmcache_rawblock
        assert RawBlockDevice is lmcache_rawblock.RawBlockDevice
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
