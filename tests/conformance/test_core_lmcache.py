"""Format compatibility of the native RawBlockCore with LMCache's own RawBlockCore (the real
``lmcache.v1.storage_backend.raw_block`` over its Rust device), both ways, and core tests run
with LMCache's objects (CacheEngineKey, ObjectKey, MemoryObj from LMCache's allocator).

Marked ``lmcache``: run with ``make test-lmcache`` (virtualenv .venv-lmcache); the default run
deselects them. Each test skips with the reason when LMCache is not importable.
"""

from __future__ import annotations

import logging

import pytest

from core_helpers import META, SLOT, make_config, make_device
from helpers import lmcache_imports
from lmcache_rawblock import lmcache_paths

with lmcache_imports() as lmc:
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_allocators.host_memory_allocator import HostMemoryAllocator
    from lmcache.v1.memory_management import MemoryFormat
    lmc_rb = lmcache_paths.import_raw_block()  # where the installed LMCache version has it

from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig  # noqa: E402

pytestmark = lmc.marks

logging.getLogger("LMCache").setLevel(logging.ERROR)


def _cfg_kwargs(dev, **kw):
    base = dict(make_config(dev).__dict__)
    for k in list(base):
        if k not in lmc_rb.RawBlockCoreConfig.__dataclass_fields__:
            base.pop(k)
    base.update(kw)
    return base


def theirs(dev, namespace="object", **kw):
    return lmc_rb.RawBlockCore(lmc_rb.RawBlockCoreConfig(**_cfg_kwargs(dev, **kw)), key_namespace=namespace)


def ours(dev, namespace="object", **kw):
    # format v1 unless a test names the format: these tests hand devices back and forth
    kw.setdefault("meta_format", "v1")
    extra = {k: kw.pop(k) for k in list(kw) if k in ("verify_payload_checksum", "meta_format")}
    return RawBlockCore(RawBlockCoreConfig(**_cfg_kwargs(dev, **kw), **extra), key_namespace=namespace)


@pytest.fixture
def alloc():
    a = HostMemoryAllocator(64 << 20)
    yield a


def _objects(alloc, n, seed=0):
    """LMCache MemoryObjs with varied shapes, dtypes, formats and cached positions."""
    kinds = [(torch.Size([2, 3, 16]), torch.bfloat16, MemoryFormat.KV_2LTD),
             (torch.Size([1000]), torch.uint8, MemoryFormat.BINARY),
             (torch.Size([4, 257]), torch.float16, MemoryFormat.KV_T2D),
             (torch.Size([3, 5, 7]), torch.float32, MemoryFormat.KV_2LTD)]
    g = torch.Generator().manual_seed(seed)
    objs = []
    for i in range(n):
        shape, dtype, fmt = kinds[i % len(kinds)]
        o = alloc.allocate(shape, dtype, fmt=fmt)
        raw = o.byte_array
        data = torch.randint(0, 256, (len(raw),), dtype=torch.uint8, generator=g)
        memoryview(raw).cast("B")[:] = data.numpy().tobytes()
        if i % 3 == 0:
            o.metadata.cached_positions = torch.arange(i, i + 5, dtype=torch.int64)
        objs.append(o)
    return objs


def _object_keys(n, model="compat"):
    from lmcache_rawblock.raw_block import encode_object_key
    from lmcache_rawblock.raw_block._lmcache import ObjectKey

    return [encode_object_key(ObjectKey(chunk_hash=(i * 7919).to_bytes(8, "big"), model_name=model, kv_rank=0))
            for i in range(n)]


def _legacy_keys(n):
    return [lmc_rb.encode_legacy_key(CacheEngineKey("compat-model", 1, 0, 0x1234_0000 + i, torch.bfloat16))
            for i in range(n)]


def _blank_like(alloc, objs):
    return [alloc.allocate(o.metadata.shape, o.metadata.dtype, fmt=o.metadata.fmt) for o in objs]


def _bytes(o):
    return bytes(memoryview(o.byte_array).cast("B"))


def _meta_tuple(m):
    pos = None if m.cached_positions is None else [int(x) for x in m.cached_positions]
    return (m.path.rsplit("@", 1)[1], m.size, tuple(m.shape) if m.shape is not None else None, m.dtype, m.fmt, pos)


def _check_same(reader, writer_meta, keys, objs, alloc):
    enc = [k.encoded for k in keys]
    assert reader.exists_many(enc) == [True] * len(enc)
    assert sorted(reader.snapshot_indexed_keys()) == sorted(enc)
    outs = _blank_like(alloc, objs)
    assert reader.load_many_into(enc, outs) == [True] * len(enc)
    assert [_bytes(o) for o in outs] == [_bytes(o) for o in objs]
    got = [_meta_tuple(m) for m in reader.get_metadata_many(enc)]
    assert got == writer_meta


@pytest.mark.parametrize("writer_engine", ["posix", "io_uring"])
@pytest.mark.parametrize("reader_engine", ["posix", "io_uring"])
@pytest.mark.parametrize("namespace", ["object", "legacy"])
def test_lmcache_writes_ours_reads(tmp_path, alloc, writer_engine, reader_engine, namespace):
    dev = make_device(tmp_path)
    keys = _object_keys(24) if namespace == "object" else _legacy_keys(24)
    objs = _objects(alloc, 24)
    w = theirs(dev, namespace, io_engine=writer_engine)
    assert w.put_many(keys, objs).results == [True] * 24
    w.delete_many([keys[5].encoded])
    keys, objs = keys[:5] + keys[6:], objs[:5] + objs[6:]
    meta = [_meta_tuple(m) for m in w.get_metadata_many([k.encoded for k in keys])]
    w.close()  # LMCache's final checkpoint
    r = ours(dev, namespace, io_engine=reader_engine)
    try:
        assert r.report_status()["recovery_dropped_entries"] == 0
        _check_same(r, meta, keys, objs, alloc)
    finally:
        r.close()


@pytest.mark.parametrize("writer_engine", ["posix", "io_uring"])
@pytest.mark.parametrize("checksum", [False, True])
@pytest.mark.parametrize("namespace", ["object", "legacy"])
def test_ours_writes_lmcache_reads(tmp_path, alloc, writer_engine, checksum, namespace):
    dev = make_device(tmp_path)
    keys = _object_keys(24) if namespace == "object" else _legacy_keys(24)
    objs = _objects(alloc, 24, seed=1)
    w = ours(dev, namespace, io_engine=writer_engine, verify_payload_checksum=checksum)
    assert w.put_many(keys, objs).results == [True] * 24
    w.delete_many([keys[7].encoded])
    keys, objs = keys[:7] + keys[8:], objs[:7] + objs[8:]
    meta = [_meta_tuple(m) for m in w.get_metadata_many([k.encoded for k in keys])]
    w.close()
    for engine in ("posix", "io_uring"):
        r = theirs(dev, namespace, io_engine=engine)
        try:
            _check_same(r, meta, keys, objs, alloc)
        finally:
            r.close()
    # and back: ours still reads what LMCache's close wrote (it re-checkpoints only if dirty)
    r = ours(dev, namespace, verify_payload_checksum=checksum)
    try:
        _check_same(r, meta, keys, objs, alloc)
    finally:
        r.close()


@pytest.mark.parametrize("namespace", ["object", "legacy"])
def test_lmcache_device_moves_to_the_log_format_and_lmcache_then_starts_empty(tmp_path, alloc, namespace):
    # A device LMCache 0.5.6 wrote (v1) opens in the log format with every entry and moves at
    # its first checkpoint; LMCache's core then finds no checkpoint of its format (it starts
    # empty, misreads nothing), and ours still reads the log after LMCache has opened it.
    dev = make_device(tmp_path)
    keys = _object_keys(30) if namespace == "object" else _legacy_keys(30)
    objs = _objects(alloc, 30, seed=3)
    w = theirs(dev, namespace)
    assert w.put_many(keys[:24], objs[:24]).results == [True] * 24
    meta = [_meta_tuple(m) for m in w.get_metadata_many([k.encoded for k in keys[:24]])]
    w.close()
    r = ours(dev, namespace, meta_format="log")
    try:
        assert r.report_status()["recovery_outcome"] == "loaded"
        _check_same(r, meta, keys[:24], objs[:24], alloc)
        assert r.put_many(keys[24:], objs[24:]).results == [True] * 6
        r.checkpoint_now()
        assert r.report_status()["metadata_log"]["state"] == "live"
        meta = [_meta_tuple(m) for m in r.get_metadata_many([k.encoded for k in keys])]
    finally:
        r.close()
    t = theirs(dev, namespace)
    try:
        assert t.indexed_key_count() == 0
        outs = _blank_like(alloc, objs[:3])
        assert t.load_many_into([k.encoded for k in keys[:3]], outs) == [False] * 3
    finally:
        t.close()
    r = ours(dev, namespace, meta_format="log")
    try:
        _check_same(r, meta, keys, objs, alloc)
    finally:
        r.close()


def test_interleaved_writers_share_one_device(tmp_path, alloc):
    """LMCache writes, ours adds and deletes, LMCache adds: every reader sees the union."""
    dev = make_device(tmp_path)
    keys = _object_keys(30)
    objs = _objects(alloc, 30, seed=2)
    a = theirs(dev)
    a.put_many(keys[:10], objs[:10])
    a.close()
    b = ours(dev, io_engine="io_uring")
    assert b.indexed_key_count() == 10
    b.put_many(keys[10:20], objs[10:20])
    b.delete_many([keys[0].encoded])
    b.close()
    c = theirs(dev)
    assert c.indexed_key_count() == 19
    c.put_many(keys[20:], objs[20:])
    c.close()
    d = ours(dev)
    try:
        live = list(range(1, 30))
        meta = [_meta_tuple(m) for m in d.get_metadata_many([keys[i].encoded for i in live])]
        _check_same(d, meta, [keys[i] for i in live], [objs[i] for i in live], alloc)
        # LMCache reused slot 0 (freed by our delete) or a fresh one; no two keys share a slot
        offs = [m[0] for m in meta]
        assert len(set(offs)) == len(offs)
    finally:
        d.close()


# ---- our core tests with LMCache's objects -----------------------------------------------

@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_core_round_trip_with_lmcache_objects(tmp_path, alloc, engine):
    dev = make_device(tmp_path)
    c = ours(dev, "legacy", io_engine=engine)
    keys = _legacy_keys(6)
    objs = _objects(alloc, 6, seed=3)
    try:
        r = c.put_many(keys, objs)
        assert r.results == [True] * 6 and r.stored_keys == [k.encoded for k in keys]
        outs = _blank_like(alloc, objs)
        assert c.load_many_into([k.encoded for k in keys], outs, raise_on_error=True) == [True] * 6
        assert [_bytes(o) for o in outs] == [_bytes(o) for o in objs]
        # cached_positions come back into the destination objects as LMCache tensors
        assert torch.equal(outs[0].metadata.cached_positions, objs[0].metadata.cached_positions)
        md = c.get_metadata_many([keys[0].encoded])[0]
        assert md.dtype == torch.bfloat16 and md.fmt == MemoryFormat.KV_2LTD and tuple(md.shape) == (2, 3, 16)
        assert c.exists_many([keys[1].encoded], lock=True) == [True]
        assert c.delete_many([keys[1].encoded]) == [False]  # locked
        c.unlock_many([keys[1].encoded])
        assert c.delete_many([keys[1].encoded, keys[1].encoded]) == [True, False]
        assert c.get_metadata_prefix([k.encoded for k in keys]) != []
    finally:
        c.close()


def test_register_fixed_buffers_from_lmcache_tensors(tmp_path, alloc):
    dev = make_device(tmp_path)
    c = ours(dev, io_engine="io_uring")

    class Paged:
        def __init__(self):
            self.bufs = [torch.zeros(1 << 20, dtype=torch.uint8), torch.zeros(1 << 20, dtype=torch.uint8)]

        def get_paged_buffers(self):
            return self.bufs

    p = Paged()
    try:
        c.register_fixed_buffers_from_allocator(p)
        assert c.report_status()["rust_io"]["fixed_buffer_attempts"] == 0
    finally:
        c.close()


@pytest.mark.parametrize("namespace", ["object", "legacy"])
def test_inspect_and_verify_a_device_written_by_lmcache(tmp_path, alloc, namespace):
    from lmcache_rawblock import tools

    dev = make_device(tmp_path)
    keys = _object_keys(10) if namespace == "object" else _legacy_keys(10)
    w = theirs(dev, namespace)
    assert w.put_many(keys, _objects(alloc, 10)).results == [True] * 10
    w.close()
    info = tools.inspect_device(dev)
    assert info["geometry"]["entries"] == 10 and info["geometry"]["slot_bytes"] == SLOT
    res = tools.verify_device(dev)
    assert res["checked"] == 10 and res["ok"] == 10 and res["checksums_checked"] == 0
    # A stale header (another key's identity) is reported, as LMCache's recovery would drop it.
    entry = info["sample_entries"][0]
    with open(dev, "r+b") as f:
        f.seek(entry["offset"] + 8)
        f.write((12345).to_bytes(8, "little"))
    res = tools.verify_device(dev)
    assert res["ok"] == 9 and res["mismatches"][0]["key"] == entry["key"]


@pytest.mark.parametrize("writer_engine", ["posix", "io_uring"])
@pytest.mark.parametrize("namespace", ["object", "legacy"])
def test_lmcache_device_opens_fast_and_slot_reuse_is_a_miss(tmp_path, alloc, writer_engine, namespace):
    """A device written by LMCache's core, opened with meta_verify_on_load=False: every entry
    loads (judged by its first load), and a slot LMCache reused after its last checkpoint
    serves the other key's bytes from LMCache's core but is a miss in ours (an unvalidated
    entry's slot header is checked at its first load)."""
    dev = make_device(tmp_path)
    keys = _object_keys(13) if namespace == "object" else _legacy_keys(13)
    objs = _objects(alloc, 13, seed=2)
    k1, k2 = keys[0], keys[12]
    o1, o2 = objs[0], objs[4]  # same shape/dtype/fmt: equal payload lengths
    w = theirs(dev, namespace, io_engine=writer_engine)
    assert w.put_many(keys[:12], objs[:12]).results == [True] * 12
    w.checkpoint_now()
    with open(dev, "rb") as f:
        ckpt = f.read(META)
    slot = w.entry_offset(k1.encoded)
    w.delete_many([k1.encoded])
    assert w.put_many([k2], [o2]).results == [True]
    assert w.entry_offset(k2.encoded) == slot
    w.close()
    with open(dev, "r+b") as f:  # crash: the metadata region as of the last checkpoint
        f.write(ckpt)
    rest = list(zip(keys[1:12], objs[1:12]))

    lmc = theirs(dev, namespace, meta_verify_on_load=False)
    try:
        out = _blank_like(alloc, [o1])
        assert lmc.load_many_into([k1.encoded], out) == [True]  # LMCache: K2's bytes as K1's
        assert _bytes(out[0]) == _bytes(o2)
    finally:
        lmc.close()
    with open(dev, "r+b") as f:
        f.write(ckpt)

    for engine in ("posix", "io_uring"):
        r = ours(dev, namespace, io_engine=engine, meta_verify_on_load=False)
        try:
            assert r.report_status()["unverified_entry_count"] == 12
            outs = _blank_like(alloc, [o1] + [o for _, o in rest])
            got = r.load_many_into([k1.encoded] + [k.encoded for k, _ in rest], outs)
            assert got == [False] + [True] * 11
            assert _bytes(outs[0]) != _bytes(o2)
            assert [_bytes(o) for o in outs[1:]] == [_bytes(o) for _, o in rest]
            st = r.report_status()
            assert (st["load_dropped_entries"], st["load_verified_entries"], st["unverified_entry_count"]) == (1, 11, 0)
        finally:
            r._native.close()
        with open(dev, "r+b") as f:
            f.write(ckpt)


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_tensor_memory_objs_are_read_without_byte_array(tmp_path, alloc, engine, monkeypatch):
    # The C side reads LMCache's TensorMemoryObj through raw_data.data_ptr() / get_size():
    # with byte_array broken, put and load still move exactly get_size() bytes.
    import lmcache.v1.memory_management as mm

    dev = make_device(tmp_path)
    c = ours(dev, io_engine=engine)
    keys = _object_keys(4, model="fastpath")
    objs = _objects(alloc, 4, seed=5)
    assert all(type(o) is mm.TensorMemoryObj for o in objs)
    want = [_bytes(o) for o in objs]
    outs = _blank_like(alloc, objs)

    def broken(*a, **k):
        raise AssertionError("byte_array was used")

    monkeypatch.setattr(mm.ctypes, "cast", broken)
    try:
        assert c.put_many(keys, objs).results == [True] * 4
        assert c.load_many_into([k.encoded for k in keys], outs, raise_on_error=True) == [True] * 4
    finally:
        monkeypatch.undo()
        c.close()
    assert [_bytes(o) for o in outs] == want
