"""The LMCache version matrix of the Makefile: exact versions, one virtualenv each, and the pins
that live outside the Makefile (the benchmark's --install-competitors) equal to its newest line."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from helpers import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")

EXACT = re.compile(r"^\d+\.\d+\.\d+((a|b|rc)\d+)?$")


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(REPO), *args], capture_output=True, text=True)


def _matrix() -> list[tuple[str, str, str]]:
    r = _make("lmcache-matrix")
    assert r.returncode == 0, r.stderr
    rows = [tuple(line.split()) for line in r.stdout.splitlines() if line.strip()]
    assert rows and all(len(row) == 3 for row in rows), r.stdout
    return rows  # type: ignore[return-value]


def test_every_version_of_the_matrix_is_exact_with_its_own_virtualenv():
    rows = _matrix()
    versions = [v for v, _, _ in rows]
    assert len(set(versions)) == len(versions) >= 2, versions
    for version, rust, venv in rows:
        assert EXACT.match(version), version
        name, _, rust_version = rust.partition("==")
        assert name == "lmcache-rust-raw-block-io" and EXACT.match(rust_version), rust
        assert venv == f".venv-lmcache-{version}"


def test_the_benchmark_installs_the_newest_versions_of_the_matrix():
    from lmcache_rawblock_bench import common

    newest, rust, _ = _matrix()[-1]
    assert common.LMCACHE_VERSION == newest
    assert f"lmcache-rust-raw-block-io=={common.RUST_VERSION}" == rust


def test_a_version_outside_the_matrix_is_refused_by_name():
    r = _make("-n", "test-lmcache", "LMCACHE=0.0.1")
    assert r.returncode != 0
    assert "LMCACHE=0.0.1: not in the matrix" in r.stderr


def test_every_install_step_pins_lmcache_and_the_rust_wheel():
    """No `pip install` line of the Makefile names lmcache or the Rust wheel without a version."""
    text = (REPO / "Makefile").read_text()
    loose = [line.strip() for line in text.splitlines() if "pip install" in line and
             re.search(r"(?<![\w=-])(lmcache|lmcache-rust-raw-block-io)(?![\w=-])(?!==)", line.split("#")[0])]
    assert not loose, loose


def test_the_venv_check_refuses_other_versions_by_name():
    """tools/lmcache_venv_check.py (make lmcache-venv's check) fails, naming what it found, when
    the interpreter's lmcache or Rust wheel is not the matrix's version."""
    import sys

    r = subprocess.run([sys.executable, str(REPO / "tools" / "lmcache_venv_check.py"), "0.0.1", "0.0.2"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "the matrix wants 0.0.1" in r.stderr and "lmcache-rust-raw-block-io is" in r.stderr
