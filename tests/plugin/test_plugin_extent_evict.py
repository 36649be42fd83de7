"""Extent eviction under ``rust_raw_block.eviction_policy: extent`` (with ``extent_bytes``):
a full cache keeps taking puts from threads, every key still indexed loads its own bytes, the
background evictor keeps clean extents ahead and whole extents are evicted and deallocated;
pinned keys stay; bad settings are refused naming them.

Real files in tmp_path, real threads, the stand-in LMCache objects of tests/plugin_fakes.py, both
metadata formats. Waits are for a condition, with a bound only a hang reaches.
"""

from __future__ import annotations

import errno
import threading
import types

import pytest

from lmcache_rawblock.plugin import RustRawBlockBackend
from plugin_fakes import FakeEngineConfig, FakeLocalCPUBackend, FakeMetadata, base_extra, make_key
from plugin.test_plugin_evict_ahead import IDLE_WAIT_S, SLOT, _run_threads, assert_loads, put_keys

MiB = 1 << 20
PER = 4
EXTENT = PER * SLOT


@pytest.fixture
def open_backend(tmp_path, loop_thread):
    made: list[RustRawBlockBackend] = []

    def make(slots: int = 64, **overrides) -> RustRawBlockBackend:
        path = tmp_path / "dev.img"
        if not path.exists():
            with open(path, "wb") as f:
                f.truncate(4 * MiB + slots * SLOT)
        cfg = FakeEngineConfig(base_extra(str(path), **overrides))
        be = RustRawBlockBackend(config=cfg, metadata=FakeMetadata(), local_cpu_backend=FakeLocalCPUBackend(),
                                 loop=loop_thread.loop)
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


# log-stride: the log format's strided layout, extents of 4 slots and a 4 KiB unused tail;
# log-classes: size_classes 2 (the chunks all of class 0: the plugin's path over classes)
@pytest.mark.parametrize("fmt", ["v1", "log", "log-stride", "log-classes"])
@pytest.mark.parametrize("threads,batch,engine", [(1, 1, "posix"), (4, 8, "io_uring")])
def test_full_cache_under_extent_eviction_keeps_taking_puts_and_loads_right(open_backend, fmt, threads, batch,
                                                                          engine):
    stride = fmt == "log-stride"
    be = open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT + (4096 if stride else 0),
                      meta_format=fmt.split("-")[0], io_engine=engine, deallocate_freed="on",
                      size_classes=2 if fmt == "log-classes" else 1)
    assert be._core.extent_counts()["extent_tail_bytes"] == (4096 if stride else 0)
    total = be._core.extent_counts()["extents_total"] * PER
    pinned = list(range(4))
    assert not put_keys(be, pinned)
    assert all(be.pin(make_key(i)) for i in pinned)
    attempted, errors, done = _run_threads(be, threads, first=100, total=6 * total, batch=batch)
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    st = be.report_status()
    assert errors == [], f"{len(errors)} of {attempted} puts failed; first: {errors[0]}"
    assert st["evictor_errors"] == 0 and st["evicted_extents"] > 0 and st["extents_evicted"] > 0
    assert st["extent_deallocs"] > 0, "whole extents were deallocated"
    assert st["dealloc_ranges"] <= st["extent_deallocs"], "each deallocation covers whole extents"
    assert st["indexed_key_count"] <= total
    assert_loads(be, pinned)  # the oldest keys, pinned: never evicted
    live = [i for i in done if be.contains(make_key(i))]
    assert len(live) >= total // 4, "extent eviction keeps most of the cache"
    assert_loads(be, live)  # 0 wrong bytes
    assert be.inflight_io_count() == 0
    for i in pinned:
        assert be.unpin(make_key(i))


def test_the_evictor_keeps_clean_extents_in_reserve(open_backend):
    be = open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=3,
                      meta_format="log")
    n = be._core.extent_counts()["extents_total"]
    for start in range(0, n * PER, 8):
        assert not put_keys(be, list(range(start, start + 8)))
        assert be._evictor.wait_idle(IDLE_WAIT_S)
    st = be._core.extent_counts()
    assert st["extents_clean"] + st["extents_pending_dealloc"] >= 3
    assert be.report_status()["extent_reserve"] == 3
    # the first extent's keys (the least recently used) went first
    assert not be.contains(make_key(0)) and be.contains(make_key(n * PER - 1))


def test_a_pass_with_small_extents_frees_several_with_one_free_group(open_backend):
    # Each evicting pass writes one group of its FREE records and syncs it: with extents of a
    # few slots the pass takes at least 16 MiB of them (at most the reserve), so the
    # groups come a pass at a time, not an extent at a time.
    be = open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=4,
                      meta_format="log")
    assert be._extents.batch == 4  # 16 MiB is more than 4 of these extents: the reserve caps it
    n = be._core.extent_counts()["extents_total"]
    for start in range(0, 3 * n * PER, PER):  # a put wakes the evictor once the spare extents are used
        assert not put_keys(be, list(range(start, start + PER)))
        assert be._evictor.wait_idle(IDLE_WAIT_S)
    st = be.report_status()
    groups = be._core._native.status()["metadata_log"]["free_lane"]["groups"]
    assert st["evictor_errors"] == 0 and st["evicted_extents"] >= 2 * n
    assert 0 < groups <= st["evicted_extents"] // 3, (groups, st["evicted_extents"])


def test_extent_policy_needs_extent_bytes(open_backend):
    with pytest.raises(ValueError, match="eviction_policy 'extent' needs extents: set extent_bytes"):
        open_backend(eviction_policy="extent")


def test_extent_policy_says_when_auto_turned_extents_off(open_backend):
    with pytest.raises(ValueError, match=r"needs extents: .*\(extent_bytes=auto resolved to off here: off_regular_file\)"):
        open_backend(eviction_policy="extent", extent_bytes="auto")


@pytest.mark.parametrize("value", [0, -1, "two", True, 2.9])
def test_bad_extent_reserve_is_refused_naming_it(open_backend, value):
    with pytest.raises(ValueError, match=r"rust_raw_block.extent_reserve'\] must be an integer >= 1"):
        open_backend(eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=value)


@pytest.mark.parametrize("fmt, message", [
    ("v1", r"extent_bytes must be a multiple of slot_bytes with meta_format='v1'.*extent_bytes=12289"),
    ("log", r"extent_bytes must be a multiple of block_align \(extent_bytes=12289"),
])
def test_bad_extent_bytes_is_refused_naming_it(open_backend, fmt, message):
    with pytest.raises(ValueError, match=message):
        open_backend(extent_bytes=SLOT + 1, meta_format=fmt)


@pytest.mark.parametrize("fmt", ["v1", "log"])
@pytest.mark.parametrize("reinsert", [True, False])
def test_a_hot_key_is_put_again_when_its_extent_is_evicted(open_backend, fmt, reinsert):
    be = open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=3,
                      extent_reinsert=reinsert, meta_format=fmt)
    n = be._core.extent_counts()["extents_total"]
    assert not put_keys(be, list(range(PER)))  # the first extent
    assert_loads(be, [0])  # key 0 is hot: loaded since its put
    for start in range(PER, (n + 2) * PER, PER):
        assert not put_keys(be, list(range(start, start + PER)))
        assert be._evictor.wait_idle(IDLE_WAIT_S)
    st = be.report_status()
    assert st["evictor_errors"] == 0 and st["evicted_extents"] >= 3
    assert not any(be.contains(make_key(i)) for i in range(1, PER)), "the first extent was evicted"
    assert be.contains(make_key(0)) == reinsert
    assert st["reinserted_extent_entries"] == (1 if reinsert else 0)
    if reinsert:
        assert_loads(be, [0])  # its own bytes, from its new slot


@pytest.mark.parametrize("fmt", ["v1", "log"])
def test_a_hot_key_removed_while_its_extent_is_evicted_stays_removed(open_backend, fmt):
    # The evictor reads a hot key, deletes its extent, writes the checkpoint, then puts the key
    # again. A remove of that key meanwhile (it misses then, so the remove finds nothing) is
    # the user's word: the key must not come back with the bytes it had.
    be = open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=3,
                      extent_reinsert=True, meta_format=fmt)
    n = be._core.extent_counts()["extents_total"]
    assert not put_keys(be, list(range(PER)))
    assert_loads(be, [0])  # hot
    core, reclaim, removed = be._core, be._core.reclaim_held_slots, []

    def reclaim_after_a_remove() -> int:
        if not removed and not core.contains_key(be._encode(make_key(0))):
            removed.append(be.remove(make_key(0)))  # evicted, not yet put again
        return reclaim()

    core.reclaim_held_slots = reclaim_after_a_remove
    for start in range(PER, (n + 2) * PER, PER):
        assert not put_keys(be, list(range(start, start + PER)))
        assert be._evictor.wait_idle(IDLE_WAIT_S)
    assert removed == [False], "the remove came between the eviction and the put again"
    assert not any(be.contains(make_key(i)) for i in range(PER)), "key 0 was removed: it stays removed"
    assert be.report_status()["reinserted_extent_entries"] == 0


def test_an_extent_reserve_of_every_extent_is_refused_naming_it(open_backend):
    # a reserve of every extent would have the evictor delete every closed extent on each pass
    with pytest.raises(ValueError, match=r"rust_raw_block.extent_reserve'\] must be below the device's \d+ "
                                         r"extents \(clean extents kept ahead\), got 1000"):
        open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=1000)


def test_a_put_that_found_no_slot_raises_the_reserve_kept_ahead(open_backend):
    # A put that evicts for itself is a sign the puts outran the evictor: the reserve it keeps
    # doubles (up to a quarter of the extents), and the evictor's next pass fills it.
    be = open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=2,
                      meta_format="log")
    n = be._core.extent_counts()["extents_total"]
    assert be._extents.effective_reserve() == 2
    assert not put_keys(be, list(range(n * PER)))
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    assert be._extents.evict(1) > 0  # what a put that found no slot does
    raised = be._extents.effective_reserve()
    assert raised == min(4, n // 4) and raised > 2
    assert be.report_status()["extent_reserve_effective"] >= 2
    be._signal_evictor()
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    st = be._core.extent_counts()
    assert st["extents_clean"] + st["extents_pending_dealloc"] >= 2


def test_a_key_another_call_is_storing_evicts_nothing(open_backend):
    # The core refuses a key another call is storing (EBUSY): no eviction gives it a slot, so a
    # full cache must not lose an extent of keys for it.
    be = open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=2,
                      meta_format="log")
    n = be._core.extent_counts()["extents_total"]
    assert not put_keys(be, list(range(n * PER)))
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    busy = RuntimeError("RawBlockCore could not store 1 key(s): the key is being stored by another call")
    busy.errno = errno.EBUSY  # as the core's errors carry it
    before = be.report_status()["put_evicted_entries"]
    be._core.put_many = lambda specs, objs, placement_ids=None: types.SimpleNamespace(
        results=[False] * len(specs), stored_keys=[], failure=busy)
    spec = types.SimpleNamespace(encoded=be._encode(make_key(10_000)))
    results, failure = be._put_with_policy([spec], [object()])
    assert results == [False] and failure is busy
    assert be.report_status()["put_evicted_entries"] == before


@pytest.mark.parametrize("fmt", ["v1", "log"])
def test_reinsertion_reads_and_puts_again_without_the_pin_lock(open_backend, fmt):
    # Pins, removes and loads take the pin lock: the evictor's reads of hot keys and its put of
    # them again must not hold it over that I/O.
    be = open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=3,
                      extent_reinsert=True, meta_format=fmt)
    n = be._core.extent_counts()["extents_total"]
    assert not put_keys(be, list(range(PER)))
    assert_loads(be, [0])  # hot
    core, held = be._core, []
    load, put = core.load_many_into, core.put_many

    def load_seen(*a, **k):
        if threading.current_thread().name == "rawblock-evictor":
            held.append(("read", be._pin_lock.locked()))
        return load(*a, **k)

    def put_seen(*a, **k):
        if threading.current_thread().name == "rawblock-evictor":
            held.append(("put", be._pin_lock.locked()))
        return put(*a, **k)

    core.load_many_into, core.put_many = load_seen, put_seen
    for start in range(PER, (n + 2) * PER, PER):
        assert not put_keys(be, list(range(start, start + PER)))
        assert be._evictor.wait_idle(IDLE_WAIT_S)
    assert be.report_status()["reinserted_extent_entries"] == 1
    assert ("read", False) in held and ("put", False) in held
    assert all(not locked for _, locked in held), held
    assert_loads(be, [0])


def test_puts_into_a_reserve_with_room_to_spare_do_not_wake_the_evictor(open_backend):
    # Each pass reads the core's status under the GIL the puts wait for: while the clean
    # extents beyond the reserve last, the puts leave the evictor asleep.
    be = open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=2,
                      meta_format="log")
    n = be._core.extent_counts()["extents_total"]
    assert not put_keys(be, [0])  # the first pass counts the clean extents
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    passes = be._evictor.passes
    spare = (n - 1 - 2 - 1) * PER  # clean extents past the reserve, less one, in slots
    for i in range(1, spare // 2):
        assert not put_keys(be, [i])
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    assert be._evictor.passes == passes
    assert not put_keys(be, list(range(spare // 2, n * PER + 3 * PER)))  # past the reserve: it evicts
    assert be._evictor.wait_idle(IDLE_WAIT_S)
    assert be._evictor.passes > passes and be.report_status()["evicted_extents"] > 0


class _RemoveFirst:
    """The evictor's pin lock, which runs ``before()`` (once armed) in the evictor thread before
    taking it: a remove then comes between the reinserting put and what follows it."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock, self.before = lock, None

    def __enter__(self):
        if self.before is not None and threading.current_thread().name == "rawblock-evictor":
            before, self.before = self.before, None
            before()
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def test_keys_told_as_put_again_are_in_the_core_when_a_remove_races_the_put(open_backend):
    # The owner's record (on_put_again) must change in the same section as the core: a remove
    # of a hot key right after the evictor's put of it again waits until the owner is told, so
    # the owner is never told of a key the core no longer holds.
    be = open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=3,
                      extent_reinsert=True, meta_format="log")
    n = be._core.extent_counts()["extents_total"]
    assert not put_keys(be, list(range(PER)))
    assert_loads(be, [0])  # hot
    core, put, told, removed, threads = be._core, be._core.put_many, [], [], []
    hot = be._encode(make_key(0))
    lock = be._extents._pin_lock = _RemoveFirst(be._extents._pin_lock)

    def remove_now() -> None:
        done = threading.Event()
        t = threading.Thread(target=lambda: (removed.append(be.remove(make_key(0))), done.set()))
        threads.append(t)
        t.start()
        done.wait(2.0)  # a remove that waits for the evictor's section lets it go on first

    def put_armed(*a, **k):
        res = put(*a, **k)
        if threading.current_thread().name == "rawblock-evictor" and hot in res.stored_keys and not threads:
            lock.before = remove_now
        return res

    core.put_many = put_armed
    be._extents._on_put_again = lambda keys: told.append({key: core.contains_key(key) for key in keys})
    for start in range(PER, (n + 2) * PER, PER):
        assert not put_keys(be, list(range(start, start + PER)))
        assert be._evictor.wait_idle(IDLE_WAIT_S)
        if threads:
            break
    assert threads, "the hot key was put again"
    threads[0].join()
    assert told and all(all(there.values()) for there in told), told
    assert removed == [True] and not be.contains(make_key(0)), "the remove removed the key put again"


def test_puts_of_the_largest_class_wake_the_evictor_before_the_spare_extents_run_out(open_backend):
    # With size classes an extent holds fewer slots of the larger classes than of the smallest
    # (the chunks here are all of class 0: 4 an extent, against 6 of class 1): the puts' budget
    # before the evictor looks again must count the slots they take, or they run the clean
    # extents out and evict for themselves.
    be = open_backend(slots=128, eviction_policy="extent", extent_bytes=EXTENT, extent_reserve=2,
                      meta_format="log", size_classes=2)
    n = be._core.extent_counts()["extents_total"]
    for i in range(n * PER + 3 * PER):
        assert not put_keys(be, [i])
        assert be._evictor.wait_idle(IDLE_WAIT_S)
    st = be.report_status()
    assert st["evicted_extents"] > 0
    assert st["put_evicted_entries"] == 0, "a put ran out of clean extents and evicted for itself"
