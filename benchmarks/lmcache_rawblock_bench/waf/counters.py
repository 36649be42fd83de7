"""Real-drive wear counters around a measurement window.

:func:`read_counters` takes a snapshot of an NVMe namespace's wear counters (the controller's
SMART / Health log and, when Flexible Data Placement is on, the endurance group's FDP
statistics and events logs); :func:`window` turns two snapshots into the window's deltas and
its write amplification; :func:`steady_state_warning` says when a WAF of about 1 means the
measurement says little.

Counter sources and their granularity:

* ``fdp_stats`` (log 0x22, per endurance group): host bytes with metadata written (hbmw),
  media bytes written (mbmw), media bytes erased (mbe), in bytes. 128-bit on the wire, the low
  64 bits are kept. The WAF comes from these: media / host.
* ``smart`` (log 0x02, controller-wide): Data Units Written / Read, in units of 1000 x 512
  bytes (a window shorter than 512,000 bytes may show 0 or 1 unit), and the host read / write
  command counts (low 64 bits). Every namespace of the controller adds to them.
* ``fdp_events`` (log 0x23): the number of host and controller FDP events the drive holds and
  how many of each type (``by_type``; 0 = reclaim unit not fully written, 1 = its active time
  limit exceeded, 0x80 = media reallocated, ...). The log keeps only the most recent events (at
  most 63 per log), so a window's event delta is a lower bound and stays 0 once a log is full.
  Host events are only logged for the types the host enabled (Set Features, FDP Events).
"""

from __future__ import annotations

import time
from typing import Optional

#: Bytes in one SMART "data unit" (1000 x 512 bytes).
SMART_UNIT_BYTES = 512_000

#: WAF within this distance of 1.0 draws :func:`steady_state_warning`.
STEADY_STATE_TOLERANCE = 0.05


def read_counters(path: str) -> Optional[dict]:
    """A snapshot of the wear counters of the NVMe namespace at ``path`` (``/dev/ngXnY`` or
    ``/dev/nvmeXnY``): ``smart`` {data_units_written, data_units_read, host_write_commands,
    host_read_commands}, ``fdp_stats`` {hbmw, mbmw, mbe} or None, ``fdp_events`` {host,
    controller} or None, ``endgid``, ``nsid`` and ``time`` (``time.time()`` after the read).

    None when ``path`` is not an NVMe namespace (a regular file, a loop or other block device).
    OSError when it cannot be opened; RuntimeError when the controller fails the SMART log."""
    from lmcache_rawblock import _native

    try:
        c = _native.nvme_wear_counters(path)
    except ValueError:
        # ENOTTY (no NVMe ioctls) or namespace id 0 (a controller node): not a namespace.
        return None
    c["time"] = time.time()
    return c


def _delta(before: Optional[dict], after: Optional[dict], group: str, key: str) -> Optional[int]:
    if not before or not after:
        return None
    b, a = before.get(group), after.get(group)
    if not isinstance(b, dict) or not isinstance(a, dict) or key not in b or key not in a:
        return None
    return int(a[key]) - int(b[key])


def window(before: Optional[dict], after: Optional[dict]) -> dict:
    """The deltas between two :func:`read_counters` snapshots of the same namespace.

    Keys: ``available`` (True when the FDP statistics are there on both sides), ``note`` (a
    plain sentence when something is missing, else ""), ``seconds``, ``host_bytes`` (hbmw),
    ``media_bytes`` (mbmw), ``erased_bytes`` (mbe), ``smart_written_bytes`` (Data Units
    Written x 512,000: 512,000-byte granularity, controller-wide), ``smart_read_bytes``,
    ``host_write_commands``, ``host_read_commands``, ``events_host``, ``events_controller``
    (None where a counter is missing) and ``waf`` = media / host bytes (None when the host
    delta is 0 or the counters are missing)."""
    out: dict = {
        "available": False,
        "note": "",
        "seconds": None,
        "host_bytes": _delta(before, after, "fdp_stats", "hbmw"),
        "media_bytes": _delta(before, after, "fdp_stats", "mbmw"),
        "erased_bytes": _delta(before, after, "fdp_stats", "mbe"),
        "smart_written_bytes": None,
        "smart_read_bytes": None,
        "host_write_commands": _delta(before, after, "smart", "host_write_commands"),
        "host_read_commands": _delta(before, after, "smart", "host_read_commands"),
        "events_host": _delta(before, after, "fdp_events", "host"),
        "events_controller": _delta(before, after, "fdp_events", "controller"),
        "waf": None,
    }
    duw = _delta(before, after, "smart", "data_units_written")
    dur = _delta(before, after, "smart", "data_units_read")
    out["smart_written_bytes"] = None if duw is None else duw * SMART_UNIT_BYTES
    out["smart_read_bytes"] = None if dur is None else dur * SMART_UNIT_BYTES
    if before and after and "time" in before and "time" in after:
        out["seconds"] = float(after["time"]) - float(before["time"])

    if before is None or after is None:
        out["note"] = ("no wear counters: the target is not an NVMe namespace (a regular file or a "
                       "non-NVMe block device), so the drive's write amplification cannot be measured")
        return out
    if before.get("nsid") != after.get("nsid") or before.get("endgid") != after.get("endgid"):
        out["note"] = "the two snapshots are of different namespaces; the deltas mean nothing"
        for k in list(out):
            if k not in ("available", "note", "seconds"):
                out[k] = None
        return out
    host, media = out["host_bytes"], out["media_bytes"]
    if host is None or media is None:
        out["note"] = ("no FDP statistics: Flexible Data Placement is off or not supported on this "
                       "drive, so media bytes written are unknown; only the SMART host counters are shown")
        return out
    if host < 0 or media < 0:
        out["note"] = "a counter went backwards (drive reset or reformatted during the window)"
        return out
    out["available"] = True
    if host == 0:
        out["note"] = "the host wrote nothing during the window: no WAF"
    else:
        out["waf"] = media / host
    return out


def steady_state_warning(waf: Optional[float]) -> Optional[str]:
    """A warning when ``waf`` is within 0.05 of 1.0 (the drive did no visible garbage
    collection during the window), else None (also for None)."""
    if waf is None or abs(waf - 1.0) > STEADY_STATE_TOLERANCE:
        return None
    return (f"WAF = {waf:.3f}: the drive is not in steady state, or does not model garbage collection: "
            "QEMU's FDP emulation reports WAF = 1")
