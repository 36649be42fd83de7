"""Crash-state enumeration (tests/reliability/crashstates.py): every device image a power loss
could leave during a recorded workload recovers without wrong bytes, without losing a durable
key and without bringing back a version the last acknowledged checkpoint no longer listed,
in both metadata formats (format v1; the log format, and the move from v1 to it), with freed
slots deallocated (deallocate_freed="on": punched holes, zeros once durable) and without. Runs
through `make test-reliability`."""

from __future__ import annotations

import dataclasses
import os

import pytest

from reliability import crashstates
from reliability.common import HEADER, SLOT, Config

pytestmark = pytest.mark.skipif(os.environ.get("RB_CRASH_TESTS") != "1",
                                reason="crash harnesses run via `make test-reliability` (RB_CRASH_TESTS=1)")

WORKLOADS = list(crashstates.WORKLOADS)
GROUP_MAGIC = b"RBMLOG02"
BASE_MAGIC = b"RBMBASE2"
SB_MAGIC = b"RBMETA02"


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_write_log_rebuilds_the_device(engine, workload, tmp_path):
    # The recorder misses nothing: the pre-workload image plus every logged write is the
    # device as the workload left it.
    wl = crashstates.WORKLOADS[workload]
    rec = crashstates.record_workload(engine, str(tmp_path), wl)
    assert sum(r.kind == crashstates.WRITE for r in rec.recs) >= len(wl.ops)
    # deallocations (zeros over their ranges) included: a punched hole reads back as zeros
    assert crashstates.replay_all(rec) == rec.final
    deallocs = [r for r in rec.recs if r.kind == crashstates.DEALLOC]
    if wl.dealloc:
        # the core deallocated freed slots and the recorder saw every range it reports
        assert rec.status["dealloc_state"] == "on" and rec.status["dealloc_kind"] == "punch_hole"
        assert deallocs and rec.status["dealloc_failures"] == 0
        assert sum(len(r.data) for r in deallocs) == rec.status["dealloc_bytes"]
        assert all(r.off >= crashstates.META and (r.off - crashstates.META) % SLOT == 0 and len(r.data) % SLOT == 0
                   for r in deallocs)
    else:
        assert not deallocs and rec.status["dealloc_state"] == "off"


# Torn writes: 4 KiB blocks; in the log format also 1 KiB blocks of metadata writes, so a
# one-block log group, base or superblock write can persist in part.
TEARS = {"whole-writes": (0, 0), "torn-4k": (4096, 4096), "torn-4k-meta-1k": (4096, 1024)}
TORN = {"v1": "torn-4k", "log": "torn-4k-meta-1k"}
# Without deallocation: every workload, whole and torn, recorded with each engine. With it
# (deallocate_freed="on"): every workload with whole writes, and the two written for it torn as
# well (reuse with each engine, reuse-log recorded with posix); deallocations are torn like data
# writes (4 KiB blocks). The rest of the torn deallocation matrix runs from the command line
# (tests/RELIABILITY.md); CI time stays near what it was.
ENGINES = ["posix", "io_uring"]
CASES = [(e, w, t) for w in WORKLOADS for t in ("whole-writes", TORN[crashstates.WORKLOADS[w].meta_format])
         for e in ENGINES
         if t == "whole-writes" or not crashstates.WORKLOADS[w].dealloc or w == "reuse"
         or (w == "reuse-log" and e == "posix")]


@pytest.mark.parametrize("engine,workload,tear", CASES, ids=[f"{e}-{w}-{t}" for e, w, t in CASES])
def test_crash_states(engine, workload, tear, tmp_path, capsys):
    data_tear, meta_tear = TEARS[tear]
    wl = crashstates.WORKLOADS[workload]
    # with deallocation, recovered by the recording engine only (both engines' recovery of the
    # same images is what the workloads without it check): half the time
    results = crashstates.check_recorded(engine, [engine] if wl.dealloc else ["posix", "io_uring"], str(tmp_path),
                                         tear=data_tear, tear_meta=meta_tear, workload=wl)
    with capsys.disabled():
        for r in results:
            print(f"\ncrash states ({tear}) " + r.row(), flush=True)
    for r in results:
        assert r.states > r.writes and r.keys_checked > 0
        # the enumeration saw deallocations when the workload has them on: one that silently
        # stopped would leave the checker nothing to judge
        assert (r.deallocs > 0) == crashstates.WORKLOADS[workload].dealloc, r.row()
        assert (r.wrong_states, r.lost_states, r.stale_states) == (0, 0, 0), "\n".join(r.failures[:10])
        assert r.damage_states == 0, "\n".join(r.failures[:10])


def _magic_writes(rec, magic):
    return [r for r in rec.recs if r.kind == crashstates.WRITE and r.data[:8] == magic]


def _reuses(rec):
    """[(put op index, new key, old key, slot offset)] for every put that stored a key in a slot
    another key held (in the setup or an earlier put) until a delete of it."""
    owner = dict(rec.setup_slots)
    out = []
    for i, op in enumerate(rec.ops):
        for k, off in op.slots.items():
            if off in owner and owner[off] != k:
                out.append((i, k, owner[off], off))
            owner[off] = k
    return out


def test_log_workload_covers_what_it_claims(tmp_path):
    # Records after puts and after deletes, a freed slot taken after one small record, the ring
    # filled and compacted by a checkpoint, two compactions switching base areas.
    rec = crashstates.record_workload("posix", str(tmp_path), crashstates.WORKLOADS["log"])
    ml = rec.status["metadata_log"]
    assert ml["state"] == "live" and ml["ring_full"] >= 1
    assert ml["compactions"] >= 3  # the full ring's, then the two compact_metadata() calls
    assert [op.synced for op in rec.ops if op.kind == "compact"] == [True, True]
    bases = _magic_writes(rec, BASE_MAGIC)
    sbs = _magic_writes(rec, SB_MAGIC)
    assert len(bases) >= 3 and {b.off for b in bases} == {4096, 65536 + 4096}  # both base areas
    assert {s.off for s in sbs} == {0, 65536}
    assert len(_magic_writes(rec, GROUP_MAGIC)) >= 5
    # A put into the slot of a key whose delete one checkpoint (one group, no base) made
    # durable, and nothing else in between.
    one_group = []
    for i, k, old, off in _reuses(rec):
        dels = [j for j in range(i) if rec.ops[j].kind == "delete" and old in rec.ops[j].keys]
        lo, hi = rec.ops[dels[-1]].log_after, rec.ops[i].log_before
        between = [r for r in rec.recs if r.kind == crashstates.WRITE and lo <= r.end <= hi]
        if [r.data[:8] for r in between] == [GROUP_MAGIC]:
            one_group.append((k, old, off))
    assert one_group, _reuses(rec)


def test_move_workload_moves_the_device(tmp_path):
    for name, v1_write in (("move", True), ("move-c1", False)):
        rec = crashstates.record_workload("posix", str(tmp_path), crashstates.WORKLOADS[name])
        assert rec.pre[:8] == b"LMCIDX01" or rec.pre[65536:65544] == b"LMCIDX01"  # set up in format v1
        assert rec.status["metadata_log"]["state"] == "live"
        first_sb = _magic_writes(rec, SB_MAGIC)[0]
        before = [r for r in rec.recs if r.kind == crashstates.WRITE and r.seq < first_sb.seq]
        # move: the newest v1 checkpoint was in container 0, so one is written into container 1
        # first; move-c1: it was in container 1 already
        assert any(r.off == 65536 and r.data[:8] == b"LMCIDX01" for r in before) == v1_write
        assert any(r.data[:8] == BASE_MAGIC and r.off == 4096 for r in before)
        assert _reuses(rec)  # a key stored into a slot a v1 checkpoint had listed for another


@pytest.mark.parametrize("at_open", [True, False], ids=["validated-at-open", "load-check-only"])
def test_the_reuse_hazard_shows_when_the_free_record_is_missing(at_open, tmp_path):
    """The check has teeth: take the state after a put into a slot whose FREE record was one
    durable group old, with the new key's payload written and its slot header not, and drop
    that group (as a core that reused the slot before the record was durable would leave it).
    Recovery then lists the old key, whose slot header is still there, over the new key's
    payload: wrong bytes, whichever line checks the header. With the group, the same image
    serves neither key."""
    rec = crashstates.record_workload("posix", str(tmp_path), crashstates.WORKLOADS["log"])
    i, new, old, off = next((i, k, o, s) for i, k, o, s in _reuses(rec) if rec.ops[i].kind == "put")
    put = rec.ops[i]
    dels = [j for j in range(i) if rec.ops[j].kind == "delete" and old in rec.ops[j].keys]
    group = [r for r in rec.recs if r.kind == crashstates.WRITE and r.data[:8] == GROUP_MAGIC
             and rec.ops[dels[-1]].log_after <= r.end <= put.log_before][-1]
    before = [r for r in rec.recs if r.kind == crashstates.WRITE and r.end <= put.log_before]
    new_payload = next(r for r in rec.recs if r.kind == crashstates.WRITE and r.off == off + HEADER
                       and put.log_before < r.end <= put.log_after)
    cfg = Config("posix", False, False, at_open, "log")
    allkeys = sorted(rec.versions)
    durable, allowed = crashstates.expectations(rec, put.log_before, put.log_after)
    images = {}
    for name, skip in (("with the group", None), ("without it", group)):
        img = bytearray(rec.pre)
        for r in before + [new_payload]:
            if r is not skip:
                crashstates.apply(img, r)
        images[name] = crashstates.recover_image(bytes(img), rec.dev, cfg, rec.versions, allkeys)
    wrong, lost, stale = crashstates.judge(images["with the group"], durable, allowed)
    assert (wrong, lost, stale) == ([], [], [])
    assert old not in images["with the group"]["served"] and new not in images["with the group"]["served"]
    bad = images["without it"]["wrong"]
    assert [k for k, _ in bad] == [old] and f"tagged as key {new}" in bad[0][1], images["without it"]


def test_a_synced_group_without_the_flush_of_its_payloads_is_caught(tmp_path):
    """The model has teeth for groups synced by themselves (RWF_DSYNC): such a write makes its
    own range durable and nothing else, so the payloads a PUT group names are durable only
    through the flush before it. Dropping that flush from the recording (as a writer that skipped
    it would leave the log) must give crash states where a checkpointed key's payload is missing
    under its durable record, also at crash points after the group's sync; with the flush, none
    (test_crash_states)."""
    rec = crashstates.record_workload("posix", str(tmp_path), crashstates.WORKLOADS["log"])
    ck = next(op for prev, op in zip(rec.ops, rec.ops[1:]) if op.kind == "checkpoint" and prev.kind == "put")
    synced = [r for r in rec.recs if r.kind == crashstates.SYNCED and ck.log_before < r.end <= ck.log_after]
    assert synced, "the checkpoint after a put wrote no synced group"
    flush = [r for r in rec.recs if r.kind == crashstates.FLUSH and ck.log_before < r.end < synced[0].end]
    assert len(flush) == 1, flush
    cut = dataclasses.replace(rec, recs=[r for r in rec.recs if r is not flush[0]])
    results = crashstates.check_recorded("posix", ["posix"], str(tmp_path), workload=cut.workload, rec=cut)
    assert all(r.lost_states + r.wrong_states > 0 for r in results), [r.row() for r in results]
    # caught after the group's sync too (a model counting a synced write as a flush of all before
    # it sees these payloads durable there): states with the group durable, its payload not
    assert all(any(" durable []" not in f for f in r.failures) for r in results), results[0].failures[:3]


@pytest.mark.parametrize("workload", ["log", "move", "reuse-log"])
@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_second_crash_after_recovery(engine, workload, tmp_path, capsys):
    # A crash, recovery, the next writer's operations (its first group goes where recovery
    # found the log's end, over a torn group or a group of the dead writer), and a crash in
    # those: 12 seeded first-crash images (6 for reuse-log, deallocation on; metadata writes
    # torn in 1 KiB blocks), every state of each second run.
    wl = crashstates.WORKLOADS[workload]
    r = crashstates.check_second_crash(engine, str(tmp_path), wl, limit=6 if wl.dealloc else 12)
    with capsys.disabled():
        print("\ncrash states (twice) " + r.row(), flush=True)
    assert r.states > r.writes and r.keys_checked > 0
    if wl.dealloc:
        assert r.deallocs > 0, r.row()  # the follow-up runs' deallocations, over every second run
    assert (r.wrong_states, r.lost_states, r.stale_states) == (0, 0, 0), "\n".join(r.failures[:10])
    assert r.damage_states == 0, "\n".join(r.failures[:10])


def _deallocs(rec):
    return [r for r in rec.recs if r.kind == crashstates.DEALLOC]


def _epoch_of(rec, seq):
    """Index of the flush epoch a record with sequence number seq may be lost in."""
    return sum(1 for r in rec.recs if r.kind == crashstates.FLUSH and r.off <= seq)


@pytest.mark.parametrize("workload", ["reuse", "reuse-log"])
def test_reuse_workloads_cover_what_they_claim(workload, tmp_path):
    # Deallocations after the metadata that freed the slots was flushed (checkpoint, a
    # compaction in the log format, a delete of a key no v1 container lists), ranges of more
    # than one slot merged, and puts into deallocated slots whose writes share a flush epoch
    # with the deallocation (so crash states hold the new key's bytes over a range whose
    # deallocation was lost, and a deallocation without the new key's bytes).
    rec = crashstates.record_workload("posix", str(tmp_path), crashstates.WORKLOADS[workload])
    deallocs = _deallocs(rec)
    assert any(len(r.data) > SLOT for r in deallocs)
    by_op = {}
    for i, op in enumerate(rec.ops):
        for r in deallocs:
            if op.log_before < r.end <= op.log_after:
                by_op.setdefault(op.kind, []).append((i, r))
    assert "checkpoint" in by_op and ("delete" if workload == "reuse" else "compact") in by_op, by_op
    into_deallocated = []
    for i, op in enumerate(rec.ops):
        for k, off in op.slots.items():
            before = [r for r in deallocs if r.off <= off < r.off + len(r.data) and r.end <= op.log_before]
            if before:
                d = before[-1]
                first_write = min(r.seq for r in rec.recs if r.kind == crashstates.WRITE and r.off == off
                                  and op.log_before < r.end <= op.log_after)
                into_deallocated.append((k, off, _epoch_of(rec, d.seq) == _epoch_of(rec, first_write)))
    assert len(into_deallocated) >= 3 and any(same for _k, _o, same in into_deallocated), into_deallocated


@pytest.mark.parametrize("at_open", [True, False], ids=["validated-at-open", "load-check-only"])
@pytest.mark.parametrize("workload", ["reuse", "reuse-log"])
def test_a_deallocation_landing_on_a_live_slot_is_caught(workload, at_open, tmp_path):
    """The check has teeth for deallocations: take a deallocation that a put then reused the
    slots of, and let it land after that put and the checkpoint that made the put durable (what a
    core that handed a slot to the allocator before its deallocation completed, or a drive that
    reordered the two, would leave). The new keys are durable and their slots read zeros: the
    checker reports them lost, whichever line checks the header. Without the doctoring the same
    point is clean."""
    rec = crashstates.record_workload("posix", str(tmp_path), crashstates.WORKLOADS[workload])
    deallocs = _deallocs(rec)
    hit = None
    for i, op in enumerate(rec.ops):
        if op.kind != "put":
            continue
        for d in deallocs:
            keys = [k for k, off in op.slots.items() if d.off <= off < d.off + len(d.data) and d.end <= op.log_before]
            if keys:
                hit = (i, d, keys)
                break
        if hit:
            break
    assert hit, "no put into a deallocated slot"
    i, d, keys = hit
    ck = next(op for op in rec.ops[i + 1:] if op.synced)
    upto = [r for r in rec.recs if crashstates.lands(r) and r.end <= ck.log_after]
    durable, allowed = crashstates.expectations(rec, ck.log_after, ck.log_after)
    assert set(keys) <= durable
    cfg = Config("posix", False, False, at_open, rec.workload.meta_format, True)
    allkeys = sorted(rec.versions)
    img = bytearray(rec.pre)
    for r in upto:
        crashstates.apply(img, r)
    clean = crashstates.recover_image(bytes(img), rec.dev, cfg, rec.versions, allkeys)
    assert crashstates.judge(clean, durable, allowed) == ([], [], [])
    crashstates.apply(img, d)   # the deallocation again, after the put and its checkpoint
    got = crashstates.recover_image(bytes(img), rec.dev, cfg, rec.versions, allkeys)
    wrong, lost, stale = crashstates.judge(got, durable, allowed)
    assert wrong == [] and stale == [] and set(keys) <= set(lost), got


@pytest.mark.parametrize("workload", ["full", "full-log"])
def test_full_workloads_take_slots_before_their_deallocation(workload, tmp_path):
    # On the full device a put writes the metadata that frees slots itself and takes them
    # undeallocated (dealloc_skipped); later frees are deallocated and reused again.
    rec = crashstates.record_workload("posix", str(tmp_path), crashstates.WORKLOADS[workload])
    assert rec.status["dealloc_skipped"] > 0 and rec.status["dealloc_slots"] > 0
    put8 = next(op for op in rec.ops if op.kind == "put" and 8 in op.keys)
    assert 8 in put8.slots  # stored, in a slot freed by the delete just before
    # the group that frees them made durable: flushed, or synced by itself (RWF_DSYNC)
    assert any(r.kind in (crashstates.FLUSH, crashstates.SYNCED) for r in rec.recs
               if put8.log_before < r.end <= put8.log_after)
    assert not any(r.kind == crashstates.DEALLOC for r in rec.recs if put8.log_before < r.end <= put8.log_after)


def test_the_lane_workload_writes_free_groups_without_a_flush(tmp_path):
    # The deletes' FREE records of durable keys go ahead of pending puts: a put's room and a
    # reclaim write them as a group synced by itself, with no flush of the pending payloads, so
    # crash states hold the FREE group durable and the puts before it not.
    rec = crashstates.record_workload("posix", str(tmp_path), crashstates.WORKLOADS["lane-log"])
    lane = rec.status["metadata_log"]["free_lane"]
    assert lane["groups"] >= 3 and lane["records"] >= 5, lane
    put8 = next(op for op in rec.ops if op.kind == "put" and 8 in op.keys)
    inside = [r.kind for r in rec.recs if put8.log_before < r.end <= put8.log_after]
    assert {8, 11} <= set(put8.slots) and crashstates.SYNCED in inside and crashstates.FLUSH not in inside, inside
    last = rec.ops[-2]  # the reclaim after deleting 4 and 9 (both durable): the group alone
    inside = [r.kind for r in rec.recs if last.log_before < r.end <= last.log_after]
    assert last.kind == "reclaim" and crashstates.SYNCED in inside and crashstates.FLUSH not in inside, inside
