"""LMCache's plugin stack, for the tests that run inside the real LMCache (tests/conformance):
a LocalCPUBackend, an event loop in a thread as StorageManager has, and the storage plugins
LMCache's own loader creates from an LMCacheEngineConfig, ours or LMCache's Rust-backed one.
Importing it where LMCache is missing does not fail (the tests that use it skip there)."""

from __future__ import annotations

import asyncio
import collections
import threading

from helpers import lmcache_imports

with lmcache_imports():
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend import storage_plugin_launcher
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

MiB = 1 << 20
MODEL = "lmc-test-model"
CHUNK = 16  # tokens per chunk: kv_shape (2 layers, K+V, 16 tokens, 4 heads, 32 dims) -> 16 KiB bf16
KV_SHAPE = (2, 2, CHUNK, 4, 32)
PLUGIN_NAME = "raw_block"
OUR_MODULE = "lmcache_rawblock.plugin"
OUR_CLASS = "RustRawBlockBackend"
LMC_MODULE = "lmcache.v1.storage_backend.plugins.rust_raw_block_backend"


def make_metadata(world_size: int = 1, worker_id: int = 0) -> "LMCacheMetadata":
    return LMCacheMetadata(model_name=MODEL, world_size=world_size, local_world_size=world_size,
                           worker_id=worker_id, local_worker_id=worker_id, kv_dtype=torch.bfloat16,
                           kv_shape=KV_SHAPE, chunk_size=CHUNK)


def small_extra(device: str, module: str = OUR_MODULE, **keys) -> dict:
    extra = {
        f"storage_plugin.{PLUGIN_NAME}.module_path": module,
        f"storage_plugin.{PLUGIN_NAME}.class_name": OUR_CLASS,
        "rust_raw_block.device_path": device,
        "rust_raw_block.meta_total_bytes": 4 * MiB,
        "rust_raw_block.meta_enable_periodic": False,
    }
    extra.update({f"rust_raw_block.{k}": v for k, v in keys.items()})
    return extra


def make_config(extra: dict, **fields) -> "LMCacheEngineConfig":
    kw = dict(chunk_size=CHUNK, max_local_cpu_size=0.05, local_cpu=False,
              storage_plugins=[PLUGIN_NAME], extra_config=extra)
    kw.update(fields)
    return LMCacheEngineConfig.from_defaults(**kw)


class Stack:
    """A LocalCPUBackend + storage-manager-like loop thread + plugins loaded by LMCache."""

    def __init__(self, config, metadata=None):
        self.config = config
        self.metadata = metadata or make_metadata()
        self.local = LocalCPUBackend(config, self.metadata, "cpu")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="storage-manager-event-loop",
                                       daemon=True)
        self.thread.start()
        self.backends: list = []

    def launch(self):
        """Load the configured plugins through LMCache's own loader; the backend or None."""
        found: collections.OrderedDict = collections.OrderedDict()
        storage_plugin_launcher(self.config, self.metadata, self.loop, self.local, "cpu", found)
        be = found.get(PLUGIN_NAME)
        if be is not None:
            self.backends.append(be)
        return be

    def run(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def alloc(self, fill: int, tokens: int = CHUNK, dtype=None, positions: bool = False):
        shape = self.metadata.get_shapes(tokens)[0]
        obj = self.local.allocate(shape, dtype or torch.bfloat16)
        assert obj is not None
        raw = obj.tensor.view(torch.uint8)
        g = torch.Generator().manual_seed(fill)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))
        if positions:
            obj.metadata.cached_positions = torch.arange(fill, fill + tokens, dtype=torch.long)
        return obj

    def close(self):
        for be in self.backends:
            be.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.local.close()
