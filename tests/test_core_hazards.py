"""LMCache hazards fixed by the C core (format unchanged), each with a test that fails on
LMCache's behaviour and passes on ours; plus the periodic checkpoint thread and idle rule."""

import threading
import time

import pytest

from core_helpers import (
    META, SLOT, Obj, base_state, make_core, make_device, newest_state, okey, read_containers, read_slot,
    write_container, write_slot,
)


def _entry(slot, size):
    return {"offset": META + slot * SLOT, "size": size, "shape": None, "dtype": None, "fmt": None,
            "cached_positions": None}


def test_sequence_resumes_when_load_is_disabled(tmp_path):
    # LMCache starts at seq 1 in container 0; container 1 (seq 4, stale) then wins on restart.
    dev = make_device(tmp_path)
    stale = okey(1)
    write_slot(dev, META, stale.slot_identity, b"s" * 10)
    write_container(dev, 1, 4, base_state(dev, 1, {stale.encoded: _entry(0, 10)}))
    c = make_core(dev, load_checkpoint_on_init=False)
    assert c.report_status()["metadata_seq"] == 4
    fresh = okey(2)
    c.put_many([fresh], [Obj(b"f" * 10)])
    c.checkpoint_now()
    assert c.report_status()["metadata_seq"] == 5
    c.close()
    c = make_core(dev)
    try:
        assert c.exists_many([fresh.encoded, stale.encoded]) == [True, False]
    finally:
        c.close()


def test_sequence_resumes_when_payload_rejected(tmp_path):
    # The newest checkpoint is rejected (another device path): we still continue after its seq.
    dev = make_device(tmp_path)
    write_container(dev, 1, 6, base_state(dev, 0, {}, device_path="/dev/elsewhere"))
    c = make_core(dev)
    k = okey(3)
    c.put_many([k], [Obj(10)])
    c.close()
    assert newest_state(dev)[:2] == (0, 7)
    c = make_core(dev)
    try:
        assert c.exists_many([k.encoded]) == [True]
    finally:
        c.close()


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
    c.checkpoint_now()
    c._native.close()
    got = {k: (seq, st is not None) for k, seq, st, _ in read_containers(dev)}
    assert got == {0: (5, True), 1: (8, True)}


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
    c = make_core(dev2, meta_enable_periodic=True, meta_checkpoint_interval_sec=1, meta_idle_quiet_ms=60000)
    try:
        c.put_many([okey(1)], [Obj(10)])
        time.sleep(1.5)
        assert c.report_status()["metadata_seq"] == 0  # not idle for 60 s: no periodic checkpoint
        c.checkpoint_now()  # forced
        assert c.report_status()["metadata_seq"] == 1
    finally:
        c.close()
