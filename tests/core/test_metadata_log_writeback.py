"""A failed flush (a lost write-back) meeting the log-structured metadata writer
(docs/metadata-log.md, "Write-back failures"): the trust layer drops the entries whose bytes
the failure may have lost and journals their FREE records, in a page after the one holding
their PUT records. Two groups are not atomic together, so until a whole base says at once what
is durable:

- no group is written (a crash between the PUT group and the FREE group would list a dropped
  key again), neither by a checkpoint nor by a compaction between its slices;
- a compaction whose build saw a flush fail abandons its base (it may list an entry the
  failure dropped after the entry was copied into it);
- the next checkpoint writes a whole base.

Each crash runs in a child process that dies without closing the core; the parent reopens the
device and checks that no dropped key is listed and that no load serves other bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from core_helpers import HEADER, Obj, make_core, make_device, okey, payload
from helpers import TESTS

SIZE = 3000
SLOT_BYTES = 8192
LOG_META = 16 << 20
# interval 1 s: a page a second old is due, so a compaction writes it between its slices;
# no idle checkpoint, no periodic thread: nothing else writes the log meanwhile
CFG = dict(meta_format="log", slot_bytes=SLOT_BYTES, meta_total_bytes=LOG_META, meta_checkpoint_interval_sec=1,
           meta_idle_quiet_ms=600_000, meta_enable_periodic=False)
K = range(50000, 50020)  # the keys a failed flush drops


def _dev(tmp_path, n_keys):
    return make_device(tmp_path, size=2 * LOG_META + (n_keys + 200) * SLOT_BYTES)


def _open(dev):
    return make_core(dev, **CFG)


def _child(dev: str, out: str, body: str) -> dict:
    """body in a child process over a core c on dev; it dumps the dict `res` to out, then dies
    without closing the core."""
    code = textwrap.dedent(f"""
        import json, os, sys, threading, time
        sys.path.insert(0, {str(TESTS)!r})
        from core_helpers import Obj, make_core, okey, payload
        c = make_core({dev!r}, **{CFG!r})
        res = {{}}
        def put(ids):
            assert all(c.put_many([okey(i) for i in ids], [Obj(payload(i, {SIZE})) for i in ids]).results)
    """) + textwrap.dedent(body) + textwrap.dedent(f"""
        with open({out!r}, "w") as f:
            json.dump(res, f)
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    with open(out) as f:
        return json.load(f)


def _own_bytes(core, ids):
    """ids whose load returns their own bytes; any other bytes served fail the test."""
    objs = [Obj(SIZE) for _ in ids]
    got = core.load_many_into([okey(i).encoded for i in ids], objs)
    ok = []
    for i, o, g in zip(ids, objs, got):
        if g:
            assert o.bytes() == payload(i, SIZE), f"key {i} served other bytes"
            ok.append(i)
    return ok


def test_a_compaction_abandons_its_base_when_a_flush_fails_while_it_is_built(tmp_path):
    """The keys K reuse the slots of deleted keys D. The compaction copies K into its base (one
    slice), then writes the due page between slices; that flush fails and drops K. The base
    still lists K: switching to it would make K current after a crash, with D's bytes in its
    slots if K's write-back was what the failure lost."""
    dev = _dev(tmp_path, 2000)
    res = _child(dev, str(tmp_path / "res.json"), """
        put(range(2000))
        c.checkpoint_now()
        D = range(20)
        doff = {i: c.entry_offset(okey(i).encoded) for i in D}
        assert all(c.delete_many([okey(i).encoded for i in D]))
        c.checkpoint_now()
        put(range(50000, 50020))
        koff = {i: c.entry_offset(okey(i).encoded) for i in range(50000, 50020)}
        res["reused"] = {k: d for k, o in koff.items() for d, od in doff.items() if od == o}
        res["koff"] = koff
        time.sleep(1.2)  # K's page is due: the compaction writes it between its slices
        st0 = c._native.status()
        c._native._inject_fault("flush", 1)
        try:
            c._native.compact_metadata()
            res["compact_error"] = None
        except Exception as e:
            res["compact_error"] = str(e)
        st = c._native.status()
        res["dropped"] = st["writeback_dropped_entries"]
        res["compactions"] = st["metadata_log"]["compactions"] - st0["metadata_log"]["compactions"]
        res["last_error"] = st["checkpoint_last_error"]
    """)
    assert res["dropped"] == 20  # the failed flush dropped K (the case under test)
    assert res["reused"], "no key reused a deleted key's slot: the scenario did not arise"
    assert res["compactions"] == 0 and "abandoned" in res["compact_error"], res
    assert "metadata base abandoned" in res["last_error"]
    # the lost write-back: K's slots still hold D's bytes under K's header
    with open(dev, "r+b") as f:
        for k, d in res["reused"].items():
            f.seek(res["koff"][k] + HEADER)
            f.write(payload(int(d), SIZE))
    c = _open(dev)
    st = c._native.status()
    assert st["recovery_outcome"] == "loaded"
    assert c.exists_many([okey(i).encoded for i in K]) == [False] * 20
    assert _own_bytes(c, list(K)) == []
    assert _own_bytes(c, range(20, 2000)) == list(range(20, 2000))
    c.close()


def test_a_compaction_writes_no_group_before_the_whole_base_a_failed_flush_asks_for(tmp_path):
    """A failed checkpoint dropped K (its PUT page unwritten, the FREE records in a later page).
    A compaction then must not write those pages between its slices: the crash here comes right
    after a flush between the two groups failed, and K's PUT group alone would list K again."""
    dev = _dev(tmp_path, 10000)
    res = _child(dev, str(tmp_path / "res.json"), """
        for b in range(0, 10000, 1000):  # three slices of the compaction
            put(range(b, b + 1000))
        c.checkpoint_now()
        put(range(50000, 50020))
        c._native._inject_fault("flush", 1)
        try:
            c.checkpoint_now()
        except Exception:
            pass
        st0 = c._native.status()
        res["dropped"] = st0["writeback_dropped_entries"]
        # each group write waits: a crash right after a failed one lands before the next
        c._native._set_checkpoint_delay_ms(1500)
        c._native._inject_fault("flush", 2)
        t = threading.Thread(target=c._native.compact_metadata, daemon=True)
        t.start()
        while t.is_alive() and c._native.status()["writeback_failures"] < st0["writeback_failures"] + 1:
            time.sleep(0.005)
        st = c._native.status()
        res["groups_written"] = st["metadata_log"]["groups_written"] - st0["metadata_log"]["groups_written"]
    """)
    assert res["dropped"] == 20
    assert res["groups_written"] == 0
    c = _open(dev)
    assert c.exists_many([okey(i).encoded for i in K]) == [False] * 20
    assert _own_bytes(c, list(K)) == []
    assert len(_own_bytes(c, range(0, 10000, 7))) == len(range(0, 10000, 7))
    c.close()


def test_a_failed_flush_makes_the_next_checkpoint_a_whole_base(tmp_path):
    """Whichever flush fails (here the one that makes a compaction's base durable), the
    entries it dropped leave through a whole base, never through groups."""
    dev = _dev(tmp_path, 2000)
    c = _open(dev)
    put = [okey(i) for i in range(2000)]
    assert all(c.put_many(put, [Obj(payload(i, SIZE)) for i in range(2000)]).results)
    c.checkpoint_now()
    assert all(c.put_many([okey(i) for i in K], [Obj(payload(i, SIZE)) for i in K]).results)
    c._native._inject_fault("flush", 1)
    try:
        c._native.compact_metadata()
    except Exception as e:
        assert "flush" in str(e) or "fdatasync" in str(e), e
    st0 = c._native.status()
    assert st0["writeback_dropped_entries"] == 20 and st0["metadata_log"]["compactions"] == 0
    c.checkpoint_now()
    st = c._native.status()
    assert st["metadata_log"]["bases_written"] == st0["metadata_log"]["bases_written"] + 1
    assert st["metadata_log"]["groups_written"] == st0["metadata_log"]["groups_written"]
    c.close()
    c = _open(dev)
    assert c._native.status()["recovery_outcome"] == "loaded"
    assert c.exists_many([okey(i).encoded for i in K]) == [False] * 20
    assert _own_bytes(c, range(2000)) == list(range(2000))
    c.close()


def test_a_checkpoint_writes_no_group_after_a_flush_failed_on_another_thread(tmp_path):
    """Checkpoint A decided it needs no whole base, then waited for the checkpoint lock while
    checkpoint B's flush failed and dropped K. A must not then write K's PUT page and its FREE
    page as groups: the crash here comes right after a flush between them failed."""
    dev = _dev(tmp_path, 2000)
    res = _child(dev, str(tmp_path / "res.json"), """
        put(range(2000))
        c.checkpoint_now()
        put(range(50000, 50020))
        st0 = c._native.status()
        c._native._set_checkpoint_delay_ms(1500)  # each checkpoint waits before its first flush
        c._native._inject_fault("flush", 1)  # B's
        def ckpt():
            try:
                c.checkpoint_now()
            except Exception:
                pass
        b = threading.Thread(target=ckpt, daemon=True)
        b.start()
        time.sleep(0.5)  # B holds the checkpoint lock: A finds no whole base due, and waits for it
        a = threading.Thread(target=ckpt, daemon=True)
        a.start()
        fails = lambda: c._native.status()["writeback_failures"] - st0["writeback_failures"]  # noqa: E731
        while (a.is_alive() or b.is_alive()) and fails() < 1:
            time.sleep(0.005)
        res["dropped"] = c._native.status()["writeback_dropped_entries"]
        c._native._inject_fault("flush", 2)  # A's second flush: after its first group
        while (a.is_alive() or b.is_alive()) and fails() < 2:
            time.sleep(0.005)
    """)
    assert res["dropped"] == 20
    c = _open(dev)
    assert c.exists_many([okey(i).encoded for i in K]) == [False] * 20
    assert _own_bytes(c, list(K)) == []
    assert _own_bytes(c, range(2000)) == list(range(2000))
    c.close()


@pytest.mark.parametrize("failing", ["free-group", "put-group"])
def test_a_failed_synced_group_write_fails_like_a_flush(tmp_path, failing):
    """A log group is made durable by a write synced by itself (RWF_DSYNC); a group of PUT
    records after the flush of the payloads it names. The deletes' FREE records go first, in a
    group of their own that needs no flush. When a synced write fails (the kernel may report
    there a write-back error of any page of the file), the checkpoint fails as on a failed
    flush: the failure is counted, the slots its group would free stay held (those of a FREE
    group written before it are free), the next checkpoint writes a whole base."""
    dev = _dev(tmp_path, 100)
    c = _open(dev)
    assert all(c.put_many([okey(i) for i in range(20)], [Obj(payload(i, SIZE)) for i in range(20)]).results)
    c.checkpoint_now()
    c.delete_many([okey(i).encoded for i in range(10)])
    assert all(c.put_many([okey(i) for i in K], [Obj(payload(i, SIZE)) for i in K]).results)
    st0 = c._native.status()
    # the synced writes and flushes in order: the FREE group, the payloads' flush, the PUT group
    c._native._inject_fault("flush", 1 if failing == "free-group" else 3)
    try:
        c.checkpoint_now()
        raise AssertionError("the checkpoint succeeded")
    except OSError as e:
        assert "RWF_DSYNC" in str(e), e
    st = c._native.status()
    assert st["writeback_failures"] == st0["writeback_failures"] + 1
    lane = st["metadata_log"]["free_lane"]
    assert lane["groups"] == (0 if failing == "free-group" else 1)
    # a failed synced write is a failed flush: the puts since the last flush are dropped too
    # (20 slots) when it is the first; after the payloads' flush they are durable
    assert st["checkpoint_held_slots"] == (30 if failing == "free-group" else 0)
    c.checkpoint_now()
    st = c._native.status()
    assert st["metadata_log"]["bases_written"] == st0["metadata_log"]["bases_written"] + 1
    assert st["checkpoint_held_slots"] == 0
    c.close()
    c = _open(dev)
    assert c.exists_many([okey(i).encoded for i in range(20)]) == [False] * 10 + [True] * 10
    # dropped before any flush of their payloads; else that flush succeeded
    assert c.exists_many([okey(i).encoded for i in K]) == [failing == "put-group"] * 20
    c.close()
