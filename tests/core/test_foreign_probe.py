"""probe_foreign: libblkid tells a device that belongs to someone else."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers import sha256_file
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


# --------------------------------------------------------------------------- away from offset 0

MiB = 1 << 20
needs_mkfs = pytest.mark.skipif(not shutil.which("mkfs.ext4") or not shutil.which("e2fsck"),
                                reason="mkfs.ext4 / e2fsck (e2fsprogs) are not installed")


def _mkfs_at(target: str, offset: int, fs_size: str = "32M") -> None:
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", f"offset={offset}", target, fs_size], check=True,
                   capture_output=True)


def _fsck_region(src: str, offset: int, length: int, tmp_path) -> subprocess.CompletedProcess:
    out = tmp_path / "region.img"
    with open(src, "rb") as f, open(out, "wb") as g:
        f.seek(offset)
        g.write(f.read(length))
    return subprocess.run(["e2fsck", "-n", "-f", str(out)], capture_output=True, text=True)


@needs_mkfs
@pytest.mark.parametrize("offset", [1 * MiB, 63 * 512, 8 * MiB])
def test_file_system_in_a_partition_whose_table_was_wiped(tmp_path, offset):
    p = _img(tmp_path)
    _mkfs_at(p, offset)
    assert _native.probe_foreign(p) == f"ext4 file system at byte offset {offset}"


@needs_mkfs
def test_core_refuses_ext4_at_1mib_and_leaves_it_intact(tmp_path):
    from core_helpers import Obj, make_core, okey, payload

    p = _img(tmp_path)
    _mkfs_at(p, MiB)
    before = sha256_file(p)
    assert _fsck_region(p, MiB, 32 * MiB, tmp_path).returncode == 0
    for meta in (MiB, 4 * MiB):
        with pytest.raises(ValueError, match=r"holds a ext4 file system at byte offset 1048576.*allow_foreign_device"):
            core = make_core(p, meta_total_bytes=meta)
            core.put_many([okey(1)], [Obj(payload(1, 100))])  # reached only without the refusal
            core.checkpoint_now()
            core.close()
    assert sha256_file(p) == before, "nothing may be written to a refused device"
    r = _fsck_region(p, MiB, 32 * MiB, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_mkfs
def test_core_refuses_ext4_at_1mib_on_a_loop_device(tmp_path, loop_device):
    from core_helpers import make_core

    dev = loop_device(64 * MiB)
    _mkfs_at(dev, MiB)
    before = sha256_file(dev)
    with pytest.raises(ValueError, match="ext4 file system at byte offset 1048576"):
        make_core(dev)
    assert sha256_file(dev) == before
    r = _fsck_region(dev, MiB, 32 * MiB, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_our_device_with_random_payloads_is_not_foreign(tmp_path):
    """Slot payloads are arbitrary bytes: a device holding a valid checkpoint is not scanned
    past offset 0, and where one of our slots starts the scan does not look either."""
    import random

    from core_helpers import Obj, make_core, okey

    p = _img(tmp_path, size=128 * MiB)
    rng = random.Random(5)
    core = make_core(p)
    keys = [okey(i) for i in range(300)]
    assert all(core.put_many(keys, [Obj(rng.randbytes(60000)) for _ in keys]).results)
    core.close()
    assert _native.probe_foreign(p) is None
    with open(p, "r+b") as f:  # container 0 unreadable: the scan runs over our slots
        f.write(bytes(4096))
    assert _native.probe_foreign(p) is None


def test_probe_of_a_large_blank_device_is_cheap(tmp_path):
    import time

    p = _img(tmp_path, size=4 << 30)
    t = time.perf_counter()
    assert _native.probe_foreign(p) is None
    assert time.perf_counter() - t < 5.0



def _resident_bytes(path: str) -> int:
    """Bytes of the file in the page cache: mincore(2) over a read-only shared mapping."""
    import ctypes
    import os

    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
            return sum(b & 1 for b in vec) * page
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def test_probe_leaves_no_pages_in_the_page_cache(tmp_path):
    # libblkid reads scattered windows (tens of MiB); left in the page cache as small pages they
    # would make the slots later written over them slower to read back.
    p = _img(tmp_path, size=96 << 20)
    assert _resident_bytes(p) == 0
    assert _native.probe_foreign(p) is None
    assert _resident_bytes(p) == 0
