"""Logging of what the C core met on its device: failed transfers and flushes, slot headers a
load refused, entries dropped by a failed flush or by a device that shrank.

The core counts every event and keeps the last faults (``report_status()``); this module turns
new ones into log lines, once per burst: the first event of a kind is logged at once, later
ones of the same kind at most every ``interval`` seconds with the count since the last line.
It reads only the core's cheap counters unless one moved.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

# The kinds of event, as trust_counters() orders them.
_FAULTS, _REJECTED, _WRITEBACK, _SHRINK = range(4)
_PUT = 4  # puts that failed for a reason other than a device error (no slot, too large)


class _Burst:
    """At most one line per ``interval`` seconds; what is held back is counted into the next."""

    __slots__ = ("interval", "last", "held")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last = float("-inf")
        self.held = 0

    def take(self, n: int, now: float) -> int:
        """Count n new events; returns how many to report now (0: hold them back)."""
        self.held += n
        if now - self.last < self.interval:
            return 0
        self.last = now
        n, self.held = self.held, 0
        return n


class TrustEvents:
    """Watches one native core; ``check()`` logs what happened since the last call."""

    def __init__(self, native: Any, logger: logging.Logger, device_path: str, *, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._native = native
        self._logger = logger
        self._path = device_path
        self._clock = clock
        self._lock = threading.Lock()
        self._seen = list(native.trust_counters())
        self._bursts = [_Burst(interval) for _ in range(5)]

    def check(self, *, log_faults: bool = True) -> bool:
        """Log what moved since the last call; log_faults=False counts new faults as seen
        without a line (the caller reports them itself). Returns whether new faults came in."""
        if list(self._native.trust_counters()) == self._seen:
            return False  # the common case, without the lock
        with self._lock:
            # read again under the lock: counters only grow, so what was seen never goes back
            now_counts = self._native.trust_counters()
            new = [max(0, int(a) - int(b)) for a, b in zip(now_counts, self._seen)]
            first_fault = self._seen[_FAULTS] + 1
            self._seen = list(now_counts)
            now = self._clock()
            report = [b.take(n, now) if n else 0 for b, n in zip(self._bursts, new)]
        if report[_FAULTS] and log_faults:
            self._log_faults(report[_FAULTS], first_fault)
        if report[_REJECTED]:
            self._logger.warning(
                "RawBlockCore refused %d load(s) whose slot header is not the key's (another writer, a "
                "device that shrank or was overwritten): served as misses, entries dropped (device=%s)",
                report[_REJECTED], self._path)
        if report[_WRITEBACK]:
            self._logger.error(
                "RawBlockCore dropped %d entr%s written since the last successful device flush, because a "
                "flush failed: their bytes may not be on the device (device=%s)",
                report[_WRITEBACK], "y" if report[_WRITEBACK] == 1 else "ies", self._path)
        if report[_SHRINK]:
            self._logger.error("RawBlockCore dropped %d entr%s past the end of a device that shrank (device=%s)",
                               report[_SHRINK], "y" if report[_SHRINK] == 1 else "ies", self._path)
        return new[_FAULTS] > 0

    def put_failed(self, n_failed: int, n: int, failure: BaseException) -> None:
        """A put_many call stored n - n_failed of n keys. A device error is logged from the
        fault journal (operation, offset, path, errno); any other reason once per burst."""
        if self.check() or isinstance(failure, OSError):
            return  # a device error: the fault journal's line says it
        with self._lock:
            report = self._bursts[_PUT].take(n_failed, self._clock())
        if report:
            self._logger.warning("RawBlockCore could not store %d key(s) (%d of %d in the last call): %s (device=%s)",
                                 report, n_failed, n, failure, self._path)

    def _log_faults(self, n: int, first_seq: int) -> None:
        faults = [f for f in self._native.status()["faults"] if f["seq"] >= first_seq]
        newest = faults[-1]["text"] if faults else "(no longer in the journal)"
        if n == 1:
            self._logger.error("RawBlockCore I/O error: %s", newest)
        else:
            self._logger.error("RawBlockCore %d I/O errors since the last report; the newest: %s", n, newest)
