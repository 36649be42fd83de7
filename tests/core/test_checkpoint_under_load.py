"""Checkpoints of the log-structured format while the cache never goes idle: the periodic
checkpoint is due once the oldest journaled change is one interval old, or once the journal
holds RB_ML_PENDING_MAX (16 MiB) of records, whatever the I/O; the journal's memory is in the
core's memory figure and its status; a checkpoint that wrote a whole base is counted."""

from __future__ import annotations

import time

from core_helpers import Obj, make_core, make_device, okey

NEVER_IDLE_MS = 600_000  # the idle rule would need 10 minutes without I/O: it never fires here
SLOT8K = 8192


def _log(path, **kw):
    kw.setdefault("meta_format", "log")
    return make_core(path, **kw)


def _status(core):
    return core._native.status()


def test_a_checkpoint_is_written_while_puts_never_stop(tmp_path):
    # 1 GiB sparse file of 8 KiB slots: ~130k slots, more than the loop below puts. Puts only
    # (a delete would wake the periodic thread for its freed slots), one key at a time.
    dev = make_device(tmp_path, size=1 << 30)
    c = _log(dev, slot_bytes=SLOT8K, meta_total_bytes=16 << 20, meta_enable_periodic=True,
             meta_checkpoint_interval_sec=1, meta_idle_quiet_ms=NEVER_IDLE_MS)
    try:
        obj = Obj(100)
        i = 0
        deadline = time.monotonic() + 60  # 60 intervals: a generous bound, not a timing check
        while _status(c)["checkpoints_written"] < 2 and time.monotonic() < deadline:
            r = c.put_many([okey(i)], [obj])
            assert r.results == [True], r.failure
            i += 1
            time.sleep(0.0005)  # about 2,000 puts a second: the slots last the whole bound
        st = _status(c)
        assert st["checkpoints_written"] >= 2, (i, st["metadata_persisted"], st["metadata_log"])
        assert st["metadata_persisted"] > 0
        assert st["checkpoint_failures"] == 0, st["checkpoint_last_error"]
    finally:
        c.close()
    c = _log(dev, slot_bytes=SLOT8K, meta_total_bytes=16 << 20)
    try:
        assert _status(c)["indexed_key_count"] == i
    finally:
        c.close()


def test_a_journal_past_its_bound_is_written_without_waiting_for_the_interval(tmp_path):
    # Keys of about 4 KB: 5,000 puts journal about 20 MiB of records, past the 16 MiB bound;
    # the interval (an hour) and the idle rule (10 minutes) cannot be what writes them.
    dev = make_device(tmp_path)
    c = _log(dev, slot_bytes=SLOT8K, meta_total_bytes=64 << 20, meta_enable_periodic=True,
             meta_checkpoint_interval_sec=3600, meta_idle_quiet_ms=NEVER_IDLE_MS)
    model = "m" * 4000
    try:
        obj = Obj(100)
        for b in range(50):
            ids = range(b * 100, b * 100 + 100)
            assert all(c.put_many([okey(i, model) for i in ids], [obj] * 100).results)
        deadline = time.monotonic() + 60
        while _status(c)["checkpoints_written"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        st = _status(c)
        assert st["checkpoints_written"] >= 1, st["metadata_log"]
        assert st["metadata_persisted"] >= 2000  # the bound is about 4,100 of these changes
    finally:
        c.close()


def test_the_journal_is_counted_in_memory_and_status_until_a_checkpoint(tmp_path):
    dev = make_device(tmp_path)
    c = _log(dev, slot_bytes=SLOT8K, meta_total_bytes=16 << 20)
    try:
        c.put_many([okey(0)], [Obj(10)])
        c.checkpoint_now()
        empty = c.index_memory_bytes()
        log0 = _status(c)["metadata_log"]
        assert log0["pending_records"] == 0
        model = "k" * 1000
        for b in range(20):
            ids = range(1 + b * 100, 1 + b * 100 + 100)
            assert all(c.put_many([okey(i, model) for i in ids], [Obj(10)] * 100).results)
        log = _status(c)["metadata_log"]
        assert log["pending_records"] >= 2000
        # every record holds its key (about 1 KB here)
        assert log["journal_bytes"] - log0["journal_bytes"] >= 2000 * 1000
        full = c.index_memory_bytes()
        assert full - empty >= log["journal_bytes"] - log0["journal_bytes"]
        c.checkpoint_now()
        after = _status(c)["metadata_log"]
        assert after["pending_records"] == 0
        assert after["journal_bytes"] < 2000 * 1000 // 10
        assert full - c.index_memory_bytes() >= log["journal_bytes"] - after["journal_bytes"]
    finally:
        c.close()


def test_a_checkpoint_that_wrote_a_base_is_counted(tmp_path):
    # A blank device: the first checkpoint writes a whole base, which covers every change.
    dev = make_device(tmp_path)
    c = _log(dev)
    try:
        c.put_many([okey(1)], [Obj(10)])
        c.checkpoint_now()
        st = _status(c)
        assert st["metadata_log"]["bases_written"] == 1
        assert st["checkpoints_written"] == 1
        assert st["metadata_persisted"] == st["metadata_dirty_total"]
    finally:
        c.close()


def test_a_compaction_writes_the_groups_that_are_due_while_it_builds_its_base(tmp_path):
    # No periodic thread; a 1 s interval, never idle. After the first base, 20 changes are
    # journaled and left to age past the interval; a compaction of 10,020 entries (three
    # slices of 4,096) then writes them as a group between its slices, where before it left
    # them to its base and wrote no group.
    dev = make_device(tmp_path, size=1 << 30)
    c = _log(dev, slot_bytes=SLOT8K, meta_total_bytes=16 << 20, meta_checkpoint_interval_sec=1,
             meta_idle_quiet_ms=NEVER_IDLE_MS)
    try:
        obj = Obj(10)
        for b in range(0, 10000, 1000):
            assert all(c.put_many([okey(i) for i in range(b, b + 1000)], [obj] * 1000).results)
        c.checkpoint_now()
        assert all(c.put_many([okey(i) for i in range(10000, 10020)], [obj] * 20).results)
        time.sleep(1.5)  # the 20 changes are now older than the interval: a checkpoint is due
        before = _status(c)["metadata_log"]
        assert before["pending_records"] >= 20
        c._native.compact_metadata()
        after = _status(c)["metadata_log"]
        assert after["compactions"] == before["compactions"] + 1
        assert after["groups_written"] > before["groups_written"], (before, after)
    finally:
        c.close()
