"""The command line of the benchmark harness and the write-amplification study.

``python -m lmcache_rawblock bench ...`` and ``python -m lmcache_rawblock waf ...`` (the runtime's
command line hands both to ``main`` here when this package is installed), or the same two commands
under ``python -m lmcache_rawblock_bench``. ``bench`` measures our RawBlockDevice against the Rust
wheel (lmcache-rust-raw-block-io) and our io_uring engine against fio on a scratch file or device,
and our RawBlockCore, recovery and storage plugin against LMCache's; it prints tables and the goals
the run measured, and writes results.json, summary.txt and PNG plots. ``waf`` simulates SSD write
amplification per FDP placement strategy (``lmcache_rawblock_bench.waf``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import lmcache_rawblock_bench as bench

from . import common, core, report
from .common import parse_size
from .target import TargetError, open_target
from .waf import cli as waf_cli

PROG = "python -m lmcache_rawblock"
DEFAULT_SIZE = "1G"
PUBLIC_SUITES = ("quick", "full")
HIDDEN_SUITES = ("smoke",)


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sizes_arg(text: str) -> list[int]:
    out = []
    for item in text.split(","):
        try:
            n = parse_size(item)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if n % 4096:
            raise argparse.ArgumentTypeError(
                f"invalid block size {item.strip()!r}: must be a multiple of 4 KiB (O_DIRECT needs aligned sizes)"
            )
        out.append(n)
    return out


def _counts_arg(text: str) -> list[int]:
    """Entry counts: 100000, 100k, 1M, 10M (decimal multipliers)."""
    mult = {"": 1, "k": 1000, "m": 1000 ** 2}
    out = []
    for item in text.split(","):
        t = item.strip().lower()
        num, unit = (t[:-1], t[-1]) if t and t[-1] in "km" else (t, "")
        try:
            n = int(float(num) * mult[unit])
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid entry count {item.strip()!r}: e.g. 100k, 1M, 10M") from None
        if n <= 0:
            raise argparse.ArgumentTypeError(f"invalid entry count {item.strip()!r}: must be greater than zero")
        out.append(n)
    return sorted(set(out))


def _list_arg(allowed: Sequence[str], what: str):
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty {what} list {text!r}: choose from {', '.join(allowed)}")
        bad = [x for x in items if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(repr(b) for b in bad)} in {text!r}: choose from {', '.join(allowed)}"
            )
        return list(dict.fromkeys(items))

    return parse


def _suite_arg(text: str) -> str:
    if text in PUBLIC_SUITES or text in HIDDEN_SUITES:
        return text
    raise argparse.ArgumentTypeError(f"invalid suite {text!r}: choose from {', '.join(PUBLIC_SUITES)}")


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: expected a positive integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: must be at least 1")
    return n


def add_bench_command(sub: argparse._SubParsersAction) -> None:
    """The ``bench`` command and its options."""
    b = sub.add_parser(
        "bench",
        help="benchmark against LMCache's Rust device, LMCache's core and plugin, and fio",
        description=(
            "Benchmark lmcache_rawblock's RawBlockDevice against LMCache's Rust device "
            "(lmcache_rust_raw_block_io; interleaved in one process, medians, ratio = our time / Rust's, "
            "lower is better), our io_uring engine against fio on the same file or device, and our "
            "RawBlockCore, slot-header recovery and storage plugin against LMCache's (speed-up = LMCache's "
            "time / ours). Without --device a sparse file in a temporary directory is used and removed "
            "afterwards; the core, recovery and plugin parts always use sparse files of their own."
        ),
    )
    b.add_argument("--device", metavar="PATH",
                   help="scratch file or block device to benchmark on (its contents are overwritten; "
                        "refused when blkid finds a file system or partition table, unless --force)")
    b.add_argument("--size", type=_size_arg, metavar="SIZE",
                   help=f"size of the temporary sparse file (default {DEFAULT_SIZE}), or how much of "
                        "--device to use; e.g. 256M, 4G")
    b.add_argument("--engines", type=_list_arg(bench.ENGINES, "engine"), default=list(bench.DEFAULT_ENGINES),
                   metavar="LIST",
                   help="comma-separated engines: posix (pread_into/pwrite_from_buffer latency), "
                        "io_uring (batched throughput), uring_cmd (NVMe passthrough: reported, not measured "
                        "on files); default posix,io_uring")
    b.add_argument("--suite", type=_suite_arg, default="quick", metavar="{quick,full}",
                   help="quick (default, a few minutes; core at 1k entries, reduced grids) or full "
                        "(core at 1k/10k/100k entries on both engines, every grid, more rounds, depths and fio time)")
    b.add_argument("--out", default="bench-out", metavar="DIR",
                   help="directory for results.json, summary.txt and PNG plots (default ./bench-out)")
    b.add_argument("--install-competitors", action="store_true",
                   help="pip install missing competitors first: lmcache-rust-raw-block-io into this "
                        "Python; for core/recovery/plugin torch==2.13.0 then lmcache (the newest tested version) into a separate directory "
                        "(LMCACHE_RAWBLOCK_COMPETITORS, default ~/.cache/lmcache-rawblock/...); carries on "
                        "if that fails")
    b.add_argument("--force", action="store_true",
                   help="use --device even if it holds a file system or partition table")
    b.add_argument("--sizes", type=_sizes_arg, metavar="LIST",
                   help="override the suite's block sizes, e.g. 4k,1M (multiples of 4 KiB)")
    b.add_argument("--repeats", type=_positive_int, metavar="N",
                   help="override the number of interleaved repeat rounds")
    b.add_argument("--parts", type=_list_arg(bench.PART_NAMES, "part"), default=list(bench.DEFAULT_PARTS),
                   metavar="LIST",
                   help="parts to run: device (per-call latency vs the Rust device), uring (io_uring batches vs "
                        "the Rust device), limit (io_uring stream vs fio), core (RawBlockCore vs LMCache's, per-key "
                        "CPU beside the kernel floor, checkpoint flush cost), recovery (slot-header validation), "
                        "plugin (batched_remove, eviction under contention), e2e (LMCache's plugin store/retrieve path "
                        "with its LocalCPUBackend, ours vs LMCache's plugin, beside fio), mp (LMCache's MP L2 tier under its "
                        "kv-tier-pressure workload's requests, our MP adapter vs LMCache's raw-block adapter; needs "
                        "LMCache 0.5.7), mpevict (MP mode's L2 eviction over extents: LMCache's LRU controller "
                        "against our adapter's whole-extent eviction), loadcheck (what the "
                        "load-time slot-header check costs a load, on against off, on tmpfs and disk), dealloc (an "
                        "eviction batch, delete_many and the checkpoint that frees its slots, and the puts after "
                        "it, with deallocate_freed on against off, on a file and a loop device), scale (both "
                        "metadata formats and LMCache's core: checkpoint after churn beside a full base, bytes per "
                        "entry, reopen beside fio, index memory against index size, puts on a full cache), "
                        "histcost (what recording the core's histograms costs a put and a load, on against off), "
                        "prefix (eviction_policy prefix against lru: a multi-turn conversation trace through the "
                        "plugin at 25/50/100 %% of its working set, tokens served, reachable bytes, per-put CPU), "
                        "drives (root; the cache over N capped RAM devices: store and load bandwidth as a share of "
                        "N x cap beside fio and LMCache's core, CPU per GB against N, load latency under stores; "
                        "only when named), loadcost (root; cost-aware loads on capped RAM devices saturated by "
                        "stores: loads finishing after recompute and mean time to data, priced prefix lookup on "
                        "against off; only when named); default all but drives and loadcost")
    b.add_argument("--scale-entries", type=_counts_arg, metavar="LIST",
                   help="index sizes of the scale part's checkpoint, reopen and memory rows, e.g. 1M,10M "
                        "(default: the suite's; 10M takes about 11 GiB of page cache and several minutes)")
    b.add_argument("--drives", type=_counts_arg, metavar="LIST", dest="drives_n",
                   help="the drives part's device counts, e.g. 1,2,4,8 (default: the suite's)")
    b.add_argument("--drives-seconds", type=float, metavar="S",
                   help="the drives part's seconds per bandwidth figure (default: the suite's)")
    b.add_argument("--drives-backend", choices=("zram", "loop"),
                   help="the drives and loadcost parts' devices: zram (default; every engine's bytes charged once) or loop "
                        "(tmpfs files; io_uring requests the loop device splits are charged twice)")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    b.add_argument("--no-plots", action="store_true", help="do not write PNG plots")


def add_waf_command(sub: argparse._SubParsersAction) -> None:
    """The ``waf`` command and its subcommands (lmcache_rawblock_bench.waf)."""
    waf_cli.add_arguments(sub)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The parser of ``python -m lmcache_rawblock_bench``: the bench and waf commands."""
    parser = argparse.ArgumentParser(prog=prog, description="lmcache_rawblock's benchmark harness and "
                                                            "write-amplification study.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_bench_command(sub)
    add_waf_command(sub)
    return parser


def _show_path(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _err(msg: str, prog: str = PROG) -> None:
    print(f"{prog} bench: error: {msg}", file=sys.stderr)


def cmd_bench(args: argparse.Namespace, argv: list[str], prog: str = PROG) -> int:
    if not bench.planned_parts(bench.Options(engines=args.engines, parts=args.parts)):
        _err(f"--engines {','.join(args.engines)} with --parts {','.join(args.parts)}: nothing to run "
             "(device needs the posix engine; uring, limit and recovery the io_uring engine; core and "
             "loadcheck posix or io_uring)", prog)
        return 2
    notes: list[str] = []
    core_comps = _core_competitors(args, notes)
    comps = [common.ours(), common.rust()]
    if not comps[1].available and args.install_competitors and comps[1].install:
        print(f"installing competitor: {sys.executable} -m pip install {common.RUST_DIST}", file=sys.stderr)
        ok, msg = common.install_competitors()
        notes.append(msg if ok else f"--install-competitors: {msg}; continuing without it")
        comps[1] = common.rust()
    elif not comps[1].available and comps[1].install:
        notes.append(f"rust competitor not installed: add it with `{comps[1].install}` or --install-competitors")

    try:
        target = open_target(args.device, args.size, force=args.force, default_size=common.parse_size(DEFAULT_SIZE))
    except TargetError as exc:
        _err(str(exc), prog)
        return 2
    out = os.path.abspath(args.out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        target.cleanup()
        _err(f"--out {args.out}: cannot create the directory: {exc.strerror or exc}", prog)
        return 2

    opts = bench.Options(
        suite=args.suite,
        engines=args.engines,
        parts=args.parts,
        sizes=args.sizes,
        repeats=args.repeats,
        scale_entries=args.scale_entries,
        drives_n=args.drives_n,
        drives_seconds=args.drives_seconds,
        drives_backend=args.drives_backend,
        progress=not args.no_progress,
        argv=argv,
    )
    with target:
        try:
            results = bench.run(opts, target, comps, notes, core_comps=core_comps)
        except ValueError as exc:
            _err(f"--size/--sizes: {exc}", prog)
            return 2
        except OSError as exc:
            _err(f"I/O on {target.path} failed: {exc}", prog)
            return 1
    report.print_summary(results)
    written = [report.write_json(results, out), report.write_summary(results, out)]
    if not args.no_plots:
        files, note = report.write_plots(results, out)
        written += files
        if note:
            print(f"note: {note}")
    print("wrote: " + ", ".join(_show_path(f) for f in written))
    return 0


def _core_competitors(args: argparse.Namespace, notes: list[str]) -> list | None:
    """Our core and LMCache's for the core, recovery and plugin parts (None when none of them runs)."""
    planned = bench.planned_parts(bench.Options(engines=args.engines, parts=args.parts))
    if not set(planned) & set(bench.CORE_PARTS):
        return None
    core.activate_competitor_dir()
    lmc = core.lmcache_core()
    if not lmc.available and args.install_competitors:
        print(f"installing competitor: torch==2.13.0 then lmcache=={common.LMCACHE_VERSION} into {core.competitor_dir()} "
              "(large; a few minutes)", file=sys.stderr)
        ok, msg = core.install_lmcache()
        notes.append(msg if ok else f"--install-competitors: {msg}; continuing without LMCache")
        lmc = core.lmcache_core()
        if ok and not lmc.available:
            notes.append(f"lmcache installed but not importable: {lmc.error}")
    elif not lmc.available:
        notes.append(f"lmcache competitor {lmc.error}: add it with `{lmc.install}` or --install-competitors")
    return [core.ours_core(), lmc]


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run ``bench ...`` or ``waf ...``; ``prog`` is the command the user typed, for usage lines,
    error messages and the command recorded in results.json."""
    argv_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    try:
        args = parser.parse_args(argv_list)
    except SystemExit as exc:  # argparse exits on --help and on errors
        return int(exc.code or 0)
    if args.command == "bench":
        try:
            return cmd_bench(args, [prog, *argv_list], prog)
        except KeyboardInterrupt:
            _err("interrupted", prog)
            return 130
    return waf_cli.main(args, [prog, *argv_list])
