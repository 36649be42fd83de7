"""Write-behind of buffered puts: at each 8 MiB of payload put through the page cache, the core's
periodic thread starts the write-back of the device's dirty pages without waiting for it
(sync_file_range), so a checkpoint's flush finds little left to write. It proves nothing about
durability (only the flush does), so the keys are checked through a checkpoint, a close and a
reopen; under O_DIRECT, or without the periodic thread, nothing is started."""

from __future__ import annotations

import time

import pytest

from core_helpers import META, SLOT, Obj, make_core, make_device, okey, payload

SIZE = 60 * 1024
N = 400  # 400 x 60 KiB: 23 MiB of payload, two write-behinds at least


def _put(core, ids):
    r = core.put_many([okey(i) for i in ids], [Obj(payload(i, SIZE)) for i in ids])
    assert all(r.results), r.failure


def _write_behinds(core):
    return core._native.status()["device_write_behinds"]


def _wait_for(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pred()


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_buffered_puts_start_their_write_back_at_each_8_mib(tmp_path, engine):
    dev = make_device(tmp_path, size=META + (N + 16) * SLOT)
    c = make_core(dev, meta_enable_periodic=True, io_engine=engine)
    for b in range(0, N, 50):
        _put(c, range(b, b + 50))
    assert _wait_for(lambda: _write_behinds(c) >= 2), _write_behinds(c)
    assert c.report_status()["device_write_behinds"] == _write_behinds(c)
    c.checkpoint_now()
    c.close()
    c = make_core(dev)
    objs = [Obj(SIZE) for _ in range(N)]
    assert all(c.load_many_into([okey(i).encoded for i in range(N)], objs))
    assert all(o.bytes() == payload(i, SIZE) for i, o in enumerate(objs))
    c.close()


@pytest.mark.parametrize("why", ["odirect", "no-periodic-thread"])
def test_no_write_behind_without_the_page_cache_or_the_periodic_thread(tmp_path, why):
    dev = make_device(tmp_path, size=META + (N + 16) * SLOT)
    kw = dict(use_odirect=True, meta_enable_periodic=True) if why == "odirect" else dict(meta_enable_periodic=False)
    c = make_core(dev, **kw)
    _put(c, range(N))
    time.sleep(0.5)  # what a write-behind would have had to start
    assert _write_behinds(c) == 0
    c.close()


def test_write_behind_wake_ups_do_not_put_off_the_periodic_checkpoint(tmp_path):
    """Format v1, a 1 s period, no quiet time needed: an 8 MiB put every fifth of a second wakes
    the periodic thread for its write-back five times a second, and its checkpoint still comes
    each second while they go on (a wake-up that writes none leaves the deadline standing)."""
    big, n = 8 << 20, 16
    dev = make_device(tmp_path, size=META + (n + 2) * (big + 4096))
    c = make_core(dev, meta_format="v1", slot_bytes=big + 4096, meta_enable_periodic=True,
                  meta_checkpoint_interval_sec=1, meta_idle_quiet_ms=0)
    obj = Obj(payload(0, big))  # made once: making 8 MiB in Python takes longer than the gap between puts
    written0 = c._native.status()["checkpoints_written"]
    for i in range(n):
        r = c.put_many([okey(i)], [obj])
        assert r.results == [True], r.failure
        time.sleep(0.2)
    st = c._native.status()
    assert st["device_write_behinds"] >= n // 2
    assert st["checkpoints_written"] - written0 >= 2, st["checkpoints_written"] - written0
    c.close()


def test_write_behind_wake_ups_do_not_put_off_the_retry_of_a_failed_log_checkpoint(tmp_path):
    """The log format's deadline follows its oldest change, but once that change is overdue (a
    checkpoint failed: here its first flush) the retry is one period on. An 8 MiB put every
    fifth of a second wakes the periodic thread for its write-back five times a second; the
    retry still comes a period later while they go on (the deadline stands)."""
    big, n = 8 << 20, 16
    dev = make_device(tmp_path, size=(128 << 20) + (n + 2) * (big + 4096))
    c = make_core(dev, meta_format="log", slot_bytes=big + 4096, meta_total_bytes=128 << 20,
                  meta_enable_periodic=True, meta_checkpoint_interval_sec=1, meta_idle_quiet_ms=0)
    c._native._inject_fault("flush", 1)  # the period's first checkpoint fails
    obj = Obj(payload(0, big))
    for i in range(n):
        r = c.put_many([okey(i)], [obj])
        assert r.results == [True], r.failure
        time.sleep(0.2)
    st = c._native.status()
    assert st["checkpoint_failures"] >= 1 and st["device_write_behinds"] >= n // 2
    assert st["checkpoints_written"] >= 1, "the failed checkpoint was not tried again during the puts"
    c.close()
