"""Extent eviction: the plugin's ``eviction_policy: extent``.

With ``extent_bytes`` on, the core hands slots out an extent (a reclaim unit) at a time and
gives an extent back to the device as one range once all its slots are free. Evicting keys one
by one in LRU order would leave every extent partly live, so the drive would still copy what
survives when it reclaims. This policy evicts whole extents instead: the victim is the closed
extent filled longest ago (its last put, O(1) in the core; a load hit marks its key hot but
does not keep the extent, whose neighbours on the drive would otherwise go before it), and all
its keys go in one batched delete through the plugin's normal delete path, so FREE records,
checkpoints, the readers' quarantine and deallocation behave as for any delete.

* Evict-ahead: the background thread keeps ``extent_reserve`` clean extents (every slot free,
  or waiting for its deallocation; by default 5 % of the extents, at least 2, as the LRU
  policy's evict-ahead keeps 5 % of the slots) so puts find room without waiting; a pass that
  evicts also writes the checkpoint that makes the freed slots reusable.
* A put that still finds no slot evicts extents for its missing keys (never the batch's own
  keys), as the LRU policy does.
* Pinned keys and keys a load holds are kept; their extent stays partly live (the core does
  not choose it again at once) and its free slots are reused when no clean extent is left.
* Hot keys survive (CacheLib's region reinsertion), with ``extent_reinsert`` on (the
  default): the background evictor reads the victim's keys that were loaded since they were
  put (at most half the extent, so each eviction frees at least half of one), deletes the
  extent's keys, and once the checkpoint has made the slots reusable puts those keys again,
  into the open extent. Between the delete and the put such a key misses. A put that evicts
  for itself does not reinsert (the slots it frees are its own). A remove by the cache's user
  during the pass (``removed``) cancels its reinsertion: a key removed then (it missed, so the
  remove found nothing) must not come back with the bytes it had.

Locks: ``pin_lock`` is the plugin's ``_pin_lock``, held from the victim choice to its delete so
no pin slips in between (the plugin's lock order), and over the put that reinserts so no remove
does; the counters change under it too (the evictor thread and a put evicting for itself both
write them).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import Any

from .raw_block import RawBlockKeySpec
from .raw_block.key_codec import slot_identity_from_encoded_key
from .settings import parse_int

__all__ = ["DEFAULT_RESERVE_FRACTION", "ExtentEviction", "parse_reserve"]

# The default reserve: this fraction of the extents, at least MIN_RESERVE.
DEFAULT_RESERVE_FRACTION = 0.05
MIN_RESERVE = 2


def parse_reserve(value: Any, label: str) -> int:
    """``extent_reserve``: an integer >= 1 (an int or a decimal string); None or "" = 0, the
    default (5 % of the extents, at least 2)."""
    if value is None or value == "":
        return 0
    try:
        number = parse_int(value, label)  # 2.9 is not 2 extents, True not 1
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{label} must be an integer >= 1 (clean extents kept ahead), got {value!r}")
    return number


class ExtentEviction:
    """Whole-extent eviction over one core with extents on (see the module docstring)."""

    def __init__(self, core: Any, pin_lock: threading.Lock, pinned: Callable[[], set[str]], reserve: int,
                 logger: logging.Logger, reinsert: bool = True, label: str = "extent_reserve") -> None:
        counts = core.extent_counts()
        if counts["extent_slots"] == 0:
            raise ValueError("eviction_policy 'extent' needs extents: set extent_bytes to the drive's reclaim unit "
                             "(at least 2 slots; with meta_format v1 a multiple of slot_bytes)")
        if reserve and reserve >= counts["extents_total"]:
            # every closed extent would be evicted on every pass: the cache would keep nothing
            raise ValueError(f"{label} must be below the device's {counts['extents_total']} extents (clean extents "
                             f"kept ahead), got {reserve}")
        self._core = core
        self._pin_lock = pin_lock
        self._pinned = pinned
        self.reserve = reserve or max(MIN_RESERVE, math.ceil(DEFAULT_RESERVE_FRACTION * counts["extents_total"]))
        self._log = logger
        self.reinsert = reinsert
        self.extents_evicted = 0  # victim extents whose keys were deleted
        self.keys_evicted = 0
        self.keys_reinserted = 0
        self.removes = 0  # the plugin's removes, counted under pin_lock (see removed)

    def evict(self, want: int, protect: frozenset[str] | set[str] = frozenset()) -> int:
        """Delete the keys of victim extents, filled longest ago first, until ``want`` keys
        are gone or every closed extent was looked at once. Returns the keys deleted."""
        evicted = 0
        seen: set[int] = set()
        while evicted < want:
            got = self._evict_one(protect, seen, None)
            if got is None:
                break
            evicted += got
        return evicted

    def _evict_one(self, protect: frozenset[str] | set[str], seen: set[int], again: list | None) -> int | None:
        """One victim extent's keys deleted: how many, or None when no victim is left. With
        ``again`` (a list), its hot keys read first go there as (spec, payload) to put back."""
        with self._pin_lock:
            victim = self._core.extent_victim()
            if victim is None or victim[0] in seen:
                return None
            ext, keys, hot = victim
            seen.add(ext)
            pinned = self._pinned()
            keep = [(k, h) for k, h in zip(keys, hot) if k not in pinned and k not in protect]
            keys = [k for k, _ in keep]
            if again is not None:
                again += self._read([k for k, h in keep if h][:len(keep) // 2])
            results = self._core.delete_many(keys, force=False) if keys else []
            deleted = sum(1 for ok in results if ok)
            if deleted:
                self.extents_evicted += 1
                self.keys_evicted += deleted
        if deleted:
            self._log.debug("raw-block extent eviction: extent %d, %d keys deleted", ext, deleted)
        return deleted

    def removed(self) -> None:
        """The cache's user removed keys (the plugin calls it under ``pin_lock``): a pass
        that evicted before then does not put its hot keys back."""
        self.removes += 1

    def missing_clean(self) -> int:
        """Clean extents (or extents waiting for their deallocation) short of the reserve."""
        c = self._core.extent_counts()
        if c["closed"]:
            return 0
        return max(0, self.reserve - c["extents_clean"] - c["extents_pending_dealloc"])

    def evictor_pass(self) -> bool:
        """One pass of the evictor thread: evict one victim extent per clean extent missing
        from the reserve, then write the checkpoint that makes their slots reusable (their
        extents then wait for their deallocation, which that checkpoint runs). True when it
        evicted (the next pass looks again: a format v1 core needs a second change before its
        second container stops listing the slots)."""
        evicted = 0
        again: list | None = [] if self.reinsert else None
        removes = self.removes
        for _ in range(self.missing_clean()):
            got = self._evict_one(frozenset(), set(), again)
            if not got:
                break
            evicted += got
        if evicted or self._core.slot_counts().held:
            self._core.reclaim_held_slots()
        if again:
            self._put_again(again, removes)
        return evicted > 0

    def _read(self, keys: list[str]) -> list[tuple[Any, Any]]:
        """(spec, payload) of each key read whole (a key gone or unreadable is left out)."""
        if not keys:
            return []
        metas = self._core.get_metadata_many(keys)
        found = [(k, m) for k, m in zip(keys, metas) if m is not None]
        objs = [_Payload(m) for _, m in found]
        ok = self._core.load_many_into([k for k, _ in found], objs) if found else []
        ns = self._core.key_namespace
        return [(RawBlockKeySpec(encoded=k, slot_identity=slot_identity_from_encoded_key(k, ns)), o)
                for (k, _), o, good in zip(found, objs, ok) if good]

    def _put_again(self, again: list[tuple[Any, Any]], removes: int) -> None:
        """Put the hot keys of evicted extents back (into the open extent). A key put again
        meanwhile by the cache's user stays as that put left it; after any remove since the
        pass began (``removes`` then) none is put back. The pin lock keeps a remove from
        slipping in between that check and the put."""
        with self._pin_lock:
            if self.removes != removes:
                self._log.debug("raw-block extent eviction: %d hot keys not put back (keys were removed)",
                                len(again))
                return
            res = self._core.put_many([s for s, _ in again], [o for _, o in again])
            self.keys_reinserted += sum(1 for ok in res.results if ok)


class _Payload:
    """A key's bytes read back for reinsertion, with the metadata its put is given again."""

    def __init__(self, meta: Any) -> None:
        self.metadata = meta
        self.byte_array = memoryview(bytearray(int(meta.size)))
