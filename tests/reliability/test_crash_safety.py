"""Crash safety of the core: after a crash, a load returns the key's own bytes or a miss.

Each test builds the state a crash or a damaged medium leaves and checks what recovery and
loads make of it: slot reuse while a checkpoint still lists the slot, payloads that fail their
checksum, a damaged checksum marker, and checkpoint containers that cannot be read.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from core_helpers import (
    CORE_LOGGER, HEADER, META, SLOT, Obj, base_state, make_core, make_device, okey, payload, read_containers,
    write_container, write_slot,
)
from helpers import TESTS

# Reads format v1's containers or relies on its slot-reuse rule.
pytestmark = pytest.mark.v1_layout

ENGINES = [("posix", False), ("io_uring", False), ("posix", True), ("io_uring", True)]
ENGINE_IDS = ["posix", "io_uring", "posix-odirect", "io_uring-odirect"]
N = 5000


def _entry(slot, size):
    return {"offset": META + slot * SLOT, "size": size, "shape": None, "dtype": None, "fmt": None,
            "cached_positions": None}


def _patch(dev: str, off: int, data: bytes) -> None:
    with open(dev, "r+b") as f:
        f.seek(off)
        f.write(data)


def _run_writer(dev: str, body: str, **cfg) -> None:
    """Run body in a child process on a core opened over dev, then end it without closing the
    core (no final checkpoint, nothing flushed by us): what a crash leaves behind."""
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(TESTS)!r})
        from core_helpers import Obj, make_core, okey, payload
        c = make_core({dev!r}, meta_enable_periodic=False, **{cfg!r})
    """) + textwrap.dedent(body) + "\nos._exit(0)\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("checksum", [False, True], ids=["nosum", "sum"])
@pytest.mark.parametrize("engine,odirect", ENGINES, ids=ENGINE_IDS)
def test_torn_put_into_a_checkpointed_slot_never_serves_other_bytes(tmp_path, engine, odirect, checksum):
    # A is checkpointed, then deleted (not durable); B is put and its second data write (the
    # header on io_uring, the payload on posix) fails; the process dies without a checkpoint.
    # Had B taken A's slot, A's header would lie over B's payload on io_uring and recovery would
    # serve B's bytes as A's.
    dev = make_device(tmp_path)
    a, b = okey(1), okey(2)
    _run_writer(dev, f"""
        a, b = okey(1), okey(2)
        assert c.put_many([a], [Obj(payload(1, {N}))]).results == [True]
        c.checkpoint_now()
        c.delete_many([a.encoded])
        c._native._inject_fault("write", 2)
        c.put_many([b], [Obj(payload(2, {N}))])
    """, io_engine=engine, use_odirect=odirect, verify_payload_checksum=checksum)
    c = make_core(dev, io_engine=engine, use_odirect=odirect, verify_payload_checksum=checksum)
    try:
        out = Obj(b"\xee" * N)
        got = c.load_many_into([a.encoded, b.encoded], [out, Obj(N)])
        assert got[1] is False  # B was never checkpointed
        # The delete was not durable: A may come back, but only with its own bytes.
        assert got[0] is True and out.bytes() == payload(1, N)
    finally:
        c.close()


@pytest.mark.parametrize("engine,odirect", ENGINES, ids=ENGINE_IDS)
def test_payload_checksum_failure_drops_the_entry(tmp_path, engine, odirect):
    dev = make_device(tmp_path)
    a, b = okey(1), okey(2)
    c = make_core(dev, io_engine=engine, use_odirect=odirect, verify_payload_checksum=True)
    try:
        c.put_many([a, b], [Obj(payload(1, N)), Obj(payload(2, N))])
        c.checkpoint_now()
        off = c.entry_offset(a.encoded)
        foreign = payload(9, N)
        _patch(dev, off + HEADER, foreign)  # another key's bytes under A's header
        out = Obj(b"\xee" * N)
        assert c.load_many_into([a.encoded], [out]) == [False]
        assert foreign[:64] not in out.bytes() and out.bytes()[:N] == bytes(N)
        st = c.report_status()
        assert st["payload_checksum_failures"] == 1 and st["payload_checksum_dropped_entries"] == 1
        assert c.exists_many([a.encoded, b.encoded]) == [False, True]
        assert st["metadata_dirty_total"] > st["metadata_persisted"]
        assert c.load_many_into([a.encoded], [Obj(N)]) == [False]
        assert c.report_status()["payload_checksum_failures"] == 1  # not read again
        c.checkpoint_now()
    finally:
        c.close()
    c = make_core(dev, io_engine=engine, use_odirect=odirect, verify_payload_checksum=True)
    try:
        assert c.exists_many([a.encoded, b.encoded]) == [False, True]  # the drop is durable
    finally:
        c.close()


@pytest.mark.parametrize("verify_on_load", [True, False], ids=["verify", "deferred"])
@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_one_flipped_bit_in_the_checksum_marker_does_not_turn_the_check_off(tmp_path, engine, verify_on_load):
    dev = make_device(tmp_path)
    a, b = okey(1), okey(2)
    c = make_core(dev, io_engine=engine, verify_payload_checksum=True)
    c.put_many([a, b], [Obj(payload(1, N)), Obj(payload(2, N))])
    off = c.entry_offset(a.encoded)
    c.close()
    state = [s for _, _, s, _ in read_containers(dev) if s][0]
    assert "xxh3" in state["entries"][a.encoded]  # the checkpoint records the checksum
    with open(dev, "rb") as f:
        f.seek(off + 24)
        marker = f.read(8)
    assert marker == b"RBXXH3v1"
    _patch(dev, off + 24, bytes([marker[0] ^ 0x01]))  # one bit of the marker
    _patch(dev, off + HEADER, payload(9, N))          # and a payload that is not A's
    c = make_core(dev, io_engine=engine, verify_payload_checksum=True, meta_verify_on_load=verify_on_load)
    try:
        out = Obj(b"\xee" * N)
        assert c.load_many_into([a.encoded], [out]) == [False]
        assert payload(9, N)[:64] not in out.bytes()
        assert c.exists_many([a.encoded, b.encoded]) == [False, True]
        st = c.report_status()
        assert st["recovery_dropped_entries"] == 1
        outb = Obj(N)
        assert c.load_many_into([b.encoded], [outb]) == [True] and outb.bytes() == payload(2, N)
    finally:
        c.close()


def test_checkpoint_without_checksums_is_read_as_before(tmp_path):
    # LMCache's checkpoints carry no checksum field; a header with our marker still counts.
    dev = make_device(tmp_path)
    a = okey(1)
    write_slot(dev, META, a.slot_identity, payload(1, 100))
    write_container(dev, 0, 1, base_state(dev, 1, {a.encoded: _entry(0, 100)}))
    c = make_core(dev, verify_payload_checksum=True)
    try:
        out = Obj(100)
        assert c.load_many_into([a.encoded], [out]) == [True] and out.bytes() == payload(1, 100)
    finally:
        c.close()


@pytest.mark.parametrize("bad", ["not-hex-at-all!!", "0123456789ABCDEF", "123", 5])
def test_unreadable_checksum_field_skips_the_entry(tmp_path, bad):
    dev = make_device(tmp_path)
    a, b = okey(1), okey(2)
    write_slot(dev, META, a.slot_identity, payload(1, 100))
    write_slot(dev, META + SLOT, b.slot_identity, payload(2, 100))
    ea = dict(_entry(0, 100), xxh3=bad)
    write_container(dev, 0, 1, base_state(dev, 2, {a.encoded: ea, b.encoded: _entry(1, 100)}))
    c = make_core(dev)
    try:
        assert c.exists_many([a.encoded, b.encoded]) == [False, True]
    finally:
        c.close()


def _two_checkpoints(dev):
    a, b = okey(1), okey(2)
    write_slot(dev, META, a.slot_identity, payload(1, 100))
    write_slot(dev, META + SLOT, b.slot_identity, payload(2, 100))
    write_container(dev, 0, 3, base_state(dev, 1, {a.encoded: _entry(0, 100)}))
    write_container(dev, 1, 4, base_state(dev, 2, {a.encoded: _entry(0, 100), b.encoded: _entry(1, 100)}))
    return a, b


def test_fallback_to_the_older_checkpoint_is_a_warning_with_what_was_lost(tmp_path, caplog):
    dev = make_device(tmp_path)
    a, b = _two_checkpoints(dev)
    _patch(dev, (1 * (META // 2)) + 4096 + 40, b"#")  # one byte of the newer payload
    caplog.set_level(logging.INFO, logger=CORE_LOGGER)
    c = make_core(dev)
    try:
        assert c.exists_many([a.encoded, b.encoded]) == [True, False]
        st = c.report_status()
        assert st["recovery_outcome"] == "fallback"
        assert (st["recovery_seq"], st["recovery_rejected_seq"], st["recovery_lost_entries"]) == (3, 4, 1)
        err = st["checkpoint_last_error"]
        assert "container 1, seq 4" in err and "container 0, seq 3" in err and "1 entries" in err
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert any("seq 4" in r.getMessage() for r in warnings)
    finally:
        c.close()


def test_lost_index_is_an_error_and_differs_from_a_blank_device(tmp_path, caplog):
    dev = make_device(tmp_path)
    a, b = _two_checkpoints(dev)
    _patch(dev, 4096 + 40, b"#")
    _patch(dev, (META // 2) + 4096 + 40, b"#")
    caplog.set_level(logging.INFO, logger=CORE_LOGGER)
    c = make_core(dev)
    try:
        assert c.exists_many([a.encoded, b.encoded]) == [False, False]
        st = c.report_status()
        assert st["recovery_outcome"] == "unreadable" and st["recovery_rejected_seq"] == 4
        assert "none is readable" in st["checkpoint_last_error"]
        assert any(r.levelno == logging.ERROR for r in caplog.records)
        # Both containers may list any slot: the first put replaces both before taking one.
        assert c.put_many([okey(3)], [Obj(10)]).results == [True]
        assert c.report_status()["checkpoints_for_room"] == 2
    finally:
        c.close()
    caplog.clear()
    blank = make_device(tmp_path, name="blank.img")
    c = make_core(blank)
    try:
        st = c.report_status()
        assert st["recovery_outcome"] == "blank" and st["checkpoint_last_error"] is None
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert c.put_many([okey(3)], [Obj(10)]).results == [True]
        assert c.report_status()["checkpoints_for_room"] == 0
    finally:
        c.close()


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_checkpoint_flushes_before_and_after_each_container_write(tmp_path, engine):
    dev = make_device(tmp_path)
    c = make_core(dev, io_engine=engine)
    try:
        c.put_many([okey(1)], [Obj(10)])
        before = c.report_status()["device_flushes"]
        c.checkpoint_now()
        assert c.report_status()["device_flushes"] - before == 3
    finally:
        c.close()


def test_full_device_reuses_freed_slots_through_a_checkpoint(tmp_path):
    # Every slot in use and listed by the checkpoint: deleting and putting again must still
    # work, the core writing checkpoints that release the freed slots.
    dev = make_device(tmp_path, size=META + 4 * SLOT)
    c = make_core(dev)
    try:
        keys = [okey(i) for i in range(4)]
        assert c.put_many(keys, [Obj(payload(i, 100)) for i in range(4)]).results == [True] * 4
        c.checkpoint_now()
        c.delete_many([keys[0].encoded, keys[1].encoded])
        st = c.report_status()
        assert st["free_slot_count"] == 0 and st["checkpoint_held_slots"] == 2
        new = [okey(10), okey(11)]
        assert c.put_many(new, [Obj(payload(10, 100)), Obj(payload(11, 100))]).results == [True, True]
        assert c.report_status()["checkpoints_for_room"] == 2
        outs = [Obj(100), Obj(100)]
        assert c.load_many_into([k.encoded for k in new], outs) == [True, True]
        assert [o.bytes() for o in outs] == [payload(10, 100), payload(11, 100)]
    finally:
        c.close()


def test_state_applied_at_run_time_never_hands_out_a_listed_slot(tmp_path):
    # A state applied at run time may set next_slot below slots the checkpoint on the device
    # lists; allocation must still skip them.
    dev = make_device(tmp_path)
    c = make_core(dev)
    try:
        keys = [okey(i) for i in range(3)]
        c.put_many(keys, [Obj(payload(i, 100)) for i in range(3)])
        c.checkpoint_now()  # lists slots 0..2
        assert c.apply_loaded_state(base_state(dev, 0, {})) is True
        new = okey(9)
        assert c.put_many([new], [Obj(payload(9, 100))]).results == [True]
        assert c.entry_offset(new.encoded) == META + 3 * SLOT
        assert c.report_status()["checkpoint_held_slots"] == 3
    finally:
        c.close()
