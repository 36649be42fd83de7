"""The log-structured metadata format through the core: checkpoints that write what changed,
freed slots reusable after one small durable record, compaction, recovery after a crash, the
move from format v1, and what format v1 readers (ours, LMCache's) make of a log device."""

from __future__ import annotations

import hashlib
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from lmcache_rawblock.raw_block import encode_object_key
from lmcache_rawblock.raw_block._lmcache import ObjectKey

from core_helpers import META, SLOT, Obj, make_core, make_device, newest_state, okey, payload, read_containers
from helpers import TESTS

ENGINES = [("posix", False), ("io_uring", False), ("posix", True), ("io_uring", True)]
ENGINE_IDS = ["posix", "io_uring", "posix-odirect", "io_uring-odirect"]
SIZE = 2000


def _hkey(i):
    return encode_object_key(ObjectKey(chunk_hash=hashlib.sha256(i.to_bytes(8, "big")).digest(),
                                       model_name="meta-llama/Llama-3.1-8B-Instruct", kv_rank=i % 8))


def _log(path, **kw):
    kw.setdefault("meta_format", "log")
    return make_core(path, **kw)


def _put(core, ids, size=SIZE):
    keys = [okey(i) for i in ids]
    r = core.put_many(keys, [Obj(payload(i, size)) for i in ids])
    assert all(r.results), r.failure
    return keys


def _loads(core, ids, size=SIZE):
    """ids whose load returns their own bytes; any other bytes served fail the test."""
    objs = [Obj(size) for _ in ids]
    got = core.load_many_into([okey(i).encoded for i in ids], objs)
    ok = []
    for i, o, g in zip(ids, objs, got):
        if g:
            assert o.bytes() == payload(i, size), f"key {i} served other bytes"
            ok.append(i)
    return ok


def _status(core):
    return core._native.status()


def _run_child(dev: str, body: str, **cfg) -> None:
    """body in a child process over a core on dev, then the child dies without closing it."""
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(TESTS)!r})
        from core_helpers import Obj, make_core, okey, payload
        c = make_core({dev!r}, meta_enable_periodic=False, meta_format="log", **{cfg!r})
    """) + textwrap.dedent(body) + "\nos._exit(0)\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("engine,odirect", ENGINES, ids=ENGINE_IDS)
def test_entries_and_deletes_survive_a_reopen(tmp_path, engine, odirect):
    dev = make_device(tmp_path)
    c = _log(dev, io_engine=engine, use_odirect=odirect)
    _put(c, range(300))
    c.checkpoint_now()
    assert c.delete_many([okey(i).encoded for i in range(0, 300, 3)]) == [True] * 100
    c.close()
    c = _log(dev, io_engine=engine, use_odirect=odirect)
    st = _status(c)
    assert st["recovery_outcome"] == "loaded" and st["metadata_log"]["state"] == "live"
    want = [i for i in range(300) if i % 3]
    assert st["indexed_key_count"] == len(want)
    assert _loads(c, range(300)) == want
    c.close()


def test_a_checkpoint_writes_what_changed_not_the_index(tmp_path):
    # LMCache-shaped keys (a 32-byte chunk hash) so the base is not all repetition.
    dev = make_device(tmp_path, size=META * 8 + 6100 * 4 * 4096)
    c = _log(dev, meta_total_bytes=8 * META, slot_bytes=4 * 4096)
    keys = [_hkey(i) for i in range(6000)]
    assert all(c.put_many(keys, [Obj(payload(i, 100)) for i in range(6000)]).results)
    c.checkpoint_now()  # the first base
    base = _status(c)["metadata_log"]
    assert base["bases_written"] == 1 and base["base_last_entries"] == 6000
    assert base["base_last_bytes"] >= 6000 * 30
    assert all(c.put_many([_hkey(i) for i in range(6000, 6020)], [Obj(payload(i, 100)) for i in range(20)]).results)
    c.delete_many([k.encoded for k in keys[:20]])
    c.checkpoint_now()
    log = _status(c)["metadata_log"]
    assert log["bases_written"] == 1  # no new base
    # Two groups: the deletes' 20 FREE records ahead (their keys' PUT records were durable),
    # then the 20 puts (the class is logged already); a block each.
    assert log["groups_written"] - base["groups_written"] == 2
    assert log["free_lane"] == {"groups": 1, "records": 20, "in_flush": 0}
    assert log["last_group_records"] == 20
    assert log["bytes_written"] - base["bytes_written"] <= 2 * 4096
    c.close()


def test_a_freed_slot_is_reusable_after_one_small_record(tmp_path):
    # A device of 40 slots, full: deleting 10 keys and one checkpoint give 10 puts their slots.
    dev = make_device(tmp_path, size=META + 40 * SLOT)
    c = _log(dev)
    _put(c, range(40))
    c.checkpoint_now()
    assert not any(c.put_many([okey(99)], [Obj(payload(99, SIZE))]).results)
    c.delete_many([okey(i).encoded for i in range(10)])
    st = _status(c)
    assert st["checkpoint_held_slots"] == 10 and st["free_slot_count"] == 0
    flushes = st["device_flushes"]
    c.checkpoint_now()
    st = _status(c)
    assert st["checkpoint_held_slots"] == 0 and st["free_slot_count"] == 10
    # a group of FREE records alone names no payload: no flush of the data first, only the
    # group's own bytes synced (one write with RWF_DSYNC)
    assert st["device_flushes"] - flushes == 1
    assert st["metadata_log"]["bases_written"] == 1
    _put(c, range(100, 110))
    c.close()
    c = _log(dev)
    assert _loads(c, list(range(10)) + list(range(100, 110)) + [10, 39]) == list(range(100, 110)) + [10, 39]
    c.close()


def _lane_setup(tmp_path, **kw):
    """A full 40-slot device: keys 0-29 durable, keys 30-39 put since (pending), then the
    durable keys 0-9 and the pending key 30 deleted."""
    dev = make_device(tmp_path, size=META + 40 * SLOT)
    c = _log(dev, **kw)
    _put(c, range(30))
    c.checkpoint_now()
    _put(c, range(30, 40))
    return dev, c


@pytest.mark.parametrize("lane", ["on", "off"])
def test_a_put_gets_its_room_from_the_deletes_free_group_without_the_puts_flush(tmp_path, lane):
    """The deleted keys' PUT records were durable: their FREE records go ahead of the pending
    puts' records, and a put out of slots writes that group alone, synced by itself, without
    flushing the pending payloads or making their records durable. Off (every FREE in line
    behind the pending PUTs, the core's way before): that put writes every page after a flush."""
    dev, c = _lane_setup(tmp_path)
    if lane == "off":
        c._native.free_lane_off()
    c.delete_many([okey(i).encoded for i in list(range(10)) + [30]])
    st0 = _status(c)
    assert st0["checkpoint_held_slots"] == 11
    _put(c, range(100, 110))  # no free slot: the put makes room
    st = _status(c)
    lane_st = st["metadata_log"]["free_lane"]
    assert st["checkpoints_for_room"] == st0["checkpoints_for_room"] + 1
    if lane == "on":
        assert lane_st == {"groups": 1, "records": 10, "in_flush": 0}
        assert st["device_flushes"] - st0["device_flushes"] == 1  # the group's own synced write
        assert st["checkpoint_held_slots"] == 1  # key 30's slot: its FREE waits behind its PUT
        assert st["metadata_persisted"] < st["metadata_dirty_total"]  # the pending puts stay pending
    else:
        assert lane_st == {"groups": 0, "records": 0, "in_flush": 0}
        assert st["device_flushes"] - st0["device_flushes"] >= 2  # the payloads' flush, then the group
        assert st["checkpoint_held_slots"] == 0
    c.close()
    c = _log(dev)
    want = list(range(10, 30)) + list(range(31, 40)) + list(range(100, 110))
    assert _loads(c, range(110)) == want
    c.close()


def _checkpoint_in_its_flush(c):
    """A whole checkpoint on a thread, held in its payload flush for 1.5 s (the test hook's delay
    is spent there); back once it is there."""
    c._native._set_checkpoint_delay_ms(1500)
    errors = []

    def run():
        try:
            c.checkpoint_now()
        except Exception as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(0.3)  # it took the checkpoint lock and its pages, and waits in the flush
    return t, errors


def test_the_free_group_is_written_while_a_whole_checkpoint_flushes_the_pending_payloads(tmp_path):
    """A whole checkpoint flushing the pending puts' payloads does not hold back the deletes'
    FREE group: a put out of slots writes that group during the flush and gets its slots before
    the checkpoint ends. A crash at that moment recovers the deleted keys absent, the durable
    ones with their bytes, and none of the puts whose records the checkpoint had yet to write;
    once it has, they are there."""
    dev, c = _lane_setup(tmp_path)
    t, errors = _checkpoint_in_its_flush(c)
    c.delete_many([okey(i).encoded for i in range(10)])
    _put(c, range(100, 110))  # no free slot: the FREE group, written in the checkpoint's flush
    st = _status(c)
    crash = str(tmp_path / "crash.img")
    shutil.copyfile(dev, crash)  # what a crash now leaves
    assert t.is_alive(), "the put waited for the whole checkpoint"
    assert st["metadata_log"]["free_lane"] == {"groups": 1, "records": 10, "in_flush": 1}
    assert st["checkpoint_held_slots"] == 0
    t.join(30)
    assert not errors and not t.is_alive()
    c._native._set_checkpoint_delay_ms(0)
    c.close()
    c = _log(crash)
    assert _loads(c, list(range(40)) + list(range(100, 110))) == list(range(10, 30))
    c.close()
    c = _log(dev)
    assert _loads(c, list(range(40)) + list(range(100, 110))) == list(range(10, 40)) + list(range(100, 110))
    c.close()


def test_a_free_group_that_fails_in_a_whole_checkpoints_flush_leaves_that_checkpoint_a_base(tmp_path):
    """The FREE group's synced write fails while a whole checkpoint flushes (an injected
    write-back error): the pending puts' bytes are not proven, so their entries are dropped, and
    the checkpoint, its flush done, writes no group but a whole base, which says at once what is
    durable (the FREE group it would have had to write first included)."""
    dev, c = _lane_setup(tmp_path)
    st0 = _status(c)
    t, errors = _checkpoint_in_its_flush(c)
    c.delete_many([okey(i).encoded for i in range(10)])
    c._native._inject_fault("flush", 1)
    with pytest.raises(Exception, match="injected"):
        c._native.reclaim_held_slots()
    assert t.is_alive(), "the FREE group waited for the whole checkpoint"
    t.join(30)
    assert not errors and not t.is_alive()
    st = _status(c)
    assert st["writeback_dropped_entries"] - st0["writeback_dropped_entries"] == 10  # keys 30-39
    assert st["metadata_log"]["bases_written"] == st0["metadata_log"]["bases_written"] + 1
    assert st["metadata_log"]["groups_written"] == st0["metadata_log"]["groups_written"]
    assert st["checkpoint_held_slots"] == 0
    c._native._set_checkpoint_delay_ms(0)
    c.close()
    c = _log(dev)
    assert _loads(c, range(40)) == list(range(10, 30))
    c.close()


def test_a_reclaim_returns_once_the_checkpoint_writing_its_freed_slots_released_them(tmp_path):
    """A FREE record behind a pending PUT record of its slot goes in line, into the page a whole
    checkpoint then takes. A reclaim while that checkpoint flushes writes no checkpoint of its
    own for it, but returns only once the slot is reusable: a caller that finds slots still
    held after a reclaim takes it that the core needs a change to the index first (the
    plugin's evict-ahead then evicts one more key), which is not so here."""
    dev, c = _lane_setup(tmp_path)
    c.delete_many([okey(30).encoded])  # its PUT record waits: the FREE record goes in line
    st0 = _status(c)
    t, errors = _checkpoint_in_its_flush(c)
    c._native.reclaim_held_slots()
    st = _status(c)
    assert st["checkpoint_held_slots"] == 0, "a reclaim returned with the slot still held"
    assert st["checkpoints_written"] == st0["checkpoints_written"] + 1  # the whole one's, none of its own
    t.join(30)
    assert not errors and not t.is_alive()
    c._native._set_checkpoint_delay_ms(0)
    c.close()


def test_a_delete_wakes_the_periodic_thread_to_write_the_free_group_alone(tmp_path):
    """The periodic thread, woken by a delete, makes the freed slots reusable with the FREE
    group alone; the pending puts wait for their period (an hour here, never idle)."""
    dev, c = _lane_setup(tmp_path, meta_enable_periodic=True, meta_checkpoint_interval_sec=3600,
                         meta_idle_quiet_ms=3_600_000)
    written0 = _status(c)["checkpoints_written"]
    c.delete_many([okey(i).encoded for i in range(5)])
    deadline = time.monotonic() + 30
    while _status(c)["checkpoint_held_slots"] and time.monotonic() < deadline:
        time.sleep(0.01)
    st = _status(c)
    assert st["checkpoint_held_slots"] == 0 and st["free_slot_count"] == 5
    assert st["metadata_log"]["free_lane"] == {"groups": 1, "records": 5, "in_flush": 0}
    assert st["checkpoints_written"] == written0 and st["metadata_persisted"] < st["metadata_dirty_total"]
    c.close()


def test_a_state_applied_after_deletes_keeps_its_keys_on_the_deleted_keys_slots(tmp_path):
    """Keys 0-4 deleted (their FREE records wait in the deletes' group), then a state applied at
    run time that lists keys 0-9 on their slots again: the whole base written next covers the
    FREE group, which must not be replayed after it and vacate the state's slots."""
    dev = make_device(tmp_path, size=META + 40 * SLOT)
    v1dev = make_device(tmp_path, size=META + 40 * SLOT, name="v1.img")
    c1 = _log(v1dev, meta_format="v1")
    _put(c1, range(10))
    c1.checkpoint_now()
    c1.close()
    state = newest_state(v1dev)[2]
    state["device_path"] = dev
    c = _log(dev)
    _put(c, range(10))
    c.checkpoint_now()
    c.delete_many([okey(i).encoded for i in range(5)])
    assert c.apply_loaded_state(state)
    assert _loads(c, range(10)) == list(range(10))
    c.checkpoint_now()  # a whole base
    # the slots the deleted keys' FREE records held are the state's: no page's drop frees them
    # again, so the puts that fill the device take only the 30 others
    _put(c, range(100, 130))
    assert _loads(c, range(10)) == list(range(10))
    c.close()
    c = _log(dev)
    assert _loads(c, list(range(10)) + list(range(100, 130))) == list(range(10)) + list(range(100, 130))
    c.close()


def test_release_held_slots_on_a_closed_core_says_so_and_notes_no_fault(tmp_path):
    dev, c = _lane_setup(tmp_path)
    c.close()
    c.delete_many([okey(0).encoded])
    with pytest.raises(RuntimeError, match="closed"):
        c._native.release_held_slots()
    st = _status(c)
    assert not st["checkpoint_last_error"] and st["writeback_failures"] == 0


def test_a_failed_flush_after_a_new_superblock_makes_the_next_checkpoint_a_whole_base(tmp_path):
    """A compaction's superblock written, the flush after it failed: the superblock may be
    durable, its log starting after the base, where this writer would still have put a queued
    group of the base's. The next checkpoint writes a whole base under a newer superblock
    instead of groups, and every acknowledged key survives a reopen."""
    dev = make_device(tmp_path, size=META + 200 * SLOT)
    c = _log(dev)
    _put(c, range(50))
    c.checkpoint_now()
    _put(c, range(50, 60))
    c.checkpoint_now()  # nothing pending: the failed flush drops no entry (that alone asks a base)
    st0 = _status(c)
    c._native._inject_fault("flush", 2)  # the base's flush succeeds, the one after its superblock fails
    with pytest.raises(OSError, match="injected"):
        c._native.compact_metadata()
    st = _status(c)
    assert st["metadata_log"]["bases_written"] == st0["metadata_log"]["bases_written"]
    _put(c, range(60, 70))
    c.checkpoint_now()
    st = _status(c)
    assert st["metadata_log"]["bases_written"] == st0["metadata_log"]["bases_written"] + 1
    c.close()
    c = _log(dev)
    assert c.report_status()["recovery_outcome"] == "loaded"
    assert _loads(c, range(70)) == list(range(70))
    c.close()


def test_a_deleted_key_put_again_is_gone_or_new_never_old_after_its_free_group(tmp_path):
    """Key 5 deleted (its FREE record ahead, in the deletes' group, which the put of key 5 again
    writes alone to get a slot: the one key 5 left) and put again (its PUT record in line). A
    crash then recovers key 5 absent; after a checkpoint, with its new bytes; never the old."""
    dev, c = _lane_setup(tmp_path)
    c.delete_many([okey(5).encoded])
    assert c.put_many([okey(5)], [Obj(payload(500, SIZE))]).results == [True]
    st = _status(c)
    assert st["metadata_log"]["free_lane"]["groups"] == 1 and st["checkpoint_held_slots"] == 0
    crash = str(tmp_path / "crash.img")
    shutil.copyfile(dev, crash)  # what a crash of this process leaves: the pending records never written
    c.checkpoint_now()
    c.close()
    for path, want in ((crash, None), (dev, payload(500, SIZE))):
        c = _log(path)
        o = Obj(SIZE)
        got = c.load_many_into([okey(5).encoded], [o])
        assert (o.bytes() if got[0] else None) == want, path
        assert _loads(c, [4, 6, 29]) == [4, 6, 29]
        c.close()


def test_a_put_on_a_full_cache_frees_room_itself_and_says_why_when_it_cannot(tmp_path):
    dev = make_device(tmp_path, size=META + 16 * SLOT)
    c = _log(dev)
    _put(c, range(16))
    c.delete_many([okey(i).encoded for i in range(4)])
    # the freed slots wait for a durable record: the put writes it (one small group) and goes on
    _put(c, range(50, 54))
    assert _status(c)["checkpoints_for_room"] >= 1
    r = c.put_many([okey(60)], [Obj(payload(60, SIZE))])
    assert r.results == [False] and "no free slot" in str(r.failure)
    c.close()


def test_compaction_moves_the_base_and_empties_the_log(tmp_path):
    dev = make_device(tmp_path)
    c = _log(dev)
    _put(c, range(500))
    c.checkpoint_now()
    for r in range(5):
        c.delete_many([okey(i).encoded for i in range(r * 50, r * 50 + 50)])
        _put(c, range(1000 + r * 50, 1050 + r * 50))
        c.checkpoint_now()
    before = _status(c)["metadata_log"]
    assert before["live_bytes"] > 0
    assert c._native.compact_metadata() is True
    after = _status(c)["metadata_log"]
    assert after["compactions"] == 1 and after["bases_written"] == 2
    assert after["live_bytes"] == 0 and after["base_last_entries"] == 500
    _put(c, range(5000, 5010))  # groups after the new base
    c.delete_many([okey(1000).encoded])
    c.checkpoint_now()
    c.close()
    c = _log(dev)
    want = sorted(set(range(250, 500)) | set(range(1001, 1250)) | set(range(5000, 5010)))
    assert _status(c)["indexed_key_count"] == len(want)
    assert _loads(c, range(5010)) == want
    c.close()


def test_a_group_that_takes_the_ring_past_half_full_wakes_the_compaction(tmp_path):
    # 1 MiB region: a 128 KiB ring, 32 groups of 4 KiB. The periodic thread's period is an
    # hour and nothing deletes (a delete's wake-up would look at the ring too): groups written
    # by the caller's own checkpoints must still have it compact once past half full, before
    # the ring fills and a caller's checkpoint has to compact first.
    dev = make_device(tmp_path)
    c = _log(dev, meta_enable_periodic=True, meta_checkpoint_interval_sec=3600, meta_idle_quiet_ms=3_600_000)
    for i in range(20):
        _put(c, [i])
        c.checkpoint_now()
    deadline = time.monotonic() + 30
    while _status(c)["metadata_log"]["compactions"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    log = _status(c)["metadata_log"]
    assert log["compactions"] >= 1 and log["ring_full"] == 0, log
    c.close()
    c = _log(dev)
    assert _loads(c, range(20)) == list(range(20))
    c.close()


def test_the_ring_wraps_and_a_full_ring_is_compacted_before_the_next_group(tmp_path):
    # 1 MiB region: a 128 KiB ring, 32 groups of 4 KiB; no periodic thread to compact it.
    dev = make_device(tmp_path)
    c = _log(dev)
    _put(c, range(50))
    c.checkpoint_now()
    live = set(range(50))
    nxt = 50
    for r in range(80):
        victim = min(live)
        c.delete_many([okey(victim).encoded])
        live.discard(victim)
        _put(c, [nxt])
        live.add(nxt)
        nxt += 1
        c.checkpoint_now()
    log = _status(c)["metadata_log"]
    assert log["ring_full"] >= 2 and log["compactions"] >= 2  # twice round the ring
    # each checkpoint wrote a group, or a compaction covered its changes
    assert log["groups_written"] + log["compactions"] >= 80
    c.close()
    c = _log(dev)
    assert _loads(c, range(nxt)) == sorted(live)
    c.close()


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_a_crash_keeps_every_checkpointed_change(tmp_path, engine):
    dev = make_device(tmp_path)
    _run_child(dev, """
        keys = [okey(i) for i in range(200)]
        assert all(c.put_many(keys, [Obj(payload(i, 2000)) for i in range(200)]).results)
        c.checkpoint_now()
        c.delete_many([k.encoded for k in keys[:100]])
        assert all(c.put_many([okey(i) for i in range(500, 550)], [Obj(payload(i, 2000)) for i in range(500, 550)]).results)
        c.checkpoint_now()
        c.delete_many([k.encoded for k in keys[100:110]])   # never checkpointed
    """, io_engine=engine)
    c = _log(dev, io_engine=engine)
    got = _loads(c, list(range(200)) + list(range(500, 550)))
    assert set(range(110, 200)) | set(range(500, 550)) <= set(got) <= set(range(100, 200)) | set(range(500, 550))
    c.close()


def test_a_torn_last_group_ends_the_log(tmp_path):
    dev = make_device(tmp_path)
    c = _log(dev)
    _put(c, range(100))
    c.checkpoint_now()
    _put(c, range(100, 110))
    c.checkpoint_now()
    ring_off = META // 2 - (META // 2) // 4
    head = _status(c)["metadata_log"]["live_bytes"]
    _put(c, range(110, 120))
    c.checkpoint_now()
    c.close()
    with open(dev, "r+b") as f:  # the second group's body, one byte
        f.seek(ring_off + head + 60)
        b = f.read(1)
        f.seek(ring_off + head + 60)
        f.write(bytes([b[0] ^ 0xFF]))
    c = _log(dev)
    assert _loads(c, range(120)) == list(range(110))
    c.close()


def test_a_v1_device_moves_to_the_log_format_with_every_entry(tmp_path):
    dev = make_device(tmp_path)
    c = make_core(dev, meta_format="v1")
    _put(c, range(300))
    c.close()
    assert read_containers(dev)  # format v1 on the device
    c = _log(dev)
    st = _status(c)
    assert st["recovery_outcome"] == "loaded" and st["metadata_log"]["state"] == "v1-to-move"
    assert st["indexed_key_count"] == 300
    c.delete_many([okey(0).encoded])
    c.checkpoint_now()
    assert _status(c)["metadata_log"]["state"] == "live"
    c.close()
    # No v1 container is left for a v1 reader to misread: LMCache's core starts empty.
    assert read_containers(dev) == []
    with pytest.raises(ValueError, match="meta_format='log'"):
        make_core(dev, meta_format="v1")
    c = _log(dev)
    assert _loads(c, range(300)) == list(range(1, 300))
    c.close()


def test_load_checkpoint_on_init_false_starts_a_new_generation_before_reusing_a_slot(tmp_path):
    dev = make_device(tmp_path, size=META + 20 * SLOT)
    c = _log(dev)
    _put(c, range(20))
    c.close()
    c = _log(dev, load_checkpoint_on_init=False)
    assert _status(c)["recovery_outcome"] == "skipped" and _status(c)["indexed_key_count"] == 0
    _put(c, range(100, 105))  # the first put writes the new generation before it takes a slot
    assert _status(c)["metadata_log"]["bases_written"] == 1
    c.close()
    c = _log(dev)
    assert _status(c)["indexed_key_count"] == 5
    assert _loads(c, list(range(20)) + list(range(100, 105))) == list(range(100, 105))
    c.close()


def test_another_geometry_is_rejected_and_never_misread(tmp_path):
    dev = make_device(tmp_path)
    c = _log(dev)
    _put(c, range(10))
    c.close()
    c = _log(dev, slot_bytes=2 * SLOT)
    st = _status(c)
    assert st["recovery_outcome"] == "rejected" and "slot_bytes" in st["checkpoint_last_error"]
    assert st["indexed_key_count"] == 0
    c.close()


def test_superblocks_are_not_v1_containers_for_lmcache(tmp_path):
    # LMCache 0.5.6 reads "<8sIQQI" at 0 and at container_bytes: magic, version, seq, length, crc.
    dev = make_device(tmp_path)
    c = _log(dev)
    _put(c, range(10))
    c.close()
    with open(dev, "rb") as f:
        for off in (0, META // 2):
            f.seek(off)
            magic, version, _seq, plen, _crc = struct.unpack("<8sIQQI", f.read(32))
            assert magic == b"RBMETA02" and version == 2 and plen == 0


@pytest.mark.parametrize("threads", [1, 4, 8])
def test_many_threads_put_into_a_full_cache_with_deletes(tmp_path, threads):
    # MP-style: each put of a full cache is preceded by a delete of an old key (LMCache's L2
    # eviction), and nothing else makes room: 0 failed puts.
    n_slots = 64
    dev = make_device(tmp_path, size=META + n_slots * SLOT)
    c = _log(dev, io_engine="io_uring")
    _put(c, range(n_slots))
    c.checkpoint_now()
    lock = threading.Lock()
    owned = list(range(n_slots))
    nxt = [10_000]
    failures = []

    def work(t):
        for _ in range(100):
            with lock:
                victim = owned.pop(0)
                k = nxt[0]
                nxt[0] += 1
            c.delete_many([okey(victim).encoded])
            r = c.put_many([okey(k)], [Obj(payload(k, SIZE))])
            if not r.results[0]:
                failures.append(str(r.failure))
            with lock:
                owned.append(k)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert failures == []
    c.close()
    c = _log(dev, io_engine="io_uring")
    assert sorted(_loads(c, owned)) == sorted(owned)
    c.close()


def test_groups_a_crashed_writer_left_past_a_torn_one_are_never_replayed(tmp_path):
    # Writer A's last two groups: the first torn, the second one the next writer cannot see
    # (here hidden while it recovers: a read that failed, or a device that wrote A's groups of
    # one checkpoint in no promised order before each group had its own flush). Writer B
    # recovers to before them and writes its own group where the torn one was, of the same
    # length; the group after it on the device is then A's, with the sequence B's next one
    # would have. Replaying it would free a slot B still holds a key in: its writer epoch, lower
    # than B's, keeps it out.
    dev = make_device(tmp_path)
    _run_child(dev, """
        keys = [okey(i) for i in range(10)]
        assert all(c.put_many(keys, [Obj(payload(i, 2000)) for i in range(10)]).results)
        c.checkpoint_now()                      # the first base
        for i in (9, 1, 2):                     # three groups of one FREE each
            c.delete_many([keys[i].encoded])
            c.checkpoint_now()
    """)
    ring_off = META // 2 - (META // 2) // 4
    with open(dev, "r+b") as f:  # the second of the three groups (ring offset 4096): torn
        f.seek(ring_off + 4096 + 48)
        f.write(b"\xff" * 8)
        f.seek(ring_off + 8192)  # the third: out of sight
        third = f.read(4096)
        f.seek(ring_off + 8192)
        f.write(bytes(4096))
    _run_child(dev, """
        assert c.report_status()["recovery_outcome"] == "loaded"  # a torn tail
        assert c.exists_many([okey(1).encoded, okey(2).encoded, okey(9).encoded]) == [True, True, False]
        assert all(c.put_many([okey(20)], [Obj(payload(20, 2000))]).results)
        c.checkpoint_now()                      # B's group, where A's torn one was
        assert c.report_status()["metadata_log"]["last_group_bytes"] == 4096
    """)
    with open(dev, "r+b") as f:
        f.seek(ring_off + 8192)
        f.write(third)
    c = _log(dev)
    assert _loads(c, [1, 2, 9, 20]) == [1, 2, 20]
    assert _status(c)["recovery_outcome"] == "loaded"
    c.close()


def test_a_damaged_group_with_a_later_one_after_it_is_skipped_not_taken_for_the_tail(tmp_path):
    # The same three groups, the second damaged while the third is there: the third is replayed
    # (key 2 stays deleted), the second's FREE is lost (key 1 comes back, its own bytes), the
    # loss is reported, and the next writer's first checkpoint writes a whole base in a new
    # generation, so the damage is read no more.
    dev = make_device(tmp_path)
    _run_child(dev, """
        keys = [okey(i) for i in range(10)]
        assert all(c.put_many(keys, [Obj(payload(i, 2000)) for i in range(10)]).results)
        c.checkpoint_now()
        for i in (9, 1, 2):
            c.delete_many([keys[i].encoded])
            c.checkpoint_now()
    """)
    ring_off = META // 2 - (META // 2) // 4
    with open(dev, "r+b") as f:
        f.seek(ring_off + 4096 + 48)
        f.write(b"\xff" * 8)
    _run_child(dev, """
        st = c.report_status()
        assert st["recovery_outcome"] == "damaged" and not st["is_healthy"]
        assert "group 3 at ring offset 4096" in st["checkpoint_last_error"], st["checkpoint_last_error"]
        assert c.exists_many([okey(1).encoded, okey(2).encoded, okey(9).encoded]) == [True, False, False]
        gen = c._native.status()["metadata_log"]["generation"]
        assert all(c.put_many([okey(20)], [Obj(payload(20, 2000))]).results)
        c.checkpoint_now()
        ml = c._native.status()["metadata_log"]
        assert ml["bases_written"] == 1 and ml["generation"] != gen
    """)
    c = _log(dev)
    assert _loads(c, [1, 2, 9, 20]) == [1, 20]
    assert _status(c)["recovery_outcome"] == "loaded"
    c.close()


def test_classes_no_entry_uses_leave_with_the_next_base(tmp_path):
    # Every payload a shape of its own (LMCache's last chunk of a request varies in tokens):
    # the base carries only the classes its entries use, so a small region never fills with
    # classes of entries long gone, across compactions and restarts.
    dev = make_device(tmp_path, size=(128 << 10) + 64 * SLOT)
    c = _log(dev, meta_total_bytes=128 << 10)
    for i in range(1500):
        k = i % 4
        assert c.put_many([okey(k)], [Obj(payload(k, 64 + i))]).results == [True]
        c.checkpoint_now()
        c.delete_many([okey(k).encoded])
        if i == 700:
            c.close()
            c = _log(dev, meta_total_bytes=128 << 10)
    log = _status(c)["metadata_log"]
    assert log["compactions"] > 10 and log["base_too_large"] == 0
    _put(c, [7])
    c.close()
    c = _log(dev, meta_total_bytes=128 << 10)
    assert _loads(c, [7]) == [7]
    c.close()


def test_the_final_checkpoint_compacts_a_full_ring(tmp_path):
    # No periodic thread: the ring is left full, with changes still journaled, when close()
    # writes the final checkpoint; it compacts first and keeps them.
    dev = make_device(tmp_path)
    c = _log(dev)
    _put(c, range(40))
    c.checkpoint_now()
    for i in range(32):  # 32 groups of 4 KiB: the ring is full
        c.delete_many([okey(i).encoded])
        c.checkpoint_now()
    assert _status(c)["metadata_log"]["live_bytes"] == 32 * 4096
    big = list(range(1000, 1020))
    _put(c, big)
    c.close()
    c = _log(dev)
    assert _loads(c, list(range(40)) + big) == list(range(32, 40)) + big
    c.close()


def test_start_up_validation_runs_after_open_returns_with_the_periodic_thread(tmp_path):
    # A slot header another writer overwrote: open returns without reading every header; the
    # periodic thread's validation drops the entry soon after, and a load before that is a miss
    # (every load judges its header).
    import time

    dev = make_device(tmp_path)
    c = _log(dev)
    _put(c, range(50))
    off = c.entry_offset(okey(7).encoded)
    c.close()
    with open(dev, "r+b") as f:
        f.seek(off)
        f.write(b"\0" * 64)
    c = _log(dev, meta_enable_periodic=True, meta_verify_on_load=True)
    try:
        for _ in range(500):
            st = _status(c)
            if st["unverified_entry_count"] == 0:
                break
            time.sleep(0.01)
        assert st["unverified_entry_count"] == 0 and st["recovery_dropped_entries"] == 1
        assert _loads(c, range(50)) == [i for i in range(50) if i != 7]
    finally:
        c.close()


def test_format_v1_takes_over_a_log_device_only_when_told_to_start_empty(tmp_path):
    dev = make_device(tmp_path)
    c = _log(dev)
    _put(c, range(10))
    c.close()
    with pytest.raises(ValueError, match="meta_format='log'"):
        make_core(dev, meta_format="v1")
    c = make_core(dev, meta_format="v1", load_checkpoint_on_init=False)
    assert _status(c)["recovery_outcome"] == "skipped"
    _put(c, range(100, 105))  # its first checkpoint clears both superblocks, then writes v1
    c.close()
    assert read_containers(dev)
    c = make_core(dev, meta_format="v1")
    assert _loads(c, list(range(10)) + list(range(100, 105))) == list(range(100, 105))
    c.close()


def test_inspect_and_verify_read_a_log_device(tmp_path):
    from lmcache_rawblock import tools

    dev = make_device(tmp_path)
    c = _log(dev)
    _put(c, range(12))
    c.checkpoint_now()
    c.delete_many([okey(0).encoded])
    c.close()
    info = tools.inspect_device(dev)
    assert info["metadata_format"] == "log" and info["checkpoint_in_use"] in (0, 1)
    assert info["geometry"]["entries"] == 11 and info["metadata_log"]["log"]["frees"] == 1
    res = tools.verify_device(dev)
    assert res["checked"] == 11 and res["ok"] == 11
