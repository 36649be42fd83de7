"""The metrics of lmcache_rawblock.metrics: the standalone endpoint serves exactly the table of
docs/observability.md, and what it serves during a workload agrees with the operations done."""

from __future__ import annotations

import re
import threading
import urllib.request
from pathlib import Path

import pytest

from core_helpers import Obj, make_core, make_device, okey, payload
from lmcache_rawblock import metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"
N = 4096


def _doc_table() -> dict[str, tuple[str, tuple[str, ...]]]:
    text = DOC.read_text()
    body = text.split("<!-- metrics-table: begin")[1].split("<!-- metrics-table: end")[0]
    out = {}
    for line in body.splitlines():
        m = re.match(r"\| `([a-z_]+)` \| (\w+) \| ([a-z_, ]+) \|", line)
        if m:
            out[m.group(1)] = (m.group(2), tuple(x.strip() for x in m.group(3).split(",")))
    return out


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)$')


def parse(text: str) -> tuple[dict[str, str], list[tuple[str, dict, float]]]:
    """(family -> type, samples) of a text exposition."""
    types, samples = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            types[name] = typ
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            assert m, f"unparsable sample line: {line!r}"
            labels = dict(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', m.group(2)))
            samples.append((m.group(1), labels, float(m.group(3))))
    return types, samples


def value(samples, name: str, **labels) -> float:
    got = [v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in labels.items())]
    assert len(got) == 1, f"{name} {labels}: {len(got)} samples"
    return got[0]


def scrape(server) -> str:
    host, port = server.server_address[:2]
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        return r.read().decode()


@pytest.fixture
def served(tmp_path):
    core = make_core(make_device(tmp_path), io_engine="io_uring")
    src = metrics.Sources()
    src.add(core, device="/dev/test0", model="m1")
    srv = metrics.serve(src, port=0)
    yield core, srv
    srv.shutdown()
    srv.server_close()
    core.close()


def test_the_endpoint_serves_exactly_the_documented_table(served):
    _core, srv = served
    types, samples = parse(scrape(srv))
    doc = _doc_table()
    assert doc, "no metrics table found in docs/observability.md"
    assert types == {name: typ for name, (typ, _) in doc.items()}
    for name, (typ, labels) in doc.items():
        names = {name + s for s in ("_bucket", "_count", "_sum")} if typ == "histogram" else {name}
        seen = {frozenset(k for k in lab if k != "le") for n, lab, _ in samples if n in names}
        assert seen == {frozenset(labels)}, (name, seen)
        assert name.endswith("_total") == (typ == "counter"), name
        assert typ != "histogram" or name.endswith(("_seconds", "_bytes")), name


def test_a_scrape_during_a_workload_agrees_with_the_operations_done(served):
    core, srv = served
    keys = [okey(i) for i in range(40)]
    stop = threading.Event()
    scrapes: list[str] = []

    def scraper():
        while not stop.is_set():
            scrapes.append(scrape(srv))

    t = threading.Thread(target=scraper)
    t.start()
    try:
        for i in range(0, 40, 4):
            assert all(core.put_many(keys[i:i + 4], [Obj(payload(j, N)) for j in range(i, i + 4)]).results)
        outs = [Obj(N) for _ in range(8)]
        for r in range(5):
            assert core.load_many_into([k.encoded for k in keys[8 * r:8 * r + 8]], outs) == [True] * 8
        assert core.delete_many([k.encoded for k in keys[:3]]) == [True] * 3
        assert core.load_many_into([keys[0].encoded, okey(1000).encoded], outs[:2]) == [False, False]
    finally:
        stop.set()
        t.join()
    assert scrapes, "the scraper got no answer during the workload"
    for text in scrapes:  # every scrape taken meanwhile is a consistent exposition
        parse(text)
    _, s = parse(scrape(srv))
    lab = {"device": "/dev/test0", "model": "m1"}
    assert value(s, "lmcache_rawblock_put_seconds_count", **lab) == 10
    assert value(s, "lmcache_rawblock_put_bytes_sum", **lab) == 40 * N
    assert value(s, "lmcache_rawblock_load_seconds_count", **lab) == 6
    assert value(s, "lmcache_rawblock_load_bytes_sum", **lab) == 40 * N
    assert value(s, "lmcache_rawblock_load_hits_total", **lab) == 40
    assert value(s, "lmcache_rawblock_load_misses_total", reason="evicted", **lab) == 1
    assert value(s, "lmcache_rawblock_load_misses_total", reason="absent", **lab) == 1
    assert value(s, "lmcache_rawblock_evictions_total", cause="deleted", **lab) == 3
    assert value(s, "lmcache_rawblock_delete_seconds_count", **lab) == 1
    assert value(s, "lmcache_rawblock_indexed_keys", **lab) == 37
    # cumulative buckets rise to the count; the sum is in seconds
    b = [(float(l2["le"]), v) for n, l2, v in s if n == "lmcache_rawblock_load_seconds_bucket" and l2["le"] != "+Inf"]
    assert [v for _, v in b] == sorted(v for _, v in b) and b[-1][1] == 6
    assert 0 < value(s, "lmcache_rawblock_load_seconds_sum", **lab) < 60
    h = core._native.histograms()["histograms"]["load_ns"]
    assert value(s, "lmcache_rawblock_load_seconds_sum", **lab) == pytest.approx(h["sum"] * 1e-9)
    assert value(s, "lmcache_rawblock_io_device_seconds_count", **lab) > 0


def test_quantiles_fall_inside_the_bucket_that_holds_them():
    h = {"count": 100, "sum": 0, "buckets": [(5, 50), (1280, 49), (1 << 20, 1)]}  # [4,5) [1024,1280) [917504,1M)
    assert metrics.quantile(h, 0.25) == pytest.approx(4.5)
    assert 1024 <= metrics.quantile(h, 0.9) < 1280
    assert (7 << 17) <= metrics.quantile(h, 1.0) <= 1 << 20
    assert metrics.quantile({"count": 0, "sum": 0, "buckets": []}, 0.5) is None


def test_the_endpoint_refuses_a_bad_port_by_name():
    with pytest.raises(ValueError, match="port must be an int in \\[0, 65535\\], got 70000"):
        metrics.serve(metrics.Sources(), port=70000)


def test_a_core_that_is_gone_drops_out_of_the_sources(tmp_path):
    core = make_core(make_device(tmp_path))
    src = metrics.Sources()
    src.add(core, device="d")
    assert len(src) == 1 and len(src.snapshots()) == 1
    core.close()
    del core
    import gc

    gc.collect()
    assert len(src) == 0 and src.snapshots() == []
