"""LMCache hazards fixed by the C core (format unchanged), each with a test that fails on
LMCache's behaviour and passes on ours; plus the periodic checkpoint thread and idle rule."""

import os
import threading
import time

import pytest

from core_helpers import (
    BLOCK, HEADER, META, SLOT, Obj, base_state, make_core, make_device, newest_state, okey, payload,
    odirect_ok, read_containers, read_slot, write_container, write_slot,
)


def _entry(slot, size):
    return {"offset": META + slot * SLOT, "size": size, "shape": None, "dtype": None, "fmt": None,
            "cached_positions": None}


@pytest.mark.v1_layout
def test_sequence_resumes_when_load_is_disabled(tmp_path):
    # LMCache starts at seq 1 in container 0; container 1 (seq 4, stale) then wins on restart.
    dev = make_device(tmp_path)
    stale = okey(1)
    write_slot(dev, META, stale.slot_identity, b"s" * 10)
    write_container(dev, 1, 4, base_state(dev, 1, {stale.encoded: _entry(0, 10)}))
    c = make_core(dev, load_checkpoint_on_init=False)
    assert c.report_status()["metadata_seq"] == 4
    fresh = okey(2)
    # Container 1 was not read, so it may list any slot: before the first slot is handed out,
    # a checkpoint (seq 5, container 0) and then one over container 1 (seq 6) replace it.
    c.put_many([fresh], [Obj(b"f" * 10)])
    st = c.report_status()
    assert (st["metadata_seq"], st["checkpoints_for_room"]) == (6, 2)
    c.checkpoint_now()
    assert c.report_status()["metadata_seq"] == 7
    c.close()
    c = make_core(dev)
    try:
        assert c.exists_many([fresh.encoded, stale.encoded]) == [True, False]
    finally:
        c.close()


@pytest.mark.v1_layout
def test_sequence_resumes_when_payload_rejected(tmp_path):
    # The newest checkpoint is rejected (another device path): we still continue after its seq.
    dev = make_device(tmp_path)
    write_container(dev, 1, 6, base_state(dev, 0, {}, device_path="/dev/elsewhere"))
    c = make_core(dev)
    k = okey(3)
    c.put_many([k], [Obj(10)])  # first replaces both containers (seq 7 and 8): see above
    c.close()
    assert newest_state(dev)[:2] == (0, 9)
    c = make_core(dev)
    try:
        assert c.exists_many([k.encoded]) == [True]
    finally:
        c.close()


@pytest.mark.v1_layout
def test_never_overwrites_the_loaded_checkpoint(tmp_path):
    # Container 0: valid seq 5 (loaded). Container 1: header seq 6, torn payload. The next
    # write must not land in container 0 (seq 7 would): it uses seq 8 in container 1.
    dev = make_device(tmp_path)
    a = okey(1)
    write_slot(dev, META, a.slot_identity, b"a" * 10)
    write_container(dev, 0, 5, base_state(dev, 1, {a.encoded: _entry(0, 10)}))
    write_container(dev, 1, 6, base_state(dev, 0, {}), crc=1)
    c = make_core(dev)
    assert c.exists_many([a.encoded]) == [True]
    c.put_many([okey(2)], [Obj(10)])
    got = {k: (seq, st is not None) for k, seq, st, _ in read_containers(dev)}
    assert got == {0: (5, True), 1: (8, True)}
    c.checkpoint_now()  # container 1 now holds the newest: container 0 may be replaced
    c._native.close()
    got = {k: (seq, st is not None) for k, seq, st, _ in read_containers(dev)}
    assert got == {0: (9, True), 1: (8, True)}


@pytest.mark.v1_layout
def test_one_checkpoint_writer_at_a_time(tmp_path):
    dev = make_device(tmp_path)
    c = make_core(dev)
    try:
        c._native._set_checkpoint_delay_ms(300)
        c.put_many([okey(1)], [Obj(10)])
        t = threading.Thread(target=c.checkpoint_now)
        t.start()
        time.sleep(0.1)  # writer A has chosen its sequence number and is sleeping
        c.put_many([okey(2)], [Obj(10)])
        c.checkpoint_now()  # writer B must wait for A and then take the next sequence
        t.join()
        c._native._set_checkpoint_delay_ms(0)
        got = sorted((k, seq) for k, seq, st, _ in read_containers(dev) if st is not None)
        assert got == [(0, 1), (1, 2)]
        assert list(newest_state(dev)[2]["entries"]) == [okey(1).encoded, okey(2).encoded]
        assert c.report_status()["metadata_seq"] == 2
    finally:
        c.close()


@pytest.mark.v1_layout
def test_oversized_checkpoint_raises_and_is_reported(tmp_path):
    dev = make_device(tmp_path, size=16 << 20)
    meta = 16384  # containers of 8 KiB -> payload capacity 4096 bytes
    c = make_core(dev, meta_total_bytes=meta)
    keys = [okey(i, model="m" * 100) for i in range(40)]
    c.put_many(keys, [Obj(10) for _ in keys])
    with pytest.raises(RuntimeError, match="metadata payload too large"):
        c.checkpoint_now()
    st = c.report_status()
    assert st["checkpoint_too_large_count"] == 1 and "too large" in st["checkpoint_last_error"]
    out = c.close()
    assert out.final_checkpoint_written is False
    assert c.report_status()["checkpoint_too_large_count"] == 2


def test_payload_checksum_turns_corruption_into_a_miss(tmp_path):
    dev = make_device(tmp_path)
    k = okey(1)
    for checksum in (False, True):
        c = make_core(dev, verify_payload_checksum=checksum, load_checkpoint_on_init=False)
        c.put_many([k], [Obj(b"A" * 100)])
        with open(dev, "r+b") as f:  # corrupt one payload byte behind the core's back
            f.seek(META + 4096 + 10)
            f.write(b"X")
        out = Obj(100)
        ok = c.load_many_into([k.encoded], [out])
        if checksum:
            assert ok == [False]  # a miss, never wrong bytes
            assert c.report_status()["payload_checksum_failures"] == 1
        else:
            assert ok == [True] and out.bytes() != b"A" * 100  # LMCache's behaviour: wrong bytes served
        c.close()


def test_payload_checksum_header_is_readable_by_lmcache_and_survives_restart(tmp_path):
    dev = make_device(tmp_path)
    k = okey(1)
    c = make_core(dev, verify_payload_checksum=True)
    c.put_many([k], [Obj(b"B" * 300)])
    c.close()
    magic, ident, plen, hdr, data = read_slot(dev, META)
    assert (magic, ident, plen, data) == (b"LMCBLK01", k.slot_identity, 300, b"B" * 300)
    assert hdr[24:32] == b"RBXXH3v1"
    # LMCache-style open (checksum off) still recovers the entry.
    c = make_core(dev)
    assert c.exists_many([k.encoded]) == [True]
    c._native.close()
    # Stale payload under a fresh header (torn re-put): with the checksum it is a miss.
    with open(dev, "r+b") as f:
        f.seek(META + 4096)
        f.write(b"C" * 300)
    c = make_core(dev, verify_payload_checksum=True)
    try:
        assert c.exists_many([k.encoded]) == [True]
        assert c.load_many_into([k.encoded], [Obj(300)]) == [False]
    finally:
        c.close()


def _task_ids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _sleeps(tid: str) -> int:
    """How many times the thread blocked (voluntary context switches)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for task {tid}")


@pytest.mark.v1_layout
def test_periodic_checkpoint_respects_idle_rule(tmp_path):
    dev = make_device(tmp_path)
    c = make_core(dev, meta_enable_periodic=True, meta_checkpoint_interval_sec=1, meta_idle_quiet_ms=0)
    try:
        c.put_many([okey(1)], [Obj(10)])
        deadline = time.monotonic() + 5
        while c.report_status()["metadata_seq"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.report_status()["metadata_seq"] == 1
    finally:
        c.close()
    dev2 = make_device(tmp_path, name="busy.img")
    before = _task_ids()
    c = make_core(dev2, meta_enable_periodic=True, meta_checkpoint_interval_sec=1, meta_idle_quiet_ms=60000)
    try:
        started = _task_ids() - before
        assert len(started) == 1, f"expected the periodic checkpoint thread alone, got {started}"
        (ticker,) = started
        c.put_many([okey(1)], [Obj(10)])
        # The thread sleeps only between its decisions (nothing else takes the core's locks now),
        # so two more sleeps mean it woke and decided at least once after the put.
        slept = _sleeps(ticker)
        deadline = time.monotonic() + 10
        while _sleeps(ticker) < slept + 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _sleeps(ticker) >= slept + 2, "the periodic checkpoint thread never woke after the put"
        assert c.report_status()["metadata_seq"] == 0  # not idle for 60 s: no periodic checkpoint
        c.checkpoint_now()  # forced
        assert c.report_status()["metadata_seq"] == 1
    finally:
        c.close()


# ---- slot reuse after the last checkpoint, meta_verify_on_load=False ----
#
# Records recovered without header validation carry an "unverified" mark; the first load of
# one reads its slot header with the payload (posix: one read of header + payload into a
# scratch buffer; io_uring: a header read in the payload's batch) and judges it before the
# key counts as loaded. A mismatch is a miss and drops the record as recovery would.


ENGINES = [("posix", False), ("io_uring", False), ("posix", True), ("io_uring", True)]
ENGINE_IDS = ["posix", "io_uring", "posix-odirect", "io_uring-odirect"]


def _fast(dev, engine, odirect, **kw):
    if odirect and not odirect_ok(dev):
        pytest.skip("the temporary directory's file system refuses O_DIRECT")
    return make_core(dev, io_engine=engine, use_odirect=odirect, meta_verify_on_load=False, **kw)


def _meta_region(dev):
    with open(dev, "rb") as f:
        return f.read(META)


def _crash(dev, meta_region):
    """The device as a crash leaves it: slots as written, metadata as of the last checkpoint."""
    with open(dev, "r+b") as f:
        f.write(meta_region)


def _io(c):
    io = c.report_status()["rust_io"]
    return io["read_attempts"], io["read_submitted_bytes"]


@pytest.mark.parametrize("engine,odirect", ENGINES, ids=ENGINE_IDS)
def test_slot_reuse_with_verification_off_is_a_miss(tmp_path, engine, odirect):
    dev = make_device(tmp_path)
    k0, k1, k2 = okey(10), okey(1), okey(2)
    n = 5000  # K1 and K2 have the same length: only the identity tells them apart
    w = make_core(dev, io_engine=engine)
    w.put_many([k0, k1], [Obj(payload(0, n)), Obj(payload(1, n))])
    slot_k1 = w.entry_offset(k1.encoded)
    w.checkpoint_now()  # lists k0 and k1
    ckpt = _meta_region(dev)
    w.delete_many([k1.encoded])
    w.put_many([k2], [Obj(payload(2, n))])
    # The checkpoint on the device still lists K1 there, so we never reuse its slot...
    assert w.entry_offset(k2.encoded) != slot_k1
    w._native.close()
    _crash(dev, ckpt)
    # ... but LMCache's core does (LIFO): K2's header and payload in K1's slot.
    write_slot(dev, slot_k1, k2.slot_identity, payload(2, n))

    c = _fast(dev, engine, odirect)
    try:
        st = c.report_status()
        # fast start-up: nothing judged at open, both records indexed and marked
        assert st["recovery_dropped_entries"] == 0 and st["unverified_entry_count"] == 2
        assert c.exists_many([k0.encoded, k1.encoded, k2.encoded]) == [True, True, False]
        free_before = st["free_slot_count"]
        outs = [Obj(b"\xee" * n), Obj(b"\xee" * n)]
        # LMCache: [True, True] with K2's bytes in outs[0]
        assert c.load_many_into([k1.encoded, k0.encoded], outs) == [False, True]
        assert payload(2, n)[:64] not in outs[0].bytes()  # K2's bytes never handed out as K1's
        assert outs[1].bytes() == payload(0, n)
        st = c.report_status()
        assert st["recovery_dropped_entries"] == 1 and st["load_dropped_entries"] == 1
        assert st["load_verified_entries"] == 1 and st["unverified_entry_count"] == 0
        # its slot is still listed by the checkpoint on the device: held, not free
        assert st["free_slot_count"] == free_before and st["checkpoint_held_slots"] == 1
        assert st["metadata_dirty_total"] > st["metadata_persisted"]
        assert c.exists_many([k1.encoded]) == [False]
        assert c.load_many_into([k1.encoded], [Obj(n)]) == [False]
        # K2's slot is untouched on the device; K2 (never checkpointed) loads once put again
        assert read_slot(dev, slot_k1)[1:3] == (k2.slot_identity, n)
        assert read_slot(dev, slot_k1)[4] == payload(2, n)
        assert c.put_many([k2], [Obj(payload(2, n))]).results == [True]
        out = Obj(n)
        assert c.load_many_into([k2.encoded], [out]) == [True] and out.bytes() == payload(2, n)
    finally:
        c.close()
    # the drop reached the checkpoint: K1 stays gone after the next restart
    c = _fast(dev, engine, odirect)
    try:
        assert c.exists_many([k0.encoded, k1.encoded, k2.encoded]) == [True, False, True]
    finally:
        c.close()


@pytest.mark.parametrize("engine,odirect", ENGINES, ids=ENGINE_IDS)
def test_unverified_entry_is_checked_once(tmp_path, engine, odirect):
    dev = make_device(tmp_path)
    k = okey(3)
    n = 3000
    w = make_core(dev)
    w.put_many([k], [Obj(payload(3, n))])
    w.close()
    c = _fast(dev, engine, odirect)
    try:
        assert c.report_status()["unverified_entry_count"] == 1
        a0, b0 = _io(c)
        out = Obj(n)
        assert c.load_many_into([k.encoded], [out]) == [True] and out.bytes() == payload(3, n)
        a1, b1 = _io(c)
        st = c.report_status()
        assert st["unverified_entry_count"] == 0 and st["load_verified_entries"] == 1
        assert st["load_dropped_entries"] == 0 and st["metadata_dirty_total"] == st["metadata_persisted"]
        xfer = -(-n // BLOCK) * BLOCK if odirect else n
        hdr = HEADER if (engine == "posix" or odirect) else 64
        if engine == "posix":
            assert (a1 - a0, b1 - b0) == (1, HEADER + xfer)  # one read: header + payload
        else:
            assert (a1 - a0, b1 - b0) == (2, hdr + xfer)  # header read in the payload's batch
        out = Obj(n)
        assert c.load_many_into([k.encoded], [out]) == [True] and out.bytes() == payload(3, n)
        a2, b2 = _io(c)
        # verified now: still judged (every load reads its header), but counted once
        assert (a2 - a1, b2 - b1) == (a1 - a0, b1 - b0)
        assert c.report_status()["load_verified_entries"] == 1
    finally:
        c.close()


@pytest.mark.parametrize("engine,odirect", ENGINES, ids=ENGINE_IDS)
def test_unverified_entry_with_torn_header_is_a_miss(tmp_path, engine, odirect):
    dev = make_device(tmp_path)
    k = okey(4)
    n = 700
    w = make_core(dev)
    w.put_many([k], [Obj(payload(4, n))])
    off = w.entry_offset(k.encoded)
    w.close()
    with open(dev, "r+b") as f:  # magic gone, rest of the header and the payload intact
        f.seek(off)
        f.write(b"\0" * 8)
    c = _fast(dev, engine, odirect)
    try:
        assert c.exists_many([k.encoded]) == [True]
        out = Obj(b"\xee" * n)
        assert c.load_many_into([k.encoded], [out], raise_on_error=True) == [False]  # a miss, not an error
        assert payload(4, n)[:64] not in out.bytes()
        st = c.report_status()
        assert st["load_dropped_entries"] == 1 and st["recovery_dropped_entries"] == 1
        assert c.exists_many([k.encoded]) == [False]
    finally:
        c.close()


def test_unverified_entry_checksum_record_is_checked(tmp_path):
    # Hazard 5 with verification off: a header with our checksum record over a stale payload.
    dev = make_device(tmp_path)
    k = okey(5)
    w = make_core(dev, verify_payload_checksum=True)
    w.put_many([k], [Obj(b"B" * 300)])
    w.close()
    with open(dev, "r+b") as f:
        f.seek(META + HEADER)
        f.write(b"C" * 300)
    ckpt = _meta_region(dev)
    for engine in ("posix", "io_uring"):
        _crash(dev, ckpt)  # each engine starts from the same checkpoint
        c = _fast(dev, engine, False)
        try:
            assert c.load_many_into([k.encoded], [Obj(300)]) == [False]  # LMCache: True, b"C" * 300
            st = c.report_status()
            assert st["load_dropped_entries"] == 1 and st["payload_checksum_failures"] == 1
        finally:
            c.close()


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_unverified_header_read_failure_keeps_the_entry(tmp_path, engine):
    dev = make_device(tmp_path)
    k = okey(6)
    w = make_core(dev)
    w.put_many([k], [Obj(payload(6, 100))])
    w.close()
    c = _fast(dev, engine, False)
    try:
        c._native._inject_fault("read", 1)  # the first data read: the header (with the payload on posix)
        with pytest.raises(OSError):
            c.load_many_into([k.encoded], [Obj(100)], raise_on_error=True)
        st = c.report_status()
        assert st["unverified_entry_count"] == 1 and st["load_dropped_entries"] == 0  # unreadable != invalid
        out = Obj(100)
        assert c.load_many_into([k.encoded], [out]) == [True] and out.bytes() == payload(6, 100)
        assert c.report_status()["unverified_entry_count"] == 0
    finally:
        c.close()


def test_verified_and_fresh_entries_read_their_header_in_the_same_call(tmp_path):
    dev = make_device(tmp_path)
    k, f = okey(7), okey(8)
    w = make_core(dev)
    w.put_many([k], [Obj(payload(7, 100))])
    w.close()
    c = make_core(dev)  # meta_verify_on_load=True: judged at open
    try:
        assert c.report_status()["unverified_entry_count"] == 0
        c.put_many([f], [Obj(payload(8, 100))])
        a0, b0 = _io(c)
        assert c.load_many_into([k.encoded, f.encoded], [Obj(100), Obj(100)]) == [True, True]
        assert _io(c) == (a0 + 2, b0 + 2 * (HEADER + 100))  # one preadv each: header + payload
    finally:
        c.close()
    c = _fast(dev, "posix", False)  # verification off: records written in this process are not marked
    try:
        assert c.report_status()["unverified_entry_count"] == 2
        g = okey(9)
        c.put_many([g], [Obj(payload(9, 100))])
        assert c.report_status()["unverified_entry_count"] == 2
        a0, b0 = _io(c)
        assert c.load_many_into([g.encoded], [Obj(100)]) == [True]
        assert _io(c) == (a0 + 1, b0 + HEADER + 100)
        c.delete_many([k.encoded])
        assert c.report_status()["unverified_entry_count"] == 1
    finally:
        c.close()
