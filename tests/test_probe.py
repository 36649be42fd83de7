"""probe_foreign: libblkid tells a device that belongs to someone else."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from lmcache_rawblock import _native


def _img(tmp_path, name="x.img", size=64 << 20):
    p = tmp_path / name
    with open(p, "wb") as f:
        f.truncate(size)
    return str(p)


def test_blank_and_our_own_devices_are_not_foreign(tmp_path):
    assert _native.probe_foreign(_img(tmp_path)) is None
    p = _img(tmp_path, "ours.img")
    with open(p, "r+b") as f:  # what our checkpoint container and slot headers look like
        f.write(b"LMCIDX01" + bytes(4088))
        f.seek(1 << 20)
        f.write(b"LMCBLK01" + bytes(4088))
    assert _native.probe_foreign(p) is None


@pytest.mark.skipif(not shutil.which("mkfs.ext4"), reason="mkfs.ext4 (e2fsprogs) is not installed")
def test_file_system_is_foreign(tmp_path):
    p = _img(tmp_path)
    subprocess.run(["mkfs.ext4", "-q", "-F", p], check=True)
    assert _native.probe_foreign(p) == "ext4 file system"


@pytest.mark.skipif(not shutil.which("sfdisk"), reason="sfdisk (fdisk package) is not installed")
@pytest.mark.parametrize("label", ["gpt", "dos"])
def test_partition_table_is_foreign(tmp_path, label):
    p = _img(tmp_path)
    subprocess.run(["sfdisk", "-q", p], input=f"label: {label}\n,\n", text=True, check=True, capture_output=True)
    assert _native.probe_foreign(p) == f"{label} partition table"


def test_missing_path_is_an_oserror(tmp_path):
    with pytest.raises(FileNotFoundError, match="cannot probe"):
        _native.probe_foreign(str(tmp_path / "missing"))
