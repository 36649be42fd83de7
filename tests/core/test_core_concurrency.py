"""Regression tests from a focused review of the io_uring binding and the core.

Each test runs its scenario in a child interpreter with a timeout where the bug shows as
a hang (an infinite loop with the GIL held cannot be interrupted from the test process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers import TESTS

pytest.importorskip("numpy")


def run_child(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(os.environ),
        )
    except subprocess.TimeoutExpired as e:  # pragma: no cover - the failure mode
        pytest.fail(f"child hung: stdout={e.stdout!r} stderr={e.stderr!r}")


def test_batch_table_survives_many_threads_queueing_at_once(tmp_path):
    """queue_batch reserved one table slot, released the GIL for prepare/submit and only then
    inserted: many threads inside that window all passed the same reservation, so the
    open-addressing table (load factor <= 1/2 assumed) filled up completely and the next
    insert or lookup of a missing id spun forever with the GIL held."""
    path = tmp_path / "dev.bin"
    with open(path, "wb") as f:
        f.truncate(32 << 20)
    code = f"""
        import threading, sys
        from lmcache_rawblock import RawBlockDevice
        dev = RawBlockDevice({str(path)!r}, True, io_engine="io_uring", iouring_queue_depth=8)
        NT = 24
        TOTAL = 32 << 20
        barrier = threading.Barrier(NT)
        ids = []
        lock = threading.Lock()
        def worker():
            buf = bytearray(1)  # shorter than total_len: the whole request is bounced (slow prepare)
            barrier.wait()
            bid = dev.batched_write([0], [buf], [TOTAL], None, [1])
            with lock:
                ids.append(bid)
        ts = [threading.Thread(target=worker) for _ in range(NT)]
        for t in ts: t.start()
        for t in ts: t.join()
        assert dev.wait_iouring(10**12) == ([], [])  # unknown id: a miss, not a hang
        for bid in ids:
            ok, errs = dev.wait_iouring(bid)
            assert ok == [True] and errs == [], (ok, errs)
        assert len(set(ids)) == NT
        dev.close()
        print("ok")
    """
    for _ in range(2):
        r = run_child(code, timeout=30)
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("method", ["batched_write", "batched_read"])
def test_close_from_index_callback_does_not_deadlock(tmp_path, method):
    """batched_write/batched_read took the device user reference (rb_dev_enter) before
    converting offsets/total_lens with __index__. Python code run there that closes the
    device (directly or from a finaliser) waited in rb_dev_close for its own thread's
    reference to go away: a self-deadlock. Now the reference is taken after every number is
    converted; the call reports the closed device instead."""
    path = tmp_path / "dev.bin"
    with open(path, "wb") as f:
        f.truncate(1 << 20)
    code = f"""
        from lmcache_rawblock import RawBlockDevice
        dev = RawBlockDevice({str(path)!r}, True, io_engine="io_uring", iouring_queue_depth=8)
        class Evil:
            def __index__(self):
                dev.close()
                return 0
        try:
            dev.{method}([Evil()], [bytearray(4096)], [4096])
        except RuntimeError as e:
            print(e)
        else:
            print("no error")
        assert dev.closed
    """
    r = run_child(code, timeout=20)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "device is closed"


def test_state_applied_during_put_keeps_the_inflight_slot_reserved(tmp_path):
    """apply_state_json reset the slot allocator to the state's next_slot and kept in-flight
    reservations only below it. A put in flight on slot >= that next_slot still committed its
    key there, and the allocator handed the same slot to the next put: two keys shared one
    slot (the second overwrote the first's payload). Now the allocator's next_slot moves past
    every in-flight slot."""
    import json
    import threading

    from core_helpers import HEADER, META, MiB, Obj, base_state, make_core, make_device, okey

    slot = 64 * MiB  # a large payload keeps the put in flight long enough to be seen
    cap = META + 4 * slot
    path = make_device(tmp_path, size=cap)
    doc = json.dumps(base_state(path, 0, {}, slot_bytes=slot, capacity_bytes=cap)).encode()
    a, b = okey(1), okey(2)
    for _ in range(20):
        c = make_core(path, slot_bytes=slot, meta_verify_on_load=False)
        try:
            res = {}
            t = threading.Thread(  # joined below, in this iteration: the loop's res and c it sees are current
                target=lambda: res.setdefault("a", c.put_many([a], [Obj(slot - HEADER)]).results))  # noqa: B023
            t.start()
            seen = False
            while t.is_alive() and not seen:
                seen = c._native.exists_inflight(a.encoded)
            applied = c._native.apply_state_json(doc) if seen else None
            t.join()
            if not seen:
                continue  # the put finished before the poll saw it: try again
            assert applied == (True, "")
            assert res["a"] == [True]
            assert c.put_many([b], [Obj(10)]).results == [True]
            assert c.entry_offset(a.encoded) != c.entry_offset(b.encoded)
            return
        finally:
            c.close()
    pytest.skip("never caught the put in flight")


def test_put_many_metas_list_mutated_during_put(tmp_path):
    """put_many kept the dtype/fmt strings borrowed from the caller's metas *list* (PySequence_Fast
    returns the list itself) while the core ran without the GIL. Another thread replacing a
    list item freed the tuple and its strings; the core then interned freed memory as the
    key's dtype (heap-use-after-free under ASan; garbage metadata otherwise). Now a list is
    copied to a tuple, which keeps every item alive for the call."""
    code = """
        import sys, threading, pathlib
        sys.path.insert(0, %r)
        from core_helpers import HEADER, META, MiB, make_core, make_device, okey
        d = pathlib.Path(%r)
        SL = 64 * MiB
        path = make_device(d, size=META + 4 * SL)
        c = make_core(path, slot_bytes=SL)
        n = c._native
        k0, k1 = okey(1).encoded, okey(2).encoded
        big = bytearray(SL - HEADER)
        dt = "".join(chr(97 + (i %% 26)) for i in range(4000))  # malloc-backed, owned by the tuple only
        metas = [("uint8", "BINARY", None, None), (dt, "BINARY", None, None)]
        del dt
        def put():
            n.put_many([k0, k1], [1, 2], [big, bytearray(10)], [None, None], metas)
        t = threading.Thread(target=put)
        t.start()
        seen = False
        while t.is_alive() and not seen:
            seen = n.exists_inflight(k0)
        metas[1] = None  # the second key is reserved (and its dtype read) after the first's write
        junk = ["Z" * (3999 + (i > -1)) for i in range(50)]
        t.join()
        (_, _, _, dtype) = n.get_metadata_many([k1])[0][:4]
        print("seen" if seen else "missed", dtype == "".join(chr(97 + (i %% 26)) for i in range(4000)))
        c.close()
    """ % (str(TESTS), str(tmp_path))
    for _ in range(5):
        r = run_child(code, timeout=60)
        assert r.returncode == 0, r.stderr[-3000:]
        if r.stdout.split()[0] == "seen":
            assert r.stdout.split()[1] == "True", r.stdout
            return
    pytest.skip("never caught the put in flight")


def test_revalidation_does_not_stamp_an_old_checksum_on_a_reput_key(tmp_path):
    """validate_entries (recovery validation after apply_state, the _revalidate hook) reads
    slot headers without the lock and then applied each verdict to the key's record if it
    still had the same slot. A key deleted and put again meanwhile gets the same slot back
    (LIFO reuse), so the old header's checksum was stamped on the new record and the new,
    valid payload failed every load with "payload checksum mismatch". Now a record whose
    size, checksum or verification flags changed since the snapshot is left alone. Since the
    slot quarantine, a slot freed while a reader is in flight is not handed out again until the
    reader ends, so the re-put key now lands elsewhere while the revalidation runs."""
    import threading

    from core_helpers import META, Obj, make_core, make_device, okey

    path = make_device(tmp_path, size=META + 30000 * 8192)
    c = make_core(path, slot_bytes=8192, verify_payload_checksum=True)
    try:
        n = c._native
        k = okey(0)
        c.put_many([k], [Obj(b"A" * 100)])
        others = [okey(i) for i in range(1, 20000)]  # the sequential reader reads k's header first
        c.put_many(others, [Obj(b"x" * 10) for _ in others])
        off = c.entry_offset(k.encoded)
        for _ in range(5):
            th = threading.Thread(target=lambda: n._revalidate(True))
            th.start()
            while n.status()["inflight_io_count"] == 0 and th.is_alive():
                pass
            c.delete_many([k.encoded])
            c.put_many([k], [Obj(b"B" * 100)])
            raced = th.is_alive()
            new_off = c.entry_offset(k.encoded)
            th.join()
            if raced:
                assert new_off != off, "a slot freed during the revalidation was reused at once"
            out = Obj(100)
            assert c.load_many_into([k.encoded], [out]) == [True]
            assert out.bytes() == b"B" * 100
            if raced:
                return
            c.delete_many([k.encoded])
            c.put_many([k], [Obj(b"A" * 100)])
        pytest.skip("revalidation finished before the re-put")
    finally:
        c.close()


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
@pytest.mark.v1_layout
def test_load_never_returns_the_bytes_of_a_key_put_into_its_slot_meanwhile(tmp_path, engine):
    """A load snapshots a key's slot under the core lock and reads it after dropping it. A
    forced delete of that key plus a put of another key in between used to hand the same slot
    (LIFO reuse) to the new key, and the load returned the new key's bytes as the old key's
    (with ok=True). Freed slots now wait in quarantine until the readers in flight end."""
    import threading

    from core_helpers import META, Obj, make_core, make_device, okey

    c = make_core(make_device(tmp_path, size=META + 64 * 8192), slot_bytes=8192, io_engine=engine)
    try:
        k, k2, k3 = okey(0), okey(1), okey(2)
        c.put_many([k], [Obj(b"A" * 100)])
        off = c.entry_offset(k.encoded)
        c._native._set_load_delay_ms(300)
        out, res = Obj(100), {}
        th = threading.Thread(target=lambda: res.update(r=c.load_many_into([k.encoded], [out])))
        th.start()
        while c._native.status()["inflight_io_count"] == 0 and th.is_alive():
            pass
        assert th.is_alive(), "the load ended before the delete"
        assert c.delete_many([k.encoded], force=True) == [True]
        assert c.put_many([k2], [Obj(b"B" * 100)]).results == [True]
        assert c.entry_offset(k2.encoded) != off, "the slot of a key being read was reused"
        th.join()
        c._native._set_load_delay_ms(0)
        if res["r"] == [True]:
            assert out.bytes() == b"A" * 100
        # once the load has ended the slot is free again (LIFO: the next put takes it)
        assert c.put_many([k3], [Obj(b"C" * 100)]).results == [True]
        assert c.entry_offset(k3.encoded) == off
        back = Obj(100)
        assert c.load_many_into([k2.encoded], [back]) == [True] and back.bytes() == b"B" * 100
    finally:
        c.close()


@pytest.mark.v1_layout
def test_quarantine_generations_release_slots_while_readers_overlap(tmp_path):
    """Readers that keep overlapping (never zero in flight) must not keep freed slots out of use
    for ever: a slot freed while reader 1 runs comes back once reader 1 has ended, even though
    reader 2 (started later) is still running."""
    import threading

    from core_helpers import META, Obj, make_core, make_device, okey

    c = make_core(make_device(tmp_path, size=META + 64 * 8192), slot_bytes=8192)
    try:
        keys = [okey(i) for i in range(4)]
        c.put_many(keys, [Obj(bytes([65 + i]) * 64) for i in range(4)])
        offs = {k.encoded: c.entry_offset(k.encoded) for k in keys}

        def load(k, out):
            out.append(c.load_many_into([k.encoded], [Obj(64)]))

        def inflight():
            return c._native.status()["inflight_io_count"]

        r1 = []
        c._native._set_load_delay_ms(400)
        t1 = threading.Thread(target=load, args=(keys[0], r1))
        t1.start()
        while inflight() == 0:
            pass
        assert c.delete_many([keys[1].encoded], force=True) == [True]  # freed during reader 1
        c._native._set_load_delay_ms(1500)
        r2 = []
        t2 = threading.Thread(target=load, args=(keys[2], r2))
        t2.start()
        while inflight() < 2:
            pass
        t1.join()
        assert t2.is_alive()
        # reader 1 is done; reader 2 began after the free, so it cannot hold keys[1]'s slot
        new = okey(10)
        assert c.put_many([new], [Obj(b"N" * 64)]).results == [True]
        assert c.entry_offset(new.encoded) == offs[keys[1].encoded]
        t2.join()
        c._native._set_load_delay_ms(0)
        assert r1 == [[True]] and r2 == [[True]]
    finally:
        c.close()
