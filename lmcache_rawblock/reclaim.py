"""A background thread that frees slots off the callers' threads.

The plugin's evict-ahead (``rust_raw_block.eviction_trigger_watermark`` / ``eviction_ratio``)
and the MP adapter's deletes both end with freed slots that become reusable only once a
checkpoint no longer lists them. Writing that checkpoint on the thread that deleted (a put, or
LMCache's eviction controller) would make it wait for metadata I/O; :class:`Reclaimer` runs the
work on one daemon thread instead, woken by :meth:`Reclaimer.signal`.

* The thread starts at the first signal, so an instance that never needs it costs nothing.
* Signals coalesce: any number of them while a pass runs give one more pass.
* ``work()`` returns True when it wants another pass at once (it left work behind).
* An exception from ``work()`` is logged with its traceback and counted (``errors``,
  ``last_error``); the same error again is counted and logged at debug level only, so a
  failure on every put does not flood the log. The thread goes on with the next signal.
* :meth:`stop` wakes the thread, waits for the pass in progress and joins it; a signal after
  that does nothing. The owner stops it before closing the core the work uses.

Locks: ``_cond``'s lock is a leaf (nothing else is taken under it, and ``work()`` runs without
it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Reclaimer"]


class Reclaimer:
    """One daemon thread running ``work()`` after signals (see the module docstring)."""

    def __init__(self, name: str, work: Callable[[], bool], logger: logging.Logger) -> None:
        self.name = name
        self._work = work
        self._logger = logger
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._pending = False
        self._busy = False
        self._stopped = False
        self.passes = 0
        self.errors = 0
        self.last_error: str | None = None

    # ---- callers ------------------------------------------------------------------------

    def signal(self) -> None:
        """Ask for a pass (starting the thread the first time). Never blocks on the work."""
        with self._cond:
            if self._stopped:
                return
            self._pending = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            else:
                self._cond.notify()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread after the pass in progress; True when it has ended (or never ran)."""
        with self._cond:
            self._stopped = True
            self._pending = False
            thread = self._thread
            self._cond.notify_all()
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no pass is running or asked for (False when ``timeout`` ran out first)."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._pending or self._busy) or self._stopped, timeout)

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def status(self) -> dict:
        return {"running": self.running, "passes": self.passes, "errors": self.errors,
                "last_error": self.last_error}

    # ---- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._pending or self._stopped)
                if self._stopped:
                    return
                self._pending = False
                self._busy = True
            again = False
            try:
                again = bool(self._work())
            except Exception as e:  # any failure: logged with its traceback and counted
                self.errors += 1
                error = f"{type(e).__name__}: {e}"
                if error != self.last_error:
                    self._logger.exception("%s: a pass failed", self.name)
                else:  # the same failure again: counted, logged once per change of error
                    self._logger.debug("%s: a pass failed again: %s", self.name, error)
                self.last_error = error
            finally:
                self.passes += 1
            if again:
                with self._cond:
                    if not self._stopped:
                        self._pending = True
