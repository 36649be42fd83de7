"""RustRawBlockBackend: LMCache's plugin behaviour, batched_remove, eviction policies.

These run against stand-ins for LMCache's MemoryObj / LocalCPUBackend / config
(tests/plugin_fakes.py) so they need neither lmcache nor torch; tests/conformance/test_plugin_lmcache.py
repeats the essentials inside the real LMCache.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from unittest import mock

import pytest

from lmcache_rawblock.plugin import RustRawBlockBackend, build_core_config
from plugin_fakes import (
    FakeEngineConfig,
    FakeLocalCPUBackend,
    FakeMetadata,
    base_extra,
    make_key,
    make_obj,
)

MiB = 1 << 20


@pytest.fixture
def make_backend(tmp_path, loop_thread):
    made: list[RustRawBlockBackend] = []

    def make(size=64 * MiB, name="dev.img", metadata=None, local=None, **overrides):
        path = tmp_path / name
        if not path.exists():
            with open(path, "wb") as f:
                f.truncate(size)
        cfg = FakeEngineConfig(base_extra(str(path), **overrides))
        be = RustRawBlockBackend(config=cfg, metadata=metadata or FakeMetadata(),
                                 local_cpu_backend=local or FakeLocalCPUBackend(), loop=loop_thread.loop)
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


def put(be, keys, objs):
    futs = be.batched_submit_put_task(keys, objs)
    errors = []
    for f in futs or []:
        try:
            f.result(30)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    return futs, errors


# --------------------------------------------------------------------------- basics


def test_put_get_roundtrip_and_str(make_backend):
    be = make_backend()
    assert str(be) == "RustRawBlockBackend"
    objs = [make_obj(i) for i in range(3)]
    futs, errors = put(be, [make_key(i) for i in range(3)], objs)
    assert futs and not errors
    assert all(o.get_ref_count() == 1 for o in objs), "the plugin gives back the references it took"
    for i in range(3):
        got = be.get_blocking(make_key(i))
        assert got is not None and got.tobytes() == objs[i].tobytes()
        assert got.metadata.shape == objs[i].metadata.shape
    assert be.get_blocking(make_key(99)) is None
    assert be.inflight_io_count() == 0


def test_put_dedup(make_backend):
    be = make_backend()
    obj = make_obj(1)
    # The same key twice in one batch is written once; an already stored key is skipped.
    futs, errors = put(be, [make_key(1), make_key(1)], [obj, make_obj(1)])
    assert len(futs) == 1 and not errors
    assert be.batched_submit_put_task([make_key(1)], [make_obj(1)]) is None
    assert be.indexed_key_count() == 1
    assert obj.get_ref_count() == 1


def test_exists_in_put_tasks_while_writing(make_backend):
    be = make_backend()
    gate = threading.Event()
    real = be._put_with_policy

    def slow(specs, objs):
        gate.wait(10)
        return real(specs, objs)

    with mock.patch.object(be, "_put_with_policy", side_effect=slow):
        futs = be.batched_submit_put_task([make_key(5)], [make_obj(5)])
        assert be.exists_in_put_tasks(make_key(5))
        assert not be.exists_in_put_tasks(make_key(6))
        gate.set()
        futs[0].result(30)
    assert not be.exists_in_put_tasks(make_key(5))
    assert be.contains(make_key(5))


def test_callback_once_per_key(make_backend):
    be = make_backend()
    seen = []
    futs = be.batched_submit_put_task([make_key(i) for i in range(4)], [make_obj(i) for i in range(4)],
                                      on_complete_callback=seen.append)
    for f in futs:
        f.result(30)
    assert sorted(k.chunk_hash for k in seen) == [0x1000 + i for i in range(4)]


def test_callback_errors_are_logged_not_raised(make_backend, caplog):
    be = make_backend()

    def boom(key):
        raise ValueError("callback failed")

    futs = be.batched_submit_put_task([make_key(1)], [make_obj(1)], on_complete_callback=boom)
    with caplog.at_level(logging.ERROR):
        assert futs[0].result(30) is None
    assert "on_complete_callback failed" in caplog.text
    assert be.contains(make_key(1))


# --------------------------------------------------------------------------- prefix semantics


def test_batched_get_blocking_prefix_stop(make_backend):
    be = make_backend()
    put(be, [make_key(1), make_key(3)], [make_obj(1), make_obj(3)])
    got = be.batched_get_blocking([make_key(1), make_key(2), make_key(3)])
    assert got[0] is not None and got[1] is None and got[2] is None
    assert be.get_blocking(make_key(3)) is not None
    assert be.batched_get_blocking([]) == []


def test_batched_get_non_blocking_prefix_stop(make_backend, loop_thread):
    be = make_backend()
    put(be, [make_key(1), make_key(3)], [make_obj(1), make_obj(3)])
    got = loop_thread.run(be.batched_get_non_blocking("lookup", [make_key(1), make_key(2), make_key(3)]))
    assert len(got) == 1 and got[0].tobytes() == make_obj(1).tobytes()


def test_batched_contains_and_async_contains_are_prefixes(make_backend, loop_thread):
    be = make_backend()
    put(be, [make_key(1), make_key(2), make_key(4)], [make_obj(1), make_obj(2), make_obj(4)])
    keys = [make_key(i) for i in (1, 2, 3, 4)]
    assert be.batched_contains(keys) == 2
    assert loop_thread.run(be.batched_async_contains("l", keys)) == 2
    assert loop_thread.run(be.batched_async_contains("l", keys, pin=True)) == 2
    assert be.lock_refcount(make_key(1).to_string()) == 1
    assert be.lock_refcount(make_key(4).to_string()) == 0
    assert be.unpin(make_key(1)) and be.unpin(make_key(2))
    assert be.lock_refcount(make_key(1).to_string()) == 0


# --------------------------------------------------------------------------- pins


def test_pin_and_contains_are_idempotent(make_backend):
    be = make_backend()
    put(be, [make_key(1)], [make_obj(1)])
    enc = make_key(1).to_string()
    assert be.contains(make_key(1), pin=True) and be.contains(make_key(1), pin=True) and be.pin(make_key(1))
    assert be.lock_refcount(enc) == 1
    assert be.unpin(make_key(1)) and be.unpin(make_key(1))
    assert be.lock_refcount(enc) == 0
    assert not be.pin(make_key(2)), "pinning an absent key fails"
    assert not be.unpin(make_key(2)), "unpinning an absent key reports absence"

    results = []
    barrier = threading.Barrier(8)

    def pin():
        barrier.wait()
        results.append(be.pin(make_key(1)))

    threads = [threading.Thread(target=pin) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 8
    assert be.lock_refcount(enc) == 1, "one lock reference however many times a key is pinned"


def test_remove_with_and_without_force(make_backend):
    be = make_backend()
    put(be, [make_key(1), make_key(2)], [make_obj(1), make_obj(2)])
    be.pin(make_key(1))
    assert not be.remove(make_key(1), force=False), "a pinned key survives a non-forced remove"
    assert be.contains(make_key(1))
    assert be.remove(make_key(1), force=True)
    assert not be.contains(make_key(1))
    assert be.lock_refcount(make_key(1).to_string()) == 0
    assert be.remove(make_key(2), force=False)
    assert not be.remove(make_key(2))


# --------------------------------------------------------------------------- batched_remove


def test_batched_remove_empty(make_backend):
    be = make_backend()
    with mock.patch.object(be._core, "delete_many", wraps=be._core.delete_many) as dm:
        assert be.batched_remove([]) == 0
    assert dm.call_count == 0


def test_batched_remove_happy_path_deletes_in_one_native_call(make_backend):
    be = make_backend()
    keys = [make_key(i) for i in range(5)]
    put(be, keys, [make_obj(i) for i in range(5)])
    with mock.patch.object(be._core, "delete_legacy_keys", wraps=be._core.delete_legacy_keys) as fused, \
            mock.patch.object(be._core, "delete_many", wraps=be._core.delete_many) as dm:
        assert be.batched_remove(keys) == 5
    # Nothing pinned: one native call encodes every key and runs the core's delete_many once.
    assert fused.call_count == 1 and dm.call_count == 0
    assert fused.call_args.args[0] == keys
    assert be.indexed_key_count() == 0


def test_batched_remove_with_pins_calls_delete_many_once(make_backend):
    be = make_backend()
    keys = [make_key(i) for i in range(5)]
    put(be, keys, [make_obj(i) for i in range(5)])
    be.pin(keys[0])
    with mock.patch.object(be._core, "delete_many", wraps=be._core.delete_many) as dm:
        assert be.batched_remove(keys) == 5
    assert dm.call_count == 1
    assert dm.call_args.args[0] == [k.to_string() for k in keys]
    assert be._pinned_keys == set() and be.indexed_key_count() == 0


def test_batched_remove_keeps_pinned_without_force(make_backend):
    be = make_backend()
    keys = [make_key(i) for i in range(5)]
    put(be, keys, [make_obj(i) for i in range(5)])
    be.pin(keys[1])
    be.pin(keys[3])
    assert be.batched_remove(keys, force=False) == 3
    assert [be.contains(k) for k in keys] == [False, True, False, True, False]
    # Pins survive: the pinned set still owns its lock references.
    assert be.lock_refcount(keys[1].to_string()) == 1
    assert be.unpin(keys[1])


def test_batched_remove_all_missing(make_backend):
    be = make_backend()
    assert be.batched_remove([make_key(i) for i in range(4)]) == 0


def test_batched_remove_force_removes_pinned(make_backend):
    be = make_backend()
    keys = [make_key(i) for i in range(3)]
    put(be, keys, [make_obj(i) for i in range(3)])
    be.pin(keys[0])
    assert be.batched_remove(keys, force=True) == 3
    assert be.indexed_key_count() == 0
    assert not be.unpin(keys[0]), "the pin went away with the key"
    assert be._pinned_keys == set()


def test_batched_remove_matches_per_key_remove(make_backend):
    """Same results as the base class's per-key fan-out on an identical state."""
    a = make_backend(name="a.img")
    b = make_backend(name="b.img")
    keys = [make_key(i) for i in range(6)]
    for be in (a, b):
        put(be, keys[:4], [make_obj(i) for i in range(4)])
        be.pin(keys[2])
    fanout = sum(int(b.remove(k, force=False)) for k in keys)
    assert a.batched_remove(keys, force=False) == fanout == 3
    assert [a.contains(k) for k in keys] == [b.contains(k) for k in keys]


# --------------------------------------------------------------------------- capacity and eviction


def _small_device_backend(make_backend, **kw):
    # capacity 12 MiB, meta 4 MiB, slot 4 MiB -> 2 slots.
    return make_backend(size=12 * MiB, slot_bytes=4 * MiB, **kw)


def test_rejects_when_full_with_policy_none(make_backend):
    be = _small_device_backend(make_backend)
    assert be.eviction_policy == "none"
    _, errors = put(be, [make_key(1), make_key(2)], [make_obj(1), make_obj(2)])
    assert not errors
    obj3 = make_obj(3)
    futs = be.batched_submit_put_task([make_key(3)], [obj3])
    with pytest.raises(RuntimeError, match="Failed to persist raw-block key .*: no free slot: 2 slots, 2 indexed"):
        futs[0].result(30)
    assert obj3.get_ref_count() == 1 and not be.exists_in_put_tasks(make_key(3))
    assert not be.contains(make_key(3))
    assert be.get_blocking(make_key(1)).tobytes() == make_obj(1).tobytes()
    assert be.get_blocking(make_key(2)).tobytes() == make_obj(2).tobytes()


# On two slots the default evict-ahead (trigger 0.95) would evict as soon as both are taken:
# eviction_ratio 0 turns it off, so these see the put path's own eviction alone.
def test_lru_evicts_least_recently_used(make_backend):
    be = _small_device_backend(make_backend, eviction_policy="lru", eviction_ratio=0)
    put(be, [make_key(1)], [make_obj(1)])
    put(be, [make_key(2)], [make_obj(2)])
    assert be.get_blocking(make_key(1)) is not None  # key 1 is now the most recent
    _, errors = put(be, [make_key(3)], [make_obj(3)])
    assert not errors
    assert be.contains(make_key(1)) and not be.contains(make_key(2)) and be.contains(make_key(3))
    assert be.get_blocking(make_key(3)).tobytes() == make_obj(3).tobytes()


def test_lru_never_evicts_pinned(make_backend):
    be = _small_device_backend(make_backend, eviction_policy="lru", eviction_ratio=0)
    put(be, [make_key(1), make_key(2)], [make_obj(1), make_obj(2)])
    be.pin(make_key(1))
    be.pin(make_key(2))
    futs = be.batched_submit_put_task([make_key(3)], [make_obj(3)])
    with pytest.raises(RuntimeError, match=r"Failed to persist .*nothing is left to evict: 2 slots, 2 indexed "
                       r"\(2 pinned, 0 more locked by loads\), 0 being written, 0 freed and waiting"):
        futs[0].result(30)
    assert be.contains(make_key(1)) and be.contains(make_key(2))
    be.unpin(make_key(2))
    _, errors = put(be, [make_key(3)], [make_obj(3)])
    assert not errors and not be.contains(make_key(2)) and be.contains(make_key(1))


def test_lru_does_not_evict_on_io_errors(make_backend):
    be = make_backend(eviction_policy="lru")  # plenty of free slots
    put(be, [make_key(1), make_key(2)], [make_obj(1), make_obj(2)])
    be._core._native._inject_fault("write", 1)
    futs = be.batched_submit_put_task([make_key(3)], [make_obj(3)])
    with pytest.raises(RuntimeError, match=r"Failed to persist .*: \[Errno 5\] write failed at offset \d+: "
                       r"pwrite failed \(injected\): Input/output error \(EIO\); device_path='.*'"):
        futs[0].result(30)
    assert be.contains(make_key(1)) and be.contains(make_key(2)), "an I/O error evicts nothing"


def test_bad_eviction_policy(make_backend):
    with pytest.raises(ValueError, match=r"rust_raw_block.eviction_policy'\] must be one of none, lru, prefix, extent, extent_prefix; got 'fifo'"):
        make_backend(eviction_policy="fifo")


# --------------------------------------------------------------------------- config


def test_config_errors(tmp_path, loop_thread):
    local = FakeLocalCPUBackend()
    with pytest.raises(ValueError, match=r"extra_config\['rust_raw_block.device_path'\] is required"):
        RustRawBlockBackend(config=FakeEngineConfig({}), metadata=FakeMetadata(), local_cpu_backend=local,
                            loop=loop_thread.loop)
    with pytest.raises(ValueError, match="requires an asyncio event loop"):
        RustRawBlockBackend(config=FakeEngineConfig({}), metadata=FakeMetadata(), local_cpu_backend=local)
    with pytest.raises(ValueError, match="requires a local_cpu_backend"):
        RustRawBlockBackend(config=FakeEngineConfig({}), metadata=FakeMetadata(), loop=loop_thread.loop)
    with pytest.raises(ValueError, match=r"rust_raw_block.use_odirect'\] must be a boolean"):
        build_core_config(FakeEngineConfig(base_extra("/x", use_odirect="maybe")), FakeMetadata(), local)
    with pytest.raises(ValueError, match=r"rust_raw_block.capacity_bytes'\] must be an integer, got 'lots'"):
        build_core_config(FakeEngineConfig(base_extra("/x", capacity_bytes="lots")), FakeMetadata(), local)


def test_config_defaults_and_string_booleans():
    local = FakeLocalCPUBackend(chunk_bytes=100_000)
    cfg = build_core_config(FakeEngineConfig({"rust_raw_block.device_path": "/dev/x",
                                              "rust_raw_block.use_odirect": "true",
                                              "rust_raw_block.use_uring": "1"}), FakeMetadata(), local)
    assert cfg.use_odirect is True and cfg.io_engine == "io_uring"
    assert cfg.slot_bytes == 4096 * ((4096 + 100_000 + 4095) // 4096)
    assert cfg.meta_total_bytes == 128 * MiB and cfg.iouring_queue_depth == 256
    assert cfg.meta_magic == b"LMCIDX01" and cfg.meta_version == 1 and cfg.enable_zero_copy is True
    # io_engine wins over the legacy flags, case-insensitively.
    cfg = build_core_config(FakeEngineConfig({"rust_raw_block.device_path": "/dev/x",
                                              "rust_raw_block.io_engine": "POSIX",
                                              "rust_raw_block.use_iouring": True}), FakeMetadata(), local)
    assert cfg.io_engine == "posix"


def test_data_offsets_start_after_metadata(make_backend):
    be = make_backend(meta_total_bytes=8 * MiB)
    put(be, [make_key(1)], [make_obj(1)])
    assert be.entry_offset(make_key(1)) >= 8 * MiB
    assert be.metadata_container_offsets() == [0, 4 * MiB]


def test_checkpoint_roundtrip_through_close(make_backend, tmp_path, loop_thread):
    be = make_backend()
    put(be, [make_key(1), make_key(2)], [make_obj(1), make_obj(2)])
    be.close()
    again = make_backend()
    assert again.contains(make_key(1)) and again.contains(make_key(2))
    assert again.get_blocking(make_key(2)).tobytes() == make_obj(2).tobytes()


def test_skips_checkpoint_on_init(make_backend):
    be = make_backend()
    put(be, [make_key(1)], [make_obj(1)])
    be.close()
    again = make_backend(load_checkpoint_on_init=False)
    assert not again.contains(make_key(1))


# --------------------------------------------------------------------------- tensor parallel


def test_tp4_paths_and_isolation(tmp_path, loop_thread):
    paths = {}
    for r in range(4):
        p = tmp_path / f"rank{r}.img"
        with open(p, "wb") as f:
            f.truncate(32 * MiB)
        paths[str(r) if r % 2 else r] = str(p)  # string and integer rank keys both work
    backends = []
    try:
        for r in range(4):
            extra = base_extra("", per_tp_device_paths=paths)
            del extra["rust_raw_block.device_path"]
            be = RustRawBlockBackend(config=FakeEngineConfig(extra), metadata=FakeMetadata(4, r),
                                     local_cpu_backend=FakeLocalCPUBackend(), loop=loop_thread.loop)
            backends.append(be)
            assert be._core.device_path == str(tmp_path / f"rank{r}.img")
        for r, be in enumerate(backends):
            put(be, [make_key(r, worker=r, world=4)], [make_obj(r)])
        for r, be in enumerate(backends):
            assert be.get_blocking(make_key(r, worker=r, world=4)).tobytes() == make_obj(r).tobytes()
            other = (r + 1) % 4
            assert be.get_blocking(make_key(other, worker=other, world=4)) is None
    finally:
        for be in backends:
            be.close()


def test_tp_path_errors(tmp_path, loop_thread):
    local = FakeLocalCPUBackend()

    def extra(paths):
        e = base_extra("", per_tp_device_paths=paths)
        del e["rust_raw_block.device_path"]
        return FakeEngineConfig(e)

    with pytest.raises(ValueError, match="Duplicate device path configured"):
        build_core_config(extra({"0": "/a", "1": "/a"}), FakeMetadata(2, 0), local)
    with pytest.raises(ValueError, match=r"no device for worker_id 2; available keys: \['0', '1'\]"):
        build_core_config(extra({"0": "/a", "1": "/b"}), FakeMetadata(4, 2), local)
    with pytest.raises(ValueError, match="is required when world_size > 1"):
        build_core_config(extra({}), FakeMetadata(2, 0), local)


def test_warns_on_cross_rank_device(make_backend, tmp_path):
    shared = str(tmp_path / "shared.img")
    with open(shared, "wb") as f:
        f.truncate(64 * MiB)
    other = str(tmp_path / "other.img")
    be = make_backend(metadata=FakeMetadata(2, 0), per_tp_device_paths={"0": shared, "1": other})
    put(be, [make_key(1, worker=0, world=2)], [make_obj(1)])
    be.close()
    # Rank 1 is (mis)configured onto the device rank 0 wrote.
    with mock.patch("lmcache_rawblock.plugin.logger.warning") as warn:
        make_backend(metadata=FakeMetadata(2, 1), per_tp_device_paths={"0": other, "1": shared})
    assert warn.call_count == 1
    args = warn.call_args.args
    assert args[2] == 1 and args[3] == 0, "current worker id, then the stored one"


# --------------------------------------------------------------------------- close and errors


def test_close_is_thread_safe(make_backend):
    be = make_backend()
    put(be, [make_key(1)], [make_obj(1)])
    errors = []
    barrier = threading.Barrier(8)

    def close():
        barrier.wait()
        try:
            be.close()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=close) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    be.close()
    assert not errors


def test_get_handles_allocator_exhaustion(make_backend):
    local = FakeLocalCPUBackend()
    be = make_backend(local=local)
    put(be, [make_key(1)], [make_obj(1)])
    local.fail_allocations = True
    assert be.get_blocking(make_key(1)) is None
    assert be.batched_get_blocking([make_key(1)]) == [None]
    assert be.inflight_io_count() == 0
    assert be.lock_refcount(make_key(1).to_string()) == 0


def test_get_releases_allocations_on_read_error(make_backend):
    local = FakeLocalCPUBackend()
    be = make_backend(local=local)
    put(be, [make_key(1), make_key(2)], [make_obj(1), make_obj(2)])
    local.allocated.clear()
    be._core._native._inject_fault("read", 1)
    with pytest.raises(OSError):
        be.batched_get_blocking([make_key(1), make_key(2)])
    assert local.allocated and all(o.get_ref_count() == 0 for o in local.allocated)
    assert be.inflight_io_count() == 0
    assert be.lock_refcount(make_key(1).to_string()) == 0


def test_submit_rolls_back_refs_on_dispatch_failure(make_backend):
    be = make_backend()
    objs = [make_obj(i) for i in range(3)]
    with mock.patch("asyncio.run_coroutine_threadsafe", side_effect=RuntimeError("loop is closing")):
        with pytest.raises(RuntimeError, match="loop is closing"):
            be.batched_submit_put_task([make_key(i) for i in range(3)], objs)
    assert all(o.get_ref_count() == 1 for o in objs)
    assert not any(be.exists_in_put_tasks(make_key(i)) for i in range(3))


def test_submit_rolls_back_only_unscheduled_refs(make_backend):
    be = make_backend()
    objs = [make_obj(i) for i in range(3)]
    real = asyncio.run_coroutine_threadsafe
    calls = []

    def first_only(coro, loop):
        calls.append(1)
        if len(calls) == 1:
            return real(coro, loop)
        coro.close()
        raise RuntimeError("scheduling failed")

    with mock.patch("asyncio.run_coroutine_threadsafe", side_effect=first_only):
        with pytest.raises(RuntimeError, match="scheduling failed"):
            be.batched_submit_put_task([make_key(i) for i in range(3)], objs)
    deadline = threading.Event()
    for _ in range(300):
        if not be.exists_in_put_tasks(make_key(0)):
            break
        deadline.wait(0.01)
    assert be.contains(make_key(0)), "the scheduled put finished"
    assert all(o.get_ref_count() == 1 for o in objs)
    assert not any(be.exists_in_put_tasks(make_key(i)) for i in range(3))


def test_get_allocator_backend(make_backend):
    local = FakeLocalCPUBackend()
    be = make_backend(local=local)
    assert be.get_allocator_backend() is local


def test_futures_are_concurrent_futures(make_backend):
    be = make_backend()
    futs = be.batched_submit_put_task([make_key(1)], [make_obj(1)])
    assert isinstance(futs[0], Future)
    assert futs[0].result(30) is None
