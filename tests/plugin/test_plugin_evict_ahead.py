"""Evict-ahead under ``rust_raw_block.eviction_policy: lru``: puts on a full cache never fail.

``rust_raw_block.eviction_trigger_watermark`` / ``eviction_ratio`` start a background evictor
that deletes least-recently-used unpinned entries in one batch and writes the checkpoint that
makes their slots reusable; a put that still finds no slot evicts for its whole batch and
retries. Under either policy, the slots a remove frees are made reusable on that background
thread, not by the put that next needs them. Real files in tmp_path, real threads, the
stand-in LMCache objects of
tests/plugin_fakes.py. Nothing here is timed: waits are for a condition, with a generous
bound that only a hang reaches.
"""

from __future__ import annotations

import logging
import math
import struct
import threading

import pytest

from helpers import REPO
from lmcache_rawblock.plugin import RustRawBlockBackend
from plugin_fakes import (
    FMT,
    SHAPE,
    FakeEngineConfig,
    FakeLocalCPUBackend,
    FakeMemoryObj,
    FakeMetadata,
    base_extra,
    make_key,
)

MiB = 1 << 20
SLOT = 4096 + 8192  # header + one 8 KiB chunk (plugin_fakes.SHAPE in bfloat16)
PAYLOAD = math.prod(SHAPE) * 2
IDLE_WAIT_S = 60.0  # only a hung evictor reaches it


def payload(i: int) -> bytes:
    """Bytes that name their key: a load that returned another key's slot would show it."""
    head = struct.pack("<QQ", i, i ^ 0x5A5A5A5A5A5A5A5A)
    body = bytes(((i * 131) + j) & 0xFF for j in range(256))
    return (head + body * (PAYLOAD // 256 + 1))[:PAYLOAD]


def obj(i: int) -> FakeMemoryObj:
    return FakeMemoryObj(SHAPE, "bfloat16", FMT, payload(i))


@pytest.fixture
def open_backend(tmp_path, loop_thread):
    made: list[RustRawBlockBackend] = []

    def make(slots: int = 64, name: str = "dev.img", **overrides) -> RustRawBlockBackend:
        path = tmp_path / name
        if not path.exists():
            with open(path, "wb") as f:
                f.truncate(4 * MiB + slots * SLOT)  # metadata region, then the slots
        cfg = FakeEngineConfig(base_extra(str(path), **overrides))
        be = RustRawBlockBackend(config=cfg, metadata=FakeMetadata(), local_cpu_backend=FakeLocalCPUBackend(),
                                 loop=loop_thread.loop)
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


def put_keys(be, ids: list[int]) -> list[BaseException]:
    """One batched_submit_put_task of ids; the errors of its futures."""
    futs = be.batched_submit_put_task([make_key(i) for i in ids], [obj(i) for i in ids])
    assert futs is not None, f"keys {ids} were skipped (already stored?)"
    errors = []
    for f in futs:
        try:
            f.result(120)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    return errors


def fill_full(open_backend, slots: int, **overrides) -> tuple[RustRawBlockBackend, int]:
    """A device whose every slot holds an entry (keys 0..usable-1, written with policy none
    and checkpointed at close), reopened with ``overrides``: (backend, usable slots)."""
    be = open_backend(slots=slots)
    usable = be._core.slot_counts().usable
    for start in range(0, usable, 64):
        assert not put_keys(be, list(range(start, min(usable, start + 64))))
    assert be.indexed_key_count() == usable
    be.close()
    be = open_backend(slots=slots, **overrides)
    c = be._core.slot_counts()
    assert (c.indexed, c.reusable, c.held) == (usable, 0, 0), "the reopened cache is full"
    return be, usable


def assert_loads(be, ids) -> None:
    for i in ids:
        got = be.get_blocking(make_key(i))
        assert got is not None, f"key {i} missing"
        assert got.tobytes() == payload(i), f"key {i} loaded another key's bytes"


# --------------------------------------------------------------------------- a full cache under threads


def _run_threads(be, threads: int, first: int, total: int, batch: int) -> tuple[int, list[BaseException], list[int]]:
    """``threads`` callers storing keys first..first+total-1 between them, ``batch`` keys per
    call: (keys attempted, errors, the keys in the order their puts completed)."""
    per_thread = [list(range(first + t, first + total, threads)) for t in range(threads)]
    errors: list[BaseException] = []
    done: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def run(ids: list[int]) -> None:
        start.wait()
        for k in range(0, len(ids), batch):
            errs = put_keys(be, ids[k:k + batch])
            with lock:
                errors.extend(errs)
                done.extend(ids[k:k + batch])

    workers = [threading.Thread(target=run, args=(ids,)) for ids in per_thread]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(map(len, per_thread)), errors, done


CASES = [
    # (threads, keys per put call, io engine): multi-key puts reach the core as one batch on
    # io_uring (posix stores one key per call)
    pytest.param(1, 1, "posix", id="1-thread-one-key"),
    pytest.param(4, 1, "posix", id="4-threads-one-key"),
    pytest.param(8, 1, "posix", id="8-threads-one-key"),
    pytest.param(1, 8, "io_uring", id="1-thread-batch"),
    pytest.param(4, 8, "io_uring", id="4-threads-batch"),
    pytest.param(8, 8, "io_uring", id="8-threads-batch"),
]


@pytest.mark.parametrize("threads,batch,engine", CASES)
def test_full_cache_puts_never_fail(open_backend, threads, batch, engine):
    """A full 256-slot cache, 2,400 new keys from 1, 4 or 8 threads: no put fails, the keys each
    thread stored last load their own bytes, pinned entries (the least recently used of all)
    survive, and the evictor did the evicting."""
    be, usable = fill_full(open_backend, 256, eviction_policy="lru", io_engine=engine)
    pinned = list(range(8))  # the oldest entries: first in line for eviction
    assert all(be.pin(make_key(i)) for i in pinned)

    attempted, errors, done = _run_threads(be, threads, first=usable, total=2400, batch=batch)
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    st = be.report_status()
    print(f"\n{threads} threads x {batch}-key puts ({engine}): {attempted} attempted, {len(errors)} failed; "
          f"evicted ahead {st['evicted_ahead_entries']}, by puts {st['put_evicted_entries']}, "
          f"put retries {st['put_evict_retries']}, checkpoints for room {st['checkpoints_for_room']}, "
          f"evictor passes {st['evictor_passes']}")
    assert attempted == 2400
    assert errors == [], f"{len(errors)} of {attempted} puts failed; first: {errors[0]}"
    assert st["evictor_errors"] == 0
    assert st["evicted_ahead_entries"] > 0, "the evictor evicted nothing"
    assert st["indexed_key_count"] <= usable
    for i in pinned:
        assert be.contains(make_key(i)), f"pinned key {i} was evicted"
    assert_loads(be, pinned)
    # The 64 puts that completed last are far younger than the 230 entries evict-ahead keeps.
    assert_loads(be, done[-64:])
    assert be.inflight_io_count() == 0
    for i in pinned:
        assert be.unpin(make_key(i))


@pytest.mark.parametrize("threads", [4, 8])
def test_full_cache_puts_never_fail_without_evict_ahead(open_backend, threads):
    """eviction_ratio 0 turns evict-ahead off: the put path's own eviction alone keeps every
    put succeeding under threads (each evicts for its batch and retries while others take the
    slots it freed)."""
    be, usable = fill_full(open_backend, 256, eviction_policy="lru", eviction_ratio=0)
    # Each put here writes the checkpoints that free its slot itself: 800 keep the test short.
    attempted, errors, done = _run_threads(be, threads, first=usable, total=800, batch=1)
    st = be.report_status()
    print(f"\n{threads} threads, evict-ahead off: {attempted} attempted, {len(errors)} failed; "
          f"evicted by puts {st['put_evicted_entries']}, put retries {st['put_evict_retries']}, "
          f"checkpoints for room {st['checkpoints_for_room']}")
    assert errors == [], f"{len(errors)} of {attempted} puts failed; first: {errors[0]}"
    assert st["evicted_ahead_entries"] == 0
    assert st["put_evicted_entries"] >= attempted - usable
    assert_loads(be, done[-64:])


# --------------------------------------------------------------------------- what the evictor does


def test_evictor_frees_slots_before_puts_need_them(open_backend):
    """On a full cache the evictor deletes the least-recently-used entries down to trigger -
    ratio in one pass and writes the checkpoint that frees their slots: the puts after it take
    those slots without evicting and without a checkpoint of their own."""
    be, usable = fill_full(open_backend, 40, eviction_policy="lru", eviction_trigger_watermark=0.75,
                           eviction_ratio=0.25)
    trigger, low = be._eviction_marks(usable)
    assert (trigger, low) == (math.ceil(0.75 * usable), math.floor(0.5 * usable))
    # Recovered entries are in the order they were committed (the fill's puts run on several
    # executor threads, so not quite key order): that is the LRU order.
    order = list(be._core.snapshot_indexed_keys())
    assert list(be._lru) == order
    # The first put finds no slot: it evicts one entry itself, stores (the core writing the
    # checkpoint that frees the slot, as it does when a put finds only held slots), and wakes
    # the evictor.
    assert not put_keys(be, [usable])
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    st = be.report_status()
    c = be._core.slot_counts()
    assert st["put_evicted_entries"] == 1
    # Down to `low` in use; a core that frees slots only at the second checkpoint after a
    # change (v1) costs one more victim, whose slot waits for the next pass.
    extra = st["evicted_ahead_entries"] - (usable - low)
    assert extra in (0, 1), st["evicted_ahead_entries"]
    assert (c.indexed, c.held, c.reusable) == (low - extra, extra, usable - low), "evicted slots are reusable"
    room_checkpoints = c.room_checkpoints  # the first put's
    assert room_checkpoints <= 1
    # The least recently used went first: the oldest recovered entries.
    survivors = [enc for enc in order if be._core.contains_key(enc)]
    assert survivors == order[len(order) - (low - 1 - extra):]
    assert be.contains(make_key(usable))

    # Up to the trigger again, puts only take free slots: nobody evicts, nobody checkpoints.
    more = list(range(usable + 1, usable + 1 + (trigger - low - 1)))
    for i in more:
        assert not put_keys(be, [i])
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    st = be.report_status()
    assert st["put_evicted_entries"] == 1 and st["put_evict_retries"] == 1
    assert st["checkpoints_for_room"] == room_checkpoints
    assert be.indexed_key_count() == trigger - 1 - extra
    assert_loads(be, [usable, *more])


def test_evictor_reclaims_slots_freed_by_removes(open_backend):
    """Slots freed by LMCache's removes wait for a checkpoint; the evictor writes it, so the
    next puts on the full device need none."""
    be, usable = fill_full(open_backend, 32, eviction_policy="lru", eviction_trigger_watermark=1.0,
                           eviction_ratio=0.05)
    written = be._core._native.status()["checkpoints_written"]
    assert be.batched_remove([make_key(i) for i in range(10)], force=False) == 10
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    assert be._core._native.status()["checkpoints_written"] > written, "the evictor wrote a checkpoint"
    c = be._core.slot_counts()
    assert c.held + c.reusable == 10
    for i in range(usable, usable + 10):
        assert not put_keys(be, [i])
    st = be.report_status()
    assert st["put_evicted_entries"] == 0
    # Without the evictor's checkpoint the first put writes one per container (v1: two); a core
    # that frees held slots at the first checkpoint after a delete leaves none to the puts.
    assert st["checkpoints_for_room"] <= 1


def test_pinned_entries_are_never_evicted_ahead(open_backend):
    """With every entry pinned, evict-ahead evicts nothing and a put fails saying why (pinned
    entries); once one is unpinned, it is the one that goes."""
    be, usable = fill_full(open_backend, 16, eviction_policy="lru", eviction_ratio=0.5)
    for i in range(usable):
        assert be.pin(make_key(i))
    errors = put_keys(be, [100])
    assert len(errors) == 1
    msg = str(errors[0])
    assert "no slot is free and nothing is left to evict" in msg, msg
    assert f"{usable} slots, {usable} indexed ({usable} pinned, 0 more locked by loads), 0 being written, " \
           f"0 freed and waiting for a checkpoint, 0 reusable" in msg, msg
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    assert be.report_status()["evicted_ahead_entries"] == 0
    assert all(be.contains(make_key(i)) for i in range(usable))
    assert be.unpin(make_key(3))
    assert not put_keys(be, [100])
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    assert not be.contains(make_key(3))
    # Evict-ahead may take the new key too (the only unpinned entry left), nothing else.
    assert be.report_status()["evicted_ahead_entries"] == int(not be.contains(make_key(100)))
    kept = [i for i in range(usable) if i != 3]
    assert all(be.contains(make_key(i)) for i in kept)
    assert_loads(be, kept)


def test_evictor_starts_lazily_and_stops_at_close(open_backend):
    be = open_backend(eviction_policy="lru")
    assert be._evictor is not None and not be._evictor.running
    assert be.report_status()["evictor_running"] is False
    assert not put_keys(be, [1])
    assert be._evictor.running and be._evictor._thread.daemon
    assert be.report_status()["evictor_running"] is True
    thread = be._evictor._thread
    be.close()
    assert not thread.is_alive(), "close stops the evictor"
    be._signal_evictor()  # a late signal (a remove racing close) starts nothing
    assert not be._evictor.running and be._evictor._thread is thread
    # policy none: puts never start the thread (only a remove does, see below)
    none = open_backend(name="none.img")
    assert not put_keys(none, [1])
    assert not none._evictor.running
    assert none.report_status()["evictor_running"] is False


def test_evictor_errors_are_logged_and_counted(open_backend, caplog):
    """A failing pass is logged with its traceback and counted; the next pass runs."""
    be, usable = fill_full(open_backend, 16, eviction_policy="lru", eviction_ratio=0.25)
    real = be._evictor._work
    calls = []

    def failing_once():
        calls.append(1)
        if len(calls) == 1:
            raise OSError(5, "checkpoint write failed (test)")
        return real()

    be._evictor._work = failing_once
    with caplog.at_level(logging.ERROR, logger="lmcache.v1.storage_backend.plugins.rust_raw_block_backend"):
        assert not put_keys(be, [100])
        assert be._evictor.wait_idle(IDLE_WAIT_S)
    records = [r for r in caplog.records if "rawblock-evictor: a pass failed" in r.getMessage()]
    assert len(records) == 1 and records[0].exc_info is not None
    st = be.report_status()
    assert st["evictor_errors"] == 1
    assert st["evictor_last_error"] == "OSError: [Errno 5] checkpoint write failed (test)"
    assert st["evicted_ahead_entries"] == 0
    # The next pass runs and evicts ahead.
    be._signal_evictor()
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    assert len(calls) >= 2 and be.report_status()["evicted_ahead_entries"] > 0
    assert be.report_status()["evictor_errors"] == 1


# --------------------------------------------------------------------------- slots freed by removes


def _status(be) -> tuple[int, int, int]:
    """(held slots, checkpoints for room, metadata writes that free slots): checkpoints, and in
    the log format the deletes' FREE groups written ahead of pending puts."""
    st = be.report_status()
    lane = be._core._native.status().get("metadata_log", {}).get("free_lane", {"groups": 0})
    return st["checkpoint_held_slots"], st["checkpoints_for_room"], st["checkpoints_written"] + lane["groups"]


@pytest.mark.parametrize("meta_format", ["log", "v1"])
def test_removes_free_their_slots_off_the_put_path(open_backend, meta_format):
    """Policy none, no periodic checkpoint: the checkpoint that makes removed entries' slots
    reusable is written by the plugin's thread after the remove, so the puts that take those
    slots write none themselves (the log format; v1 needs both containers rewritten, the put
    writes the second one) and never load another key's bytes."""
    be = open_backend(slots=16, meta_format=meta_format)
    usable = be._core.slot_counts().usable
    assert not put_keys(be, list(range(usable)))
    be._core.checkpoint_now()  # the entries are durable: their slots are held once removed
    before = _status(be)[2]
    assert be.batched_remove([make_key(i) for i in range(usable // 2)]) == usable // 2
    assert be.remove(make_key(usable - 1))
    assert be.wait_idle(IDLE_WAIT_S)
    held, room, written = _status(be)
    assert written > before, "the removes' checkpoint was written in the background"
    assert room == 0
    if meta_format == "log":
        assert held == 0, "every slot the removes freed is reusable before any put"
    freed = list(range(usable // 2)) + [usable - 1]
    fresh = [1000 + i for i in freed]
    assert not put_keys(be, fresh)
    held_after, room_after, _ = _status(be)
    assert room_after == (0 if meta_format == "log" else 1)
    assert held_after == 0
    assert be.report_status()["evictor_passes"] >= 1
    assert_loads(be, fresh + list(range(usable // 2, usable - 1)))


def test_with_the_cores_periodic_thread_the_plugin_leaves_it_the_reclaim(open_backend):
    """Log format with the periodic checkpoint on: a delete wakes the core's own thread to write
    the checkpoint, so the plugin's thread is not started for it."""
    be = open_backend(slots=16, meta_enable_periodic=True)
    usable = be._core.slot_counts().usable
    assert not put_keys(be, list(range(usable)))
    be._core.checkpoint_now()
    assert be.batched_remove([make_key(i) for i in range(4)]) == 4
    assert be.wait_idle(IDLE_WAIT_S)
    assert not be._evictor.running
    deadline = IDLE_WAIT_S
    while _status(be)[0] and deadline > 0:  # the core's thread frees them; a bound only a hang reaches
        threading.Event().wait(0.01)
        deadline -= 0.01
    assert _status(be)[0] == 0
    assert not put_keys(be, [1000, 1001, 1002, 1003])
    assert _status(be)[1] == 0, "no put wrote a checkpoint for room"


# --------------------------------------------------------------------------- settings


def test_settings_defaults_and_report_status(open_backend):
    be = open_backend(eviction_policy="lru")
    st = be.report_status()
    assert (st["eviction_trigger_watermark"], st["eviction_ratio"]) == (0.95, 0.05)
    assert (be.eviction_trigger_watermark, be.eviction_ratio) == (0.95, 0.05)
    for key in ("evictor_passes", "evictor_errors", "evicted_ahead_entries", "put_evicted_entries",
                "put_evict_retries"):
        assert st[key] == 0, key
    be2 = open_backend(name="b.img", eviction_policy="lru", eviction_trigger_watermark="0.8",
                       eviction_ratio=0.2)
    st = be2.report_status()
    assert (st["eviction_trigger_watermark"], st["eviction_ratio"]) == (0.8, 0.2)
    be3 = open_backend(name="c.img", eviction_policy="lru", eviction_trigger_watermark=1, eviction_ratio=0)
    assert (be3.eviction_trigger_watermark, be3.eviction_ratio) == (1.0, 0.0)


@pytest.mark.parametrize("name,value,bounds", [
    ("eviction_trigger_watermark", 0, "(0, 1]"),
    ("eviction_trigger_watermark", 1.5, "(0, 1]"),
    ("eviction_trigger_watermark", -0.2, "(0, 1]"),
    ("eviction_trigger_watermark", "high", "(0, 1]"),
    ("eviction_trigger_watermark", True, "(0, 1]"),
    ("eviction_trigger_watermark", float("nan"), "(0, 1]"),
    ("eviction_ratio", -0.05, "[0, 1]"),
    ("eviction_ratio", 2, "[0, 1]"),
    ("eviction_ratio", "5%", "[0, 1]"),
    ("eviction_ratio", [0.1], "[0, 1]"),
])
def test_bad_settings_are_rejected_naming_the_key(open_backend, name, value, bounds):
    import re

    want = re.escape(f"extra_config['rust_raw_block.{name}'] must be a number in {bounds}, got {value!r}")
    with pytest.raises(ValueError, match=want):
        open_backend(eviction_policy="lru", **{name: value})
    with pytest.raises(ValueError, match=want):  # checked whatever the policy
        open_backend(name="none.img", **{name: value})


def test_settings_without_lru_are_reported_unused(open_backend, caplog):
    with caplog.at_level(logging.WARNING, logger="lmcache.v1.storage_backend.plugins.rust_raw_block_backend"):
        be = open_backend(eviction_ratio=0.1)
    assert be._evictor._work == be._reclaim_pass, "the background thread only reclaims, it never evicts"
    assert any("rust_raw_block.eviction_ratio'] has no effect without rust_raw_block.eviction_policy: lru or prefix"
               in r.getMessage() for r in caplog.records)


def test_readme_table_gives_the_defaults():
    from lmcache_rawblock.plugin import DEFAULT_EVICTION_RATIO, DEFAULT_EVICTION_TRIGGER_WATERMARK

    rows = {}
    for line in (REPO / "docs" / "configuration.md").read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1]
    assert float(rows["eviction_trigger_watermark"]) == DEFAULT_EVICTION_TRIGGER_WATERMARK
    assert float(rows["eviction_ratio"]) == DEFAULT_EVICTION_RATIO


def test_evicted_slots_are_deallocated_off_the_put_path(open_backend, tmp_path):
    """With ``rust_raw_block.deallocate_freed: true`` (YAML's boolean for on), the evictor's
    batches deallocate the slots they free (punched holes in this file) before puts reuse them;
    no put fails and the keys stored last load their own bytes."""
    be, usable = fill_full(open_backend, 128, eviction_policy="lru", deallocate_freed=True)
    attempted, errors, done = _run_threads(be, 2, first=usable, total=600, batch=1)
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    st = be.report_status()
    assert errors == [], f"{len(errors)} of {attempted} puts failed; first: {errors[0]}"
    assert st["dealloc_state"] == "on" and st["dealloc_kind"] == "punch_hole"
    assert st["dealloc_failures"] == 0
    assert st["dealloc_slots"] > 0, st
    assert st["dealloc_slots"] + st["dealloc_skipped"] >= st["evicted_ahead_entries"] > 0
    assert_loads(be, done[-16:])


@pytest.mark.parametrize("classes", [1, 2])
def test_lru_evict_ahead_fires_with_size_classes(open_backend, classes):
    # With size classes the slot ids are the smallest class's: an extent holds 2^(n-1) times
    # fewer full-size slots than ids. The trigger must count what full-size entries fill, or
    # the cache fills before it fires and every put evicts for itself.
    be = open_backend(slots=64, eviction_policy="lru", eviction_trigger_watermark=0.75, eviction_ratio=0.25,
                      meta_format="log", extent_bytes=4 * SLOT, size_classes=classes)
    full = be.report_status()["usable_capacity_bytes"] // SLOT
    for i in range(2 * full):
        assert not put_keys(be, [i])
        assert be._evictor.wait_idle(IDLE_WAIT_S)
    st = be.report_status()
    assert st["evicted_ahead_entries"] > 0, "the evictor never fired"
    assert st["put_evicted_entries"] == 0, "a put found the cache full and evicted for itself"


@pytest.mark.parametrize("classes", [1, 2])
def test_a_put_out_of_room_counts_slot_ids_as_ids_with_size_classes(open_backend, classes):
    be = open_backend(slots=64, eviction_policy="lru", meta_format="log", extent_bytes=4 * SLOT,
                      size_classes=classes)
    full = be.report_status()["usable_capacity_bytes"] // SLOT
    ids = be._core.slot_counts().usable
    msg = str(be._no_room(None, "nothing is left to evict"))
    if classes == 1:
        assert ids == full and f"nothing is left to evict: {ids} slots, 0 indexed" in msg, msg
    else:
        assert ids > full and f"nothing is left to evict: {ids} slot ids ({full} of full size), 0 indexed" in msg, msg
