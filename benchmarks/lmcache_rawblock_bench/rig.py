"""Drives of known speed: RAM block devices capped in a blkio cgroup, for experiments whose limit
is exactly N x cap.

``CappedDrives(n, size, read_bps, write_bps, backend)`` is a context manager: it makes n RAM block
devices, one cgroup v1 blkio group (``/sys/fs/cgroup/blkio/<name>``) whose
``blkio.throttle.read_bps_device`` / ``write_bps_device`` hold each device's ``MAJ:MIN`` and the
caps, and moves the running process (every thread of it) into the group's ``cgroup.procs``.
Threads and child processes started later (the core's io_uring worker, io_uring's own io-wq
workers, fio) inherit the group. On exit it always moves the process back to the root group,
removes the group and the devices, whatever failed before.

Two kinds of device (``backend``):

- ``zram`` (the default): devices added through ``/sys/class/zram-control/hot_add`` and removed
  with ``hot_remove``. zram takes a bio of any size whole, so the throttle charges each byte once
  on every engine: fio with io_uring, psync, fixed buffers or not, reaches N x cap and no more.
  Pages filled with one byte value (the benchmarks' payloads) are stored without compression.
- ``loop``: loop devices with direct I/O (``losetup -f --show --direct-io=on``) over files in a
  tmpfs (``/dev/shm``). Exact for psync and for io_uring requests the loop device takes whole,
  but an io_uring request that it must split (past 128 segments or 1,280 KiB: a registered buffer
  of 8 MiB always, a plain buffer when its pages are scattered) is charged twice: the kernel
  refuses to split the non-blocking first attempt after the throttle has charged it, and the
  blocking retry is charged again. Such engines reach half the cap.

Only I/O that the process submits itself is throttled and accounted: use O_DIRECT. Buffered
writes reach the device later from the kernel's flusher threads, outside the group.

Everything the rig creates carries its name prefix and the owning process id
(``lmcache-rawblock-rig-<pid>``), and a state file of that name in ``/dev/shm`` lists the devices
as they are made, so that a run which crashed before tearing down is cleaned up by the next one
(``clean_stale``: groups, devices and files of processes that no longer exist) and two rigs of
different processes never touch each other's devices.

``python -m lmcache_rawblock_bench.rig`` is the command line: ``check`` (fio over the capped
devices, bandwidth against N x cap), ``run -- CMD`` (CMD inside the group with the devices in
``RIG_DEVICES``), ``clean`` (remove what crashed runs left) and ``status``. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Sequence

from lmcache_rawblock.livestats import pid_alive

PREFIX = "lmcache-rawblock-rig-"
BLKIO = "/sys/fs/cgroup/blkio"
SHM = "/dev/shm"
MB = 1000 * 1000
MiB = 1 << 20


class RigError(RuntimeError):
    """The rig cannot be set up (or torn down) on this machine; the message says why."""


ZRAM_CONTROL = "/sys/class/zram-control"
BACKENDS = ("zram", "loop")


def why_unavailable(blkio: str = BLKIO, backend: str = "zram") -> str | None:
    """Why this machine cannot host the rig with that backend, or None when it can."""
    if os.geteuid() != 0:
        return "capped drives need root (block devices and blkio cgroups)"
    if not os.path.exists(os.path.join(blkio, "blkio.throttle.read_bps_device")):
        return f"no cgroup v1 blkio hierarchy with throttling at {blkio}"
    if backend == "zram" and not os.path.exists(os.path.join(ZRAM_CONTROL, "hot_add")):
        return f"no zram hot_add at {ZRAM_CONTROL} (kernel without zram); try backend loop"
    if backend == "loop":
        if not shutil.which("losetup"):
            return "losetup is not installed (util-linux)"
        if not os.path.exists("/dev/loop-control"):
            return "/dev/loop-control is missing (no loop driver)"
    if backend not in BACKENDS:
        return f"backend {backend!r}: choose from {', '.join(BACKENDS)}"
    return None


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _owner(name: str) -> int | None:
    m = re.match(re.escape(PREFIX) + r"(\d+)", os.path.basename(name))
    return int(m.group(1)) if m else None


def loops_over(prefix: str) -> list[tuple[str, str]]:
    """(loop device, backing file) of every attached loop whose backing file starts with prefix."""
    r = subprocess.run(["losetup", "-J", "-l"], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        return []
    out = []
    for d in json.loads(r.stdout).get("loopdevices", []):
        back = (d.get("back-file") or "").removesuffix(" (deleted)")
        if back.startswith(prefix):
            out.append((d["name"], back))
    return out


def _pids(group: str) -> list[int]:
    try:
        return [int(x) for x in _read(os.path.join(group, "cgroup.procs")).split()]
    except FileNotFoundError:
        return []


def _remove_group(group: str, blkio: str) -> None:
    """Move whatever is left in group to the root group, then remove it."""
    for _ in range(50):
        for pid in _pids(group):
            try:
                _write(os.path.join(blkio, "cgroup.procs"), str(pid))
            except OSError:
                pass  # exited meanwhile
        try:
            os.rmdir(group)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)  # a task still exiting, or a throttled bio still queued
    os.rmdir(group)


def _remove_zram(idx: int) -> None:
    """Reset zram<idx> (frees its memory) and remove it; EBUSY while something holds it open."""
    if not os.path.exists(f"/sys/block/zram{idx}"):
        return
    for attempt in range(50):
        try:
            _write(f"/sys/block/zram{idx}/reset", "1")
            _write(os.path.join(ZRAM_CONTROL, "hot_remove"), str(idx))
            return
        except OSError:
            if attempt == 49:
                raise
            time.sleep(0.02)  # the last close still releasing it


def _state_path(shm: str, name: str) -> str:
    return os.path.join(shm, f"{name}.json")


def clean_stale(blkio: str = BLKIO, shm: str = SHM) -> list[str]:
    """Remove the groups, devices and files that rigs of dead processes left; returns what was
    removed."""
    removed = []

    def dead(name: str) -> bool:
        pid = _owner(name)
        return pid is not None and not pid_alive(pid)

    for name in sorted(os.listdir(blkio)) if os.path.isdir(blkio) else []:
        if name.startswith(PREFIX) and dead(name):
            _remove_group(os.path.join(blkio, name), blkio)
            removed.append(os.path.join(blkio, name))
    for name in sorted(os.listdir(shm)) if os.path.isdir(shm) else []:
        if name.startswith(PREFIX) and name.endswith(".json") and dead(name):
            try:
                state = json.loads(_read(os.path.join(shm, name)))
            except (OSError, ValueError):
                state = {}
            for idx in state.get("zram", []):
                _remove_zram(int(idx))
                removed.append(f"/dev/zram{idx}")
    if shutil.which("losetup"):
        for dev, back in loops_over(os.path.join(shm, PREFIX)):
            if dead(back):
                subprocess.run(["losetup", "-d", dev], capture_output=True)
                removed.append(dev)
    for name in sorted(os.listdir(shm)) if os.path.isdir(shm) else []:
        if name.startswith(PREFIX) and dead(name):
            os.unlink(os.path.join(shm, name))
            removed.append(os.path.join(shm, name))
    return removed


def _majmin(dev: str) -> str:
    st = os.stat(dev)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


@dataclass
class CappedDrives:
    """n RAM block devices capped at read_bps / write_bps each (bytes per second; 0 = no cap),
    the running process inside their blkio group while the context is open."""

    n: int
    size: int = 256 * MiB
    read_bps: int = 100 * MB
    write_bps: int = 100 * MB
    backend: str = "zram"
    shm: str = SHM
    blkio: str = BLKIO
    name: str = ""
    devices: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    zram: list[int] = field(default_factory=list)
    group: str = ""
    _pid: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n {self.n}: at least one drive")
        if self.size < MiB or self.size % 4096:
            raise ValueError(f"size {self.size}: at least 1 MiB and a multiple of 4 KiB")
        for what, v in (("read_bps", self.read_bps), ("write_bps", self.write_bps)):
            if v < 0:
                raise ValueError(f"{what} {v}: a cap in bytes per second, or 0 for none")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r}: choose from {', '.join(BACKENDS)}")

    def __enter__(self) -> CappedDrives:
        why = why_unavailable(self.blkio, self.backend)
        if why:
            raise RigError(why)
        clean_stale(self.blkio, self.shm)
        self._pid = os.getpid()
        self.name = self.name or f"{PREFIX}{self._pid}"
        if not self.name.startswith(f"{PREFIX}{self._pid}"):
            raise ValueError(f"name {self.name!r}: must start with {PREFIX}{self._pid} (stale runs are found by it)")
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def _save_state(self) -> None:
        _write(_state_path(self.shm, self.name), json.dumps({"pid": self._pid, "zram": self.zram,
                                                             "devices": self.devices, "files": self.files}))

    def _add_loop(self, i: int) -> str:
        path = os.path.join(self.shm, f"{self.name}-{i}.img")
        self.files.append(path)
        self._save_state()
        with open(path, "wb") as f:  # filled, not sparse: every read copies a page, as a drive would
            chunk = b"\x5a" * (4 * MiB)
            for off in range(0, self.size, len(chunk)):
                f.write(chunk[: min(len(chunk), self.size - off)])
        r = subprocess.run(["losetup", "-f", "--show", "--direct-io=on", path], capture_output=True, text=True)
        if r.returncode != 0:
            raise RigError(f"losetup --direct-io=on {path}: {r.stderr.strip()}")
        return r.stdout.strip()

    def _add_zram(self) -> str:
        idx = int(_read(os.path.join(ZRAM_CONTROL, "hot_add")))
        self.zram.append(idx)
        self._save_state()
        _write(f"/sys/block/zram{idx}/disksize", str(self.size))
        dev = f"/dev/zram{idx}"
        for _ in range(100):  # devtmpfs makes the node; udev may be slower
            if os.path.exists(dev):
                return dev
            time.sleep(0.01)
        raise RigError(f"{dev}: no device node after hot_add")

    def _setup(self) -> None:
        self._save_state()
        for i in range(self.n):
            self.devices.append(self._add_zram() if self.backend == "zram" else self._add_loop(i))
            self._save_state()
        self.group = os.path.join(self.blkio, self.name)
        os.mkdir(self.group)
        for dev in self.devices:
            mm = _majmin(dev)
            if self.read_bps:
                _write(os.path.join(self.group, "blkio.throttle.read_bps_device"), f"{mm} {self.read_bps}")
            if self.write_bps:
                _write(os.path.join(self.group, "blkio.throttle.write_bps_device"), f"{mm} {self.write_bps}")
        _write(os.path.join(self.group, "cgroup.procs"), str(self._pid))

    def set_caps(self, dev: str, read_bps: int, write_bps: int) -> None:
        """Change one device's caps (0 = none: its rule removed, and its I/O no longer accounted)."""
        if dev not in self.devices:
            raise ValueError(f"dev {dev!r}: not one of this rig's devices {self.devices}")
        mm = _majmin(dev)
        _write(os.path.join(self.group, "blkio.throttle.read_bps_device"), f"{mm} {read_bps}")
        _write(os.path.join(self.group, "blkio.throttle.write_bps_device"), f"{mm} {write_bps}")

    def wipe(self, nbytes: int) -> None:
        """Overwrite the first nbytes of every device outside the throttle (through the backing
        file; zram: a reset to empty, then the same size), e.g. a cache's metadata before the next
        cache opens with another layout. Nothing may hold a device open."""
        if self.backend == "loop":
            for f in self.files:
                with open(f, "r+b") as fh:
                    fh.write(b"\x5a" * min(nbytes, self.size))
            return
        for idx in self.zram:
            _write(f"/sys/block/zram{idx}/reset", "1")
            _write(f"/sys/block/zram{idx}/disksize", str(self.size))

    def teardown(self) -> None:
        """Back to the root group, group removed, devices removed, files removed; the first error
        is raised after every step has been tried."""
        errors: list[str] = []
        if self.group and os.path.isdir(self.group):
            try:
                _remove_group(self.group, self.blkio)
            except OSError as exc:
                errors.append(f"rmdir {self.group}: {exc}")
        for dev in self.devices if self.backend == "loop" else []:
            r = subprocess.run(["losetup", "-d", dev], capture_output=True, text=True)
            if r.returncode != 0:
                errors.append(f"losetup -d {dev}: {r.stderr.strip()}")
        for idx in self.zram:
            try:
                _remove_zram(idx)
            except OSError as exc:
                errors.append(f"zram{idx} reset / hot_remove: {exc}")
        for path in [*self.files, _state_path(self.shm, self.name)] if self.name else self.files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                errors.append(f"unlink {path}: {exc}")
        self.devices, self.files, self.zram, self.group = [], [], [], ""
        if errors:
            raise RigError("; ".join(errors))

    # ------------------------------------------------------------------ what the group saw

    def service_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes the group's throttle accounted, per device path: {"Read": n, "Write": n}."""
        by_mm = {_majmin(d): d for d in self.devices}
        out: dict[str, dict[str, int]] = {d: {"Read": 0, "Write": 0} for d in self.devices}
        for line in _read(os.path.join(self.group, "blkio.throttle.io_service_bytes")).splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] in by_mm and parts[1] in ("Read", "Write"):
                out[by_mm[parts[0]]][parts[1]] = int(parts[2])
        return out

    def caps(self) -> dict[str, dict[str, int]]:
        """The caps the group holds, per device path, read back from the throttle files."""
        by_mm = {_majmin(d): d for d in self.devices}
        out: dict[str, dict[str, int]] = {d: {} for d in self.devices}
        for side, fname in (("read_bps", "blkio.throttle.read_bps_device"),
                            ("write_bps", "blkio.throttle.write_bps_device")):
            for line in _read(os.path.join(self.group, fname)).splitlines():
                mm, v = line.split()
                if mm in by_mm:
                    out[by_mm[mm]][side] = int(v)
        return out

    def threads_outside(self) -> list[tuple[int, str]]:
        """(tid, name) of this process's threads that are not in the group (none while it is open)."""
        want = "/" + self.name
        out = []
        for tid in os.listdir(f"/proc/{self._pid}/task"):
            try:
                lines = _read(f"/proc/{self._pid}/task/{tid}/cgroup").splitlines()
                comm = _read(f"/proc/{self._pid}/task/{tid}/comm").strip()
            except FileNotFoundError:
                continue  # exited meanwhile
            path = next((ln.split(":", 2)[2] for ln in lines if "blkio" in ln.split(":", 2)[1].split(",")), "/")
            if path != want:
                out.append((int(tid), comm))
        return out

    def describe(self) -> dict:
        backing = "zram (hot_add)" if self.backend == "zram" else "tmpfs file, losetup --direct-io=on"
        return {"n": self.n, "size": self.size, "read_bps": self.read_bps, "write_bps": self.write_bps,
                "backend": self.backend, "backing": backing, "devices": list(self.devices), "group": self.group}


# ---------------------------------------------------------------------------- fio over the rig


def fio_command(devices: Sequence[str], rw: str, bs: int, depth: int, seconds: float, engine: str = "io_uring",
                size: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    """fio with one job per device (``--filename`` per job), O_DIRECT, aggregate reporting; zeroed
    buffers, which zram stores without compressing, as it stores the benchmarks' one-byte fills."""
    cmd = ["fio", "--output-format=json", "--group_reporting", "--direct=1", f"--ioengine={engine}",
           f"--rw={rw}", f"--bs={bs}", "--time_based", f"--runtime={max(1, round(seconds * 1000))}ms",
           "--thread", "--randrepeat=0", "--norandommap", "--zero_buffers"]
    if engine == "io_uring":
        cmd.append(f"--iodepth={depth}")
    if size:
        cmd.append(f"--size={size}")
    cmd += list(extra)
    for i, dev in enumerate(devices):
        cmd += [f"--name=d{i}", f"--filename={dev}"]
    return cmd


def run_fio(devices: Sequence[str], rw: str, bs: int, depth: int, seconds: float, engine: str = "io_uring",
            size: int | None = None, extra: Sequence[str] = ()) -> dict:
    """Aggregate bandwidth of fio over devices (bytes/s) and the bytes moved, with the command."""
    cmd = fio_command(devices, rw, bs, depth, seconds, engine, size, extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if proc.returncode != 0:
        raise RigError(f"fio exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:300]}")
    text = proc.stdout
    data = json.loads(text[text.find("{"):])
    side = data["jobs"][0]["write" if "write" in rw else "read"]
    return {"bytes_per_s": float(side["bw_bytes"]), "io_bytes": int(side["io_bytes"]), "command": cmd,
            "fio_version": data.get("fio version")}


# ---------------------------------------------------------------------------- command line


def _bps(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)(i?)b?(?:/s)?", text.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid rate {text!r}: e.g. 100M (bytes per second), 1.5G, 0 for none")
    base = 1024 if m.group(3) else 1000
    return int(float(m.group(1)) * base ** " kmg".index(m.group(2) or " "))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lmcache_rawblock_bench.rig",
                                description="Drives of known speed: capped loop devices over tmpfs files (root).")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, text in (("check", "fio over N capped devices: aggregate bandwidth against N x cap"),
                       ("run", "run a command inside the group; the devices are in RIG_DEVICES")):
        s = sub.add_parser(name, help=text)
        s.add_argument("-n", "--drives", type=int, default=2, help="number of devices (default 2)")
        s.add_argument("--size", type=_bps, default=256 * MiB, help="bytes per device (default 256Mi)")
        s.add_argument("--read-cap", type=_bps, default=100 * MB, help="read cap per device (default 100M)")
        s.add_argument("--write-cap", type=_bps, default=100 * MB, help="write cap per device (default 100M)")
        s.add_argument("--backend", choices=BACKENDS, default="zram",
                       help="zram (default: every engine charged once) or loop (tmpfs files)")
    sub.choices["check"].add_argument("--seconds", type=float, default=3.0, help="fio run time per case")
    sub.choices["check"].add_argument("--bs", type=_bps, default=8 * MiB, help="fio block size (default 8Mi)")
    sub.choices["run"].add_argument("argv", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    sub.add_parser("clean", help="remove the groups, loops and files of rigs whose process is gone")
    sub.add_parser("status", help="list the rig groups, loops and files present")
    return p


CHECK_CASES = (("io_uring", []), ("io_uring", ["--fixedbufs"]), ("psync", []))


def _check(d: CappedDrives, seconds: float, bs: int) -> int:
    print(f"{d.n} {d.backend} devices {' '.join(d.devices)}, group {d.group}")
    for engine, extra in CHECK_CASES:
        for rw, cap in (("read", d.read_bps), ("write", d.write_bps)):
            before = d.service_bytes()
            r = run_fio(d.devices, rw, bs, 8, seconds, engine, extra=extra)
            after = d.service_bytes()
            side = "Read" if rw == "read" else "Write"
            charged = sum(after[x][side] - before[x][side] for x in d.devices)
            share = f"{r['bytes_per_s'] / (d.n * cap):.3f} of N x cap" if cap else "uncapped"
            print(f"  fio {engine:8} {' '.join(extra):11} {rw:5} {r['bytes_per_s'] / MB:9.1f} MB/s  {share}, "
                  f"charged {charged / r['io_bytes']:.2f} x the bytes moved")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "status":
        groups = [g for g in os.listdir(BLKIO) if g.startswith(PREFIX)] if os.path.isdir(BLKIO) else []
        files = [f for f in os.listdir(SHM) if f.startswith(PREFIX)] if os.path.isdir(SHM) else []
        loops = loops_over(os.path.join(SHM, PREFIX)) if shutil.which("losetup") else []
        print(json.dumps({"groups": groups, "files": files, "loops": loops}, indent=1))
        return 0
    why = why_unavailable(BLKIO, getattr(args, "backend", "zram"))
    if why:
        print(f"rig: {why}", file=sys.stderr)
        return 2
    if args.cmd == "clean":
        for what in clean_stale():
            print(f"removed {what}")
        return 0
    with CappedDrives(args.drives, args.size, args.read_cap, args.write_cap, args.backend) as d:
        if args.cmd == "check":
            return _check(d, args.seconds, args.bs)
        cmd = args.argv[1:] if args.argv[:1] == ["--"] else list(args.argv)
        if not cmd:
            print("rig run: no command given (rig run -- CMD ...)", file=sys.stderr)
            return 2
        env = dict(os.environ, RIG_DEVICES=" ".join(d.devices))
        return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
