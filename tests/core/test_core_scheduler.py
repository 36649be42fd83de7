"""RawBlockCore over the io_uring scheduler (io_scheduler): stores cut into pieces are acknowledged
only once every piece completed, survive a reopen, and a failed piece fails the put without
freeing anything wrong; a load queued behind a stream of stores completes before the stores'
last piece; fifo keeps the one queue. Order comes from the engine's completion trace and its
hold (test hooks), never from timing."""

from __future__ import annotations

import threading

import pytest

from core_helpers import HEADER, MiB, Obj, make_core, make_device, okey, payload

SLOT = 1 * MiB
PLEN = SLOT - HEADER


def score(dev, sched="loads_first", **kw):
    kw.setdefault("iouring_queue_depth", 16)
    return make_core(dev, io_engine="io_uring", slot_bytes=SLOT, io_scheduler=sched, **kw)


@pytest.fixture
def dev(tmp_path):
    return make_device(tmp_path, size=64 * MiB)


def io(core):
    return dict(core.report_status()["rust_io"])


def available(core):
    st = core.report_status()
    return st["free_slot_count"] + st["max_slots"] - st["next_slot"]


@pytest.mark.parametrize("sched", ["loads_first", "fifo"])
def test_split_stores_round_trip_and_recover(dev, sched):
    keys = [okey(i) for i in range(8)]
    objs = [Obj(payload(i, PLEN - 1000 * i)) for i in range(8)]
    c = score(dev, sched, write_piece_bytes=64 * 1024)
    assert c.report_status()["io_scheduler"]["io_scheduler"] == sched
    assert c.put_many(keys, objs).results == [True] * 8
    outs = [Obj(len(o.bytes())) for o in objs]
    assert c.load_many_into([k.encoded for k in keys], outs) == [True] * 8
    assert [o.bytes() for o in outs] == [o.bytes() for o in objs]
    st = io(c)
    if sched == "loads_first":
        assert st["split_requests"] == 8 and st["peak_write_inflight_bytes"] <= 16 * MiB
    else:
        assert st["split_requests"] == 0
    c.checkpoint_now()
    c.close()
    c = score(dev, sched)
    outs = [Obj(len(o.bytes())) for o in objs]
    assert c.load_many_into([k.encoded for k in keys], outs) == [True] * 8
    assert [o.bytes() for o in outs] == [o.bytes() for o in objs]
    c.close()


def test_a_failed_piece_fails_the_put_and_frees_its_slots(dev):
    c = score(dev, write_piece_bytes=128 * 1024)
    a = okey(100)
    assert c.put_many([a], [Obj(payload(100, PLEN))]).results == [True]
    free_before = available(c)
    b, d = okey(101), okey(102)
    objs = [Obj(payload(101, PLEN)), Obj(payload(102, PLEN))]
    c._native._fail_engine_write(3)
    r = c.put_many([b, d], objs)
    assert r.results == [False, False], "a failed write rolls its chunk back"
    st = c.report_status()
    assert st["inflight_key_count"] == 0 and not c.exists_many([b.encoded, d.encoded])[0]
    assert available(c) == free_before, "the chunk's slots are free again, nothing else"
    assert io(c)["write_inflight_bytes"] == 0
    assert c.put_many([b, d], objs).results == [True, True]
    outs = [Obj(PLEN) for _ in range(3)]
    assert c.load_many_into([a.encoded, b.encoded, d.encoded], outs) == [True] * 3
    assert [o.bytes() for o in outs] == [payload(100, PLEN), payload(101, PLEN), payload(102, PLEN)]
    c.close()


def wait_queued(core, n):
    """Until n requests wait in the held engine's queue (a hang guard only, never a verdict)."""
    for _ in range(200000):
        if io(core)["queued_requests"] >= n:
            return
        threading.Event().wait(0.001)
    raise AssertionError(f"never saw {n} queued requests: {io(core)}")


@pytest.mark.parametrize("sched", ["loads_first", "fifo"])
def test_a_load_behind_a_stream_of_stores(dev, sched):
    """Four 1 MiB stores (eight requests) are queued, then a load: with one ring entry, under
    loads_first the load's reads complete before any piece of the stores; under fifo after every
    store's requests."""
    c = score(dev, sched, iouring_queue_depth=1, write_max_bytes_in_flight=128 * 1024,
              write_piece_bytes=128 * 1024)
    old = okey(200)
    assert c.put_many([old], [Obj(payload(200, PLEN))]).results == [True]
    keys = [okey(300 + i) for i in range(4)]
    objs = [Obj(payload(300 + i, PLEN)) for i in range(4)]
    out = Obj(PLEN)
    res = {}
    c._native._trace_engine(4096)
    c._native._hold_engine(True)
    try:
        t1 = threading.Thread(target=lambda: res.setdefault("put", c.put_many(keys, objs).results))
        t1.start()
        wait_queued(c, 8)
        t2 = threading.Thread(target=lambda: res.setdefault("load", c.load_many_into([old.encoded], [out])))
        t2.start()
        wait_queued(c, 9)
    finally:
        c._native._hold_engine(False)
    t1.join()
    t2.join()
    trace = c._native._trace_engine(0)
    assert res == {"put": [True] * 4, "load": [True]}
    assert out.bytes() == payload(200, PLEN)
    reads = [i for i, t in enumerate(trace) if t[0] == "read"]
    writes = [i for i, t in enumerate(trace) if t[0] == "write"]
    assert len(reads) == 2, "the load reads its slot header and its payload"
    if sched == "loads_first":
        assert reads == [0, 1], "one ring entry: the load is sent first"
        assert len(writes) == 4 * (PLEN // (128 * 1024) + 1) + 4, "payloads in pieces, headers whole"
    else:
        assert reads == [len(trace) - 2, len(trace) - 1], "fifo: the load waits for every store"
        assert len(writes) == 8
    c.close()
