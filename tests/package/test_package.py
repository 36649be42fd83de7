"""What ``import lmcache_rawblock`` costs and exposes."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

import lmcache_rawblock
from core_helpers import Obj, make_core, make_device, okey, payload
from helpers import REPO
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


# ----------------------------------------------------------------- runtime apart from the tooling

ROOT = REPO  # the checkout
TOOLING = ("lmcache_rawblock_bench", "matplotlib", "tqdm")

# A child process with the benchmark package findable (the checkout's benchmarks/ on its path)
# runs one product path, then prints which modules of the tooling (and of its plotting and
# progress-bar dependencies) it loaded, after a marker line.
_LOADED_PROBE = r"""
import importlib.util, json, runpy, sys
assert importlib.util.find_spec("lmcache_rawblock_bench") is not None, "the probe needs the benchmark package"
ARGV = {argv!r}
code = 0
if ARGV is None:
    try:
        exec({source!r})
    except ModuleNotFoundError as exc:  # the MP adapter needs LMCache: what loaded up to it counts
        if exc.name.split(".")[0] not in ("lmcache", "torch"):
            raise
else:
    sys.argv = ["lmcache_rawblock", *ARGV]
    try:
        runpy.run_module("lmcache_rawblock", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {tooling!r})
print("\nLOADED " + json.dumps({{"code": code, "loaded": loaded}}))
"""


def _child_env() -> dict:
    path = [str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))


def _loaded(argv: list[str] | None = None, source: str = "") -> tuple[int, list[str]]:
    probe = _LOADED_PROBE.format(argv=argv, source=source, tooling=TOOLING)
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                       env=_child_env(), cwd=ROOT)
    assert "LOADED " in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(r.stdout.rsplit("LOADED ", 1)[1])
    return doc["code"], doc["loaded"]


@pytest.mark.parametrize("source", [
    "import lmcache_rawblock",
    "import lmcache_rawblock.plugin",
    "import lmcache_rawblock.l2_adapter",
    "import lmcache_rawblock.raw_block; lmcache_rawblock.RawBlockCore",
    "import lmcache_rawblock.compat, lmcache_rawblock.tools, lmcache_rawblock.reclaim",
])
def test_runtime_imports_load_no_tooling(source):
    """The plugin, the MP adapter, RawBlockCore and the tools load nothing of the benchmark
    package, matplotlib or tqdm, although the benchmark package is importable."""
    _, loaded = _loaded(source=source)
    assert loaded == [], f"{source!r} loaded {loaded}"


@pytest.mark.parametrize("argv", [["--help"], ["inspect", "--help"], ["verify", "--help"], ["fdp-status", "--help"],
                                  ["inspect", "IMAGE", "--json"], ["verify", "IMAGE"]], ids="-".join)
def test_product_commands_load_no_tooling(tmp_path, argv):
    path = make_device(tmp_path)
    core = make_core(path)
    assert all(core.put_many([okey(i) for i in range(3)], [Obj(payload(i, 5000)) for i in range(3)]).results)
    core.close()
    code, loaded = _loaded(argv=[path if a == "IMAGE" else a for a in argv])
    assert code in (0, None), f"{argv}: exit status {code}"
    assert loaded == [], f"python -m lmcache_rawblock {' '.join(argv)} loaded {loaded}"


def test_runtime_sources_import_nothing_from_the_tooling():
    """Only the command line's hand-over of bench / waf names the benchmark package (tqdm is the
    product's too: verify's progress bar on a terminal, when it is installed)."""
    offenders = []
    sources = sorted((ROOT / "lmcache_rawblock").rglob("*.py"))
    assert len(sources) > 10, f"no runtime sources under {ROOT}"
    for p in sources:
        tree = ast.parse(p.read_text())
        allowed: set[int] = set()
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and p.name == "__main__.py" and fn.name == "run_tooling":
                allowed |= {id(n) for n in ast.walk(fn)}
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.split(".")[0] in ("lmcache_rawblock_bench", "matplotlib") for n in names) \
                    and id(node) not in allowed:
                offenders.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"the runtime imports the tooling at {offenders}"


@pytest.mark.parametrize("command", ["bench", "waf"])
def test_tooling_commands_without_the_bench_package(command):
    """With lmcache_rawblock_bench not importable, bench and waf exit 2 with one line saying
    how to install it (the runtime wheel alone: tests/wheel_smoke)."""
    hide = ("import runpy, sys; sys.modules['lmcache_rawblock_bench'] = None; "
            f"sys.argv = ['lmcache_rawblock', {command!r}, '--help']; "
            "runpy.run_module('lmcache_rawblock', run_name='__main__', alter_sys=True)")
    r = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=60,
                       env=_child_env(), cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        f"python -m lmcache_rawblock {command}: not installed: bench and waf come with the "
        "lmcache-rawblock-bench distribution (from a checkout: pip install ./benchmarks)"]


@pytest.mark.parametrize("module", ["lmcache_rawblock", "lmcache_rawblock_bench"])
def test_tooling_commands_with_the_bench_package(module):
    r = subprocess.run([sys.executable, "-m", module, "waf", "--help"], capture_output=True, text=True,
                       timeout=60, env=_child_env(), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: python -m {module} waf")
