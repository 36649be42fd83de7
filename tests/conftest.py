"""Shared fixtures: sparse backing files, loop devices, the optional Rust wheel."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MiB = 1 << 20


@pytest.fixture
def sparse_file(tmp_path: Path):
    """Factory: a sparse file of the given size (default 16 MiB)."""

    def make(size: int = 16 * MiB, name: str = "dev.img") -> str:
        p = tmp_path / name
        with open(p, "wb") as f:
            f.truncate(size)
        return str(p)

    return make


def rust_module():
    """The real lmcache_rust_raw_block_io wheel, or None (never our compat shim)."""
    if "lmcache_rawblock.compat" in sys.modules:
        from lmcache_rawblock import compat

        if compat.is_installed():
            return None
    try:
        mod = importlib.import_module("lmcache_rust_raw_block_io")
    except ImportError:
        return None
    if getattr(mod, "__lmcache_rawblock__", False):
        return None
    return mod


def _can_losetup() -> str | None:
    if os.geteuid() != 0:
        return "loop devices need root"
    if not shutil.which("losetup"):
        return "losetup is not installed (util-linux)"
    if not os.path.exists("/dev/loop-control"):
        return "/dev/loop-control is missing (no loop driver)"
    return None


@pytest.fixture
def loop_device(tmp_path: Path):
    """Factory: attach a loop device over a fresh file; detached at teardown."""
    why = _can_losetup()
    if why:
        pytest.skip(why)
    attached: list[str] = []

    def make(size: int = 16 * MiB, sector_size: int = 512, direct_io: bool = False) -> str:
        img = tmp_path / f"loop{len(attached)}.img"
        with open(img, "wb") as f:
            f.truncate(size)
        cmd = ["losetup", "-f", "--show", "--sector-size", str(sector_size)]
        if direct_io:
            cmd.append("--direct-io=on")
        cmd.append(str(img))
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"losetup failed: {r.stderr.strip()}")
        dev = r.stdout.strip()
        attached.append(dev)
        return dev

    yield make
    for dev in attached:
        subprocess.run(["losetup", "-d", dev], capture_output=True)
