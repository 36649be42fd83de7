"""A cache over several devices serves one series per device (labelled by its path) and
publishes each device's live figures under that device's path; a failed device drops out of
both until it is reopened."""

from __future__ import annotations

import json

from core_helpers import Obj, make_config, make_device, okey, payload
from lmcache_rawblock import livestats, metrics
from lmcache_rawblock.raw_block import MultiDeviceConfig, MultiDeviceCore

N = 4096


def _multi(tmp_path) -> tuple[MultiDeviceCore, list[str]]:
    paths = [make_device(tmp_path, name=f"dev{i}.img") for i in range(2)]
    cfg = MultiDeviceConfig.for_paths(make_config(paths[0]), paths)
    return MultiDeviceCore(cfg, key_namespace="object"), paths


def _by_device(sources: metrics.Sources) -> dict[str, dict]:
    return {lab["device"]: snap for lab, snap in sources.snapshots()}


def test_each_device_of_a_multi_device_cache_is_its_own_series(tmp_path):
    core, paths = _multi(tmp_path)
    try:
        ids = range(20)
        res = core.put_many([okey(i) for i in ids], [Obj(payload(i, N)) for i in ids])
        assert res.results == [True] * 20
        on = {p: sum(1 for i in ids if core.device_of(okey(i).encoded) == p) for p in paths}
        assert all(on.values()), f"both devices took keys: {on}"
        src = metrics.Sources()
        src.add(core, core.device_path, "m")
        per = _by_device(src)
        assert sorted(per) == sorted(paths), per.keys()
        for p in paths:
            assert per[p]["status"]["indexed_keys"] == on[p]
            assert per[p]["histograms"]["put_ns"]["count"] >= 1
        text = metrics.render(src.families())
        for p in paths:
            assert f'device="{p}"' in text
        assert core.mark_failed(paths[0], "test")
        assert sorted(_by_device(src)) == [paths[1]], "a failed device has no series"
        core.reopen_device(paths[0])
        per = _by_device(src)
        assert sorted(per) == sorted(paths)
        assert per[paths[0]]["status"]["indexed_keys"] == on[paths[0]], "the reopened device's recovered keys"
    finally:
        core.close()


def test_each_device_publishes_its_own_live_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("RB_STATS_DIR", str(tmp_path / "stats"))
    core, paths = _multi(tmp_path)
    pubs = livestats.publish(core, core.device_path, interval=60)
    try:
        core.put_many([okey(i) for i in range(6)], [Obj(payload(i, N)) for i in range(6)])
        assert isinstance(pubs, livestats.Publishers) and len(pubs.publishers) == 2
        for i, p in enumerate(paths):
            assert pubs.publishers[i].publish_now()
            doc = json.loads(open(livestats.snapshot_path(p)).read())
            keys = sum(1 for k in range(6) if core.device_of(okey(k).encoded) == p)
            assert doc["snapshot"]["status"]["indexed_keys"] == keys
        core.mark_failed(paths[1], "test")
        assert pubs.publishers[1].publish_now(), "a failed device does not end its publisher"
        assert not (tmp_path / "stats" / livestats.snapshot_path(paths[1]).rsplit("/", 1)[1]).exists()
    finally:
        pubs.stop()
        core.close()
    assert not pubs.publishers[0].publish_now(), "a closed cache publishes nothing"
