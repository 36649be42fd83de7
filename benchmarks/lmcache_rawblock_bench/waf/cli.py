"""``python -m lmcache_rawblock waf ...``: the write-amplification tools.

* ``waf simulate``: a workload (generated, a JSON-lines trace, or a recorded write stream) on a
  simulated FDP drive, WAF per placement mode;
* ``waf generate``: write the LMCache-shaped workload as a JSON-lines trace;
* ``waf study``: the simulated study (the endurance table: LMCache's default store pattern and
  the study's workload, 95% and 100% utilisation, 1x-8x concurrency, 7% and 28% spare, both
  metadata formats, 1 GiB and 16 GiB reclaim units, per lever; with ``--parts levers,sweep``
  every lever at 50-100% and the reclaim unit and chunk size sweep; validation; published
  anchors) into results.json, summary.md and PNG plots;
* ``waf replay``: the same workload through our real core on a device or file, with the drive's
  wear counters read around the measured window (WAF, op counts, write latency), and the
  device write stream it produced (``--record``, for ``waf simulate --stream``, which with
  ``--fit-util`` and ``--stream-warmup`` gives the steady-state WAF of the real core's own
  decisions; ``python -m lmcache_rawblock_bench.waf.replaycheck`` sets the model beside it);
* ``waf precondition``: bring a real drive to steady state before measuring it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from . import stream
from .ftl import ISOLATIONS, POLICIES, FlashSim, Geometry
from .workload import WORKLOADS, WorkloadSpec

PROG = "python -m lmcache_rawblock waf"


def _geometry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ru-pages", type=int, default=1024,
                   help="pages per reclaim unit (default 1024: 1 GiB with 1 MiB pages)")
    p.add_argument("--rus", type=int, default=256, help="reclaim units (default 256)")
    p.add_argument("--groups", type=int, default=1, help="reclaim groups (default 1)")
    p.add_argument("--op", type=float, default=0.1, help="over-provisioning, spare / logical (default 0.1)")
    p.add_argument("--page-bytes", type=int, default=1 << 20, help="bytes per simulated page (default 1 MiB)")
    p.add_argument("--handles", type=int, default=8,
                   help="placement handles (default 8: separated placement uses up to 4 for data and 1 for "
                        "checkpoints)")
    p.add_argument("--gc", choices=POLICIES, default="greedy", help="victim choice (default greedy)")
    p.add_argument("--isolation", choices=ISOLATIONS, default="initial",
                   help="handle isolation: initial (GC mixes handles) or persistent (default initial)")


def _evict_ahead(text: str):
    if text in ("off", "none", ""):
        return None
    try:
        trig, ratio = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TRIGGER,RATIO (e.g. 0.95,0.05) or off, got {text!r}") from None
    return (trig, ratio)


def add_arguments(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser("waf", help="SSD write-amplification tools: simulate, generate, study, replay, precondition",
                       description="SSD write-amplification (WAF) tools for LMCache's SSD tier.")
    ws = w.add_subparsers(dest="waf_command", metavar="WAF_COMMAND")
    ws.required = True
    s = ws.add_parser("simulate", help="WAF of a workload on a simulated FDP drive",
                      description="Run a workload through the cache model onto a simulated FDP drive and report "
                                  "the WAF in steady state, per placement mode.")
    _geometry_args(s)
    s.add_argument("--mode", default="no_fdp,mixed,separated",
                   help="comma-separated modes: no_fdp, mixed, ckpt_apart, separated (default no_fdp, mixed, "
                        "separated)")
    s.add_argument("--strategy", default="tp_worker",
                   help=f"comma-separated strategies for separated: {', '.join(stream.STRATEGIES)} (default tp_worker)")
    s.add_argument("--util", type=float, default=0.95, help="fraction of the logical space the cache uses (0.95)")
    s.add_argument("--admission", choices=("always", "second_hit"), default="always")
    s.add_argument("--warmup", type=float, default=2.0, help="drive writes before measuring (default 2)")
    s.add_argument("--measure", type=float, default=2.0, help="drive writes measured (default 2)")
    s.add_argument("--dealloc", nargs="?", const="on", default="off", choices=("on", "off"),
                   help="deallocate freed slots when they become reusable (the core's deallocate_freed; "
                        "--dealloc alone: on; default off)")
    s.add_argument("--reuse", choices=stream.REUSE_ORDERS, default="lifo",
                   help="freed-slot reuse order: lifo (the core today), fifo, ru_groups (RU-sized groups, "
                        "region eviction) (default lifo)")
    s.add_argument("--evict-ahead", type=_evict_ahead, default=None, metavar="TRIGGER,RATIO",
                   help="the plugin's evict-ahead, e.g. 0.95,0.05 (default off: evict on demand)")
    s.add_argument("--meta-format", choices=stream.META_FORMATS, default="log",
                   help="checkpoint format: log (the core's default) or v1 (default log)")
    s.add_argument("--chunk-bytes", type=int, default=8 << 20,
                   help="slot bytes (header and one worker's KV of a full chunk) (default 8 MiB)")
    s.add_argument("--trace", metavar="FILE", help="a JSON-lines trace instead of the generator")
    s.add_argument("--stream", metavar="FILE", help="a recorded write stream (--record): replayed on the drive, "
                                                    "no cache model")
    s.add_argument("--stream-warmup", type=float, default=None, metavar="DRIVE_WRITES",
                   help="with --stream: also report the WAF of the window after this many drive writes of the "
                        "stream (the steady state), beside the WAF from the start")
    s.add_argument("--fit-util", type=float, default=None, metavar="U",
                   help="with --stream: size the drive from the stream (--page-bytes, --ru-pages, --op kept; "
                        "--rus computed) so that its span is U of the logical space")
    s.add_argument("--record", metavar="FILE", help="also write the write stream of the first mode to FILE")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--workload", choices=tuple(WORKLOADS), default="study",
                   help="store pattern of the generator: study (decode and partial chunks stored) or "
                        "lmcache_defaults (save_decode_cache and save_unfull_chunk false: full chunks at prefill)")
    s.add_argument("--concurrency", type=int, default=32, help="generator: conversations in flight (default 32)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g = ws.add_parser("generate", help="write the LMCache-shaped workload as a JSON-lines trace")
    g.add_argument("--requests", type=int, default=2000)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--tp", type=int, default=2)
    g.add_argument("--workload", choices=tuple(WORKLOADS), default="study", help="store pattern (default study)")
    g.add_argument("--families", type=int, default=2000, help="shared prefixes (default 2000)")
    g.add_argument("--concurrency", type=int, default=32, help="conversations in flight (default 32)")
    g.add_argument("--chunk-bytes", type=int, default=16 << 20,
                   help="KV bytes of a full chunk over all workers (default 16 MiB)")
    g.add_argument("--out", default="-", help="file (default stdout)")
    st = ws.add_parser("study", help="the simulated study into results.json, summary.md and PNG plots",
                       description="The endurance table (LMCache's default store pattern and the study's workload, "
                                   "utilisation, concurrency, drive spare, metadata format, RU size, per lever), "
                                   "validation and anchors (about 12 minutes on 2 cores); --parts adds every lever "
                                   "at 1 GiB reclaim units and the RU-size and chunk-size sweep.")
    st.add_argument("--parts", default="endurance",
                    help="comma-separated: endurance, levers, sweep (default endurance)")
    st.add_argument("--workloads", default="lmcache_defaults,study", help="endurance: store patterns")
    st.add_argument("--concurrency", default="1,2,4,8", help="endurance: conversations in flight, multiples of 32")
    st.add_argument("--spares", default="0.07,0.28", help="endurance: drive over-provisioning")
    st.add_argument("--formats", default="log,v1", help="endurance: metadata formats")
    st.add_argument("--endurance-ru-sizes", default="1G,16G", help="endurance: reclaim unit sizes")
    st.add_argument("--out", default="benchmarks/results/waf", help="directory (default benchmarks/results/waf)")
    st.add_argument("--utils", default=None, help="utilisations (default 0.95,1.0 for endurance, "
                                                   "0.5,0.8,0.95,1.0 for levers and sweep)")
    st.add_argument("--repeats", type=int, default=2, help="seeds per lever cell (default 2)")
    st.add_argument("--sweep-repeats", type=int, default=1, help="seeds per sweep cell (default 1)")
    st.add_argument("--ru-sizes", default="256M,1G,4G,16G", help="reclaim unit sizes of the sweep")
    st.add_argument("--chunks", default="8M,32M", help="chunk (slot) sizes of the sweep")
    st.add_argument("--levers", default="all", help="comma-separated levers of the headline table (default all)")
    st.add_argument("--warmup", type=float, default=None, help="drive writes (default 1.5 endurance, 2 otherwise)")
    st.add_argument("--measure", type=float, default=None, help="drive writes (default 1.5 endurance, 2 otherwise)")
    st.add_argument("--jobs", type=int, default=0, help="processes (default: one per CPU)")
    st.add_argument("--no-plots", action="store_true")
    st.add_argument("--no-checks", action="store_true", help="skip the validation and anchor runs")
    from . import replay

    rp = ws.add_parser("replay", help="the workload through our real core on a device or file, WAF from the "
                                      "drive's counters",
                       description="Run the LMCache-shaped workload (or a trace) through our real core on a device "
                                   "or file, per placement mode, and measure a window: the drive's wear counters "
                                   "(WAF where the drive reports it), op counts, write latency.")
    replay.add_arguments(rp)
    pre = _precondition()
    if pre is not None:
        pc = ws.add_parser("precondition", help="bring a drive to steady state before measuring it")
        pre.add_arguments(pc)


def _precondition():
    try:
        from . import precondition
    except ImportError:
        return None
    return precondition


def _err(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return 2


def _split(text: str, allowed, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise ValueError(f"--{what} {text!r}: choose from {', '.join(allowed)}")
    return items


def _geometry(a) -> Geometry:
    return Geometry(ru_pages=a.ru_pages, n_rus=a.rus, n_groups=a.groups, op=a.op, max_handles=a.handles,
                    page_bytes=a.page_bytes)


def cmd_simulate(a) -> int:
    from .run import simulate_lmcache

    try:
        geometry = _geometry(a)
        modes = _split(a.mode, stream.MODES, "mode")
        strategies = _split(a.strategy, stream.STRATEGIES, "strategy")
    except ValueError as exc:
        return _err(str(exc))
    if a.stream:
        try:
            r = simulate_stream(a.stream, geometry, policy=a.gc, isolation=a.isolation, fit_util=a.fit_util,
                                warmup=a.stream_warmup)
        except (OSError, ValueError, RuntimeError) as exc:
            return _err(str(exc))
        if a.json:
            print(json.dumps(r, indent=1))
        else:
            w = f", WAF {r['window_waf']:.3f} after {a.stream_warmup} drive writes" if "window_waf" in r else ""
            print(f"{a.stream}: {r['records']} records on {r['geometry']['n_rus']} RUs of {r['geometry']['ru_pages']} "
                  f"pages, WAF {r['waf']:.3f} (from the start){w}")
        return 0
    configs = [(m, None) for m in modes if m != "separated"]
    if "separated" in modes:
        configs += [("separated", s) for s in strategies]
    results = []
    for mode, strat in configs:
        try:
            if a.trace or a.record:
                r = _simulate_io(a, geometry, mode, strat, record=a.record if not results else None)
            else:
                r = simulate_lmcache(geometry, _spec(a), util=a.util, mode=mode, strategy=strat,
                                     admission=a.admission, policy=a.gc, isolation=a.isolation, warmup=a.warmup,
                                     measure=a.measure, dealloc=a.dealloc == "on", reuse=a.reuse,
                                     evict_ahead=a.evict_ahead, meta_format=a.meta_format)
        except (OSError, ValueError, RuntimeError) as exc:
            return _err(str(exc))
        results.append(r)
    if a.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{'placement':28} {'WAF':>7} {'host GiB':>9} {'hit ratio':>9}")
    for r in results:
        lab = r["mode"] if r["mode"] != "separated" else f"separated:{r['strategy']}"
        host = r["window"]["host_pages"] * geometry.page_bytes / 2**30
        hr = r["cache"].get("hit_ratio")
        print(f"{lab:28} {r['waf']:7.3f} {host:9.1f} {hr if hr is None else round(hr, 3)!s:>9}")
    return 0


def fit_geometry(span: int, util: float, geometry: Geometry) -> Geometry:
    """``geometry`` with as many RUs as make ``span`` bytes ``util`` of its logical space."""
    from dataclasses import replace

    if not 0 < util <= 1:
        raise ValueError(f"--fit-util must be in (0, 1] (the stream's span over the logical space), got {util!r}")
    pages = -(-int(span / util) // geometry.page_bytes)
    data_rus = -(-int(pages * (1 + geometry.op)) // geometry.ru_pages) + 1
    n = data_rus + geometry.reserve_rus
    n += (-n) % geometry.n_groups
    return replace(geometry, n_rus=n)


def simulate_stream(path: str, geometry: Geometry, *, policy: str = "greedy", isolation: str = "initial",
                    fit_util: Optional[float] = None, warmup: Optional[float] = None) -> dict:
    """A recorded write stream (``waf replay --record``: the real core's slot writes,
    checkpoints and deallocations) on the simulated drive: WAF from the start and, with
    ``warmup``, over the window after that many drive writes."""
    if fit_util is not None:
        with open(path) as f:
            geometry = fit_geometry(stream.stream_span(f, source=path), fit_util, geometry)
    if warmup is not None and not warmup >= 0:
        raise ValueError(f"--stream-warmup must be >= 0 drive writes, got {warmup!r}")
    sim = FlashSim(geometry, policy=policy, isolation=isolation)
    marked = []

    def mark():
        sim.mark()
        marked.append(True)

    with open(path) as f:
        n = stream.replay_stream(f, stream.SimSink(sim), source=path, on_mark=mark,
                                 mark_after=None if warmup is None else int(warmup * geometry.logical_bytes))
    r = {"stream": path, "records": n, "geometry": geometry.to_dict(), "waf": sim.counters.waf(),
         "counters": sim.counters.to_dict()}
    if warmup is not None:
        if not marked:
            raise ValueError(f"--stream-warmup {warmup}: the stream {path} ends within its first {warmup} drive "
                             f"writes ({sim.counters.host_pages * geometry.page_bytes} bytes written, a drive "
                             f"write is {geometry.logical_bytes})")
        r["window"] = sim.window().to_dict()
        r["window_waf"] = sim.window().waf()
        r["window_drive_writes"] = sim.window().host_pages / geometry.logical_pages
    return r


def _spec(a) -> WorkloadSpec:
    from .run import spec_for_slot

    return spec_for_slot(WorkloadSpec(seed=a.seed, concurrency=a.concurrency, **WORKLOADS[a.workload]), a.chunk_bytes)


def _simulate_io(a, geometry: Geometry, mode: str, strat: Optional[str], record: Optional[str]) -> dict:
    """A trace file and/or a recorded stream: the whole input, WAF from the start and over the
    part after ``--warmup`` drive writes."""
    from lmcache_rawblock.admission import Admission
    from .run import slot_bytes_for
    from .workload import generate, read_trace

    sim = FlashSim(geometry, policy=a.gc, isolation=a.isolation)
    sink = stream.SimSink(sim)
    rec_file = open(record, "w") if record else None
    try:
        if rec_file:
            rec = stream.Recorder(rec_file)
            inner = sink

            class Tee:
                def write_bytes(self, o, n, p):
                    rec.write_bytes(o, n, p)
                    inner.write_bytes(o, n, p)

                def dealloc_bytes(self, o, n):
                    rec.dealloc_bytes(o, n)
                    inner.dealloc_bytes(o, n)

            sink = Tee()
        spec = _spec(a)
        slot = slot_bytes_for(spec, geometry)
        cfg = stream.CacheConfig(capacity_bytes=int(a.util * geometry.logical_bytes),
                                 meta_total_bytes=4 * geometry.page_bytes, slot_bytes=slot, dealloc=a.dealloc == "on",
                                 tp=spec.tp, reuse=a.reuse, evict_ahead=a.evict_ahead, meta_format=a.meta_format,
                                 meta_io_bytes=geometry.page_bytes,
                                 group_slots=max(1, geometry.ru_pages * geometry.page_bytes // slot))
        model = stream.CacheModel(cfg, mode, strat, sink, Admission(a.admission))
        if a.trace:
            with open(a.trace) as f:
                events = read_trace(f, source=a.trace)
                model.feed(events, stop_bytes=int(a.warmup * geometry.logical_bytes))
                sim.mark()
                model.feed(events)
        else:
            from dataclasses import replace

            events = generate(replace(spec, requests=0))
            model.feed(events, stop_bytes=int(a.warmup * geometry.logical_bytes))
            sim.mark()
            model.feed(events, stop_bytes=int((a.warmup + a.measure) * geometry.logical_bytes))
    finally:
        if rec_file:
            rec_file.close()
    return {"mode": mode, "strategy": strat, "waf": sim.window().waf(), "window": sim.window().to_dict(),
            "cumulative_waf": sim.counters.waf(), "cache": model.stats.to_dict()}


def cmd_generate(a) -> int:
    from .workload import generate, write_trace

    try:
        spec = WorkloadSpec(requests=a.requests, seed=a.seed, tp=a.tp, families=a.families,
                            concurrency=a.concurrency, chunk_bytes=a.chunk_bytes, **WORKLOADS[a.workload])
    except ValueError as exc:
        return _err(str(exc))
    if a.out == "-":
        write_trace(generate(spec), sys.stdout, spec)
    else:
        try:
            with open(a.out, "w") as f:
                n = write_trace(generate(spec), f, spec)
        except OSError as exc:
            return _err(f"--out {a.out}: {exc.strerror or exc}")
        print(f"wrote {n} events to {a.out}", file=sys.stderr)
    return 0


def cmd_study(a, argv: list[str]) -> int:
    from ..common import parse_size
    from . import study

    try:
        parts = _split(a.parts, ("endurance", "levers", "sweep"), "parts")
        utils = tuple(float(u) for u in a.utils.split(",")) if a.utils else None
        tasks = []
        if "endurance" in parts:
            tasks += study.endurance_tasks(
                workloads=tuple(_split(a.workloads, tuple(WORKLOADS), "workloads")), utils=utils or (0.95, 1.0),
                concurrency=tuple(int(x) for x in a.concurrency.split(",")),
                ops=tuple(float(x) for x in a.spares.split(",")), formats=tuple(_split(a.formats, stream.META_FORMATS,
                                                                                        "formats")),
                ru_sizes=tuple(parse_size(x) for x in a.endurance_ru_sizes.split(",")),
                warmup=1.5 if a.warmup is None else a.warmup, measure=1.5 if a.measure is None else a.measure)
        if "levers" in parts or "sweep" in parts:
            sweep = "sweep" in parts
            rus = tuple(parse_size(x) for x in a.ru_sizes.split(",")) if sweep else ()
            chunks = tuple(parse_size(x) for x in a.chunks.split(",")) if sweep else ()
            levers = tuple(study.LEVERS) if a.levers == "all" else tuple(_split(a.levers, tuple(study.LEVERS),
                                                                                "levers"))
            tasks += study.study_tasks(utils=utils or (0.5, 0.8, 0.95, 1.0),
                                       levers=levers if "levers" in parts else (), repeats=a.repeats,
                                       warmup=2.0 if a.warmup is None else a.warmup,
                                       measure=2.0 if a.measure is None else a.measure, sweep_ru=rus,
                                       sweep_slot=chunks, sweep_repeats=a.sweep_repeats,
                                       ru_counts=(64, 128, 256, 512) if sweep else ())
    except ValueError as exc:
        return _err(str(exc))
    print(f"{len(tasks)} runs; scale: {study.N_RUS} reclaim units per drive ({study.MIN_RUS} where that passes "
          f"{study.MAX_PAGES} pages), the real RU / chunk ratio", file=sys.stderr)

    def progress(i, n, r):
        v = " ".join(f"{k}={x}" for k, x in sorted(r.get("variant", {}).items()))
        print(f"[{i}/{n}] {r['part']} {r['geometry_tag']} {v} util {r['util']} {r['lever']}: WAF {r['waf']:.3f} "
              f"({r.get('seconds', '-')} s)", file=sys.stderr, flush=True)

    res = study.run_study(tasks, jobs=a.jobs, progress=progress)
    val = anc = None
    if not a.no_checks:
        val, anc = study.validation(), study.anchors()
    files = study.write_study(a.out, res, val, anc, argv, plot=not a.no_plots)
    print("wrote: " + ", ".join(files))
    return 0


def main(args, argv: Optional[list[str]] = None) -> int:
    if args.waf_command == "simulate":
        return cmd_simulate(args)
    if args.waf_command == "generate":
        return cmd_generate(args)
    if args.waf_command == "study":
        return cmd_study(args, argv or [PROG, "study"])
    if args.waf_command == "replay":
        from . import replay

        return replay.main(args, argv or [PROG, "replay"])
    if args.waf_command == "precondition":
        return _precondition().main(args)
    return _err(f"unknown waf command {args.waf_command!r}")
