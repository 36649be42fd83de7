"""``MultiDeviceCore``: one cache over several devices, each its own failure domain.

Each device is a :class:`RawBlockCore` with its own metadata, recovered alone when it opens. A
key lives on one device: lookups ask the devices' in-memory indexes (no second map in Python),
a put of a key some device holds goes to that device (where the core treats it as already
stored), and a new key goes to the device with the shortest queue (keys of this facade's calls
in flight on it) among those with a reusable slot, the most reusable slots breaking a tie. A
batch is split by device and the parts run at the same time, one on the caller's thread and the
others on a pool of threads (the native calls release the GIL; a RawBlockCore takes calls from
several threads at once).

A key named twice in one batch takes one device (which keeps the first copy, as one core does);
a delete acts on every device. Loads have a pool of their own, so a load's part never waits
behind another caller's store part.

Failure domains: when an operation on a device fails with a device errno (EIO, ENODEV, ENXIO,
ENOSPC, EROFS, ...) or a core error that may be the device's (not one whose ``errno`` says
capacity, contention or a bad argument: :func:`_maybe_device`), and a probe of the device (its
size, and a read of its first logical block through a descriptor of the probe's own) fails too,
or its io_uring worker has died, the device is marked failed and its core closed (on a thread of
its own: a close that hangs on a dying drive holds no caller): its keys are misses from then on
(loads report a miss, never an exception for them), the other devices keep serving and take the
new keys, a put whose part failed with the device is retried once on the others.
:meth:`MultiDeviceCore.reopen_device` opens it again (its metadata recovered alone, or a blank
replacement at the same path) without touching the others; nothing retries it on its own, and
close() waits for it (the device is closed again and the reopen raises). A key that the
returning device holds and another device holds or is being written to meanwhile stays there:
the returning device's copy is deleted (the copy that stayed online is the one callers have been
served from). Should a put still find its new key on another device afterwards, the newest write
wins: the other copy is deleted. At open, a key found on two devices (one that was failed when
the process stopped, its key stored again elsewhere) stays on the first in the device list.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import fcntl
import functools
import logging
import mmap
import os
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._native import encode_legacy_keys
from .config import RawBlockCoreConfig, RawBlockPutManyResult, normalize_raw_block_placement_ids
from .core import NativeQuiescence, RawBlockCloseOutcome, RawBlockCore, SlotCounts
from .key_codec import RawBlockKeySpec

logger = logging.getLogger("lmcache.v1.storage_backend.raw_block.core")

# What a failing or vanished drive answers (a block device past its end: ENOSPC on writes).
DEVICE_ERRNOS = frozenset({errno.EIO, errno.ENODEV, errno.ENXIO, errno.ENOSPC, errno.EROFS, errno.ENOTCONN,
                           errno.ESHUTDOWN, errno.ENOMEDIUM, errno.EREMOTEIO, errno.ENOENT, errno.EBADF})

ONLINE, FAILED, OPENING, CLOSED = "online", "failed", "opening", "closed"

# The geometry every device must share: the adapters and the plugin size objects by it.
_SHARED_GEOMETRY = ("slot_bytes", "header_bytes", "block_align", "io_engine", "use_uring_cmd")
# Attributes of RawBlockCore the facade exposes with the first device's value.
_FIRST_ATTRS = ("block_align", "header_bytes", "slot_bytes", "meta_total_bytes", "io_engine", "use_odirect",
                "enable_zero_copy", "meta_magic", "meta_magic_text", "meta_version", "meta_checkpoint_interval_sec",
                "meta_idle_quiet_ms", "meta_enable_periodic", "load_checkpoint_on_init", "meta_verify_on_load",
                "iouring_queue_depth", "use_uring_cmd", "fdp_slot_affinity_enabled",
                "meta_checkpoint_placement_id")
# report_status keys summed over the online devices; other scalar keys keep a value all
# devices agree on, else the list of the devices' values.
_SUMMED = frozenset({
    "usable_capacity_bytes", "indexed_key_count", "inflight_key_count", "locked_key_count", "free_slot_count",
    "next_slot", "max_slots", "metadata_dirty_total", "inflight_io_count", "fixed_buffer_registered_bytes",
    "fdp_slot_affinity_hit_count", "fdp_slot_affinity_fallback_count", "payload_checksum_failures",
    "checkpoints_written", "checkpoint_failures", "checkpoint_too_large_count", "recovery_dropped_entries",
    "unverified_entry_count", "load_verified_entries", "load_dropped_entries", "payload_checksum_dropped_entries",
    "recovery_lost_entries", "recovery_skipped_entries", "checkpoint_held_slots", "checkpoints_for_room",
    "device_flushes", "device_write_behinds", "load_rejected_entries", "writeback_failures",
    "writeback_dropped_entries",
    "undurable_writes", "shrink_dropped_entries", "retired_slots", "usable_slots", "device_size_bytes",
    "io_errors_total"})


@dataclasses.dataclass(frozen=True)
class MultiDeviceConfig:
    """The configurations of the devices of one :class:`MultiDeviceCore`, in order."""

    configs: tuple[RawBlockCoreConfig, ...]

    @classmethod
    def for_paths(cls, config: RawBlockCoreConfig, device_paths: Sequence[str]) -> MultiDeviceConfig:
        """``config`` once per path, each with its own ``device_path``."""
        return cls(tuple(dataclasses.replace(config, device_path=str(p)) for p in device_paths))


class _Device:
    """One device of the cache: its core while online, its state and counters. The facade's
    ``_lock`` guards the fields; calls into ``core`` are made without it."""

    __slots__ = ("index", "config", "core", "state", "reason", "failures", "reopens", "queued", "put_keys",
                 "load_keys", "lost_keys", "duplicates_dropped", "last_status", "closing")

    def __init__(self, index: int, config: RawBlockCoreConfig) -> None:
        self.index = index
        self.config = config
        self.core: RawBlockCore | None = None
        self.state = OPENING
        self.reason: str | None = None
        self.failures = 0  # times marked failed
        self.reopens = 0  # times reopen_device brought it back
        self.queued = 0  # keys of calls in flight on it
        self.put_keys = 0  # new keys placed on it
        self.load_keys = 0  # keys loaded from it
        self.lost_keys = 0  # indexed keys it held when it was marked failed
        self.duplicates_dropped = 0  # its copies of keys another device holds, deleted
        self.last_status: dict | None = None  # its report when it was marked failed
        self.closing: threading.Thread | None = None  # the close of its core after a failure

    def wait_closed(self) -> None:
        """Wait for the close of its failed core (its writer lock goes with it)."""
        t = self.closing
        if t is not None:
            t.join()

    @property
    def path(self) -> str:
        return str(self.config.device_path)


# The core's RuntimeErrors that are never the device's (its ``errno``): no free slot or a full
# metadata log (ENOSPC), a key being stored by another call (EBUSY), a payload or index too large
# (EFBIG, EOVERFLOW), a checkpoint still owed (EAGAIN), a bad argument (EINVAL), no memory.
_NOT_DEVICE_RUNTIME_ERRNOS = frozenset({errno.ENOSPC, errno.EBUSY, errno.EFBIG, errno.EOVERFLOW, errno.EAGAIN,
                                        errno.EINVAL, errno.ENOMEM})


def _maybe_device(exc: BaseException | None) -> bool:
    """Whether a failure may be the device's: an OSError with a device errno, or the core's
    RuntimeError (a short transfer, a closed device, a dead worker) unless its ``errno`` says
    capacity, contention or a bad argument: the probe decides."""
    if isinstance(exc, OSError):
        return exc.errno in DEVICE_ERRNOS
    if not isinstance(exc, RuntimeError):
        return False
    return getattr(exc, "errno", None) not in _NOT_DEVICE_RUNTIME_ERRNOS


_BLKSSZGET = 0x1268  # the logical block size of a block device (linux/fs.h)


def _logical_block_size(fd: int) -> int:
    """The logical block size of the block device open at ``fd``; 0 for a file or when the
    device does not say."""
    if not stat.S_ISBLK(os.fstat(fd).st_mode):
        return 0
    buf = bytearray(4)
    try:
        fcntl.ioctl(fd, _BLKSSZGET, buf)
    except OSError:
        return 0
    return int.from_bytes(buf, sys.byteorder)


def _read_first(fd: int, block: int) -> int:
    buf = mmap.mmap(-1, block)  # page aligned: O_DIRECT takes it
    try:
        return os.preadv(fd, [buf], 0)
    finally:
        buf.close()


def _open_probe(path: str) -> tuple[int, bool]:
    """A read-only descriptor of ``path``, O_DIRECT where it takes it: (fd, direct)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT), True
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return os.open(path, os.O_RDONLY), False


def probe_device(path: str, block: int = 4096) -> str | None:
    """Why the device at ``path`` does not answer (it cannot be opened, reports a size of 0, or
    a read of its first block fails or comes back short), or None when it answers. Uses a
    descriptor of its own, O_DIRECT where the device takes it (past the page cache), reading
    ``block`` bytes rounded up to the device's logical block size (BLKSSZGET); a file that
    refuses the direct read (EINVAL: its own alignment) is read through the page cache."""
    try:
        fd, direct = _open_probe(path)
    except OSError as e:
        return f"open failed: {e}"
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        if size == 0:
            return "the device reports a size of 0"
        lbs = _logical_block_size(fd)
        if lbs > 0:
            block = -(-max(block, 1) // lbs) * lbs
        try:
            n = _read_first(fd, block)
        except OSError as e:
            if not direct or e.errno != errno.EINVAL or lbs > 0:
                raise
            os.close(fd)
            fd = os.open(path, os.O_RDONLY)
            n = _read_first(fd, block)
        if n != block and n != size:
            return f"a read of its first {block} bytes returned {n}"
        return None
    except OSError as e:
        return f"a read of its first block failed: {e}"
    finally:
        os.close(fd)


class MultiDeviceCore:
    """One cache over several raw block devices (or pre-sized files), each a
    :class:`RawBlockCore` with its own metadata; the methods of RawBlockCore."""

    # the first device's (_FIRST_ATTRS), set when the devices open
    block_align: int
    header_bytes: int
    slot_bytes: int
    meta_total_bytes: int
    io_engine: str
    use_odirect: bool
    enable_zero_copy: bool
    meta_magic: bytes
    meta_magic_text: str
    meta_version: int
    meta_checkpoint_interval_sec: int
    meta_idle_quiet_ms: int
    meta_enable_periodic: bool
    load_checkpoint_on_init: bool
    meta_verify_on_load: bool
    iouring_queue_depth: int
    use_uring_cmd: bool
    fdp_slot_affinity_enabled: bool
    meta_checkpoint_placement_id: int | None
    capacity_bytes: int

    def __init__(self, configs: MultiDeviceConfig | Sequence[RawBlockCoreConfig], *, key_namespace: str) -> None:
        cfgs = tuple(configs.configs if isinstance(configs, MultiDeviceConfig) else configs)
        _check_configs(cfgs)
        self.key_namespace = key_namespace
        self.config = cfgs[0]
        self._devs = [_Device(i, c) for i, c in enumerate(cfgs)]
        self.device_paths = [d.path for d in self._devs]
        self.device_path = ",".join(self.device_paths)
        self._lock = threading.Lock()  # device states and counters
        self._opened = threading.Condition(self._lock)  # a reopen_device ended (close waits for it)
        self._opening = 0  # reopen_device calls under way
        self._place_lock = threading.Lock()  # placement of new keys (taken before _lock)
        self._placing: dict[str, _Device] = {}  # new keys being written, where they go
        self._fixed: list[tuple[str, tuple]] = []  # fixed-buffer registrations, replayed on reopen
        self._closed = False
        self._close_done = threading.Event()
        self._close_outcome: RawBlockCloseOutcome | None = None
        # stores (and other fan-outs) and loads have a pool each: a load's parts never queue
        # behind other callers' store parts (the engine's loads-first order, across devices)
        workers = max(1, len(cfgs) - 1)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rawblock-dev")
        self._load_pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                                thread_name_prefix="rawblock-load")
        try:
            self._open_all()
        except BaseException:
            self._pool.shutdown(wait=False)
            self._load_pool.shutdown(wait=False)
            raise

    def _open_all(self) -> None:
        """Open every device at once (each recovers alone). A device that cannot be reached is
        marked failed; a configuration error, or no device at all, raises."""
        outs = self._fanout([(d, functools.partial(RawBlockCore, d.config, key_namespace=self.key_namespace))
                             for d in self._devs])
        first_error = self._settle_opens(outs)
        opened = [d for d in self._devs if d.core is not None]
        if first_error is not None or not opened:
            for d in opened:
                d.core.close()  # type: ignore[union-attr]
            raise first_error or RuntimeError(f"no device of {self.device_paths} could be opened: "
                                              f"{[d.reason for d in self._devs]}")
        first = opened[0].core
        for name in _FIRST_ATTRS:
            setattr(self, name, getattr(first, name))
        self.capacity_bytes = sum(d.core.capacity_bytes for d in opened)  # type: ignore[union-attr]
        for i, d in enumerate(opened[1:], 1):
            self._drop_duplicates(d, opened[:i])

    def _settle_opens(self, outs: list[Any]) -> BaseException | None:
        """Each device online or failed from its open's outcome; the error to raise, if any."""
        first_error: BaseException | None = None
        for d, out in zip(self._devs, outs):
            if isinstance(out, RawBlockCore):
                d.core, d.state = out, ONLINE
                continue
            # a core error that names no device fault (a capacity too small, say) is the
            # device's when the device does not answer the probe (a drive gone: size 0)
            device = _maybe_device(out) or (isinstance(out, RuntimeError)
                                            and probe_device(d.path, int(d.config.block_align)) is not None)
            if first_error is None and (not device or len(self._devs) == 1):
                first_error = out  # a configuration error, or the only device: raised
            d.state, d.reason = FAILED, f"open failed: {out}"
            logger.error("raw-block device %s could not be opened (%s); its keys are misses until "
                         "reopen_device(%d)", d.path, out, d.index)
        return first_error

    # ---- devices ------------------------------------------------------------------------

    def _online(self) -> list[_Device]:
        with self._lock:
            return [d for d in self._devs if d.state == ONLINE]

    def _online_cores(self) -> list[tuple[_Device, RawBlockCore]]:
        """(device, core) of each online device, taken together under the lock: a core that a
        failure takes away meanwhile is still the object called (its calls then raise)."""
        with self._lock:
            return [(d, d.core) for d in self._devs if d.state == ONLINE and d.core is not None]

    def _device(self, device: int | str) -> _Device:
        for d in self._devs:
            if device == d.index or device == d.path:
                return d
        raise ValueError(f"device must be an index in 0..{len(self._devs) - 1} or one of {self.device_paths}, "
                         f"got {device!r}")

    def device_states(self) -> list[dict]:
        """Each device's path, state (online / failed / opening / closed) and why it failed."""
        with self._lock:
            return [{"index": d.index, "device_path": d.path, "state": d.state, "reason": d.reason}
                    for d in self._devs]

    def device_cores(self) -> list[RawBlockCore | None]:
        """Each device's core while it is online, else None (for tests and tools)."""
        with self._lock:
            return [d.core if d.state == ONLINE else None for d in self._devs]

    def mark_failed(self, device: int | str, reason: str, *, wait: bool = True) -> bool:
        """Take a device out of service: its core is closed and its keys are misses until
        :meth:`reopen_device`. False when it was not online. The close runs on a thread of its
        own; with ``wait`` (the default) this returns once it ended. A failure the cache finds
        by itself does not wait: a close that hangs on a dying drive holds no caller."""
        d = self._device(device)
        with self._lock:
            if d.state != ONLINE or d.core is None:
                return False
            core, d.core, d.state, d.reason = d.core, None, FAILED, reason
            d.failures += 1
        try:
            d.last_status = core.report_status()
            d.lost_keys += int(d.last_status["indexed_key_count"])
        except Exception as e:  # noqa: BLE001 - a core that cannot report: nothing to keep
            d.last_status = {"error": str(e)}
        logger.error("raw-block device %s failed (%s): its %d keys are misses until reopen_device(%d); "
                     "the other devices keep serving", d.path, reason, d.lost_keys, d.index)
        # closed on a thread of its own: a close that waits on a dying drive holds no caller;
        # reopen_device and close wait for it
        t = threading.Thread(target=_close_failed, args=(d.path, core), name=f"rawblock-close-{d.index}",
                             daemon=True)
        with self._lock:
            d.closing = t
        t.start()
        if wait:
            t.join()
        return True

    def _suspect(self, d: _Device, exc: BaseException | None) -> bool:
        """After ``exc`` from device ``d``: True when the device is failed (already, or now
        because the error is a device's and a probe of the device fails too)."""
        if d.state != ONLINE:
            return True
        if not _maybe_device(exc):
            return False
        why = probe_device(d.path, int(d.config.block_align))
        if why is None:
            return False  # the device answers: a fault of one transfer, not of the drive
        return self.mark_failed(d.index, f"{exc}; probe: {why}", wait=False) or d.state != ONLINE

    def check_devices(self) -> list[dict]:
        """Probe every online device (and its io_uring worker) now and mark the ones that do not
        answer failed; returns :meth:`device_states`."""
        for d, core in self._online_cores():
            worker = core._worker_error()
            why = f"io_uring worker failed: {worker}" if worker else probe_device(d.path, int(d.config.block_align))
            if why is not None:
                self.mark_failed(d.index, why)
        return self.device_states()

    def reopen_device(self, device: int | str) -> dict:
        """Open a failed device again (its metadata recovered alone; a blank replacement at the
        same path starts empty) without touching the others. Keys it holds that another device
        took meanwhile are deleted from it. Returns its recovery outcome and counts; raises
        (leaving it failed) when it cannot be opened."""
        d = self._device(device)
        d.wait_closed()  # the failed core's writer lock must be given back first
        with self._lock:
            if self._closed:
                raise RuntimeError("MultiDeviceCore is closed")
            if d.state != FAILED:
                raise ValueError(f"device {d.index} ({d.path}) is {d.state}, not failed")
            d.state = OPENING
            self._opening += 1
        try:
            core, dropped = self._reopen(d)
        finally:
            with self._lock:
                self._opening -= 1
                self._opened.notify_all()
        st = core.report_status()
        logger.info("raw-block device %s back online: recovery %s, %d keys (%d held elsewhere deleted)",
                    d.path, st["recovery_outcome"], st["indexed_key_count"], dropped)
        return {"device_path": d.path, "recovery_outcome": st["recovery_outcome"],
                "indexed_key_count": st["indexed_key_count"], "duplicates_dropped": dropped}

    def _reopen(self, d: _Device) -> tuple[RawBlockCore, int]:
        """Open device ``d`` (OPENING) and set it online: (its core, duplicates dropped). Left
        failed when its open fails; closed again, raising, when this facade closed meanwhile."""
        try:
            core = RawBlockCore(d.config, key_namespace=self.key_namespace)
        except BaseException as e:
            with self._lock:
                d.state, d.reason = FAILED, f"reopen failed: {e}"
            raise
        for method, args in self._fixed:
            try:
                getattr(core, method)(*args)
            except Exception as e:  # noqa: BLE001 - plain buffers still work
                logger.warning("raw-block device %s: fixed-buffer registration failed on reopen: %s", d.path, e)
        dropped, online = 0, False
        try:
            with self._place_lock:  # no new key placed while the duplicates are looked for
                with self._lock:
                    closed = self._closed
                if not closed:
                    dropped = self._drop_duplicates(d, self._online(), core)
                with self._lock:
                    if not self._closed:
                        d.core, d.state, d.reason, online = core, ONLINE, None, True
                        d.reopens += 1
        finally:
            if not online:
                with self._lock:
                    d.state = CLOSED if self._closed else FAILED
                core.close()
        if not online:
            raise RuntimeError(f"MultiDeviceCore closed while device {d.index} ({d.path}) was reopened: it is "
                               "closed again")
        return core, dropped

    def _drop_duplicates(self, d: _Device, others: Iterable[_Device], core: RawBlockCore | None = None) -> int:
        """Delete from ``d`` (its ``core``, else its current one) the keys one of ``others``
        holds or is being written to (see the module's note). _place_lock held."""
        core = core if core is not None else d.core
        keys = core.snapshot_indexed_keys() if core is not None else []
        if not keys:
            return 0
        held = [self._placing.get(k) not in (None, d) for k in keys]
        for o in others:
            other = o.core
            if o is d or other is None:
                continue
            for i, there in enumerate(other.exists_many(keys)):
                held[i] = held[i] or there
        dups = [k for k, h in zip(keys, held) if h]
        if not dups:
            return 0
        removed = sum(core.delete_many(dups, force=True))  # type: ignore[union-attr]
        with self._lock:
            d.duplicates_dropped += removed
        logger.warning("raw-block device %s held %d keys another device holds or is writing; its copies were "
                       "deleted", d.path, removed)
        return removed

    def _drop_elsewhere(self, landed: dict[_Device, list[str]]) -> None:
        """After a put: delete the keys just written to one device from every other online
        device (the newest write wins; placement keeps this from happening, this makes sure)."""
        online = self._online_cores()
        if len(online) < 2:
            return
        for d, keys in landed.items():
            for o, core in online:
                if o is d or not keys:
                    continue
                try:
                    dups = [k for k, h in zip(keys, core.exists_many(keys)) if h]
                    removed = sum(core.delete_many(dups, force=True)) if dups else 0
                except Exception as e:  # noqa: BLE001 - the put stands; a device fault is handled
                    if not self._suspect(o, e):
                        logger.warning("raw-block device %s: dropping copies of keys just stored on %s failed: %s",
                                       o.path, d.path, e)
                    continue
                if removed:
                    with self._lock:
                        o.duplicates_dropped += removed
                    logger.warning("raw-block device %s held %d keys just stored on %s; its copies were deleted",
                                   o.path, removed, d.path)

    # ---- running parts of a batch -------------------------------------------------------

    def _fanout(self, tasks: Sequence[tuple[_Device, Callable[[], Any]]],
                pool: concurrent.futures.ThreadPoolExecutor | None = None) -> list[Any]:
        """Run each task (one device's part of a batch) at the same time: the first on this
        thread, the others on ``pool`` (the store pool by default). Each result, or the
        exception the task raised."""
        futures = [_submit(pool or self._pool, fn) for _, fn in tasks[1:]]
        out: list[Any] = []
        if tasks:
            try:
                out.append(tasks[0][1]())
            except Exception as e:  # noqa: BLE001 - returned to the caller, per device
                out.append(e)
        for f in futures:
            try:
                out.append(f.result())
            except Exception as e:  # noqa: BLE001 - returned to the caller, per device
                out.append(e)
        return out

    def _queue(self, parts: dict[_Device, list[int]], delta: int) -> None:
        with self._lock:
            for d, idx in parts.items():
                d.queued += delta * len(idx)

    def _locate(self, keys: Sequence[str], devs: Sequence[_Device]) -> list[_Device | None]:
        """The device holding each key (None: none of ``devs``), from the indexes."""
        where: list[_Device | None] = [None] * len(keys)
        for d in devs:
            pending = [i for i, w in enumerate(where) if w is None]
            if not pending:
                break
            core = d.core
            if core is None:
                continue
            try:
                hits = core.exists_many([keys[i] for i in pending])
            except Exception as e:  # a core closed by a failure meanwhile is skipped, else raised
                if not self._suspect(d, e):
                    raise
                continue
            for i, hit in zip(pending, hits):
                if hit:
                    where[i] = d
        return where

    @staticmethod
    def _split(where: Sequence[_Device | None]) -> dict[_Device, list[int]]:
        parts: dict[_Device, list[int]] = {}
        for i, d in enumerate(where):
            if d is not None:
                parts.setdefault(d, []).append(i)
        return parts

    # ---- puts ---------------------------------------------------------------------------

    def _room(self, devs: Sequence[_Device]) -> dict[_Device, int]:
        room = {}
        for d in devs:
            try:
                room[d] = d.core.slot_counts().reusable if d.core is not None else 0
            except Exception:  # noqa: BLE001 - a core closed meanwhile: no room
                room[d] = 0
        return room

    def _place(self, keys: Sequence[str], exclude: frozenset[_Device] = frozenset()
               ) -> tuple[list[_Device | None], set[str]]:
        """Each key's device: where it lives or is being written, else a device picked for it
        (recorded in _placing until its put ends; a key named twice takes the first's device,
        and its device then keeps the first copy as a single device does). _place_lock held.
        Returns the devices and the keys this call recorded in _placing."""
        devs = [d for d in self._online() if d not in exclude]
        where = self._locate(keys, devs)
        new = [i for i, w in enumerate(where) if w is None]
        for i in new:
            placing = self._placing.get(keys[i])
            if placing is not None and placing not in exclude:
                where[i] = placing
        first: dict[str, int] = {}
        for i in new:
            if where[i] is None:
                first.setdefault(keys[i], i)
        if first and devs:
            for i, d in zip(first.values(), self._pick(len(first), devs)):
                where[i] = d
                self._placing[keys[i]] = d
            for i in new:
                if where[i] is None:
                    where[i] = where[first[keys[i]]]
        return where, set(first) if devs else set()

    def _pick(self, n: int, devs: Sequence[_Device]) -> list[_Device]:
        """Devices for n new keys: each to the shortest queue among the devices with a reusable
        slot (all of them when none has one), the most reusable slots breaking a tie."""
        room = self._room(devs)
        with self._lock:
            load = {d: d.queued for d in devs}
        out = []
        for _ in range(n):
            cands = [d for d in devs if room[d] > 0] or list(devs)
            d = min(cands, key=lambda d: (load[d], -room[d], d.index))
            load[d] += 1
            room[d] -= 1
            out.append(d)
        return out

    def put_many(self, keys: Sequence[RawBlockKeySpec], objs: Sequence[Any],
                 placement_ids: Sequence[int | None] | None = None) -> RawBlockPutManyResult:
        if not keys or not objs:
            raise ValueError("keys and objs must be non-empty")
        if len(keys) != len(objs):
            raise ValueError("keys and objs must have the same length")
        pids = normalize_raw_block_placement_ids(placement_ids, len(keys))
        enc = [k.encoded for k in keys]
        results = [False] * len(keys)
        stored: list[str] = []
        failure: BaseException | None = None
        todo = list(range(len(keys)))
        exclude: frozenset[_Device] = frozenset()
        landed: dict[_Device, list[str]] = {}
        for _attempt in range(2):  # a part whose device failed is retried once on the others
            first, lost = self._put_round(keys, objs, pids, enc, todo, results, landed, exclude)
            failure = failure or first  # the first round's failure is kept
            if not lost:
                break
            todo, exclude = sorted(i for idx in lost.values() for i in idx), exclude | frozenset(lost)
        for keys_on in landed.values():
            stored.extend(keys_on)
        self._drop_elsewhere(landed)
        if failure is None and not all(results):
            failure = RuntimeError(f"no online device for the keys among {self.device_paths}: "
                                   f"{self.device_states()}")
        return RawBlockPutManyResult(results=results, stored_keys=stored, failure=failure)

    def _put_round(self, keys: Sequence[RawBlockKeySpec], objs: Sequence[Any], pids: list, enc: list[str],
                   todo: list[int], results: list[bool], landed: dict[_Device, list[str]],
                   exclude: frozenset[_Device]) -> tuple[BaseException | None, dict[_Device, list[int]]]:
        """Put the keys at ``todo``: (the first failure of a device still online, the parts
        whose device failed); the keys each device stored are added to ``landed``."""
        with self._place_lock:
            where, owned = self._place([enc[i] for i in todo], exclude)
        parts = {d: [todo[j] for j in idx] for d, idx in self._split(where).items()}
        self._queue(parts, 1)
        try:
            outs = self._fanout([(d, functools.partial(_put_part, d, idx, keys, objs, pids))
                                 for d, idx in parts.items()])
        finally:
            self._queue(parts, -1)
            with self._place_lock:
                for key in owned:
                    self._placing.pop(key, None)
        return self._put_outcomes(parts, outs, results, landed)

    def _put_outcomes(self, parts: dict[_Device, list[int]], outs: list[Any], results: list[bool],
                      landed: dict[_Device, list[str]]) -> tuple[BaseException | None, dict[_Device, list[int]]]:
        failure: tuple[int, BaseException] | None = None
        lost: dict[_Device, list[int]] = {}
        for (d, idx), out in zip(parts.items(), outs):
            exc = out if isinstance(out, BaseException) else out.failure
            if exc is not None and self._suspect(d, exc):
                lost[d] = idx  # its keys are misses now: put them elsewhere
                continue
            if isinstance(out, BaseException):
                failure = min(failure or (idx[0], out), (idx[0], out), key=lambda t: t[0])
                continue
            with self._lock:
                d.put_keys += len(out.stored_keys)
            for i, ok in zip(idx, out.results):
                results[i] = ok
            landed.setdefault(d, []).extend(out.stored_keys)
            if out.failure is not None:
                first = idx[out.results.index(False)] if False in out.results else idx[0]
                failure = min(failure or (first, out.failure), (first, out.failure), key=lambda t: t[0])
        return (failure[1] if failure else None), lost

    # ---- loads --------------------------------------------------------------------------

    def load_many_into(self, encoded_keys: Sequence[str], objs: Sequence[Any], *,
                       raise_on_error: bool = False) -> list[bool]:
        """RawBlockCore.load_many_into over the devices: each device's part at the same time. A
        key whose device failed (before or during the call) is a miss, never an error; with
        ``raise_on_error`` the first other failed key's error is raised once all parts end."""
        if not encoded_keys or not objs:
            raise ValueError("encoded_keys and objs must be non-empty")
        if len(encoded_keys) != len(objs):
            raise ValueError("encoded_keys and objs must have the same length")
        keys = list(encoded_keys)
        parts = self._split(self._locate(keys, self._online()))
        self._queue(parts, 1)
        try:
            outs = self._fanout([(d, functools.partial(_load_part, d, idx, keys, objs))
                                 for d, idx in parts.items()], self._load_pool)
        finally:
            self._queue(parts, -1)
        results = [False] * len(keys)
        errors: list[BaseException | None] = [None] * len(keys)
        for (d, idx), out in zip(parts.items(), outs):
            self._load_outcome(d, idx, out, results, errors)
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            if raise_on_error:
                raise first
            for key, e in zip(keys, errors):
                if e is not None:
                    logger.error("RawBlockCore load failed for %s: %s", key, e)
        return results

    def _load_outcome(self, d: _Device, idx: list[int], out: Any, results: list[bool],
                      errors: list[BaseException | None]) -> None:
        """Settle one device's part of a load: results, or errors unless the device failed."""
        if isinstance(out, BaseException):
            if not self._suspect(d, out):
                for i in idx:
                    errors[i] = out
            return
        res, errs = out
        for i, ok in zip(idx, res):
            results[i] = ok
        with self._lock:
            d.load_keys += sum(res)
        if errs is None:
            return
        device_err = next((e for e in errs if _maybe_device(e)), None)
        if device_err is not None and self._suspect(d, device_err):
            return  # the device failed: its keys that did not load are misses
        for i, e in zip(idx, errs):
            if e is not None:
                errors[i] = e

    # ---- index queries ------------------------------------------------------------------

    def _each(self, fn: Callable[[RawBlockCore], Any]) -> list[Any]:
        """fn on each online core in device order, one after another (lookups are fast); a
        core that raises (closed by a failure meanwhile) is left out."""
        out = []
        for d, core in self._online_cores():
            try:
                out.append(fn(core))
            except Exception as e:  # a device that failed under the call is left out, else raised
                if not self._suspect(d, e):
                    raise
        return out

    def contains_key(self, encoded_key: str, *, lock: bool = False) -> bool:
        return self.exists_many([encoded_key], lock=lock)[0]

    def exists_many(self, encoded_keys: Sequence[str], *, lock: bool = False) -> list[bool]:
        keys = list(encoded_keys)
        found = [False] * len(keys)
        for d, core in self._online_cores():
            pending = [i for i, f in enumerate(found) if not f]
            if not pending:
                break
            try:
                hits = core.exists_many([keys[i] for i in pending], lock=lock)
            except Exception as e:  # a core closed by a failure meanwhile is skipped, else raised
                if not self._suspect(d, e):
                    raise
                continue
            for i, hit in zip(pending, hits):
                found[i] = hit
        return found

    def exists_inflight(self, encoded_key: str) -> bool:
        with self._place_lock:
            if encoded_key in self._placing:
                return True
        return any(self._each(lambda c: c.exists_inflight(encoded_key)))

    def get_metadata_many(self, encoded_keys: Sequence[str]) -> list[Any]:
        keys = list(encoded_keys)
        out: list[Any] = [None] * len(keys)
        for d, core in self._online_cores():
            pending = [i for i, m in enumerate(out) if m is None]
            if not pending:
                break
            try:
                metas = core.get_metadata_many([keys[i] for i in pending])
            except Exception as e:  # a core closed by a failure meanwhile is skipped, else raised
                if not self._suspect(d, e):
                    raise
                continue
            for i, m in zip(pending, metas):
                out[i] = m
        return out

    def get_metadata_prefix(self, encoded_keys: Sequence[str], *, lock: bool = False,
                            skip_locked: Iterable[str] | None = None) -> list[Any]:
        """The metadata of the longest prefix of keys some device holds (each locked on its
        device with ``lock``, but those in ``skip_locked``), as RawBlockCore's."""
        keys = list(encoded_keys)
        skip = set(skip_locked) if skip_locked else None
        where = self._locate(keys, self._online())
        cut = next((i for i, w in enumerate(where) if w is None), len(keys))
        parts = self._split(where[:cut])
        out: list[Any] = [None] * cut
        locked: list[tuple[RawBlockCore, list[int]]] = []
        for d, idx in parts.items():
            core, metas = self._prefix_part(d, [keys[i] for i in idx], lock, skip)
            for i, m in zip(idx, metas):
                out[i] = m
            if len(metas) < len(idx):
                cut = min(cut, idx[len(metas)])  # deleted meanwhile: the prefix ends there
            if lock and core is not None:
                locked.append((core, [i for i in idx[:len(metas)] if skip is None or keys[i] not in skip]))
        if lock:
            _unlock_past(locked, keys, cut)
        return out[:cut]

    def _prefix_part(self, d: _Device, keys: list[str], lock: bool, skip: set[str] | None
                     ) -> tuple[RawBlockCore | None, list[Any]]:
        """Device ``d``'s part of a prefix lookup: (its core, the metadata of its prefix); none
        when the device failed meanwhile (the prefix ends there), another error raised."""
        core = d.core
        try:
            if core is None:
                raise RuntimeError(f"device {d.path} is {d.state}")
            return core, core.get_metadata_prefix(keys, lock=lock, skip_locked=skip)
        except Exception as e:
            if not self._suspect(d, e):
                raise
            return None, []

    def unlock_many(self, encoded_keys: Sequence[str]) -> None:
        keys = list(encoded_keys)
        self._each(lambda c: c.unlock_many(keys))  # a device without a key leaves it alone

    def first_encoded_key(self) -> str | None:
        return next((k for k in self._each(lambda c: c.first_encoded_key()) if k is not None), None)

    def lock_refcount(self, encoded_key: str) -> int:
        return sum(self._each(lambda c: c.lock_refcount(encoded_key)))

    def inflight_io_count(self) -> int:
        return sum(self._each(lambda c: c.inflight_io_count()))

    def indexed_key_count(self) -> int:
        return sum(self._each(lambda c: c.indexed_key_count()))

    def snapshot_indexed_keys(self) -> list[str]:
        return [k for keys in self._each(lambda c: c.snapshot_indexed_keys()) for k in keys]

    def entry_offset(self, encoded_key: str) -> int | None:
        """The key's offset on the device that holds it."""
        return next((o for o in self._each(lambda c: c.entry_offset(encoded_key)) if o is not None), None)

    def locate_cores(self, encoded_keys: Sequence[str]) -> list[RawBlockCore | None]:
        """The core of the online device holding each key, None for a key none holds."""
        return [None if d is None else d.core for d in self._locate(list(encoded_keys), self._online())]

    def device_of(self, encoded_key: str) -> str | None:
        """The path of the device that holds the key, or None."""
        where = self._locate([encoded_key], self._online())[0]
        return None if where is None else where.path

    def metadata_container_offsets(self) -> list[int]:
        """The first online device's (each device has its own metadata region)."""
        return self._each(lambda c: c.metadata_container_offsets())[0]

    def data_base_offset(self) -> int:
        """The first online device's (each device has its own metadata region)."""
        return self._each(lambda c: c.data_base_offset())[0]

    def usage(self) -> tuple[float, float]:
        counts = self.slot_counts()
        if not counts.usable:
            return (-1.0, -1.0)
        used = min(1.0, counts.used / counts.usable)
        return (used, used)

    def slot_counts(self) -> SlotCounts:
        """The online devices' slot counts summed (a failed device's slots are not counted)."""
        each = self._each(lambda c: c.slot_counts())
        if not each:
            return SlotCounts(0, 0, 0, 0, 0, 0, 0, 0, True)
        sums = {f.name: sum(getattr(c, f.name) for c in each) for f in dataclasses.fields(SlotCounts)
                if f.name != "closed"}
        return SlotCounts(**sums, closed=self._closed or all(c.closed for c in each))

    def index_memory_bytes(self) -> int:
        return sum(self._each(lambda c: c.index_memory_bytes()))

    # ---- deletes and metadata writes ----------------------------------------------------

    def delete_many(self, encoded_keys: Sequence[str], *, force: bool = False) -> list[bool]:
        """Delete the keys on every online device (a key is on one, but a copy left on another
        must not survive a delete): True where some device removed it."""
        keys = list(encoded_keys)
        removed = [False] * len(keys)
        for d, core in self._online_cores():
            try:
                res = core.delete_many(keys, force=force)
            except Exception as e:  # a core closed by a failure meanwhile is skipped, else raised
                if not self._suspect(d, e):
                    raise
                continue
            removed = [a or bool(b) for a, b in zip(removed, res)]
        return removed

    def delete_legacy_keys(self, keys: Sequence[Any], force: bool) -> int:
        return sum(self.delete_many(encode_legacy_keys(list(keys)), force=force))

    def _on_all(self, name: str, *args: Any) -> list[Any]:
        """core.<name>(*args) on every online device at once; a device's error that is a
        failure of the device marks it failed, any other is raised (the first)."""
        pairs = self._online_cores()
        devs = [d for d, _ in pairs]
        outs = self._fanout([(d, functools.partial(getattr(core, name), *args)) for d, core in pairs])
        first = next((o for d, o in zip(devs, outs) if isinstance(o, BaseException) and not self._suspect(d, o)),
                     None)
        if first is not None:
            raise first
        return [o for o in outs if not isinstance(o, BaseException)]

    def checkpoint_now(self) -> None:
        self._on_all("checkpoint_now")

    def reclaim_held_slots(self) -> int:
        return sum(self._on_all("reclaim_held_slots"))

    def apply_loaded_state(self, data: Any) -> bool:
        """LMCache's test hook loads one device's state document: with several devices there is
        no one device to load it into, so nothing is applied."""
        logger.warning("apply_loaded_state: a MultiDeviceCore has one state per device; nothing applied")
        return False

    # ---- device / engine ----------------------------------------------------------------

    def raw_device(self) -> Any:
        """The first online device's view (NVMe passthrough), else None."""
        views = self._each(lambda c: c.raw_device())
        return views[0] if views else None

    def set_raw_device_for_testing(self, raw_device: Any) -> None:
        raise NotImplementedError(
            "set_raw_device_for_testing: MultiDeviceCore's devices are owned by their C cores and cannot be "
            f"replaced (got {type(raw_device).__name__})")

    def register_fixed_buffers_from_allocator(self, memory_allocator: Any) -> None:
        """Register the allocator's buffers on every device (each ring has its own table)."""
        self._fixed.append(("register_fixed_buffers_from_allocator", (memory_allocator,)))
        self._on_all("register_fixed_buffers_from_allocator", memory_allocator)

    def register_fixed_buffer_range(self, ptr: int, size: int) -> None:
        """Register the range on every device (each ring has its own table)."""
        self._fixed.append(("register_fixed_buffer_range", (ptr, size)))
        self._on_all("register_fixed_buffer_range", ptr, size)

    def fetch_fdp_status(self) -> list[tuple[int, int]]:
        """The (placement identifier, handle) pairs every online device reports (in the first
        device's order): placement identifiers must mean the same on every device."""
        each = self._each(lambda c: c.fetch_fdp_status())
        if not each:
            raise RuntimeError(f"no online device among {self.device_paths}")
        common = set(each[0]).intersection(*map(set, each[1:]))
        return [p for p in each[0] if p in common]

    def is_poisoned(self) -> bool:
        return False

    def _worker_error(self) -> str | None:
        """None while some device serves: a device whose io_uring worker died is marked failed."""
        for d, core in self._online_cores():
            err = core._worker_error()
            if err is not None:
                self.mark_failed(d.index, f"io_uring worker failed: {err}", wait=False)
        if self._online():
            return None
        return f"every device failed: {self.device_states()}"

    def raise_if_failed(self) -> None:
        """RuntimeError when no device serves any more."""
        err = self._worker_error()
        if err is not None:
            raise RuntimeError(err)

    # ---- status -------------------------------------------------------------------------

    def report_status(self) -> dict:
        """The single-device report's keys over the online devices (counts summed, settings all
        devices share as they are, others as the list of the devices' values), with
        ``devices``: each device's state, counters and own report."""
        with self._lock:
            devs = list(self._devs)
        per: list[dict] = []
        online: list[dict] = []
        for d in devs:
            entry = self._device_entry(d)
            per.append(entry)
            if entry.get("status") is not None and d.state == ONLINE:
                online.append(entry["status"])
        status = _aggregate(online)
        n_online = len(online)
        status.update({
            "is_healthy": n_online > 0 and all(s.get("is_healthy") for s in online),
            "degraded": n_online < len(devs),
            "type": "MultiDeviceCore",
            "device_path": self.device_path,
            "device_paths": list(self.device_paths),
            "device_count": len(devs),
            "devices_online": n_online,
            "devices_failed": sum(1 for d in devs if d.state == FAILED),
            "lost_keys": sum(d.lost_keys for d in devs),
            "devices": per,
        })
        return status

    def _device_entry(self, d: _Device) -> dict:
        with self._lock:
            entry = {"index": d.index, "device_path": d.path, "state": d.state, "reason": d.reason,
                     "failures": d.failures, "reopens": d.reopens, "queued_keys": d.queued,
                     "put_keys": d.put_keys, "load_keys": d.load_keys, "lost_keys": d.lost_keys,
                     "duplicates_dropped": d.duplicates_dropped}
            core = d.core if d.state == ONLINE else None
        status = None
        if core is not None:
            try:
                status = core.report_status()
            except Exception as e:  # noqa: BLE001 - closed by a failure meanwhile
                entry["reason"] = f"status failed: {e}"
        entry["status"] = status if status is not None else d.last_status
        if status is not None:
            entry.update(capacity_bytes=status["usable_capacity_bytes"], indexed_key_count=status["indexed_key_count"],
                         io_errors_total=status["io_errors_total"], is_healthy=status["is_healthy"])
        return entry

    # ---- shutdown -----------------------------------------------------------------------

    def close(self) -> RawBlockCloseOutcome:
        """Close every device (waiting for a reopen_device under way: the device it opens is
        closed again). A second call waits for the first and returns its outcome."""
        with self._lock:
            first = not self._closed
            self._closed = True
            if first:
                while self._opening:
                    self._opened.wait()
                pairs = [(d, d.core) for d in self._devs if d.state == ONLINE and d.core is not None]
                for d in self._devs:
                    d.state = CLOSED
        if not first:
            self._close_done.wait()
            assert self._close_outcome is not None
            return self._close_outcome
        try:
            outs = self._fanout([(d, core.close) for d, core in pairs])
            for d in self._devs:
                d.wait_closed()
            self._pool.shutdown(wait=True)
            self._load_pool.shutdown(wait=True)
            self._close_outcome = _close_outcome(outs)
        finally:
            if self._close_outcome is None:
                self._close_outcome = _close_outcome([RuntimeError("close did not finish")])
            self._close_done.set()
        return self._close_outcome


def _close_failed(path: str, core: RawBlockCore) -> None:
    try:
        core.close()
    except Exception as e:  # noqa: BLE001 - the device is failing: its close may fail too
        logger.warning("raw-block device %s: close after failure raised %s", path, e)


def _close_outcome(outs: list[Any]) -> RawBlockCloseOutcome:
    """One close outcome from the devices' closes (outcomes or exceptions)."""
    outcomes = [o for o in outs if isinstance(o, RawBlockCloseOutcome)]
    errors = [str(o) for o in outs if isinstance(o, BaseException)]
    reasons = [o.reason for o in outcomes if o.quiescence is not NativeQuiescence.PROVEN] + errors
    proven = not reasons
    return RawBlockCloseOutcome(
        NativeQuiescence.PROVEN if proven else NativeQuiescence.RETAINED,
        any(o.poisoned for o in outcomes) or bool(errors),
        "every device closed" if proven else "; ".join(reasons),
        final_checkpoint_written=bool(outcomes) and all(o.final_checkpoint_written for o in outcomes))


def _put_part(d: _Device, idx: list[int], keys: Sequence[RawBlockKeySpec], objs: Sequence[Any],
              pids: list) -> RawBlockPutManyResult:
    core = d.core
    if core is None:
        raise RuntimeError(f"device {d.path} is {d.state}")
    return core.put_many([keys[i] for i in idx], [objs[i] for i in idx], [pids[i] for i in idx])


def _load_part(d: _Device, idx: list[int], keys: list[str], objs: Sequence[Any]
               ) -> tuple[list[bool], list[BaseException | None] | None]:
    core = d.core
    if core is None:
        raise RuntimeError(f"device {d.path} is {d.state}")
    return core.load_many_results([keys[i] for i in idx], [objs[i] for i in idx])


def _unlock_past(locked: list[tuple[RawBlockCore, list[int]]], keys: list[str], cut: int) -> None:
    """Give back the locks a prefix lookup took on the keys at positions ``cut`` and after
    (not returned): ``locked`` holds each device's core and locked positions."""
    for core, positions in locked:
        extra = [keys[i] for i in positions if i >= cut]
        if extra:
            try:
                core.unlock_many(extra)
            except Exception as e:  # noqa: BLE001 - a core closed by a failure: its locks went with it
                logger.warning("raw-block: giving back %d prefix locks failed: %s", len(extra), e)


def _submit(pool: concurrent.futures.ThreadPoolExecutor, fn: Callable[[], Any]) -> concurrent.futures.Future:
    """``fn`` on ``pool``, or run here when the pool is shut down (a call racing close)."""
    try:
        return pool.submit(fn)
    except RuntimeError:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        try:
            fut.set_result(fn())
        except Exception as e:  # noqa: BLE001 - returned through the future, as the pool does
            fut.set_exception(e)
        return fut


def _check_configs(cfgs: Sequence[RawBlockCoreConfig]) -> None:
    if not cfgs:
        raise ValueError("MultiDeviceCore needs at least one device configuration, got none")
    paths = [str(c.device_path) for c in cfgs]
    dups = sorted({p for p in paths if paths.count(p) > 1})
    if dups:
        raise ValueError(f"device paths must be distinct, got {paths!r} ({', '.join(dups)} repeated)")
    for name in _SHARED_GEOMETRY:
        values = {getattr(c, name) for c in cfgs}
        if len(values) > 1:
            raise ValueError(f"every device must have the same {name}, got {[getattr(c, name) for c in cfgs]!r}")


def _aggregate(reports: list[dict]) -> dict:
    """One report from the devices' reports (see MultiDeviceCore.report_status)."""
    if not reports:
        return {"is_healthy": False, "indexed_key_count": 0, "usable_capacity_bytes": 0}
    return {key: _merge(key, [r.get(key) for r in reports]) for key in reports[0]}


def _merge(key: str, values: list[Any]) -> Any:
    if key in _SUMMED:
        return sum(int(v or 0) for v in values)
    if key == "io_error_counts":
        merged: dict[str, int] = {}
        for v in values:
            for k, n in (v or {}).items():
                merged[k] = merged.get(k, 0) + n
        return merged
    if key == "io_errors":
        return [f for v in values for f in (v or [])]
    return values[0] if all(v == values[0] for v in values) else values


def parse_device_paths(value: Any, label: str, *, distinct: bool = False) -> list[str]:
    """One or several device paths: a path, a list or tuple of paths, or the text of a list
    ("a,b" or "[a, b]", as YAML templates and the environment give it); with ``distinct`` a
    path given twice is refused. Errors name ``label`` and the value."""
    items: Any = value
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value).strip()
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        items = [t.strip().strip("'\"") for t in text.split(",")]
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(f"{label} must be a device path or a non-empty list of device paths, got {value!r}")
    paths = [os.fspath(p) if isinstance(p, os.PathLike) else str(p) for p in items]
    if any(not p for p in paths):
        raise ValueError(f"{label} must not contain an empty path, got {value!r}")
    if distinct and len(set(paths)) != len(paths):
        raise ValueError(f"{label} must not repeat a device, got {value!r}")
    return paths


def mp_device_paths(params: dict) -> list[str] | None:
    """The MP adapter's ``device_paths`` (removed from ``params``), with ``device_path`` set to
    the first when absent: None when not given. Both given must agree on the first device."""
    value = params.pop("device_paths", None)
    if value is None or value == "" or value == []:
        return None
    paths = parse_device_paths(value, "device_paths", distinct=True)
    first = params.setdefault("device_path", paths[0])
    if first != paths[0]:
        raise ValueError(f"device_path = {first!r} must be the first of device_paths = {value!r}, or left out")
    return paths


def open_core(config: RawBlockCoreConfig | MultiDeviceConfig, *, key_namespace: str
              ) -> RawBlockCore | MultiDeviceCore:
    """The core of a configuration: a RawBlockCore for one device, a MultiDeviceCore for a
    MultiDeviceConfig."""
    if isinstance(config, MultiDeviceConfig):
        return MultiDeviceCore(config, key_namespace=key_namespace)
    return RawBlockCore(config, key_namespace=key_namespace)
