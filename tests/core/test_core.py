"""RawBlockCore over the posix path on sparse files: put/load/exists/delete, locks,
metadata, slot allocation and affinity, fault rollback, checkpoint + recovery, close."""

import threading

import pytest

from core_helpers import (
    CORE_LOGGER, DEV_SIZE, HEADER, META, SLOT, Obj, base_state, make_core, make_device, newest_state, okey, payload,
    read_containers,
)


@pytest.fixture
def dev(tmp_path):
    return make_device(tmp_path)


@pytest.fixture
def core(dev):
    c = make_core(dev)
    yield c
    c.close()


def test_geometry_and_status(core):
    st = core.report_status()
    assert st["max_slots"] == 2032 and st["next_slot"] == 0 and st["free_slot_count"] == 0
    assert st["usable_capacity_bytes"] == 2032 * SLOT
    assert core.metadata_container_offsets() == [0, 524288]
    assert core.data_base_offset() == META
    assert st["type"] == "RawBlockCore" and st["key_namespace"] == "object" and st["is_healthy"]
    assert core.usage() == (0.0, 0.0)


def test_store_load_and_exists(core):
    keys = [okey(i) for i in range(3)]
    objs = [Obj(payload(i, (i + 1) * 1024)) for i in range(3)]
    res = core.put_many(keys, objs)
    assert res.results == [True] * 3
    assert res.stored_keys == [k.encoded for k in keys]
    assert core.exists_many([k.encoded for k in keys]) == [True] * 3
    assert core.contains_key(keys[0].encoded)
    outs = [Obj((i + 1) * 1024) for i in range(3)]
    assert core.load_many_into([k.encoded for k in keys], outs) == [True] * 3
    assert [o.bytes() for o in outs] == [o.bytes() for o in objs]
    assert core.indexed_key_count() == 3
    assert core.first_encoded_key() == keys[0].encoded
    assert core.snapshot_indexed_keys() == [k.encoded for k in keys]
    assert core.usage()[0] == pytest.approx(3 / 2032)


def test_duplicate_put_keeps_original_payload(core):
    k = okey(1)
    assert core.put_many([k], [Obj(b"a" * 100)]).stored_keys == [k.encoded]
    r = core.put_many([k], [Obj(b"b" * 100)])
    assert r.results == [True] and r.stored_keys == []
    out = Obj(100)
    assert core.load_many_into([k.encoded], [out]) == [True]
    assert out.bytes() == b"a" * 100


def test_duplicate_keys_in_one_batch(core):
    k = okey(5)
    r = core.put_many([k, k], [Obj(b"x" * 10), Obj(b"y" * 10)])
    assert r.results == [True, True] and r.stored_keys == [k.encoded]
    out = Obj(10)
    core.load_many_into([k.encoded], [out])
    assert out.bytes() == b"x" * 10


@pytest.mark.v1_layout
def test_delete_and_missing_load(core):
    a, b = okey(1), okey(2)
    core.put_many([a], [Obj(b"z" * 64)])
    assert core.delete_many([a.encoded, b.encoded]) == [True, False]
    assert core.exists_many([a.encoded, b.encoded]) == [False, False]
    assert core.load_many_into([a.encoded], [Obj(64)]) == [False]
    st = core.report_status()
    assert st["free_slot_count"] == 1 and st["next_slot"] == 1


def test_locks_block_delete_unless_forced(core):
    a = okey(1)
    core.put_many([a], [Obj(b"q" * 32)])
    assert core.exists_many([a.encoded, okey(9).encoded], lock=True) == [True, False]
    assert core.contains_key(a.encoded, lock=True)
    assert core.lock_refcount(a.encoded) == 2
    assert core.lock_refcount(okey(9).encoded) == 0
    assert core.report_status()["locked_key_count"] == 1
    assert core.delete_many([a.encoded]) == [False]
    core.unlock_many([a.encoded, okey(9).encoded])
    assert core.lock_refcount(a.encoded) == 1
    assert core.delete_many([a.encoded], force=True) == [True]
    assert core.lock_refcount(a.encoded) == 0
    assert core.report_status()["locked_key_count"] == 0
    core.unlock_many([a.encoded])  # unknown key: no-op, never negative
    assert core.lock_refcount(a.encoded) == 0


def test_metadata_many_and_prefix(core):
    keys = [okey(i) for i in range(4)]
    objs = [Obj(payload(i, 200), shape=(2, 100)) for i in range(4)]
    objs[1].metadata.cached_positions = [0, 1, 2]
    core.put_many(keys[:3], objs[:3])
    metas = core.get_metadata_many([k.encoded for k in keys])
    assert metas[3] is None
    m = metas[1]
    assert m.size == 200 and tuple(m.shape) == (2, 100) and m.dtype == "uint8"
    assert m.fmt.name == "BINARY" and list(m.cached_positions) == [0, 1, 2] and m.pin_count == 0
    assert m.path == f"{core.device_path}@{META + SLOT}"
    enc = [k.encoded for k in keys]
    pre = core.get_metadata_prefix([enc[0], enc[1], enc[3], enc[2]], lock=True, skip_locked={enc[1]})
    assert len(pre) == 2
    assert core.lock_refcount(enc[0]) == 1 and core.lock_refcount(enc[1]) == 0
    assert core.lock_refcount(enc[2]) == 0
    out = Obj(200)
    out.metadata.cached_positions = None
    assert core.load_many_into([enc[1]], [out]) == [True]
    assert list(out.metadata.cached_positions) == [0, 1, 2]


def test_put_many_validation(core):
    with pytest.raises(ValueError, match="keys and objs must be non-empty"):
        core.put_many([], [])
    with pytest.raises(ValueError):
        core.put_many([okey(1)], [Obj(1), Obj(1)])
    with pytest.raises(ValueError, match="must not contain placement identifier 0"):
        core.put_many([okey(1)], [Obj(1)], placement_ids=[0])
    assert core.report_status()["rust_io"]["write_attempts"] == 0
    with pytest.raises(ValueError):
        core.load_many_into([], [])


def test_posix_put_many_uses_sequential_pwrite(core):
    keys = [okey(i) for i in range(3)]
    before = core.report_status()["rust_io"]["write_attempts"]
    core.put_many(keys, [Obj(payload(i, 5000)) for i in range(3)])
    assert core.report_status()["rust_io"]["write_attempts"] - before == 6
    outs = [Obj(5000) for _ in range(3)]
    assert core.load_many_into([k.encoded for k in keys], outs) == [True] * 3
    assert outs[2].bytes() == payload(2, 5000)


def test_oversize_key_isolated(core):
    keys = [okey(i) for i in range(3)]
    objs = [Obj(100), Obj(SLOT - HEADER + 1), Obj(SLOT - HEADER)]
    r = core.put_many(keys, objs)
    assert r.results == [True, False, True]
    assert core.report_status()["next_slot"] == 2


def test_partial_slot_exhaustion(tmp_path):
    dev = make_device(tmp_path, size=META + 3 * SLOT + 100)
    c = make_core(dev)
    try:
        r = c.put_many([okey(i) for i in range(5)], [Obj(10) for _ in range(5)])
        assert r.results == [True, True, True, False, False]
        st = c.report_status()
        assert st["max_slots"] == 3 and st["free_slot_count"] + st["max_slots"] - st["next_slot"] == 0
    finally:
        c.close()


def test_write_failure_rolls_back_only_that_key(core):
    core._native._inject_fault("write", 3)  # 3rd data write = header of the 2nd key
    keys = [okey(i) for i in range(3)]
    r = core.put_many(keys, [Obj(payload(i, 100)) for i in range(3)])
    assert r.results == [True, False, True]
    assert r.stored_keys == [keys[0].encoded, keys[2].encoded]
    st = core.report_status()
    # the failed key's slot (1) went back to the free list and the next key reused it
    assert st["inflight_key_count"] == 0 and st["free_slot_count"] == 0 and st["next_slot"] == 2
    assert core.entry_offset(keys[2].encoded) == META + SLOT
    out = Obj(100)
    assert core.load_many_into([keys[2].encoded], [out]) == [True] and out.bytes() == payload(2, 100)


def test_read_failure_is_a_miss(core):
    k = okey(1)
    core.put_many([k], [Obj(b"r" * 10)])
    core._native._inject_fault("read", 1)
    assert core.load_many_into([k.encoded], [Obj(10)]) == [False]
    assert core.load_many_into([k.encoded], [Obj(10)]) == [True]


def test_short_destination_is_a_miss(core):
    k = okey(1)
    core.put_many([k], [Obj(b"r" * 100)])
    assert core.load_many_into([k.encoded], [Obj(50)]) == [False]


@pytest.mark.v1_layout
def test_lifo_reuse_without_affinity(core):
    keys = [okey(i) for i in range(4)]
    core.put_many(keys, [Obj(10) for _ in keys])
    core.delete_many([keys[0].encoded])
    core.delete_many([keys[2].encoded])
    core.put_many([okey(10)], [Obj(10)])
    assert core.entry_offset(okey(10).encoded) == META + 2 * SLOT


@pytest.mark.v1_layout
def test_affinity_reuses_matching_pid(dev):
    c = make_core(dev, fdp_slot_affinity_enabled=True)
    try:
        a, b, x = okey(1), okey(2), okey(3)
        c.put_many([a, b], [Obj(10), Obj(10)], placement_ids=[1, 7])
        off_a = c.entry_offset(a.encoded)
        c.delete_many([a.encoded, b.encoded])
        c.put_many([x], [Obj(10)], placement_ids=[1])
        assert c.entry_offset(x.encoded) == off_a
        st = c.report_status()
        assert (st["fdp_slot_affinity_hit_count"], st["fdp_slot_affinity_fallback_count"]) == (1, 0)
    finally:
        c.close()


@pytest.mark.v1_layout
def test_affinity_fallback_rebinds_and_none_clears(dev):
    c = make_core(dev, fdp_slot_affinity_enabled=True)
    try:
        a, b = okey(1), okey(2)
        c.put_many([a, b], [Obj(10), Obj(10)], placement_ids=[1, 7])
        off_b = c.entry_offset(b.encoded)
        c.delete_many([a.encoded, b.encoded])
        k9 = okey(9)
        c.put_many([k9], [Obj(10)], placement_ids=[9])  # no pool for 9: most recently freed
        assert c.entry_offset(k9.encoded) == off_b
        assert c.report_status()["fdp_slot_affinity_fallback_count"] == 1
        c.delete_many([k9.encoded])
        k9b = okey(19)
        c.put_many([k9b], [Obj(10)], placement_ids=[9])
        assert c.entry_offset(k9b.encoded) == off_b
        assert c.report_status()["fdp_slot_affinity_hit_count"] == 1
        # a pid-less allocation clears the slot's pid
        c.delete_many([k9b.encoded])
        kn = okey(20)
        c.put_many([kn], [Obj(10)])
        assert c.entry_offset(kn.encoded) == off_b
        c.delete_many([kn.encoded])
        k9c = okey(21)
        c.put_many([k9c], [Obj(10)], placement_ids=[9])
        assert c.report_status()["fdp_slot_affinity_hit_count"] == 1  # no pool entry for 9 any more
    finally:
        c.close()


def test_affinity_not_restored_from_checkpoint(dev):
    c = make_core(dev, fdp_slot_affinity_enabled=True)
    a, b = okey(1), okey(2)
    c.put_many([a, b], [Obj(10), Obj(10)], placement_ids=[7, 7])
    c.delete_many([a.encoded])
    c.close()
    c = make_core(dev, fdp_slot_affinity_enabled=True)
    try:
        c.put_many([okey(3)], [Obj(10)], placement_ids=[7])
        st = c.report_status()
        assert (st["fdp_slot_affinity_hit_count"], st["fdp_slot_affinity_fallback_count"]) == (0, 1)
    finally:
        c.close()


def test_recovers_checkpoint_after_close(dev):
    c = make_core(dev)
    keys = [okey(i) for i in range(5)]
    c.put_many(keys, [Obj(payload(i, 3000)) for i in range(5)])
    c.delete_many([keys[1].encoded])
    out = c.close()
    assert out.final_checkpoint_written and out.may_release_backing_resources
    c2 = make_core(dev)
    try:
        assert c2.exists_many([k.encoded for k in keys]) == [True, False, True, True, True]
        o = Obj(3000)
        assert c2.load_many_into([keys[3].encoded], [o]) == [True]
        assert o.bytes() == payload(3, 3000)
        st = c2.report_status()
        assert st["next_slot"] == 5 and st["free_slot_count"] == 1 and st["metadata_seq"] == 1
        assert st["metadata_dirty_total"] == 0
    finally:
        c2.close()


@pytest.mark.v1_layout
def test_checkpoint_now_noop_when_clean(core, dev):
    core.checkpoint_now()
    assert core.report_status()["metadata_seq"] == 0
    core.put_many([okey(1)], [Obj(10)])
    core.checkpoint_now()
    core.checkpoint_now()
    st = core.report_status()
    assert st["metadata_seq"] == 1 and st["metadata_persisted"] == st["metadata_dirty_total"]


def test_load_checkpoint_on_init_false_starts_empty(dev):
    c = make_core(dev)
    c.put_many([okey(1)], [Obj(10)])
    c.close()
    c = make_core(dev, load_checkpoint_on_init=False)
    try:
        assert c.indexed_key_count() == 0
    finally:
        c.close()


def test_rejects_checkpoint_layout_mismatch(core, dev):
    for field in ("block_align", "header_bytes"):
        assert core.apply_loaded_state(base_state(dev, 0, {}, **{field: 8192})) is False
    assert core.apply_loaded_state(base_state(dev, 0, {}, slot_bytes=SLOT * 2)) is False
    assert core.apply_loaded_state(base_state(dev, 0, {}, meta_magic="LMCIDX02")) is False
    assert core.apply_loaded_state(base_state(dev, 0, {}, meta_version=2)) is False
    assert core.apply_loaded_state(base_state(dev, 0, {}, device_path="/other")) is False
    assert core.apply_loaded_state(base_state(dev, 0, {}, version=2)) is False
    assert core.apply_loaded_state(base_state(dev, 5000, {})) is False
    assert core.apply_loaded_state([1, 2]) is False
    # missing fields count as equal; capacity/data_base are not compared
    st = base_state(dev, 0, {}, capacity_bytes=1, data_base_offset=7)
    del st["block_align"]
    assert core.apply_loaded_state(st) is True


def test_apply_skips_bad_entries(core, dev):
    entries = {"a": {"offset": META - SLOT, "size": 10}, "b": {"offset": META + 1, "size": 10},
               "c": {"offset": META, "size": SLOT}, "d": "not-a-dict"}
    assert core.apply_loaded_state(base_state(dev, 1, entries)) is True
    assert core.indexed_key_count() == 0
    assert core.report_status()["free_slot_count"] == 1


def test_rebuilds_missing_free_slots_from_checkpoint(tmp_path):
    dev = make_device(tmp_path)
    k = okey(1)
    c = make_core(dev, meta_verify_on_load=False)
    try:
        st = base_state(dev, 2, {k.encoded: {"offset": META, "size": 10, "shape": None, "dtype": None,
                                            "fmt": None, "cached_positions": None}}, free_slots=[])
        assert c.apply_loaded_state(st) is True
        assert c.report_status()["free_slot_count"] == 1
        c.put_many([okey(2)], [Obj(10)])
        assert c.entry_offset(okey(2).encoded) == META + SLOT
        assert c.report_status()["next_slot"] == 2
    finally:
        c.close()


@pytest.mark.v1_layout
def test_slot_listed_by_a_checkpoint_is_not_reused_until_rewritten(dev):
    c = make_core(dev)
    k1, k2, k3 = okey(1), okey(2), okey(3)
    c.put_many([k1], [Obj(b"1" * 100)])
    c.checkpoint_now()  # container 0 lists k1 in slot 0
    c.delete_many([k1.encoded])
    c.put_many([k2], [Obj(b"2" * 100)])
    assert c.entry_offset(k2.encoded) == META + SLOT  # not k1's slot
    st = c.report_status()
    assert st["checkpoint_held_slots"] == 1 and st["free_slot_count"] == 0
    c.checkpoint_now()  # container 1 excludes slot 0; container 0 still lists it
    assert c.report_status()["checkpoint_held_slots"] == 1
    c.put_many([k3], [Obj(b"3" * 100)])
    c.checkpoint_now()  # container 0 rewritten without slot 0: it is free again
    st = c.report_status()
    assert st["checkpoint_held_slots"] == 0 and st["free_slot_count"] == 1
    c.put_many([okey(4)], [Obj(b"4" * 100)])
    assert c.entry_offset(okey(4).encoded) == META
    c.close()


def test_close_semantics(dev):
    c = make_core(dev)
    k = okey(1)
    c.put_many([k], [Obj(10)])
    out = c.close()
    assert out.quiescence.value == "proven" and out.final_checkpoint_written
    assert c.close() is out
    assert c.exists_many([k.encoded]) == [True]  # in-memory queries still work
    with pytest.raises(RuntimeError, match="cannot admit reads after shutdown"):
        c.load_many_into([k.encoded], [Obj(10)])
    assert c.put_many([okey(2)], [Obj(10)]).results == [False]
    assert c.report_status()["is_healthy"] is False


def test_concurrent_puts_and_loads(core):
    errors = []

    def worker(t):
        try:
            keys = [okey(t * 1000 + i) for i in range(20)]
            objs = [Obj(payload(t + i, 700)) for i in range(20)]
            assert all(core.put_many(keys, objs).results)
            outs = [Obj(700) for _ in range(20)]
            assert all(core.load_many_into([k.encoded for k in keys], outs))
            assert [o.bytes() for o in outs] == [o.bytes() for o in objs]
            assert all(core.delete_many([k.encoded for k in keys[::2]]))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    st = core.report_status()
    assert st["indexed_key_count"] == 60 and st["inflight_key_count"] == 0 and st["inflight_io_count"] == 0


def test_legacy_namespace_recovery_and_dtype_fallback(tmp_path):
    from lmcache_rawblock.raw_block import encode_legacy_key
    from lmcache_rawblock.raw_block._lmcache import CacheEngineKey

    dev = make_device(tmp_path)
    c = make_core(dev, namespace="legacy")
    spec = encode_legacy_key(CacheEngineKey("m", 1, 0, 0xABCDEF, "bfloat16"))
    o = Obj(b"L" * 50)
    o.metadata.dtype = None
    c.put_many([spec], [o])
    c.close()
    c = make_core(dev, namespace="legacy")
    try:
        assert c.exists_many([spec.encoded]) == [True]
        assert c.get_metadata_many([spec.encoded])[0].dtype == "bfloat16"  # parsed from the key
    finally:
        c.close()


@pytest.mark.v1_layout
def test_checkpoint_lists_only_committed_entries(dev, core):
    core.put_many([okey(1), okey(2)], [Obj(10), Obj(20)])
    core.checkpoint_now()
    k, seq, state, _ = newest_state(dev)
    assert (k, seq) == (0, 1)
    assert list(state["entries"]) == [okey(1).encoded, okey(2).encoded]
    assert len(read_containers(dev)) == 1
    assert DEV_SIZE == state["capacity_bytes"]


# ---- load_many_into(raise_on_error=...) --------------------------------------------------

def _three_keys(core):
    keys = [okey(i) for i in range(3)]
    core.put_many(keys, [Obj(payload(i, 300)) for i in range(3)])
    return [k.encoded for k in keys]


def test_load_error_is_logged_and_false_by_default(core, caplog):
    enc = _three_keys(core)
    core._native._inject_fault("read", 2)
    outs = [Obj(300) for _ in enc]
    with caplog.at_level("ERROR", logger=CORE_LOGGER):
        assert core.load_many_into(enc, outs) == [True, False, True]
    recs = [r for r in caplog.records if r.name == CORE_LOGGER]
    assert len(recs) == 1 and enc[1] in recs[0].getMessage()
    assert outs[2].bytes() == payload(2, 300)


def test_load_raise_on_error_raises_first_error_after_the_batch(core):
    enc = _three_keys(core)
    core._native._inject_fault("read", 2)
    outs = [Obj(300) for _ in enc]
    with pytest.raises(OSError) as ei:
        core.load_many_into(enc, outs, raise_on_error=True)
    assert ei.value.errno == 5  # EIO, as the device raises it
    # the batch finished (the third key was read) and the accounting is back to zero
    assert outs[2].bytes() == payload(2, 300) and outs[0].bytes() == payload(0, 300)
    st = core.report_status()
    assert st["inflight_io_count"] == 0 and st["inflight_key_count"] == 0
    assert core.load_many_into(enc, [Obj(300) for _ in enc], raise_on_error=True) == [True] * 3


def test_load_raise_on_error_ignores_misses(core):
    enc = _three_keys(core)
    assert core.load_many_into([enc[0], okey(99).encoded], [Obj(300), Obj(300)], raise_on_error=True) == [True, False]


def test_load_raise_on_error_short_destination(core):
    enc = _three_keys(core)
    with pytest.raises(ValueError, match="too small"):
        core.load_many_into([enc[0]], [Obj(10)], raise_on_error=True)
    assert core.inflight_io_count() == 0
