"""The LMCache-shaped workload, its trace format, the cache model's write stream per mode, and
write admission."""

from __future__ import annotations

import io
import json
from collections import Counter

import pytest

from lmcache_rawblock import fdp
from lmcache_rawblock.admission import Admission, FrequencySketch
from lmcache_rawblock_bench.waf import stream
from lmcache_rawblock_bench.waf.ftl import Geometry
from lmcache_rawblock_bench.waf.run import simulate_lmcache
from lmcache_rawblock_bench.waf.workload import WorkloadSpec, generate, read_trace, write_trace

SPEC = WorkloadSpec(requests=150, families=40, tp=2, chunk_bytes=2 << 20, seed=5)


def test_generator_shape_and_determinism():
    ev = list(generate(SPEC))
    assert ev == list(generate(SPEC))
    ops = Counter(e["op"] for e in ev)
    assert ops["get"] > 0 and ops["put"] > 0
    assert {e["worker"] for e in ev} == {0, 1}
    puts = [e for e in ev if e["op"] == "put"]
    assert {e["phase"] for e in puts} == {"prefill", "decode"}
    sizes = {e["size"] for e in puts}
    assert SPEC.object_bytes in sizes and min(sizes) < SPEC.object_bytes  # full and partial objects
    # decode stores one chunk per batch; prefill batches hold a chain
    per_batch = Counter((e["batch"], e["phase"]) for e in puts)
    assert max(n for (b, ph), n in per_batch.items() if ph == "decode") == 1
    assert max(n for (b, ph), n in per_batch.items() if ph == "prefill") > 1
    times = [e["time"] for e in ev]
    assert times == sorted(times)


def test_trace_round_trip_and_errors():
    buf = io.StringIO()
    n = write_trace(generate(SPEC), buf, SPEC)
    lines = buf.getvalue().splitlines()
    assert json.loads(lines[0])["workload"]["seed"] == 5 and len(lines) == n + 1
    assert list(read_trace(lines)) == list(generate(SPEC))
    with pytest.raises(ValueError, match="t:1: op must be one of get, put, delete, got 'store'"):
        list(read_trace(['{"op": "store", "key": "ab"}'], source="t"))
    with pytest.raises(ValueError, match="t:2: key must be hex digits, got 'xyz'"):
        list(read_trace(["", '{"op": "get", "key": "xyz"}'], source="t"))
    with pytest.raises(ValueError, match="a put needs size >= 1 and a batch"):
        list(read_trace(['{"op": "put", "key": "ab", "size": 0}']))


class Sink:
    def __init__(self):
        self.writes, self.deallocs = [], []

    def write_bytes(self, off, n, pid):
        self.writes.append((off, n, pid))

    def dealloc_bytes(self, off, n):
        self.deallocs.append((off, n))


def _model(mode, strategy=None, admission="always", capacity_slots=40, dealloc=True):
    slot = 4096 + SPEC.object_bytes
    cfg = stream.CacheConfig(capacity_bytes=(1 << 20) + capacity_slots * slot, slot_bytes=slot,
                             meta_total_bytes=1 << 20, tp=SPEC.tp, dealloc=dealloc, checkpoint_every=50)
    sink = Sink()
    m = stream.CacheModel(cfg, mode, strategy, sink, Admission(admission))
    m.feed(generate(SPEC))
    return m, sink


def test_modes_place_writes_as_the_fdp_strategies_route_them():
    m, sink = _model("no_fdp")
    assert {p for _, _, p in sink.writes} == {None}
    # every evicted slot deallocated (a store call's evictions in adjacent ranges merged)
    assert m.stats.evictions > 0 and m.stats.dealloc_slots == m.stats.evictions
    assert sum(n for _, n in sink.deallocs) == m.stats.evictions * m.cfg.slot_bytes
    m, sink = _model("mixed")
    assert {p for _, _, p in sink.writes} == {1}
    m, sink = _model("separated", "tp_worker")
    data = [(o, p) for o, _, p in sink.writes if o >= 1 << 20]
    assert {p for _, p in data} == {1, 2}  # one identifier per worker
    ckpt = {p for o, _, p in sink.writes if o < 1 << 20}
    assert ckpt == {5}  # the checkpoint on its own handle
    m, sink = _model("separated", "phase")
    assert {p for o, _, p in sink.writes if o >= 1 << 20} == {1, 2}
    m, sink = _model("separated", "cache_salt_prefix")
    assert len({p for o, _, p in sink.writes if o >= 1 << 20}) == 4  # four tenants


def test_phase_routing_is_fdp_routing():
    # the cache model asks lmcache_rawblock.fdp: a one-chunk store is decode (second id)
    facts = [fdp.KeyFacts(chunk_hash=7, worker=0, local_rank=0, salt="", stream=("m", 2, 0, ""))]
    assert fdp.PlacementRouter("phase", (1, 2, 3, 4)).placements(facts) == [2]


def test_slot_reuse_and_write_sizes():
    m, sink = _model("no_fdp", dealloc=False)
    slot = m.cfg.slot_bytes
    offs = {o for o, _, _ in sink.writes if o >= 1 << 20}
    assert all((o - (1 << 20)) % slot == 0 for o in offs)
    assert len(offs) == m.cfg.n_slots  # every slot used, no more
    assert all(n <= slot for o, n, _ in sink.writes if o >= 1 << 20)
    assert sink.deallocs == []


def test_second_hit_admission_writes_less_and_costs_hits():
    a, _ = _model("no_fdp", capacity_slots=200)
    b, _ = _model("no_fdp", "tp_worker", admission="second_hit", capacity_slots=200)
    assert b.stats.puts_refused > 0
    assert b.stats.puts_written < a.stats.puts_written * 0.8
    assert b.stats.puts_refused + b.stats.puts_written == b.stats.puts_offered
    # (the hit ratio may go either way: refusing one-use chunks also keeps them from evicting
    # useful ones; the study reports both)


def test_sketch_is_bounded_and_ages():
    # Integer keys: the sketch hashes them itself, so the collisions (and the estimate after
    # halving) do not depend on the interpreter's string-hash seed.
    s = FrequencySketch(width=64, depth=2, halve_every=100)
    assert s.nbytes == 128
    for _ in range(3):
        s.record(7)
    assert s.estimate(7) == 3
    for i in range(100):
        s.record(1000 + i)
    assert s.estimate(7) <= 1  # halved
    a = Admission("second_hit", width=1 << 10)
    assert [a.admit(x) for x in ("a", "b", "a", "a")] == [False, False, True, True]
    assert a.status()["admission_rejected"] == 2
    with pytest.raises(ValueError, match="admission must be one of always, second_hit, got 'third_hit'"):
        Admission("third_hit")
    with pytest.raises(ValueError, match="sketch width must be a power of two >= 16, got 100"):
        FrequencySketch(width=100)


def test_simulate_lmcache_small_end_to_end():
    g = Geometry(ru_pages=16, n_rus=256, op=0.07, max_handles=8, page_bytes=1 << 20)
    spec = WorkloadSpec(families=200, chunk_bytes=8 << 20, seed=2)
    r = simulate_lmcache(g, spec, util=0.9, mode="separated", strategy="phase", warmup=1, measure=0.5,
                         checkpoint_every=50)
    assert r["waf"] >= 1.0 and r["window"]["host_pages"] >= 0.5 * g.logical_pages
    assert r["handles_used"] == 3
    with pytest.raises(ValueError, match="util must be in \\(0, 1\\].*1.5"):
        simulate_lmcache(g, spec, util=1.5, mode="no_fdp")
    with pytest.raises(ValueError, match="mode must be one of no_fdp, mixed, separated, ckpt_apart, got 'fdp'"):
        simulate_lmcache(g, spec, util=0.9, mode="fdp")


def test_chunk_hashes_are_uniform_so_prompt_placement_uses_every_handle():
    # LMCache's chained hashes are uniform; the generator once drew only odd hashes, which sent
    # the prompt strategy's chains to 2 of 4 handles.
    spec = WorkloadSpec(requests=400, families=100, tp=1, chunk_bytes=1 << 20, seed=3)
    keys = {int(e["key"], 16) for e in generate(spec)}
    low = Counter(k % 4 for k in keys)
    assert set(low) == {0, 1, 2, 3}
    assert min(low.values()) > 0.2 * len(keys)
    ids = (1, 2, 3, 4)
    anchors = {fdp.prompt_placement(k, ids) for k in keys}
    assert anchors == {1, 2, 3, 4}
    assert 0 not in keys and max(keys) >= 1 << 63  # the whole 64-bit range, never 0


def test_lmcache_default_store_pattern_stores_full_chunks_at_prefill_only():
    base = list(generate(SPEC))
    spec = WorkloadSpec(**dict(SPEC.to_dict(), family_chunks=(1, 8), user_chunks=(1, 4), answer_chunks=(1, 6),
                               save_decode_cache=False, save_unfull_chunk=False))
    ev = list(generate(spec))
    puts = [e for e in ev if e["op"] == "put"]
    assert puts and {e["size"] for e in puts} == {spec.object_bytes}
    assert {e["phase"] for e in puts} == {"prefill"}
    # the same conversations: the lookups are the same, the answer's full chunks are stored by the
    # next turn's prefill (as part of its chain)
    assert [e for e in ev if e["op"] == "get"] == [e for e in base if e["op"] == "get"]
    decode_full = {e["key"] for e in base if e["op"] == "put" and e["phase"] == "decode"
                   and e["size"] == spec.object_bytes}
    stored = {e["key"] for e in puts}
    looked_up = {e["key"] for e in ev if e["op"] == "get"}
    assert decode_full & looked_up and decode_full & looked_up <= stored
    with pytest.raises(ValueError, match="save_unfull_chunk must be true or false, got 'no'"):
        WorkloadSpec(save_unfull_chunk="no")
