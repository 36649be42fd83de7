"""The in-process plugin's priced prefix lookup (rust_raw_block.load_cost_recompute_tokens_per_second):
off by default; on, batched_contains and batched_async_contains report the held prefix while
the device is idle and nothing while a store burst is queued ahead of a load (held by the
engine's test hook), pins only what they report, and a bad setting names itself and its value."""

from __future__ import annotations

import time

import pytest

from lmcache_rawblock.plugin import RustRawBlockBackend
from plugin_fakes import FakeEngineConfig, FakeLocalCPUBackend, FakeMetadata, base_extra, make_key, make_obj

MiB = 1 << 20
RATE = "load_cost_recompute_tokens_per_second"
PRIOR = "load_cost_prior_read_bytes_per_second"


@pytest.fixture
def backend(tmp_path, loop_thread):
    made = []

    def make(**overrides):
        path = tmp_path / "dev.img"
        if not path.exists():
            with open(path, "wb") as f:
                f.truncate(64 * MiB)
        try:
            be = RustRawBlockBackend(config=FakeEngineConfig(base_extra(str(path), **overrides)),
                                     metadata=FakeMetadata(), local_cpu_backend=FakeLocalCPUBackend(),
                                     loop=loop_thread.loop)
        except RuntimeError as e:
            if "io_uring" in str(e):
                pytest.skip(f"io_uring unavailable: {e}")
            raise
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


def put(be, keys):
    for f in be.batched_submit_put_task(keys, [make_obj(k.chunk_hash) for k in keys]) or []:
        f.result(30)


def test_off_by_default(backend):
    be = backend()
    assert be._pricer is None
    put(be, [make_key(i) for i in range(3)])
    assert be.batched_contains([make_key(i) for i in range(4)]) == 3


# 8 KiB payloads of 256-token chunks. Recompute at 4,000 tokens/s: 0.256 s for 4 chunks. Reads
# at the prior 1 MiB/s: 4 chunks 0.03 s from an idle device; behind 512 KiB of queued stores
# over 0.5 s.
ON = {RATE: 4000, PRIOR: MiB, "io_engine": "io_uring", "io_scheduler": "fifo"}


def held_burst(be, loop_thread, while_held):
    """Stores submitted while the engine holds them (at least 512 KiB queued) during while_held()."""
    core = be._core
    core._native._hold_engine(True)
    try:
        futs = be.batched_submit_put_task([make_key(1000 + i) for i in range(64)],
                                          [make_obj(1000 + i) for i in range(64)]) or []
        for _ in range(20000):  # a hang guard, not a verdict
            if core._native.load_queue()[1] >= 512 * 1024:
                break
            time.sleep(0.001)
        assert core._native.load_queue()[1] >= 512 * 1024, "the burst is queued"
        out = while_held()
    finally:
        core._native._hold_engine(False)
    for f in futs:
        f.result(30)
    return out


def test_served_when_idle_refused_behind_a_store_burst(backend, loop_thread):
    be = backend(**ON)
    keys = [make_key(i) for i in range(4)]
    put(be, keys)
    assert be.batched_contains(keys + [make_key(99)]) == 4
    assert loop_thread.run(be.batched_async_contains("l", keys)) == 4
    busy = held_burst(be, loop_thread, lambda: (be.batched_contains(keys),
                                                 loop_thread.run(be.batched_async_contains("l", keys, pin=True))))
    assert busy == (0, 0)
    assert be.lock_refcount(keys[0].to_string()) == 0, "nothing reported, nothing pinned"
    assert be._pricer.truncated_keys == 8
    assert loop_thread.run(be.batched_async_contains("l", keys, pin=True)) == 4
    assert be.lock_refcount(keys[0].to_string()) == 1
    for k in keys:
        assert be.unpin(k)


def test_reads_slower_than_recompute_report_nothing(backend):
    be = backend(**{RATE: 1e9, PRIOR: MiB})  # recompute a chunk in 0.26 us; read it in 8 ms
    keys = [make_key(i) for i in range(2)]
    put(be, keys)
    assert be.batched_contains(keys) == 0
    assert be._core.contains_key(keys[0].to_string()), "the chunks stay cached"


@pytest.mark.parametrize("bad", [0, -3, "fast", True, "nan"])
def test_a_bad_rate_names_the_setting_and_the_value(backend, bad):
    with pytest.raises(ValueError, match=r"rust_raw_block\.load_cost_recompute_tokens_per_second.*" + repr(bad)):
        backend(**{RATE: bad})


def test_a_bad_setting_leaves_nothing_open(backend):
    """A constructor refused for a bad load_cost setting closes its core (the device lock goes
    with it) and stops its metrics export: the next backend opens the same device."""
    import threading

    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(ValueError, match=RATE):
        backend(**{RATE: "fast"})
    assert {t.ident for t in threading.enumerate() if t.is_alive()} <= before, "a thread of the refused backend runs"
    be = backend()
    put(be, [make_key(1)])
    assert be.batched_contains([make_key(1)]) == 1


def test_a_prior_without_a_rate_is_refused(backend):
    with pytest.raises(ValueError, match=r"load_cost_prior_read_bytes_per_second.*needs.*" + RATE):
        backend(**{PRIOR: MiB})
