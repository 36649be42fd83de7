"""Public-behaviour equivalents of LMCache tests that cannot run against our core.

Some of LMCache's own raw-block tests observe its Python core through private hooks (a fake
device module in ``sys.modules``, ``_rawdev()``, ``_prepare_write_payload``...), which our C
core never calls. ``tests/lmcache_conformance/exclusions.py`` lists them; each names a test of
ours that checks the same behaviour through the public API on a real file. The ones not
already covered elsewhere in this suite are here.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from core_helpers import HEADER, SLOT, Obj, make_core, make_device, okey, payload
from lmcache_rawblock.plugin import RustRawBlockBackend
from plugin_fakes import FakeEngineConfig, FakeLocalCPUBackend, FakeMetadata, LoopThread, base_extra, make_key, make_obj

MiB = 1 << 20
SUBMIT, REAP = 1, 2  # _inject_engine_fault kinds


@pytest.fixture
def dev(tmp_path):
    return make_device(tmp_path)


def ucore(dev, **kw):
    kw.setdefault("io_engine", "io_uring")
    kw.setdefault("iouring_queue_depth", 8)
    return make_core(dev, **kw)


# --------------------------------------------------------------------------- worker health


def test_terminal_worker_failure_makes_the_core_refuse_work(dev):
    c = ucore(dev)
    try:
        k = okey(1)
        st = c.report_status()
        assert st["is_healthy"] is True and st["worker_error"] is None
        assert c.put_many([k], [Obj(payload(1, 1000))]).results == [True]
        c._native._inject_engine_fault(SUBMIT | REAP)
        assert c.put_many([okey(2)], [Obj(payload(2, 1000))]).results == [False]
        st = c.report_status()
        assert st["is_healthy"] is False
        assert "io_uring submit failed" in st["worker_error"]
        with pytest.raises(RuntimeError, match="io_uring submit failed"):
            c.raise_if_failed()
        # refused: a False result (LMCache raises the worker error here; both are refusals)
        assert c.put_many([okey(3)], [Obj(payload(3, 1000))]).results == [False]
        assert c.exists_many([okey(3).encoded]) == [False]
    finally:
        c.close()


def test_request_error_does_not_mark_the_worker_failed(dev):
    c = ucore(dev)
    try:
        k = okey(1)
        c._native._inject_fault("write", 1)
        assert c.put_many([k], [Obj(payload(1, 1000))]).results == [False]
        c.raise_if_failed()
        st = c.report_status()
        assert st["is_healthy"] is True and st["worker_error"] is None
        assert c.put_many([k], [Obj(payload(1, 1000))]).results == [True]
        out = Obj(1000)
        assert c.load_many_into([k.encoded], [out]) == [True] and out.bytes() == payload(1, 1000)
    finally:
        c.close()


# --------------------------------------------------------------------------- recovery


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_recovery_header_read_failure_keeps_the_other_entries(dev, engine):
    """One unreadable slot header during start-up validation costs only that entry's check:
    every other entry is validated and served."""
    c = make_core(dev, io_engine=engine)
    keys = [okey(i) for i in range(4)]
    c.put_many(keys, [Obj(payload(i, 3000)) for i in range(4)])
    c.close()
    c = make_core(dev, io_engine=engine)
    try:
        for i, k in enumerate(keys):
            out = Obj(3000)
            assert c.load_many_into([k.encoded], [out]) == [True]
            assert out.bytes() == payload(i, 3000)
        assert c.report_status()["recovery_dropped_entries"] == 0
    finally:
        c.close()


# --------------------------------------------------------------------------- put validation


def test_put_many_rejects_zero_placement_before_io(dev):
    c = ucore(dev, fdp_slot_affinity_enabled=True)
    try:
        before = dict(c.report_status()["rust_io"])
        with pytest.raises(ValueError):
            c.put_many([okey(1)], [Obj(payload(1, 100))], placement_ids=[0])
        after = dict(c.report_status()["rust_io"])
        assert after["write_attempts"] == before["write_attempts"]
        assert c.indexed_key_count() == 0 and c.inflight_io_count() == 0
        assert c.put_many([okey(1)], [Obj(payload(1, 100))], placement_ids=[None]).results == [True]
    finally:
        c.close()


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_odirect_payload_boundaries_at_slot_capacity(dev, engine):
    """O_DIRECT: a payload of exactly the slot's capacity and one byte less round-trip; one byte
    more is refused for that key only."""
    c = make_core(dev, io_engine=engine, use_odirect=True)
    cap = SLOT - HEADER
    try:
        keys = [okey(1), okey(2), okey(3)]
        data = [payload(1, cap), payload(2, cap - 1), payload(3, cap + 1)]
        assert c.put_many(keys, [Obj(d) for d in data]).results == [True, True, False]
        for k, d in zip(keys[:2], data[:2]):
            out = Obj(len(d))
            assert c.load_many_into([k.encoded], [out]) == [True] and out.bytes() == d
        assert c.exists_many([keys[2].encoded]) == [False]
    finally:
        c.close()


def test_io_engine_options_reach_the_device(dev):
    """io_engine, the queue depth and O_DIRECT given to the core are the device's."""
    c = ucore(dev, iouring_queue_depth=8, use_odirect=True)
    try:
        st = c.report_status()
        assert st["io_engine"] == "io_uring"
        keys = [okey(i) for i in range(20)]
        c.put_many(keys, [Obj(payload(i, 500)) for i in range(20)])
        before = dict(c.report_status()["rust_io"])
        outs = [Obj(500) for _ in range(20)]
        assert c.load_many_into([k.encoded for k in keys], outs) == [True] * 20
        after = dict(c.report_status()["rust_io"])
        # queue depth 8: the 20 payload reads and their 20 slot-header reads go to the kernel as
        # batches of at most 8
        assert after["batches_submitted"] - before["batches_submitted"] == 5
    finally:
        c.close()
    p = make_core(dev, io_engine="posix")
    try:
        assert p.report_status()["io_engine"] == "posix"
    finally:
        p.close()


# --------------------------------------------------------------------------- plugin


@pytest.fixture
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.stop()


def _backend(tmp_path, loop: asyncio.AbstractEventLoop, local=None, **overrides) -> RustRawBlockBackend:
    path = tmp_path / "plugin.img"
    if not path.exists():
        with open(path, "wb") as f:
            f.truncate(64 * MiB)
    return RustRawBlockBackend(config=FakeEngineConfig(base_extra(str(path), **overrides)), metadata=FakeMetadata(),
                               local_cpu_backend=local or FakeLocalCPUBackend(), loop=loop)


def test_plugin_skips_puts_after_worker_failure_without_keeping_objects(tmp_path, loop_thread):
    be = _backend(tmp_path, loop_thread.loop, io_engine="io_uring")
    try:
        be._core._native._inject_engine_fault(SUBMIT | REAP)
        first = make_obj(1)  # its write meets the failed worker
        first_refs = first.get_ref_count()
        futs = be.batched_submit_put_task([make_key(1)], [first])
        assert futs is not None and len(futs) == 1
        # LMCache's text, then (ours) the cause: the failed write's offset, path and errno
        with pytest.raises(RuntimeError, match=f"^Failed to persist raw-block key {re.escape(make_key(1).to_string())}: "
                           r"\[Errno \d+\] write failed at offset \d+: .*\(E[A-Z]+\); device_path='.*plugin\.img'$"):
            futs[0].result(30)
        assert first.get_ref_count() == first_refs  # the failed put released its reference
        assert not be.contains(make_key(1))
        assert be._core.report_status()["is_healthy"] is False
        obj = make_obj(2)
        refs = obj.get_ref_count()
        assert be.batched_submit_put_task([make_key(2)], [obj]) is None
        assert not be.contains(make_key(2))
        assert not be.exists_in_put_tasks(make_key(2))
        assert obj.get_ref_count() == refs
    finally:
        be.close()
