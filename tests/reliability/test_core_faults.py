"""What the core does when its device fails under it, with the core's fault hooks: a flush that
fails (as fdatasync reports a write-back error), a write that fails, and how that is reported
(the fault journal, put failures with their cause, log lines once per burst). The same faults on
real devices (a thin-provisioned loop device, a full file system, a truncated file) are in
tests/reliability/test_trust_faults.py."""

from __future__ import annotations

import errno
import logging

import pytest

from core_helpers import CORE_LOGGER, Obj, make_core, make_device, okey, payload
from lmcache_rawblock.raw_block.events import TrustEvents

N = 3000
LOGGER = CORE_LOGGER


def _put(core, ids):
    res = core.put_many([okey(i) for i in ids], [Obj(payload(i, N)) for i in ids])
    assert res.results == [True] * len(ids), res.failure
    return res


def _loads(core, ids):
    outs = [Obj(N) for _ in ids]
    ok = core.load_many_into([okey(i).encoded for i in ids], outs)
    for i, good, o in zip(ids, ok, outs):
        assert not good or o.bytes() == payload(i, N), f"key {i} served foreign bytes"
    return ok


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_failed_flush_drops_what_it_did_not_prove(tmp_path, engine):
    dev = make_device(tmp_path)
    core = make_core(dev, io_engine=engine)
    try:
        _put(core, [0, 1])
        core.checkpoint_now()  # 0, 1 durable
        _put(core, [2, 3])
        core._native._inject_fault("flush", 1)  # the next flush reports a write-back error
        with pytest.raises(OSError) as ei:
            core.checkpoint_now()
        assert ei.value.errno == errno.EIO
        st = core.report_status()
        assert st["writeback_failures"] == 1 and st["writeback_dropped_entries"] == 2
        assert st["undurable_writes"] == 0
        assert core.exists_many([okey(i).encoded for i in range(4)]) == [True, True, False, False]
        assert _loads(core, [0, 1]) == [True, True]
        f = st["io_errors"][-1]
        assert f["op"] == "flush" and f["errno"] == errno.EIO and f["offset"] is None
        assert dev in f["text"] and "(EIO)" in f["text"]
        assert st["io_error_counts"] == {"EIO": 1} and st["io_errors_total"] == 1
        # the core keeps accepting puts; a later good checkpoint lists them, not the dropped ones
        _put(core, [4])
        core.checkpoint_now()
        st = core.report_status()
        assert st["io_errors_total"] == 1 and st["io_error_counts"] == {"EIO": 1}, "a success clears nothing"
        assert "fdatasync failed" in st["checkpoint_last_error"]
    finally:
        core.close()
    core = make_core(dev, io_engine=engine)
    try:
        assert core.exists_many([okey(i).encoded for i in range(5)]) == [True, True, False, False, True]
        assert _loads(core, [0, 1, 4]) == [True] * 3
    finally:
        core.close()


def test_flush_failure_in_the_checkpoints_later_flushes_drops_only_newer_keys(tmp_path):
    # A checkpoint flushes three times; when its first flush succeeded, the keys it lists are
    # durable and stay; keys committed later are not proven and go.
    dev = make_device(tmp_path)
    core = make_core(dev)
    try:
        _put(core, [0, 1])
        core._native._inject_fault("flush", 2)  # the flush after the container's payload
        with pytest.raises(OSError):
            core.checkpoint_now()
        st = core.report_status()
        assert st["writeback_failures"] == 1 and st["writeback_dropped_entries"] == 0
        assert _loads(core, [0, 1]) == [True, True]
    finally:
        core.close()
    core = make_core(dev)
    try:
        assert _loads(core, [0, 1]) == [True, True]
    finally:
        core.close()


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_failed_write_names_its_cause(tmp_path, engine, caplog):
    dev = make_device(tmp_path)
    core = make_core(dev, io_engine=engine)
    try:
        core._native._inject_fault("write", 1)
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            res = core.put_many([okey(0)], [Obj(payload(0, N))])
        assert res.results == [False] and res.stored_keys == []
        assert isinstance(res.failure, OSError) and res.failure.errno == errno.EIO
        text = str(res.failure)
        assert "write failed at offset " in text and "(EIO); device_path=" in text and text.endswith(f"'{dev}'")
        lines = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
        assert len(lines) == 1 and dev in lines[0] and "(EIO)" in lines[0]
        st = core.report_status()
        assert st["io_errors"][-1]["op"] == "write" and st["io_error_counts"] == {"EIO": 1}
        _put(core, [1])  # a later success clears nothing
        assert core.report_status()["io_errors_total"] == 1
        assert core.put_many([okey(1)], [Obj(payload(1, N))]).failure is None  # already stored: True
    finally:
        core.close()


def test_no_free_slot_says_so(tmp_path):
    dev = make_device(tmp_path, size=(1 << 20) + 2 * 64 * 1024)  # metadata + two slots
    core = make_core(dev)
    try:
        _put(core, [0, 1])
        res = core.put_many([okey(2)], [Obj(payload(2, N))])
        assert res.results == [False] and isinstance(res.failure, RuntimeError)
        assert str(res.failure).startswith("no free slot: 2 slots, 2 indexed")
        res = core.put_many([okey(3)], [Obj(payload(3, 70 * 1024))])
        assert "does not fit a slot" in str(res.failure)
    finally:
        core.close()


def test_fault_journal_keeps_the_last_faults_oldest_first(tmp_path):
    dev = make_device(tmp_path)
    core = make_core(dev)
    try:
        for i in range(11):
            core._native._inject_fault("write", 1)
            assert core.put_many([okey(i)], [Obj(payload(i, N))]).results == [False]
        st = core.report_status()
        assert st["io_errors_total"] == 11 and st["io_error_counts"] == {"EIO": 11}
        assert [f["seq"] for f in st["io_errors"]] == list(range(4, 12))
        assert all(f["time"] > 1e9 for f in st["io_errors"])
    finally:
        core.close()


class _FakeNative:
    def __init__(self):
        self.counts = [0, 0, 0, 0]
        self.faults = []

    def trust_counters(self):
        return tuple(self.counts)

    def status(self):
        return {"faults": self.faults}

    def fault(self, text):
        self.counts[0] += 1
        self.faults.append({"seq": self.counts[0], "text": text})


def test_events_are_logged_once_per_burst(caplog):
    nat, now = _FakeNative(), [100.0]
    ev = TrustEvents(nat, logging.getLogger(LOGGER), "/dev/x", interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ev.check()
        assert not caplog.records  # nothing moved
        nat.fault("write failed at offset 1 of /dev/x: boom (EIO)")
        ev.check()
        for _ in range(50):  # a burst within the interval: counted, not logged
            nat.fault("write failed at offset 2 of /dev/x: boom (EIO)")
            nat.counts[1] += 1
            ev.check()
        msgs = [r.getMessage() for r in caplog.records]
        assert len(msgs) == 2 and "offset 1" in msgs[0] and "refused 1 load" in msgs[1]
        now[0] += 11
        ev.check()
        assert len(caplog.records) == 2  # nothing new since: nothing to say
        nat.fault("write failed at offset 3 of /dev/x: boom (EIO)")
        nat.counts[1] += 1
        ev.check()
        msgs = [r.getMessage() for r in caplog.records[2:]]
        assert len(msgs) == 2
        assert msgs[0].startswith("RawBlockCore 51 I/O errors since the last report") and "offset 3" in msgs[0]
        assert "refused 50 load" in msgs[1]
