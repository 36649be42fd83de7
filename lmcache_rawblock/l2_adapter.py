"""LMCache's multiprocess (MP) raw-block L2 adapter, on our C ``RawBlockCore``.

LMCache's MP mode loads an adapter class from a module named in the ``--l2-adapter`` JSON
(its ``plugin`` adapter type), so ours is selected without changing anything in LMCache::

    {"type": "plugin", "module_path": "lmcache_rawblock.l2_adapter",
     "class_name": "RawBlockL2Adapter",
     "adapter_params": {"device_path": "/dev/nvme0n1", "slot_bytes": 1052672, ...}}

``adapter_params`` takes exactly the keys of LMCache's built-in ``raw_block`` type (LMCache's
own ``RawBlockL2AdapterConfig.from_dict`` parses them; LMCache finds the config class here by
the ``<class_name>Config`` convention), plus ours: the core's own settings
(``verify_payload_checksum``, ``allow_foreign_device``, ``recovery_read_threads``,
``meta_format``, ``deallocate_freed``, ``io_scheduler`` and its three byte budgets),
``device_paths``, ``shared``, ``fdp_phase``, and three more values of
``fdp_data_placement_policy``: ``tp_worker``, ``prompt`` and ``phase`` (``lmcache_rawblock.fdp``).

``RawBlockL2Adapter`` is a class of our own that implements LMCache's ``L2AdapterInterface``
of every supported version (0.5.6 and 0.5.7) over our core; it does not run LMCache's raw-block
adapter code. What it adds to what LMCache's adapter does, and why it is a class of its own:
docs/compatibility.md ("MP adapter (RawBlockL2Adapter)").

* Tasks: one thread pool per kind (store, lookup, load; LMCache's worker counts), one event fd
  per kind, results popped once, as LMCache's interface asks.
* Listeners and KV events: stores, loads and touches, deletes, and the entries our core drops
  by itself (a slot header that fails its check at a load or after a restart, a failed write
  back, a device that shrank) reach LMCache's listeners (its eviction policies, byte and
  per-``cache_salt`` accounting) and its event bus. The last kind is found by the adapter's
  background thread (below), when a lookup or a load misses a key the adapter holds, or the
  core's drop counters move.
* ``shared`` (``adapter_params`` or the ``--l2-adapter`` JSON's own ``shared``, which LMCache
  passes through ``set_backend_identity``): the memory tags are (storage, remote), as for
  LMCache's built-in type with ``shared``; (storage, local) otherwise.
* ``submit_touch``: an LRU touch with no I/O (listeners told the keys were accessed).
* Deletes: LMCache's L2 eviction controller calls ``delete(keys)`` with a batch of victims:
  one ``delete_many(force=False)``. A freed slot is reusable only once a checkpoint no longer
  lists it; the adapter's background thread (``lmcache_rawblock.reclaim``, one per adapter,
  started by the first signal, stopped by ``close`` before the core closes) writes that
  checkpoint, off the controller's thread and off the store workers'.
* The core is built by one method, :meth:`RawBlockL2Adapter._make_core`.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, NamedTuple

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters import raw_block_l2_adapter as _lmc
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
from lmcache.v1.platform import create_event_notifier

from . import fdp, load_cost, metrics
from .extent_evict import ExtentEviction, parse_reinsert, parse_reserve, remove_guard
from .prefix_evict import EXTENT_POLICIES, PrefixOrder, extent_eviction, forget_keeping_links
from .raw_block import RawBlockCore as _OurCore
from .raw_block import RawBlockCoreConfig as _OurConfig
from .raw_block import encode_object_key, multi
from .reclaim import Reclaimer
from .settings import SETTINGS, parse_bool, parse_value

__all__ = ["RawBlockL2Adapter", "RawBlockL2AdapterConfig", "memory_tags", "slot_bytes_for"]

# The core's settings that LMCache's RawBlockCoreConfig does not have, and the placement-policy
# settings LMCache's MP adapter does not have (write admission is the plugin's only).
_OURS = tuple(s for s in SETTINGS.values() if s.config and not s.lmcache)
_OUR_POLICY = tuple(s for s in SETTINGS.values() if s.policy and not s.lmcache_mp and s.name != "admission")
_POLICY_KEY = "fdp_data_placement_policy"
_CLOSE_RECLAIM_WAIT_S = 30.0
# The core's counters of entries it dropped by itself (report_status() keys).
_DROP_COUNTERS = ("recovery_dropped_entries", "load_dropped_entries", "payload_checksum_dropped_entries",
                  "writeback_dropped_entries", "shrink_dropped_entries", "load_rejected_entries")
logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the installed LMCache


class _Tags(NamedTuple):
    """Memory tags where the installed LMCache has none (0.5.6): the same two fields."""

    segment: str
    residency: str


def memory_tags(shared: bool) -> Any:
    """The memory tags of a raw-block L2 adapter in the installed LMCache's type: (storage,
    remote) when ``shared``, (storage, local) otherwise. LMCache 0.5.7 has
    ``lmcache.v1.distributed.api.MemoryTags`` (its prefetch controller filters adapters by
    them); 0.5.6 has no such type, and the same two fields come back as strings."""
    try:
        from lmcache.v1.distributed.api import MemoryResidency, MemorySegment, MemoryTags
    except ImportError:
        return _Tags("storage", "remote" if shared else "local")
    return MemoryTags(MemorySegment.STORAGE, MemoryResidency.REMOTE if shared else MemoryResidency.LOCAL)


def _tag_name(tag: Any) -> str:
    """``storage``, ``local``, ``remote``: an enum member's name in lower case, or the string."""
    return str(getattr(tag, "name", tag)).lower()


def slot_bytes_for(layout: Any, *, serde: Any = None, header_bytes: int = 4096, block_align: int = 4096) -> int:
    """The ``slot_bytes`` that holds one chunk of ``layout`` (LMCache's ``MemoryLayoutDesc``)
    as stored: with ``serde`` (a ``{"type": "fp8", ...}`` dict as in the ``--l2-adapter``
    JSON's ``serde``, or LMCache's ``SerdeConfig``) the size LMCache's serde processor says its
    output takes, else the chunk's own bytes; plus ``header_bytes``, rounded up to
    ``block_align``."""
    import torch

    if serde is None:
        payload = sum(torch.Size(s).numel() * torch.empty((), dtype=d).element_size()
                      for s, d in zip(layout.shapes, layout.dtypes, strict=True))
    else:
        from lmcache.v1.distributed.serde import SerdeConfig, create_serde_processor

        if isinstance(serde, dict):
            serde = SerdeConfig(type=serde["type"], kwargs={k: v for k, v in serde.items() if k != "type"})
        processor = create_serde_processor(serde)
        try:
            payload = int(processor.estimate_serialized_size(layout))
        finally:
            processor.close()
    total = int(header_bytes) + payload
    return -(-total // int(block_align)) * int(block_align)


# --------------------------------------------------------------------------- the config


class RawBlockL2AdapterConfig(_lmc.RawBlockL2AdapterConfig):
    """LMCache's raw-block adapter config plus our core's own settings (class attributes
    holding their defaults, set below from the settings table) and ``shared``."""

    @classmethod
    def from_dict(cls, d: dict) -> RawBlockL2AdapterConfig:
        d = dict(d)
        paths = multi.mp_device_paths(d)  # several devices: one core over them (MultiDeviceCore)
        ours = {s.name: parse_value(s.name, d.pop(s.name)) for s in _OURS + _OUR_POLICY if s.name in d}
        shared = parse_bool(d.pop("shared"), "shared") if "shared" in d else None
        drop = parse_bool(d.pop("drop_unreachable"), "drop_unreachable") if "drop_unreachable" in d else False
        extents = _extent_params(d)
        # LMCache's parser knows its own policies only: it sees ours as "none" (no directive
        # from its code), and the adapter routes ours itself.
        strategy = d.get(_POLICY_KEY)
        if strategy is not None and strategy != "":
            strategy = parse_value(_POLICY_KEY, strategy)
            if strategy in fdp.STRATEGIES:
                d[_POLICY_KEY] = fdp.NONE
        base = _lmc.RawBlockL2AdapterConfig.from_dict(d)
        cfg = cls.__new__(cls)
        cfg.__dict__.update(base.__dict__)
        for name, value in ours.items():
            setattr(cfg, name, value)
        if shared is not None:
            cfg.shared = shared
        cfg.drop_unreachable = drop
        cfg.eviction_policy, cfg.extent_reserve, cfg.extent_reinsert = extents
        if strategy in fdp.STRATEGIES:
            cfg.fdp_data_placement_policy = strategy
        cfg.device_paths = paths
        # Our checks of the FDP keys together (the strategies' and fdp_phase's needs, named).
        fdp.resolve_settings(
            {"fdp_enabled": cfg.fdp_enabled, "fdp_placement_ids": cfg.fdp_placement_ids,
             _POLICY_KEY: cfg.fdp_data_placement_policy, "fdp_slot_reuse_policy": cfg.fdp_slot_reuse_policy,
             "fdp_phase": cfg.fdp_phase},
            io_engine=cfg.io_engine, use_uring_cmd=cfg.use_uring_cmd,
            meta_checkpoint_placement_id=cfg.meta_checkpoint_placement_id,
            default_policy=fdp.CACHE_SALT_PREFIX)
        return cfg

    def to_core_config(self) -> _OurConfig | multi.MultiDeviceConfig:
        """The core config LMCache's adapter config describes, as ours, with our settings (with
        several ``device_paths``, that config once per device)."""
        cfg = _to_our_config(super().to_core_config(),
                             **{s.name: getattr(self, s.name, s.default) for s in _OURS})
        paths = getattr(self, "device_paths", None)
        return multi.MultiDeviceConfig.for_paths(cfg, paths) if paths and len(paths) > 1 else cfg

    @classmethod
    def help(cls) -> str:
        ours = "".join(f"- {s.name} ({s.type}, default {s.default}): {s.help}\n" for s in _OURS + _OUR_POLICY)
        strategies = (f"- {_POLICY_KEY} also takes {', '.join(fdp.STRATEGIES)}: "
                      f"{SETTINGS[_POLICY_KEY].help}\n")
        shared = ("- shared (bool, default false): the device is a storage domain other hosts share; the "
                  "adapter's memory tags are then (storage, remote)\n")
        drop = ("- drop_unreachable (bool, default false): when LMCache's eviction deletes a chunk, also "
                "delete the stored chunks that follow it in a prompt (learned from lookups): no lookup can "
                "reach them\n")
        extent = ("- eviction_policy (none, extent or extent_prefix, default none): extent (needs extent_bytes, one "
                  "device) evicts whole extents ahead of the stores, the one filled longest ago first, and tells "
                  "LMCache's listeners of the keys it deleted; set LMCache's L2 eviction to noop (or its watermark "
                  "above 1 - extent_reserve / extents) so it does not delete keys one by one first; extent_prefix: "
                  "as extent, but of the four extents filled longest ago the one whose eviction loses the fewest "
                  "chunks a lookup reaches (chains learned from lookups) goes\n"
                  "- extent_reserve (int, default 5% of the extents, at least 2): clean extents kept ahead\n"
                  "- extent_reinsert (bool, default true): hot keys of a victim extent are put back\n")
        return (_lmc.RawBlockL2AdapterConfig.help() + "\nlmcache_rawblock (the C core) adds:\n" + ours
                + strategies + shared + drop + extent)


for _s in _OURS + _OUR_POLICY:
    setattr(RawBlockL2AdapterConfig, _s.name, _s.default)
del _s
RawBlockL2AdapterConfig.drop_unreachable = False
RawBlockL2AdapterConfig.eviction_policy = "none"
RawBlockL2AdapterConfig.extent_reserve = 0
RawBlockL2AdapterConfig.extent_reinsert = True
_ADAPTER_EVICTION_POLICIES = ("none", *EXTENT_POLICIES)


def _extent_params(d: dict) -> tuple[str, int, bool]:
    """``eviction_policy``, ``extent_reserve``, ``extent_reinsert`` popped from ``d`` and
    checked: (policy, reserve (0 = the default), reinsert)."""
    raw = d.pop("eviction_policy", None)
    policy = "none" if raw is None or raw == "" else str(raw).strip().lower()
    if policy not in _ADAPTER_EVICTION_POLICIES:
        raise ValueError(f"eviction_policy must be one of {', '.join(_ADAPTER_EVICTION_POLICIES)} (LMCache's own "
                         f"L2 eviction is configured on LMCache's side), got {raw!r}")
    reserve = parse_reserve(d.pop("extent_reserve", None), "extent_reserve")
    reinsert = parse_reinsert(d.pop("extent_reinsert", None), "extent_reinsert")
    if policy not in EXTENT_POLICIES and reserve:
        raise ValueError(f"extent_reserve={reserve} needs eviction_policy 'extent' or 'extent_prefix', got {policy!r}")
    return policy, reserve, reinsert


def _to_our_config(config: Any, **ours: Any) -> _OurConfig:
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
              if f.name in _OurConfig.__dataclass_fields__}
    return _OurConfig(**fields, **ours)


def _gpu_count() -> int:
    """Visible GPUs: the TP ranks one node's ``cache_salt_rank`` buckets hold (LMCache's rule)."""
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch, or no driver: no GPU to count
        return 0


def _bitmap(flags: list[bool]) -> Bitmap:
    bitmap = Bitmap(len(flags))
    for i, ok in enumerate(flags):
        if ok:
            bitmap.set(i)
    return bitmap


# --------------------------------------------------------------------------- the adapter


class _Resident(NamedTuple):
    """An entry the adapter told LMCache's listeners was stored."""

    key: Any  # LMCache's ObjectKey
    size: int  # the bytes it was charged (the slot)
    generation: int  # which store of the key this is, so a late drop check spares a newer one


class RawBlockL2Adapter(L2AdapterInterface):
    """LMCache's MP-mode L2 adapter interface on our C core (see the module docstring)."""

    def __init__(self, config: Any, l1_memory_desc: Any = None) -> None:
        if isinstance(config, dict):
            config = RawBlockL2AdapterConfig.from_dict(config)
        if not isinstance(config, _lmc.RawBlockL2AdapterConfig):
            raise TypeError(f"config must be a RawBlockL2AdapterConfig or a dict, got {type(config).__name__}")
        super().__init__()
        if ((config.use_odirect or config.use_uring_cmd) and l1_memory_desc is not None
                and l1_memory_desc.align_bytes < config.block_align):
            raise ValueError(f"l1_memory_desc.align_bytes={l1_memory_desc.align_bytes} is below "
                             f"block_align={config.block_align}, which use_odirect / use_uring_cmd need")
        self._config = config
        self._shared = bool(getattr(config, "shared", False))
        self._lock = threading.Lock()  # a leaf: task tables, resident entries
        self._closed = False
        self._task_ids = itertools.count()
        self._generations = itertools.count(1)
        self._done: dict[str, dict[int, Any]] = {"store": {}, "lookup": {}, "load": {}}
        self._inflight = {"store": 0, "lookup": 0, "load": 0}
        self._resident: dict[str, _Resident] = {}
        # drop_unreachable and eviction_policy extent_prefix: the chains learned from lookups
        # (guarded by _lock); under extent_prefix the extent evictor's chooser updates them when
        # it deletes and puts back (prefix_evict.extent_eviction)
        self._drop = bool(getattr(config, "drop_unreachable", False))
        self._policy = getattr(config, "eviction_policy", "none")
        self._chains: PrefixOrder | None = PrefixOrder() if self._drop or self._policy == "extent_prefix" else None
        self._chains_by_evictor = self._policy == "extent_prefix"
        self._dropped_unreachable = 0
        self._drops_seen = -1
        self._check_drops = False
        self._efds: dict[str, Any] = {}
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._core: Any = None
        self._reclaimer = Reclaimer("rawblock-l2-reclaim", self._reclaim_pass, logger)
        # eviction_policy extent: whole extents evicted ahead (lmcache_rawblock.extent_evict);
        # _evict_lock orders its victim choice and delete against our deletes (before _lock);
        # what it deleted and put back, in order, for LMCache's listeners, told outside the locks.
        self._extents: ExtentEviction | None = None
        self._evict_lock = threading.Lock()
        # (deleted | stored, encoded key, entry), or (listen, listener, the entries held when it registered)
        self._untold: list[tuple[str, Any, Any]] = []
        # keys it (or a delete) deleted while a store was in flight, with the sequence of that delete: a store
        # that committed one before the delete must not record it. Each store in flight keeps the
        # sequence it started at; entries no store in flight started before are dropped, so the
        # map stays bounded under stores that never go idle (guarded by _lock)
        self._evicted_storing: dict[str, int] = {}
        self._evict_seq = 0
        self._store_marks: dict[int, int] = {}  # store task id -> _evict_seq when it was submitted
        self._tell_lock = threading.Lock()  # one teller at a time, so the order holds (before _lock)
        self._teller: int | None = None  # the thread telling (a listener calling back in is not made to wait)
        try:
            self._core = self._make_core(config)
            metrics.attach_mp(self._core, config.device_path)  # LMCache's MP observability; drops out with the core
            load_cost.register(self._core)  # for a cost-aware load policy (lmcache_rawblock.load_policy)
            self._configure_fdp(config)
            self._register_l1(config, l1_memory_desc)
            self._max_capacity_bytes = int(self._core.report_status().get("usable_capacity_bytes", 0))
            self._seed_resident()
            self._extents = self._start_extents(config)
            for kind, workers in (("store", config.num_store_workers), ("lookup", config.num_lookup_workers),
                                  ("load", config.num_load_workers)):
                self._efds[kind] = create_event_notifier()
                self._pools[kind] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"rawblk-{kind}")
        except BaseException:
            self._release()
            raise

    # ---- construction -------------------------------------------------------------------

    def _make_core(self, config: Any) -> Any:
        """The core this adapter stores through, built from its config: the one place a core
        is constructed. A RawBlockCore for one device; a MultiDeviceCore (the same API) over
        several ``device_paths`` (one adapter over N devices: docs/compatibility.md)."""
        core_config = config.to_core_config()
        if isinstance(core_config, multi.MultiDeviceConfig):
            return multi.MultiDeviceCore(core_config, key_namespace="object")
        return _OurCore(core_config, key_namespace="object")

    def _start_extents(self, config: Any) -> ExtentEviction | None:
        """``eviction_policy: extent`` or ``extent_prefix``: the evictor of whole extents over
        this adapter's one device, which tells the adapter (and through it LMCache's listeners)
        what it deleted and put back; None under ``none``. Under ``extent_prefix`` the chains
        learned from lookups weigh the victim (the plugin's builder, the same choice)."""
        if self._policy not in EXTENT_POLICIES:
            return None
        if isinstance(self._core, multi.MultiDeviceCore):
            raise ValueError(f"eviction_policy={self._policy!r} takes one device, got device_paths "
                             f"{list(self._core.device_paths)}")
        return extent_eviction(self._policy, self._core, self._evict_lock, set, int(config.extent_reserve), logger,
                               bool(config.extent_reinsert), "extent_reserve", self._chains, self._lock,
                               on_deleted=self._extent_deleted, on_put_again=self._extent_put_again)

    def _extent_deleted(self, encoded: list[str]) -> None:
        """The extent evictor deleted these keys (under ``_evict_lock``): no longer held; their
        listeners' news waits for ``_tell_recorded``."""
        with self._lock:
            self._deleted_while_storing(encoded)
            # a store that put a key again after the delete and finished before this record
            # holds it: it stays (its listeners were told it was stored)
            recorded = [enc for enc in encoded if enc in self._resident]
            again = {e for e, ok in zip(recorded, self._core.exists_many(recorded)) if ok} if recorded else set()
            gone = [enc for enc in encoded if enc not in again]
            for enc in gone:
                entry = self._resident.pop(enc, None)
                if entry is not None:
                    self._untold.append(("deleted", enc, entry))
            if self._chains is not None:
                self._chains_evicted(self._chains, gone)

    def _deleted_while_storing(self, encoded: list[str]) -> None:
        """The core deleted ``encoded`` (an extent eviction, a delete): remembered for the stores
        in flight, which may have put one of them before the delete (``_not_evicted``). Under
        ``_lock``."""
        if self._store_marks:
            self._evict_seq += 1
            for enc in encoded:  # re-inserted at the end: the map stays in sequence order
                self._evicted_storing.pop(enc, None)
                self._evicted_storing[enc] = self._evict_seq

    def _chains_evicted(self, chains: PrefixOrder, gone: list[str]) -> None:
        """The chains after the extent evictor deleted ``gone``. Under ``extent_prefix`` its
        chooser told them first: what is left is a key a store recorded in between, which
        leaves as the chooser's keys do (its link kept). Under ``_lock``."""
        if not self._chains_by_evictor:
            chains.remove_many(gone)
        else:
            forget_keeping_links(chains, [enc for enc in gone if enc in chains])

    def _extent_put_again(self, encoded: list[str]) -> None:
        """The extent evictor put these hot keys back (under ``_evict_lock``): held again."""
        with self._lock:
            new = [enc for enc in encoded if enc not in self._resident]
            self._hold(new, int(self._core.slot_bytes))
            for enc in new:
                if enc in self._resident:
                    self._untold.append(("stored", enc, self._resident[enc]))
                    if self._chains is not None and not self._chains_by_evictor:
                        self._chains.add(enc)

    def _tell_recorded(self) -> None:
        """Tell LMCache's listeners every key stored and deleted (by stores, deletes, extent
        eviction and its put-backs, drops, a device reopened), in the order the adapter recorded
        them (under ``_lock``), so a key evicted and stored again is told deleted, then stored,
        and a key deleted right after its store is told stored, then deleted: LMCache's byte
        usage and its listeners' keys, what it was told, stay what the core holds. A listener
        registers at its place in the queue (``register_listener``). Returns once every event
        recorded before the call is told, except when a listener calls back into the adapter:
        what it records is told by the telling it runs in, right after it."""
        me = threading.get_ident()
        if self._teller == me:
            return
        with self._tell_lock:
            self._teller = me
            try:
                while True:
                    with self._lock:
                        events, self._untold = self._untold, []
                    if not events:
                        return
                    for kind, run in itertools.groupby(events, key=lambda ev: ev[0]):
                        if kind == "listen":
                            for _, listener, held in run:
                                self._listen(listener, held)
                            continue
                        entries = [e for _, _, e in run]
                        self._tell(kind, [e.key for e in entries], [e.size for e in entries])
            finally:
                self._teller = None

    def _configure_fdp(self, config: Any) -> None:
        """The placement identifiers KV writes use (the device's, checked against the config),
        and the router of the configured policy; no router without ``fdp_enabled``."""
        self._fdp_enabled = bool(config.fdp_enabled)
        self._fdp_policy = config.fdp_data_placement_policy
        self._fdp_discovered: list[tuple[int, int]] = []
        self._fdp_ids: tuple[int, ...] = ()
        self._fdp_router: fdp.PlacementRouter | None = None
        if not self._fdp_enabled:
            return
        try:
            self._fdp_discovered = [(int(p), int(r)) for p, r in self._core.fetch_fdp_status()]
        except Exception as e:
            raise RuntimeError(f"fetch_fdp_status of {config.device_path} failed: {e}") from e
        configured = config.fdp_placement_ids
        device_ids = [p for p, _ in self._fdp_discovered if p != 0]
        if configured is not None and not set(configured) <= set(device_ids):
            raise RuntimeError(f"fdp_placement_ids are not all reported by {config.device_path}: "
                               f"configured={list(configured)} device={device_ids}")
        self._fdp_ids = fdp.data_placement_ids(self._fdp_discovered, configured,
                                               self._core.meta_checkpoint_placement_id,
                                               device=config.device_path, policy=self._fdp_policy)
        role = fdp.role_phase(getattr(config, "fdp_phase", fdp.AUTO))
        self._fdp_router = fdp.PlacementRouter(self._fdp_policy, self._fdp_ids, role=role,
                                               ranks=max(1, _gpu_count()))
        logger.info("RawBlockL2Adapter: FDP placement identifiers %s, policy %s", list(self._fdp_ids),
                    self._fdp_policy)

    def _register_l1(self, config: Any, desc: Any) -> None:
        """io_uring with zero copy: the stable L1 arena registered as fixed buffers (ordinary
        io_uring I/O, with a warning, when the registration fails)."""
        if config.io_engine != "io_uring" or not config.enable_zero_copy:
            return
        if desc is None or getattr(desc, "stable_registration_size", None) is None:
            logger.info("RawBlockL2Adapter: no stable L1 range to register as io_uring fixed buffers")
            return
        try:
            self._core.register_fixed_buffer_range(desc.ptr, desc.stable_registration_size)
        except Exception as e:  # noqa: BLE001 - the I/O works without them, slower
            logger.warning("RawBlockL2Adapter: registering the L1 arena as io_uring fixed buffers failed (%s); "
                           "using ordinary io_uring I/O", e)

    def _hold(self, encoded_keys: list[str], size: int) -> list[Any]:
        """Record the indexed keys not held yet as resident (those that decode to an
        ObjectKey): the ObjectKeys newly held. Called with ``_lock`` held or before the adapter
        serves."""
        from .raw_block import decode_object_key

        keys = []
        for encoded in encoded_keys:
            if encoded in self._resident:
                continue
            try:
                key = decode_object_key(encoded)
            except Exception as e:  # noqa: BLE001 - not an ObjectKey this version can build: left out, said
                logger.warning("RawBlockL2Adapter: indexed key %r is not an ObjectKey (%s); it is not reported",
                               encoded, e)
                continue
            self._resident[encoded] = _Resident(key, size, next(self._generations))
            keys.append(key)
        return keys

    def _seed_resident(self) -> None:
        """The entries the core recovered, charged a slot each in LMCache's byte accounting."""
        size = int(self._core.slot_bytes)
        indexed = self._core.snapshot_indexed_keys()
        keys = self._hold(indexed, size)
        if self._chains is not None:
            self._chains.add_recovered(indexed)
        if keys:
            with self._usage_lock:
                self._total_bytes_used += size * len(keys)
                for key in keys:
                    self._bytes_by_cache_salt[key.cache_salt] = self._bytes_by_cache_salt.get(key.cache_salt, 0) + size

    # ---- event fds ----------------------------------------------------------------------

    def _fd(self, kind: str) -> int:
        efd = self._efds.get(kind)
        return -1 if efd is None else efd.fileno()

    def get_store_event_fd(self) -> int:
        return self._fd("store")

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._fd("lookup")

    def get_load_event_fd(self) -> int:
        return self._fd("load")

    # ---- tasks --------------------------------------------------------------------------

    def _submit(self, kind: str, work: Any, finish: Any, *args: Any) -> int:
        with self._lock:
            if self._closed:
                raise RuntimeError("RawBlockL2Adapter is closed")
            task_id = next(self._task_ids)
            self._inflight[kind] += 1
            if kind == "store":
                self._store_marks[task_id] = self._evict_seq
        try:
            self._core.raise_if_failed()
            future = self._pools[kind].submit(work, *args)
        except Exception as e:  # noqa: BLE001 - a failed core or pool: the task completes as failed
            future = Future()
            future.set_exception(e)
        future.add_done_callback(partial(finish, task_id, *args))
        return task_id

    def _complete(self, kind: str, task_id: int, result: Any) -> None:
        with self._lock:
            self._inflight[kind] -= 1
            self._done[kind][task_id] = result
            efd = self._efds.get(kind)
        try:
            if efd is not None:
                efd.notify()
        except OSError:
            logger.debug("RawBlockL2Adapter: the %s event fd was closed before it was signalled", kind)

    def _pop(self, kind: str, task_id: int) -> Any:
        with self._lock:
            return self._done[kind].pop(task_id, None)

    @staticmethod
    def _check_pair(keys: list, objects: list) -> None:
        if not keys or not objects:
            raise ValueError("keys and objects must be non-empty")
        if len(keys) != len(objects):
            raise ValueError(f"keys and objects must have the same length, got {len(keys)} and {len(objects)}")

    # store

    def submit_store_task(self, keys: list, objects: list) -> int:
        self._check_pair(keys, objects)
        return self._submit("store", self._run_store, self._finish_store, list(keys), list(objects))

    def _run_store(self, keys: list, objects: list) -> tuple[bool, list[tuple[str, Any]]]:
        specs = [encode_object_key(k) for k in keys]
        placements = self._fdp_router.placements([fdp.object_key_facts(k) for k in keys]) if self._fdp_router else None
        result = self._core.put_many(specs, objects, placement_ids=placements)
        results, stored = list(result.results), set(result.stored_keys)
        if self._extents is not None:
            if not all(results) and getattr(result.failure, "errno", None) == errno.ENOSPC:
                stored |= self._store_evicting(specs, objects, placements, results)
            self._reclaimer.signal()  # the evictor keeps its clean extents ahead of the next store
        return all(results), [(s.encoded, k) for s, k in zip(specs, keys) if s.encoded in stored]

    def _store_evicting(self, specs: list, objects: list, placements: list | None, results: list[bool]) -> set[str]:
        """A store that found no slot under ``eviction_policy: extent``: evict extents for its
        failed keys (never the batch's own), make the freed slots reusable, store those keys
        again once. Updates ``results``; returns the keys the retry stored."""
        failed = [i for i, ok in enumerate(results) if not ok]
        assert self._extents is not None
        evicted = self._extents.evict(len(failed), frozenset(s.encoded for s in specs))
        self._tell_recorded()
        if not evicted and self._core.slot_counts().held == 0:
            return set()
        self._core.reclaim_held_slots()
        retry = self._core.put_many([specs[i] for i in failed], [objects[i] for i in failed],
                                    placement_ids=None if placements is None else [placements[i] for i in failed])
        for i, ok in zip(failed, retry.results):
            results[i] = ok
        return set(retry.stored_keys)

    def _finish_store(self, task_id: int, keys: list, objects: list, future: Future) -> None:
        ok, stored = False, []
        try:
            ok, stored = future.result()
        except Exception as e:  # noqa: BLE001 - the task fails, logged; LMCache sees it in the result
            logger.error("RawBlockL2Adapter: store task %d failed: %s", task_id, e)
        size = int(self._core.slot_bytes) if stored else 0
        with self._lock:
            stored = self._not_evicted(task_id, stored)
            for encoded, key in stored:
                told = encoded in self._resident  # held all along (its eviction not recorded): told once
                entry = self._resident[encoded] = _Resident(key, size, next(self._generations))
                if not told:  # after any eviction of the key recorded before it: told in that order
                    self._untold.append(("stored", encoded, entry))
            if self._chains is not None and stored:
                self._chains.add_many([e for e, _ in stored])
        if stored:  # listeners first: when the task shows complete, the accounting has it
            self._tell_recorded()
        self._complete("store", task_id, L2StoreResult(ok, size * len(stored)))

    def _not_evicted(self, task_id: int, stored: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """The keys a store put that the core still holds, of those the extent evictor deleted
        while the store ran (it may have deleted them after their put, before this record, and
        found nothing of ours to drop). Called with ``_lock`` held, so a later delete finds
        them recorded; forgets the deletes no store still in flight started before."""
        mark = self._store_marks.pop(task_id, self._evict_seq)
        evicted = self._evicted_storing
        gone = [enc for enc, _ in stored if evicted.get(enc, -1) > mark]
        floor = min(self._store_marks.values(), default=self._evict_seq)
        while evicted:
            oldest = next(iter(evicted))
            if evicted[oldest] > floor:
                break
            del evicted[oldest]
        if not gone:
            return stored
        held = dict(zip(gone, self._core.exists_many(gone)))
        return [(enc, key) for enc, key in stored if held.get(enc, True)]

    def pop_completed_store_tasks(self) -> dict:
        with self._lock:
            done, self._done["store"] = self._done["store"], {}
        return done

    # lookup and lock

    def submit_lookup_and_lock_task(self, keys: list, group_layout_descs: Any = None) -> int:
        if not keys:
            raise ValueError("keys must be non-empty")
        return self._submit("lookup", self._run_lookup, self._finish_lookup, list(keys))

    def _run_lookup(self, keys: list) -> list[bool]:
        encoded = [encode_object_key(k).encoded for k in keys]
        cost = load_cost.registered(self._core)
        if cost is not None:  # a load policy listens: how many keys a chunk of tokens has
            cost.note_chunks(len(keys), len({k.chunk_hash for k in keys}))
        found = self._core.exists_many(encoded, lock=True)
        self._note_misses(keys, found)
        if self._chains is not None:
            self._learn_chains(keys, encoded)
        return found

    def _learn_chains(self, keys: list, encoded: list[str]) -> None:
        """A lookup hands a request's keys group by group (a group per kv_rank or layer
        group), each in prompt order from its first chunk: each key follows the one before it
        in its run of keys of one model, rank, group and salt."""
        runs: list[list[str]] = []
        last = None
        for key, enc in zip(keys, encoded):
            run = (key.model_name, key.kv_rank, getattr(key, "object_group_id", 0), key.cache_salt)
            if run != last:
                runs.append([])
                last = run
            runs[-1].append(enc)
        with self._lock:
            for run_keys in runs:
                self._chains.note_call(run_keys)  # type: ignore[union-attr]

    def _finish_lookup(self, task_id: int, keys: list, future: Future) -> None:
        try:
            bitmap = _bitmap(future.result())
        except Exception as e:  # noqa: BLE001 - the task fails, logged; LMCache sees an empty bitmap
            logger.error("RawBlockL2Adapter: lookup task %d failed: %s", task_id, e)
            bitmap = Bitmap(len(keys))
        self._complete("lookup", task_id, bitmap)

    def query_lookup_and_lock_result(self, task_id: int) -> Bitmap | None:
        return self._pop("lookup", task_id)

    def submit_unlock(self, keys: list) -> None:
        self._core.unlock_many([encode_object_key(k).encoded for k in keys])

    # load

    def submit_load_task(self, keys: list, objects: list) -> int:
        self._check_pair(keys, objects)
        return self._submit("load", self._run_load, self._finish_load, list(keys), list(objects))

    def _run_load(self, keys: list, objects: list) -> list[bool]:
        loaded = self._core.load_many_into([encode_object_key(k).encoded for k in keys], objects)
        self._note_misses(keys, loaded)
        return loaded

    def _finish_load(self, task_id: int, keys: list, objects: list, future: Future) -> None:
        loaded: list[bool] = [False] * len(keys)
        try:
            loaded = future.result()
        except Exception as e:  # noqa: BLE001 - the task fails, logged; LMCache sees an empty bitmap
            logger.error("RawBlockL2Adapter: load task %d failed: %s", task_id, e)
        accessed = [k for k, ok in zip(keys, loaded) if ok]
        if accessed:
            self._tell("accessed", accessed)
        self._complete("load", task_id, _bitmap(loaded))

    def query_load_result(self, task_id: int) -> Bitmap | None:
        return self._pop("load", task_id)

    # touch, delete

    def submit_touch(self, keys: list) -> None:
        """Mark the keys this adapter holds accessed, for LMCache's eviction order; no I/O."""
        with self._lock:
            held = [k for k in keys if encode_object_key(k).encoded in self._resident]
        if held:
            self._tell("accessed", held)

    def delete(self, keys: list) -> None:
        """One ``delete_many(force=False)`` (keys locked by a lookup stay), listeners told of
        the keys deleted; then the checkpoint that makes the freed slots reusable, on the
        background thread."""
        try:
            encoded = [encode_object_key(k).encoded for k in keys]
            with remove_guard(self._extents), self._evict_lock:  # as the plugin's removes
                if self._extents is not None:
                    self._extents.removed()  # no hot key of an extent eviction under way comes back
                deleted = self._core.delete_many(encoded, force=False)
            with self._lock:
                removed = [e for e, ok in zip(encoded, deleted) if ok]
                self._deleted_while_storing(removed)  # a store in flight that put one is not told it
                gone = self._record_deleted(removed)
            if gone:
                self._tell_recorded()
            if self._chains is not None:
                self._chains_deleted([e for e, ok in zip(encoded, deleted) if ok])
        finally:
            self._reclaimer.signal()

    def _chains_deleted(self, deleted: list[str]) -> None:
        """The chains after a delete: with ``drop_unreachable`` what follows the deleted keys
        goes too; otherwise (``extent_prefix`` alone) they only forget the keys."""
        if self._drop:
            self._drop_unreachable(deleted)
            return
        with self._lock:
            self._chains.remove_many(deleted)  # type: ignore[union-attr]

    def _drop_unreachable(self, deleted: list[str]) -> None:
        """``drop_unreachable``: after ``deleted`` left, delete the held chunks that follow
        them (no lookup reaches them any more; keys locked by a lookup stay, for the next
        delete), listeners told, as of any delete."""
        with self._lock:
            for enc in deleted:
                self._chains.remove(enc)  # type: ignore[union-attr]
            victims = self._chains.unreachable(lambda e: e not in self._resident)  # type: ignore[union-attr]
        if not victims:
            return
        results = self._core.delete_many(victims, force=False)
        with self._lock:
            dropped = [enc for enc, ok in zip(victims, results) if ok]
            self._deleted_while_storing(dropped)
            for enc in dropped:
                self._chains.remove(enc)  # type: ignore[union-attr]
            gone = self._record_deleted(dropped)
            self._dropped_unreachable += gone
        if gone:
            self._tell_recorded()

    def _record_deleted(self, encoded: list[str]) -> int:
        """The held ``encoded`` keys the core no longer holds: no longer held, their deletion
        queued for ``_tell_recorded`` after whatever was recorded before. Under ``_lock``; how
        many were held."""
        n = 0
        for enc in encoded:
            entry = self._resident.pop(enc, None)
            if entry is not None:
                self._untold.append(("deleted", enc, entry))
                n += 1
        return n

    # ---- devices ------------------------------------------------------------------------

    def reopen_device(self, device: int | str) -> dict:
        """Bring back one failed device of an adapter over several ``device_paths`` (see
        ``MultiDeviceCore.reopen_device``): the keys it recovered that the adapter does not
        hold are recorded as held and LMCache's listeners and event bus are told they were
        stored (a slot each), so its byte accounting counts them and its eviction can pick
        them. Returns the reopen's outcome with ``keys_reported_stored``."""
        core = self._core
        if not isinstance(core, multi.MultiDeviceCore):
            raise ValueError(f"reopen_device needs several devices (adapter_params device_paths); this adapter has "
                             f"one: {self._config.device_path!r}")
        out = dict(core.reopen_device(device))
        back = core.device_cores()[core.device_paths.index(out["device_path"])]
        encoded = back.snapshot_indexed_keys() if back is not None else []
        size = int(core.slot_bytes)
        with self._lock:
            new = [enc for enc in encoded if enc not in self._resident]
            keys = self._hold(new, size)
            self._untold += [("stored", enc, self._resident[enc]) for enc in new if enc in self._resident]
        if keys:
            self._tell_recorded()
        out["keys_reported_stored"] = len(keys)
        return out

    # ---- listeners ----------------------------------------------------------------------

    def _tell(self, what: str, keys: list, sizes: list[int] | None = None) -> None:
        """LMCache's listeners and event bus told (its base class does both); a listener's
        failure is logged, never the task's."""
        try:
            if what == "stored":
                self._notify_keys_stored(keys, sizes)
            elif what == "deleted":
                self._notify_keys_deleted(keys, sizes)
            else:
                self._notify_keys_accessed(keys)
        except Exception as e:  # noqa: BLE001 - a listener's failure is logged, never the task's
            logger.warning("RawBlockL2Adapter: telling LMCache's listeners %d keys were %s failed: %s",
                           len(keys), what, e)

    def register_listener(self, listener: Any) -> None:
        """Register a listener and tell it of the entries already held (a restart's, and those
        stored since), as LMCache's adapter does. The registration takes its place in the
        queue ``_tell_recorded`` tells from: the listener is told every entry held when it
        registers, once, then every event recorded after, and none recorded before (what
        those did is in what it is told is held), though their telling may still be under
        way. Returns once it is told, except from inside a listener's notice: then it is
        registered and told right after that notice."""
        with self._lock:
            self._untold.append(("listen", listener, list(self._resident.values())))
        self._tell_recorded()

    def _listen(self, listener: Any, held: list[_Resident]) -> None:
        """The registration of ``listener`` reached in the queue: LMCache's base class keeps
        it, and it is told the entries ``held`` when it registered."""
        super().register_listener(listener)
        if held:
            try:
                listener.on_l2_keys_stored([h.key for h in held], [h.size for h in held])
            except Exception as e:  # noqa: BLE001 - a listener's failure is logged
                logger.warning("RawBlockL2Adapter: telling a new listener of %d held keys failed: %s", len(held), e)

    def set_backend_identity(self, name: str, shared: bool = False) -> None:
        """LMCache's identity of this adapter; ``shared`` from the ``--l2-adapter`` JSON is
        kept, as is ``shared`` from ``adapter_params``."""
        super().set_backend_identity(name, shared)
        self._shared = bool(shared) or bool(getattr(self._config, "shared", False))

    def get_memory_tags(self) -> Any:
        """(storage, remote) when the device is shared with other hosts, (storage, local) otherwise."""
        return memory_tags(self._shared)

    # ---- entries the core dropped by itself ----------------------------------------------

    def _note_misses(self, keys: list, found: list[bool]) -> None:
        """A lookup or load missed keys the adapter holds: the core dropped them; the background
        thread tells LMCache's listeners."""
        if all(found):
            return
        with self._lock:
            held_miss = any(not ok and encode_object_key(k).encoded in self._resident for k, ok in zip(keys, found))
            if held_miss:
                self._check_drops = True
        if held_miss:
            self._reclaimer.signal()

    def _dropped_count(self) -> int:
        """Entries the core has dropped by itself so far (its ``report_status()`` counters)."""
        st = self._core.report_status()
        return sum(int(st.get(name, 0)) for name in _DROP_COUNTERS)

    def _reclaim_pass(self) -> bool:
        """The background thread's pass: the checkpoint that makes freed slots reusable, then,
        when the core may have dropped entries, LMCache's listeners told of them. Under
        ``eviction_policy: extent``, first the clean extents kept ahead (that pass writes the
        checkpoint), listeners told of what it deleted and put back."""
        if self._extents is not None:
            self._extents.evictor_pass()
            self._tell_recorded()
        else:
            self._core.reclaim_held_slots()
        dropped = self._dropped_count()
        with self._lock:
            check = self._check_drops or dropped != self._drops_seen
            self._check_drops = False
        if check:
            self._report_dropped()
            self._drops_seen = dropped
        return False

    def _report_dropped(self) -> int:
        """Held entries the core no longer indexes, reported deleted; their count. Under
        ``_evict_lock``, as the evictor's and our deletes are: between a delete in the core and
        its record here, the keys it deleted would look dropped."""
        with self._evict_lock:
            with self._lock:
                snapshot = [(e, r.generation) for e, r in self._resident.items()]
            if not snapshot:
                return 0
            present = self._core.exists_many([e for e, _ in snapshot])
            with self._lock:
                dropped = []
                for (encoded, generation), ok in zip(snapshot, present):
                    entry = self._resident.get(encoded)
                    if not ok and entry is not None and entry.generation == generation:
                        dropped.append(encoded)
                        if self._chains is not None:
                            self._chains.remove(encoded)
                gone = self._record_deleted(dropped)
        if gone:
            logger.warning("RawBlockL2Adapter: %d entries were dropped by the core (failed checks or write "
                           "back); LMCache's listeners are told they were deleted", gone)
            self._tell_recorded()
        return gone

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until the background thread has nothing left to do (False on timeout)."""
        return self._reclaimer.wait_idle(timeout)

    # ---- status, close ------------------------------------------------------------------

    def report_status(self) -> dict:
        core = self._core.report_status()
        router = self._fdp_router
        salts = router.salts.assignments() if router is not None and router.salts is not None else {}
        tags = self.get_memory_tags()
        with self._lock:
            return {
                "is_healthy": bool(core.get("is_healthy", True)) and not self._closed,
                "type": "RawBlockL2Adapter",
                **{f"{k}_inflight_task_count": v for k, v in self._inflight.items()},
                **{f"completed_{k}_task_count": len(v) for k, v in self._done.items()},
                "held_key_count": len(self._resident),
                "drop_unreachable": self._chains is not None,
                "dropped_unreachable_count": self._dropped_unreachable,
                **self._extent_status(),
                "shared": self._shared,
                "memory_tags": [_tag_name(tags.segment), _tag_name(tags.residency)],
                "fdp_enabled": self._fdp_enabled,
                "fdp_discovered_status": list(self._fdp_discovered),
                "fdp_placement_ids": list(self._fdp_ids),
                "fdp_data_placement_policy": self._fdp_policy,
                "fdp_slot_reuse_policy": self._config.fdp_slot_reuse_policy,
                "fdp_cache_salt_bucket_placements": salts,
                "reclaim": self._reclaimer.status(),
                "core": core,
            }

    def _extent_status(self) -> dict:
        """Under ``_lock``."""
        ext = self._extents
        if ext is None:
            return {"eviction_policy": "none"}
        out = {"eviction_policy": self._policy, "extent_reserve": ext.reserve, "evicted_extents": ext.extents_evicted,
               "evicted_extent_entries": ext.keys_evicted, "reinserted_extent_entries": ext.keys_reinserted}
        if ext.chooser is not None and self._chains is not None:  # extent_prefix: victims not the oldest
            out["extent_victims_not_oldest"] = ext.chooser.chosen_other
            out.update(self._chains.counts())
        return out

    def close(self) -> None:
        """Finish the tasks in flight, stop the background thread, close the core and the fds."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for pool in self._pools.values():
            pool.shutdown(wait=True)
        if not self._reclaimer.stop(_CLOSE_RECLAIM_WAIT_S):
            logger.warning("the raw-block reclaim thread is still writing a checkpoint after %.0f s; closing anyway",
                           _CLOSE_RECLAIM_WAIT_S)
        self._release()

    def _release(self) -> None:
        """Close what exists (also after a failed construction)."""
        self._closed = True
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        self._reclaimer.stop(_CLOSE_RECLAIM_WAIT_S)
        if self._core is not None:
            load_cost.forget(self._core)
            self._core.close()
        with self._lock:
            efds, self._efds = self._efds, {}
        for efd in efds.values():
            efd.close()
