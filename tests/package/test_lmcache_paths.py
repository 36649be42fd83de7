"""Where LMCache's moved modules are: resolved from the files of the installed LMCache, newest
layout first, without importing LMCache. Fake ``lmcache`` trees of each layout stand in for the
releases; the real installed one is checked where present."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from lmcache_rawblock import lmcache_paths

NEW_RB = "lmcache.v1.distributed.l2_adapters.raw_block"
OLD_RB = "lmcache.v1.storage_backend.raw_block"


def _tree(root: Path, *modules: str) -> Path:
    """A fake installed ``lmcache`` holding ``modules`` (dotted, under lmcache)."""
    for name in ("lmcache", *modules):
        parts = name.split(".")
        d = root.joinpath(*parts)
        d.mkdir(parents=True, exist_ok=True)
        for i in range(1, len(parts) + 1):
            (root.joinpath(*parts[:i]) / "__init__.py").touch()
    return root


@pytest.fixture
def layout_of(tmp_path, monkeypatch):
    """Point the resolver at a fake lmcache tree made of the given packages."""

    def make(*modules: str) -> None:
        root = _tree(tmp_path / "site", *modules)
        monkeypatch.setattr(lmcache_paths, "_lmcache_roots", lambda: (str(root / "lmcache"),))

    return make


def test_a_0_5_6_layout_resolves_to_the_storage_backend_paths(layout_of):
    layout_of(OLD_RB, "lmcache.v1.event_manager", "lmcache.v1.config")
    assert lmcache_paths.raw_block_package() == OLD_RB
    assert lmcache_paths.raw_block_core_logger() == OLD_RB + ".core"
    assert lmcache_paths.inprocess_module("event_manager") == "lmcache.v1.event_manager"


def test_a_0_5_7_layout_resolves_to_the_distributed_and_inprocess_paths(layout_of):
    layout_of(NEW_RB, "lmcache.inprocess.v1.event_manager", "lmcache.v1.config")
    assert lmcache_paths.raw_block_package() == NEW_RB
    assert lmcache_paths.raw_block_module("key_codec") == NEW_RB + ".key_codec"
    assert lmcache_paths.inprocess_module("event_manager") == "lmcache.inprocess.v1.event_manager"
    # A module that stayed in lmcache.v1 is found there.
    assert lmcache_paths.inprocess_module("config") == "lmcache.v1.config"


def test_a_plain_module_file_counts_as_present(tmp_path, monkeypatch):
    root = _tree(tmp_path / "site", "lmcache.v1")
    (root / "lmcache" / "v1" / "event_manager.py").write_text("")
    monkeypatch.setattr(lmcache_paths, "_lmcache_roots", lambda: (str(root / "lmcache"),))
    assert lmcache_paths.has_module("lmcache.v1.event_manager")
    assert not lmcache_paths.has_module("lmcache.v1.cache_engine")


def test_without_lmcache_the_newest_layout_is_the_answer(monkeypatch):
    monkeypatch.setattr(lmcache_paths, "_lmcache_roots", lambda: ())
    assert not lmcache_paths.lmcache_installed()
    assert lmcache_paths.raw_block_package() == lmcache_paths.RAW_BLOCK_PACKAGES[0] == NEW_RB
    assert lmcache_paths.layout()["raw_block"] is None


@pytest.mark.parametrize("call, arg", [(lmcache_paths.has_module, "torch.nn"),
                                       (lmcache_paths.inprocess_module, "../event_manager"),
                                       (lmcache_paths.raw_block_module, "")])
def test_bad_names_are_refused_with_the_value(call, arg):
    with pytest.raises(ValueError, match=repr(arg).replace(".", r"\.")):
        call(arg)


def test_our_core_logs_under_the_resolved_name():
    from lmcache_rawblock.raw_block import core

    assert core.logger is logging.getLogger(lmcache_paths.raw_block_core_logger())


def test_resolving_imports_neither_lmcache_nor_torch():
    code = ("import sys; from lmcache_rawblock import lmcache_paths as p; p.layout(); p.raw_block_core_logger(); "
            "bad = [m for m in ('lmcache', 'torch') if m in sys.modules]; sys.exit(', '.join(bad) or None)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(importlib.util.find_spec("lmcache") is None, reason="LMCache is not installed here")
def test_the_installed_lmcache_has_what_is_resolved():
    for name in (lmcache_paths.raw_block_package(), lmcache_paths.raw_block_module("core"),
                 lmcache_paths.inprocess_module("event_manager"), lmcache_paths.PLUGIN_MODULE,
                 lmcache_paths.L2_ADAPTER_MODULE):
        assert importlib.util.find_spec(name) is not None, name
