"""Deallocation, slot reuse order, evict-ahead and checkpoint placement in the cache model, and
the deallocation model against the analytic one at the effective spare factor."""

from __future__ import annotations

import json

import pytest

from lmcache_rawblock.admission import Admission
from lmcache_rawblock_bench.waf import stream
from lmcache_rawblock_bench.waf.analytic import greedy_uniform_waf
from lmcache_rawblock_bench.waf.ftl import Geometry
from lmcache_rawblock_bench.waf.run import simulate_lmcache, spec_for_slot
from lmcache_rawblock_bench.waf.study import GIB, MAX_PAGES, MIB, dealloc_uniform_waf, drive, workload_for
from lmcache_rawblock_bench.waf.workload import WorkloadSpec

SMALL = dict(ru_pages=64, n_rus=256, max_handles=1, page_bytes=4096)


class Sink:
    def __init__(self):
        self.ops = []

    def write_bytes(self, off, n, pid):
        self.ops.append(("w", off, n, pid))

    def dealloc_bytes(self, off, n):
        self.ops.append(("d", off, n))


def put(k, size=4096, batch=None):
    return {"op": "put", "key": f"{k:016x}", "size": size, "worker": 0, "batch": k if batch is None else batch}


def delete(k):
    return {"op": "delete", "key": f"{k:016x}", "worker": 0}


def model(n_slots=16, **kw):
    slot = 8192
    cfg = stream.CacheConfig(capacity_bytes=(1 << 20) + n_slots * slot, slot_bytes=slot, meta_total_bytes=1 << 20,
                             tp=1, **{**dict(checkpoint_every=0, dealloc=True), **kw})
    sink = Sink()
    return stream.CacheModel(cfg, "no_fdp", None, sink), sink


def slot_of(off):
    return (off - (1 << 20)) // 8192


@pytest.mark.parametrize("live", [0.6, 0.9])
def test_dealloc_matches_the_analytic_model_at_the_effective_spare(live):
    r = dealloc_uniform_waf(live, op=0.1, warmup=1.0, measure=1.0, geometry=SMALL)
    # the effective spare is far above the drive's 10%: deallocated space is spare
    assert r["effective_op"] > 0.15
    assert abs(r["waf"] - r["model"]) / r["model"] < 0.05, r
    off = dealloc_uniform_waf(live, op=0.1, dealloc=False, warmup=1.0, measure=1.0, geometry=SMALL)
    # without deallocation the drive keeps every freed slot's bytes: only the 10% is spare
    assert off["effective_op"] < 0.11
    assert off["waf"] > 1.4 * r["waf"], (off, r)
    assert off["waf"] > greedy_uniform_waf(0.15)


def test_freed_slots_wait_for_the_checkpoint_then_deallocate_in_one_batch():
    m, sink = model()
    m.feed([put(k) for k in range(1, 9)])
    m.feed([delete(k) for k in (2, 3, 4, 7)])
    assert [o for o in sink.ops if o[0] == "d"] == []  # held until a checkpoint records them free
    assert m.held == [1, 2, 3, 6]
    m._checkpoint()
    d = [o for o in sink.ops if o[0] == "d"]
    # adjacent slots coalesce into one range: slots 1-3 and 6
    assert [(slot_of(o[1]), o[2] // 8192) for o in d] == [(1, 3), (6, 1)]
    st = m.stats
    assert (st.dealloc_slots, st.dealloc_ranges, st.dealloc_commands, st.dealloc_bytes) == (4, 2, 1, 4 * 8192)
    # the checkpoint write comes before the deallocation
    last_w = max(i for i, o in enumerate(sink.ops) if o[0] == "w")
    assert last_w < sink.ops.index(d[0])


def test_a_put_with_no_reusable_slot_writes_the_checkpoint_before_evicting():
    m, sink = model(n_slots=4)
    m.feed([put(k) for k in range(1, 5)])
    m.feed([delete(1), put(10)])
    assert m.stats.evictions == 0 and m.stats.reclaims == 1  # the deleted slot, made reusable
    m.feed([put(11)])
    assert m.stats.evictions == 1 and m.stats.reclaims == 2
    assert ("d", (1 << 20) + 8192, 8192) in sink.ops  # key 2 (LRU) evicted from slot 1, deallocated


def test_no_deallocation_when_off():
    m, sink = model(n_slots=4, dealloc=False)
    m.feed([put(k) for k in range(1, 9)])
    assert m.stats.evictions == 4 and not [o for o in sink.ops if o[0] == "d"] and m.stats.dealloc_slots == 0


@pytest.mark.parametrize("reuse,expect", [("lifo", [5, 3, 1]), ("fifo", [1, 3, 5])])
def test_reuse_order(reuse, expect):
    m, sink = model(n_slots=8, reuse=reuse)
    m.feed([put(k) for k in range(1, 9)])
    m.feed([delete(k) for k in (2, 4, 6)])  # slots 1, 3, 5 in that order
    m._checkpoint()
    sink.ops.clear()
    m.feed([put(k) for k in (20, 21, 22)])
    assert [slot_of(o[1]) for o in sink.ops if o[0] == "w" and o[1] >= 1 << 20] == expect


def test_ru_groups_fill_a_group_and_evict_whole_groups():
    m, sink = model(n_slots=12, reuse="ru_groups", group_slots=4)
    m.feed([put(k) for k in range(1, 13)])  # groups 0, 1, 2 full
    m.feed([{"op": "get", "key": f"{1:016x}", "worker": 0}])  # group 0 recently used: group 1 is the oldest
    sink.ops.clear()
    m.feed([put(20)])
    # the whole of group 1 (keys 5-8) evicted, deallocated in one range, and the put takes its first slot
    assert m.stats.evictions == 4 and all(k not in m.index for k in [(x, 0) for x in range(5, 9)])
    d = [o for o in sink.ops if o[0] == "d"]
    assert [(slot_of(o[1]), o[2] // 8192) for o in d] == [(4, 4)]
    m.feed([put(k) for k in (21, 22, 23)])
    assert [slot_of(o[1]) for o in sink.ops if o[0] == "w" and o[1] >= 1 << 20] == [4, 5, 6, 7]
    # a delete inside a closed group does not make its slot reusable on its own
    m.feed([delete(2)])
    m._checkpoint()
    assert m.slots.available() == 0


def test_evict_ahead_keeps_room_and_evicts_in_batches():
    m, sink = model(n_slots=20, evict_ahead=(0.9, 0.2))
    m.feed([put(k) for k in range(1, 60)])
    st = m.stats
    assert st.evictions == st.evicted_ahead > 0  # every eviction ahead of need
    assert len(m.index) <= 18  # never above the trigger
    assert st.dealloc_ranges < st.dealloc_slots  # batches coalesce


def test_checkpoints_on_their_own_handle():
    cfg = stream.CacheConfig(capacity_bytes=(1 << 20) + 8 * 8192, slot_bytes=8192, meta_total_bytes=1 << 20, tp=1,
                             checkpoint_every=2, meta_io_bytes=4096)
    sink = Sink()
    m = stream.CacheModel(cfg, "ckpt_apart", None, sink, Admission())
    m.feed([put(k) for k in range(1, 7)])
    data = {o[3] for o in sink.ops if o[0] == "w" and o[1] >= 1 << 20}
    meta = {o[3] for o in sink.ops if o[0] == "w" and o[1] < 1 << 20}
    assert data == {cfg.ids[0]} and meta == {cfg.checkpoint_pid}


def test_dealloc_brings_the_lmcache_workload_near_one_on_a_small_drive():
    g = Geometry(ru_pages=64, n_rus=128, op=0.1, max_handles=1, page_bytes=1 << 20)
    spec = spec_for_slot(WorkloadSpec(families=120, concurrency=4, seed=3), 8 << 20)
    kw = dict(util=1.0, mode="no_fdp", warmup=1.5, measure=1.0)
    today = simulate_lmcache(g, spec, dealloc=False, **kw)
    on = simulate_lmcache(g, spec, dealloc=True, **kw)
    assert today["waf"] > 1.1 and on["waf"] < 1.06, (today["waf"], on["waf"])
    assert on["cache"]["dealloc_slots"] > 0 and today["cache"]["dealloc_slots"] == 0
    # the same cache decisions: deallocation changes the drive only
    assert on["cache"]["hits"] == today["cache"]["hits"]


def test_a_drive_not_in_steady_state_shows_no_amplification_in_any_mode():
    g = Geometry(ru_pages=64, n_rus=128, op=0.1, max_handles=4, page_bytes=1 << 20)
    spec = spec_for_slot(WorkloadSpec(families=120, concurrency=4), 8 << 20)
    wafs = [simulate_lmcache(g, spec, util=0.95, warmup=0, measure=0.5, **kw)["waf"]
            for kw in (dict(mode="no_fdp", dealloc=False), dict(mode="separated", strategy="tp_worker"),
                       dict(mode="no_fdp", reuse="ru_groups"))]
    assert wafs == [1.0, 1.0, 1.0]


def test_study_drive_keeps_the_ru_to_chunk_ratio_and_scales_the_workload():
    g = drive(16 * GIB, 8 * MIB)
    # 16 GiB RUs of 8 MiB chunks: 128 RUs and pages of a quarter slot keep it to MAX_PAGES
    assert g.ru_pages * g.page_bytes == 16 * GIB and g.page_bytes == 2 * MIB and g.n_rus == 128
    assert g.physical_pages <= MAX_PAGES
    assert drive(GIB, 8 * MIB).n_rus == 256
    w1, w2 = workload_for(drive(GIB, 8 * MIB), 8 * MIB), workload_for(g, 8 * MIB)
    # scaled with the logical slots: 126 data RUs of 16 GiB against 254 of 1 GiB (2 held back each)
    assert w1.families == 2000 and w2.families == round(2000 * 126 * 16 / 254)
    assert w2.concurrency == round(32 * 126 * 16 / 254) and w2.object_bytes == 8 * MIB - 4096
    with pytest.raises(ValueError, match="must be whole pages"):
        drive(GIB, 3 * MIB + 1)


def test_cli_simulate_takes_the_levers(capsys):
    from lmcache_rawblock.__main__ import main

    rc = main(["waf", "simulate", "--ru-pages", "64", "--rus", "128", "--handles", "2", "--mode", "no_fdp",
               "--dealloc", "--reuse", "ru_groups", "--evict-ahead", "0.95,0.05", "--warmup", "0.3",
               "--measure", "0.3", "--json"])
    assert rc == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert r["dealloc"] is True and r["reuse"] == "ru_groups" and r["evict_ahead"] == [0.95, 0.05]
    assert main(["waf", "simulate", "--evict-ahead", "high"]) == 2
    assert "TRIGGER,RATIO" in capsys.readouterr().err


def test_study_tables_pick_the_first_product_lever_that_meets_the_target(tmp_path):
    from lmcache_rawblock_bench.waf import study

    g = Geometry(ru_pages=64, n_rus=128, op=0.1, max_handles=1, page_bytes=1 << 20)
    spec = spec_for_slot(WorkloadSpec(families=120, concurrency=4, seed=3), 8 << 20)
    tasks = [(("sweep", "small", name), g, spec, dict(dict(mode="no_fdp", dealloc=False), **study.LEVERS[name][0],
                                                      util=1.0, warmup=1.5, measure=1.0))
             for name in ("today", "dealloc")]
    res = study.run_study(tasks, jobs=1)
    rows = study.summarize(res)
    (op,) = study.operator_table(rows)
    assert op["today"] > 1.05 and op["lever"] == "dealloc" and op["waf"] <= 1.05 and op["meets_target"]
    assert "deallocate_freed: on" in op["settings"]
    files = study.write_study(str(tmp_path), res, None, None, ["waf", "study"], plot=False)
    md = (tmp_path / "summary.md").read_text()
    assert "## Operator table" in md and "| 64 MiB | 8 MiB | 100% |" in md
    assert json.loads((tmp_path / "results.json").read_text())["operator_table"][0]["lever"] == "dealloc"
    assert (tmp_path / "COMMAND").read_text().strip() == "waf study" and len(files) == 3


def test_the_default_drive_has_1_gib_reclaim_units_and_room_for_separated_placement():
    from lmcache_rawblock_bench.waf.cli import add_arguments
    import argparse

    g = Geometry()
    assert g.ru_pages * g.page_bytes == GIB and g.n_rus == 256 and g.op == 0.1
    p = argparse.ArgumentParser()
    add_arguments(p.add_subparsers(dest="command"))
    a = p.parse_args(["waf", "simulate"])
    assert a.ru_pages * a.page_bytes == GIB and a.rus == 256 and a.op == 0.1
    # four data identifiers and the checkpoint's: five handles must fit
    assert a.handles >= 5 and a.dealloc == "off" and a.reuse == "lifo" and a.evict_ahead is None
