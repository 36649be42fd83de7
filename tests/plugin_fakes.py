"""Stand-ins for the LMCache objects the storage plugin talks to, for tests that run without
the ``lmcache`` package: a MemoryObj with LMCache's fields (``byte_array``, ``metadata``,
``data_ptr``, reference counting), a LocalCPUBackend with ``allocate`` and
``get_full_chunk_size_bytes``, an engine config with ``extra_config``, the worker metadata,
and an asyncio loop running in a thread (as StorageManager's is).

The tests marked ``lmcache`` use the real classes instead (tests/conformance/test_plugin_lmcache.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import math
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from lmcache_rawblock.raw_block._lmcache import CacheEngineKey, MemoryFormat

ITEMSIZE = {"bfloat16": 2, "half": 2, "float16": 2, "float": 4, "float32": 4, "uint8": 1, "int8": 1}


def dtype_name(dtype: Any) -> str:
    s = str(dtype)
    return s[len("torch."):] if s.startswith("torch.") else s


class FakeMemoryObj:
    """LMCache MemoryObj surface used by the plugin (no torch)."""

    def __init__(self, shape, dtype, fmt, payload: bytes | None = None):
        nbytes = math.prod(shape) * ITEMSIZE[dtype_name(dtype)]
        self._buf = (ctypes.c_uint8 * nbytes)()
        if payload is not None:
            assert len(payload) == nbytes
            ctypes.memmove(self._buf, payload, nbytes)
        self.byte_array = memoryview(self._buf).cast("B")
        self.metadata = SimpleNamespace(shape=list(shape), dtype=dtype, fmt=fmt, cached_positions=None)
        self._refs = 1
        self._lock = threading.Lock()

    @property
    def data_ptr(self) -> int:
        return ctypes.addressof(self._buf)

    def ref_count_up(self) -> None:
        with self._lock:
            self._refs += 1

    def ref_count_down(self) -> None:
        with self._lock:
            self._refs -= 1
            assert self._refs >= 0, "reference count went negative"

    def get_ref_count(self) -> int:
        return self._refs

    def tobytes(self) -> bytes:
        return bytes(self.byte_array)


class FakeLocalCPUBackend:
    """Allocates FakeMemoryObjs; ``fail_allocations`` makes allocate() return None."""

    def __init__(self, chunk_bytes: int = 8192):
        self.chunk_bytes = chunk_bytes
        self.allocated: list[FakeMemoryObj] = []
        self.fail_allocations = False

    def allocate(self, shape, dtype, fmt=None, eviction=True, busy_loop=True):
        # LMCache's allocate() reads a plain tuple as a *list of shapes*: a single shape must
        # come as a torch.Size (or a list).
        assert not (isinstance(shape, tuple) and type(shape).__name__ != "Size"), f"shape {shape!r} is a tuple"
        assert all(isinstance(d, int) for d in shape), f"shape {shape!r} must hold ints"
        if self.fail_allocations:
            return None
        obj = FakeMemoryObj(shape, dtype, fmt)
        self.allocated.append(obj)
        return obj

    def get_full_chunk_size_bytes(self) -> int:
        return self.chunk_bytes

    def get_memory_allocator(self):
        return SimpleNamespace(get_paged_buffers=lambda: [])


@dataclass
class FakeEngineConfig:
    extra_config: dict = field(default_factory=dict)


@dataclass
class FakeMetadata:
    world_size: int = 1
    worker_id: int = 0


class LoopThread:
    """An asyncio loop running forever in a daemon thread."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-storage-loop", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


SHAPE = (2, 16, 8, 16)  # 8 KiB of bfloat16
FMT = MemoryFormat.KV_T2D


def make_key(i: int, worker: int = 0, world: int = 1) -> CacheEngineKey:
    return CacheEngineKey("test_model", world, worker, 0x1000 + i, "bfloat16")


def make_obj(i: int) -> FakeMemoryObj:
    n = math.prod(SHAPE) * 2
    payload = bytes((i * 7 + j) & 0xFF for j in range(256)) * (n // 256)
    return FakeMemoryObj(SHAPE, "bfloat16", FMT, payload)


def base_extra(path: str, **overrides) -> dict:
    extra = {
        "rust_raw_block.device_path": path,
        "rust_raw_block.block_align": 4096,
        "rust_raw_block.header_bytes": 4096,
        "rust_raw_block.meta_total_bytes": 4 << 20,
        "rust_raw_block.meta_enable_periodic": False,
    }
    extra.update({f"rust_raw_block.{k}": v for k, v in overrides.items()})
    return extra
