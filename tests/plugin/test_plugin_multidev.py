"""The plugin over several devices: ``rust_raw_block.device_paths`` (one rank) and lists in
``per_tp_device_paths`` (TP > 1) give one cache over the devices (MultiDeviceCore); what a
failed device costs the plugin's gets; the configuration errors."""

from __future__ import annotations

import os

import pytest

from lmcache_rawblock.plugin import RustRawBlockBackend, build_core_config, resolve_device_paths
from lmcache_rawblock.raw_block import MultiDeviceCore, RawBlockCore
from plugin_fakes import FakeEngineConfig, FakeLocalCPUBackend, FakeMetadata, base_extra, make_key, make_obj

MiB = 1 << 20


def _files(tmp_path, n, size=64 * MiB, prefix="dev"):
    out = []
    for i in range(n):
        p = tmp_path / f"{prefix}{i}.img"
        with open(p, "wb") as f:
            f.truncate(size)
        out.append(str(p))
    return out


def _backend(loop_thread, extra, metadata=None):
    return RustRawBlockBackend(config=FakeEngineConfig(extra), metadata=metadata or FakeMetadata(),
                               local_cpu_backend=FakeLocalCPUBackend(), loop=loop_thread.loop)


def _extra(paths, **kw):
    e = base_extra("", device_paths=paths, **kw)
    del e["rust_raw_block.device_path"]
    return e


def _put(be, ids, worker=0, world=1):
    futs = be.batched_submit_put_task([make_key(i, worker, world) for i in ids], [make_obj(i) for i in ids])
    for f in futs or []:
        f.result(30)


def test_device_paths_make_one_cache_over_the_devices(tmp_path, loop_thread):
    paths = _files(tmp_path, 3)
    be = _backend(loop_thread, _extra(paths))
    try:
        assert isinstance(be._core, MultiDeviceCore) and be.device_paths == paths and be.device_path == paths[0]
        _put(be, range(12))
        got = be.batched_get_blocking([make_key(i) for i in range(12)])
        assert [g.tobytes() for g in got] == [make_obj(i).tobytes() for i in range(12)]
        st = be.report_status()
        assert st["indexed_key_count"] == 12 and st["device_paths"] == paths
        assert all(d["indexed_key_count"] > 0 for d in st["devices"]), "every device took keys"
    finally:
        be.close()
    be = _backend(loop_thread, _extra(",".join(paths)))  # the text form, as a template gives it
    try:
        got = be.batched_get_blocking([make_key(i) for i in range(12)])
        assert [g.tobytes() for g in got] == [make_obj(i).tobytes() for i in range(12)]
    finally:
        be.close()


def test_one_path_in_device_paths_is_a_plain_core(tmp_path, loop_thread):
    be = _backend(loop_thread, _extra(_files(tmp_path, 1)))
    try:
        assert isinstance(be._core, RawBlockCore)
    finally:
        be.close()


def test_a_failed_device_makes_its_keys_misses_for_the_plugin(tmp_path, loop_thread):
    paths = _files(tmp_path, 2)
    be = _backend(loop_thread, _extra(paths))
    try:
        _put(be, range(8))
        where = [be._core.device_of(be._encode(make_key(i))) for i in range(8)]
        be._core.mark_failed(1, "taken out by the test")
        for i in range(8):
            got = be.get_blocking(make_key(i))
            assert (got is not None) == (where[i] == paths[0])
            assert got is None or got.tobytes() == make_obj(i).tobytes()
        _put(be, range(20, 24))  # new keys go to the device left
        assert all(be.contains(make_key(i)) for i in range(20, 24))
        assert be.report_status()["devices_failed"] == 1
        be.reopen_device(paths[1])
        assert all(be.contains(make_key(i)) for i in range(8))
    finally:
        be.close()


def test_reopened_keys_join_the_lru_list_as_oldest(tmp_path, loop_thread):
    paths = _files(tmp_path, 2)
    be = _backend(loop_thread, _extra(paths, eviction_policy="lru"))
    try:
        _put(be, range(6))
        where = [be._core.device_of(be._encode(make_key(i))) for i in range(6)]
    finally:
        be.close()
    os.rename(paths[0], paths[0] + ".away")  # drive 0 is missing when the plugin starts
    be = _backend(loop_thread, _extra(paths, eviction_policy="lru"))
    try:
        assert be.report_status()["devices"][0]["state"] == "failed"
        back = {be._encode(make_key(i)) for i in range(6) if where[i] == paths[0]}
        assert back and not back & set(be._lru)
        os.rename(paths[0] + ".away", paths[0])
        assert be.reopen_device(paths[0])["indexed_key_count"] == len(back)
        assert set(list(be._lru)[:len(back)]) == back, "its keys are the first eviction candidates"
        assert len(be._lru) == 6
    finally:
        be.close()


def test_reopen_device_needs_several_devices(tmp_path, loop_thread):
    be = _backend(loop_thread, _extra(_files(tmp_path, 1)))
    try:
        with pytest.raises(ValueError, match="reopen_device needs several devices"):
            be.reopen_device(0)
    finally:
        be.close()


def test_lru_eviction_over_several_devices(tmp_path, loop_thread):
    # two devices of two 4 MiB slots each: a fifth key evicts the least recently used
    paths = _files(tmp_path, 2, size=12 * MiB)
    be = _backend(loop_thread, _extra(paths, slot_bytes=4 * MiB, eviction_policy="lru", eviction_ratio=0))
    try:
        for i in range(4):
            _put(be, [i])
        assert be.get_blocking(make_key(0)) is not None  # key 0 is now the most recent
        _put(be, [4])
        assert be.contains(make_key(4)) and be.contains(make_key(0)) and not be.contains(make_key(1))
        assert be.get_blocking(make_key(4)).tobytes() == make_obj(4).tobytes()
    finally:
        be.close()


def test_per_rank_lists_in_per_tp_device_paths(tmp_path, loop_thread):
    paths = _files(tmp_path, 4)
    mapping = {"0": paths[:2], 1: f"{paths[2]},{paths[3]}"}
    backends = []
    try:
        for r in range(2):
            e = base_extra("", per_tp_device_paths=mapping)
            del e["rust_raw_block.device_path"]
            be = _backend(loop_thread, e, FakeMetadata(2, r))
            backends.append(be)
            assert be.device_paths == paths[2 * r:2 * r + 2]
            _put(be, range(6), worker=r, world=2)
        for r, be in enumerate(backends):
            got = be.batched_get_blocking([make_key(i, r, 2) for i in range(6)])
            assert [g.tobytes() for g in got] == [make_obj(i).tobytes() for i in range(6)]
    finally:
        for be in backends:
            be.close()


def test_device_paths_errors(tmp_path):
    local = FakeLocalCPUBackend()

    def cfg(**kw):
        return FakeEngineConfig(base_extra("", **kw))

    with pytest.raises(ValueError, match=r"device_path'\] = '/a' or .*device_paths'\] = \['/b'\], not both"):
        build_core_config(FakeEngineConfig(base_extra("/a", device_paths=["/b"])), FakeMetadata(), local)
    with pytest.raises(ValueError, match="must not repeat a device"):
        build_core_config(cfg(device_paths=["/a", "/a"]), FakeMetadata(), local)
    with pytest.raises(ValueError, match="must not contain an empty path"):
        build_core_config(cfg(device_paths=["/a", ""]), FakeMetadata(), local)
    with pytest.raises(ValueError, match="non-empty list of device paths, got 7"):
        build_core_config(cfg(device_paths=7), FakeMetadata(), local)
    with pytest.raises(ValueError, match="give each rank its list in"):
        build_core_config(cfg(device_paths=["/a", "/b"], per_tp_device_paths={"0": "/c", "1": "/d"}),
                          FakeMetadata(2, 0), local)
    with pytest.raises(ValueError, match="Duplicate device path configured"):
        build_core_config(cfg(per_tp_device_paths={"0": ["/a", "/b"], "1": ["/c", "/b"]}), FakeMetadata(2, 1),
                          local)
    assert resolve_device_paths({"rust_raw_block.device_paths": "[/a, /b]"}, FakeMetadata()) == ["/a", "/b"]
