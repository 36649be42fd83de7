"""The file or device the benchmark writes to, and where its scratch files go.

Without ``--device`` a sparse file is created in a fresh temporary directory (on a file system
that takes O_DIRECT, see ``scratch_dir``) and removed afterwards. With ``--device PATH`` the path must exist, be a regular file or a block device,
and carry no file system or partition table signature (libblkid, the probe RawBlockCore uses)
unless ``--force``. It is held exclusively while the target is open (``Target.guard``: flock
LOCK_EX, and O_EXCL on a block device, as a core holds its device), so a device a running core
or another benchmark holds, or a mounted one, is refused rather than overwritten; devices
opened for the measurement in this process still open beside the guard.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import struct
import tempfile
from dataclasses import dataclass, field
from typing import Any

from .common import MiB, fmt_size

BLKGETSIZE64 = 0x80081272
PREFILL_CHUNK = 4 * MiB


def supports_odirect(directory: str) -> bool:
    """Whether a file in *directory* can be opened with O_DIRECT (tmpfs cannot)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".odirect-probe-", dir=directory)
    except OSError:
        return False
    os.close(fd)
    try:
        os.close(os.open(probe, os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC))
        return True
    except OSError:
        return False
    finally:
        os.unlink(probe)


def scratch_dir() -> str:
    """The temporary directory for sparse files: ``tempfile.gettempdir()`` ($TMPDIR, /tmp), or
    /var/tmp when that one cannot do O_DIRECT (/tmp is a tmpfs on Debian 13)."""
    first = tempfile.gettempdir()
    for d in (first, "/var/tmp"):
        if os.path.isdir(d) and supports_odirect(d):
            return d
    return first


def make_workdir(prefix: str = "lmcache-rawblock-bench-") -> str:
    return tempfile.mkdtemp(prefix=prefix, dir=scratch_dir())


class TargetError(Exception):
    """A --device/--size problem the user must fix; the message names the parameter."""


@dataclass
class Target:
    path: str
    kind: str  # "sparse-file" | "file" | "block-device"
    size: int  # bytes of the target the benchmark may use
    device_size: int
    tmpdir: str | None = None
    notes: list[str] = field(default_factory=list)
    guard: Any = None  # RawBlockDevice holding the exclusive lock until cleanup()

    def describe(self) -> dict:
        return {"path": self.path, "kind": self.kind, "size_bytes": self.size, "device_size_bytes": self.device_size,
                "temporary": self.tmpdir is not None, "notes": list(self.notes)}

    def cleanup(self) -> None:
        if self.guard is not None:
            self.guard.close()
            self.guard = None
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def __enter__(self) -> "Target":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def find_signature(path: str) -> str | None:
    """What libblkid finds on *path* (e.g. "ext4 file system", "gpt partition table"), or None.

    The same probe RawBlockCore runs before it writes to a device. Raises TargetError when
    the probe cannot be made.
    """
    from lmcache_rawblock._native import probe_foreign

    try:
        return probe_foreign(path)
    except OSError as exc:
        raise TargetError(f"--device {path}: cannot check it for a file system or partition table: "
                          f"{exc.strerror or exc}; pass --force to skip the check") from exc


def hold_exclusive(path: str) -> Any:
    """A read-only RawBlockDevice on *path* holding the lock a core holds (flock LOCK_EX, and
    O_EXCL on a block device) until it is closed. Writes through other descriptors of this
    process go on beside it; a core, or a RawBlockDevice of another process, is refused while it
    is held. TargetError naming the holder when the device is held or mounted."""
    from lmcache_rawblock._native import RawBlockDevice

    try:
        return RawBlockDevice(path, False, lock="exclusive")
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            raise TargetError(f"--device {path}: refusing to use it: {exc.strerror}") from None
        raise TargetError(f"--device {path}: cannot open it: {exc.strerror or exc}") from None
    except ValueError as exc:  # a FIFO, socket or directory
        raise TargetError(f"--device {path}: {exc}") from None


def _block_size(path: str) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        buf = fcntl.ioctl(fd, BLKGETSIZE64, b"\0" * 8)
        return struct.unpack("Q", buf)[0]
    except OSError:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def open_target(device: str | None, size: int | None, force: bool = False, default_size: int = 1 << 30,
                lock: bool = True) -> Target:
    """Validate --device/--size and return the target (creating a sparse file if needed). With
    ``lock``, a --device is held exclusively (see hold_exclusive) until the target's cleanup."""
    if device is None:
        want = size or default_size
        want -= want % 4096
        if want <= 0:
            raise TargetError(f"--size {size}: must be at least 4 KiB")
        tmpdir = make_workdir()
        path = os.path.join(tmpdir, "bench.img")
        try:
            with open(path, "wb") as f:
                f.truncate(want)
        except OSError as exc:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise TargetError(f"--size {fmt_size(want)}: cannot create a sparse file in {tmpdir}: {exc}") from exc
        return Target(path=path, kind="sparse-file", size=want, device_size=want, tmpdir=tmpdir)

    path = os.fspath(device)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TargetError(f"--device {path}: no such file or device") from None
    except OSError as exc:
        raise TargetError(f"--device {path}: cannot stat it: {exc.strerror or exc}") from None
    if stat.S_ISBLK(st.st_mode):
        kind = "block-device"
        dev_size = _block_size(path)
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
        dev_size = st.st_size
    else:
        raise TargetError(f"--device {path}: not a regular file or a block device")

    # The lock first, as the core takes it: a held or mounted device is reported as such.
    guard = hold_exclusive(path) if lock else None
    try:
        notes: list[str] = []
        try:
            sig = find_signature(path)
        except TargetError:
            if not force:
                raise
            sig = None
            notes.append("file-system signature check skipped (--force)")
        if sig is not None:
            if not force:
                raise TargetError(
                    f"--device {path}: refusing to use it: blkid -p found {sig}. The benchmark overwrites "
                    "the device and would destroy that data; pass --force to use it anyway"
                )
            notes.append(f"--force: overwriting a device with {sig}")

        usable = dev_size if size is None else min(size, dev_size)
        if size is not None and size > dev_size:
            notes.append(f"--size {fmt_size(size)} is larger than the device; using {fmt_size(dev_size)}")
        usable -= usable % 4096
        if usable <= 0:
            raise TargetError(f"--device {path}: too small ({dev_size} bytes); need at least 4 KiB")
    except BaseException:
        if guard is not None:
            guard.close()
        raise
    return Target(path=path, kind=kind, size=usable, device_size=dev_size, notes=notes, guard=guard)


def prefill(path: str, nbytes: int) -> None:
    """Write a non-zero pattern over the first *nbytes* so reads hit allocated blocks."""
    chunk = bytes((i * 131 + 7) & 0xFF for i in range(256)) * (PREFILL_CHUNK // 256)
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        off = 0
        while off < nbytes:
            n = min(PREFILL_CHUNK, nbytes - off)
            os.pwrite(fd, chunk[:n], off)
            off += n
        os.fsync(fd)
    finally:
        os.close(fd)


def settle(path: str, nbytes: int) -> None:
    """Flush dirty pages of the region and drop it from the page cache.

    Called before O_DIRECT measurements and fio: an O_DIRECT write over dirty cached pages
    makes the kernel write those pages back first, which would charge one suite's buffered
    writes to the next suite's figures.
    """
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.fsync(fd)
        try:
            os.posix_fadvise(fd, 0, nbytes, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
    finally:
        os.close(fd)


def sync_file(path: str) -> None:
    """Write back the file's dirty pages (they stay cached)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def warm(path: str, nbytes: int) -> None:
    """Read the first *nbytes* through the page cache, so buffered reads find them there."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        off = 0
        while off < nbytes and os.pread(fd, PREFILL_CHUNK, off):
            off += PREFILL_CHUNK
    finally:
        os.close(fd)
