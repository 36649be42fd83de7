"""Command line of lmcache_rawblock: ``python -m lmcache_rawblock COMMAND ...``.

``inspect`` and ``verify`` read a device's checkpoint and slot headers; ``fdp-status`` shows an
NVMe namespace's FDP handles (``lmcache_rawblock.tools``); ``stats`` shows a running cache live
(``lmcache_rawblock.livestats``). ``bench`` (the benchmark harness) and
``waf`` (the write-amplification study) belong to a separate distribution, lmcache-rawblock-bench
(``benchmarks/`` in the source tree, package ``lmcache_rawblock_bench``): they are handed to it
when it is installed, and otherwise exit 2 saying how to install it. The product commands import
nothing from it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

PROG = "python -m lmcache_rawblock"
# The commands of lmcache_rawblock_bench, with the one-line help the command list shows.
TOOLING_COMMANDS = {
    "bench": "benchmark against LMCache's Rust device, LMCache's core and plugin, and fio",
    "waf": "SSD write-amplification tools: simulate, generate, study, replay, precondition",
}
TOOLING_MISSING = ("not installed: bench and waf come with the lmcache-rawblock-bench distribution "
                   "(from a checkout: pip install ./benchmarks)")


def build_parser() -> argparse.ArgumentParser:
    """The product commands, and bench / waf as names that hand over to lmcache_rawblock_bench
    (``main`` does that before parsing, so this parser never imports it)."""
    parser = argparse.ArgumentParser(prog=PROG, description="lmcache_rawblock tools.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_tooling_command(sub, "bench")
    _add_tool_commands(sub)
    _add_fdp_status_command(sub)
    _add_stats_command(sub)
    _add_tooling_command(sub, "waf")
    return parser


def _add_tooling_command(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help=TOOLING_COMMANDS[name], add_help=False)
    p.add_argument("args", nargs=argparse.REMAINDER)


def _add_fdp_status_command(sub: argparse._SubParsersAction) -> None:
    """fdp-status: a namespace's FDP handles and their available media writes (lmcache_rawblock.tools)."""
    from lmcache_rawblock._quiet import quiet_imports

    try:
        with quiet_imports():
            from lmcache_rawblock import tools
    except ImportError:
        return
    helptext = ("show an NVMe namespace's FDP configuration, its reclaim unit handles with their placement "
                "identifiers and available media writes, and the endurance group's media counters (read-only)")
    tools.add_fdp_status_arguments(sub.add_parser("fdp-status", help=helptext, description=helptext))


def _add_stats_command(sub: argparse._SubParsersAction) -> None:
    from lmcache_rawblock import livestats

    helptext = ("live view of a running cache: rates, p50/p99 per operation, fill, misses, evictions, the "
                "drive's write amplification where readable; --json once (reads what the writer publishes: "
                "no device access, no lock)")
    livestats.add_arguments(sub.add_parser("stats", help=helptext, description=helptext))


def _add_tool_commands(sub: argparse._SubParsersAction) -> None:
    """inspect / verify: read-only checks of a device written by LMCache (lmcache_rawblock.tools)."""
    from lmcache_rawblock._quiet import quiet_imports

    try:
        with quiet_imports():  # tools loads LMCache's key classes when LMCache is installed
            from lmcache_rawblock import tools
    except ImportError:
        return
    if not hasattr(tools, "add_arguments"):
        return
    for name, verify, helptext in (
        ("inspect", False, "show the checkpoint geometry and a sample of entries (read-only)"),
        ("verify", True, "check every entry's header and payload checksum (read-only)"),
    ):
        p = sub.add_parser(name, help=helptext, description=helptext)
        tools.add_arguments(p, verify)


def run_tooling(argv: list[str]) -> int:
    """``bench ...`` / ``waf ...``: lmcache_rawblock_bench's command line when it is installed,
    else exit status 2 and one line saying how to install it."""
    try:
        from lmcache_rawblock_bench import cli
    except ModuleNotFoundError as exc:
        if exc.name not in ("lmcache_rawblock_bench", "lmcache_rawblock_bench.cli"):
            raise
        print(f"{PROG} {argv[0]}: {TOOLING_MISSING}", file=sys.stderr)
        return 2
    return cli.main(argv, prog=PROG)


def main(argv: Sequence[str] | None = None) -> int:
    argv_list = list(sys.argv[1:] if argv is None else argv)
    if argv_list[:1] and argv_list[0] in TOOLING_COMMANDS:
        return run_tooling(argv_list)
    parser = build_parser()
    try:
        args = parser.parse_args(argv_list)
    except SystemExit as exc:  # argparse exits on --help and on errors
        return int(exc.code or 0)
    if args.command in TOOLING_COMMANDS:
        return run_tooling([args.command, *args.args])
    if args.command == "fdp-status":
        from lmcache_rawblock import tools

        return tools.main_fdp_status(args)
    if args.command == "stats":
        from lmcache_rawblock import livestats

        return livestats.main(args)
    if args.command in ("inspect", "verify"):
        from lmcache_rawblock import tools

        return tools.main_inspect(args) if args.command == "inspect" else tools.main_verify(args)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
