"""Tests that need an NVMe device: they run inside the emulated FDP guest (`make test-nvme`,
tools/nvme_guest/rig.py), which exports the device paths and geometry as RB_NVME_* variables.

Every test collected from this directory is marked `nvme` (so the default run deselects it);
one that is selected anyway outside the guest skips with the reason. Inside the guest a
missing device is an error, not a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NOT_IN_GUEST = "needs the emulated NVMe guest (make test-nvme); RB_NVME_GUEST is not set"


def in_guest() -> bool:
    return os.environ.get("RB_NVME_GUEST") == "1"


@pytest.hookimpl(tryfirst=True)  # before -m deselects, so `-m 'not nvme'` sees the mark
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.nvme)


def pytest_runtest_setup(item) -> None:
    if HERE in Path(str(item.path)).resolve().parents and not in_guest():
        pytest.skip(NOT_IN_GUEST)


def _device(var: str) -> str:
    if not in_guest():
        pytest.skip(NOT_IN_GUEST)
    path = os.environ.get(var)
    if not path:
        pytest.fail(f"{var} is not set in the NVMe guest")
    if not os.path.exists(path):
        pytest.fail(f"{var}={path} does not exist in the NVMe guest")
    return path


@pytest.fixture(scope="session")
def nvme_char() -> str:
    """Generic character device of namespace 1 (/dev/ng0n1): io_uring passthrough."""
    return _device("RB_NVME_CHAR")


@pytest.fixture(scope="session")
def nvme_block() -> str:
    """Block device of namespace 1 (/dev/nvme0n1)."""
    return _device("RB_NVME_BLOCK")


@pytest.fixture(scope="session")
def nvme_ctrl() -> str:
    """Controller character device (/dev/nvme0): admin commands."""
    return _device("RB_NVME_CTRL")


@pytest.fixture(scope="session")
def nvme_geometry() -> dict[str, int]:
    """What the rig configured: namespace bytes, LBA size, reclaim unit handles and size."""
    if not in_guest():
        pytest.skip(NOT_IN_GUEST)
    keys = {"size": "RB_NVME_SIZE", "lba": "RB_NVME_LBA", "ruhs": "RB_NVME_RUHS", "ru_size": "RB_NVME_RU_SIZE"}
    return {k: int(os.environ[v]) for k, v in keys.items()}
