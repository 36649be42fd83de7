"""The live load-finish estimate (lmcache_rawblock.load_cost): the scheduler's pending bytes per
direction, an estimate that rises with the bytes queued ahead (a held store burst), the prior
bandwidth before any load is measured, the measured one after, and the prefix worth loading
(serve, truncate, refuse). Queues are built with the engine's hold (a test hook), never timing."""

from __future__ import annotations

import threading

import pytest

from core_helpers import HEADER, MiB, Obj, make_core, make_device, okey, payload
from lmcache_rawblock import load_cost
from lmcache_rawblock.load_cost import DeviceLoadCost, LoadCost, parse_rate, worth_loading

SLOT = 1 * MiB
PLEN = SLOT - HEADER


def ucore(dev, sched="loads_first", **kw):
    kw.setdefault("iouring_queue_depth", 16)
    try:
        return make_core(dev, io_engine="io_uring", slot_bytes=SLOT, io_scheduler=sched, **kw)
    except RuntimeError as e:
        if "io_uring" in str(e):
            pytest.skip(f"io_uring unavailable: {e}")
        raise


@pytest.fixture
def dev(tmp_path):
    return make_device(tmp_path, size=64 * MiB)


def wait_queued(core, n):
    """Until n requests wait in the held engine's queue (a hang guard only, never a verdict)."""
    for _ in range(200000):
        if core.report_status()["rust_io"]["queued_requests"] >= n:
            return
        threading.Event().wait(0.001)
    raise AssertionError("never saw the requests queued")


def held_store(core, keys, objs, while_held):
    """Run a put of keys while the engine holds its requests; call while_held() once they
    are queued, release, and return what it returned."""
    res = {}
    core._native._hold_engine(True)
    try:
        t = threading.Thread(target=lambda: res.setdefault("put", core.put_many(keys, objs).results))
        t.start()
        wait_queued(core, 2 * len(keys))
        seen = while_held()
    finally:
        core._native._hold_engine(False)
    t.join()
    assert res["put"] == [True] * len(keys)
    return seen


@pytest.mark.parametrize("sched", ["loads_first", "fifo"])
def test_pending_bytes_count_a_held_store_and_drain_to_zero(dev, sched):
    c = ucore(dev, sched)
    keys = [okey(i) for i in range(3)]
    objs = [Obj(payload(i, PLEN)) for i in range(3)]
    assert c._native.load_queue()[:3] == (0, 0, 0)
    written = c._native.load_queue()[4]
    reads, writes, inflight, _, during = held_store(c, keys, objs, c._native.load_queue)
    assert reads == 0
    assert writes >= 3 * PLEN, "every payload byte of the held store is pending"
    assert inflight >= 3 * PLEN
    assert during == written, "nothing of the held store completed"
    after = c._native.load_queue()
    assert after[:3] == (0, 0, 0)
    assert after[4] - written >= 3 * PLEN, "the completed write bytes count the store"
    c.close()


@pytest.mark.parametrize("sched", ["loads_first", "fifo"])
def test_estimate_rises_under_a_store_burst(dev, sched):
    c = ucore(dev, sched, write_max_bytes_in_flight=256 * 1024, write_piece_bytes=256 * 1024)
    old = okey(100)
    assert c.put_many([old], [Obj(payload(100, PLEN))]).results == [True]
    lc = LoadCost(c)
    idle = lc.estimate_load_seconds([old.encoded])
    keys = [okey(i) for i in range(4)]
    during = held_store(c, keys, [Obj(payload(i, PLEN)) for i in range(4)],
                        lambda: (lc.estimate_load_seconds([old.encoded]), lc.devices()[0].ahead_bytes()))
    assert during[0] > idle
    if sched == "fifo":
        assert during[1] >= 4 * PLEN, "fifo: a load waits behind every queued store byte"
    else:
        assert during[1] == 256 * 1024, "loads_first: only the write budget is ahead of a load"
    assert lc.estimate_load_seconds([old.encoded]) == pytest.approx(idle)
    c.close()


def test_no_history_uses_the_prior_and_a_load_measures_the_bandwidth(dev):
    c = ucore(dev)
    keys = [okey(i) for i in range(4)]
    assert c.put_many(keys, [Obj(payload(i, PLEN)) for i in range(4)]).results == [True] * 4
    lc = load_cost.attach(c, prior_bandwidth=100 * MiB)
    d = lc.devices()[0]
    assert d.samples == 0 and d.bandwidth == 100 * MiB
    assert d.key_bytes == SLOT - HEADER, "before a load: the slot's payload"
    # nothing queued: the keys' bytes over the prior
    assert lc.estimate_load_seconds([k.encoded for k in keys]) == pytest.approx(4 * PLEN / (100 * MiB))
    assert lc.estimate_load_seconds([okey(99).encoded]) == 0.0, "a key no device holds costs nothing"
    outs = [Obj(PLEN) for _ in keys]
    assert c.load_many_into([k.encoded for k in keys], outs) == [True] * 4
    assert d.samples == 1 and d.bandwidth > 0 and d.bandwidth != 100 * MiB
    assert c.load_cost is d, "the estimate measures the core it is attached to"
    c.close()


def test_estimate_by_bytes_per_device_names_an_unknown_device(dev):
    c = ucore(dev)
    lc = LoadCost(c, prior_bandwidth=1 * MiB)
    assert lc.estimate_load_seconds(bytes_per_device={dev: 2 * MiB}) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="/nope"):
        lc.estimate_load_seconds(bytes_per_device={"/nope": 1})
    with pytest.raises(ValueError, match="exactly one"):
        lc.estimate_load_seconds()
    c.close()


class _Native:
    def __init__(self, reads=0, writes=0):
        self.queue = (reads, writes, reads + writes, 0, 0)

    def load_queue(self):
        return self.queue

    def io_scheduler(self):
        return {"io_scheduler": "fifo", "write_max_bytes_in_flight": 16 * MiB}


class _Core:
    """The parts of a RawBlockCore a DeviceLoadCost reads, with a queue the test sets."""

    def __init__(self, path, reads=0, writes=0):
        self.device_path, self.io_engine, self.slot_bytes, self.header_bytes = path, "io_uring", MiB + 4096, 4096
        self._native = _Native(reads, writes)


def device(path, bw, reads=0, writes=0):
    return DeviceLoadCost(_Core(path, reads, writes), prior_bandwidth=bw)


def test_estimate_is_monotone_in_queued_bytes():
    d = device("/a", 100 * MiB)
    last = -1.0
    for queued in (0, 1, MiB, 10 * MiB, 100 * MiB):
        d._queue = _Native(writes=queued).load_queue
        est = d.seconds(4 * MiB)
        assert est > last
        last = est


# A chunk of 256 tokens of 1 MiB; recompute at 1,000 tokens/s: 0.256 s a chunk. Devices read
# 100 MiB/s: 0.01 s a chunk.
TPK, TPS = 256, 1000.0


def test_worth_loading_serves_a_prefix_that_loads_faster():
    a = device("/a", 100 * MiB)
    assert worth_loading([a] * 8, TPK, TPS) == 8
    assert worth_loading([a, a, None, a], TPK, TPS) == 2, "a miss ends the prefix"


def test_worth_loading_refuses_behind_a_deep_queue():
    a = device("/a", 100 * MiB, writes=1000 * MiB)  # 10 s ahead; 8 chunks recompute in 2 s
    assert worth_loading([a] * 8, TPK, TPS) == 0


def test_worth_loading_truncates_before_a_busy_device():
    a = device("/a", 100 * MiB)
    b = device("/b", 100 * MiB, writes=1000 * MiB)
    assert worth_loading([a, a, a, b, a, b], TPK, TPS) == 3
    lc_keys = [a, a, a]
    assert worth_loading(lc_keys + [None], TPK, TPS) == 3


def test_worth_loading_refuses_when_reads_are_slower_than_recompute():
    slow = device("/a", 1 * MiB)  # 1 s a chunk against 0.256 s of recompute
    assert worth_loading([slow] * 4, TPK, TPS) == 0


@pytest.mark.parametrize("bad", [0, -1, "fast", True, float("nan"), float("inf"), "0"])
def test_rate_setting_names_the_parameter_and_the_value(bad):
    with pytest.raises(ValueError, match=r"recompute_tps.*" + repr(bad).replace("(", r"\(").replace(")", r"\)")):
        parse_rate(bad, "recompute_tps")


def test_a_bandwidth_setting_names_its_unit():
    with pytest.raises(ValueError, match=r"prior must be a number > 0 \(bytes per second\), got -1"):
        parse_rate(-1, "prior", "bytes per second")


def test_rate_setting_unset_and_numbers():
    assert parse_rate(None, "x") is None and parse_rate("", "x") is None
    assert parse_rate("2500", "x") == 2500.0 and parse_rate(12.5, "x") == 12.5


def test_several_devices_take_the_slowest_device(tmp_path):
    from lmcache_rawblock.raw_block import MultiDeviceConfig, MultiDeviceCore

    from core_helpers import make_config

    paths = [make_device(tmp_path, size=32 * MiB, name=f"d{i}.img") for i in range(2)]
    m = MultiDeviceCore(MultiDeviceConfig.for_paths(make_config(paths[0], slot_bytes=SLOT), paths),
                        key_namespace="object")
    try:
        keys = [okey(i) for i in range(6)]
        assert m.put_many(keys, [Obj(payload(i, PLEN)) for i in range(6)]).results == [True] * 6
        lc = LoadCost(m, prior_bandwidth=10 * MiB)
        assert len(lc.devices()) == 2
        enc = [k.encoded for k in keys]
        where = [m.device_of(e) for e in enc]
        assert [d.device_path if d else None for d in lc.locate(enc)] == where
        most = max(where.count(p) for p in paths)
        assert lc.estimate_load_seconds(enc) == pytest.approx(most * PLEN / (10 * MiB))
        one = lc.estimate_load_seconds(bytes_per_device={paths[0]: 4 * MiB, paths[1]: 1 * MiB})
        assert one == pytest.approx(0.4)
        assert lc.estimate_spread_seconds(6) == pytest.approx(3 * PLEN / (10 * MiB))
        assert worth_loading(lc.locate(enc + [okey(99).encoded]), TPK, TPS) == 6
    finally:
        m.close()


def test_write_rate_is_measured_only_while_writes_are_pending():
    d = device("/a", 100 * MiB)
    assert d.write_bandwidth == 100 * MiB, "no history: the read bandwidth stands in"
    d._note_writes(10.0, 0, 0)
    d._note_writes(11.0, 50 * MiB, 8 * MiB)  # nothing was pending at the first reading
    assert d.write_samples == 0
    d._note_writes(12.0, 60 * MiB, 8 * MiB)
    assert d.write_samples == 1 and d.write_bandwidth == pytest.approx(10 * MiB)
    # writes ahead now cost their time at the write rate: 8 MiB at 10 MiB/s, then 1 MiB at 100 MiB/s
    assert d.seconds(1 * MiB, (0, 8 * MiB)) == pytest.approx(0.8 + 0.01)


def test_a_listed_cache_dropped_by_its_owner_leaves_the_list(dev):
    """The MP adapters' list holds its cores weakly, and each core's estimate lives on the core:
    once a core is closed and dropped, nothing in the list keeps it (or its device) alive."""
    import gc
    import weakref

    core = make_core(dev, slot_bytes=SLOT)
    load_cost.register(core)
    try:
        listed = load_cost.live()
        assert any(lc._core is core for lc in listed) and load_cost.registered(core) is not None
    finally:
        core.close()
    gone = weakref.ref(core)
    del core, listed
    gc.collect()
    assert gone() is None, "the list of caches kept a closed core alive"
    assert all(lc._core is not None for lc in load_cost.live())
