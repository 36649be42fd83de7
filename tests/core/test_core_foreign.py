"""A device that holds someone else's data is refused, untouched, unless explicitly allowed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from core_helpers import Obj, make_core, make_device, okey, payload
from helpers import sha256_file


@pytest.mark.skipif(not shutil.which("mkfs.ext4"), reason="mkfs.ext4 (e2fsprogs) is not installed")
def test_file_system_is_refused_and_left_untouched(tmp_path):
    path = make_device(tmp_path)
    subprocess.run(["mkfs.ext4", "-q", "-F", path], check=True)
    before = sha256_file(path)
    with pytest.raises(ValueError, match=r"holds a ext4 file system.*allow_foreign_device"):
        make_core(path)
    assert sha256_file(path) == before, "nothing may be written to a refused device"


@pytest.mark.skipif(not shutil.which("sfdisk"), reason="sfdisk (fdisk package) is not installed")
def test_partition_table_is_refused(tmp_path):
    path = make_device(tmp_path)
    subprocess.run(["sfdisk", "-q", path], input="label: gpt\n,\n", text=True, check=True, capture_output=True)
    with pytest.raises(ValueError, match="gpt partition table"):
        make_core(path)


@pytest.mark.skipif(not shutil.which("mkfs.ext4"), reason="mkfs.ext4 (e2fsprogs) is not installed")
def test_allow_foreign_device_overrides(tmp_path):
    path = make_device(tmp_path)
    subprocess.run(["mkfs.ext4", "-q", "-F", path], check=True)
    core = make_core(path, allow_foreign_device=True)
    assert all(core.put_many([okey(1)], [Obj(payload(1, 100))]).results)
    core.close()


def test_our_own_device_reopens(tmp_path):
    path = make_device(tmp_path)
    core = make_core(path)
    core.put_many([okey(1)], [Obj(payload(1, 100))])
    core.close()
    again = make_core(path)  # our checkpoint and slot headers are not a foreign signature
    assert again.contains_key(okey(1).encoded)
    again.close()
