"""RustRawBlockBackend inside the real LMCache (0.5.x, CPU-only torch).

Run with ``make test-lmcache`` (the virtualenv .venv-lmcache). Everything here is marked
``lmcache`` and skips, with the reason, when LMCache is not importable. The plugin is loaded
the way LMCache loads it (``storage_plugin_launcher`` from an ``LMCacheEngineConfig``), with a
real ``LocalCPUBackend`` and ``LMCacheMetadata`` and an asyncio loop in a thread (as
StorageManager has), and is then driven with real ``MemoryObj``s:

* store / look up / pin / retrieve / remove through the plugin API, checking bytes, shapes,
  dtypes, formats, ``cached_positions``, and that every MemoryObj's reference count comes
  back (and the allocator has no allocation left over);
* the README configuration in both forms (YAML file, environment variables);
* StorageManager.batched_put / batched_get / get / contains / batched_contains /
  batched_remove;
* behaviours of LMCache's own plugin tests that need LMCache objects (legacy dtype recovery,
  LayerCacheEngineKey, tagged keys, the loader swallowing constructor errors);
* devices written by LMCache's own RustRawBlockBackend (Rust wheel) open in ours with every
  entry and identical bytes, and the reverse.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest

from core_helpers import odirect_ok
from helpers import REPO, lmcache_imports, rust_module
from lmcache_rawblock import lmcache_paths
from lmcache_stack import (
    CHUNK, LMC_MODULE, MODEL, OUR_CLASS, OUR_MODULE, PLUGIN_NAME, Stack, make_config, make_metadata, small_extra,
)

with lmcache_imports() as lmc:
    import torch
    from lmcache.utils import CacheEngineKey, LayerCacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.storage_backend import storage_plugin_launcher
    from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

pytestmark = lmc.marks

MiB = 1 << 20

# ---------------------------------------------------------------------------------------
# The README examples, verbatim. Tests substitute README_DEVICE with a sparse file and add
# the sizes a CPU-only test needs (chunk_size, max_local_cpu_size) around them.
README_DEVICE = "/dev/nvme0n1"

def _readme_examples() -> tuple[str, dict[str, str]]:
    """The YAML and the environment-variable examples of README.md's plugin section, as
    written there: these tests keep the README true."""
    import re
    import shlex

    text = (REPO / "README.md").read_text()
    section = text[text.index("## Configure it in LMCache (the plugin)"):]
    yaml_block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    sh_block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    env = {}
    for tok in shlex.split(sh_block):
        if tok != "export" and "=" in tok:
            name, _, value = tok.partition("=")
            env[name] = value
    return yaml_block, env


README_YAML, README_ENV = _readme_examples()
# ---------------------------------------------------------------------------------------


def sparse(path: Path, size: int) -> str:
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


def key(i: int, *, worker: int = 0, world: int = 1, dtype=None, tags: dict | None = None) -> "CacheEngineKey":
    return CacheEngineKey(MODEL, world, worker, 0xABC000 + i, dtype or torch.bfloat16,
                          dict(tags) if tags else {})


def active_allocations(local: "LocalCPUBackend") -> int:
    alloc = local.get_memory_allocator()
    inner = getattr(alloc, "pin_allocator", alloc)
    return int(inner.num_active_allocations)


@pytest.fixture
def stacks():
    made: list[Stack] = []

    def make(config, metadata=None) -> Stack:
        s = Stack(config, metadata)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture
def our(tmp_path, stacks):
    """Our plugin, loaded by LMCache from extra_config, on a 64 MiB sparse file."""
    st = stacks(make_config(small_extra(sparse(tmp_path / "dev.img", 64 * MiB))))
    be = st.launch()
    assert be is not None, "LMCache's loader did not create the plugin (see the log for the error)"
    return st, be


def put_and_wait(be, keys, objs, timeout=30):
    futs = be.batched_submit_put_task(keys, objs)
    for f in futs or []:
        f.result(timeout)
    return futs


def raw_bytes(obj) -> bytes:
    return bytes(obj.byte_array)


def assert_same(got, want):
    assert got is not None
    assert got.metadata.shape == want.metadata.shape and isinstance(got.metadata.shape, torch.Size)
    assert got.metadata.dtype == want.metadata.dtype
    assert got.metadata.fmt == want.metadata.fmt
    assert raw_bytes(got) == raw_bytes(want)
    assert torch.equal(got.tensor.view(torch.uint8), want.tensor.view(torch.uint8))  # NaN-safe
    if want.metadata.cached_positions is None:
        assert got.metadata.cached_positions is None
    else:
        assert torch.equal(got.metadata.cached_positions, want.metadata.cached_positions)


def release(objs):
    for o in objs:
        if o is not None:
            o.ref_count_down()


# --------------------------------------------------------------------------- loading


def test_loader_creates_our_plugin_under_its_name(our):
    st, be = our
    assert type(be).__module__ == OUR_MODULE and type(be).__name__ == OUR_CLASS
    assert isinstance(be, StoragePluginInterface), "subclasses LMCache's own StoragePluginInterface"
    assert str(be) == "RustRawBlockBackend" and be.dst_device == "cpu"
    assert be.loop is st.loop and be.local_cpu_backend is st.local and be.metadata is st.metadata
    assert be.get_allocator_backend() is st.local
    # Default slot size: header + LocalCPUBackend's full chunk, rounded to the block.
    assert st.local.get_full_chunk_size_bytes() == 16 * 1024
    assert be.slot_bytes == 4096 + 16 * 1024


def test_loader_swallows_constructor_errors(tmp_path, stacks, caplog):
    """LMCache logs and skips a plugin whose constructor raises; the engine starts without it."""
    missing = str(tmp_path / "absent" / "dev.img")
    st = stacks(make_config(small_extra(missing)))
    with caplog.at_level(logging.ERROR):
        assert st.launch() is None
    found: collections.OrderedDict = collections.OrderedDict()
    storage_plugin_launcher(st.config, st.metadata, st.loop, None, "cpu", found)
    assert PLUGIN_NAME not in found, "no local_cpu_backend -> ValueError -> not loaded"


# --------------------------------------------------------------------------- the plugin API


def test_store_lookup_retrieve_remove(our):
    st, be = our
    base = active_allocations(st.local)
    objs = [st.alloc(i, positions=(i % 2 == 1)) for i in range(4)]
    objs.append(st.alloc(99, tokens=5, positions=True))  # a partial (unfull) chunk
    keys = [key(i) for i in range(5)]
    futs = put_and_wait(be, keys, objs)
    assert futs and all(f.done() and f.exception() is None for f in futs)
    assert all(o.get_ref_count() == 1 for o in objs), "the plugin gives back every reference it took"
    assert not any(be.exists_in_put_tasks(k) for k in keys)
    assert be.batched_submit_put_task(keys[:1], objs[:1]) is None, "already stored -> nothing to do"

    # Lookups: contains, the prefix batched_contains (base class) and batched_async_contains.
    missing = key(1000)
    assert all(be.contains(k) for k in keys) and not be.contains(missing)
    assert be.batched_contains(keys) == 5
    assert be.batched_contains([keys[0], keys[1], missing, keys[2]]) == 2
    assert st.run(be.batched_async_contains("lookup-1", keys)) == 5
    assert st.run(be.batched_async_contains("lookup-2", [keys[0], missing, keys[1]])) == 1
    assert st.run(be.batched_async_contains("lookup-3", [missing] + keys)) == 0

    # Retrieval: bytes, shapes, dtypes, formats and cached_positions of real MemoryObjs.
    got = be.get_blocking(keys[4])
    assert_same(got, objs[4])
    assert got.metadata.shape[2] == 5 and got.get_ref_count() == 1
    release([got])
    assert be.get_blocking(missing) is None

    got = be.batched_get_blocking(keys)
    assert len(got) == 5
    for g, o in zip(got, objs):
        assert_same(g, o)
    release(got)
    got = be.batched_get_blocking([keys[0], keys[1], missing, keys[3]])
    assert got[2] is None and got[3] is None, "prefix semantics: stop at the first miss"
    assert_same(got[0], objs[0])
    assert_same(got[1], objs[1])
    release(got)
    assert be.batched_get_blocking([]) == []

    got = st.run(be.batched_get_non_blocking("lookup-4", [keys[2], keys[3], missing, keys[4]],
                                             {"cum_chunk_lengths": [0, 16, 32, 48, 53]}))
    assert len(got) == 2, "non-blocking get returns the loaded prefix only"
    assert_same(got[0], objs[2])
    assert_same(got[1], objs[3])
    release(got)
    assert be.inflight_io_count() == 0

    # Removal: remove and batched_remove count 0/1 per key.
    assert be.remove(keys[0]) is True and be.remove(keys[0]) is False
    assert not be.contains(keys[0])
    assert be.batched_remove([keys[1], missing, keys[2], keys[1]]) == 2
    assert be.batched_remove(keys[3:]) == 2
    assert be.indexed_key_count() == 0 and be.batched_contains(keys) == 0
    assert be.batched_remove([]) == 0

    assert all(o.get_ref_count() == 1 for o in objs)
    release(objs)
    assert active_allocations(st.local) == base, "every allocation went back to LocalCPUBackend"


def test_pin_unpin_and_forced_removal(our):
    st, be = our
    objs = [st.alloc(i) for i in range(3)]
    keys = [key(i) for i in range(3)]
    put_and_wait(be, keys, objs)
    enc = [k.to_string() for k in keys]

    assert be.pin(keys[0]) and be.contains(keys[0], pin=True) and be.pin(keys[0])
    assert be.lock_refcount(enc[0]) == 1, "however often pinned, one lock reference"
    assert be.batched_contains(keys, pin=True) == 3
    assert [be.lock_refcount(e) for e in enc] == [1, 1, 1]
    assert be.unpin(keys[1]) and be.unpin(keys[2]) and be.unpin(keys[2])
    assert [be.lock_refcount(e) for e in enc] == [1, 0, 0]
    assert not be.pin(key(1000)) and not be.unpin(key(1000))

    # A pinned entry survives removal without force; reads of it do not drop the pin.
    got = be.get_blocking(keys[0])
    assert_same(got, objs[0])
    release([got])
    assert be.lock_refcount(enc[0]) == 1
    assert be.remove(keys[0], force=False) is False
    assert be.batched_remove(keys, force=False) == 2
    assert be.contains(keys[0]) and not be.contains(keys[1])
    assert be.batched_remove([keys[0]], force=True) == 1 and not be.contains(keys[0])
    assert be.unpin(keys[0]) is False

    # batched_async_contains(pin=True) pins the hit prefix.
    put_and_wait(be, keys, objs)
    assert st.run(be.batched_async_contains("l", [keys[0], keys[1], key(1000), keys[2]], pin=True)) == 2
    assert [be.lock_refcount(e) for e in enc] == [1, 1, 0]
    assert be.unpin(keys[0]) and be.unpin(keys[1])
    assert [be.lock_refcount(e) for e in enc] == [0, 0, 0]
    assert all(o.get_ref_count() == 1 for o in objs)
    release(objs)


def test_close_then_reload_from_checkpoint(tmp_path, stacks):
    """LMCache can close and re-create a backend on the same device (recreate_backend)."""
    cfg = make_config(small_extra(sparse(tmp_path / "dev.img", 64 * MiB)))
    st = stacks(cfg)
    be = st.launch()
    objs = [st.alloc(i, positions=True) for i in range(3)]
    put_and_wait(be, [key(i) for i in range(3)], objs)
    be.close()
    be.close()
    again = st.launch()
    assert again is not be and again.indexed_key_count() == 3
    got = again.batched_get_blocking([key(i) for i in range(3)])
    for g, o in zip(got, objs):
        assert_same(g, o)
    release(got)
    release(objs)


# --------------------------------------------------------------------------- README configs



def _roundtrip_through(st: Stack, be) -> None:
    assert type(be).__module__ == OUR_MODULE
    assert be.report_status()["use_odirect"] is True
    objs = [st.alloc(i, positions=True) for i in range(3)]
    put_and_wait(be, [key(i) for i in range(3)], objs)
    got = be.batched_get_blocking([key(i) for i in range(3)])
    for g, o in zip(got, objs):
        assert_same(g, o)
    release(got)
    assert be.batched_remove([key(i) for i in range(3)]) == 3
    release(objs)


def test_readme_yaml_config(tmp_path, stacks):
    dev = sparse(tmp_path / "nvme.img", 256 * MiB)  # the default 128 MiB metadata region fits
    if not odirect_ok(dev):
        pytest.skip(f"O_DIRECT is not supported on {tmp_path}")
    # The test's small sizes come last, so they win over the README's production values.
    text = README_YAML + f"chunk_size: {CHUNK}\nmax_local_cpu_size: 0.05\nlocal_cpu: false\n"
    yaml_path = tmp_path / "lmcache.yaml"
    yaml_path.write_text(text.replace(README_DEVICE, dev))
    cfg = LMCacheEngineConfig.from_file(str(yaml_path))
    assert cfg.storage_plugins == ["raw_block"]
    assert cfg.extra_config["rust_raw_block.use_odirect"] is True
    st = stacks(cfg)
    be = st.launch()
    assert be is not None, "the README YAML does not load the plugin"
    # LocalCPUBackend aligned its allocator to rust_raw_block.block_align for O_DIRECT.
    obj = st.alloc(7)
    assert obj.tensor.data_ptr() % 4096 == 0
    release([obj])
    _roundtrip_through(st, be)


def test_readme_env_config(tmp_path, stacks, monkeypatch):
    dev = sparse(tmp_path / "nvme.img", 256 * MiB)
    if not odirect_ok(dev):
        pytest.skip(f"O_DIRECT is not supported on {tmp_path}")
    for name in list(os.environ):
        if name.startswith("LMCACHE_"):
            monkeypatch.delenv(name)
    for name, value in README_ENV.items():
        monkeypatch.setenv(name, value.replace(README_DEVICE, dev))
    monkeypatch.setenv("LMCACHE_CHUNK_SIZE", str(CHUNK))
    monkeypatch.setenv("LMCACHE_MAX_LOCAL_CPU_SIZE", "0.05")
    monkeypatch.setenv("LMCACHE_LOCAL_CPU", "false")
    cfg = LMCacheEngineConfig.from_env()
    assert cfg.storage_plugins == ["raw_block"]
    assert cfg.extra_config["rust_raw_block.device_path"] == dev
    st = stacks(cfg)
    be = st.launch()
    assert be is not None, "the README environment variables do not load the plugin"
    _roundtrip_through(st, be)


# --------------------------------------------------------------------------- StorageManager


def test_storage_manager_drives_the_plugin(tmp_path):
    EventManager = lmcache_paths.import_inprocess("event_manager").EventManager
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    cfg = make_config(small_extra(sparse(tmp_path / "dev.img", 64 * MiB)))
    md = make_metadata()
    sm = StorageManager(cfg, md, EventManager())
    try:
        assert list(sm.storage_backends) == ["LocalCPUBackend", PLUGIN_NAME]
        be = sm.storage_backends[PLUGIN_NAME]
        assert type(be).__module__ == OUR_MODULE
        local = sm.storage_backends["LocalCPUBackend"]
        base = active_allocations(local)
        shape = md.get_shapes()[0]
        keys = [key(i) for i in range(4)]
        objs = []
        for i in range(4):
            o = sm.allocate(shape, torch.bfloat16)
            o.tensor.view(torch.uint8).copy_(torch.randint(
                0, 256, o.tensor.view(torch.uint8).shape, dtype=torch.uint8,
                generator=torch.Generator().manual_seed(i)))
            objs.append(o)
        for o in objs:
            o.ref_count_up()  # batched_put gives one reference away per object
        sm.batched_put(keys, objs)  # all backends; LocalCPU (local_cpu=False) keeps nothing
        deadline = time.monotonic() + 30
        while not all(be.contains(k) for k in keys) or any(be.exists_in_put_tasks(k) for k in keys):
            assert time.monotonic() < deadline, "puts did not finish"
            time.sleep(0.01)
        assert all(o.get_ref_count() == 1 for o in objs)

        assert sm.contains(keys[0]) == PLUGIN_NAME
        assert sm.contains(key(1000)) is None
        hits, mapping = sm.batched_contains(keys + [key(1000)])
        assert hits == 4 and mapping == {PLUGIN_NAME: keys}

        got = sm.get(keys[1], location=PLUGIN_NAME)
        assert_same(got, objs[1])
        release([got])
        got = sm.batched_get(keys, location=PLUGIN_NAME)
        for g, o in zip(got, objs):
            assert_same(g, o)
        release(got)
        got = sm.batched_get([keys[0], key(1000), keys[2]], location=PLUGIN_NAME)
        assert got[1] is None and got[2] is None
        release(got)

        assert sm.batched_remove(keys[:2], locations=[PLUGIN_NAME]) == 2
        assert sm.remove(keys[2], locations=[PLUGIN_NAME]) == 1
        assert sm.batched_remove(keys, locations=[PLUGIN_NAME]) == 1
        # StorageManager wrote the hits back into LocalCPUBackend; drop those copies too.
        sm.batched_remove(keys, locations=["LocalCPUBackend"])
        assert be.indexed_key_count() == 0
        release(objs)
        assert active_allocations(local) == base
    finally:
        sm.close()


def test_storage_manager_sees_only_the_chunks_worth_loading(tmp_path):
    """rust_raw_block.load_cost_recompute_tokens_per_second, read from LMCache's own config:
    StorageManager.batched_contains (LMCacheEngine's lookup) gets the priced prefix from our
    plugin: nothing where recomputing is faster than reading, everything held where reading is."""
    EventManager = lmcache_paths.import_inprocess("event_manager").EventManager
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    extra = small_extra(sparse(tmp_path / "dev.img", 64 * MiB), load_cost_recompute_tokens_per_second=1e12,
                        load_cost_prior_read_bytes_per_second=MiB)
    md = make_metadata()
    sm = StorageManager(make_config(extra), md, EventManager())
    try:
        be = sm.storage_backends[PLUGIN_NAME]
        assert be._pricer is not None and be._pricer.tokens_per_key == CHUNK
        keys = [key(i) for i in range(4)]
        objs = [sm.allocate(md.get_shapes()[0], torch.bfloat16) for _ in keys]
        put_and_wait(be, keys, objs)
        assert all(be.contains(k) for k in keys)
        # 16 tokens recompute in 16 ps; 16 KiB read at 1 MiB/s in 16 ms: recompute
        assert sm.batched_contains(keys) == (0, {})
        assert be.report_status()["load_cost"]["truncated_keys"] == 4
        # at 100 tokens/s a chunk recomputes in 160 ms: every held chunk is worth reading
        be._pricer.recompute_tps = 100.0
        assert sm.batched_contains(keys + [key(1000)]) == (4, {PLUGIN_NAME: keys})
        release(objs)
    finally:
        sm.close()


# --------------------------------------------------------------------------- LMCache-specific keys


def _read_checkpoint(path: str, meta_total: int = 4 * MiB, align: int = 4096) -> dict:
    """The newest valid checkpoint JSON on the device (v1 layout: two mirrored containers)."""
    container = (meta_total // 2) // align * align
    best = None
    with open(path, "rb") as f:
        for c in range(2):
            f.seek(c * container)
            magic, _ver, seq, plen, crc = struct.unpack("<8sIQQI", f.read(32))
            if magic != b"LMCIDX01" or not 0 < plen <= container - align:
                continue
            f.seek(c * container + align)
            payload = f.read(plen)
            if zlib.crc32(payload) & 0xFFFFFFFF != crc:
                continue
            if best is None or seq > best[0]:
                best = (seq, json.loads(payload))
    assert best is not None, "no valid checkpoint on the device"
    return best[1]


@pytest.mark.parametrize("stored_dtype", ["torch.bfloat16", None])
def test_recovers_legacy_key_dtype(tmp_path, stacks, stored_dtype):
    """LMCache's test: a checkpoint entry with dtype "torch.bfloat16" (and a stray lru_keys
    field) loads as bf16; without a dtype, the dtype in the legacy key is used."""
    dev = sparse(tmp_path / "dev.img", 64 * MiB)
    st = stacks(make_config(small_extra(dev, meta_format="v1")))  # the test edits the v1 checkpoint
    be = st.launch()
    obj = st.alloc(5)
    put_and_wait(be, [key(5)], [obj])
    be.close()
    state = _read_checkpoint(dev)
    enc = key(5).to_string()
    assert state["entries"][enc]["dtype"] == "bfloat16"
    state["entries"][enc]["dtype"] = stored_dtype
    state["lru_keys"] = [enc]
    again = st.launch()
    assert again.apply_loaded_state(state) is True
    got = again.get_blocking(key(5))
    assert got is not None and got.metadata.dtype == torch.bfloat16
    assert_same(got, obj)
    release([got, obj])


def test_layer_keys_of_one_chunk_keep_their_payloads(tmp_path, stacks):
    """LayerCacheEngineKeys of one chunk share a slot identity; each keeps its own payload,
    also after recovery from the checkpoint."""
    cfg = make_config(small_extra(sparse(tmp_path / "dev.img", 64 * MiB)), use_layerwise=True)
    st = stacks(cfg)
    be = st.launch()
    layer_shape = torch.Size([CHUNK, 2, 4 * 32])  # KV_T2D: one layer of one chunk
    keys = [LayerCacheEngineKey(MODEL, 1, 0, 0x5151, torch.bfloat16, {}, layer) for layer in range(4)]
    objs = []
    for layer in range(4):
        o = st.local.allocate(layer_shape, torch.bfloat16)
        assert o.metadata.fmt == MemoryFormat.KV_T2D
        o.tensor.fill_(float(layer + 1))
        objs.append(o)
    put_and_wait(be, keys, objs)
    assert be.indexed_key_count() == 4
    assert len({be.entry_offset(k) for k in keys}) == 4
    be.close()
    again = st.launch()
    got = again.batched_get_blocking(keys)
    for g, o in zip(got, objs):
        assert_same(g, o)
    assert [g.tensor[0, 0, 0].item() for g in got] == [1.0, 2.0, 3.0, 4.0]
    release(got)
    release(objs)


def test_tagged_keys_are_distinct_entries(our):
    st, be = our
    plain, tagged = key(7), key(7, tags={"lmcache.tag.user": "alice"})
    assert tagged.to_string().endswith("@user%alice")
    a, b = st.alloc(1), st.alloc(2)
    put_and_wait(be, [plain, tagged], [a, b])
    assert be.indexed_key_count() == 2
    ga, gb = be.get_blocking(plain), be.get_blocking(tagged)
    assert_same(ga, a)
    assert_same(gb, b)
    release([ga, gb, a, b])


def test_other_dtypes_roundtrip(our):
    st, be = our
    dtypes = [torch.float16, torch.float32, torch.uint8, torch.int8]
    if hasattr(torch, "float8_e4m3fn"):
        dtypes.append(torch.float8_e4m3fn)
    objs, keys = [], []
    for i, dt in enumerate(dtypes):
        tokens = CHUNK * 2 // dt.itemsize if dt.itemsize > 2 else CHUNK  # fits the bf16-sized slot
        objs.append(st.alloc(i, dtype=dt, tokens=tokens))
        keys.append(key(i, dtype=dt))
    put_and_wait(be, keys, objs)
    got = be.batched_get_blocking(keys)
    for g, o in zip(got, objs):
        assert_same(g, o)
    release(got)
    release(objs)


def test_core_metadata_shape_is_a_torch_size(our):
    """LocalCPUBackend.allocate takes a torch.Size or a *list of* shapes: a plain list/tuple of
    ints is read as several shapes and the retrieve path fails. LMCache's core hands out
    torch.Size (DiskCacheMetadata.shape); ours must too."""
    st, be = our
    obj = st.alloc(3)
    put_and_wait(be, [key(3)], [obj])
    meta = be._core.get_metadata_prefix([key(3).to_string()])[0]
    assert isinstance(meta.shape, torch.Size), f"shape is a {type(meta.shape).__name__}, not torch.Size"
    got = be.get_blocking(key(3))
    assert_same(got, obj)
    release([got, obj])


def test_checkpoint_dtype_names_match_lmcache(tmp_path, stacks):
    """The checkpoint's dtype strings are LMCache's names (lmcache.utils.TORCH_DTYPE_TO_STR_DTYPE),
    so LMCache's recovery maps them back to the same dtype."""
    from lmcache.utils import STR_DTYPE_TO_TORCH_DTYPE, TORCH_DTYPE_TO_STR_DTYPE

    dev = sparse(tmp_path / "dev.img", 64 * MiB)
    st = stacks(make_config(small_extra(dev, meta_format="v1")))  # reads the v1 checkpoint back
    be = st.launch()
    dtypes = sorted({dt for dt in TORCH_DTYPE_TO_STR_DTYPE}, key=str)
    objs, keys = [], []
    for i, dt in enumerate(dtypes):
        tokens = max(1, CHUNK * 2 // dt.itemsize) if dt.itemsize > 2 else CHUNK
        objs.append(st.alloc(i, dtype=dt, tokens=tokens))
        keys.append(key(i))  # the key's dtype stays bf16: only the stored dtype tells them apart
    put_and_wait(be, keys, objs)
    be.close()
    entries = _read_checkpoint(dev)["entries"]
    wrong = {str(dt): entries[k.to_string()]["dtype"] for k, dt in zip(keys, dtypes)
             if entries[k.to_string()]["dtype"] != TORCH_DTYPE_TO_STR_DTYPE[dt]}
    assert not wrong, f"dtype names LMCache does not know: {wrong} (expected e.g. fp8_e4m3fn)"
    assert all(STR_DTYPE_TO_TORCH_DTYPE[entries[k.to_string()]["dtype"]] == dt for k, dt in zip(keys, dtypes))
    release(objs)


# --------------------------------------------------------------------------- cross-implementation


def _require_rust_wheel():
    mod = rust_module()
    if mod is None:
        pytest.skip("the Rust wheel lmcache_rust_raw_block_io is not installed (or is our compat shim)")
    return mod


CROSS_KEYS = dict(slot_bytes=8192 + 16 * 1024, block_align=4096, header_bytes=4096)


def _cross_objects(st: Stack):
    """Chunks of several shapes, dtypes and formats, with and without cached_positions."""
    objs = [st.alloc(i, positions=(i % 2 == 0)) for i in range(6)]
    objs.append(st.alloc(40, tokens=3, positions=True))
    objs.append(st.alloc(41, dtype=torch.float16))
    if hasattr(torch, "float8_e4m3fn"):
        objs.append(st.alloc(42, dtype=torch.float8_e4m3fn))
    objs.append(st.alloc(43, dtype=torch.uint8))
    keys = [key(i) for i in range(len(objs) - 1)]
    keys.append(key(999, tags={"lmcache.tag.tenant": "t1"}))
    keys[7] = key(7, dtype=torch.float16)
    return keys, objs


@pytest.mark.parametrize("direction", ["lmcache_to_ours", "ours_to_lmcache"])
def test_device_written_by_one_implementation_opens_in_the_other(tmp_path, stacks, direction):
    _require_rust_wheel()
    writer_mod, reader_mod = (LMC_MODULE, OUR_MODULE) if direction == "lmcache_to_ours" else (OUR_MODULE, LMC_MODULE)
    dev = sparse(tmp_path / "dev.img", 64 * MiB)

    # ours writes format v1 when LMCache's core is to read the device
    w_keys = dict(CROSS_KEYS, **({"meta_format": "v1"} if writer_mod == OUR_MODULE else {}))
    st_w = stacks(make_config(small_extra(dev, module=writer_mod, **w_keys)))
    writer = st_w.launch()
    assert writer is not None and type(writer).__module__ == writer_mod
    keys, objs = _cross_objects(st_w)
    put_and_wait(writer, keys, objs)
    assert writer.indexed_key_count() == len(keys)
    assert writer.remove(keys[1]) is True  # a freed slot is part of the state too
    live = [i for i in range(len(keys)) if i != 1]
    offsets = {keys[i].to_string(): writer.entry_offset(keys[i]) for i in live}
    writer.close()
    st_w.backends.clear()

    st_r = stacks(make_config(small_extra(dev, module=reader_mod, **CROSS_KEYS)))
    reader = st_r.launch()
    assert reader is not None and type(reader).__module__ == reader_mod
    assert reader.indexed_key_count() == len(live), "every entry is recovered"
    assert not reader.contains(keys[1])
    for i in live:
        assert reader.entry_offset(keys[i]) == offsets[keys[i].to_string()]
        got = reader.get_blocking(keys[i])
        assert got is not None, f"{keys[i].to_string()} not readable"
        assert_same(got, objs[i])
        release([got])
    # The reader keeps working on the device: a new put lands in the freed slot or a new one.
    extra = st_r.alloc(77)
    put_and_wait(reader, [key(77)], [extra])
    got = reader.get_blocking(key(77))
    assert_same(got, extra)
    release([got, extra])
    release(objs)


# --------------------------------------------------------------------------- a full cache under threads


def test_full_cache_under_threads_with_lru(tmp_path, stacks):
    """eviction_policy lru with evict-ahead inside the real LMCache: a device whose every slot
    holds an entry takes 1,000 new chunks from 4 threads without a failed put; pinned entries
    (the oldest) survive, the chunks stored last load their own bytes, and every MemoryObj
    goes back to LocalCPUBackend."""
    slot = 4096 + 16384  # header + one 16 KiB chunk
    dev = sparse(tmp_path / "dev.img", 4 * MiB + 96 * slot)
    st = stacks(make_config(small_extra(dev)))
    be = st.launch()
    usable = be._core.slot_counts().usable
    for i in range(usable):
        o = st.alloc(i)
        put_and_wait(be, [key(i)], [o])
        release([o])
    be.close()
    st = stacks(make_config(small_extra(dev, eviction_policy="lru")))
    be = st.launch()
    assert be is not None and be.indexed_key_count() == usable
    base = active_allocations(st.local)
    pinned = [key(i) for i in range(4)]
    assert all(be.pin(k) for k in pinned)

    errors: list = []
    done: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def run(ids):
        start.wait()
        for i in ids:
            o = st.alloc(i)
            try:
                put_and_wait(be, [key(i)], [o], timeout=120)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(e)
            finally:
                release([o])
            with lock:
                done.append(i)

    workers = [threading.Thread(target=run, args=(list(range(usable + t, usable + 1000, 4)),)) for t in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert be._evictor.wait_idle(60)
    status = be.report_status()
    assert errors == [], f"{len(errors)} of 1000 puts failed; first: {errors[0]}"
    assert len(done) == 1000 and status["evicted_ahead_entries"] > 0 and status["evictor_errors"] == 0
    assert all(be.contains(k) for k in pinned)
    for i in [*range(4), *done[-24:]]:
        got = be.get_blocking(key(i))
        want = st.alloc(i)
        assert got is not None, f"chunk {i} missing"
        assert raw_bytes(got) == raw_bytes(want), f"chunk {i} loaded other bytes"
        release([got, want])
    assert all(be.unpin(k) for k in pinned)
    assert active_allocations(st.local) == base
