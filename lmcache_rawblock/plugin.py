"""``RustRawBlockBackend``: a drop-in for LMCache's raw-block storage plugin, on our C core.

LMCache loads it from ``extra_config``::

    storage_plugin.raw_block.module_path: lmcache_rawblock.plugin
    storage_plugin.raw_block.class_name: RustRawBlockBackend

and it reads the same ``rust_raw_block.*`` keys as LMCache's plugin (see the README for the
table). Beyond LMCache:

* ``batched_remove`` takes the pin lock once and deletes every key with one native
  ``delete_many`` call (which runs without the GIL), instead of one lock and one call per key;
* ``rust_raw_block.eviction_policy``: ``"none"`` (default; a put fails when no slot is free, as
  in LMCache today) or ``"lru"`` (evict least-recently-used entries that nobody has pinned);
* ``rust_raw_block.verify_payload_checksum``: store an xxh3-64 of each payload in slot-header
  bytes LMCache does not read, and treat a load that fails it as a miss.

Lock order: ``_put_lock`` and ``_pin_lock`` are never held together; ``_lru_lock`` is a leaf
taken inside either (or neither); the core's own mutex is below all of them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from itertools import compress
from typing import Any

from ._native import encode_legacy_keys
from ._plugin_base import StoragePluginInterface
from .raw_block import (
    DEFAULT_IOURING_QUEUE_DEPTH,
    RawBlockCore,
    RawBlockCoreConfig,
    encode_legacy_key,
    normalize_raw_block_io_engine,
    round_up,
)
from .raw_block.key_codec import decode_legacy_key

logger = logging.getLogger("lmcache.v1.storage_backend.plugins.rust_raw_block_backend")

_DEFAULT_META_MAGIC = b"LMCIDX01"
_DEFAULT_META_VERSION = 1
_KEY_PREFIX = "rust_raw_block."
EVICTION_POLICIES = ("none", "lru")
_CLOSE_PUT_WAIT_S = 10.0

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


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


def _as_bool(extra: Mapping, name: str, default: bool | None) -> bool | None:
    value = _get(extra, name, None)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"extra_config['{_key(name)}'] must be a boolean (true/false), got {value!r}")


def _as_int(extra: Mapping, name: str, default: int) -> int:
    value = _get(extra, name, None)
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError(f"extra_config['{_key(name)}'] must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"extra_config['{_key(name)}'] must be an integer, got {value!r}") from None


def _validate_per_tp_device_paths(mapping: Mapping) -> None:
    """Every rank must get its own device: two ranks on one device would corrupt each other."""
    paths = [str(p) for p in mapping.values()]
    if len(set(paths)) != len(paths):
        raise ValueError(
            f"Duplicate device path configured in {_key('per_tp_device_paths')}: {dict(mapping)!r}")


def _get_per_tp_device_path(mapping: Mapping, rank: int) -> str:
    """Look the rank up as a string key first (JSON), then as an int (YAML)."""
    for k in (str(rank), rank):
        if k in mapping:
            return str(mapping[k])
    raise ValueError(
        f"{_key('per_tp_device_paths')} has no device for worker_id {rank}; "
        f"available keys: {sorted(str(k) for k in mapping)}")


def _resolve_device_path(extra: Mapping, metadata: Any) -> str:
    world_size = int(getattr(metadata, "world_size", 1) or 1) if metadata is not None else 1
    if world_size > 1:
        mapping = _get(extra, "per_tp_device_paths", None) or {}
        if not isinstance(mapping, Mapping):
            raise ValueError(
                f"extra_config['{_key('per_tp_device_paths')}'] must be a mapping of rank -> device path "
                f"when world_size > 1, got {mapping!r}")
        if not mapping:
            raise ValueError(
                f"extra_config['{_key('per_tp_device_paths')}'] is required when world_size > 1 "
                f"(world_size={world_size})")
        _validate_per_tp_device_paths(mapping)
        return _get_per_tp_device_path(mapping, int(getattr(metadata, "worker_id", 0)))
    path = _get(extra, "device_path", None)
    if not path:
        raise ValueError(f"extra_config['{_key('device_path')}'] is required")
    return str(path)


def _full_chunk_bytes(local_cpu_backend: Any) -> int:
    for name in ("get_full_chunk_size_bytes", "get_full_chunk_size"):
        fn = getattr(local_cpu_backend, name, None)
        if callable(fn):
            return int(fn())
    raise ValueError(
        "cannot derive the default rust_raw_block.slot_bytes: local_cpu_backend has neither "
        "get_full_chunk_size_bytes() nor get_full_chunk_size(); set rust_raw_block.slot_bytes")


def build_core_config(config: Any, metadata: Any, local_cpu_backend: Any) -> RawBlockCoreConfig:
    """The core configuration described by the ``rust_raw_block.*`` keys of ``config``."""
    extra = _extra_config(config)
    device_path = _resolve_device_path(extra, metadata)
    block_align = _as_int(extra, "block_align", 4096)
    header_bytes = _as_int(extra, "header_bytes", 4096)
    slot_bytes = _get(extra, "slot_bytes", None)
    if slot_bytes is None:
        if block_align <= 0:
            raise ValueError(f"block_align must be a power of two > 0, got {block_align}")
        slot_bytes = round_up(header_bytes + _full_chunk_bytes(local_cpu_backend), block_align)
    else:
        slot_bytes = _as_int(extra, "slot_bytes", 0)
    io_engine = normalize_raw_block_io_engine(
        _get(extra, "io_engine", None),
        use_iouring=_as_bool(extra, "use_iouring", None),
        use_uring=_as_bool(extra, "use_uring", None),
    )
    magic = _get(extra, "meta_magic", _DEFAULT_META_MAGIC)
    if isinstance(magic, str):
        magic = magic.encode("ascii", errors="strict") if magic.isascii() else magic.encode("utf-8")
    ckpt_pid = _get(extra, "meta_checkpoint_placement_id", None)
    return RawBlockCoreConfig(
        device_path=device_path,
        capacity_bytes=_as_int(extra, "capacity_bytes", 0),
        block_align=block_align,
        header_bytes=header_bytes,
        slot_bytes=slot_bytes,
        use_odirect=bool(_as_bool(extra, "use_odirect", False)),
        enable_zero_copy=bool(_as_bool(extra, "enable_zero_copy", True)),
        meta_total_bytes=_as_int(extra, "meta_total_bytes", 128 * 1024 * 1024),
        meta_magic=magic,
        meta_version=_as_int(extra, "meta_version", _DEFAULT_META_VERSION),
        meta_checkpoint_interval_sec=_as_int(extra, "meta_checkpoint_interval_sec", 60),
        meta_idle_quiet_ms=_as_int(extra, "meta_idle_quiet_ms", 100),
        meta_enable_periodic=bool(_as_bool(extra, "meta_enable_periodic", True)),
        meta_verify_on_load=bool(_as_bool(extra, "meta_verify_on_load", True)),
        max_data_transfer_size=_as_int(extra, "max_data_transfer_size", 0),
        load_checkpoint_on_init=bool(_as_bool(extra, "load_checkpoint_on_init", True)),
        io_engine=io_engine,
        iouring_queue_depth=_as_int(extra, "iouring_queue_depth", DEFAULT_IOURING_QUEUE_DEPTH),
        use_uring_cmd=bool(_as_bool(extra, "use_uring_cmd", False)),
        meta_checkpoint_placement_id=None if ckpt_pid is None else _as_int(extra, "meta_checkpoint_placement_id", 0),
        verify_payload_checksum=bool(_as_bool(extra, "verify_payload_checksum", False)),
    )


def _eviction_policy(extra: Mapping) -> str:
    value = _get(extra, "eviction_policy", "none")
    policy = str(value).strip().lower() if value is not None else "none"
    if policy not in EVICTION_POLICIES:
        raise ValueError(
            f"extra_config['{_key('eviction_policy')}'] must be one of {', '.join(EVICTION_POLICIES)}; "
            f"got {value!r}")
    return policy


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
        cfg = build_core_config(config, metadata, local_cpu_backend)
        self.device_path = cfg.device_path  # this rank's device, as LMCache's plugin exposes it
        self._core = RawBlockCore(cfg, key_namespace="legacy")
        try:
            if self._core.io_engine == "io_uring":
                try:
                    self._core.register_fixed_buffers_from_allocator(local_cpu_backend.get_memory_allocator())
                except Exception as e:  # noqa: BLE001
                    logger.warning("io_uring fixed-buffer registration failed (%s). Falling back to non-fixed "
                                   "buffer mode", e)
            self._warn_on_cross_rank_device(metadata)
        except BaseException:
            self._core.close()
            raise

        self._put_lock = threading.Lock()
        self._put_tasks: set[str] = set()  # encoded keys of writes scheduled and not finished
        self._pin_lock = threading.Lock()
        self._pinned_keys: set[str] = set()
        self._lru_lock = threading.Lock()
        self._lru: OrderedDict[str, None] = OrderedDict()
        if self.eviction_policy == "lru":
            # Recovered entries start in index order (oldest checkpointed first).
            for enc in self._core.snapshot_indexed_keys():
                self._lru[enc] = None
        self._close_lock = threading.Lock()
        self._closed = False

    def __str__(self) -> str:
        return "RustRawBlockBackend"

    def _warn_on_cross_rank_device(self, metadata: Any) -> None:
        if metadata is None:
            return
        first = self._core.first_encoded_key()
        if first is None:
            return
        try:
            stored_worker = int(decode_legacy_key(first).worker_id)
        except Exception:  # noqa: BLE001
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

    @property
    def _raw(self) -> Any:
        return self._core.raw_device()

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

    def report_status(self) -> dict:
        status = dict(self._core.report_status())
        status["eviction_policy"] = self.eviction_policy
        return status

    # ---- helpers ------------------------------------------------------------------------

    @staticmethod
    def _encode(key: Any) -> str:
        return key if isinstance(key, str) else key.to_string()

    def _lru_touch(self, encoded: list[str]) -> None:
        if self.eviction_policy != "lru" or not encoded:
            return
        with self._lru_lock:
            for enc in encoded:
                self._lru[enc] = None
                self._lru.move_to_end(enc)

    def _lru_forget(self, encoded: list[str]) -> None:
        if self.eviction_policy != "lru" or not encoded:
            return
        with self._lru_lock:
            for enc in encoded:
                self._lru.pop(enc, None)

    def _evict_lru(self, count: int, protect: set[str]) -> int:
        """Remove up to ``count`` least-recently-used entries nobody holds a lock on."""
        evicted = 0
        with self._lru_lock:
            candidates = [k for k in self._lru if k not in protect]
        for victim in candidates:
            if evicted >= count:
                break
            # force=False keeps entries that a reader or a pin holds; the pin lock keeps
            # pin() from taking a lock reference half-way through.
            with self._pin_lock:
                if victim in self._pinned_keys:
                    continue
                removed = self._core.delete_many([victim], force=False)[0]
            if removed:
                evicted += 1
                self._lru_forget([victim])
                logger.debug("raw-block LRU evicted %s", victim)
        return evicted

    def _put_with_policy(self, specs: list, objs: list) -> list[bool]:
        result = self._core.put_many(specs, objs)
        results = list(result.results)
        stored = list(result.stored_keys)
        # Evict only when the device is out of slots: a put that failed for another reason
        # (an I/O error) must not cost other keys their place.
        if self.eviction_policy == "lru" and not all(results) and self._core.usage()[0] >= 1.0:
            failed = [i for i, ok in enumerate(results) if not ok]
            batch_keys = {s.encoded for s in specs}
            if self._evict_lru(len(failed), protect=batch_keys):
                retry = self._core.put_many([specs[i] for i in failed], [objs[i] for i in failed])
                for i, ok in zip(failed, retry.results):
                    results[i] = ok
                stored += list(retry.stored_keys)
        self._lru_touch(stored)
        return results

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
        with self._pin_lock:
            removed = self._core.delete_many([enc], force=force)[0]
            if removed:
                self._pinned_keys.discard(enc)
        if removed:
            self._lru_forget([enc])
        return removed

    def batched_remove(self, keys: Any, force: bool = True) -> int:
        """Remove many keys with one pin-lock section and one native delete of all of them.

        Keys are encoded in C (LMCache's ``CacheEngineKey.to_string()`` layout; ``to_string()``
        itself for any other key object). When nothing is pinned and the policy is not LRU, the
        encoding and the core's delete happen in one native call; otherwise the encoded keys are
        kept to drop the removed ones from the pinned set / LRU list.
        """
        if not isinstance(keys, (list, tuple)):
            keys = list(keys)
        if not keys:
            return 0
        with self._pin_lock:
            if not self._pinned_keys and self.eviction_policy != "lru":
                # Nothing to reconcile afterwards: encode into one C buffer and delete in the
                # same native call (no str objects, GIL released for the whole batch).
                return self._core.delete_legacy_keys(keys, force)
            encoded = encode_legacy_keys(keys)
            results = self._core.delete_many(encoded, force=force)
            if self._pinned_keys:
                self._pinned_keys.difference_update(compress(encoded, results))
        if self.eviction_policy == "lru":
            self._lru_forget(list(compress(encoded, results)))
        return results.count(True)

    async def batched_async_contains(self, lookup_id: str, keys: list, pin: bool = False) -> int:
        encoded = encode_legacy_keys(keys)
        hits = 0
        for ok in self._core.exists_many(encoded, lock=False):
            if not ok:
                break
            hits += 1
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
        queued: list[tuple[Any, Any, Any]] = []
        for key, obj in zip(keys, objs):
            spec = encode_legacy_key(key)
            with self._put_lock:
                if spec.encoded in self._put_tasks:
                    continue
                self._put_tasks.add(spec.encoded)
            if self._core.contains_key(spec.encoded) or self._core.exists_inflight(spec.encoded):
                with self._put_lock:
                    self._put_tasks.discard(spec.encoded)
                continue
            obj.ref_count_up()
            queued.append((key, spec, obj))
        if not queued:
            return None
        if self._core.io_engine == "io_uring" and len(queued) > 1:
            batches = [queued]
        else:
            batches = [[item] for item in queued]
        futures = []
        for n, batch in enumerate(batches):
            coro = self._put_coro(batch, on_complete_callback)
            try:
                fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
            except BaseException:
                coro.close()
                # Nothing scheduled from here on will run: give back what it would have released.
                for later in batches[n:]:
                    self._release_put_items(later)
                raise
            futures.append(fut)
        return futures

    def _release_put_items(self, items: list) -> None:
        for _key, spec, obj in items:
            try:
                obj.ref_count_down()
            finally:
                with self._put_lock:
                    self._put_tasks.discard(spec.encoded)

    async def _put_coro(self, items: list, on_complete_callback: Any) -> None:
        try:
            specs = [spec for _key, spec, _obj in items]
            objs = [obj for _key, _spec, obj in items]
            results = await asyncio.to_thread(self._put_with_policy, specs, objs)
            failed = [spec.encoded for spec, ok in zip(specs, results) if not ok]
            if on_complete_callback is not None:
                for (key, _spec, _obj), ok in zip(items, results):
                    if ok:
                        try:
                            on_complete_callback(key)
                        except Exception:  # noqa: BLE001
                            logger.exception("on_complete_callback failed for %s", key)
            if failed:
                if len(items) == 1:
                    raise RuntimeError(f"Failed to persist raw-block key {failed[0]}")
                raise RuntimeError(f"Failed to persist raw-block keys: {', '.join(failed)}")
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
            for meta in metas:
                if meta.shape is None or meta.dtype is None:
                    logger.warning("raw-block entry without shape or dtype; stopping the prefix there")
                    break
                obj = self.local_cpu_backend.allocate(meta.shape, meta.dtype, meta.fmt)
                if obj is None:
                    logger.error("local_cpu_backend.allocate returned None; stopping the prefix there")
                    break
                allocated.append(obj)
            if not allocated:
                return []
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
        except BaseException:
            for obj in allocated:
                obj.ref_count_down()
            raise
        finally:
            if locked:
                self._core.unlock_many(locked)

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
            self._core.close()
            self._closed = True


__all__ = ["EVICTION_POLICIES", "RustRawBlockBackend", "build_core_config"]
