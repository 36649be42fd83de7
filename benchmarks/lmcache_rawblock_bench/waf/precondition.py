"""``waf precondition``: bring a drive (or a file) to a known written state before measuring
its write amplification, then measure the WAF of plain random writes as a baseline.

Three phases over the span (the first ``--span`` bytes of ``--device``):

1. sequential fill: every byte written once, in ``--block`` writes;
2. random overwrite: ``--overwrite`` drive writes of the span in ``--random-block`` writes at
   uniformly random aligned offsets (this is what pushes a flash drive into garbage collection);
3. calibration: ``--calibrate`` drive writes more of the same random writes, no placement
   directive, with the wear counters (:mod:`.counters`) read just before and just after it.
   The window's WAF is the baseline a placement-aware replay is compared with.

Writes go through ``O_DIRECT`` when the file or device takes it (else buffered, then fsync),
from ``--depth`` threads (each one synchronous pwrite at a time, so the queue depth is about
``--depth``). The data is random (not compressible, not zero) with each block's offset stamped
in its first bytes. Each phase ends with fsync (an NVMe Flush on a namespace).

An NVMe generic character device (``/dev/ngXnY``) is written through its block device
``/dev/nvmeXnY`` (same namespace, ordinary writes); the counters are read from the path given.

The data on the span is destroyed: ``--destroy-data`` is required, and a device on which
libblkid finds a file system or partition table is refused unless ``--force`` (the same check
as ``bench --device``). The write path is held exclusively for the whole run (flock LOCK_EX, and
O_EXCL on a block device, as a core holds its device): a device a running core holds, or a
mounted one, is refused, and no core can open it while it is preconditioned.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import stat
import struct
import sys
import threading
import time
from typing import Callable, Iterator, Optional

from ..common import MiB, aligned_buffer, fmt_size, parse_size
from ..target import TargetError, hold_exclusive, open_target
from . import counters

ALIGN = 4096
PROG = "python -m lmcache_rawblock waf precondition"


def _size_type(multiple: int = 1) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = parse_size(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if n % multiple:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a multiple of {fmt_size(multiple)} (O_DIRECT needs aligned sizes)")
        return n

    return parse


def _drive_writes_type() -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of drive writes") from None
        if not (v >= 0.0) or v == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number >= 0")
        return v

    return parse


def _depth_type(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= v <= 64:
        raise argparse.ArgumentTypeError(f"{text!r}: must be between 1 and 64")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``waf precondition`` (the subcommand's parser is made by the caller)."""
    p.description = p.description or (
        "Precondition a drive for a write-amplification measurement: a sequential fill of the span, "
        "random overwrites, then a calibration window of random writes with the drive's wear counters "
        "(FDP statistics, SMART) read around it. DESTROYS the data on the span.")
    p.add_argument("--device", required=True, metavar="PATH",
                   help="block device, NVMe generic character device (/dev/ngXnY, written through /dev/nvmeXnY) "
                        "or regular file to precondition; its data is destroyed")
    p.add_argument("--span", type=_size_type(ALIGN), metavar="SIZE",
                   help="bytes from the start of the device to write (default the whole device or file; "
                        "a regular file is extended to it), e.g. 64G")
    p.add_argument("--block", type=_size_type(ALIGN), default=MiB, metavar="SIZE",
                   help="write size of the sequential fill (default 1M)")
    p.add_argument("--random-block", type=_size_type(ALIGN), default=128 * 1024, metavar="SIZE",
                   help="write size of the random overwrite and calibration passes (default 128K)")
    p.add_argument("--overwrite", type=_drive_writes_type(), default=1.0, metavar="DW",
                   help="random overwrite, in drive writes of the span (default 1.0)")
    p.add_argument("--calibrate", type=_drive_writes_type(), default=0.25, metavar="DW",
                   help="calibration window of random writes, in drive writes of the span, with the wear "
                        "counters read before and after it (default 0.25; 0 skips it)")
    p.add_argument("--depth", type=_depth_type, default=4, metavar="N",
                   help="writer threads, about the queue depth (default 4)")
    p.add_argument("--seed", type=int, default=1, help="random offsets' generator seed (default 1)")
    p.add_argument("--destroy-data", action="store_true",
                   help="required: confirms that the data on the span may be overwritten")
    p.add_argument("--force", action="store_true",
                   help="write even if blkid finds a file system or partition table on the device")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _err(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return 2


_NG_RE = re.compile(r"^ng(\d+)n(\d+)$")


def write_path_for(path: str) -> str:
    """The path writes go to: the block device ``/dev/nvmeXnY`` for a generic character device
    ``ngXnY`` (same namespace), else ``path`` itself."""
    try:
        st = os.stat(path)
    except OSError:
        return path
    m = _NG_RE.match(os.path.basename(path))
    if stat.S_ISCHR(st.st_mode) and m:
        return os.path.join(os.path.dirname(path) or "/dev", f"nvme{m.group(1)}n{m.group(2)}")
    return path


class _Progress:
    """One line on stderr per phase, refreshed at most every second (carriage return on a
    terminal, a new line at most every 10 s otherwise)."""

    def __init__(self, name: str, total: int) -> None:
        self.name, self.total = name, max(total, 1)
        self.done = 0
        self.t0 = self.last = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if now - self.last >= (1.0 if self.tty else 10.0):
                self.last = now
                self._show(now, end="\r" if self.tty else "\n")

    def _show(self, now: float, end: str) -> None:
        dt = max(now - self.t0, 1e-9)
        print(f"{self.name}: {100.0 * self.done / self.total:5.1f}%  {fmt_size_approx(self.done)} "
              f"of {fmt_size_approx(self.total)}  {fmt_size_approx(self.done / dt)}/s", end=end, file=sys.stderr,
              flush=True)

    def finish(self) -> float:
        now = time.monotonic()
        self._show(now, end="\n")
        return now - self.t0


def fmt_size_approx(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


def _open_for_write(path: str) -> tuple[int, bool]:
    """fd and whether it is O_DIRECT (tried first, buffered when the file system refuses it)."""
    flags = os.O_WRONLY | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_DIRECT), True
    except OSError as exc:
        if exc.errno != 22:  # EINVAL: no O_DIRECT here (tmpfs)
            raise
    return os.open(path, flags), False


def _run_writers(fd: int, depth: int, block: int, jobs: Callable[[int], Iterator[tuple[int, int]]],
                 prog: _Progress) -> None:
    """depth threads, thread i writing the (offset, length) pairs jobs(i) yields (generated as
    they go: a large drive has millions of them); the first error is raised after every thread
    stops."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def work(i: int) -> None:
        buf = aligned_buffer(block)
        buf[:] = os.urandom(block)
        try:
            for off, n in jobs(i):
                if stop.is_set():
                    return
                struct.pack_into("<QQ", buf, 0, off, i)  # every block's content differs
                done = 0
                while done < n:
                    w = os.pwrite(fd, buf[done:n], off + done)
                    if w <= 0:
                        raise OSError(5, f"short write at offset {off + done}")
                    done += w
                prog.add(n)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(depth)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _sequential(fd: int, span: int, block: int, depth: int) -> float:
    nblocks = (span + block - 1) // block

    def jobs(i: int) -> Iterator[tuple[int, int]]:
        return ((k * block, min(block, span - k * block)) for k in range(i, nblocks, depth))

    prog = _Progress("sequential fill", span)
    _run_writers(fd, depth, block, jobs, prog)
    os.fsync(fd)
    return prog.finish()


def _random(name: str, fd: int, span: int, block: int, drive_writes: float, depth: int, seed: int) -> tuple[int, float]:
    slots = span // block
    nops = int(round(drive_writes * span / block))

    def jobs(i: int) -> Iterator[tuple[int, int]]:
        rng = random.Random(seed * 1000 + i)
        mine = nops // depth + (1 if i < nops % depth else 0)
        return ((rng.randrange(slots) * block, block) for _ in range(mine))

    prog = _Progress(name, nops * block)
    _run_writers(fd, depth, block, jobs, prog)
    os.fsync(fd)
    return nops * block, prog.finish()


def _snapshot(device: str, notes: list[str]) -> Optional[dict]:
    """read_counters, or None with a note when the controller or the kernel refuses."""
    try:
        return counters.read_counters(device)
    except (OSError, RuntimeError) as exc:
        notes.append(f"wear counters of {device} could not be read: {exc}")
        return None


def run(device: str, span: Optional[int], block: int, random_block: int, overwrite: float, calibrate: float,
        depth: int, seed: int, force: bool) -> dict:
    """The three phases; the report. TargetError for a problem with the arguments or device."""
    wpath = write_path_for(device)
    if wpath != device and not os.path.exists(wpath):
        raise TargetError(f"--device {device}: a generic character device, but its block device {wpath} "
                          "does not exist (writes go through it)")
    # Held before anything is written (the file extension included), until the last write.
    guard = hold_exclusive(wpath) if os.path.exists(wpath) else None
    try:
        notes: list[str] = []
        if wpath != device:
            notes.append(f"writes go through the block device {wpath}; counters are read from {device}")
        try:
            st = os.stat(wpath)
        except OSError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and span is not None and st.st_size < span:
            with open(wpath, "r+b") as f:
                f.truncate(span)
            notes.append(f"{wpath} extended from {st.st_size} to {span} bytes")
        target = open_target(wpath, span, force=force, lock=False)
        notes.extend(target.notes)
        span = target.size
        if block > span:
            raise TargetError(f"--block {block}: larger than the span ({span} bytes)")
        if random_block > span:
            raise TargetError(f"--random-block {random_block}: larger than the span ({span} bytes)")

        report: dict = {"device": device, "write_path": wpath, "kind": target.kind, "span_bytes": span,
                        "device_bytes": target.device_size, "block": block, "random_block": random_block,
                        "depth": depth, "overwrite_drive_writes": overwrite, "calibrate_drive_writes": calibrate,
                        "phases": [], "notes": notes}
        fd, direct = _open_for_write(wpath)
        report["o_direct"] = direct
        if not direct:
            notes.append("O_DIRECT not available here: buffered writes, fsync at the end of each phase")
        try:
            secs = _sequential(fd, span, block, depth)
            report["phases"].append({"name": "fill", "bytes": span, "seconds": secs})
            if overwrite > 0:
                n, secs = _random("random overwrite", fd, span, random_block, overwrite, depth, seed)
                report["phases"].append({"name": "overwrite", "bytes": n, "seconds": secs})
            if calibrate > 0:
                before = _snapshot(device, notes)
                n, secs = _random("calibration", fd, span, random_block, calibrate, depth, seed + 1)
                after = _snapshot(device, notes) if before is not None else None
                report["phases"].append({"name": "calibrate", "bytes": n, "seconds": secs})
                w = counters.window(before, after)
                w["written_bytes"] = n
                report["calibration"] = w
                report["waf"] = w["waf"]
                report["warning"] = counters.steady_state_warning(w["waf"])
            else:
                report["calibration"] = None
                report["waf"] = None
                report["warning"] = None
        finally:
            os.close(fd)
        return report
    finally:
        if guard is not None:
            guard.close()


def _rate(nbytes: int, secs: float) -> str:
    return f"{fmt_size_approx(nbytes / secs)}/s" if secs > 0 else "-"


def format_report(r: dict) -> str:
    lines = [f"precondition {r['device']}" + (f" (written through {r['write_path']})"
                                               if r["write_path"] != r["device"] else "")
             + f": span {fmt_size_approx(r['span_bytes'])} of {fmt_size_approx(r['device_bytes'])}, "
             f"{'O_DIRECT' if r['o_direct'] else 'buffered'}, depth {r['depth']}"]
    for ph in r["phases"]:
        lines.append(f"  {ph['name']:<10} {fmt_size_approx(ph['bytes']):>12} in {ph['seconds']:.1f} s "
                     f"({_rate(ph['bytes'], ph['seconds'])})")
    w = r.get("calibration")
    if w is None:
        lines.append("calibration: skipped (--calibrate 0)")
    else:
        lines.append(f"calibration window: {fmt_size_approx(w['written_bytes'])} of random "
                     f"{fmt_size_approx(r['random_block'])} writes, no placement directive")
        if w["host_bytes"] is not None:
            lines.append(f"  FDP host bytes {w['host_bytes']}, media bytes {w['media_bytes']}, "
                         f"erased bytes {w['erased_bytes']}")
        if w["smart_written_bytes"] is not None:
            lines.append(f"  SMART data units written: {w['smart_written_bytes']} bytes "
                         "(512,000-byte units, controller-wide)")
        if w["waf"] is not None:
            lines.append(f"  WAF {w['waf']:.3f}")
        else:
            lines.append(f"  WAF not available: {w['note']}")
    if r.get("warning"):
        lines.append(f"warning: {r['warning']}")
    for n in r["notes"]:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def main(a: argparse.Namespace) -> int:
    """Run ``waf precondition`` with the parsed options; the exit code (2 on a refusal or a
    bad option, 1 when a write fails)."""
    if not a.destroy_data:
        return _err(f"--device {a.device}: refusing to run without --destroy-data: preconditioning overwrites "
                    "the span with random data")
    try:
        r = run(a.device, a.span, a.block, a.random_block, a.overwrite, a.calibrate, a.depth, a.seed, a.force)
    except TargetError as exc:
        return _err(str(exc))
    except OSError as exc:
        print(f"{PROG}: error: {a.device}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(r, indent=2, sort_keys=True, default=str))
    else:
        print(format_report(r))
    return 0
