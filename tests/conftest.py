"""Fixtures for the tests of every folder: sparse backing files, RAM file systems and loop
devices. Plain helpers, importable from any test file, are in helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import Rig, why_no_losetup

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


@pytest.fixture
def rig(tmp_path: Path):
    """RAM file systems and loop devices for one test (helpers.Rig), undone at teardown."""
    r = Rig(tmp_path)
    yield r
    r.undo()


@pytest.fixture
def loop_device(tmp_path: Path, rig: Rig):
    """Factory: attach a loop device over a fresh file; detached at teardown."""
    why = why_no_losetup()
    if why:
        pytest.skip(why)
    made: list[str] = []

    def make(size: int = 16 * MiB, sector_size: int = 512, direct_io: bool = False) -> str:
        img = tmp_path / f"loop{len(made)}.img"
        with open(img, "wb") as f:
            f.truncate(size)
        made.append(rig.attach(str(img), sector_size=sector_size, direct_io=direct_io))
        return made[-1]

    return make
