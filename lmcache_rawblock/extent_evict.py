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
  evicts also writes the checkpoint that makes the freed slots reusable. The reserve follows
  the puts: a pass that evicted measures the extents the puts opened while it ran (its victims'
  deletes, the checkpoint, the deallocation: what a put out of slots would wait for), and the
  evictor keeps twice the most of that seen lately (halved every ``DEMAND_HALF_LIFE_S``), at
  most a quarter of the extents, when that is more than ``extent_reserve``
  (``effective_reserve``); a put that found no slot doubles it at once. A storm of puts then
  finds the next extent clean instead of waiting for the checkpoint its freed slots need.
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

Owners: the plugin (``eviction_policy: extent``) and the MP adapter (``eviction_policy``
in ``adapter_params``). An owner that keeps its own record of the stored keys passes
``on_deleted`` and ``on_put_again``: called under ``pin_lock`` with the encoded keys a victim's
delete removed and the keys a reinsertion stored, so the record changes in the same section as
the core (the hooks must not block or call back into the evictor).

The evictor thread's pass is one native call (``RawBlockCore.extent_evict``, the GIL released
throughout): the core takes each victim and deletes its keys under one hold of its mutex (a key
a pin or a load holds is skipped there, as the plugin's pins lock their keys in the core), then
writes the checkpoint that makes the slots reusable. Hot keys to put back come out of it still
stored: the pass reads them, deletes them and reclaims. A put that evicts for itself, and a
chooser's pass (``extent_prefix``), take a victim at a time from Python.

Locks: ``pin_lock`` is the plugin's ``_pin_lock``. A pass with an owner to tell
(``on_deleted``) holds it over the native call, whose checkpoint then runs after it; without
one it is taken only to count. A victim taken from Python holds it over the victim choice and
again over the victim's delete, which skips the keys pinned meanwhile (the plugin's lock
order); hot keys are read between the two, without it, so pins, removes and loads do not wait
for that I/O. The put that reinserts holds only ``reinsert_lock``, which the plugin's removes take too
(so no remove slips in between the check and the put; pins and loads never wait for it). The
counters change under ``pin_lock`` (the evictor thread and a put evicting for itself both
write them).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from .raw_block import RawBlockKeySpec
from .raw_block.key_codec import slot_identity_from_encoded_key
from .settings import parse_bool, parse_int

__all__ = ["DEFAULT_RESERVE_FRACTION", "ExtentEviction", "parse_reinsert", "parse_reserve", "reinsert_choice",
           "remove_guard"]

# The default reserve: this fraction of the extents, at least MIN_RESERVE.
DEFAULT_RESERVE_FRACTION = 0.05
MIN_RESERVE = 2
# The reserve the puts' measured demand may raise it to: at most this fraction of the extents
# (clean extents hold no keys: what the cache gives up under a storm of puts).
MAX_RESERVE_FRACTION = 0.25
# The demand remembered: the most extents opened during one evicting pass, halved every so
# many seconds (a burst is remembered for a few passes, an idle cache forgets it).
DEMAND_HALF_LIFE_S = 2.0
# The bytes of extents a pass that evicts frees at least (whole extents, at most ``reserve`` of
# them): each pass writes a group of its FREE records and syncs it, and with small extents a
# pass per extent would cost the device a sync per extent (an extent of 16 64 KiB slots: a sync
# a MiB). Extents of a reclaim unit are larger: one a pass, as the missing ones say.
PASS_MIN_BYTES = 16 << 20


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


def parse_reinsert(value: Any, label: str) -> bool:
    """``extent_reinsert``: a boolean; None or "" = True, the default."""
    return True if value is None or value == "" else parse_bool(value, label)


def reinsert_choice(keys: list[tuple[Any, bool]]) -> list[Any]:
    """Which of a victim extent's evictable keys (key, loaded since its put) are put again: the
    hot ones in the extent's slot order (filled first, first), at most half of ``keys``, so each
    eviction frees at least half of what it looked at. The wear study's replay
    (``waf replay``) uses the same rule."""
    return [k for k, hot in keys if hot][:len(keys) // 2]


def remove_guard(extents: ExtentEviction | None) -> Any:
    """What an owner's remove holds before its pin lock: the evictor's ``reinsert_lock`` (so its
    reinserting put cannot bring back a key removed after its check), nothing without one."""
    return extents.reinsert_lock if extents is not None else contextlib.nullcontext()


def _largest_class_slots(core: Any, counts: dict[str, int]) -> int:
    """Slots an extent holds of the largest size class, whose slots are ``slot_bytes``:
    ``extent_slots`` counts the smallest class's (the same without size classes). The puts'
    budget (``puts_stored``) counts these, so puts of large objects do not run the clean
    extents out before it ends."""
    per = counts["extent_slots"]
    eb = counts.get("extent_bytes", 0)
    return max(1, min(per, eb // int(core.slot_bytes))) if eb else per


class ExtentEviction:
    """Whole-extent eviction over one core with extents on (see the module docstring)."""

    def __init__(self, core: Any, pin_lock: threading.Lock, pinned: Callable[[], set[str]], reserve: int,
                 logger: logging.Logger, reinsert: bool = True, label: str = "extent_reserve",
                 on_deleted: Callable[[list[str]], None] | None = None,
                 on_put_again: Callable[[list[str]], None] | None = None, chooser: Any = None) -> None:
        counts = core.extent_counts()
        if counts["extent_slots"] == 0:
            why = core.report_status().get("extent_bytes_source", "setting")
            auto = "" if why == "setting" else f" (extent_bytes=auto resolved to off here: {why})"
            raise ValueError("eviction_policy 'extent' needs extents: set extent_bytes to the drive's reclaim unit "
                             f"(at least 2 slots; with meta_format v1 a multiple of slot_bytes){auto}")
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
        self._on_deleted = on_deleted
        self._on_put_again = on_put_again
        self.extents_evicted = 0  # victim extents whose keys were deleted
        self.keys_evicted = 0
        self.keys_reinserted = 0
        self.removes = 0  # the plugin's removes, counted under pin_lock (see removed)
        # Prefix weighting (eviction_policy extent_prefix; prefix_evict.ReachableExtents): picks
        # among the few extents filled longest ago (its owner passes on_deleted / on_put_again).
        self.chooser = chooser
        self.reinsert_lock = threading.Lock()  # the reinserting put; the plugin's removes take it
        # For benchmarks: False runs the pass a victim at a time from Python (_pass_by_victims),
        # as under a chooser, to set the one native call beside it.
        self.native_pass = True
        self._total = counts["extents_total"]
        self._cap = max(self.reserve, min(self._total - 1, math.floor(MAX_RESERVE_FRACTION * self._total)))
        self._demand = 0.0  # extents the puts opened during one evicting pass (see _note_demand)
        self._demand_at = time.monotonic()
        self._per = _largest_class_slots(core, counts)
        # extents a pass that evicts takes at least (PASS_MIN_BYTES)
        extent = counts.get("extent_bytes") or counts["extent_slots"] * int(core.slot_bytes)
        self.batch = max(1, min(self.reserve, math.ceil(PASS_MIN_BYTES / extent)))
        self._quiet = 0  # keys the puts may store before the evictor looks again (puts_stored)
        self._quiet_lock = threading.Lock()  # a leaf

    def evict(self, want: int, protect: frozenset[str] | set[str] = frozenset()) -> int:
        """Delete the keys of victim extents, filled longest ago first, until ``want`` keys
        are gone or every closed extent was looked at once. Returns the keys deleted."""
        self._note_demand(self.effective_reserve())  # the reserve ran dry: twice as many ahead
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
        ``again`` (a list), its hot keys read first go there as (spec, payload) to put back;
        they are read without ``pin_lock`` (a key pinned meanwhile is then kept, not deleted)."""
        with self._pin_lock:
            victim = self._victim(seen)
            if victim is None or victim[0] in seen:
                return None
            ext, keys, hot = victim
            seen.add(ext)
            pinned = self._pinned()
            keep = [(k, h) for k, h in zip(keys, hot) if k not in pinned and k not in protect]
        read = self._read(reinsert_choice(keep)) if again is not None and keep else []
        deleted = self._delete_victim([k for k, _ in keep], read, again)
        if deleted:
            self._log.debug("raw-block extent eviction: extent %d, %d keys deleted", ext, deleted)
        return deleted

    def _delete_victim(self, keys: list[str], read: list[tuple[Any, Any]], again: list | None,
                       extent: bool = True) -> int:
        """The victim's ``keys`` deleted but those pinned while its hot keys were read
        (``read``, kept in ``again`` unless pinned); how many (counted as an extent evicted
        when ``extent``, see ``_delete``)."""
        with self._pin_lock:
            pinned = self._pinned()
            keys = [k for k in keys if k not in pinned]
            if again is not None:
                again += [(spec, obj) for spec, obj in read if spec.encoded not in pinned]
            return self._delete(keys, extent)

    def _delete(self, keys: list[str], extent: bool = True) -> int:
        """A victim's keys deleted (under ``pin_lock``), counted (as one extent evicted when
        ``extent`` and any went) and told to ``on_deleted``: how many."""
        results = self._core.delete_many(keys, force=False) if keys else []
        gone = [k for k, ok in zip(keys, results) if ok]
        if gone and extent:
            self.extents_evicted += 1
        self._told(gone)
        return len(gone)

    def _told(self, gone: list[str]) -> None:
        """Keys a victim's delete removed: counted and told to ``on_deleted`` (under ``pin_lock``)."""
        self.keys_evicted += len(gone)
        if gone and self._on_deleted is not None:
            self._on_deleted(gone)

    def _victim(self, seen: set[int]) -> tuple[int, list[str], list[bool]] | None:
        """The core's victim extent; with a chooser, the one it picks among up to
        ``chooser.candidates`` filled longest ago (looked at without counting as used)."""
        if self.chooser is None:
            return self._core.extent_victim()
        candidates = [got for got in self._core.extent_peek(self.chooser.candidates) if got[0] not in seen]
        if not candidates:
            return self._core.extent_victim()  # every candidate looked at once: the evict loop ends
        pick = candidates[self.chooser.choose([c[1] for c in candidates])]
        return self._core.extent_take(pick[0]) or self._core.extent_victim()

    def removed(self) -> None:
        """The cache's user removed keys (the plugin calls it under ``pin_lock``): a pass
        that evicted before then does not put its hot keys back."""
        self.removes += 1

    def effective_reserve(self) -> int:
        """The clean extents kept ahead now: ``reserve``, or twice the extents the puts opened
        during one evicting pass lately when that is more, at most a quarter of the extents."""
        now = time.monotonic()
        self._demand *= 0.5 ** ((now - self._demand_at) / DEMAND_HALF_LIFE_S)
        self._demand_at = now
        return min(self._cap, max(self.reserve, math.ceil(2 * self._demand - 1e-9)))

    def _note_demand(self, opened: int) -> None:
        """An evicting pass saw the puts open ``opened`` extents while it ran."""
        self.effective_reserve()  # decays the remembered demand to now
        self._demand = max(self._demand, float(opened))

    def missing_clean(self, counts: dict[str, int] | None = None) -> int:
        """Clean extents (or extents waiting for their deallocation) short of the reserve."""
        c = self._core.extent_counts() if counts is None else counts
        if c["closed"]:
            return 0
        return max(0, self.effective_reserve() - c["extents_clean"] - c["extents_pending_dealloc"])

    def puts_stored(self, n: int) -> bool:
        """The plugin's puts stored ``n`` keys: whether the evictor should look again. Until the
        clean extents beyond the reserve are used up (all but one, as counted by the last
        pass), it need not: a pass per put would read the core's status for nothing, holding
        the GIL the puts wait for."""
        with self._quiet_lock:
            self._quiet -= n
            return self._quiet < 0

    def _set_quiet(self, c: dict[str, int]) -> None:
        """The keys the puts may store before a look is due, from counts read after a pass:
        the clean extents beyond the reserve, less one per open extent (each stream's next
        put may open one with its extent part full), plus one extent. With none beyond the
        reserve, a look at every put would find nothing to do until an extent is opened, and
        a pass for each (Python, a native call, the GIL the puts wait for) a dozen times an
        extent; looking an extent late costs one extent of the reserve, which is there for
        that. A pass that could not meet the reserve (keys pinned) is tried again an extent
        later too, not at every put."""
        spare = c["extents_clean"] + c["extents_pending_dealloc"] - self.effective_reserve()
        with self._quiet_lock:
            self._quiet = max(1, spare - max(1, c["extents_open"]) + 1) * self._per

    def evictor_pass(self) -> bool:
        """One pass of the evictor thread: evict one victim extent per clean extent missing
        from the reserve, then write the checkpoint that makes their slots reusable (their
        extents then wait for their deallocation, which that checkpoint runs), then put their
        hot keys back. True when it evicted (the next pass looks again: a format v1 core needs
        a second change before its second container stops listing the slots).

        Without a chooser the victims are taken, their keys deleted and the checkpoint written
        in one native call without the GIL (``RawBlockCore.extent_evict``): a put returning
        from the core then finds the GIL free instead of waiting for this thread's Python
        between a handful of calls per victim. Only hot keys to put back, or an owner to tell
        (``on_deleted``: told under ``pin_lock``, so the checkpoint is a second call outside
        it), bring more calls."""
        if self.chooser is not None or not self.native_pass:
            return self._pass_by_victims()
        removes = self.removes
        hooked = self._on_deleted is not None
        with self._pin_lock if hooked else contextlib.nullcontext():
            got = self._core.extent_evict(self.effective_reserve(), batch=self.batch, keep_hot=self.reinsert,
                                          keys=hooked, reclaim=not hooked)
            if hooked:
                self._told_pass(got)
        if not hooked:
            with self._pin_lock:
                self._told_pass(got)
        if got.error is not None:
            raise got.error  # its reclaim failed; what it deleted was counted and told
        again = self._delete_hot(got.hot) if got.hot else []
        after = got.counts
        if got.reclaimed < 0:  # hot keys to delete first, or an owner told: the checkpoint now
            self._core.reclaim_held_slots()
            after = self._core.extent_counts()
        evicted = got.deleted + len(again)
        if evicted:
            self._note_demand(after["extents_opened"] - (got.counts["extents_opened"] - got.opened))
        if again:
            self._put_again(again, removes)
            after = self._core.extent_counts()  # the keys put again took slots too
        self._set_quiet(after)
        return evicted > 0

    def _told_pass(self, got: Any) -> None:
        """A native pass's victims counted and its deleted keys told (under ``pin_lock``)."""
        self.extents_evicted += got.extents
        self.keys_evicted += got.deleted
        if got.gone and self._on_deleted is not None:
            self._on_deleted(got.gone)

    def _delete_hot(self, hot: list[str]) -> list[tuple[Any, Any]]:
        """The hot keys a native pass kept: read (without ``pin_lock``), then deleted but those
        pinned meanwhile (their extent was counted by the pass); (spec, payload) of each read to
        put back."""
        again: list[tuple[Any, Any]] = []
        self._delete_victim(hot, self._read(hot), again, extent=False)
        return again

    def _pass_by_victims(self) -> bool:
        """evictor_pass a victim at a time from Python: the chooser's (``extent_prefix``) weighs
        candidates between the core's calls."""
        evicted = 0
        again: list | None = [] if self.reinsert else None
        removes = self.removes
        counts = self._core.extent_counts()
        for _ in range(self.missing_clean(counts)):
            got = self._evict_one(frozenset(), set(), again)
            if not got:
                break
            evicted += got
        if evicted or self._core.slot_counts().held:
            self._core.reclaim_held_slots()
        after = self._core.extent_counts()
        if evicted:
            self._note_demand(after["extents_opened"] - counts["extents_opened"])
        if again:
            self._put_again(again, removes)
            after = self._core.extent_counts()  # the keys put again took slots too
        self._set_quiet(after)
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
        pass began (``removes`` then) none is put back. ``reinsert_lock``, which removes take,
        keeps a remove from slipping in between that check and the put; pins and loads do not
        wait for the put."""
        with self.reinsert_lock:
            with self._pin_lock:
                if self.removes != removes:
                    self._log.debug("raw-block extent eviction: %d hot keys not put back (keys were removed)",
                                    len(again))
                    return
            res = self._core.put_many([s for s, _ in again], [o for _, o in again])
            # still under reinsert_lock: a remove of a key put again waits until its owner is
            # told, or the owner would record a key the remove already took from the core
            with self._pin_lock:
                self.keys_reinserted += sum(1 for ok in res.results if ok)
                if self._on_put_again is not None and res.stored_keys:
                    self._on_put_again(list(res.stored_keys))


class _Payload:
    """A key's bytes read back for reinsertion, with the metadata its put is given again."""

    def __init__(self, meta: Any) -> None:
        self.metadata = meta
        self.byte_array = memoryview(bytearray(int(meta.size)))
