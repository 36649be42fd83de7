"""Payloads handed out by LMCache's own LocalCPUBackend allocator, on both engines, buffered
and O_DIRECT.

With io_uring, LocalCPUBackend uses a paged allocator: a partial chunk is a page whose
``raw_data`` is narrowed to the logical bytes while ``get_size()`` (and so ``byte_array``,
which LMCache's core writes and reads) stays the whole page. Our core must store and load the
same bytes LMCache's core does, and devices must stay interchangeable.

Marked ``lmcache``: run with ``make test-lmcache``.
"""

from __future__ import annotations

import logging

import pytest

from core_helpers import make_config, make_device
from helpers import lmcache_imports
from lmcache_rawblock import lmcache_paths

with lmcache_imports() as lmc:
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    lmc_rb = lmcache_paths.import_raw_block()  # where the installed LMCache version has it

from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig, encode_object_key  # noqa: E402
from lmcache_rawblock.raw_block._lmcache import ObjectKey  # noqa: E402

pytestmark = lmc.marks

logging.getLogger("LMCache").setLevel(logging.ERROR)

CHUNK = 64  # tokens: kv_shape (2, 2, 64, 4, 32) bf16 -> 64 KiB per full chunk
KV_SHAPE = (2, 2, CHUNK, 4, 32)
FULL = 2 * 2 * CHUNK * 4 * 32 * 2
SLOT = 4096 + FULL


def _local(device: str, odirect: bool, engine: str) -> "LocalCPUBackend":
    extra = {"rust_raw_block.device_path": device, "rust_raw_block.meta_format": "v1",
             "rust_raw_block.use_odirect": odirect,
             "rust_raw_block.io_engine": engine}
    cfg = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, max_local_cpu_size=0.02, local_cpu=False,
                                            extra_config=extra)
    md = LMCacheMetadata(model_name="conf", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                         kv_dtype=torch.bfloat16, kv_shape=KV_SHAPE, chunk_size=CHUNK)
    return LocalCPUBackend(cfg, md, "cpu"), md


def _cfg_kwargs(dev, **kw):
    base = dict(make_config(dev, slot_bytes=SLOT).__dict__)
    for k in list(base):
        if k not in lmc_rb.RawBlockCoreConfig.__dataclass_fields__:
            base.pop(k)
    base.update(kw)
    return base


def _ours(dev, **kw):
    # format v1: these devices are handed to LMCache's own core
    return RawBlockCore(RawBlockCoreConfig(**_cfg_kwargs(dev, **kw), meta_format="v1"), key_namespace="object")


def _theirs(dev, **kw):
    return lmc_rb.RawBlockCore(lmc_rb.RawBlockCoreConfig(**_cfg_kwargs(dev, **kw)), key_namespace="object")


def _bytes(o) -> bytes:
    return bytes(memoryview(o.byte_array).cast("B"))


def _fill(local, md, tokens: int, seed: int):
    o = local.allocate(md.get_shapes(tokens)[0], torch.bfloat16)
    assert o is not None
    view = memoryview(o.byte_array).cast("B")
    g = torch.Generator().manual_seed(seed)
    view[:] = torch.randint(0, 256, (len(view),), dtype=torch.uint8, generator=g).numpy().tobytes()
    return o


def _keys(n, tag):
    return [encode_object_key(ObjectKey(chunk_hash=(i + 1).to_bytes(8, "big"), model_name=tag, kv_rank=0))
            for i in range(n)]


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
@pytest.mark.parametrize("odirect", [False, True], ids=["buffered", "odirect"])
def test_allocator_partial_chunks_round_trip_like_lmcache(tmp_path, engine, odirect):
    """Full and partial chunks from LocalCPUBackend's allocator: put, load into fresh
    allocations, same bytes and same stored size as LMCache's core (get_size())."""
    dev = make_device(tmp_path)
    local, md = _local(dev, odirect, engine)
    try:
        objs = [_fill(local, md, t, seed=t) for t in (CHUNK, 16, 1, CHUNK - 1)]
        if engine == "io_uring":
            # The allocator that made this defect visible: partial pages keep get_size() at the page.
            assert any(o.get_size() > o.raw_data.nbytes for o in objs)
        keys = _keys(len(objs), f"alloc-{engine}-{int(odirect)}")
        enc = [k.encoded for k in keys]
        core = _ours(dev, io_engine=engine, use_odirect=odirect, enable_zero_copy=odirect)
        try:
            if engine == "io_uring":
                core.register_fixed_buffers_from_allocator(local.get_memory_allocator())
            res = core.put_many(keys, objs)
            assert res.results == [True] * len(objs)
            assert [m.size for m in core.get_metadata_many(enc)] == [o.get_size() for o in objs]
            outs = [local.allocate(o.metadata.shape, torch.bfloat16) for o in objs]
            assert core.load_many_into(enc, outs, raise_on_error=True) == [True] * len(objs)
            assert [_bytes(o) for o in outs] == [_bytes(o) for o in objs]
        finally:
            core.close()
        # LMCache's own core reads what ours wrote: same sizes, same bytes.
        theirs = _theirs(dev, io_engine=engine, use_odirect=odirect, enable_zero_copy=odirect)
        try:
            assert [m.size for m in theirs.get_metadata_many(enc)] == [o.get_size() for o in objs]
            outs = [local.allocate(o.metadata.shape, torch.bfloat16) for o in objs]
            assert theirs.load_many_into(enc, outs) == [True] * len(objs)
            assert [_bytes(o) for o in outs] == [_bytes(o) for o in objs]
        finally:
            theirs.close()
    finally:
        local.close()


def _detached(raw: "torch.Tensor", size: int) -> "TensorMemoryObj":
    meta = MemoryObjMetadata(torch.Size([size]), torch.uint8, 0, size, 1, 0, MemoryFormat.BINARY)
    obj = TensorMemoryObj(raw_data=raw, metadata=meta, parent_allocator=None)
    return obj


def test_get_size_past_the_tensor_storage_is_refused(tmp_path):
    """get_size() larger than raw_data is served from the storage behind it; reaching past the
    storage is a ValueError naming the payload, before any I/O."""
    dev = make_device(tmp_path)
    backing = torch.arange(8192, dtype=torch.int32).to(torch.uint8)
    inside = _detached(backing[4096:4096 + 100], 4096)  # 100-byte view, 4096 bytes of storage after it
    outside = _detached(backing[4096:4096 + 100], 4097)
    core = _ours(dev)
    try:
        k = _keys(2, "storage")
        assert core.put_many([k[0]], [inside]).results == [True]
        assert core.get_metadata_many([k[0].encoded])[0].size == 4096
        with pytest.raises(ValueError, match=r"payload 0: get_size\(\) = 4097 .*storage"):
            core.put_many([k[1]], [outside])
        assert core.exists_many([k[1].encoded]) == [False]
        out = torch.zeros(8192, dtype=torch.uint8)
        target = _detached(out[:10], 4096)
        assert core.load_many_into([k[0].encoded], [target], raise_on_error=True) == [True]
        assert bytes(out[:4096].numpy()) == bytes(backing[4096:].numpy())
        with pytest.raises(ValueError, match=r"payload 0: get_size\(\) = 4097"):
            core.load_many_into([k[0].encoded], [_detached(out[4096:4100], 4097)])
    finally:
        core.close()
