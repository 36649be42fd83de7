"""``RustRawBlockBackend``: a drop-in for LMCache's raw-block storage plugin, on our C core.

LMCache loads it from ``extra_config``::

    storage_plugin.raw_block.module_path: lmcache_rawblock.plugin
    storage_plugin.raw_block.class_name: RustRawBlockBackend

and it reads the same ``rust_raw_block.*`` keys as LMCache's plugin (see docs/configuration.md
for the table). Beyond LMCache:

* ``batched_remove`` takes the pin lock once and deletes every key with one native
  ``delete_many`` call (which runs without the GIL), instead of one lock and one call per key;
* ``rust_raw_block.eviction_policy``: ``"none"`` (default; a put fails when no slot is free, as
  in LMCache today), ``"lru"`` (evict least-recently-used entries that nobody has pinned),
  ``"prefix"`` (as lru, in another order: first the chunks no lookup can reach because their
  predecessor is gone, then chain tails before heads, learned from store calls and lookups;
  ``lmcache_rawblock.prefix_evict``), ``"extent"`` (whole extents of the core's
  ``extent_bytes``, filled longest ago first (hot keys put back), clean ones kept ahead;
  ``lmcache_rawblock.extent_evict``) or ``"extent_prefix"`` (as extent, the victim chosen among
  the four extents filled longest ago by the reachable chunks its eviction loses, from the
  chains prefix keeps);
  under any of them, ``remove`` and ``batched_remove`` have the plugin's background thread (below;
  under ``none`` the first remove starts it) write the checkpoint that makes the freed slots
  reusable, so the put that next needs one does not (unless the core's periodic thread, which
  a delete wakes, writes it: log format);
* ``rust_raw_block.eviction_trigger_watermark`` / ``rust_raw_block.eviction_ratio`` (``lru``
  and ``prefix``; 0.95 and 0.05): evict ahead, as LMCache's MP eviction controller does with its
  ``trigger_watermark`` and ``eviction_ratio``. When the slots in use (indexed + being written)
  reach the trigger fraction of the usable slots (with ``size_classes``, the full-size slots),
  a background thread (one per plugin, started by the first put, stopped at close) deletes
  least-recently-used unpinned entries in one batch
  down to ``trigger - ratio`` and writes the checkpoint that makes their slots reusable, so puts
  find free slots without evicting or waiting for metadata I/O themselves. The put path only
  signals it. A put that still finds no slot evicts for its whole batch and retries (a bounded
  number of rounds) until it succeeds or nothing evictable is left, and then fails saying why;
* ``rust_raw_block.verify_payload_checksum``: store an xxh3-64 of each payload in slot-header
  bytes LMCache does not read, and treat a load that fails it as a miss;
* FDP placement (``rust_raw_block.fdp_*``, the MP adapter's keys under the plugin's prefix):
  each write carries the placement identifier ``lmcache_rawblock.fdp`` picks for its key;
* ``rust_raw_block.admission``: ``"always"`` (default) or ``"second_hit"`` (write a chunk only
  the second time it is stored, counted in a fixed-size sketch: ``lmcache_rawblock.admission``).

Lock order: ``_put_lock`` and ``_pin_lock`` are never held together; ``_lru_lock`` (the LRU
list, or under ``prefix`` the chains) is a leaf taken inside either (or neither);
``_stats_lock`` and the evictor's own condition lock (``lmcache_rawblock.reclaim``) are leaves
too. Under ``extent``, the extent evictor's ``reinsert_lock`` comes before ``_pin_lock``
(removes take both; its reinserting put holds it alone). The core facade's reclaim lock (it serialises
the checkpoints that make freed slots reusable) is taken with none of the plugin's locks held,
by the evictor thread or by a put that ran out of slots. The core's own mutex is below all of
them. The evictor thread takes ``_pin_lock`` (then ``_lru_lock``) to pick and delete its
victims, exactly as a put that evicts does; ``close`` stops it before closing the core.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import errno
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from itertools import compress
from typing import Any

from . import fdp, load_cost, metrics
from ._native import encode_legacy_keys
from ._plugin_base import StoragePluginInterface
from .admission import Admission
from .extent_evict import ExtentEviction, parse_reinsert, parse_reserve, remove_guard
from .prefix_evict import PrefixOrder, extent_eviction
from .raw_block import (
    MultiDeviceConfig,
    MultiDeviceCore,
    RawBlockCore,
    RawBlockCoreConfig,
    encode_legacy_key,
    round_up,
)
from .raw_block.key_codec import decode_legacy_key
from .raw_block.multi import parse_device_paths
from .reclaim import Reclaimer
from .settings import SETTINGS, finite_number, parse_bool, parse_value

logger = logging.getLogger("lmcache.v1.storage_backend.plugins.rust_raw_block_backend")

_KEY_PREFIX = "rust_raw_block."
EVICTION_POLICIES = ("none", "lru", "prefix", "extent", "extent_prefix")
# Evict-ahead defaults: keep 5-10 % of the slots free so a burst of puts finds slots at once,
# and free 5 % per pass so one batched delete and its checkpoint serve many puts.
DEFAULT_EVICTION_TRIGGER_WATERMARK = 0.95
DEFAULT_EVICTION_RATIO = 0.05
_CLOSE_PUT_WAIT_S = 10.0
_CLOSE_EVICTOR_WAIT_S = 30.0
# Rounds of evict-and-retry a put that found no slot goes through before it fails: each round
# evicts for every key of the batch still failing, so only other threads taking the freed
# slots first make a second round necessary.
_PUT_EVICT_ROUNDS = 64


# --------------------------------------------------------------------------- config access


def _extra_config(config: Any) -> Mapping:
    extra = getattr(config, "extra_config", None)
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise ValueError(f"extra_config must be a mapping, got {type(extra).__name__}")
    return extra


def _key(name: str) -> str:
    return _KEY_PREFIX + name


def _get(extra: Mapping, name: str, default: Any = None) -> Any:
    return extra.get(_key(name), default)


def _label(name: str) -> str:
    return f"extra_config['{_key(name)}']"


def _setting(extra: Mapping, name: str, default: Any = None) -> Any:
    """rust_raw_block.<name> parsed by the settings table, or ``default`` when it is absent
    (None, or an empty string as an unset environment variable gives in a template)."""
    value = _get(extra, name, None)
    if value is None or value == "":
        return default
    return parse_value(name, value, label=_label(name), logger=logger)


def _validate_per_tp_device_paths(mapping: Mapping) -> None:
    """Every rank must get its own devices: two ranks on one device would corrupt each other."""
    paths = [p for k, v in mapping.items() for p in parse_device_paths(v, f"{_label('per_tp_device_paths')}[{k!r}]")]
    if len(set(paths)) != len(paths):
        raise ValueError(
            f"Duplicate device path configured in {_key('per_tp_device_paths')}: {dict(mapping)!r}")


def _get_per_tp_device_paths(mapping: Mapping, rank: int) -> list[str]:
    """Look the rank up as a string key first (JSON), then as an int (YAML)."""
    for k in (str(rank), rank):
        if k in mapping:
            return parse_device_paths(mapping[k], f"{_label('per_tp_device_paths')}[{k!r}]")
    raise ValueError(
        f"{_key('per_tp_device_paths')} has no device for worker_id {rank}; "
        f"available keys: {sorted(str(k) for k in mapping)}")


def resolve_device_paths(extra: Mapping, metadata: Any) -> list[str]:
    """This rank's devices: ``per_tp_device_paths[rank]`` (a path or a list) when world_size > 1,
    else ``device_paths`` (a list) or ``device_path``. Several paths make one cache over them
    (``MultiDeviceCore``); a path may appear once across all ranks."""
    world_size = int(getattr(metadata, "world_size", 1) or 1) if metadata is not None else 1
    many = _get(extra, "device_paths", None)
    if many == "" or many == []:
        many = None
    if world_size > 1:
        mapping = _get(extra, "per_tp_device_paths", None) or {}
        if not isinstance(mapping, Mapping):
            raise ValueError(
                f"extra_config['{_key('per_tp_device_paths')}'] must be a mapping of rank -> device path "
                f"(or list of paths) when world_size > 1, got {mapping!r}")
        if not mapping:
            raise ValueError(
                f"extra_config['{_key('per_tp_device_paths')}'] is required when world_size > 1 "
                f"(world_size={world_size})")
        if many is not None:
            raise ValueError(f"{_label('device_paths')} = {many!r} names one rank's devices; with world_size "
                             f"{world_size} give each rank its list in {_label('per_tp_device_paths')}")
        _validate_per_tp_device_paths(mapping)
        return _get_per_tp_device_paths(mapping, int(getattr(metadata, "worker_id", 0)))
    path = _get(extra, "device_path", None)
    if many is not None:
        if path:
            raise ValueError(f"give {_label('device_path')} = {path!r} or {_label('device_paths')} = {many!r}, "
                             f"not both")
        return parse_device_paths(many, _label("device_paths"), distinct=True)
    if not path:
        raise ValueError(f"extra_config['{_key('device_path')}'] is required")
    return [str(path)]


def _full_chunk_bytes(local_cpu_backend: Any) -> int:
    for name in ("get_full_chunk_size_bytes", "get_full_chunk_size"):
        fn = getattr(local_cpu_backend, name, None)
        if callable(fn):
            return int(fn())
    raise ValueError(
        "cannot derive the default rust_raw_block.slot_bytes: local_cpu_backend has neither "
        "get_full_chunk_size_bytes() nor get_full_chunk_size(); set rust_raw_block.slot_bytes")


_PLUGIN_SETTINGS = tuple(s for s in SETTINGS.values() if s.plugin)
_FDP_SETTINGS = tuple(s for s in _PLUGIN_SETTINGS if s.policy)
# The plugin's own keys, read outside the settings table, and the legacy engine switches that
# io_engine replaced (read only when io_engine is unset).
_OWN_KEYS = frozenset({"per_tp_device_paths", "device_paths", "eviction_policy", "eviction_trigger_watermark",
                       "eviction_ratio", "extent_reserve", "extent_reinsert", load_cost.PLUGIN_RATE_SETTING,
                       load_cost.PLUGIN_PRIOR_SETTING})
_LEGACY_KEYS = frozenset({"use_iouring", "use_uring"})
# The one list of the rust_raw_block.* keys the plugin reads: the settings table's plugin rows
# (csrc/core/rb_config.c) and the keys above. docs/configuration.md's table has a row for each
# but the legacy switches (tests/core/test_settings.py checks both ways).
_PLUGIN_KEYS = frozenset(s.name for s in _PLUGIN_SETTINGS) | _OWN_KEYS | _LEGACY_KEYS
# Keys LMCache reads elsewhere (align_local_cpu_allocator: LocalCPUBackend's allocator) or that
# older LMCache releases and forks read: accepted, not used by this backend.
_NOT_USED_KEYS = frozenset({
    "align_local_cpu_allocator", "manifest_path", "manifest_write_interval", "debug_first_n", "debug_every_n",
    "use_fdp", "enable_async_batch_mode", "submit_mode", "submit_workers", "submit_pools", "gpu_buffer_bytes",
    "gpu_buffer_device", "role", "publish_after_put", "index_refresh_min_ms"})


def _check_keys(extra: Mapping) -> None:
    """An unknown rust_raw_block.* key is an error (a misspelt key would silently fall back to
    its default); keys of other LMCache components and releases are logged and ignored."""
    for full in extra:
        if not isinstance(full, str) or not full.startswith(_KEY_PREFIX):
            continue
        name = full[len(_KEY_PREFIX):]
        if name in _PLUGIN_KEYS:
            continue
        if name in _NOT_USED_KEYS:
            if name != "align_local_cpu_allocator":
                logger.info("%s is not used by this backend; ignored", _label(name))
            continue
        close = difflib.get_close_matches(name, sorted(_PLUGIN_KEYS), n=1)
        hint = f"; did you mean {_key(close[0])!r}?" if close else ""
        raise ValueError(f"unknown key {_label(name)} = {extra[full]!r}{hint}")


def build_core_config(config: Any, metadata: Any, local_cpu_backend: Any) -> RawBlockCoreConfig:
    """The core configuration described by the ``rust_raw_block.*`` keys of ``config``: every
    core setting from the settings table (default: the table's), the device path per rank,
    the slot size derived from the chunk size, and io_engine from its legacy aliases."""
    return build_configs(config, metadata, local_cpu_backend)[0]


def build_configs(config: Any, metadata: Any, local_cpu_backend: Any
                  ) -> tuple[RawBlockCoreConfig, fdp.FdpSettings]:
    """The core configuration (see :func:`build_core_config`) and the FDP placement settings
    checked against it; free-slot affinity follows ``fdp_slot_reuse_policy`` unless
    ``fdp_slot_affinity_enabled`` is given."""
    extra = _extra_config(config)
    _check_keys(extra)
    values = {s.name: _setting(extra, s.name, s.default) for s in _PLUGIN_SETTINGS
              if s.config and s.name not in ("device_path", "io_engine")}
    values["device_path"] = resolve_device_paths(extra, metadata)[0]
    if values["slot_bytes"] is None:
        values["slot_bytes"] = round_up(values["header_bytes"] + _full_chunk_bytes(local_cpu_backend),
                                        values["block_align"])
    engine = _get(extra, "io_engine", None)
    if engine is not None and engine != "":
        values["io_engine"] = parse_value("io_engine", engine, label=_label("io_engine"))
    else:
        legacy = (_setting_bool(extra, "use_iouring") or _setting_bool(extra, "use_uring"))
        values["io_engine"] = "io_uring" if legacy else "posix"
    cfg = RawBlockCoreConfig(**values)
    settings = fdp.resolve_settings(
        {s.name: _setting(extra, s.name, None) for s in _FDP_SETTINGS}, io_engine=cfg.io_engine,
        use_uring_cmd=cfg.use_uring_cmd, meta_checkpoint_placement_id=cfg.meta_checkpoint_placement_id,
        default_policy=fdp.TP_WORKER, label=_label)
    affinity = _setting(extra, "fdp_slot_affinity_enabled", None)
    reuse = _setting(extra, "fdp_slot_reuse_policy", None)
    if affinity is None:
        affinity = settings.slot_affinity
    elif reuse is not None and affinity != (reuse == fdp.PID_AFFINITY):
        raise ValueError(f"{_label('fdp_slot_affinity_enabled')}={affinity} contradicts "
                         f"{_label('fdp_slot_reuse_policy')}={reuse!r}; give one of them")
    if affinity != cfg.fdp_slot_affinity_enabled:
        cfg = dataclasses.replace(cfg, fdp_slot_affinity_enabled=affinity)
    return cfg, settings


def _setting_bool(extra: Mapping, name: str) -> bool:
    value = _get(extra, name, None)
    return False if value is None or value == "" else parse_bool(value, _label(name))


def _eviction_policy(extra: Mapping) -> str:
    value = _get(extra, "eviction_policy", "none")
    policy = str(value).strip().lower() if value is not None else "none"
    if policy not in EVICTION_POLICIES:
        raise ValueError(
            f"extra_config['{_key('eviction_policy')}'] must be one of {', '.join(EVICTION_POLICIES)}; "
            f"got {value!r}")
    return policy


def _fraction(extra: Mapping, name: str, default: float, *, zero_ok: bool) -> float:
    """rust_raw_block.<name> as a fraction: in (0, 1], or [0, 1] with ``zero_ok``; an int, a
    float or a decimal string (YAML and the environment give strings). Booleans are refused."""
    value = _get(extra, name, None)
    if value is None or value == "":
        return default
    number = finite_number(value)
    low_ok = zero_ok and number == 0.0
    if number is None or not (0.0 < number <= 1.0 or low_ok):
        bounds = "[0, 1]" if zero_ok else "(0, 1]"
        raise ValueError(f"{_label(name)} must be a number in {bounds}, got {value!r}")
    return number


def _eviction_fractions(extra: Mapping, policy: str) -> tuple[float, float]:
    """(trigger watermark, ratio) of evict-ahead, checked whatever the policy."""
    trigger = _fraction(extra, "eviction_trigger_watermark", DEFAULT_EVICTION_TRIGGER_WATERMARK, zero_ok=False)
    ratio = _fraction(extra, "eviction_ratio", DEFAULT_EVICTION_RATIO, zero_ok=True)
    if policy in ("none", "extent", "extent_prefix"):
        for name in ("eviction_trigger_watermark", "eviction_ratio"):
            value = _get(extra, name, None)
            if value is not None and value != "":
                logger.warning("%s has no effect without %s: lru or prefix", _label(name), _key("eviction_policy"))
    return trigger, ratio


def _space_failure(failure: BaseException | None) -> bool:
    """Whether a put's failure may be for want of a slot: the core reports that (no free slot,
    slots waiting for a checkpoint) as a RuntimeError, device errors as OSError, a payload
    that does not fit as ValueError. A key being stored by another call (EBUSY) is not: no
    eviction gives it a slot."""
    return isinstance(failure, RuntimeError) and getattr(failure, "errno", None) != errno.EBUSY


def _notify_stored(items: list, results: list[bool], on_complete_callback: Any) -> None:
    """Call ``on_complete_callback(key)`` for each put item whose write succeeded; a callback
    that raises is logged and the others still run."""
    for (key, *_rest), ok in zip(items, results):
        if ok:
            try:
                on_complete_callback(key)
            except Exception:
                logger.exception("on_complete_callback failed for %s", key)


def _persist_error(failed: list[str], count: int, failure: BaseException | None) -> RuntimeError:
    """The error of a put of ``count`` keys whose ``failed`` (encoded) keys were not stored."""
    why = f": {failure}" if failure is not None else ""
    if count == 1:
        return RuntimeError(f"Failed to persist raw-block key {failed[0]}{why}")
    return RuntimeError(f"Failed to persist raw-block keys: {', '.join(failed)}{why}")


# --------------------------------------------------------------------------- the plugin


class RustRawBlockBackend(StoragePluginInterface):
    """LMCache storage plugin storing KV chunks in fixed slots of a raw block device."""

    def __init__(self, config: Any = None, metadata: Any = None, local_cpu_backend: Any = None,
                 loop: asyncio.AbstractEventLoop | None = None, dst_device: str = "cpu") -> None:
        super().__init__(dst_device=dst_device, config=config, metadata=metadata,
                         local_cpu_backend=local_cpu_backend, loop=loop)
        if loop is None:
            raise ValueError("RustRawBlockBackend requires an asyncio event loop")
        if local_cpu_backend is None:
            raise ValueError("RustRawBlockBackend requires a local_cpu_backend (max_local_cpu_size must be > 0)")
        if config is None:
            raise ValueError("RustRawBlockBackend requires an LMCacheEngineConfig")
        extra = _extra_config(config)
        self.eviction_policy = _eviction_policy(extra)
        self.eviction_trigger_watermark, self.eviction_ratio = _eviction_fractions(extra, self.eviction_policy)
        cfg, self._fdp = build_configs(config, metadata, local_cpu_backend)
        self._admission = Admission(_setting(extra, "admission", "always"))
        self.device_paths = resolve_device_paths(extra, metadata)  # this rank's devices
        self.device_path = cfg.device_path  # this rank's (first) device, as LMCache's plugin exposes it
        self._core: RawBlockCore | MultiDeviceCore
        if len(self.device_paths) == 1:
            self._core = RawBlockCore(cfg, key_namespace="legacy")
        else:  # one cache over this rank's devices, each its own failure domain
            self._core = MultiDeviceCore(MultiDeviceConfig.for_paths(cfg, self.device_paths), key_namespace="legacy")
        try:
            self._router = self._start_fdp(config, metadata)
            if self._core.io_engine == "io_uring":
                try:
                    self._core.register_fixed_buffers_from_allocator(local_cpu_backend.get_memory_allocator())
                except Exception as e:  # noqa: BLE001 - any allocator: plain buffers still work
                    logger.warning("io_uring fixed-buffer registration failed (%s). Falling back to non-fixed "
                                   "buffer mode", e)
            self._warn_on_cross_rank_device(metadata)
            self._unexport = metrics.attach_inprocess(self._core, self.device_path, metadata)
        except BaseException:
            self._core.close()
            raise

        self._put_lock = threading.Lock()
        self._put_tasks: set[str] = set()  # encoded keys of writes scheduled and not finished
        self._pin_lock = threading.Lock()
        self._pinned_keys: set[str] = set()
        self._lru_lock = threading.Lock()
        self._lru: OrderedDict[str, None] = OrderedDict()
        self._evicts = self.eviction_policy != "none"
        # The plugin keeps its own order (the LRU list, or the chains) only under lru, prefix and
        # extent_prefix (the chains weigh the extents): under extent the core orders the extents
        # and deletes their keys, so a list here would only gather every key ever stored.
        self._ordered = self.eviction_policy in ("lru", "prefix", "extent_prefix")
        self._prefix: PrefixOrder | None = self._start_order()
        # One background thread, started by the first signal: it writes the checkpoint that
        # makes slots freed by removes reusable (so a put that needs them neither writes it nor
        # waits for its flush), and under lru or prefix it also evicts ahead. Under policy none it is
        # signalled only where the core has no thread of its own that a delete wakes for that
        # checkpoint (the log format's periodic thread).
        work = self._evictor_pass if self._evicts else self._reclaim_pass
        self._extents = self._start_extents(extra)
        if self._extents is not None:
            work = self._extents.evictor_pass
        self._evictor = Reclaimer("rawblock-evictor", work, logger)
        status = self._core.report_status()
        self._reclaim_removes = self._evicts or not (self._core.meta_enable_periodic and status["meta_format"] == "log")
        # (full-size slots, slot ids): with size classes the ids are the smallest class's
        self._full_slots = (status["usable_capacity_bytes"] // self._core.slot_bytes, self._core.slot_counts().usable)
        self._stats_lock = threading.Lock()
        self._evicted_ahead = 0  # entries the evictor deleted
        self._put_evicted = 0  # entries puts that found no slot deleted
        self._put_retries = 0  # put_many calls repeated after evicting (or finding room)
        self._close_lock = threading.Lock()
        self._closed = False
        # Lookups report only the chunks worth loading (lmcache_rawblock.load_cost), when set.
        try:
            self._pricer = load_cost.PrefixPricer.from_settings(self._core, extra, _KEY_PREFIX,
                                                                int(getattr(config, "chunk_size", 256)))
        except BaseException:  # a bad load_cost_* setting: nothing of this backend stays open
            self._unexport()
            self._core.close()
            raise

    def __str__(self) -> str:
        return "RustRawBlockBackend"

    def _start_order(self) -> PrefixOrder | None:
        """The recovered entries in the eviction order: under prefix, the chains of chunks
        (lmcache_rawblock.prefix_evict, returned); under lru, the LRU in index order (oldest
        checkpointed first); under extent and none, nothing (the core orders extents)."""
        if self.eviction_policy in ("prefix", "extent_prefix"):  # extent_prefix: weighs the extents
            order = PrefixOrder()
            order.add_recovered(self._core.snapshot_indexed_keys())
            return order
        if self._ordered:
            for enc in self._core.snapshot_indexed_keys():
                self._lru[enc] = None
        return None

    def _start_extents(self, extra: Mapping) -> ExtentEviction | None:
        """eviction_policy extent: its evictor (lmcache_rawblock/extent_evict.py) over this
        rank's one device; None under the other policies."""
        try:
            reserve = parse_reserve(_get(extra, "extent_reserve"), _label("extent_reserve"))
            reinsert = parse_reinsert(_get(extra, "extent_reinsert"), _label("extent_reinsert"))
            if self.eviction_policy not in ("extent", "extent_prefix"):
                return None
            if not isinstance(self._core, RawBlockCore):
                raise ValueError(f"{_key('eviction_policy')}={self.eviction_policy!r} takes one device per rank, got "
                                 f"{len(self.device_paths)}")
            # extent_prefix: the chains weigh the victim (the same builder as the MP adapter's)
            return extent_eviction(self.eviction_policy, self._core, self._pin_lock, lambda: self._pinned_keys,
                                   reserve, logger, reinsert, _label("extent_reserve"), self._prefix, self._lru_lock)
        except BaseException:
            self._unexport()
            self._core.close()
            raise

    def _start_fdp(self, config: Any, metadata: Any) -> fdp.PlacementRouter | None:
        """With FDP on: ask the device for its placement identifiers, check the configured ones
        against them and build the router of the configured policy."""
        self._fdp_status: list[tuple[int, int]] = []
        if not self._fdp.enabled:
            return None
        try:
            self._fdp_status = self._core.fetch_fdp_status()
        except (OSError, RuntimeError) as e:
            raise RuntimeError(f"{_label('fdp_enabled')}=true: cannot read the FDP placement identifiers of "
                               f"{self.device_path}: {e}") from e
        ids = fdp.data_placement_ids(self._fdp_status, self._fdp.placement_ids,
                                     self._core.meta_checkpoint_placement_id, device=self.device_path,
                                     policy=self._fdp.data_policy, label=_label)
        world_size = int(getattr(metadata, "world_size", 1) or 1) if metadata is not None else 1
        router = fdp.PlacementRouter(self._fdp.data_policy, ids, role=fdp.role_phase(self._fdp.phase, config),
                                     ranks=world_size)
        logger.info("FDP placement on %s: policy %s over placement identifiers %s (device reports %s)",
                    self.device_path, router.policy, list(ids), self._fdp_status)
        return router

    def _placements(self, keys: list) -> list | None:
        """Each key's placement identifier for this store (None: no directive for any)."""
        if self._router is None:
            return None
        return self._router.placements([fdp.legacy_key_facts(k) for k in keys])

    def _warn_on_cross_rank_device(self, metadata: Any) -> None:
        if metadata is None:
            return
        first = self._core.first_encoded_key()
        if first is None:
            return
        try:
            stored_worker = int(decode_legacy_key(first).worker_id)
        except Exception:  # noqa: BLE001 - a key of another layout: nothing to compare
            return
        current = int(getattr(metadata, "worker_id", 0))
        if stored_worker != current:
            logger.warning(
                "raw-block device %s was written by another rank: this worker_id=%d, stored worker_id=%d "
                "(first key %s); its entries will not match this rank's keys",
                self._core.device_path, current, stored_worker, first)

    # ---- properties and test hooks ----------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        return self._core.capacity_bytes

    @property
    def block_align(self) -> int:
        return self._core.block_align

    @property
    def header_bytes(self) -> int:
        return self._core.header_bytes

    @property
    def slot_bytes(self) -> int:
        return self._core.slot_bytes

    @property
    def meta_total_bytes(self) -> int:
        return self._core.meta_total_bytes

    @property
    def meta_magic_text(self) -> str:
        return self._core.meta_magic_text

    @property
    def meta_version(self) -> int:
        return self._core.meta_version

    @property
    def data_base_offset(self) -> int:
        return self._core.data_base_offset()

    # LMCache's test hook (its tests swap fake devices in through it): the device here lives
    # inside the C core, so the getter gives None and the setter raises, as the core's do.
    @property
    def _raw(self) -> Any:
        return self._core.raw_device()

    @_raw.setter
    def _raw(self, raw_device: Any) -> None:
        self._core.set_raw_device_for_testing(raw_device)

    def lock_refcount(self, encoded_key: str) -> int:
        return self._core.lock_refcount(encoded_key)

    def inflight_io_count(self) -> int:
        return self._core.inflight_io_count()

    def indexed_key_count(self) -> int:
        return self._core.indexed_key_count()

    def entry_offset(self, key: Any) -> int | None:
        return self._core.entry_offset(self._encode(key))

    def metadata_container_offsets(self) -> list[int]:
        return self._core.metadata_container_offsets()

    def apply_loaded_state(self, data: Any) -> bool:
        return self._core.apply_loaded_state(data)

    def reopen_device(self, device: int | str) -> dict:
        """Bring back one failed device of a cache over several (``device_paths``): see
        ``MultiDeviceCore.reopen_device``. Under ``lru`` its recovered keys join the LRU list
        as the least recently used; under ``prefix``, as chain heads evicted first."""
        core = self._core
        if not isinstance(core, MultiDeviceCore):
            raise ValueError(f"reopen_device needs several devices ({_label('device_paths')}); this rank has "
                             f"one: {self.device_path!r}")
        out = core.reopen_device(device)
        if self._ordered:
            back = core.device_cores()[core.device_paths.index(out["device_path"])]
            keys = back.snapshot_indexed_keys() if back is not None else []
            with self._lru_lock:
                if self._prefix is not None:
                    self._prefix.add_recovered(keys)
                    return out
                for enc in keys:
                    if enc not in self._lru:
                        self._lru[enc] = None
                        self._lru.move_to_end(enc, last=False)
        return out

    def report_status(self) -> dict:
        status = dict(self._core.report_status())
        status["eviction_policy"] = self.eviction_policy
        status["eviction_trigger_watermark"] = self.eviction_trigger_watermark
        status["eviction_ratio"] = self.eviction_ratio
        evictor = self._evictor.status()
        status["evictor_running"] = bool(evictor.get("running", False))
        status["evictor_passes"] = evictor.get("passes", 0)
        status["evictor_errors"] = evictor.get("errors", 0)
        status["evictor_last_error"] = evictor.get("last_error")
        with self._stats_lock:
            status["evicted_ahead_entries"] = self._evicted_ahead
            status["put_evicted_entries"] = self._put_evicted
            status["put_evict_retries"] = self._put_retries
        if self._extents is not None:  # eviction_policy extent: clean extents kept ahead, victims
            status["extent_reserve"] = self._extents.reserve
            status["extent_reserve_effective"] = self._extents.effective_reserve()
            status["evicted_extents"] = self._extents.extents_evicted
            status["evicted_extent_entries"] = self._extents.keys_evicted
            status["reinserted_extent_entries"] = self._extents.keys_reinserted
            if self._extents.chooser is not None:  # extent_prefix: victims not the oldest
                status["extent_victims_not_oldest"] = self._extents.chooser.chosen_other
        status.update(self._admission.status())
        if self._prefix is not None:
            with self._lru_lock:
                status.update(self._prefix.counts())
        pricer = self._pricer
        if pricer is not None:
            status["load_cost"] = pricer.status()
        router = self._router
        status["fdp_enabled"] = self._fdp.enabled
        status["fdp_discovered_status"] = list(self._fdp_status)
        status["fdp_placement_ids"] = list(router.ids) if router else []
        status["fdp_data_placement_policy"] = self._fdp.data_policy
        status["fdp_slot_reuse_policy"] = self._fdp.slot_reuse_policy
        if router is not None and router.salts is not None:
            status["fdp_cache_salt_placements"] = router.salts.assignments()
            status["fdp_cache_salt_fallback_count"] = router.salts.fallback_count
        return status

    # ---- helpers ------------------------------------------------------------------------

    @staticmethod
    def _encode(key: Any) -> str:
        return key if isinstance(key, str) else key.to_string()

    def _lru_touch(self, encoded: list[str]) -> None:
        if not self._ordered or not encoded:
            return
        with self._lru_lock:
            if self._prefix is not None:
                self._prefix.add_many(encoded)
                return
            for enc in encoded:
                self._lru[enc] = None
                self._lru.move_to_end(enc)

    def _lru_forget(self, encoded: list[str]) -> None:
        if not self._ordered or not encoded:
            return
        with self._lru_lock:
            if self._prefix is not None:
                self._prefix.remove_many(encoded)
                return
            for enc in encoded:
                self._lru.pop(enc, None)

    def _evict_lru(self, count: int, protect: frozenset[str] | set[str] = frozenset()) -> int:
        """Delete up to ``count`` least-recently-used entries that are not pinned, not in
        ``protect`` and not locked by a load, in batched deletes (one for all of them unless
        some refuse). Returns how many were deleted; their slots wait for a checkpoint."""
        evicted = 0
        tried: set[str] = set()  # refused (locked by a load) or no longer indexed
        while evicted < count:
            want = count - evicted
            # The pin lock keeps pin() from taking a lock reference between the choice and the
            # delete; force=False keeps what a load holds.
            with self._pin_lock:
                victims = self._pick_victims(want, self._pinned_keys, protect, tried)
                if not victims:
                    break
                results = self._core.delete_many(victims, force=False)
            removed = list(compress(victims, results))
            kept = [enc for enc, ok in zip(victims, results) if not ok]
            if removed:
                self._lru_forget(removed)
                evicted += len(removed)
            if kept:
                tried.update(kept)
                # Entries the core dropped itself (a failed check, a lost write-back) linger in
                # the list: forget those; the others are being read and stay.
                self._lru_forget([enc for enc, there in zip(kept, self._core.exists_many(kept)) if not there])
        if evicted:
            logger.debug("raw-block LRU evicted %d entries", evicted)
        return evicted

    def _pick_victims(self, want: int, pinned: set[str], protect: frozenset[str] | set[str],
                      tried: set[str]) -> list[str]:
        """Up to ``want`` entries to evict, in the policy's order, none of them pinned, in
        ``protect`` or in ``tried``."""
        victims: list[str] = []
        with self._lru_lock:
            if self._prefix is not None:
                kept = pinned | protect | tried if pinned or protect or tried else ()
                return self._prefix.victims(want, kept)
            for enc in self._lru:
                if enc in pinned or enc in protect or enc in tried:
                    continue
                victims.append(enc)
                if len(victims) >= want:
                    break
        return victims

    def _eviction_marks(self, usable: int) -> tuple[int, int]:
        """(slots in use that trigger evict-ahead, slots in use it evicts down to)."""
        trigger = max(1, math.ceil(self.eviction_trigger_watermark * usable - 1e-9))
        low = max(0, math.floor((self.eviction_trigger_watermark - self.eviction_ratio) * usable + 1e-9))
        return trigger, min(low, trigger - 1)

    def _usable_entries(self, usable: int) -> int:
        """The entries ``usable`` slot ids hold at full size: the ids themselves, but with
        size classes (ids of the smallest class) the full-size slots of the usable capacity,
        so the trigger fires on a cache of full-size entries (a mix of smaller ones fires it
        early, never late)."""
        full, ids = self._full_slots
        return usable * full // ids if 0 < full < ids else usable

    def _evictor_pass(self) -> bool:
        """One pass of the evictor thread: evict ahead when the slots in use reached the
        trigger, then make every slot waiting for a checkpoint reusable. True when it evicted
        (the next pass looks again: puts may have filled the slots meanwhile)."""
        counts = self._core.slot_counts()
        if counts.closed or counts.usable <= 0:
            return False
        evicted = 0
        if self.eviction_ratio > 0:
            trigger, low = self._eviction_marks(self._usable_entries(counts.usable))
            if counts.used >= trigger:
                evicted = self._evict_lru(min(counts.indexed, counts.used - low))
        if evicted or counts.held:
            self._core.reclaim_held_slots()
            if evicted and self._core.slot_counts().held:
                # A checkpoint is written only after a change to the index, and this core
                # needs one more to free the slots (v1: each of its two containers must stop
                # listing them): one more victim is that change, and its slot waits for the
                # next pass.
                extra = self._evict_lru(1)
                if extra:
                    evicted += extra
                    self._core.reclaim_held_slots()
            with self._stats_lock:
                self._evicted_ahead += evicted
        return evicted > 0

    def _reclaim_pass(self) -> bool:
        """One pass of the background thread under policy ``none``: make the slots that removes
        freed reusable (the checkpoint that no longer lists them)."""
        self._core.reclaim_held_slots()
        return False

    def _signal_evictor(self) -> None:
        self._evictor.signal()

    def _slots_freed(self) -> None:
        """Removes freed slots: have the checkpoint that makes them reusable written now, off
        the caller's thread, rather than by the put that next needs them."""
        if self._reclaim_removes:
            self._evictor.signal()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until the plugin's background thread (the checkpoint that makes slots freed by
        removes reusable; evict-ahead under lru or prefix) has no pass running or asked for. False when
        ``timeout`` (seconds) ran out first. Not in LMCache's plugin: for tests and benchmarks
        that want no background metadata I/O during what they measure next."""
        return self._evictor.wait_idle(timeout)

    def _no_room(self, failure: BaseException | None, why: str) -> RuntimeError:
        """The error of a put that found no slot even after evicting, with the counts that
        say why (pinned or being read, being written, waiting for a checkpoint)."""
        c = self._core.slot_counts()
        with self._pin_lock:
            pinned = len(self._pinned_keys)
        first = f"{failure}; " if failure is not None else ""
        full, ids = self._full_slots
        slots = f"{c.usable} slot ids ({full} of full size)" if 0 < full < ids else f"{c.usable} slots"
        return RuntimeError(
            f"{first}{why}: {slots}, {c.indexed} indexed ({pinned} pinned, "
            f"{max(0, c.locked - pinned)} more locked by loads), {c.inflight} being written, "
            f"{c.held} freed and waiting for a checkpoint, {c.reusable} reusable")

    def _put_evicting(self, specs: list, objs: list, pids: list | None, results: list[bool],
                      stored: list[str], failure: BaseException | None) -> BaseException | None:
        """The last resort of a put that found no slot: evict for every key still failing
        (never the batch's own keys), make the freed slots reusable, retry those keys; again
        while other threads take the slots first, at most ``_PUT_EVICT_ROUNDS`` times.
        Updates ``results`` and ``stored``; returns the failure left (None when all stored)."""
        protect = frozenset(s.encoded for s in specs)
        for _ in range(_PUT_EVICT_ROUNDS):
            failed = [i for i, ok in enumerate(results) if not ok]
            if not failed:
                return None
            counts = self._core.slot_counts()
            if counts.closed:
                return failure
            # With slots to spare the last retry lost them to other puts, or failed for another
            # reason (then it ends below, as that is not a want of slots): retry at once.
            if counts.reusable < len(failed) and not self._make_room(len(failed) - counts.reusable, protect,
                                                                     counts.held):
                return self._no_room(failure, "no slot is free and nothing is left to evict")
            failure = self._put_retry(specs, objs, pids, failed, results, stored)
            if all(results):
                return None
            if not _space_failure(failure):
                return failure
        return self._no_room(failure, f"other puts took the freed slots first {_PUT_EVICT_ROUNDS} times")

    def _make_room(self, want: int, protect: frozenset[str], held: int) -> bool:
        """Evict up to ``want`` entries outside ``protect`` and write the checkpoint that makes
        freed (and ``held``) slots reusable; False when there is nothing to retry with."""
        if self._extents is not None:
            evicted = self._extents.evict(want, protect)
        else:
            evicted = self._evict_lru(want, protect)
        with self._stats_lock:
            self._put_evicted += evicted
        if evicted or held:
            try:
                self._core.reclaim_held_slots()
            except Exception as e:  # noqa: BLE001 - the put's error says it below
                logger.warning("raw-block put could not write the checkpoint that frees slots: %s", e)
        after = self._core.slot_counts()
        # Slots still held wait for the checkpoint the core writes for a put that needs them
        # (one more after a change to the index): the retry gets them.
        return not (after.reusable == 0 and after.held == 0 and not evicted)

    def _put_retry(self, specs: list, objs: list, pids: list | None, failed: list[int],
                   results: list[bool], stored: list[str]) -> BaseException | None:
        """Put the keys at indexes ``failed`` again, updating ``results`` and ``stored``;
        returns why the first of them that failed again did (None when none did)."""
        retry = self._core.put_many([specs[i] for i in failed], [objs[i] for i in failed],
                                    placement_ids=None if pids is None else [pids[i] for i in failed])
        with self._stats_lock:
            self._put_retries += 1
        for i, ok in zip(failed, retry.results):
            results[i] = ok
        stored += list(retry.stored_keys)
        self._lru_touch(list(retry.stored_keys))
        return retry.failure

    def _put_with_policy(self, specs: list, objs: list,
                         pids: list | None = None) -> tuple[list[bool], BaseException | None]:
        """Store the batch (evicting for room under ``lru``, ``prefix`` or ``extent``): per-key results,
        and why the first key that failed did (None when none did)."""
        result = self._core.put_many(specs, objs, placement_ids=pids)
        results = list(result.results)
        stored = list(result.stored_keys)
        failure = result.failure
        if self._evicts:
            self._lru_touch(stored)
            # Evict only when the put may have failed for want of a slot: one that failed for
            # another reason (an I/O error) must not cost other keys their place.
            if not all(results) and _space_failure(failure):
                failure = self._put_evicting(specs, objs, pids, results, stored, failure)
            if self._extents_look(len(stored), failure):
                self._signal_evictor()
        return results, failure

    def _extents_look(self, stored: int, failure: BaseException | None) -> bool:
        """Whether this put's keys bring the evictor's next look due (always, but under
        ``extent`` while clean extents beyond the reserve are left)."""
        return self._extents is None or self._extents.puts_stored(stored) or failure is not None

    # ---- lookups and pins ---------------------------------------------------------------

    def contains(self, key: Any, pin: bool = False) -> bool:
        if pin:
            return self.pin(key)
        return self._core.contains_key(self._encode(key))

    def exists_in_put_tasks(self, key: Any) -> bool:
        enc = self._encode(key)
        with self._put_lock:
            return enc in self._put_tasks

    def pin(self, key: Any) -> bool:
        enc = self._encode(key)
        with self._pin_lock:
            if enc in self._pinned_keys:
                return True
            if not self._core.exists_many([enc], lock=True)[0]:
                return False
            self._pinned_keys.add(enc)
            return True

    def unpin(self, key: Any) -> bool:
        enc = self._encode(key)
        with self._pin_lock:
            if enc in self._pinned_keys:
                self._core.unlock_many([enc])
                self._pinned_keys.discard(enc)
                return True
            return self._core.contains_key(enc)

    def remove(self, key: Any, force: bool = True) -> bool:
        enc = self._encode(key)
        with remove_guard(self._extents), self._pin_lock:
            if self._extents is not None:
                self._extents.removed()  # no hot key of an eviction under way comes back
            removed = self._core.delete_many([enc], force=force)[0]
            if removed:
                self._pinned_keys.discard(enc)
        if removed:
            self._lru_forget([enc])
            self._slots_freed()  # its slot becomes reusable after a checkpoint
        return removed

    def batched_remove(self, keys: Any, force: bool = True) -> int:
        """Remove many keys with one pin-lock section and one native delete of all of them.

        Keys are encoded in C (LMCache's ``CacheEngineKey.to_string()`` layout; ``to_string()``
        itself for any other key object). When nothing is pinned and the policy is neither lru
        nor prefix, the encoding and the core's delete happen in one native call; otherwise the
        encoded keys are kept to drop the removed ones from the pinned set / LRU list or chains.
        """
        if not isinstance(keys, (list, tuple)):
            keys = list(keys)
        if not keys:
            return 0
        with remove_guard(self._extents), self._pin_lock:
            if self._extents is not None:
                self._extents.removed()  # no hot key of an eviction under way comes back
            if not self._pinned_keys and not self._ordered:
                # Nothing to reconcile afterwards: encode into one C buffer and delete in the
                # same native call (no str objects, GIL released for the whole batch).
                removed = self._core.delete_legacy_keys(keys, force)
                encoded, results = None, None
            else:
                encoded = encode_legacy_keys(keys)
                results = self._core.delete_many(encoded, force=force)
                if self._pinned_keys:
                    self._pinned_keys.difference_update(compress(encoded, results))
                removed = results.count(True)
        if encoded is not None and results is not None:
            self._lru_forget(list(compress(encoded, results)))
        if removed:
            self._slots_freed()  # their slots become reusable after a checkpoint
        return removed

    def batched_contains(self, keys: Any, pin: bool = False) -> int:
        """LMCache's prefix loop over ``contains`` (the base class's), or with load pricing on the
        leading chunks worth loading; under ``prefix`` the lookup also teaches the chain (the
        first missing key follows the last hit)."""
        keys = list(keys)
        if self._pricer is None:
            hits = super().batched_contains(keys, pin)
        else:
            hits = self._pin_prefix(keys, self._pricer.prefix(encode_legacy_keys(keys)), pin)
        if self._prefix is not None and keys:
            self._learn_lookup(encode_legacy_keys(keys[: hits + 1]), hits)
        return hits

    async def batched_async_contains(self, lookup_id: str, keys: list, pin: bool = False) -> int:
        encoded = encode_legacy_keys(keys)
        if self._pricer is not None:
            hits = self._pricer.prefix(encoded)
        else:
            hits = 0
            probe = encoded
            if self._prefix is not None:  # not past a chunk whose predecessor is known gone
                with self._lru_lock:
                    probe = encoded[: self._prefix.probe_bound(encoded)]
            for ok in self._core.exists_many(probe, lock=False):
                if not ok:
                    break
                hits += 1
        if self._prefix is not None:
            self._learn_lookup(encoded, hits)
        return self._pin_prefix(keys, hits, pin)

    def _learn_lookup(self, encoded: list[str], hits: int) -> None:
        """Under ``prefix``: a lookup's first missing key follows its last hit."""
        with self._lru_lock:
            self._prefix.note_lookup(encoded, hits)  # type: ignore[union-attr]

    def _pin_prefix(self, keys: list, hits: int, pin: bool) -> int:
        if not pin:
            return hits
        pinned = 0
        for key in keys[:hits]:
            if not self.pin(key):
                break
            pinned += 1
        return pinned

    # ---- puts ---------------------------------------------------------------------------

    def batched_submit_put_task(self, keys: Any, objs: Any, transfer_spec: Any = None,
                                on_complete_callback: Any = None) -> list | None:
        if self.loop is None:
            raise RuntimeError("RustRawBlockBackend has no event loop")
        if self._core.io_engine == "io_uring" and self._core._worker_error() is not None:
            # The engine has failed for good: no put can land, so take no reference (as LMCache).
            return None
        keys = list(keys)
        specs = [encode_legacy_key(key) for key in keys]
        if self._prefix is not None:  # the call's keys come in prompt order: learn the chain
            with self._lru_lock:
                self._prefix.note_call([spec.encoded for spec in specs])
        # Placement is decided over the whole store, before keys already stored drop out: the
        # first chunk of a prompt's chain anchors it even when it is skipped here.
        pids = self._placements(keys)
        queued = self._claim_puts(keys, specs, objs, pids)
        if not queued:
            return None
        return self._schedule_puts(queued, on_complete_callback, self.loop)

    def _claim_puts(self, keys: list, specs: list, objs: Any, pids: list | None) -> list[tuple[Any, Any, Any, Any]]:
        """The (key, spec, obj, placement id) of each key to write: not being written, stored
        or refused by admission; each is marked as a put task and its object referenced."""
        queued: list[tuple[Any, Any, Any, Any]] = []
        for i, (key, spec, obj) in enumerate(zip(keys, specs, objs)):
            with self._put_lock:
                if spec.encoded in self._put_tasks:
                    continue
                self._put_tasks.add(spec.encoded)
            if (self._core.contains_key(spec.encoded) or self._core.exists_inflight(spec.encoded)
                    or not self._admission.admit(spec.encoded)):
                with self._put_lock:
                    self._put_tasks.discard(spec.encoded)
                continue
            obj.ref_count_up()
            queued.append((key, spec, obj, None if pids is None else pids[i]))
        return queued

    def _schedule_puts(self, queued: list, on_complete_callback: Any,
                       loop: asyncio.AbstractEventLoop) -> list:
        """Run the writes of ``queued`` on ``loop`` (one batch under io_uring, else one per
        key): their futures; if scheduling fails, what was not scheduled is released."""
        if self._core.io_engine == "io_uring" and len(queued) > 1:
            batches = [queued]
        else:
            batches = [[item] for item in queued]
        futures = []
        for n, batch in enumerate(batches):
            coro = self._put_coro(batch, on_complete_callback)
            try:
                fut = asyncio.run_coroutine_threadsafe(coro, loop)
            except BaseException:
                coro.close()
                # Nothing scheduled from here on will run: give back what it would have released.
                for later in batches[n:]:
                    self._release_put_items(later)
                raise
            futures.append(fut)
        return futures

    def _release_put_items(self, items: list) -> None:
        for _key, spec, obj, _pid in items:
            try:
                obj.ref_count_down()
            finally:
                with self._put_lock:
                    self._put_tasks.discard(spec.encoded)

    async def _put_coro(self, items: list, on_complete_callback: Any) -> None:
        try:
            specs = [item[1] for item in items]
            objs = [item[2] for item in items]
            pids = [item[3] for item in items]
            # Without a directive the put is the plain two-argument call it was before FDP.
            args = (specs, objs) if all(p is None for p in pids) else (specs, objs, pids)
            results, failure = await asyncio.to_thread(self._put_with_policy, *args)
            failed = [spec.encoded for spec, ok in zip(specs, results) if not ok]
            if on_complete_callback is not None:
                _notify_stored(items, results, on_complete_callback)
            if failed:
                raise _persist_error(failed, len(items), failure) from failure
        finally:
            self._release_put_items(items)

    # ---- gets ---------------------------------------------------------------------------

    def _batched_get_prefix(self, keys: list) -> list:
        encoded = encode_legacy_keys(keys)
        with self._pin_lock:
            pinned = self._pinned_keys
            metas = self._core.get_metadata_prefix(encoded, lock=True, skip_locked=pinned or None)
            if pinned:
                locked = [enc for enc in encoded[: len(metas)] if enc not in pinned]
            else:
                locked = encoded[: len(metas)]
        allocated: list = []
        try:
            self._allocate_prefix(metas, allocated)
            if not allocated:
                return []
            return self._load_prefix(encoded, allocated)
        except BaseException:
            for obj in allocated:
                obj.ref_count_down()
            raise
        finally:
            if locked:
                self._core.unlock_many(locked)

    def _allocate_prefix(self, metas: list, allocated: list) -> None:
        """Append to ``allocated`` a buffer for each entry of ``metas`` in order, stopping
        (with a log line) at the first entry without shape or dtype or that gets no buffer."""
        for meta in metas:
            if meta.shape is None or meta.dtype is None:
                logger.warning("raw-block entry without shape or dtype; stopping the prefix there")
                break
            obj = self.local_cpu_backend.allocate(meta.shape, meta.dtype, meta.fmt)
            if obj is None:
                logger.error("local_cpu_backend.allocate returned None; stopping the prefix there")
                break
            allocated.append(obj)

    def _load_prefix(self, encoded: list[str], allocated: list) -> list:
        """Load the first ``len(allocated)`` keys of ``encoded`` into ``allocated``: the buffers
        of the prefix that loaded; the others are released (raises as the core's load does)."""
        results = self._core.load_many_into(encoded[: len(allocated)], allocated, raise_on_error=True)
        loaded = 0
        for ok in results:
            if not ok:
                break
            loaded += 1
        for obj in allocated[loaded:]:
            obj.ref_count_down()
        self._lru_touch(encoded[:loaded])
        return allocated[:loaded]

    def get_blocking(self, key: Any) -> Any:
        objs = self._batched_get_prefix([key])
        return objs[0] if objs else None

    def batched_get_blocking(self, keys: Any) -> list:
        keys = list(keys)
        if not keys:
            return []
        objs = self._batched_get_prefix(keys)
        return objs + [None] * (len(keys) - len(objs))

    async def batched_get_non_blocking(self, lookup_id: str, keys: list, transfer_spec: Any = None) -> list:
        return await asyncio.to_thread(self._batched_get_prefix, list(keys))

    def get_allocator_backend(self) -> Any:
        if self.local_cpu_backend is None:
            raise RuntimeError("RustRawBlockBackend has no local_cpu_backend")
        return self.local_cpu_backend

    # ---- shutdown -----------------------------------------------------------------------

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            deadline = time.monotonic() + _CLOSE_PUT_WAIT_S
            while time.monotonic() < deadline:
                with self._put_lock:
                    if not self._put_tasks:
                        break
                time.sleep(0.01)
            else:
                with self._put_lock:
                    pending = len(self._put_tasks)
                logger.warning("closing with %d raw-block puts still pending after %.0f s", pending,
                               _CLOSE_PUT_WAIT_S)
            if not self._evictor.stop(_CLOSE_EVICTOR_WAIT_S):
                logger.warning("the raw-block evictor thread is still in a pass after %.0f s; closing anyway",
                               _CLOSE_EVICTOR_WAIT_S)
            self._unexport()
            self._core.close()
            self._closed = True


__all__ = ["DEFAULT_EVICTION_RATIO", "DEFAULT_EVICTION_TRIGGER_WATERMARK", "EVICTION_POLICIES",
           "RustRawBlockBackend", "build_configs", "build_core_config", "resolve_device_paths"]
