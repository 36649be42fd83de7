"""LMCache's MP-mode raw-block L2 adapter over several devices: ``device_paths`` in
``adapter_params`` gives one adapter over one MultiDeviceCore (docs/compatibility.md says why
not N adapters), through LMCache's own parser, factory and adapter code.

Marked ``lmcache``: run with ``make test-lmcache``.
"""

from __future__ import annotations

import pytest

from helpers import lmcache_imports

with lmcache_imports() as lmc:
    import torch
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry

    from conformance.test_conformance_mp_adapter import (
        _adapter_json,
        _adapters,
        _device,
        _key,
        _load,
        _lookup,
        _obj,
        _parse,
        _store,
    )

pytestmark = lmc.marks


def test_device_paths_give_one_adapter_over_several_devices(tmp_path):
    from lmcache_rawblock.raw_block import MultiDeviceCore

    devs = [_device(tmp_path, f"dev{i}.img") for i in range(3)]
    spec = _adapter_json(devs[0], device_paths=devs)
    keys = [_key(i) for i in range(9)]
    objs = [_obj(1024, seed=i) for i in range(9)]
    adapter = create_l2_adapter_from_registry(_adapters(_parse(spec))[0])
    try:
        core = adapter._core
        assert isinstance(core, MultiDeviceCore) and core.device_paths == devs
        assert _store(adapter, keys, objs) is True
        assert _lookup(adapter, keys) == list(range(9))
        adapter.submit_unlock(keys)
        where = {core.device_of(k) for k in core.snapshot_indexed_keys()}
        assert where == set(devs), "the batch was spread over the devices"
        st = adapter.report_status()
        assert st["is_healthy"] and st["core"]["indexed_key_count"] == 9 and st["core"]["devices_online"] == 3
        assert adapter._max_capacity_bytes == st["core"]["usable_capacity_bytes"]
        # one device fails: its keys are misses, the load task still succeeds for the others
        core.mark_failed(1, "taken out by the test")
        outs = [_obj(1024, seed=100 + i) for i in range(9)]
        got = _load(adapter, keys, outs)
        on_others = [i for i, k in enumerate(keys) if core.device_of(_enc(k)) is not None]
        assert got == on_others and 0 < len(got) < 9
        assert all(torch.equal(outs[i].raw_data, objs[i].raw_data) for i in got)
    finally:
        adapter.close()


def _enc(key):
    from lmcache_rawblock.raw_block import encode_object_key

    return encode_object_key(key).encoded


def test_device_path_must_lead_device_paths(tmp_path):
    from lmcache_rawblock.l2_adapter import RawBlockL2AdapterConfig

    with pytest.raises(ValueError, match="must be the first of device_paths"):
        RawBlockL2AdapterConfig.from_dict({"device_path": "/b", "device_paths": ["/a", "/b"], "slot_bytes": 20480})
    with pytest.raises(ValueError, match="device_paths must not repeat a device"):
        RawBlockL2AdapterConfig.from_dict({"device_paths": "/a,/a", "slot_bytes": 20480})
    cfg = RawBlockL2AdapterConfig.from_dict({"device_paths": "/a,/b", "slot_bytes": 20480})
    assert cfg.device_path == "/a" and [c.device_path for c in cfg.to_core_config().configs] == ["/a", "/b"]


class _Counting:
    """A listener of LMCache's L2 adapter events that counts stored and deleted keys."""

    def __init__(self) -> None:
        self.stored = 0
        self.deleted = 0

    def on_l2_keys_stored(self, keys, sizes=None, *args, **kw) -> None:
        self.stored += len(keys)

    def on_l2_keys_deleted(self, keys, sizes=None, *args, **kw) -> None:
        self.deleted += len(keys)

    def __getattr__(self, name):  # the other events of the listener interface
        return lambda *args, **kw: None


def test_reopen_device_tells_lmcache_the_recovered_keys_were_stored(tmp_path):
    devs = [_device(tmp_path, f"dev{i}.img") for i in range(3)]
    adapter = create_l2_adapter_from_registry(_adapters(_parse(_adapter_json(devs[0], device_paths=devs)))[0])
    try:
        listener = _Counting()
        adapter.register_listener(listener)
        keys = [_key(i) for i in range(9)]
        assert _store(adapter, keys, [_obj(1024, seed=i) for i in range(9)]) is True
        core = adapter._core
        on_dev1 = [k for k in keys if core.device_of(_enc(k)) == devs[1]]
        assert 0 < len(on_dev1) < 9
        used = adapter.get_usage().total_bytes_used
        core.mark_failed(1, "taken out by the test")
        _load(adapter, keys, [_obj(1024, seed=100 + i) for i in range(9)])  # the misses reach the listeners
        adapter.wait_idle(10)
        assert listener.deleted == len(on_dev1)
        assert adapter.get_usage().total_bytes_used < used
        back = adapter.reopen_device(1)
        assert back["keys_reported_stored"] == len(on_dev1)
        assert listener.stored == 9 + len(on_dev1), "the recovered keys were told to LMCache as stored"
        st = adapter.report_status()
        assert st["held_key_count"] == st["core"]["indexed_key_count"] == 9
        assert adapter.get_usage().total_bytes_used == used, "LMCache's byte accounting counts them again"
        outs = [_obj(1024, seed=200 + i) for i in range(9)]
        assert _load(adapter, keys, outs) == list(range(9))
        with pytest.raises(ValueError, match="is online, not failed"):
            adapter.reopen_device(1)
    finally:
        adapter.close()
