"""Helpers shared by the test files of every folder under tests/ (tests/ is on sys.path: the
``pythonpath`` of pyproject's pytest settings; the fixtures built on them are in conftest.py):
where the checkout is, the optional Rust wheel, the LMCache imports of a test module, a file's
digest, the rig of RAM file systems and loop devices, and an FDP namespace's reclaim unit
handles."""

from __future__ import annotations

import errno
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent  # tests/: child interpreters put it on sys.path for core_helpers
REPO = TESTS.parent  # the checkout: README.md, docs/, csrc/, fuzz/
# The live-stats directory given before the session (RB_STATS_DIR), or None: conftest.py then
# points RB_STATS_DIR at a directory of the session's own (livestats publishes there).
STATS_DIR_GIVEN = os.environ.get("RB_STATS_DIR") or None


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


class lmcache_imports:  # lower case, as it reads in a with statement: `with lmcache_imports() as lmc:`
    """The imports of LMCache (and torch) in a test module, which must not fail the module where
    LMCache is not installed:

        with lmcache_imports() as lmc:
            import torch
            from lmcache.v1... import ...
        pytestmark = lmc.marks

    An exception in the block ends it and becomes ``reason``; ``skip`` skips a test with that
    reason (and does nothing when the imports worked), ``marks`` is ``lmcache`` plus ``skip``.
    LMCache's import-time warnings are silenced.
    """

    def __init__(self) -> None:
        self.reason: str | None = None

    def __enter__(self) -> lmcache_imports:
        warnings.simplefilter("ignore")
        return self

    def __exit__(self, tp, e, tb) -> bool:
        if e is None or not isinstance(e, Exception):
            return False
        self.reason = f"LMCache is not importable here ({tp.__name__}: {e}); run make test-lmcache"
        return True

    @property
    def skip(self) -> pytest.MarkDecorator:
        return pytest.mark.skipif(self.reason is not None, reason=self.reason or "")

    @property
    def marks(self) -> list[pytest.MarkDecorator]:
        return [pytest.mark.lmcache, self.skip]


def sha256_file(path) -> str:
    """Hex SHA-256 of a whole file: whether a test left a device's bytes untouched."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def why_no_losetup() -> str | None:
    """Why this machine cannot attach loop devices, or None when it can."""
    if os.geteuid() != 0:
        return "loop devices need root"
    if not shutil.which("losetup"):
        return "losetup is not installed (util-linux)"
    if not os.path.exists("/dev/loop-control"):
        return "/dev/loop-control is missing (no loop driver)"
    return None


def why_no_mount(fs_type: str) -> str | None:
    """Why this machine cannot mount (and unmount) a RAM file system, or None when it can."""
    if os.geteuid() != 0:
        return f"mounting a {fs_type} needs root"
    if not shutil.which("mount") or not shutil.which("umount"):
        return "mount/umount are not installed (util-linux)"
    return None


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


class Rig:
    """RAM file systems mounted and loop devices attached by one test (the `rig` fixture), undone
    in reverse order; each step skips the test, with the reason, where the machine cannot."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounts: list[Path] = []
        self.loops: list[str] = []

    def mount(self, fs_type: str, name: str, options: str | None = None) -> Path:
        """A fresh fs_type mount (tmpfs, ramfs) at root/name."""
        why = why_no_mount(fs_type)
        if why:
            pytest.skip(why)
        d = self.root / name
        d.mkdir()
        r = _run(["mount", "-t", fs_type, *(["-o", options] if options else []), fs_type, str(d)])
        if r.returncode != 0:
            pytest.skip(f"cannot mount a {fs_type}: {r.stderr.strip()}")
        self.mounts.append(d)
        return d

    def tmpfs(self, size_mib: int, name: str = "fs") -> Path:
        """A tmpfs of size_mib: writes past it fail with ENOSPC."""
        return self.mount("tmpfs", name, f"size={size_mib}m,mode=0700")

    def ramfs(self, name: str = "ramfs") -> Path:
        """A ramfs: a file system without fallocate (so no punched holes) and no O_DIRECT."""
        return self.mount("ramfs", name)

    def remount(self, d: Path, size_mib: int) -> None:
        r = _run(["mount", "-o", f"remount,size={size_mib}m", str(d)])
        assert r.returncode == 0, r.stderr

    def attach(self, backing: str, sector_size: int | None = None, direct_io: bool = False) -> str:
        """A loop device over backing (with that logical sector size, and direct I/O to it)."""
        why = why_no_losetup()
        if why:
            pytest.skip(why)
        cmd = ["losetup", "-f", "--show"]
        if sector_size is not None:
            cmd += ["--sector-size", str(sector_size)]
        if direct_io:
            cmd.append("--direct-io=on")
        r = _run([*cmd, backing])
        if r.returncode != 0:
            pytest.skip(f"losetup failed: {r.stderr.strip()}")
        dev = r.stdout.strip()
        self.loops.append(dev)
        return dev

    def set_loop_offset(self, dev: str, offset: int) -> None:
        """Move the start of loop device dev to byte offset of its backing file (LOOP_SET_STATUS64):
        an offset at the file's end leaves a device of size 0 under its open descriptors (reads
        end at once, writes fail with ENOSPC), its data untouched; offset 0 brings it back."""
        set_loop_offset(dev, offset)

    def reread_size(self, dev: str) -> None:
        r = _run(["losetup", "-c", dev])
        assert r.returncode == 0, r.stderr

    def undo(self) -> None:
        for dev in reversed(self.loops):
            _run(["losetup", "-d", dev])
        for d in reversed(self.mounts):
            if _run(["umount", str(d)]).returncode != 0:
                _run(["umount", "-l", str(d)])  # still held by a loop device being released


_LOOP_GET_STATUS64 = 0x4C05
_LOOP_SET_STATUS64 = 0x4C04
_LOOP_INFO64_SIZE = 232  # struct loop_info64
_LO_OFFSET_AT = 24  # after lo_device, lo_inode, lo_rdevice (u64 each)


def set_loop_offset(dev: str, offset: int) -> None:
    """See Rig.set_loop_offset. The kernel refuses the change (EAGAIN) while it still has the
    device's cached pages to drop; it is tried again a few times."""
    import fcntl
    import struct

    fd = os.open(dev, os.O_RDONLY)
    try:
        info = bytearray(_LOOP_INFO64_SIZE)
        fcntl.ioctl(fd, _LOOP_GET_STATUS64, info)
        struct.pack_into("<Q", info, _LO_OFFSET_AT, offset)
        for attempt in range(20):
            try:
                fcntl.ioctl(fd, _LOOP_SET_STATUS64, bytes(info))
                return
            except OSError as e:
                if e.errno != errno.EAGAIN or attempt == 19:
                    raise
                os.sync()
    finally:
        os.close(fd)


def ruamw(dev: str) -> dict[int, int]:
    """Reclaim unit available media writes of each placement identifier's handle on an FDP
    namespace ({pid: blocks}): what a write through that handle consumes."""
    from lmcache_rawblock import _native

    return {r["pid"]: r["ruamw"] for r in _native.nvme_fdp_report(dev)["ruhs"]}


class PythonBuffer:
    """A buffer implemented in Python (PEP 688), counting how often it is taken and released."""

    def __init__(self, data: bytes):
        self.mem = bytearray(data)
        self.taken = self.released = 0

    def __buffer__(self, flags):
        self.taken += 1
        return memoryview(self.mem)

    def __release_buffer__(self, view):
        self.released += 1
        view.release()


PEP688 = pytest.mark.skipif(sys.version_info < (3, 12), reason="a buffer implemented in Python (__buffer__, PEP 688) "
                                                             "needs Python 3.12+: make test-py312 runs it")


def preload_shim(tmp_path, name: str, source: str, what: str) -> str:
    """A shared object built from C ``source`` into tmp_path for LD_PRELOAD (a system call
    wrapped to inject a fault); skips, naming ``what``, where the machine has no C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip(f"no C compiler (cc) to build the {what}")
    src, so = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
    src.write_text(source)
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(so), str(src), "-ldl"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    return str(so)
