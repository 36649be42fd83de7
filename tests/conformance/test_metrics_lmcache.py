"""The tier's metrics inside the real LMCache: the in-process plugin's figures scraped over HTTP
from prometheus_client's REGISTRY (what LMCache's internal API server serves at /metrics) during
a workload, and the MP adapter's through LMCache's MP observability (OpenTelemetry), each
agreeing with the operations done.

Marked ``lmcache``: run with ``make test-lmcache``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import threading
import urllib.request

import pytest

from helpers import lmcache_imports
from lmcache_stack import MODEL, Stack, make_config, small_extra

with lmcache_imports() as lmc:
    import prometheus_client
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
    from opentelemetry import metrics as otel
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client.parser import text_string_to_metric_families

pytestmark = lmc.marks

MiB = 1 << 20


def _sparse(path, size=64 * MiB) -> str:
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


def _samples(text: str) -> list:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def _value(samples, name: str, **labels) -> float:
    got = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(got) == 1, f"{name} {labels}: {len(got)} samples"
    return got[0]


def _key(i: int) -> "CacheEngineKey":
    return CacheEngineKey(MODEL, 1, 0, 0xBEE000 + i, torch.bfloat16, {})


def test_in_process_scrape_during_a_workload_agrees_with_the_operations(tmp_path):
    dev = _sparse(tmp_path / "dev.img")
    st = Stack(make_config(small_extra(dev)))
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    stop = threading.Event()
    scrapes: list[str] = []

    def scraper():
        while not stop.is_set():
            with urllib.request.urlopen(url, timeout=10) as r:
                scrapes.append(r.read().decode())

    try:
        be = st.launch()
        assert be is not None
        t = threading.Thread(target=scraper)
        t.start()
        try:
            keys = [_key(i) for i in range(12)]
            objs = [st.alloc(i) for i in range(12)]
            nbytes = sum(len(bytes(o.byte_array)) for o in objs)
            for i in range(0, 12, 4):
                for f in be.batched_submit_put_task(keys[i:i + 4], objs[i:i + 4]) or []:
                    f.result(30)
            got = be.batched_get_blocking(keys)
            assert all(g is not None for g in got)
            for g in got:
                g.ref_count_down()
            assert be.batched_remove(keys[:2]) == 2
        finally:
            stop.set()
            t.join()
        for o in objs:
            o.ref_count_down()
        assert scrapes, "no scrape answered during the workload"
        with urllib.request.urlopen(url, timeout=10) as r:
            s = _samples(r.read().decode())
        lab = {"device": dev, "model": MODEL}
        puts = _value(s, "lmcache_rawblock_put_seconds_count", **lab)
        assert puts >= 1 and _value(s, "lmcache_rawblock_put_bytes_count", **lab) == puts
        assert _value(s, "lmcache_rawblock_put_bytes_sum", **lab) == nbytes
        assert _value(s, "lmcache_rawblock_load_hits_total", **lab) == 12
        assert _value(s, "lmcache_rawblock_load_bytes_sum", **lab) == nbytes
        assert _value(s, "lmcache_rawblock_evictions_total", cause="deleted", **lab) == 2
        assert _value(s, "lmcache_rawblock_indexed_keys", **lab) == 10
        assert _value(s, "lmcache_rawblock_put_seconds_sum", **lab) > 0
        # LMCache's own metrics are served by the same registry, beside ours
        assert any(n.startswith("lmcache_rawblock_") for n in (x.name for x in s))
    finally:
        server.shutdown()
        st.close()


def _otel_points(reader) -> dict:
    """name -> [(attributes, value)] of the reader's current collection."""
    out: dict = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend((dict(p.attributes), p.value) for p in m.data.data_points)
    return out


def _mp_adapter(dev: str):
    """Our MP adapter, selected as docs/configuration.md shows, through LMCache's parser and factory."""
    from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry

    spec = {"type": "plugin", "module_path": "lmcache_rawblock.l2_adapter", "class_name": "RawBlockL2Adapter",
            "adapter_params": {"device_path": dev, "slot_bytes": 4096 + 16384, "use_odirect": False,
                               "io_engine": "posix", "meta_total_bytes": MiB, "meta_enable_periodic": False,
                               "meta_format": "v1"}}
    args = add_l2_adapters_args(argparse.ArgumentParser()).parse_args(["--l2-adapter", json.dumps(spec)])
    cfgs = parse_args_to_l2_adapters_config(args)
    return create_l2_adapter_from_registry(list(cfgs.adapters if hasattr(cfgs, "adapters") else cfgs)[0])


def _wait(fd: int) -> None:
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    assert poll.poll(10_000), "the adapter never signalled its event fd"
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


def _obj(n_floats: int, seed: int) -> "TensorMemoryObj":
    raw = torch.rand(n_floats, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    meta = MemoryObjMetadata(shape=torch.Size([n_floats]), dtype=torch.float32, address=0, phy_size=n_floats * 4,
                             fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(raw, meta, parent_allocator=None)


def test_mp_adapter_reaches_lmcache_mp_observability(tmp_path):
    reader = InMemoryMetricReader()
    if type(otel.get_meter_provider()).__name__ != "_ProxyMeterProvider":
        pytest.skip("a global OpenTelemetry meter provider is already set in this process; this test sets its own")
    otel.set_meter_provider(MeterProvider(metric_readers=[reader]))
    dev = _sparse(tmp_path / "mp.img", 32 * MiB)
    ad = _mp_adapter(dev)
    try:
        keys = [ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="org/mp-model", kv_rank=0) for i in range(3)]
        tid = ad.submit_store_task(keys, [_obj(1024, seed=i) for i in range(3)])
        _wait(ad.get_store_event_fd())
        assert ad.pop_completed_store_tasks()[tid].is_successful()
        tid = ad.submit_lookup_and_lock_task(keys, {0: MemoryLayoutDesc(shapes=[], dtypes=[])})
        _wait(ad.get_lookup_and_lock_event_fd())
        assert ad.query_lookup_and_lock_result(tid).get_indices_list() == [0, 1, 2]
        tid = ad.submit_load_task(keys, [_obj(1024, seed=9) for _ in keys])
        _wait(ad.get_load_event_fd())
        assert ad.query_load_result(tid).get_indices_list() == [0, 1, 2]
        ad.submit_unlock(keys)
        ad.delete(keys[:1])
        pts = _otel_points(reader)

        def one(name, **attrs):
            got = [v for a, v in pts.get("lmcache_mp.l2_raw_block_" + name, [])
                   if a.get("device") == dev and all(a.get(k) == w for k, w in attrs.items())]
            assert len(got) == 1, (name, attrs, pts.get("lmcache_mp.l2_raw_block_" + name))
            return got[0]

        assert one("ops", op="put", l2_name="raw_block") == 1
        assert one("ops", op="load") == 1
        assert one("load_hits") == 3
        assert one("evictions", cause="deleted") == 1
        assert one("op_seconds", op="load") > 0
        assert one("op_p99_seconds", op="load") >= one("op_p50_seconds", op="load") > 0
        # and the full histograms in prometheus_client's registry, which the MP server's pull port serves
        s = _samples(prometheus_client.generate_latest(prometheus_client.REGISTRY).decode())
        assert _value(s, "lmcache_rawblock_load_hits_total", device=dev) == 3
    finally:
        ad.close()
