"""The storage-plugin base class: LMCache's ``StoragePluginInterface`` when ``lmcache`` is
importable, otherwise a stand-in with the same constructor and the same default methods.

The stand-in exists so the plugin can be used and tested where LMCache (and torch) are not
installed. It mirrors the interface facts of ``lmcache.v1.storage_backend.abstract_backend``:
the nine abstract methods, and the defaults ``batched_contains`` (prefix loop over
``contains``), ``batched_get_blocking`` (one ``get_blocking`` per key, no prefix stop),
``batched_remove`` (per-key fan-out over ``remove``), the async methods raising
``NotImplementedError``, and ``cancel_request`` doing nothing.
"""

from __future__ import annotations

import abc
from typing import Any

HAVE_LMCACHE_PLUGIN_API = False
try:  # pragma: no cover - depends on the environment
    from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

    HAVE_LMCACHE_PLUGIN_API = True
except Exception:  # noqa: BLE001

    class StoragePluginInterface(metaclass=abc.ABCMeta):  # type: ignore[no-redef]
        """Stand-in for LMCache's StoragePluginInterface (used only without ``lmcache``)."""

        def __init__(self, dst_device: str = "cpu", config: Any = None, metadata: Any = None,
                     local_cpu_backend: Any = None, loop: Any = None) -> None:
            if not isinstance(dst_device, str) or not dst_device:
                raise ValueError(f"dst_device must be a device string such as 'cpu', got {dst_device!r}")
            self.dst_device = dst_device
            self.config = config
            self.metadata = metadata
            self.local_cpu_backend = local_cpu_backend
            self.loop = loop

        @abc.abstractmethod
        def contains(self, key: Any, pin: bool = False) -> bool: ...

        @abc.abstractmethod
        def exists_in_put_tasks(self, key: Any) -> bool: ...

        @abc.abstractmethod
        def batched_submit_put_task(self, keys, objs, transfer_spec=None, on_complete_callback=None): ...

        @abc.abstractmethod
        def get_blocking(self, key: Any) -> Any: ...

        @abc.abstractmethod
        def pin(self, key: Any) -> bool: ...

        @abc.abstractmethod
        def unpin(self, key: Any) -> bool: ...

        @abc.abstractmethod
        def remove(self, key: Any, force: bool = True) -> bool: ...

        @abc.abstractmethod
        def get_allocator_backend(self) -> Any: ...

        @abc.abstractmethod
        def close(self) -> None: ...

        async def async_batched_submit_put_task(self, keys, objs, transfer_spec=None,
                                                on_complete_callback=None):
            raise NotImplementedError

        def get_non_blocking(self, key, location=None):
            raise NotImplementedError

        async def batched_async_contains(self, lookup_id, keys, pin=False) -> int:
            raise NotImplementedError

        async def batched_get_non_blocking(self, lookup_id, keys, transfer_spec=None):
            raise NotImplementedError

        def batched_get_blocking(self, keys):
            return [self.get_blocking(k) for k in keys]

        def batched_remove(self, keys, force: bool = True) -> int:
            return sum(int(bool(self.remove(k, force=force))) for k in keys)

        def batched_contains(self, keys, pin: bool = False) -> int:
            n = 0
            for k in keys:
                if not self.contains(k, pin):
                    break
                n += 1
            return n

        def touch_cache(self) -> None:
            raise NotImplementedError

        def cancel_request(self, req_id: str) -> None:
            return None


__all__ = ["HAVE_LMCACHE_PLUGIN_API", "StoragePluginInterface"]
