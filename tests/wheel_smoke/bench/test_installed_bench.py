"""Smoke suite for the benchmark wheel installed beside the runtime wheel (``make test-wheel``).

Runs after ``tests/wheel_smoke/`` in the same fresh virtualenv, once the benchmark wheel
(lmcache-rawblock-bench, from ``dist/bench/``, without its dependencies) is installed there:
both packages come from that virtualenv, and ``python -m lmcache_rawblock bench`` hands over to
the installed harness, which runs its device part against the installed runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import lmcache_rawblock
import lmcache_rawblock_bench

SITE = Path(sysconfig.get_path("purelib")).resolve()


def _inside(path: str | os.PathLike, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root)


def _run(args: list[str], cwd, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, LMCACHE_RAWBLOCK_COMPETITORS=str(Path(cwd) / "no-competitors"))
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_both_packages_are_the_installed_wheels():
    assert sys.prefix != sys.base_prefix, "the smoke suite must run in a virtualenv"
    for mod in (lmcache_rawblock, lmcache_rawblock_bench):
        assert _inside(mod.__file__, SITE), mod.__file__
    source = os.environ.get("RB_SOURCE_TREE")
    if source:
        on_path = [p for p in sys.path if p and _inside(p, Path(source).resolve())]
        assert not on_path, f"the source tree is on sys.path: {on_path}"
    dist = metadata.distribution("lmcache-rawblock-bench")
    assert dist.metadata["License-Expression"] == "Apache-2.0"
    assert "lmcache-rawblock" in (dist.requires or [])
    assert not [str(f) for f in dist.files or [] if f.parts[0] == "lmcache_rawblock"]


def test_bench_quick_device(tmp_path):
    out = tmp_path / "bench-out"
    r = _run([sys.executable, "-m", "lmcache_rawblock", "bench", "--suite", "quick", "--parts", "device",
              "--no-progress", "--no-plots", "--out", str(out)], tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["schema"] == 2
    assert res["machine"]["command"][:2] == ["python -m lmcache_rawblock", "bench"]
    assert (out / "summary.txt").is_file()


def test_bench_module_entry_point(tmp_path):
    r = _run([sys.executable, "-m", "lmcache_rawblock_bench", "waf", "--help"], tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m lmcache_rawblock_bench waf")
