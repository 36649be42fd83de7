"""Live figures of a running cache: the writer publishes, ``python -m lmcache_rawblock stats``
reads.

A process that writes a device (LMCache's plugin, the MP adapter, or a direct user calling
:func:`publish`) writes a small JSON snapshot of its core every second to
``/dev/shm/lmcache_rawblock/<device id>.json`` (``RB_STATS_DIR`` names another directory), by a
write to a temporary file and a rename, so a reader never sees half of one. ``stats DEVICE``
reads that file: it opens neither the device nor its lock, so it works beside the writer, and
costs the writer one small file write a second on a RAM file system. Why not the endpoint: not
every writer runs one, and a port has to be found; why not the device: the index and the
histograms live in the writer's memory, and the device shows only the last checkpoint.

The file names its writer: ``pid``, ``host``, and where that pid means something, the kernel's
``boot_id`` and the writer's pid namespace (``pid_ns``). A writer removes its file when its core
closes; one that ends without closing (killed, or exiting past its core) leaves it. So a
publisher, when it starts, removes the files of the directory whose writer it can tell is gone:
the file records the boot and pid namespace this process runs in, and no process has that pid.
It leaves every other file: a live writer's (one whose pid now names another process is kept
too), one of another host, boot or pid namespace (a ``/dev/shm`` shared with a container, a
shared directory), where a pid says nothing, and one that does not record them (written by an
earlier version). A writer's temporary file (``<file>.<pid>.tmp``, left by a writer killed
mid-write) goes when no process has its pid and it has not changed for ``TMP_STALE_S``. Removal
is best effort: a file that cannot be read or removed (another user's) is left.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import threading
import time
import weakref
from typing import Any, TextIO

from . import metrics

DEFAULT_DIR = "/dev/shm/lmcache_rawblock"
INTERVAL_S = 1.0
TMP_STALE_S = 600.0  # a temporary file this long unchanged, its pid gone, is a dead writer's
OPS = (("put", "put_ns"), ("load", "load_ns"), ("delete", "delete_ns"), ("checkpoint", "checkpoint_ns"),
       ("compaction", "compaction_ns"), ("dealloc", "dealloc_ns"), ("validate", "validate_ns"),
       ("io queue wait", "queue_wait_ns"), ("io device", "device_ns"))


def stats_dir() -> str:
    return os.environ.get("RB_STATS_DIR") or DEFAULT_DIR


def snapshot_path(device: str) -> str:
    """Where the figures of device are published: one file per device (its real path)."""
    real = os.path.realpath(device)
    return os.path.join(stats_dir(), hashlib.sha256(real.encode()).hexdigest()[:16] + ".json")


def writer_identity() -> dict[str, str | None]:
    """Where this process's pid means something: the host's name (for people), the kernel's
    boot id and the pid namespace; None for what cannot be read (no /proc)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot_id: str | None = f.read().strip() or None
    except OSError:
        boot_id = None
    try:
        pid_ns: str | None = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = None
    return {"host": os.uname().nodename, "boot_id": boot_id, "pid_ns": pid_ns}


def _dead_writer(path: str, me: dict[str, str | None]) -> int | None:
    """The inode of the snapshot file at path when its writer is gone (see the module's
    docstring), else None."""
    try:
        with open(path, encoding="utf-8") as f:
            ino = os.fstat(f.fileno()).st_ino
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not me["boot_id"] or not me["pid_ns"]:
        return None
    if doc.get("boot_id") != me["boot_id"] or doc.get("pid_ns") != me["pid_ns"]:
        return None
    pid = doc.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid_alive(pid):
        return None
    return ino


def _dead_tmp(path: str, name: str) -> int | None:
    """The inode of a temporary file at path when no process has the pid its name carries and it
    has been unchanged for TMP_STALE_S, else None."""
    m = re.fullmatch(r".+\.json\.(\d+)\.tmp", name)
    if not m or pid_alive(int(m.group(1))):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino if time.time() - st.st_mtime > TMP_STALE_S else None


def remove_dead_writers(directory: str | None = None) -> list[str]:
    """Remove the files of directory (default: :func:`stats_dir`) that writers which are gone
    left, as the module's docstring says which; return their paths."""
    d = directory or stats_dir()
    me = writer_identity()
    try:
        names = os.listdir(d)
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        path = os.path.join(d, name)
        ino = _dead_writer(path, me) if name.endswith(".json") else _dead_tmp(path, name)
        if ino is None:
            continue
        try:  # not the file a new writer of the same device put there since it was read
            if os.stat(path).st_ino == ino:
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
    return removed


class Publisher:
    """A daemon thread writing core's snapshot for device every interval seconds; ``stop()``
    ends it and removes the file, as does the core's close (or its end). Starting, it removes
    the files of the directory that dead writers left (:func:`remove_dead_writers`)."""

    def __init__(self, core: Any, device: str, interval: float = INTERVAL_S, index: int | None = None):
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.path = snapshot_path(device)
        self._identity = writer_identity()  # with the pid, in every snapshot
        remove_dead_writers(os.path.dirname(self.path))
        self._core, self._device, self._interval = weakref.ref(core), os.path.realpath(device), interval
        self._index = index  # the device's place in a MultiDeviceCore, or None for a single core
        self._write_lock = threading.Lock()  # one writer of the snapshot file (thread and callers)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rawblock-stats", daemon=True)
        self.last_error: str | None = None
        self._thread.start()

    def publish_now(self) -> bool:
        """Write the snapshot now; False (nothing written) once the core is closed or gone."""
        with self._write_lock:  # the thread and a caller share the temporary file's name
            return self._publish()

    def _publish(self) -> bool:
        core = self._core()
        if core is not None and self._index is not None:  # one device of several
            if getattr(core, "_closed", False):
                return False
            core = core.device_cores()[self._index]
            if core is None:  # failed or reopening: nothing to publish this round
                self._remove()
                return True
        snap = metrics.snapshot(core) if core is not None else None
        if snap is None or snap["status"]["closed"]:
            return False
        doc = {"version": 1, "time": time.time(), "pid": os.getpid(), **self._identity, "device": self._device,
               "interval_s": self._interval, "snapshot": snap}
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, self.path)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.publish_now():
                    break
                self.last_error = None
            except (OSError, RuntimeError) as e:  # a full or missing RAM file system
                self.last_error = str(e)
            self._stop.wait(self._interval)
        self._remove()

    def stop(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(5)
        self._remove()

    def _remove(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                mine = json.load(f).get("pid") == os.getpid()
        except (OSError, ValueError):
            mine = False
        if mine:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


class Publishers:
    """One :class:`Publisher` per device of a cache over several devices."""

    def __init__(self, pubs: list[Publisher]):
        self.publishers = pubs

    def stop(self) -> None:
        for p in self.publishers:
            p.stop()


def publish(core: Any, device: str, interval: float = INTERVAL_S) -> Publisher | Publishers:
    """Publish core's live figures for ``stats DEVICE`` until the returned publisher's stop().
    A cache over several devices (``MultiDeviceCore``) publishes each device's own figures under
    its path, so ``stats`` takes any one of them."""
    paths = getattr(core, "device_paths", None)
    if getattr(core, "device_cores", None) is not None and paths:
        return Publishers([Publisher(core, p, interval, index=i) for i, p in enumerate(paths)])
    return Publisher(core, device, interval)


# ---- the reader -----------------------------------------------------------------------------


def read(device: str) -> dict:
    """The published figures of device. FileNotFoundError (naming the file) when none are."""
    path = snapshot_path(device)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"no live figures for {device} ({path}): no process writing it publishes them "
                                "(LMCache's plugin and MP adapter do; a direct user calls "
                                "lmcache_rawblock.livestats.publish)") from None


def pid_alive(pid: int) -> bool:
    """Whether process pid exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wear(device: str) -> dict | None:
    """The drive's write counters where readable (an NVMe namespace): host and media bytes
    written (FDP statistics) and their ratio, the write amplification; else None."""
    try:
        from ._native import nvme_wear_counters

        w = nvme_wear_counters(device)
    except (ValueError, OSError, ImportError):
        return None
    fs = w.get("fdp_stats") or {}
    out = {"data_units_written": (w.get("smart") or {}).get("data_units_written")}
    if fs.get("hbmw"):
        out.update(host_bytes=fs["hbmw"], media_bytes=fs["mbmw"], waf=fs["mbmw"] / fs["hbmw"])
    return out


def summary(doc: dict, prev: dict | None = None, device: str | None = None) -> dict:
    """The figures ``stats`` shows: per operation count, rate (against prev), p50 and p99; fill;
    misses and evictions; the drive's write counters where readable."""
    snap = doc["snapshot"]
    dt = (doc["time"] - prev["time"]) if prev else 0.0
    ops = {}
    for name, key in OPS:
        h = snap["histograms"][key]
        rate = None
        if prev and dt > 0:
            rate = (h["count"] - prev["snapshot"]["histograms"][key]["count"]) / dt
        p50, p99 = metrics.quantile(h, 0.5), metrics.quantile(h, 0.99)
        ops[name] = {"count": h["count"], "per_s": rate, "p50_s": None if p50 is None else p50 * 1e-9,
                     "p99_s": None if p99 is None else p99 * 1e-9}
    st = snap["status"]
    age = time.time() - doc["time"]
    bytes_rate = {}
    for k in ("put_bytes", "load_bytes"):
        if prev and dt > 0:
            bytes_rate[k] = (snap["histograms"][k]["sum"] - prev["snapshot"]["histograms"][k]["sum"]) / dt
    return {"device": doc["device"], "pid": doc["pid"], "age_s": age,
            "live": pid_alive(int(doc["pid"])) and age < 5 * float(doc.get("interval_s", INTERVAL_S)) + 2,
            "ops": ops, "bytes_per_s": bytes_rate, "indexed_keys": st["indexed_keys"], "slots": st["max_slots"],
            "free_slots": st["free_slots"], "fill": 1 - st["free_slots"] / st["max_slots"] if st["max_slots"] else None,
            "hits": snap["hits"], "misses": snap["misses"], "evictions": snap["evictions"],
            "inflight_bytes": snap["inflight_bytes"], "peak_inflight_bytes": snap["peak_inflight_bytes"],
            "wear": wear(device or doc["device"])}


def _t(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def render(s: dict) -> str:
    """The terminal view of a summary."""
    state = "live" if s["live"] else f"STALE (pid {s['pid']}, {s['age_s']:.0f} s old)"
    fill = "-" if s["fill"] is None else f"{100 * s['fill']:.1f} %"
    lines = [f"lmcache_rawblock stats  {s['device']}  writer pid {s['pid']}  {state}",
             f"keys {s['indexed_keys']:,}  slots {s['slots']:,}  free {s['free_slots']:,}  fill {fill}  "
             f"in flight {s['inflight_bytes']:,} B (peak {s['peak_inflight_bytes']:,} B)", "",
             f"{'operation':<14}{'count':>12}{'per s':>10}{'p50':>12}{'p99':>12}"]
    for name, o in s["ops"].items():
        rate = "-" if o["per_s"] is None else f"{o['per_s']:.1f}"
        lines.append(f"{name:<14}{o['count']:>12,}{rate:>10}{_t(o['p50_s']):>12}{_t(o['p99_s']):>12}")
    br = s["bytes_per_s"]
    if br:
        lines.append(f"put {br['put_bytes'] / 2**20:.1f} MiB/s  load {br['load_bytes'] / 2**20:.1f} MiB/s")
    lines.append("")
    lines.append(f"load hits {s['hits']:,}  misses " + "  ".join(f"{k} {v:,}" for k, v in s["misses"].items()))
    lines.append("evictions " + "  ".join(f"{k} {v:,}" for k, v in s["evictions"].items()))
    w = s["wear"]
    if w and w.get("waf") is not None:
        lines.append(f"drive: host {w['host_bytes']:,} B, media {w['media_bytes']:,} B written, WAF {w['waf']:.3f}")
    else:
        lines.append("drive: write amplification not readable here (needs an NVMe namespace with FDP statistics)")
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("device", help="the device (or file) a running cache writes")
    p.add_argument("--json", action="store_true", help="print the figures once as JSON and exit")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes (default 1)")
    p.add_argument("--count", type=int, default=0, metavar="N", help="stop after N refreshes (default: until Ctrl-C)")


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if not args.interval > 0:
        print(f"stats: --interval must be > 0 seconds, got {args.interval}", file=sys.stderr)
        return 2
    try:
        doc = read(args.device)
    except (FileNotFoundError, ValueError) as e:
        print(f"stats: {e}", file=sys.stderr)
        return 1
    if args.json:
        out.write(json.dumps(summary(doc, None, args.device), indent=2) + "\n")
        return 0
    prev, n = None, 0
    try:
        while True:
            out.write("\x1b[H\x1b[2J" + render(summary(doc, prev, args.device)))
            out.flush()
            n += 1
            if args.count and n >= args.count:
                return 0
            time.sleep(args.interval)
            try:
                new = read(args.device)
            except (FileNotFoundError, ValueError):
                continue  # the writer stopped: keep the last figures (shown stale once old)
            if new["time"] != doc["time"]:
                prev, doc = doc, new
    except KeyboardInterrupt:
        return 0
