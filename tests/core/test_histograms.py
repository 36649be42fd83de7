"""The core's histograms and miss counters (csrc/core/rb_hist.h): each operation counted once per
call with its bytes, each key a load did not serve counted under its reason, and recording
switched off leaves every figure where it was."""

from __future__ import annotations

import pytest

from core_helpers import Obj, make_core, make_device, okey, payload

N = 1000


def _h(core):
    return core._native.histograms()


def _counts(snap):
    return {k: v["count"] for k, v in snap["histograms"].items()}


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_each_call_is_counted_once_with_its_bytes(tmp_path, engine):
    c = make_core(make_device(tmp_path), io_engine=engine)
    try:
        ks = [okey(i) for i in range(6)]
        c.put_many(ks[:4], [Obj(payload(i, N)) for i in range(4)])
        c.put_many(ks[4:5], [Obj(payload(4, 3 * N))])
        assert c.load_many_into([k.encoded for k in ks], [Obj(3 * N) for _ in ks]) == [True] * 5 + [False]
        assert c.delete_many([ks[0].encoded, ks[5].encoded]) == [True, False]
        s = _h(c)
        h = s["histograms"]
        assert s["enabled"] is True
        assert (h["put_ns"]["count"], h["load_ns"]["count"], h["delete_ns"]["count"]) == (2, 1, 1)
        assert (h["put_bytes"]["count"], h["put_bytes"]["sum"]) == (2, 7 * N)
        assert (h["load_bytes"]["count"], h["load_bytes"]["sum"]) == (1, 7 * N)
        assert s["hits"] == 5 and s["deleted"] == 1
        assert s["misses"] == {"absent": 1, "evicted": 0, "refused_header": 0, "checksum": 0, "device_error": 0}
        # three calls in flight, one at a time: each saw its own bytes only (the load 7 N)
        assert h["inflight_bytes"]["count"] == 3 and s["peak_inflight_bytes"] == 7 * N
        assert s["inflight_bytes"] == 0
        for name in ("put_ns", "load_ns", "delete_ns"):
            b = h[name]["buckets"]
            assert sum(n for _, n in b) == h[name]["count"] and h[name]["sum"] > 0
            assert all(up > 0 for up, _ in b)
        if engine == "io_uring":  # every batch seen by the engine: its queue wait and device time apart
            assert h["queue_wait_ns"]["count"] == h["device_ns"]["count"] > 0
        else:
            assert h["queue_wait_ns"]["count"] == h["device_ns"]["count"] == 0
    finally:
        c.close()


def test_the_buckets_hold_every_sample_under_its_upper_bound(tmp_path):
    c = make_core(make_device(tmp_path))
    try:
        sizes = [1, 2, 3, 4, 5, 7, 8, 100, 4096, 5000, 65535]
        for i, n in enumerate(sizes):
            c.put_many([okey(i)], [Obj(payload(i, n))])
        b = _h(c)["histograms"]["put_bytes"]["buckets"]
        uppers = [u for u, _ in b]
        assert uppers == sorted(uppers)
        # each size lands in the first bucket whose exclusive upper bound is above it
        got = {}
        for n in sizes:
            up = min(u for u in uppers if u > n)
            got[up] = got.get(up, 0) + 1
        assert dict(b) == got
        # log-linear: a bucket is at most a quarter of its lower edge wide
        assert dict(b)[5] == 1 and dict(b)[5120] == 2 and dict(b)[65536] == 1  # 4096 and 5000 share [4096, 5120)
    finally:
        c.close()


def test_a_miss_is_counted_under_why_the_key_was_not_served(tmp_path):
    dev = make_device(tmp_path)
    c = make_core(dev, verify_payload_checksum=True)
    try:
        ks = [okey(i) for i in range(5)]
        c.put_many(ks, [Obj(payload(i, N)) for i in range(5)])
        assert c.delete_many([ks[0].encoded]) == [True]
        off = {k.encoded: c.entry_offset(k.encoded) for k in ks[1:]}
        with open(dev, "r+b") as f:
            f.seek(off[ks[1].encoded])  # the slot header: another key's magic
            f.write(b"NOTOURS!")
            f.seek(off[ks[2].encoded] + 4096)  # the payload: its checksum no longer holds
            f.write(b"\xff" * 16)
        c._native._inject_fault("read", 3)  # ks[3]'s read fails (ks[1], ks[2] read first)
        got = c.load_many_into([k.encoded for k in ks] + [okey(99).encoded], [Obj(N) for _ in range(6)])
        assert got == [False, False, False, False, True, False]
        s = _h(c)
        assert s["misses"] == {"absent": 1, "evicted": 1, "refused_header": 1, "checksum": 1, "device_error": 1}
        assert s["hits"] == 1
    finally:
        c.close()


def test_recording_switched_off_leaves_the_figures_alone(tmp_path):
    c = make_core(make_device(tmp_path))
    try:
        k = okey(1)
        c.put_many([k], [Obj(payload(1, N))])
        before = _h(c)
        c._native.set_histograms(False)
        c.put_many([okey(2)], [Obj(payload(2, N))])
        assert c.load_many_into([k.encoded, okey(3).encoded], [Obj(N), Obj(N)]) == [True, False]
        c.delete_many([k.encoded])
        off = _h(c)
        assert off["enabled"] is False
        assert _counts(off) == _counts(before)
        c._native.set_histograms(True)
        c.put_many([okey(4)], [Obj(payload(4, N))])
        assert _counts(_h(c))["put_ns"] == _counts(before)["put_ns"] + 1
    finally:
        c.close()


def test_checkpoint_and_validation_are_timed_when_they_do_work(tmp_path):
    dev = make_device(tmp_path)
    c = make_core(dev)
    try:
        c.checkpoint_now()  # nothing to write: not timed
        n0 = _h(c)["histograms"]["checkpoint_ns"]["count"]
        c.put_many([okey(1)], [Obj(payload(1, N))])
        c.checkpoint_now()
        assert _h(c)["histograms"]["checkpoint_ns"]["count"] == n0 + 1
    finally:
        c.close()
    c = make_core(dev)
    try:
        h = _h(c)["histograms"]
        assert h["validate_ns"]["count"] >= 1 and h["validate_ns"]["sum"] > 0
    finally:
        c.close()


def test_a_closed_core_still_reports_its_figures(tmp_path):
    c = make_core(make_device(tmp_path))
    c.put_many([okey(1)], [Obj(payload(1, N))])
    c.close()
    assert _h(c)["histograms"]["put_ns"]["count"] == 1



@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_calls_from_more_threads_than_shards_are_each_counted(tmp_path, engine):
    # the core keeps 8 shards; 12 threads share them, some recording into the shared one
    import threading

    c = make_core(make_device(tmp_path), io_engine=engine)
    try:
        ks = [okey(i) for i in range(4)]
        c.put_many(ks, [Obj(payload(i, N)) for i in range(4)])
        before = _h(c)
        threads, calls, errors = 12, 40, []

        def loads(t):
            try:
                for j in range(calls):
                    k = ks[(t + j) % 4].encoded
                    if c.load_many_into([k, okey(1000 + t).encoded], [Obj(N), Obj(N)]) != [True, False]:
                        errors.append((t, j))
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(e)

        ts = [threading.Thread(target=loads, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors
        s = _h(c)
        h, n = s["histograms"], threads * calls
        assert h["load_ns"]["count"] - before["histograms"]["load_ns"]["count"] == n
        assert sum(x for _, x in h["load_ns"]["buckets"]) == h["load_ns"]["count"]
        assert h["load_bytes"]["sum"] - before["histograms"]["load_bytes"]["sum"] == n * N
        assert s["hits"] - before["hits"] == n and s["misses"]["absent"] - before["misses"]["absent"] == n
        assert s["inflight_bytes"] == 0
    finally:
        c.close()
