"""An NVMe controller pulled out of a running multi-device cache (QEMU device_del in the guest)
and put back (device_add over the same backing file): the kernel removes the namespace under
the cache's open descriptors, as a drive pulled from its slot. Needs the rig with
--nvme-count 4 (make test-nvme): a MultiDeviceCore over controllers 1..3, controller 2 pulled
while a writer stores and loads across all three."""

from __future__ import annotations

import pytest

from lmcache_rawblock_bench import nvme_hotplug
from lmcache_rawblock_bench.pulled_drive import Obj, Workload, key, open_cache, payload

MiB = 1 << 20
CTRLS = [1, 2, 3]
VICTIM = 2
OBJ = 60000


@pytest.fixture
def cache(tmp_path):
    if nvme_hotplug.count() < max(CTRLS) + 1:
        pytest.skip(f"needs the NVMe rig with --nvme-count {max(CTRLS) + 1} (make test-nvme); "
                    f"it has {nvme_hotplug.count()} controller(s)")
    paths = [nvme_hotplug.stable_path(k, tmp_path) for k in CTRLS]
    core = open_cache(paths, capacity=64 * MiB, slot=64 * 1024)
    yield core, paths, tmp_path
    core.close()
    if nvme_hotplug.find(VICTIM) is None:  # a failure midway: leave the guest as it was
        nvme_hotplug.put_back(VICTIM)


def test_a_pulled_controller_costs_only_its_keys_and_serves_them_when_back(cache):
    core, paths, links = cache
    victim = paths[CTRLS.index(VICTIM)]
    others = [p for p in paths if p != victim]
    w = Workload(core, obj_bytes=OBJ, batch=4, sample=8)
    w.start()
    try:
        w.wait_rounds(6)
        stored_before = w.next_id - w.batch  # every key below this one was stored before the checkpoint
        core.checkpoint_now()
        w.wait_rounds(2)
        w.set_phase("pulling")
        nvme_hotplug.pull(VICTIM)  # under the writer
        w.wait_rounds(1)  # the round in flight at the pull ends; the next ones start after it
        w.set_phase("during")
        w.wait_rounds(8)
        states = [s["state"] for s in core.device_states()]
        st = core.report_status()
        w.set_phase("back")
        nvme_hotplug.put_back(VICTIM)
        nvme_hotplug.stable_path(VICTIM, links)
        back = core.reopen_device(victim)
        w.set_phase("after")
        w.wait_rounds(8)
    finally:
        w.finish()
    assert not w.errors, w.errors  # no load or store raised
    counts = w.counts

    # the writer's failure detection, not a probe of ours, marked it failed; the others serve
    assert states == ["online" if p != victim else "failed" for p in paths], states
    assert st["degraded"] and st["devices_failed"] == 1 and st["is_healthy"], st
    during = counts["during"]
    for p in others:  # the others keep serving, and take the new keys
        assert during[p]["put_keys"] > 0 and during[p]["load_keys"] > 0, (p, dict(during))
    assert during[victim]["load_keys"] == 0 and during[victim]["put_keys"] == 0, dict(during[victim])
    assert during[victim]["misses"] > 0, "its keys are misses, not exceptions"
    assert all(during[p]["misses"] == 0 for p in others), dict(during)
    assert sum(c["wrong"] for ph in counts.values() for c in ph.values()) == 0, "0 wrong bytes"

    # back: what it held durably before the pull serves again
    assert back["recovery_outcome"] in ("loaded", "fallback"), back
    durable = [i for i in range(stored_before) if w.stored.get(i) == victim]
    assert durable and back["indexed_key_count"] >= len(durable)
    outs = [Obj(OBJ) for _ in durable]
    got = core.load_many_into([key(i).encoded for i in durable], outs, raise_on_error=True)
    assert all(got), f"{got.count(False)} of {len(durable)} keys stored before the pull are missing"
    assert all(o.bytes() == payload(i, OBJ) for i, o in zip(durable, outs))
    assert counts["after"][victim]["put_keys"] > 0, "it takes new keys again"

    # over everything ever stored: 0 wrong bytes, and only the pulled drive's keys lost
    ids, loaded, wrong = w.verify_all()
    assert wrong == 0
    lost = [i for i, ok in zip(ids, loaded) if not ok]
    assert all(w.stored[i] in (victim, "?") for i in lost), [(i, w.stored[i]) for i in lost][:5]
    assert core.report_status()["devices_online"] == 3
