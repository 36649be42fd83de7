"""Fixtures for the tests of every folder: sparse backing files, RAM file systems and loop
devices, and the session's live-stats directory. Plain helpers, importable from any test file,
are in helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import STATS_DIR_GIVEN, Rig, why_no_losetup

MiB = 1 << 20


@pytest.fixture(scope="session", autouse=True)
def session_stats_dir(tmp_path_factory: pytest.TempPathFactory):
    """Every core the tests publish (LMCache's plugin, the MP adapter, a direct
    ``livestats.publish``) writes its live-stats file into a directory of this session, not
    /dev/shm/lmcache_rawblock: a test process that ends without closing its core leaves its
    file behind, and the tests make a new device, so a new file, each time. Set in the
    environment, so the tests' child processes inherit it; an RB_STATS_DIR set before the
    session is kept. The directory goes with the session's others (tmp_path_retention_policy)."""
    if STATS_DIR_GIVEN:
        yield STATS_DIR_GIVEN
        return
    d = str(tmp_path_factory.mktemp("livestats", numbered=False))
    os.environ["RB_STATS_DIR"] = d
    yield d
    if os.environ.get("RB_STATS_DIR") == d:
        del os.environ["RB_STATS_DIR"]


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
