"""``waf replay`` on sparse files: the workload through the real core, its op counts against the
simulator's cache model, admission, refusals, the recorded write stream and trace input."""

from __future__ import annotations

import json

import pytest

from lmcache_rawblock.__main__ import main as cli_main
from lmcache_rawblock.admission import Admission
from lmcache_rawblock_bench.waf import stream
from lmcache_rawblock_bench.waf.workload import WorkloadSpec, generate

SMALL = ["--size", "8M", "--chunk-bytes", "64K", "--families", "30", "--destroy-data"]


def replay(capsys, dev, *args: str) -> list[dict]:
    rc = cli_main(["waf", "replay", "--device", str(dev), *SMALL, "--json", *args])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)


def error(capsys, *args: str) -> str:
    rc = cli_main(["waf", "replay", *args])
    cap = capsys.readouterr()
    assert rc == 2, (cap.out, cap.err)
    return cap.err


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_no_fdp_run_counts_and_repeatable(tmp_path, capsys, engine):
    dev = tmp_path / "dev.img"
    a = replay(capsys, dev, "--engine", engine, "--warmup", "1", "--measure", "1", "--checkpoint-every", "50")
    b = replay(capsys, dev, "--engine", engine, "--warmup", "1", "--measure", "1", "--checkpoint-every", "50")
    (r,) = a
    assert r["engine"] == engine and r["mode"] == "no_fdp" and r["waf"] is None
    assert not r["window"]["available"] and "not an NVMe namespace" in r["window"]["note"]
    ops = r["ops"]
    assert ops["lookups"] > 0 and 0 < ops["hits"] < ops["lookups"]
    assert ops["puts_stored"] == ops["puts_offered"] > 0 and ops["puts_refused"] == 0 and ops["puts_failed"] == 0
    assert ops["evictions"] > 0 and ops["checkpoints"] > 0
    assert ops["lookup_disagreements"] == 0
    # Every byte the core wrote is a chunk's slot write or a checkpoint.
    assert ops["bytes_written"] == ops["chunk_write_bytes"] + ops["checkpoint_bytes"]
    assert r["unattributed_write_bytes"] == 0
    assert ops["bytes_written"] >= r["measure_bytes"] == r["span_bytes"]
    assert r["latency"]["put_many_calls"] == ops["put_calls"] and r["latency"]["put_many_p99_ms"] > 0
    # Same seed, same work: identical counts.
    assert b[0]["ops"] == ops and b[0]["warmup_ops"] == r["warmup_ops"]


def test_repeats_use_the_next_seed(tmp_path, capsys):
    runs = replay(capsys, tmp_path / "d.img", "--repeats", "2", "--seed", "7", "--warmup", "0.5", "--measure", "0.5")
    assert [r["workload_seed"] for r in runs] == [7, 8]
    assert runs[0]["ops"] != runs[1]["ops"]


def test_ops_match_the_simulator_cache_model(tmp_path, capsys):
    """The whole of a finite workload (with deletes) through the core and through
    stream.CacheModel with as many slots: the same lookups, hits, stores, evictions, deletes."""
    spec = WorkloadSpec(requests=150, seed=3, chunk_bytes=64 << 10, families=30, delete_on_end=0.5)
    runs = replay(capsys, tmp_path / "d.img", "--requests", "150", "--seed", "3", "--delete-on-end", "0.5",
                  "--warmup", "0", "--measure", "1000", "--checkpoint-every", "0")
    r = runs[0]
    assert r["input_ended_early"]
    cfg = stream.CacheConfig(capacity_bytes=(1 << 20) + r["max_slots"] * r["slot_bytes"], meta_total_bytes=1 << 20,
                             slot_bytes=r["slot_bytes"], checkpoint_every=0, dealloc=False, tp=spec.tp)
    model = stream.CacheModel(cfg, "no_fdp", None, stream.Recorder(open(tmp_path / "m.jsonl", "w")), Admission())
    model.feed(generate(spec))
    m, ops = model.stats, r["ops"]
    assert m.evictions > 0 and m.deletes > 0
    assert (ops["lookups"], ops["hits"], ops["puts_offered"], ops["puts_stored"], ops["evictions"], ops["deletes"]) \
        == (m.lookups, m.hits, m.puts_offered, m.puts_written, m.evictions, m.deletes)


def test_second_hit_admission_refuses_first_stores(tmp_path, capsys):
    # A span that holds the whole workload: with no eviction, refusing first stores can only
    # cost hits (in a full cache it can raise them, by keeping one-time chunks out).
    common = ["--warmup", "0", "--measure", "1000", "--requests", "300", "--size", "64M", "--chunk-bytes", "16K"]
    (always,) = replay(capsys, tmp_path / "a.img", *common)
    (second,) = replay(capsys, tmp_path / "b.img", *common, "--admission", "second_hit")
    a, s = always["ops"], second["ops"]
    assert a["evictions"] == 0 and always["input_ended_early"]
    assert a["puts_refused"] == 0 and s["puts_refused"] > 0
    assert s["puts_stored"] + s["puts_refused"] == s["puts_offered"]
    assert s["payload_bytes"] < a["payload_bytes"]
    assert s["hit_ratio"] < a["hit_ratio"]
    assert second["admission"] == "second_hit"


@pytest.mark.parametrize("mode", ["mixed", "separated"])
def test_fdp_modes_refused_on_a_file(tmp_path, capsys, mode):
    dev = tmp_path / "dev.img"
    err = error(capsys, "--device", str(dev), *SMALL, "--mode", mode)
    assert f"--mode {mode}" in err and str(dev) in err and "regular file" in err and "/dev/ngXnY" in err


def test_record_replays_on_the_simulator(tmp_path, capsys):
    rec = tmp_path / "w.jsonl"
    (r,) = replay(capsys, tmp_path / "d.img", "--record", str(rec), "--warmup", "0.5", "--measure", "1",
                  "--checkpoint-every", "40")
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    # The stream is every byte the run wrote: the slot writes and the checkpoints' writes.
    assert sum(x["length"] for x in lines) == r["ops"]["bytes_written"] + r["warmup_ops"]["bytes_written"]
    ckpt = [x for x in lines if x["offset"] < r["slot_bytes"] and x["offset"] < (1 << 20)]
    assert ckpt, "no checkpoint write recorded"
    assert all(x["op"] == "write" and x["pid"] is None for x in lines)
    rc = cli_main(["waf", "simulate", "--stream", str(rec), "--page-bytes", "65536", "--ru-pages", "4",
                   "--rus", "256", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["records"] == len(lines)
    assert out["counters"]["host_pages"] > 0 and out["waf"] >= 1.0


def test_generated_trace_replays(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    rc = cli_main(["waf", "generate", "--requests", "4", "--seed", "5", "--tp", "1", "--out", str(trace)])
    capsys.readouterr()
    assert rc == 0
    # The default 16 MiB chunks: slots are sized from the trace's largest put, the run stops
    # after --measure bytes.
    rc = cli_main(["waf", "replay", "--device", str(tmp_path / "d.img"), "--span", "40M", "--trace", str(trace),
                   "--warmup", "0", "--measure", "48M", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    (r,) = json.loads(cap.out)
    assert r["slot_bytes"] == (16 << 20) + 4096 and r["ops"]["puts_stored"] >= 3
    assert r["ops"]["bytes_written"] >= 48 << 20


def test_trace_input_matches_the_generator(tmp_path, capsys):
    from lmcache_rawblock_bench.waf.workload import write_trace

    trace = tmp_path / "t.jsonl"
    spec = WorkloadSpec(requests=120, seed=5, chunk_bytes=64 << 10, families=30)
    with open(trace, "w") as f:
        write_trace(generate(spec), f, spec)
    common = ["--warmup", "0", "--measure", "1000"]
    (t,) = replay(capsys, tmp_path / "a.img", "--trace", str(trace), *common)
    (g,) = replay(capsys, tmp_path / "b.img", "--requests", "120", "--seed", "5", *common)
    assert t["workload"] == {"trace": str(trace)} and t["workload_seed"] is None
    assert t["ops"] == g["ops"] and t["ops"]["puts_stored"] > 0 and t["ops"]["evictions"] > 0


def test_table_and_out_dir(tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli_main(["waf", "replay", "--device", str(tmp_path / "d.img"), *SMALL, "--warmup", "0.2", "--measure",
                   "0.5", "--admission", "always,second_hit", "--out", str(out), "--no-plots"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "n/a (no counters)" in cap.out and "no_fdp" in cap.out and "second_hit" in cap.out
    assert "not an NVMe namespace" in cap.out
    doc = json.loads((out / "results.json").read_text())
    assert [r["admission"] for r in doc["runs"]] == ["always", "second_hit"]
    assert (out / "no_fdp-always-r0.json").exists() and (out / "summary.md").exists()
    assert "| no_fdp dealloc auto (off) | second_hit |" in (out / "summary.md").read_text()


@pytest.mark.parametrize("args, names", [
    (["--mode", "bogus"], ["--mode", "bogus"]),
    (["--strategy", "nope"], ["--strategy", "nope"]),
    (["--admission", "third_hit"], ["--admission", "third_hit"]),
    (["--warmup", "lots"], ["--warmup", "lots"]),
    (["--measure", "0"], ["--measure", "0"]),
    (["--repeats", "0"], ["--repeats", "0"]),
    (["--chunk-bytes", "0"], ["--chunk-bytes", "0"]),
    (["--tp", "0"], ["--tp", "0"]),
])
def test_bad_arguments_name_option_and_value(tmp_path, capsys, args, names):
    err = error(capsys, "--device", str(tmp_path / "d.img"), *SMALL, *args)
    for n in names:
        assert n in err, err


def test_existing_file_needs_destroy_data(tmp_path, capsys):
    dev = tmp_path / "keep.img"
    dev.write_bytes(b"precious" * 1024 * 1024)
    err = error(capsys, "--device", str(dev), "--chunk-bytes", "64K")
    assert "--destroy-data" in err and str(dev) in err
    assert dev.read_bytes()[:8] == b"precious"


def test_bad_device_and_size(tmp_path, capsys):
    missing = tmp_path / "missing.img"
    err = error(capsys, "--device", str(missing))
    assert "--device" in err and str(missing) in err and "--size" in err
    err = error(capsys, "--device", str(missing), "--size", "5000")
    assert "--size '5000'" in err
    err = error(capsys, "--device", str(tmp_path / "small.img"), "--size", "1M", "--chunk-bytes", "1M")
    assert "--size" in err and "slots" in err
    err = error(capsys, "--device", str(tmp_path / "x.img"), *SMALL, "--trace", str(tmp_path / "none.jsonl"))
    assert "--trace" in err and "none.jsonl" in err


def test_load_reads_every_hit_back(tmp_path, capsys):
    (r,) = replay(capsys, tmp_path / "d.img", "--load", "--warmup", "0.5", "--measure", "1")
    (plain,) = replay(capsys, tmp_path / "d.img", "--warmup", "0.5", "--measure", "1")
    assert r["ops"]["hits"] > 0 and r["ops"]["loads"] == r["ops"]["hits"]
    assert plain["ops"]["loads"] == 0 and plain["ops"]["hits"] == r["ops"]["hits"]


def test_block_device_with_a_file_system_is_refused_unless_forced(loop_device, capsys):
    import shutil
    import subprocess

    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed (e2fsprogs), cannot make a file-system signature")
    dev = loop_device(16 * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True, capture_output=True)
    with open(dev, "rb") as f:
        before = f.read(1 << 20)
    err = error(capsys, "--device", dev, "--chunk-bytes", "64K", "--families", "30", "--destroy-data")
    assert dev in err and "ext4" in err and "--force" in err
    with open(dev, "rb") as f:
        assert f.read(1 << 20) == before  # nothing written
    rc = cli_main(["waf", "replay", "--device", dev, "--chunk-bytes", "64K", "--families", "30", "--destroy-data",
                   "--force", "--warmup", "0.5", "--measure", "0.5", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert json.loads(cap.out)[0]["ops"]["puts_stored"] > 0


def test_dealloc_on_and_off_side_by_side_and_recorded(tmp_path, capsys):
    """--dealloc on,off: the core's deallocate_freed per run (on: punched holes in the file);
    the recorded stream of the first run has a deallocate record for every range the core
    deallocated, and replays on the simulator."""
    rec = tmp_path / "w.jsonl"
    on, off = replay(capsys, tmp_path / "d.img", "--dealloc", "on,off", "--record", str(rec), "--warmup", "0.5",
                     "--measure", "1", "--checkpoint-every", "40")
    assert (on["dealloc"], off["dealloc"]) == ("on", "off")
    assert (on["core"]["dealloc_state"], off["core"]["dealloc_state"]) == ("on", "off")
    assert on["core"]["dealloc_slots"] > 0 and off["core"]["dealloc_slots"] == 0
    assert on["core"]["dealloc_failures"] == 0
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    d = [x for x in lines if x["op"] == "deallocate"]
    assert len(d) == on["record_deallocate_ranges"] == on["core"]["dealloc_ranges"]
    assert sum(x["length"] for x in d) == on["core"]["dealloc_bytes"]
    # whole slots, each written before (a chunk write starts there) and not deallocated twice
    # without a write in between; the next write to a deallocated slot comes after it
    assert all(x["length"] % on["slot_bytes"] == 0 for x in d)
    live = {}
    for x in lines:
        if x["op"] == "write":
            live[x["offset"]] = True
        elif x["op"] == "deallocate":
            for off_ in range(x["offset"], x["offset"] + x["length"], on["slot_bytes"]):
                assert live.get(off_, False), off_
                live[off_] = False
    rc = cli_main(["waf", "simulate", "--stream", str(rec), "--page-bytes", "4096", "--ru-pages", "16",
                   "--rus", "256", "--handles", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["records"] == len(lines) and out["counters"]["deallocs"] == len(d)
    assert out["counters"]["dealloc_pages"] > 0
    assert error(capsys, "--device", str(tmp_path / "x.img"), *SMALL, "--dealloc", "sometimes").count("--dealloc")


def test_evict_batch_evicts_ahead_so_deallocation_precedes_reuse(tmp_path, capsys):
    """--evict-batch 0.05 evicts in batches, as the plugin's evict-ahead does: the core then
    deallocates nearly every freed slot before a put takes it, and deallocation on and off make
    the same cache decisions within a few evictions."""
    on, off = replay(capsys, tmp_path / "d.img", "--size", "32M", "--dealloc", "on,off", "--evict-batch", "0.05",
                     "--warmup", "1", "--measure", "1", "--checkpoint-every", "100")
    c = on["core"]
    assert c["dealloc_slots"] > 0 and c["dealloc_skipped"] * 5 < c["dealloc_slots"], c
    assert abs(on["ops"]["evictions"] - off["ops"]["evictions"]) <= 0.05 * off["ops"]["evictions"] + 2
    assert on["evict_batch"] == 0.05
    assert "--evict-batch 1.5" in error(capsys, "--device", str(tmp_path / "x.img"), *SMALL, "--evict-batch", "1.5")


def test_a_recorded_stream_of_the_real_core_replays_on_a_fitted_drive_against_the_model(tmp_path, capsys):
    """The real core's recorded decisions (slots, v1 checkpoints, deallocations) on the flash
    model: a drive fitted to the recorded span, the steady-state window after a warm-up, and the
    simulator's cache model of the same configuration on the same drive."""
    from lmcache_rawblock_bench.waf import replaycheck
    from lmcache_rawblock_bench.waf.cli import fit_geometry
    from lmcache_rawblock_bench.waf.ftl import Geometry

    rec = tmp_path / "w.jsonl"
    (r,) = replay(capsys, tmp_path / "d.img", "--size", "16M", "--workload", "lmcache_defaults", "--dealloc", "on",
                  "--evict-batch", "0.05", "--warmup", "1", "--measure", "2", "--record", str(rec))
    assert r["workload"]["save_unfull_chunk"] is False and r["ops"]["evictions"] > 0
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    span = max(x["offset"] + x["length"] for x in lines)
    g = fit_geometry(span, 0.9, Geometry(ru_pages=16, n_rus=8, op=0.1, max_handles=1, page_bytes=4096))
    smaller = Geometry(ru_pages=16, n_rus=g.n_rus - 2, op=0.1, max_handles=1, page_bytes=4096)
    assert g.logical_bytes >= span / 0.9 > smaller.logical_bytes  # the span is 90% of it, one RU to spare
    rc = cli_main(["waf", "simulate", "--stream", str(rec), "--page-bytes", "4096", "--ru-pages", "16", "--handles",
                   "1", "--fit-util", "0.9", "--stream-warmup", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["geometry"]["n_rus"] == g.n_rus
    assert out["window"]["host_pages"] < out["counters"]["host_pages"] and out["window_waf"] >= 1.0
    assert out["counters"]["deallocs"] == sum(1 for x in lines if x["op"] == "deallocate") > 0
    res = replaycheck.check(str(rec), r, Geometry(ru_pages=16, n_rus=8, op=0.1, max_handles=1, page_bytes=4096),
                            util=0.9, warmup=1)
    assert res["replay"]["waf"] == out["window_waf"]
    assert res["model"]["evict_ahead"] == [1.0, 0.05] and res["model"]["waf"] >= 1.0
    assert abs(res["model"]["slots"] - r["max_slots"]) <= 1
    # a warm-up longer than the stream is an error that says so
    rc = cli_main(["waf", "simulate", "--stream", str(rec), "--page-bytes", "4096", "--ru-pages", "16", "--handles",
                   "1", "--fit-util", "0.9", "--stream-warmup", "50"])
    assert rc == 2 and "--stream-warmup 50.0: the stream" in capsys.readouterr().err


def _allocated(path, block: int = 4096) -> set:
    """The blocks of a file that hold data (SEEK_DATA / SEEK_HOLE)."""
    import os

    out = set()
    fd = os.open(path, os.O_RDONLY)
    try:
        end = os.fstat(fd).st_size
        off = 0
        while off < end:
            try:
                d = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:
                break
            h = os.lseek(fd, d, os.SEEK_HOLE)
            out.update(range(d // block, -(-h // block)))
            off = h
    finally:
        os.close(fd)
    return out


def test_the_write_journal_of_a_log_format_run_is_every_write_and_deallocation_the_core_made(tmp_path, capsys):
    """--record in the log format with strided extents and extent eviction: the stream is the
    core's own write journal. Its write bytes are the core's write_completed_bytes; it has
    metadata writes (log groups, base, superblocks) below the data area, and whole-extent
    deallocations; replaying its writes and deallocations onto an empty block map gives the
    file's allocated blocks (the deallocations punched holes), and every live key's slot was
    written at the offset the core's index gives."""
    from lmcache_rawblock_bench.waf import journal

    rec = tmp_path / "w.jsonl"
    dev = tmp_path / "d.img"
    (r,) = replay(capsys, dev, "--size", "32M", "--chunk-bytes", "120K", "--workload", "lmcache_defaults",
                  "--meta-format", "log", "--extent-bytes", "2044K", "--eviction", "extent", "--load",
                  "--dealloc", "on", "--warmup", "1", "--measure", "1", "--meta-bytes", "1M", "--record", str(rec))
    assert r["recorded"]["data_base_offset"] == 1 << 20  # --meta-bytes: the metadata region's size
    assert r["meta_format"] == "log" and r["core"]["extent_stride"] == 2044 * 1024 and r["core"]["extent_tail_bytes"]
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    writes = [x for x in lines if x["op"] == "write"]
    deallocs = [x for x in lines if x["op"] == "deallocate"]
    assert sum(x["length"] for x in writes) == r["core_write_bytes"] == r["recorded"]["write_bytes"]
    base = r["recorded"]["data_base_offset"]
    meta = [x for x in writes if x["offset"] < base]
    assert meta and r["recorded"]["meta_write_bytes"] == sum(x["length"] for x in meta) > 0
    # whole extents deallocated: each range one stride long, starting on an extent boundary
    assert deallocs and r["core"]["extents_evicted"] > 0
    stride, ext0 = r["core"]["extent_stride"], r["core"]["extent_base_offset"]
    assert all(x["length"] == stride and (x["offset"] - ext0) % stride == 0 for x in deallocs)
    # the stream's writes and deallocations, applied in order, leave the file's data blocks
    live: set = set()
    for x in lines:
        blocks = set(range(x["offset"] // 4096, -(-(x["offset"] + x["length"]) // 4096)))
        if x["op"] == "write":
            live |= blocks
        else:
            live -= blocks
    # (the data area: the core's closing checkpoint, after the journal stopped, writes metadata)
    first = base // 4096
    assert {b for b in live if b >= first} == {b for b in _allocated(dev) if b >= first}
    # journal files: a log with bytes is refused by the reader, naming it
    bad = tmp_path / "bad.journal"
    bad.write_bytes(b"RBWLOG01" + journal.HEADER.pack(1, 0, 0, 0, 0, 8, 0) + b"x" * 8)
    with pytest.raises(ValueError, match="write log, not a journal"):
        list(journal.records(str(bad)))


def test_the_write_journal_is_exactly_what_the_core_wrote(tmp_path):
    """The core's write journal (_set_write_journal) on a log-format core: every write's offset
    and length, in order, the deallocations in between; its bytes equal the device's
    write_completed_bytes, each put's slot write sits at the key's entry offset, and the
    journal stops recording when set to None."""
    import io

    from lmcache_rawblock import _native
    from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig, encode_object_key
    from lmcache_rawblock.raw_block._lmcache import ObjectKey
    from lmcache_rawblock_bench.core import config_kwargs
    from lmcache_rawblock_bench.waf import journal
    from lmcache_rawblock_bench.waf.replay import _Obj

    dev, jp = tmp_path / "d.img", tmp_path / "j.journal"
    with open(dev, "wb") as f:
        f.truncate(16 << 20)
    cfg = RawBlockCoreConfig(**config_kwargs(str(dev), capacity_bytes=16 << 20, slot_bytes=8192,
                                             meta_total_bytes=1 << 20, meta_format="log",
                                             load_checkpoint_on_init=False, allow_foreign_device=True,
                                             deallocate_freed="on"))
    specs = [encode_object_key(ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="m", kv_rank=0,
                                         cache_salt="")) for i in range(40)]
    _native._set_write_journal(str(jp))
    try:
        core = RawBlockCore(cfg, key_namespace="object")
        try:
            core.put_many(specs, [_Obj(1000 + i) for i in range(40)])
            core.checkpoint_now()
            assert all(core.delete_many([s.encoded for s in specs[:10]], force=True))
            core.reclaim_held_slots()
            offsets = {s.encoded: core.entry_offset(s.encoded) for s in specs[10:]}
            st = core._native.status()
            written, base = st["io"]["write_completed_bytes"], st["data_base_offset"]
        finally:
            _native._set_write_journal(None)
            core.close()
    finally:
        _native._set_write_journal(None)
    out = io.StringIO()
    c = journal.to_stream(str(jp), str(dev), out, meta_end=base)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert c.write_bytes == written and c.meta_write_bytes > 0 and c.other_files == 0
    # each live key's slot: its header and its payload written there (the bytes inside the slot)
    for i, s in enumerate(specs[10:], 10):
        off = offsets[s.encoded]
        inside = [x for x in lines if x["op"] == "write" and off <= x["offset"] < off + 8192]
        assert min(x["offset"] for x in inside) == off
        assert sum(x["length"] for x in inside) == 4096 + 1000 + i, (i, inside)
    assert c.deallocs > 0 and sum(x["length"] for x in lines if x["op"] == "deallocate") % 8192 == 0
    # nothing after the journal stopped: the closing checkpoint is not in it
    assert c.writes == sum(1 for x in lines if x["op"] == "write")



def test_hit_trace_is_each_lookup_in_order_warm_up_included(tmp_path, capsys):
    """--hit-trace: one byte per lookup (1 a hit), the warm-up's first, so a window's hits are
    the sum over its lookups' slice; the same workload gives the same lookups under any eviction."""
    trace = tmp_path / "hits.bin"
    (r,) = replay(capsys, tmp_path / "d.img", "--warmup", "1", "--measure", "1", "--hit-trace", str(trace))
    t = trace.read_bytes()
    w, ops = r["warmup_ops"], r["ops"]
    assert set(t) == {0, 1}
    assert len(t) == w["lookups"] + ops["lookups"]
    assert sum(t[:w["lookups"]]) == w["hits"] and sum(t[w["lookups"]:]) == ops["hits"] > 0


def test_window_in_data_bytes_counts_the_chunks_writes_only(tmp_path, capsys):
    """--window-bytes data: the warm-up and the window end on the chunks' slot writes, so a
    format v1 run, whose key-level evictions each checkpoint the whole index, covers as many
    puts of the workload as the window says rather than stopping on its checkpoints' bytes."""
    args = ["--meta-format", "v1", "--dealloc", "on", "--checkpoint-every", "50", "--warmup", "0.5", "--measure", "1"]
    (every,) = replay(capsys, tmp_path / "a.img", *args)
    (data,) = replay(capsys, tmp_path / "b.img", *args, "--window-bytes", "data")
    assert every["window_bytes"] == "all" and data["window_bytes"] == "data"
    w, ops = data["warmup_ops"], data["ops"]
    assert w["chunk_write_bytes"] >= data["warmup_bytes"] and ops["chunk_write_bytes"] >= data["measure_bytes"]
    assert ops["checkpoint_bytes"] > 0 and ops["bytes_written"] == ops["chunk_write_bytes"] + ops["checkpoint_bytes"]
    # counted in every byte written, the checkpoints' share of the window leaves fewer chunks
    assert every["ops"]["bytes_written"] >= every["measure_bytes"] > every["ops"]["chunk_write_bytes"]
    assert ops["puts_stored"] > every["ops"]["puts_stored"] and ops["lookups"] > every["ops"]["lookups"]


def test_trace_lookups_carries_the_hit_trace_past_the_window_and_nothing_else(tmp_path, capsys):
    """--trace-lookups N: the hit trace goes on until it holds N lookups; the run's counts, its
    window and its trace up to the window's end are those of the run without it."""
    args = ["--warmup", "0.5", "--measure", "0.5", "--hit-trace"]
    (r,) = replay(capsys, tmp_path / "a.img", *args, str(tmp_path / "a.bin"))
    short = (tmp_path / "a.bin").read_bytes()
    (r2,) = replay(capsys, tmp_path / "b.img", *args, str(tmp_path / "b.bin"), "--trace-lookups", str(len(short) + 200))
    long = (tmp_path / "b.bin").read_bytes()
    assert len(short) == r["warmup_ops"]["lookups"] + r["ops"]["lookups"]
    assert len(long) >= len(short) + 200 and long[:len(short)] == short
    assert r2["ops"] == r["ops"] and r2["warmup_ops"] == r["warmup_ops"] and r2["core"] == r["core"]
    assert "--hit-trace" in error(capsys, "--device", str(tmp_path / "c.img"), *SMALL, "--trace-lookups", "10")
