"""What ``import lmcache_rawblock`` costs and exposes."""

from __future__ import annotations

import subprocess
import sys

import lmcache_rawblock
from lmcache_rawblock import raw_block

# A subprocess records every attempt to import torch or lmcache (whether or not they are
# installed), then imports the package and the modules that need neither.
_PROBE = r"""
import sys
tried = []

class Recorder:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "lmcache"):
            tried.append(name)
        return None

sys.meta_path.insert(0, Recorder())
import lmcache_rawblock
import lmcache_rawblock.settings
lmcache_rawblock.RawBlockDevice
print(",".join(tried))
"""


def test_import_does_not_import_torch_or_lmcache():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "", f"importing lmcache_rawblock tried to import: {out.strip()}"


def test_lazy_names_are_raw_block_api():
    assert set(lmcache_rawblock._RAW_BLOCK_NAMES) == set(raw_block.__all__)
    for name in raw_block.__all__:
        assert getattr(lmcache_rawblock, name) is getattr(raw_block, name)
    assert "RawBlockCore" in dir(lmcache_rawblock)
    try:
        lmcache_rawblock.no_such_name  # noqa: B018 - the attribute access is what is tested
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("an unknown attribute must raise AttributeError")


def test_the_stub_names_everything_the_extension_has():
    """_native.pyi declares every function of the module and every method of its two types (the
    test and benchmark hooks included), and nothing the extension lacks."""
    import ast
    from pathlib import Path

    from lmcache_rawblock import _native

    tree = ast.parse((Path(_native.__file__).parent / "_native.pyi").read_text())

    def declared(body) -> set[str]:
        return {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
            t.id for n in body if isinstance(n, ast.AnnAssign) for t in [n.target] if isinstance(t, ast.Name)}

    def public(obj) -> set[str]:
        return {n for n in dir(obj) if not (n.startswith("__") and n.endswith("__"))}

    assert public(_native) == declared(tree.body) - {"__version__"}
    for cls in ("RawBlockDevice", "Core"):
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        got = {n for n in declared(node.body) if not (n.startswith("__") and n.endswith("__"))}
        assert got == public(getattr(_native, cls)), cls
