"""``RawBlockCore``: LMCache's raw-block core API over the C core ``_native.Core``.

Everything stateful (index, slots, lock refcounts, in-flight table, checkpoints, recovery,
device I/O) lives in C; this facade converts LMCache objects (RawBlockKeySpec, MemoryObj,
DiskCacheMetadata) to plain arguments and back, and logs like LMCache's core.
"""

from __future__ import annotations

import enum
import errno
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _native
from ..lmcache_paths import raw_block_core_logger
from ..settings import SETTINGS
from ._lmcache import (
    DiskCacheMetadata,
    TensorMemoryObj,
    dtype_to_short_name,
    memory_format_from_name,
    memory_format_name,
    positions_from_list,
    positions_to_list,
    shape_from_list,
    short_name_to_dtype,
    torch,
)
from .config import (
    RawBlockCoreConfig,
    RawBlockPutManyResult,
    normalize_raw_block_placement_ids,
    resolve_passthrough,
)
from .events import TrustEvents
from .key_codec import RawBlockKeySpec

# Under the logger name of LMCache's raw-block core in the installed LMCache version, so logging
# configured for LMCache's core reaches ours.
logger = logging.getLogger(raw_block_core_logger())

# The kernel's limit for one registered io_uring buffer.
_MAX_FIXED_BUFFER_REGION_BYTES = 1 << 30


class NativeQuiescence(str, enum.Enum):
    PROVEN = "proven"
    RETAINED = "retained"
    NOT_ATTEMPTED = "not_attempted"


@dataclass(frozen=True)
class RawBlockCloseOutcome:
    quiescence: NativeQuiescence
    poisoned: bool
    reason: str = ""
    quarantined_slots: int = 0
    final_checkpoint_written: bool = False

    @property
    def final_checkpoint_is_vouched_for(self) -> bool:
        return self.final_checkpoint_written and self.quiescence is NativeQuiescence.PROVEN

    @property
    def may_release_backing_resources(self) -> bool:
        return self.quiescence is NativeQuiescence.PROVEN and not self.poisoned


@dataclass(frozen=True)
class SlotCounts:
    """Where the core's slots are, from one status read (see :meth:`RawBlockCore.slot_counts`)."""

    usable: int  # slots inside the device (max_slots less what a shrink took away)
    indexed: int  # slots holding an entry
    inflight: int  # slots reserved by a write that has not committed
    free: int  # freed slots a put can take now
    fresh: int  # never-used slots a put can take now
    held: int  # freed slots waiting for a checkpoint that no longer lists them
    locked: int  # indexed entries with a lock reference (pinned, or being read)
    room_checkpoints: int  # checkpoints a put had to write to get a slot, since open
    closed: bool

    @property
    def used(self) -> int:
        """Slots counted as in use: indexed entries and writes in flight."""
        return self.indexed + self.inflight

    @property
    def reusable(self) -> int:
        """Slots a put can take without waiting for anything."""
        return self.free + self.fresh


# The extent figures of _native.Core.counts() after its nine slot figures, in its order: the
# extent_* / extents_* integer keys of status() under the same names.
_EXTENT_COUNT_KEYS = ("extent_slots", "extents_total", "extents_clean", "extents_open", "extents_pending_dealloc",
                      "extents_opened", "extent_fallbacks", "extents_evicted", "extent_deallocs",
                      "extent_dealloc_skipped", "extent_base_offset", "extent_stride", "extent_tail_bytes",
                      "extent_bytes", "extent_reclaim_unit_bytes")


@dataclass(frozen=True)
class ExtentPass:
    """What one :meth:`RawBlockCore.extent_evict` did."""

    extents: int  # victim extents it took keys from
    deleted: int  # keys deleted
    gone: list[str] | None  # the keys deleted, when asked for
    hot: list[str]  # hot keys kept, still stored: the caller's to read, delete and put again
    opened: int  # extents the puts opened meanwhile
    reclaimed: int  # checkpoints its reclaim wrote; -1 when it did not run
    counts: dict[str, int]  # extent_counts() after it
    error: BaseException | None  # what its reclaim failed with


def _extent_counts(v: tuple) -> dict[str, int]:
    """extent_counts() of a tuple of _native.Core.counts()."""
    out = dict(zip(_EXTENT_COUNT_KEYS, v[9:]))
    out["closed"] = v[8]
    return out


def _buffer_address(buf: Any) -> tuple[int, int]:
    """(address, size in bytes) of a tensor or of a writable buffer-protocol object."""
    data_ptr = getattr(buf, "data_ptr", None)
    if callable(data_ptr):
        nbytes = getattr(buf, "nbytes", None)
        if nbytes is None:
            nbytes = buf.numel() * buf.element_size()
        return int(data_ptr()), int(nbytes)
    import ctypes

    mv = memoryview(buf)
    if mv.readonly:
        raise ValueError("fixed buffers must be writable")
    if not mv.c_contiguous:
        raise ValueError("fixed buffers must be contiguous")
    size = mv.nbytes
    if size == 0:
        raise ValueError("fixed buffers must not be empty")
    return ctypes.addressof(ctypes.c_char.from_buffer(mv.cast("B"))), size


# torch.Size holds Python ints only, so the C side can read it as it is; any other sequence
# goes through int() per dimension.
_TORCH_SIZE = torch.Size if torch is not None else None


def _shape_of(meta: Any) -> Any:
    shape = getattr(meta, "shape", None)
    if shape is None or type(shape) is _TORCH_SIZE:
        return shape
    return [int(d) for d in shape]


# (dtype, fmt) -> their checkpoint names: the conversions cost more than the rest of a key's
# put preparation; a process sees a handful of distinct pairs.
_META_NAMES: dict[tuple[Any, Any], tuple[str | None, str | None]] = {}


def _meta_names(dtype: Any, fmt: Any) -> tuple[str | None, str | None, bool]:
    """(dtype name, format name, whether _META_NAMES holds the pair) for the C core, which keeps
    the names of a held pair by the identities of the two objects (a dict lookup finds an
    identical key first, so it answers as _META_NAMES would)."""
    try:
        return _META_NAMES[(dtype, fmt)] + (True,)
    except (KeyError, TypeError):  # TypeError: an unhashable stand-in, converted each time
        names = (dtype_to_short_name(dtype), memory_format_name(fmt))
        if len(_META_NAMES) < 256:
            try:
                _META_NAMES[(dtype, fmt)] = names
                return (*names, True)
            except TypeError:
                pass
        return (*names, False)


def _meta_of(obj: Any) -> tuple[Any, Any, Any, Any]:
    """(dtype name, format name, shape, cached positions) of a MemoryObj: what the C core's
    put_many reads from each payload itself when given _meta_names (kept as the reference its
    tests compare against)."""
    m = getattr(obj, "metadata", None)
    names = _meta_names(getattr(m, "dtype", None), getattr(m, "fmt", None))
    pos = getattr(m, "cached_positions", None)
    return names[0], names[1], _shape_of(m), None if pos is None else positions_to_list(pos)


def _metadata_property_body(self: Any) -> Any:  # the body LMCache's TensorMemoryObj.metadata has
    with self.lock:
        return self.meta


def _metadata_shortcut() -> tuple[Any, Any, str] | None:
    """(TensorMemoryObj, its metadata property, "meta") when that property's code is
    _metadata_property_body's: the C side then reads ``obj.meta`` itself (about 0.3 us less per
    object and call than the property, whose lock orders nothing the field reads depend on).
    None when LMCache is absent or its property reads anything else."""
    prop = getattr(TensorMemoryObj, "__dict__", {}).get("metadata")
    code = getattr(getattr(prop, "fget", None), "__code__", None)
    ref = _metadata_property_body.__code__
    if code is None or (code.co_code, code.co_names, code.co_consts) != (ref.co_code, ref.co_names, ref.co_consts):
        return None
    return TensorMemoryObj, prop, "meta"


_METADATA_SHORTCUT = _metadata_shortcut()


class RawBlockCore:
    """One raw block device (or pre-sized file) used as a slot store with an on-device index."""

    def __init__(self, config: RawBlockCoreConfig, *, key_namespace: str) -> None:
        if key_namespace not in (SETTINGS["key_namespace"].choices or ()):
            raise ValueError(f"Unsupported raw-block key namespace: {key_namespace!r}")
        self.config = config
        self.key_namespace = key_namespace
        cfg = resolve_passthrough(config, logger=logger)
        self._cfg = cfg
        self.device_path = cfg.device_path
        self.block_align = cfg.block_align
        self.header_bytes = cfg.header_bytes
        self.slot_bytes = cfg.slot_bytes
        self.meta_total_bytes = cfg.meta_total_bytes
        self.io_engine = cfg.io_engine
        # The rest of the configuration as LMCache's core exposes it (after its coercions).
        self.use_odirect = cfg.use_odirect
        self.enable_zero_copy = cfg.enable_zero_copy
        self.meta_magic = cfg.meta_magic
        self.meta_magic_text = cfg.meta_magic.decode("ascii")
        self.meta_version = cfg.meta_version
        self.meta_checkpoint_interval_sec = cfg.meta_checkpoint_interval_sec
        self.meta_idle_quiet_ms = cfg.meta_idle_quiet_ms
        self.meta_enable_periodic = cfg.meta_enable_periodic
        self.load_checkpoint_on_init = cfg.load_checkpoint_on_init
        self.meta_verify_on_load = cfg.meta_verify_on_load
        self.iouring_queue_depth = cfg.iouring_queue_depth
        self.use_uring_cmd = cfg.use_uring_cmd
        self.fdp_slot_affinity_enabled = cfg.fdp_slot_affinity_enabled
        self.meta_checkpoint_placement_id = cfg.meta_checkpoint_placement_id
        if cfg.use_uring_cmd:
            self.max_data_transfer_size = cfg.max_data_transfer_size
        self._fixed_buffers: list[Any] = []
        self._closed = False
        # The load-finish estimate (lmcache_rawblock.load_cost) measuring this core's loads,
        # set by a policy that asks for one; None: nothing is measured.
        self.load_cost: Any = None
        self._close_outcome: RawBlockCloseOutcome | None = None
        # The core checks the geometry and refuses a device that holds someone else's data
        # (unless allow_foreign_device) before it reads or writes anything.
        self._native = _native.Core(**cfg.native_kwargs(key_namespace=key_namespace))
        if _METADATA_SHORTCUT is not None:
            self._native._set_metadata_shortcut(*_METADATA_SHORTCUT)
        self._events = TrustEvents(self._native, logger, self.device_path)
        st = self._native.status()
        if st["device_lock"] == "unsupported":
            # Opened anyway: a second writer on this device would not be refused.
            logger.warning("RawBlockCore: device lock unsupported on this file system; another writer on "
                           "the same device would not be refused (device=%s)", self.device_path)
        self.capacity_bytes = st["capacity_bytes"]
        self._data_base = st["data_base_offset"]
        self.meta_total_bytes = st["data_base_offset"]  # as opened: the log format sizes a blank device's
        self._container_bytes = st["container_bytes"]
        outcome = st["recovery_outcome"]
        if outcome == "skipped":
            logger.info("RawBlockCore skipping checkpoint load (load_checkpoint_on_init=False)")
        elif outcome in ("loaded", "fallback", "damaged"):
            if outcome == "fallback":
                # The newest checkpoint was damaged: what it alone listed is gone.
                logger.warning("RawBlockCore %s (device=%s)", st["checkpoint_last_error"], self.device_path)
            elif outcome == "damaged":
                # Part of the metadata was damaged (the text names where): what it alone listed is lost.
                logger.error("RawBlockCore %s (device=%s)", st["checkpoint_last_error"], self.device_path)
            logger.info("RawBlockCore loaded checkpoint (entries=%d next_slot=%d seq=%d device=%s)",
                        st["indexed_key_count"], st["next_slot"], st["recovery_seq"], self.device_path)
            if st["recovery_dropped_entries"]:
                logger.warning("RawBlockCore dropped %d stale metadata entries after slot-header validation",
                               st["recovery_dropped_entries"])
            if st["recovery_skipped_entries"]:
                logger.warning("RawBlockCore skipped %d checkpoint entries that fail the layout checks "
                               "(offset, size, slot, checksum field)", st["recovery_skipped_entries"])
        elif outcome == "unreadable":
            # Not a blank device: it had an index, and every copy of it is lost.
            logger.error("RawBlockCore %s (device=%s)", st["checkpoint_last_error"], self.device_path)
        elif outcome == "rejected":
            logger.warning("RawBlockCore %s", st["checkpoint_last_error"])
        else:
            logger.info("RawBlockCore: no valid on-device metadata checkpoint found (device=%s)", self.device_path)

    # ---- helpers ------------------------------------------------------------------------

    def _meta_from_tuple(self, key: str, t: tuple) -> Any:
        offset, size, shape, dtype, fmt, pos = t
        dt = short_name_to_dtype(dtype) if dtype is not None else None
        if dt is None and self.key_namespace == "legacy":
            parts = key.split("@")
            if len(parts) >= 5:
                dt = short_name_to_dtype(parts[4])
        return DiskCacheMetadata(path=f"{self.device_path}@{offset}", size=size, shape=shape_from_list(shape),
                                 dtype=dt,
                                 fmt=memory_format_from_name(fmt), cached_positions=positions_from_list(pos),
                                 pin_count=0)

    # ---- index queries ------------------------------------------------------------------

    def contains_key(self, encoded_key: str, *, lock: bool = False) -> bool:
        return self.exists_many([encoded_key], lock=lock)[0]

    def exists_many(self, encoded_keys: Sequence[str], *, lock: bool = False) -> list[bool]:
        return self._native.exists_many(list(encoded_keys), bool(lock))

    def exists_inflight(self, encoded_key: str) -> bool:
        return self._native.exists_inflight(encoded_key)

    def get_metadata_many(self, encoded_keys: Sequence[str]) -> list[Any]:
        keys = list(encoded_keys)
        return [None if t is None else self._meta_from_tuple(k, t)
                for k, t in zip(keys, self._native.get_metadata_many(keys))]

    def get_metadata_prefix(self, encoded_keys: Sequence[str], *, lock: bool = False,
                            skip_locked: Iterable[str] | None = None) -> list[Any]:
        keys = list(encoded_keys)
        skip = set(skip_locked) if skip_locked else None
        found = self._native.get_metadata_prefix(keys, bool(lock), skip)
        return [self._meta_from_tuple(k, t) for k, t in zip(keys, found)]

    def unlock_many(self, encoded_keys: Sequence[str]) -> None:
        self._native.unlock_many(list(encoded_keys))

    def first_encoded_key(self) -> str | None:
        keys = self._native.snapshot_keys(1)
        return keys[0] if keys else None

    def lock_refcount(self, encoded_key: str) -> int:
        return self._native.lock_refcount(encoded_key)

    def inflight_io_count(self) -> int:
        return self._native.status()["inflight_io_count"]

    def indexed_key_count(self) -> int:
        return self._native.status()["indexed_key_count"]

    def snapshot_indexed_keys(self) -> list[str]:
        return self._native.snapshot_keys()

    def entry_offset(self, encoded_key: str) -> int | None:
        return self._native.entry_offset(encoded_key)

    def metadata_container_offsets(self) -> list[int]:
        return [0, self._container_bytes]

    def data_base_offset(self) -> int:
        return self._data_base

    def usage(self) -> tuple[float, float]:
        st = self._native.status()
        slots = st["usable_slots"]  # max_slots, less what a shrink of the device took away
        if not slots:
            return (-1.0, -1.0)
        used = min(1.0, (st["indexed_key_count"] + st["inflight_key_count"]) / slots)
        return (used, used)

    def slot_counts(self) -> SlotCounts:
        """The slot counts of one read of the core's counters (the figures ``status()`` has):
        what eviction and the put path decide on."""
        usable, indexed, inflight, free, next_slot, held, locked, room, closed = self._native.counts()[:9]
        return SlotCounts(usable=usable, indexed=indexed, inflight=inflight, free=free,
                          fresh=max(0, usable - next_slot), held=held, locked=locked, room_checkpoints=room,
                          closed=bool(closed))

    def extent_counts(self) -> dict[str, int]:
        """The extent counters of one status read (zeros when ``extent_bytes`` is off):
        ``extent_slots``, ``extents_total``, ``extents_clean``, ``extents_open``,
        ``extents_pending_dealloc``, ``extents_evicted``, ``extent_deallocs``, the strided layout's
        ``extent_base_offset``, ``extent_stride`` and ``extent_tail_bytes`` (zeros when slots lie
        back to back), ``extent_bytes`` in effect and ``extent_reclaim_unit_bytes``, and
        ``closed`` (``extent_bytes_source``, a word, is in ``report_status()``). Read from the
        core's counters without building the whole status (the evictor reads them between puts)."""
        return _extent_counts(self._native.counts())

    def extent_victim(self) -> tuple[int, list[str], list[bool]] | None:
        """With extents (``extent_bytes``): the closed extent filled longest ago (its last
        put; a load marks its key hot but does not keep the extent), its keys that no load or
        pin holds, and for each whether it was loaded since it was put (a hot key eviction may
        put again); None when no closed extent holds a key. The extent then counts as just
        filled (one whose keys cannot all go is not chosen
        again at once). RuntimeError when extents are off."""
        return self._native.extent_victim()

    def extent_peek(self, count: int) -> list[tuple[int, list[str], list[bool]]]:
        """As :meth:`extent_victim` for up to ``count`` (1 to 64) closed extents holding a key,
        in victim order (the first is the one ``extent_victim`` takes), without counting them as
        used (a caller weighing candidates, then taking one with :meth:`extent_take`); fewer
        when there are fewer. One pass over the extents under the core's mutex."""
        return self._native.extent_peek(count)

    def extent_take(self, extent: int) -> tuple[int, list[str], list[bool]] | None:
        """As :meth:`extent_victim` for ``extent`` (counted as just used and as a victim); None
        when it is no longer a closed extent holding a key."""
        return self._native.extent_take(extent)

    def reclaim_held_slots(self) -> int:
        """Make the slots freed by deletes reusable now: write checkpoints while some freed slot
        waits for one and the last one was written (a checkpoint writes only when the index
        changed), at most 3 (a freed slot is reusable once no durable checkpoint lists it: two
        for the alternating v1 containers, one record in the log format; the bound keeps a
        reclaim finite while slots keep being freed). In the log format a deleted key's FREE
        record goes ahead of the pending puts' records when it can, alone and without the
        flush of their payloads; a whole checkpoint follows only while freed slots still wait.
        Returns how many were written; a caller that finds slots still held afterwards knows
        the core needs a change to the index before the next checkpoint frees them. One reclaim
        runs at a time; a caller that waited for another sees what it left. One native call
        without the GIL. A checkpoint that fails raises (its error is in the status too)."""
        try:
            return self._native.reclaim_held_slots()
        finally:
            self._events.check()

    def extent_evict(self, reserve: int, *, batch: int = 1, keep_hot: bool = False, keys: bool = False,
                     reclaim: bool = False) -> ExtentPass:
        """The extent evictor's pass in one native call without the GIL (extents on): when
        fewer than ``reserve`` extents are clean or waiting for their deallocation, the keys of
        as many victim extents as are missing, at least ``batch`` (:meth:`extent_victim`'s,
        each extent once a call), are deleted as
        :meth:`delete_many` deletes them (a key a load or a pin holds stays). ``keep_hot``
        keeps its hot keys (loaded since their put; the first in slot order, at most half the
        keys it looked at) for the caller to read, delete and put again; ``keys`` lists the
        keys deleted; ``reclaim`` runs :meth:`reclaim_held_slots` after it when no hot key was
        kept. A failed reclaim is returned in ``error``, not raised: the keys deleted before it
        stay deleted, and their owner must hear of them. RuntimeError when extents are off."""
        try:
            ext, deleted, gone, hot, opened, reclaimed, counts, error = self._native.extent_evict(
                reserve, batch, keep_hot, keys, reclaim)
        finally:
            self._events.check()
        return ExtentPass(extents=ext, deleted=deleted, gone=gone, hot=hot, opened=opened, reclaimed=reclaimed,
                          counts=_extent_counts(counts), error=error)

    def _worker_error(self) -> str | None:
        """The io_uring engine's fatal error (None while it runs, and on posix)."""
        return self._native.engine_state()[2]

    def report_status(self) -> dict:
        st = self._native.status()
        fixed_registered, fixed_bytes, worker_error = self._native.engine_state()
        return {**self._status_layout(st, worker_error), **self._status_engine(st, fixed_registered, fixed_bytes),
                **self._status_metadata(st), **self._status_device(st)}

    def _capacity_bytes(self, st: dict) -> int:
        """The bytes of slot_bytes objects the data area holds. With size classes max_slots
        counts the smallest class's slots (ids), while an extent of the largest holds
        extent_bytes // slot_bytes: LMCache charges each key slot_bytes against this, so a
        device full of full-size objects must read as full."""
        sb = self._cfg.slot_bytes
        if st.get("size_classes", 1) > 1:
            return st["extents_total"] * (st["extent_bytes"] // sb) * sb
        return st["max_slots"] * sb

    def _status_layout(self, st: dict, worker_error: str | None) -> dict:
        """report_status's health, identity, geometry and index counts (LMCache's keys)."""
        cfg = self._cfg
        return {
            # not after a recovery that lost metadata to damage (recovery_outcome "damaged")
            "is_healthy": not st["closed"] and worker_error is None and st["recovery_outcome"] != "damaged",
            "poisoned": False,
            "quarantined_slot_count": 0,
            "worker_error": worker_error,
            "type": "RawBlockCore",
            "key_namespace": self.key_namespace,
            "device_path": self.device_path,
            "block_align": cfg.block_align,
            "header_bytes": cfg.header_bytes,
            "slot_bytes": cfg.slot_bytes,
            "meta_total_bytes": st["data_base_offset"],  # the log format may size it itself
            "meta_format": st["meta_format"],
            "usable_capacity_bytes": self._capacity_bytes(st),
            # the strided layout (0 otherwise): each extent's tail past its last whole slot is unused
            "extent_stride": st["extent_stride"],
            "extent_unused_bytes": st["extent_tail_bytes"] * st["extents_total"],
            "indexed_key_count": st["indexed_key_count"],
            "inflight_key_count": st["inflight_key_count"],
            "locked_key_count": st["locked_key_count"],
            "free_slot_count": st["free_slot_count"],
            "next_slot": st["next_slot"],
            "max_slots": st["max_slots"],
            "metadata_seq": st["metadata_seq"],
            "metadata_dirty_total": st["metadata_dirty_total"],
            "metadata_persisted": st["metadata_persisted"],
            "inflight_io_count": st["inflight_io_count"],
        }

    def _status_engine(self, st: dict, fixed_registered: bool, fixed_bytes: int) -> dict:
        """report_status's I/O engine settings, fixed buffers and FDP slot affinity (LMCache's keys)."""
        cfg = self._cfg
        return {
            "use_odirect": cfg.use_odirect,
            "enable_zero_copy": cfg.enable_zero_copy,
            "fixed_buffers_registered": fixed_registered,
            "fixed_buffer_registered_bytes": fixed_bytes,
            "io_engine": cfg.io_engine,
            "iouring_queue_depth": cfg.iouring_queue_depth,
            "use_uring_cmd": cfg.use_uring_cmd,
            "fdp_slot_affinity_enabled": cfg.fdp_slot_affinity_enabled,
            "fdp_slot_affinity_hit_count": st["fdp_slot_affinity_hit_count"],
            "fdp_slot_affinity_fallback_count": st["fdp_slot_affinity_fallback_count"],
            # ours: the io_uring scheduler in effect (budgets with their defaults filled in), or None
            "io_scheduler": self._native.io_scheduler(),
        }

    def _status_metadata(self, st: dict) -> dict:
        """report_status's own keys on checksums, checkpoints, recovery and the metadata log."""
        cfg = self._cfg
        return {
            # ours
            "verify_payload_checksum": cfg.verify_payload_checksum,
            "payload_checksum_failures": st["payload_checksum_failures"],
            "checkpoints_written": st["checkpoints_written"],
            "checkpoint_failures": st["checkpoint_failures"],
            "checkpoint_too_large_count": st["checkpoint_too_large_count"],
            "checkpoint_last_error": st["checkpoint_last_error"] or None,
            "recovery_dropped_entries": st["recovery_dropped_entries"],
            # meta_verify_on_load=False: records whose slot header is judged by their first load
            "unverified_entry_count": st["unverified_entry_count"],
            "load_verified_entries": st["load_verified_entries"],
            "load_dropped_entries": st["load_dropped_entries"],
            "payload_checksum_dropped_entries": st["payload_checksum_dropped_entries"],
            # recovery at open: blank / skipped / loaded / fallback / rejected / unreadable / damaged
            "recovery_outcome": st["recovery_outcome"],
            "recovery_seq": st["recovery_seq"],
            "recovery_rejected_seq": st["recovery_rejected_seq"],
            "recovery_lost_entries": st["recovery_lost_entries"],
            # entries the loaded checkpoint lists that its checks refused (bad offset, size, ...)
            "recovery_skipped_entries": st["recovery_skipped_entries"],
            # freed slots a checkpoint container still lists, kept out of use until it is rewritten
            "checkpoint_held_slots": st["checkpoint_held_slots"],
            "metadata_log": st.get("metadata_log"),
            "checkpoints_for_room": st["checkpoints_for_room"],
            "device_flushes": st["device_flushes"],
            # write-backs of buffered puts started ahead of a checkpoint's flush
            "device_write_behinds": st["device_write_behinds"],
        }

    def _status_device(self, st: dict) -> dict:
        """report_status's keys on what the device did: refused loads, failed flushes, faults,
        the device lock, deallocation and the native I/O counters."""
        return {
            # what the device did to us: slot headers refused at load (another writer, a device
            # that shrank and grew back), flushes that failed and the entries they dropped (not
            # proven durable), a device that shrank, and the last faults with per-errno counts
            # (none of these is cleared by a later success)
            "load_rejected_entries": st["load_rejected_entries"],
            "writeback_failures": st["writeback_failures"],
            "writeback_dropped_entries": st["writeback_dropped_entries"],
            "undurable_writes": st["undurable_writes"],
            "shrink_dropped_entries": st["shrink_dropped_entries"],
            "retired_slots": st["retired_slots"],
            "usable_slots": st["usable_slots"],
            "device_size_bytes": st["device_size_bytes"],
            "io_errors_total": st["faults_total"],
            "io_error_counts": {errno.errorcode.get(e, str(e) if e else "other"): n
                                for e, n in st["fault_counts"].items()},
            "io_errors": st["faults"],
            # the core's lock on its device: exclusive / unsupported (no flock there) / released
            "device_lock": st["device_lock"],
            # freed slots given back to the device (deallocate_freed): on / off / unsupported,
            # what it issues, and what it did
            **{k: v for k, v in st.items() if k.startswith("dealloc_")},
            # extents (extent_bytes; zeros when off): slots each, how many, clean / open / waiting
            # for their deallocation, chosen for eviction, deallocated whole; extent_bytes in
            # effect and where it came from (extent_bytes_source: auto's resolution)
            **{k: v for k, v in st.items() if k.startswith(("extent_", "extents_"))},
            "rust_io": st["io"],
        }

    # ---- mutation / I/O -----------------------------------------------------------------

    def put_many(self, keys: Sequence[RawBlockKeySpec], objs: Sequence[Any],
                 placement_ids: Sequence[int | None] | None = None) -> RawBlockPutManyResult:
        if not keys or not objs:
            raise ValueError("keys and objs must be non-empty")
        if len(keys) != len(objs):
            raise ValueError("keys and objs must have the same length")
        pids = normalize_raw_block_placement_ids(placement_ids, len(keys))
        enc = [k.encoded for k in keys]
        # The C side reads each payload itself: LMCache's TensorMemoryObj through raw_data
        # (registered in _lmcache), anything else through the buffer protocol or byte_array;
        # and each payload's metadata as _meta_of would, naming (dtype, fmt) with _meta_names.
        results, stored, failure = self._native.put_many(enc, [int(k.slot_identity) for k in keys], list(objs),
                                                         pids, _meta_names)
        if failure is not None:
            self._events.put_failed(results.count(False), len(results), failure)
        else:
            self._events.check()  # lock-free counters: what the periodic thread met shows too
        return RawBlockPutManyResult(results=results, stored_keys=[enc[i] for i in stored], failure=failure)

    def load_many_into(self, encoded_keys: Sequence[str], objs: Sequence[Any], *,
                       raise_on_error: bool = False) -> list[bool]:
        """Read each indexed key's payload into objs[i].byte_array; misses are False.

        Every read of the call finishes before this returns. A key whose read failed is False
        and logged; with ``raise_on_error`` the first such error (in key order) is raised
        instead, once the whole batch has finished (OSError(errno, ...) as the device raises it).
        """
        keys = list(encoded_keys)
        results, errors = self.load_many_results(keys, objs)
        if errors is None:
            self._events.check()
            return results
        # Failed keys are logged (or raised) here, each with its key: the journal's line for
        # the same faults would say it twice.
        self._events.check(log_faults=raise_on_error)
        first: BaseException | None = None
        for key, exc in zip(keys, errors):
            if exc is None:
                continue
            if raise_on_error:
                if first is None:
                    first = exc
            else:
                logger.error("RawBlockCore load failed for %s: %s", key, exc)
        if first is not None:
            raise first
        return results

    def load_many_results(self, encoded_keys: Sequence[str], objs: Sequence[Any]
                          ) -> tuple[list[bool], list[BaseException | None] | None]:
        """load_many_into's reads, nothing logged or raised for a failed key: each key's result
        and, when some key failed, each key's error (None for the others), else None."""
        if not encoded_keys or not objs:
            raise ValueError("encoded_keys and objs must be non-empty")
        if len(encoded_keys) != len(objs):
            raise ValueError("encoded_keys and objs must have the same length")
        # The C side also sets each loaded key's cached positions on its object's metadata
        # (None as is, a list through positions_from_list); errors is None when no key failed.
        cost = self.load_cost
        if cost is None:
            return self._native.load_many_into(list(encoded_keys), list(objs), positions_from_list)
        mark = cost.begin()
        out = self._native.load_many_into(list(encoded_keys), list(objs), positions_from_list)
        cost.end(mark, objs, out[0])
        return out

    def delete_many(self, encoded_keys: Sequence[str], *, force: bool = False) -> list[bool]:
        # a list or tuple goes to C as is (it copies the keys into a tuple itself)
        keys = encoded_keys if type(encoded_keys) in (list, tuple) else list(encoded_keys)
        return self._native.delete_many(keys, bool(force))

    def checkpoint_now(self) -> None:
        try:
            self._native.checkpoint_now(True)
        finally:
            self._events.check()

    def apply_loaded_state(self, data: Any) -> bool:
        if not isinstance(data, dict):
            return False
        payload = json.dumps(data, separators=(",", ":"), ensure_ascii=True, default=str).encode("ascii")
        applied, reason = self._native.apply_state_json(payload)
        if not applied:
            logger.warning("%s", reason)
        else:
            dropped = self._native.status()["recovery_dropped_entries"]
            if dropped:
                logger.warning("RawBlockCore dropped %d stale metadata entries after slot-header validation",
                               dropped)
        return applied

    def delete_legacy_keys(self, keys: Sequence[Any], force: bool) -> int:
        """Delete LMCache ``CacheEngineKey`` objects (legacy namespace) in one native call:
        the keys are encoded in C. Returns how many were removed."""
        return _native.delete_legacy_keys(self._native, keys, bool(force))

    def index_memory_bytes(self) -> int:
        """Bytes the C core holds for its index, in-flight table, slot allocator and (log format)
        the journal of changes not yet checkpointed."""
        return int(self._native.mem_bytes())

    @property
    def hooks(self) -> CoreHooks:
        """Internal hooks for this project's benchmarks and tests; not a stable API."""
        return CoreHooks(self._native)

    # ---- device / engine ----------------------------------------------------------------

    def raw_device(self) -> Any:
        """The device is owned by the C core, so there is no device object to hand out; on NVMe
        passthrough a read-only view answers what LMCache's callers ask of it (namespace id,
        LBA size and shift, FDP status, size). Otherwise None."""
        info = self._native.nvme_info()
        return None if info is None else _PassthroughDeviceView(self._native, info)

    def set_raw_device_for_testing(self, raw_device: Any) -> None:
        """LMCache's hook to swap in a fake device. The device here lives inside the C core
        and cannot be replaced from Python."""
        raise NotImplementedError(
            "set_raw_device_for_testing: RawBlockCore's device is owned by the C core and cannot be "
            f"replaced (got {type(raw_device).__name__})")

    def register_fixed_buffers_from_allocator(self, memory_allocator: Any) -> None:
        """Register the allocator's paged buffers as io_uring fixed buffers (io_uring only).

        Buffers are tensors (``data_ptr()`` and ``nbytes`` / ``numel() * element_size()``) or
        writable objects with the buffer protocol. Registration failures raise; the plugin
        catches them and warns.
        """
        if self.io_engine != "io_uring":
            return
        getter = getattr(memory_allocator, "get_paged_buffers", None)
        if not callable(getter):
            logger.warning("allocator does not expose paged buffers; io_uring fixed-buffer zero-copy is disabled")
            return
        buffers = list(getter() or [])
        if not buffers:
            logger.warning("allocator returned no paged buffers; io_uring fixed-buffer zero-copy is disabled")
            return
        ptrs: list[int] = []
        sizes: list[int] = []
        for buf in buffers:
            ptr, size = _buffer_address(buf)
            ptrs.append(ptr)
            sizes.append(size)
        self._native.register_buffers(ptrs, sizes)
        # The engine uses the memory directly: keep the objects alive as long as the core.
        self._fixed_buffers = buffers
        logger.info("RawBlockCore registered %d io_uring fixed buffers (%d bytes)", len(ptrs), sum(sizes))

    def register_fixed_buffer_range(self, ptr: int, size: int) -> None:
        """Register one stable memory range ``[ptr, ptr + size)`` as io_uring fixed buffers, in
        regions of at most 1 GiB (the kernel's limit per registered buffer), as LMCache's core
        does. A no-op unless the engine is io_uring. The memory must stay valid as long as the
        core. Raises ValueError for a pointer or size that is not positive; registration
        errors (a second registration, the kernel refusing) propagate, and LMCache's MP
        adapter then carries on without fixed buffers."""
        if self.io_engine != "io_uring":
            return
        ptr, size = int(ptr), int(size)
        if ptr <= 0:
            raise ValueError(f"fixed-buffer range pointer must be > 0, got {ptr}")
        if size <= 0:
            raise ValueError(f"fixed-buffer range size must be > 0, got {size}")
        ptrs = list(range(ptr, ptr + size, _MAX_FIXED_BUFFER_REGION_BYTES))
        sizes = [min(_MAX_FIXED_BUFFER_REGION_BYTES, ptr + size - p) for p in ptrs]
        self._native.register_buffers(ptrs, sizes)
        logger.info("RawBlockCore registered %d regions covering %d bytes for io_uring fixed I/O", len(ptrs), size)

    def fetch_fdp_status(self) -> list[tuple[int, int]]:
        """(placement identifier, reclaim unit handle id) of each handle the namespace may write
        to, from the device (NVMe passthrough only: RuntimeError otherwise)."""
        return [(int(pid), int(ruhid)) for pid, ruhid in self._native.fetch_fdp_status()]

    def is_poisoned(self) -> bool:
        return False

    def raise_if_failed(self) -> None:
        """RuntimeError with the io_uring worker's fatal error, if it has one."""
        worker_error = self._worker_error()
        if worker_error is not None:
            raise RuntimeError(worker_error)

    def close(self) -> RawBlockCloseOutcome:
        if self._close_outcome is not None:
            return self._close_outcome
        res = self._native.close()
        if res.get("repeat") and "final_checkpoint_written" not in res:
            # another thread's close has not returned yet: nothing is known of its outcome
            return RawBlockCloseOutcome(NativeQuiescence.NOT_ATTEMPTED, False, "a close is in progress")
        # A repeat carries the completed native close's result: an earlier close() that was
        # interrupted (KeyboardInterrupt) after the core closed is reported as it ended.
        if res["checkpoint_error"]:
            logger.warning("RawBlockCore final checkpoint failed: %s", res["checkpoint_error"])
        if res["device_close_error"]:
            logger.warning("RawBlockCore device close failed: %s", res["device_close_error"])
            outcome = RawBlockCloseOutcome(NativeQuiescence.RETAINED, True,
                                           f"the native close was refused: {res['device_close_error']}",
                                           final_checkpoint_written=res["final_checkpoint_written"])
        else:
            outcome = RawBlockCloseOutcome(NativeQuiescence.PROVEN, False, "the native engine closed",
                                           final_checkpoint_written=res["final_checkpoint_written"])
        self._closed = True
        self._close_outcome = outcome
        return outcome


class _PassthroughDeviceView:
    """The questions LMCache's code asks of a passthrough RawBlockDevice, answered from the
    C core's device: no I/O methods (the core does all I/O)."""

    def __init__(self, native: Any, info: dict) -> None:
        self._native = native
        self._info = dict(info)

    def nvme_nsid(self) -> int:
        return self._info["nsid"]

    def nvme_lba_shift(self) -> int:
        return self._info["lba_shift"]

    def nvme_lba_size(self) -> int:
        return self._info["lba_size"]

    def max_data_transfer_size(self) -> int:
        return self._info["max_data_transfer_size"]

    def size_bytes(self) -> int:
        return self._info["size_bytes"]

    def fetch_fdp_status(self) -> list[tuple[int, int]]:
        return [(int(p), int(r)) for p, r in self._native.fetch_fdp_status()]


class CoreHooks:
    """Internal hooks into one C core, for benchmarks and tests that measure or provoke what the
    public API does not expose. Not a stable API: names and behaviour may change."""

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    def revalidate_headers(self, sequential: bool) -> int:
        """Run recovery's slot-header validation over every indexed entry now; returns how many
        entries it dropped. ``sequential``: one pread per header on this thread (the way
        LMCache's core reads them), else the configured reader (io_uring batches or the
        parallel posix readers)."""
        return int(self._native._revalidate(bool(sequential)))

    def apply_state_json(self, blob: bytes) -> tuple[bool, str]:
        """Apply a checkpoint payload (LMCache's JSON) to the index, as recovery does."""
        return self._native.apply_state_json(blob)

    def set_checkpoint_flush(self, enabled: bool) -> None:
        """Turn the device flushes around checkpoint writes on or off (off only to measure
        what they cost; a checkpoint written without them is not durable)."""
        self._native._set_checkpoint_no_flush(not enabled)

    def set_load_check(self, enabled: bool) -> None:
        """Turn the load-time slot-header check of verified records on or off (off only to
        measure what it costs a load; a load without it may serve another key's bytes)."""
        self._native._set_load_check_off(not enabled)

    def close_native(self) -> Any:
        """Close the C core without the facade's bookkeeping."""
        return self._native.close()
