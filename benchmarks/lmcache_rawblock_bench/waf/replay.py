"""``waf replay``: the LMCache-shaped workload through our real core on a device or file, with
the drive's wear counters read around a measured window.

The same events as ``waf simulate`` (the generator of :mod:`.workload` or a JSON-lines trace),
with the same cache semantics as :class:`.stream.CacheModel`, but every operation is a call into
:class:`lmcache_rawblock.raw_block.RawBlockCore` (the C core the plugin uses):

* consecutive ``get`` events become one ``exists_many`` call (``--load``: the hits are also read
  back with ``load_many_into``); a hit moves the key to the recent end of the LRU order;
* a ``put`` batch (one prompt's chain for one TP worker) hands over the chunks from the first one
  not stored, as LMCache's store does; write admission (``--admission``) may refuse a chunk;
  the admitted ones go to the core in one ``put_many`` call with their placement identifiers.
  Payloads are ``size`` bytes of a fixed pattern (one buffer per size);
* a full span evicts its least-recently-used entries (the plugin's ``eviction_policy=lru``)
  before the call, and again if the core still refuses keys for want of a slot; after evicting,
  it writes the checkpoints that make the freed slots reusable (``reclaim_held_slots``, and,
  when the core deallocates, one more victim for format v1's second checkpoint, as the plugin's
  evictor does), which is where the core deallocates them before a put can take them (else the
  put takes them undeallocated: ``dealloc_skipped``); ``--evict-batch F`` evicts at least F of
  the slots at a time, as the plugin's evict-ahead does;
* ``delete`` deletes; every ``--checkpoint-every`` stored chunks the core writes a checkpoint.
* ``--extent-bytes SIZE`` turns the core's extents on (``extent_bytes``: slots handed out and
  given back a reclaim unit at a time); the cache's capacity is then the slots of its whole
  extents. ``--eviction extent`` evicts as the plugin's ``eviction_policy=extent`` does: every
  key of the closed extent used least recently (``extent_victim``) at a time, instead of the
  least recently used keys (``lru``), and puts the victim's keys loaded since their put (at
  most half of it) again once their slots are reusable, as the plugin's ``extent_reinsert``
  does (``extent-noreinsert``: not); ``--eviction lru,extent`` runs both side by side. Hits
  bump an extent's use only when loaded: use ``--load`` with ``extent``.

Placement modes: ``no_fdp`` (no directive), ``mixed`` (FDP on, data and checkpoint on the first
identifier), ``separated`` (data through :class:`lmcache_rawblock.fdp.PlacementRouter` for the
strategy, the checkpoint on an identifier of its own, free-slot affinity on). ``mixed`` and
``separated`` need an FDP namespace through NVMe passthrough (``/dev/ngXnY``).

Each run opens a fresh core on the span (no checkpoint loaded: the index starts empty; a file
is zeroed first), feeds ``--warmup`` of writes, reads the counters, feeds ``--measure`` more,
and reads them again: the window excludes the warm-up. Repeat ``i`` generates with workload
seed ``seed + i``, so every mode of one repeat sees the same operations (a trace is the same
every repeat).

``--record FILE`` writes the first run's device write stream in :mod:`.stream`'s format, from
the core's own write journal (:mod:`.journal`: every write the core completed on the device,
with its offset and length, and every range it deallocated, in the order they happened): the
chunks' slot writes, and the metadata writes of either format (format v1's containers; the log
format's log groups, base chunks and superblocks), the writes the core makes when it opens
included. Nothing is reconstructed: the stream is what the product's allocator and evictor did.
The journal carries no placement identifiers, so ``--record`` takes ``--mode no_fdp`` only.

``--meta-format`` picks the core's metadata format (``v1``, the default here, or ``log``, the
product's default); with ``log``, ``--extent-bytes`` need not be a multiple of the slot size
(the strided layout: extents at ``extent_bytes`` boundaries, each with an unused tail).
``--extent-reserve N`` (with ``--eviction extent``) keeps N clean extents ahead of the puts, as
the plugin's evictor thread does (``extent_reserve``; default 0: 5 % of the extents, at least
2), by evicting victim extents after each put call and writing the checkpoint that makes their
slots reusable (where the core deallocates them).

``--dealloc`` sets the core's ``deallocate_freed`` per run (comma-separated ``auto``, ``on``,
``off``: each is a configuration of its own, side by side): ``auto`` deallocates on block devices
and NVMe namespaces and not on files; ``on`` on a file punches holes. Each run reports the
core's ``dealloc_*`` counters (state, slots, ranges, commands, bytes, failures, slots a put took
before their deallocation).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import stat
import sys
import time
from collections import OrderedDict
from typing import Iterable, Optional

from lmcache_rawblock import fdp
from lmcache_rawblock.admission import POLICIES as ADMISSIONS, Admission
from lmcache_rawblock.extent_evict import reinsert_choice

from . import stream
from .workload import WorkloadSpec

PROG = "python -m lmcache_rawblock waf replay"
ENGINES = ("auto", "posix", "io_uring")
MODEL_NAME = "waf-replay"
BLOCK = 4096
_NG = re.compile(r"ng\d+n\d+")
FILL = 0x5A
REPLAY_MODES = (stream.NO_FDP, stream.MIXED, stream.SEPARATED)
DEALLOC_CHOICES = ("auto", "on", "off")
EVICTIONS = ("lru", "extent", "extent-noreinsert")
DEALLOC_KEYS = ("dealloc_state", "dealloc_slots", "dealloc_ranges", "dealloc_commands", "dealloc_bytes",
                "dealloc_failures", "dealloc_skipped")


class ReplayError(Exception):
    """A refusal or a bad argument: the message names the option and the value."""


# --------------------------------------------------------------------------- arguments


def add_arguments(p) -> None:
    p.add_argument("--device", required=True,
                   help="device or file: /dev/ngXnY (NVMe passthrough, FDP modes), a block device, or a file "
                        "(created sparse with --size when missing). Its span is overwritten")
    p.add_argument("--size", "--span", dest="size",
                   help="bytes of the span to use (e.g. 256M; default: the whole device or file)")
    p.add_argument("--destroy-data", action="store_true",
                   help="needed for a device or an existing file: each run overwrites the span (a file replay "
                        "creates needs none)")
    p.add_argument("--force", action="store_true",
                   help="run even if blkid finds a file system or partition table on the device")
    p.add_argument("--mode", default="no_fdp", help="comma-separated: no_fdp, mixed, separated (default no_fdp)")
    p.add_argument("--strategy", default="tp_worker",
                   help=f"comma-separated strategies for separated: {', '.join(stream.STRATEGIES)} "
                        "(default tp_worker)")
    p.add_argument("--admission", default="always", help="comma-separated: always, second_hit (default always)")
    p.add_argument("--dealloc", default="auto",
                   help="comma-separated: the core's deallocate_freed per run: auto (on for block devices and NVMe "
                        "namespaces, off for files), on, off; e.g. on,off runs both (default auto)")
    p.add_argument("--trace", metavar="FILE", help="a JSON-lines trace (waf generate) instead of the generator")
    p.add_argument("--requests", type=int, default=0,
                   help="generator: conversation turns (default 0: as many as --warmup + --measure need)")
    p.add_argument("--seed", type=int, default=1, help="generator: workload seed of repeat 0 (default 1)")
    p.add_argument("--tp", type=int, default=2, help="generator: TP workers (default 2)")
    p.add_argument("--chunk-bytes", default="16M", help="generator: KV bytes of a full chunk over all workers "
                                                        "(default 16M; each worker stores chunk/tp)")
    p.add_argument("--families", type=int, default=2000, help="generator: shared prefixes (default 2000)")
    p.add_argument("--workload", choices=("study", "lmcache_defaults"), default="study",
                   help="generator: store pattern: study (decode and partial chunks stored) or lmcache_defaults "
                        "(save_decode_cache and save_unfull_chunk false: full chunks at prefill) (default study)")
    p.add_argument("--concurrency", type=int, default=32, help="generator: conversations in flight (default 32)")
    p.add_argument("--delete-on-end", type=float, default=0.0,
                   help="generator: probability a finished conversation's chunks are deleted (default 0)")
    p.add_argument("--warmup", default="1",
                   help="writes before the window: drive writes of the span (a number) or bytes (with a unit, "
                        "e.g. 64M) (default 1)")
    p.add_argument("--measure", default="1", help="writes measured, same units as --warmup (default 1)")
    p.add_argument("--window-bytes", choices=("all", "data"), default="all",
                   help="what --warmup and --measure count: every byte the core wrote (all, the default) or its "
                        "chunks' slot writes only (data: runs whose metadata writes differ, e.g. format v1's "
                        "whole-index checkpoint at every key-level eviction, then cover the same stretch of the "
                        "workload's puts)")
    p.add_argument("--repeats", type=int, default=1, help="runs per configuration (default 1)")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="I/O engine (default auto: io_uring passthrough on /dev/ngXnY, posix otherwise)")
    p.add_argument("--checkpoint-every", type=int, default=2000,
                   help="stored chunks between checkpoints (default 2000, as the simulator; 0: none)")
    p.add_argument("--handles", type=int, default=4,
                   help="placement identifiers for KV data in separated mode (default 4, as the simulator)")
    p.add_argument("--evict-batch", type=float, default=0.0,
                   help="when a put needs room, evict at least this fraction of the slots in one batch (the "
                        "plugin's evict-ahead evicts eviction_ratio = 0.05 at a time; default 0: only what the "
                        "put needs)")
    p.add_argument("--meta-format", choices=("v1", "log"), default="v1",
                   help="the core's metadata format (default v1; log is the product's default)")
    p.add_argument("--extent-bytes", default="0",
                   help="the core's extent_bytes (e.g. 64M; at least 2 slots; with format v1 a multiple of the slot "
                        "size; default 0: off)")
    p.add_argument("--meta-bytes", default="0",
                   help="the core's meta_total_bytes (default 0: two copies of the index at ~320 bytes an entry, at "
                        "least 1 MiB)")
    p.add_argument("--extent-reserve", type=int, default=0,
                   help="with --eviction extent: clean extents kept ahead of the puts, as the plugin's "
                        "extent_reserve (default 0: 5%% of the extents, at least 2)")
    p.add_argument("--eviction", default="lru",
                   help="comma-separated: lru (least recently used keys) or extent (the least recently used "
                        "extent's keys, needs --extent-bytes); e.g. lru,extent runs both (default lru)")
    p.add_argument("--load", action="store_true", help="read every hit back (load_many_into)")
    p.add_argument("--hit-trace", metavar="FILE",
                   help="write each lookup's outcome (one byte, 1 a hit), warm-up included, of the last run to FILE: "
                        "hit ratios of runs whose windows differ in bytes compared over the same lookups")
    p.add_argument("--trace-lookups", type=int, default=0, metavar="N",
                   help="with --hit-trace: after the window, go on (outside the window's counts and the record) "
                        "until the trace holds N lookups, so that it covers another run's window that reached "
                        "further into the workload (default 0: the trace ends with the window)")
    p.add_argument("--record", metavar="FILE", help="write the first run's device write stream to FILE "
                                                    "(for waf simulate --stream)")
    p.add_argument("--json", action="store_true", help="print the runs as JSON instead of a table")
    p.add_argument("--out", metavar="DIR", help="write results.json, one JSON file per run, summary.md and "
                                                "write_p99_per_mode.png into DIR")
    p.add_argument("--no-plots", action="store_true", help="with --out: no PNG")


def _size(text: str, opt: str) -> int:
    from ..common import parse_size

    try:
        return parse_size(str(text))
    except ValueError as exc:
        raise ReplayError(f"{opt} {text!r}: {exc}") from None


def _extent_size(text: str) -> int:
    """--extent-bytes: 0 (extents off) or a size."""
    return 0 if str(text).strip() == "0" else _size(text, "--extent-bytes")


def _amount(text: str, opt: str, span: int) -> tuple[int, str]:
    """(bytes, how it was given) of --warmup/--measure: a plain number is drive writes of the span."""
    try:
        dw = float(text)
    except ValueError:
        n = _size(text, opt)
        return n, f"{n} bytes"
    if not dw >= 0 or dw != dw or (opt == "--measure" and dw == 0):
        raise ReplayError(f"{opt} {text!r}: drive writes must be {'> 0' if opt == '--measure' else '>= 0'}")
    return int(dw * span), f"{dw:g} drive writes"


def _split(text: str, allowed, opt: str) -> list[str]:
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise ReplayError(f"{opt} {text!r}: choose from {', '.join(allowed)}")
    return list(dict.fromkeys(items))


# --------------------------------------------------------------------------- the device


@dataclasses.dataclass
class Target:
    path: str
    kind: str  # file, block, nvme_char
    size: int  # bytes of the span used
    created: bool = False


def _device_bytes(path: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def refuse_held(path: str) -> None:
    """ReplayError when another process's raw-block writer holds *path* (a running core): each
    run opens a core on it, which would be refused only after the set-up. The runs' cores hold
    the device exclusively themselves while they run."""
    if not os.path.exists(path):
        return
    from lmcache_rawblock._native import RawBlockDevice

    try:
        RawBlockDevice(path, False).close()  # lock="check": refused only while another process writes it
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            raise ReplayError(f"--device {path!r}: {exc.strerror}") from None
    except ValueError:
        pass  # not a file or device: open_target names it


def open_target(path: str, size_text: Optional[str]) -> Target:
    size = _size(size_text, "--size") if size_text is not None else None
    if size is not None and size % BLOCK:
        raise ReplayError(f"--size {size_text!r}: must be a multiple of {BLOCK} bytes")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if size is None:
            raise ReplayError(f"--device {path!r} does not exist (give --size to create a file of that size)") from None
        try:
            with open(path, "wb") as f:
                f.truncate(size)
        except OSError as exc:
            raise ReplayError(f"--device {path!r}: cannot create it: {exc.strerror or exc}") from None
        return Target(path, "file", size, created=True)
    except OSError as exc:
        raise ReplayError(f"--device {path!r}: {exc.strerror or exc}") from None
    if stat.S_ISREG(st.st_mode):
        have = st.st_size
        if size is None:
            if have < BLOCK:
                raise ReplayError(f"--device {path!r} is an empty file: give --size")
            size = have - have % BLOCK
        elif have < size:
            with open(path, "r+b") as f:
                f.truncate(size)
        return Target(path, "file", size)
    if stat.S_ISCHR(st.st_mode) and _NG.fullmatch(os.path.basename(path)):
        from lmcache_rawblock import _native

        try:
            have = int(_native.nvme_fdp_report(path)["size_bytes"])
        except (OSError, RuntimeError, ValueError) as exc:
            raise ReplayError(f"--device {path!r}: cannot read the NVMe namespace: {exc}") from None
        kind = "nvme_char"
    elif stat.S_ISBLK(st.st_mode):
        have, kind = _device_bytes(path), "block"
    else:
        raise ReplayError(f"--device {path!r} is neither a file, a block device nor an NVMe namespace "
                          "character device (/dev/ngXnY)")
    if size is not None and size > have:
        raise ReplayError(f"--size {size_text!r} exceeds --device {path!r} ({have} bytes)")
    return Target(path, kind, size if size is not None else have - have % BLOCK)


def fdp_ids(target: Target, mode: str, handles: int) -> tuple[tuple[int, ...], Optional[int]]:
    """(data identifiers, checkpoint identifier) of ``mode`` on the device; refuses a device
    without FDP through passthrough."""
    if mode == stream.NO_FDP:
        return (), None
    if target.kind != "nvme_char":
        what = {"file": "a regular file", "block": "a block device"}[target.kind]
        raise ReplayError(f"--mode {mode} needs an FDP NVMe namespace through passthrough (/dev/ngXnY); "
                          f"--device {target.path} is {what}: use --mode no_fdp")
    from lmcache_rawblock import _native

    try:
        rep = _native.nvme_fdp_report(target.path)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ReplayError(f"--mode {mode}: cannot read the FDP state of --device {target.path}: {exc}") from None
    reported = [int(r["pid"]) for r in (rep.get("ruhs") or [])]
    nonzero = [p for p in reported if p != 0]
    if not rep.get("fdp_enabled") or not nonzero:
        raise ReplayError(f"--mode {mode} needs Flexible Data Placement, and --device {target.path} has it off "
                          f"(placement identifiers reported: {reported}): use --mode no_fdp")
    if mode == stream.MIXED:
        return (nonzero[0],), nonzero[0]
    if len(nonzero) < 2:
        raise ReplayError(f"--mode separated needs two placement identifiers (checkpoint, data); --device "
                          f"{target.path} reports {nonzero}")
    ckpt, data = nonzero[0], tuple(nonzero[1:1 + handles])
    return data, ckpt


def core_config(target: Target, engine: str, slot_bytes: int, mode: str, ckpt_pid: Optional[int],
                dealloc: str = "auto", extent_bytes: int = 0, meta_format: str = "v1", meta_bytes: int = 0):
    from lmcache_rawblock.raw_block import RawBlockCoreConfig

    from ..core import config_kwargs, meta_bytes_for

    passthrough = target.kind == "nvme_char"
    if engine == "auto":
        engine = "io_uring" if passthrough else "posix"
    if passthrough and engine != "io_uring":
        raise ReplayError(f"--engine {engine}: --device {target.path} is an NVMe passthrough device, which needs "
                          "--engine io_uring (or auto)")
    slots_est = max(1, target.size // slot_bytes)
    meta = meta_bytes or meta_bytes_for(slots_est)
    if meta + 2 * slot_bytes > target.size:
        raise ReplayError(f"--size {target.size}: the span holds fewer than 2 slots of {slot_bytes} bytes after "
                          f"{meta} bytes of checkpoints; use a larger --size or a smaller --chunk-bytes")
    kw = config_kwargs(target.path, capacity_bytes=target.size, slot_bytes=slot_bytes, meta_total_bytes=meta,
                       io_engine=engine, use_odirect=target.kind == "block", load_checkpoint_on_init=False,
                       allow_foreign_device=True, meta_enable_periodic=False, iouring_queue_depth=256,
                       meta_format=meta_format)
    if passthrough:
        kw["use_uring_cmd"] = True
    if ckpt_pid is not None:
        kw["meta_checkpoint_placement_id"] = ckpt_pid
    kw["fdp_slot_affinity_enabled"] = mode == stream.SEPARATED
    kw["deallocate_freed"] = dealloc
    kw["extent_bytes"] = extent_bytes
    return RawBlockCoreConfig(**kw), engine


def reinit(target: Target) -> None:
    """A file is zeroed (punched back to a sparse file) before each run; a device keeps its bytes
    and the core opens with an empty index."""
    if target.kind == "file":
        with open(target.path, "r+b") as f:
            f.truncate(0)
            f.truncate(target.size)


# --------------------------------------------------------------------------- one run


class _Obj:
    __slots__ = ("byte_array", "metadata")

    def __init__(self, n: int) -> None:
        from ..core import _Meta

        self.byte_array = memoryview(bytearray([FILL]) * n)
        self.metadata = _Meta(n)


def _pct(xs: list, q: float) -> Optional[float]:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


@dataclasses.dataclass
class Ops:
    lookups: int = 0
    hits: int = 0
    loads: int = 0
    puts_offered: int = 0
    puts_refused: int = 0
    puts_stored: int = 0
    puts_failed: int = 0
    put_calls: int = 0
    payload_bytes: int = 0
    chunk_write_bytes: int = 0
    bytes_written: int = 0
    deletes: int = 0
    evictions: int = 0
    reinserted: int = 0
    checkpoints: int = 0
    checkpoint_bytes: int = 0
    lookup_disagreements: int = 0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["hit_ratio"] = self.hits / self.lookups if self.lookups else None
        return d


class Replayer:
    """The cache semantics of :class:`.stream.CacheModel` on a real core."""

    def __init__(self, core, mode: str, strategy: Optional[str], ids: tuple, admission: str, *, tp: int,
                 checkpoint_every: int, load: bool = False, ckpt_pid: Optional[int] = None,
                 chunk_align: int = 1, evict_batch: float = 0.0, eviction: str = "lru", extent_reserve: int = 0,
                 window_bytes: str = "all") -> None:
        self.core = core
        self.window_bytes = window_bytes
        self.eviction = eviction
        self.mode = mode
        self.ids = ids
        self.tp = tp
        self.router = fdp.PlacementRouter(strategy, ids, ranks=tp) if mode == stream.SEPARATED else None
        self.admission = Admission(admission)
        self.checkpoint_every = checkpoint_every
        self.load = load
        self.ckpt_pid = ckpt_pid
        self.chunk_align = chunk_align
        st = core._native.status()
        # with extents, the slots of the whole extents (the others are never handed out)
        self.max_slots = st["extents_total"] * st["extent_slots"] or st["max_slots"]
        self.block = core.block_align
        self.header = core.header_bytes
        self.written0 = st["io"]["write_completed_bytes"]
        self.written = 0
        self.data_written = 0  # the chunks' slot writes among them
        self.ckpts_seen = st["checkpoints_written"]
        self.lru: OrderedDict = OrderedDict()  # (hash, worker) -> encoded key, least recent first
        self.event_of: dict = {}  # extent eviction: (hash, worker) -> its put event (to put it again)
        self._again: list = []  # hot keys of evicted extents to put again
        self.specs: dict = {}
        self.objs: dict = {}
        self.ops = Ops()
        self.hit_trace = bytearray()  # each lookup's outcome (1 hit), warm-up and window, in order
        self.call_ns: list = []
        self.chunk_ns: list = []
        self.unattributed = 0
        self._since_ckpt = 0
        self._batch_id = None
        self._batch: list = []
        self._gets: list = []
        self.evict_batch = int(evict_batch * self.max_slots)
        self.dealloc_on = st.get("dealloc_state") == "on"
        # the plugin's extent_reserve: 5 % of the extents, at least 2, unless given
        n_ext = st["extents_total"]
        self.extent_reserve = (extent_reserve or max(2, math.ceil(0.05 * n_ext))) if n_ext else 0

    # ---- events

    def progress(self) -> int:
        """Bytes the core wrote so far as --window-bytes counts them: all, or the chunks' only."""
        return self.data_written if self.window_bytes == "data" else self.written

    def feed(self, events: Iterable[dict], stop_bytes: Optional[int] = None,
             stop_lookups: Optional[int] = None) -> bool:
        """Apply events until they end (False), or the core has written ``stop_bytes`` (True),
        counted by :meth:`progress`, or the hit trace holds ``stop_lookups`` lookups (True)."""
        for e in events:
            op = e["op"]
            if op != "put" or e.get("batch") != self._batch_id:
                self._flush_puts()
            if op != "get":
                self._flush_gets()
            if op == "get":
                self._gets.append(e)
            elif op == "put":
                self._batch_id = e.get("batch")
                self._batch.append(e)
            else:
                self._delete(e)
            if stop_bytes is not None and self.progress() >= stop_bytes:
                self._flush_puts()
                self._flush_gets()
                return True
            if stop_lookups is not None and len(self.hit_trace) + len(self._gets) >= stop_lookups:
                self._flush_puts()
                self._flush_gets()
                return True
        self._flush_puts()
        self._flush_gets()
        return False

    @staticmethod
    def _key(e: dict) -> tuple:
        return (int(e["key"], 16), int(e.get("worker", 0)))

    def _spec(self, e: dict):
        k = self._key(e)
        s = self.specs.get(k)
        if s is None:
            from lmcache_rawblock.raw_block import encode_object_key
            from lmcache_rawblock.raw_block._lmcache import ObjectKey

            s = encode_object_key(ObjectKey(chunk_hash=k[0].to_bytes(8, "big"), model_name=MODEL_NAME,
                                            kv_rank=k[1], cache_salt=e.get("salt", "") or ""))
            if len(self.specs) >= 1 << 20:  # a long run on a large drive: keep the memory bounded
                self.specs.clear()
            self.specs[k] = s
        return s

    def _obj(self, n: int) -> _Obj:
        o = self.objs.get(n)
        if o is None:
            o = self.objs[n] = _Obj(n)
        return o

    def _flush_gets(self) -> None:
        gets, self._gets = self._gets, []
        if not gets:
            return
        keys = [self._key(e) for e in gets]
        enc = [self._spec(e).encoded for e in gets]
        found = self.core.exists_many(enc)
        hits = []
        for k, en, ok in zip(keys, enc, found):
            self.ops.lookups += 1
            self.hit_trace.append(1 if ok else 0)
            if ok != (k in self.lru):
                self.ops.lookup_disagreements += 1
            if ok:
                self.ops.hits += 1
                if k in self.lru:
                    self.lru.move_to_end(k)
                hits.append(en)
        if self.load and hits:
            metas = self.core.get_metadata_many(hits)
            objs = [_Obj(int(m.size)) for m in metas if m is not None]
            keys_ok = [h for h, m in zip(hits, metas) if m is not None]
            if keys_ok:
                self.ops.loads += sum(self.core.load_many_into(keys_ok, objs))

    def _delete(self, e: dict) -> None:
        k = self._key(e)
        enc = self.lru.pop(k, None)
        self.event_of.pop(k, None)
        if enc is not None and self.core.delete_many([enc], force=True)[0]:
            self.ops.deletes += 1

    def _lru_victims(self, n: int, protect: set) -> list:
        victims = []
        for k in self.lru:
            if len(victims) >= n:
                break
            if k not in protect:
                victims.append(k)
        return victims

    def _extent_victims(self, n: int, protect: set, extents: int = 0) -> list:
        """The keys of victim extents, least recently used first, until n more than the hot
        keys to put again, or every closed extent was looked at (as the plugin's extent
        eviction); with ``extents``, the keys of that many victim extents."""
        by_enc = {enc: k for k, enc in self.lru.items()}
        victims: list = []
        seen: set = set()
        while (len(seen) < extents) if extents else (len(victims) - len(self._again) < n):
            v = self.core.extent_victim()
            if v is None or v[0] in seen:
                break
            seen.add(v[0])
            keep = [(by_enc[e], h) for e, h in zip(v[1], v[2]) if e in by_enc and by_enc[e] not in protect]
            victims += [k for k, _ in keep]
            if self.eviction == "extent":
                self._again += reinsert_choice(keep)
        return victims

    def _evict(self, n: int, protect: set, extents: int = 0) -> int:
        ext = self.eviction.startswith("extent")
        victims = self._extent_victims(n, protect, extents) if ext else self._lru_victims(n, protect)
        if not victims:
            return 0
        encs = [self.lru.pop(k) for k in victims]
        again = set(self._again)
        for k in victims:
            if k not in again:
                self.event_of.pop(k, None)
        done = sum(self.core.delete_many(encs, force=True))
        self.ops.evictions += done
        if done:
            # As the plugin's evictor does: write the checkpoints that make the freed slots
            # reusable (the core deallocates them there) before the put that needs them; format
            # v1 needs one more change to the index for the second checkpoint: one more victim
            # (only when the core deallocates: otherwise the put's own checkpoint frees them,
            # and the run evicts exactly what the simulator's cache model does).
            self._account(0)
            if self.core.reclaim_held_slots():
                self._account(0)
            if self.dealloc_on and self.core.slot_counts().held:
                extra = next((k for k in self.lru if k not in protect), None)
                if extra is not None and self.core.delete_many([self.lru.pop(extra)], force=True)[0]:
                    self.ops.evictions += 1
                    done += 1
                    self._account(0)
                    if self.core.reclaim_held_slots():
                        self._account(0)
        self._put_again()
        return done

    def _put_again(self) -> None:
        """Extent eviction's reinsertion: the hot keys of the evicted extents put again."""
        again, self._again = self._again, []
        todo = [(k, self.event_of[k], None) for k in again if k in self.event_of and k not in self.lru]
        if todo:
            self.ops.reinserted += sum(1 for ok in self._put(todo) if ok)

    def _flush_puts(self) -> None:
        batch, self._batch, self._batch_id = self._batch, [], None
        if not batch:
            return
        first = 0
        while first < len(batch) and self._key(batch[first]) in self.lru:
            self.lru.move_to_end(self._key(batch[first]))
            first += 1
        batch = batch[first:]
        if not batch:
            return
        if self.mode == stream.NO_FDP:
            pids = [None] * len(batch)
        elif self.mode == stream.MIXED:
            pids = [self.ids[0]] * len(batch)
        else:
            pids = self.router.placements([self._facts(e) for e in batch]) or [None] * len(batch)
        todo = []
        seen = set()
        for e, pid in zip(batch, pids):
            k = self._key(e)
            if k in self.lru or k in seen:
                if k in self.lru:
                    self.lru.move_to_end(k)
                continue
            self.ops.puts_offered += 1
            if not self.admission.admit(k):
                self.ops.puts_refused += 1
                continue
            seen.add(k)
            todo.append((k, e, pid))
        if not todo:
            return
        protect = {k for k, _, _ in todo}
        over = len(self.lru) + len(todo) - self.max_slots
        if over > 0:
            self._evict(max(over, self.evict_batch), protect)
        stored = self._put(todo)
        left = [t for t, ok in zip(todo, stored) if not ok]
        if left and self._evict(len(left), protect):
            again = self._put(left)
            left = [t for t, ok in zip(left, again) if not ok]
        self.ops.puts_failed += len(left)
        if self.eviction.startswith("extent"):
            self._keep_reserve()

    def _keep_reserve(self) -> None:
        """The plugin's extent evictor between puts: one victim extent per clean extent short of
        the reserve (``ExtentEviction.missing_clean``), then the checkpoint that makes their
        slots reusable, where the core deallocates them."""
        c = self.core.extent_counts()
        if c["closed"]:
            return
        missing = self.extent_reserve - c["extents_clean"] - c["extents_pending_dealloc"]
        if missing > 0 and not self._evict(0, set(), extents=missing) and self.core.slot_counts().held:
            self.core.reclaim_held_slots()
            self._account(0)

    def _facts(self, e: dict) -> fdp.KeyFacts:
        w = int(e.get("worker", 0))
        salt = e.get("salt", "") or ""
        return fdp.KeyFacts(chunk_hash=int(e["key"], 16), worker=w, local_rank=w, salt=salt,
                            stream=(MODEL_NAME, self.tp, w, salt))

    def _put(self, todo: list) -> list:
        specs = [self._spec(e) for _, e, _ in todo]
        objs = [self._obj(int(e["size"])) for _, e, _ in todo]
        pids = [p for _, _, p in todo]
        t0 = time.perf_counter_ns()
        res = self.core.put_many(specs, objs, None if self.mode == stream.NO_FDP else pids)
        dt = time.perf_counter_ns() - t0
        self.ops.put_calls += 1
        self.call_ns.append(dt)
        self.chunk_ns.append(dt / len(todo))
        expect = 0
        for (k, e, _), spec, ok in zip(todo, specs, res.results):
            if not ok:
                continue
            self.lru[k] = spec.encoded
            if self.eviction == "extent":
                self.event_of[k] = e
            size = int(e["size"])
            n = -(-(self.header + size) // self.chunk_align) * self.chunk_align
            expect += n
            self.ops.puts_stored += 1
            self.ops.payload_bytes += size
            self.ops.chunk_write_bytes += n
        self._account(expect)
        n_ok = sum(1 for ok in res.results if ok)
        self._since_ckpt += n_ok
        if self.checkpoint_every and self._since_ckpt >= self.checkpoint_every:
            self._since_ckpt = 0
            self.core.checkpoint_now()
            self._account(0)
        return list(res.results)

    def _account(self, expect: int) -> None:
        """Bytes the core wrote since the last call: ``expect`` of them the chunks' writes, the
        rest metadata (checkpoints; ``unattributed`` when no checkpoint was counted: the log
        format appends records between checkpoints too)."""
        st = self.core._native.status()
        total = st["io"]["write_completed_bytes"] - self.written0
        delta = total - self.written
        self.written = total
        self.data_written += expect
        self.ops.bytes_written += delta
        k = st["checkpoints_written"] - self.ckpts_seen
        self.ckpts_seen = st["checkpoints_written"]
        self.ops.checkpoints += k
        rest = delta - expect
        if k:
            self.ops.checkpoint_bytes += rest
        else:
            self.unattributed += rest


def run_one(a, target: Target, mode: str, strategy: Optional[str], admission: str, repeat: int,
            spec: Optional[WorkloadSpec], slot_bytes: int, record_file=None, dealloc: str = "auto",
            eviction: str = "lru") -> dict:
    from . import counters

    ids, ckpt_pid = fdp_ids(target, mode, a.handles)
    extent_bytes = _extent_size(a.extent_bytes)
    meta_bytes = 0 if str(a.meta_bytes).strip() == "0" else _size(a.meta_bytes, "--meta-bytes")
    cfg, engine = core_config(target, a.engine, slot_bytes, mode, ckpt_pid, dealloc, extent_bytes, a.meta_format,
                              meta_bytes)
    warm, warm_desc = _amount(a.warmup, "--warmup", target.size)
    meas, meas_desc = _amount(a.measure, "--measure", target.size)
    reinit(target)
    jpath = f"{record_file.name}.journal" if record_file is not None else None
    r, status, res_run = _run_core(a, cfg, target, mode, strategy, ids, admission, spec, repeat, eviction,
                                   ckpt_pid, warm, meas, counters, jpath)
    if getattr(a, "hit_trace", None):
        with open(a.hit_trace, "wb") as f:
            f.write(bytes(r.hit_trace))
    recorded = None
    if jpath:
        from . import journal

        try:
            recorded = journal.to_stream(jpath, target.path, record_file,
                                         meta_end=status["data_base_offset"]).to_dict()
            recorded["data_base_offset"] = status["data_base_offset"]
        finally:
            os.unlink(jpath)
    ended_early, seed, warm_ops, wall, win = res_run
    core_write_bytes = status["io"]["write_completed_bytes"]
    ops = r.ops.to_dict()
    res = {
        "device": target.path, "device_kind": target.kind, "span_bytes": target.size, "engine": engine,
        "mode": mode, "strategy": strategy if mode == stream.SEPARATED else None, "admission": admission,
        "dealloc": dealloc, "eviction": eviction, "extent_bytes": extent_bytes, "repeat": repeat,
        "workload_seed": seed,
        "workload": spec.to_dict() if spec is not None else {"trace": a.trace},
        "slot_bytes": slot_bytes, "max_slots": r.max_slots, "placement_ids": list(ids),
        "checkpoint_placement_id": ckpt_pid, "checkpoint_every": a.checkpoint_every, "evict_batch": a.evict_batch,
        "warmup": warm_desc, "warmup_bytes": warm, "measure": meas_desc, "measure_bytes": meas,
        "window_bytes": getattr(a, "window_bytes", "all"),
        "input_ended_early": ended_early,
        "ops": ops, "warmup_ops": warm_ops.to_dict(),
        "latency": {
            "put_many_calls": len(r.call_ns),
            "put_many_p50_ms": _ms(_pct(r.call_ns, 0.5)), "put_many_p99_ms": _ms(_pct(r.call_ns, 0.99)),
            "per_chunk_p50_ms": _ms(_pct(r.chunk_ns, 0.5)), "per_chunk_p99_ms": _ms(_pct(r.chunk_ns, 0.99)),
        },
        "wall_seconds": round(wall, 3),
        "window": win, "waf": win.get("waf"),
        "steady_state_warning": counters.steady_state_warning(win.get("waf")) if win.get("available") else None,
        "core": {k: status[k] for k in ("indexed_key_count", "checkpoints_written", "checkpoints_for_room",
                                        "fdp_slot_affinity_hit_count", "fdp_slot_affinity_fallback_count")
                 + tuple(k for k in DEALLOC_KEYS if k in status)
                 + tuple(k for k in status if k.startswith(("extent_", "extents_")))},
        "unattributed_write_bytes": r.unattributed,
        "meta_format": a.meta_format, "extent_reserve": r.extent_reserve if eviction.startswith("extent") else None,
        "core_write_bytes": core_write_bytes,
        "recorded": recorded,
        "record_deallocate_ranges": recorded["deallocs"] if recorded else None,
    }
    return res


def _run_core(a, cfg, target: Target, mode: str, strategy: Optional[str], ids: tuple, admission: str,
              spec: Optional[WorkloadSpec], repeat: int, eviction: str, ckpt_pid: Optional[int], warm: int,
              meas: int, counters, jpath: Optional[str]) -> tuple:
    """One run's core: opened fresh on the span, fed the warm-up and the measured window; with
    ``jpath``, the core's write journal from before it opens until the end of the window (its
    closing writes left out, so the journal's bytes are the core's ``write_completed_bytes``)."""
    from lmcache_rawblock import _native
    from lmcache_rawblock.raw_block import RawBlockCore

    if jpath:
        _native._set_write_journal(jpath)
    try:
        core = RawBlockCore(cfg, key_namespace="object")
    except BaseException:
        if jpath:
            _native._set_write_journal(None)
        raise
    try:
        passthrough = target.kind == "nvme_char"
        align = core.block_align if (passthrough or cfg.use_odirect) else 1
        r = Replayer(core, mode, strategy if mode == stream.SEPARATED else None, ids, admission, tp=_tp(spec, a),
                     checkpoint_every=a.checkpoint_every, load=a.load, ckpt_pid=ckpt_pid, chunk_align=align,
                     evict_batch=a.evict_batch, eviction=eviction, extent_reserve=a.extent_reserve,
                     window_bytes=getattr(a, "window_bytes", "all"))
        if spec is not None:
            events = _generated(spec, repeat)
            seed = spec.seed + repeat
        else:
            events = _trace_events(a.trace)
            seed = None
        ended_early = not r.feed(events, stop_bytes=warm) if warm else False
        warm_ops = r.ops
        r.ops = Ops()
        r.call_ns, r.chunk_ns = [], []
        w0 = r.progress()
        before = _read(counters, target.path)
        t0 = time.perf_counter()
        if not ended_early:
            ended_early = not r.feed(events, stop_bytes=w0 + meas)
        wall = time.perf_counter() - t0
        after = _read(counters, target.path)
        win = counters.window(before[0], after[0])
        if before[1] or after[1]:
            win["note"] = (win.get("note") or "") + (" " if win.get("note") else "") + (before[1] or after[1])
        status = core.report_status()
        native = core._native.status()
        status["io"], status["data_base_offset"] = native["io"], native["data_base_offset"]
        _trace_on(r, events, getattr(a, "trace_lookups", 0), ended_early, jpath)
    finally:
        if jpath:
            _native._set_write_journal(None)
        core.close()
    return r, status, (ended_early, seed, warm_ops, wall, win)


def _trace_on(r: Replayer, events, lookups: int, ended_early: bool, jpath: Optional[str]) -> None:
    """--trace-lookups: the workload fed on past the window until the hit trace holds
    ``lookups``, its ops, bytes and writes (the journal stopped first) left out of the run's."""
    if not lookups or ended_early or len(r.hit_trace) >= lookups:
        return
    if jpath:
        from lmcache_rawblock import _native

        _native._set_write_journal(None)
    ops, r.ops = r.ops, Ops()
    try:
        r.feed(events, stop_lookups=lookups)
    finally:
        r.ops = ops


def _ms(ns: Optional[float]) -> Optional[float]:
    return None if ns is None else round(ns / 1e6, 4)


def _tp(spec: Optional[WorkloadSpec], a) -> int:
    return spec.tp if spec is not None else a.tp


def _read(counters, path: str) -> tuple[Optional[dict], str]:
    try:
        return counters.read_counters(path), ""
    except (OSError, RuntimeError, AttributeError) as exc:
        return None, f"wear counters could not be read from {path}: {exc}"


def _generated(spec: WorkloadSpec, repeat: int):
    from .workload import generate

    s = dataclasses.replace(spec, seed=spec.seed + repeat)
    return generate(s)


def _trace_events(path: str):
    from .workload import read_trace

    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as exc:
        raise ReplayError(f"--trace {path!r}: {exc.strerror or exc}") from None
    return read_trace(lines, source=path)


def _trace_spec(path: str) -> Optional[WorkloadSpec]:
    """The generator parameters in a trace's header line, if it has one."""
    try:
        with open(path) as f:
            first = f.readline()
    except OSError as exc:
        raise ReplayError(f"--trace {path!r}: {exc.strerror or exc}") from None
    try:
        head = json.loads(first)
    except json.JSONDecodeError:
        return None
    if isinstance(head, dict) and "trace" in head and isinstance(head.get("workload"), dict):
        try:
            return WorkloadSpec.from_dict(head["workload"])
        except (TypeError, ValueError):
            return None
    return None


def _trace_max_size(path: str) -> int:
    from .workload import read_trace

    with open(path) as f:
        return max((int(e.get("size", 0)) for e in read_trace(f, source=path)), default=0)


# --------------------------------------------------------------------------- output


def label(r: dict) -> str:
    lab = r["mode"] if r["mode"] != stream.SEPARATED else f"separated:{r['strategy']}"
    state = r.get("core", {}).get("dealloc_state")
    ev = f" evict {r['eviction']}" if r.get("eviction", "lru") != "lru" or r.get("extent_bytes") else ""
    return f"{lab} dealloc {r.get('dealloc', 'auto')}" + (f" ({state})" if state and r.get("dealloc") == "auto"
                                                          else "") + ev


def _file_label(r: dict) -> str:
    lab = r["mode"] if r["mode"] != stream.SEPARATED else f"{r['mode']}-{r['strategy']}"
    dl = r.get("dealloc", "auto")
    lab = lab if dl == "auto" else f"{lab}-dealloc_{dl}"
    return lab if r.get("eviction", "lru") == "lru" else f"{lab}-evict_{r['eviction']}"


def _fmt(v, spec: str, none: str = "n/a") -> str:
    return none if v is None else format(v, spec)


def table(runs: list[dict]) -> str:
    lines = [f"{'mode/strategy, dealloc':40} {'admission':10} {'rep':>3} {'WAF':>18} {'host GiB':>9} {'hit ratio':>9} "
             f"{'p50 ms':>8} {'p99 ms':>8} {'chunk p99':>9}"]
    for r in runs:
        w = r["window"]
        waf = _fmt(r["waf"], ".3f", "n/a (no counters)")
        host = w.get("host_bytes")
        host_gib = (host if host is not None else r["ops"]["bytes_written"]) / 2**30
        lat = r["latency"]
        lines.append(f"{label(r):40} {r['admission']:10} {r['repeat']:>3} {waf:>18} {host_gib:9.3f} "
                     f"{_fmt(r['ops']['hit_ratio'], '.3f'):>9} {_fmt(lat['put_many_p50_ms'], '.3f'):>8} "
                     f"{_fmt(lat['put_many_p99_ms'], '.3f'):>8} {_fmt(lat['per_chunk_p99_ms'], '.3f'):>9}")
    lines.append("p50/p99 ms: write latency per put_many call; chunk p99: per chunk (a call's time / its chunks)")
    return "\n".join(lines)


def notes(runs: list[dict]) -> list[str]:
    out = []
    for msg in dict.fromkeys(r["window"].get("note") for r in runs if r["window"].get("note")):
        out.append(f"note: {msg}")
    warned = [r for r in runs if r["steady_state_warning"]]
    if warned:
        wafs = [r["waf"] for r in warned]
        first = warned[0]["steady_state_warning"].split(": ", 1)[-1]
        out.append(f"warning: WAF {min(wafs):.3f}-{max(wafs):.3f} in {len(warned)} of {len(runs)} runs: {first}")
    if any(r["input_ended_early"] for r in runs):
        out.append("note: the input ended before --warmup + --measure were written (see input_ended_early)")
    if any(r["window"].get("host_bytes") is None for r in runs):
        out.append("host GiB: bytes our core wrote in the window where the drive reports none")
    return out


def summary_md(runs: list[dict], argv: list[str]) -> str:
    rows = ["| mode/strategy, dealloc | admission | repeat | WAF | host GiB | hit ratio | write p50 ms | write p99 ms "
            "| chunk p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        w = r["window"]
        host = w.get("host_bytes")
        host_gib = (host if host is not None else r["ops"]["bytes_written"]) / 2**30
        lat = r["latency"]
        rows.append(f"| {label(r)} | {r['admission']} | {r['repeat']} | {_fmt(r['waf'], '.3f', 'n/a (no counters)')} "
                    f"| {host_gib:.3f} | {_fmt(r['ops']['hit_ratio'], '.3f')} | "
                    f"{_fmt(lat['put_many_p50_ms'], '.3f')} | {_fmt(lat['put_many_p99_ms'], '.3f')} | "
                    f"{_fmt(lat['per_chunk_p99_ms'], '.3f')} |")
    groups: dict = {}
    for r in runs:
        groups.setdefault((label(r), r["admission"]), []).append(r)
    if any(len(g) > 1 for g in groups.values()):
        rows += ["", "Over the repeats (mean, min-max):", "",
                 "| mode/strategy, dealloc | admission | runs | WAF | hit ratio | write p99 ms | chunk p99 ms |",
                 "|---|---|---|---|---|---|---|"]
        for (lab, adm), g in groups.items():
            rows.append(f"| {lab} | {adm} | {len(g)} | {_spread([r['waf'] for r in g])} | "
                        f"{_spread([r['ops']['hit_ratio'] for r in g])} | "
                        f"{_spread([r['latency']['put_many_p99_ms'] for r in g], '.1f')} | "
                        f"{_spread([r['latency']['per_chunk_p99_ms'] for r in g], '.1f')} |")
    head = (f"# waf replay\n\nCommand: `{' '.join(argv)}`\n\nDevice {runs[0]['device']} ({runs[0]['device_kind']}, "
            f"span {runs[0]['span_bytes']} bytes, engine {runs[0]['engine']}); window: {runs[0]['measure']} "
            f"after {runs[0]['warmup']} of warm-up. Repeat i uses workload seed seed+i, the same for every mode.\n\n")
    tail = "\n".join(f"- {n}" for n in notes(runs) + [
        "write p50/p99: latency of one put_many call; chunk p99: a call's time divided by its chunks"])
    return head + "\n".join(rows) + "\n" + ("\n" + tail + "\n" if tail else "")


def _spread(xs: list, spec: str = ".3f") -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    return f"{format(sum(xs) / len(xs), spec)} ({format(min(xs), spec)}-{format(max(xs), spec)})"


def plot(runs: list[dict], out: str) -> tuple[Optional[str], Optional[str]]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not importable: no plot (pip install matplotlib)"
    groups: dict = {}
    for r in runs:
        groups.setdefault(f"{label(r)}\n{r['admission']}", []).append(r["latency"]["put_many_p99_ms"] or 0.0)
    names = list(groups)
    means = [sum(v) / len(v) for v in groups.values()]
    lo = [m - min(v) for m, v in zip(means, groups.values())]
    hi = [max(v) - m for m, v in zip(means, groups.values())]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(names)), 4.5))
    ax.bar(range(len(names)), means, 0.6, yerr=[lo, hi], capsize=3)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("put_many p99 (ms)")
    ax.set_title(f"Write p99 per placement mode on {runs[0]['device']} (bars: mean, whiskers: min-max over repeats)",
                 fontsize=9)
    fig.tight_layout()
    p = os.path.join(out, "write_p99_per_mode.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p, None


def write_out(out: str, runs: list[dict], argv: list[str], plots: bool = True) -> list[str]:
    os.makedirs(out, exist_ok=True)
    files = []
    p = os.path.join(out, "results.json")
    with open(p, "w") as f:
        json.dump({"command": " ".join(argv), "runs": runs}, f, indent=1)
    files.append(p)
    for r in runs:
        name = f"{_file_label(r)}-{r['admission']}-r{r['repeat']}.json"
        p = os.path.join(out, name)
        with open(p, "w") as f:
            json.dump(r, f, indent=1)
        files.append(p)
    p = os.path.join(out, "summary.md")
    with open(p, "w") as f:
        f.write(summary_md(runs, argv))
    files.append(p)
    if plots:
        png, note = plot(runs, out)
        if png:
            files.append(png)
        if note:
            print(f"note: {note}", file=sys.stderr)
    return files


# --------------------------------------------------------------------------- main


def _configs(a) -> list[tuple[str, Optional[str], str, str, str]]:
    modes = _split(a.mode, REPLAY_MODES, "--mode")
    strategies = _split(a.strategy, stream.STRATEGIES, "--strategy")
    admissions = _split(a.admission, ADMISSIONS, "--admission")
    deallocs = _split(a.dealloc, DEALLOC_CHOICES, "--dealloc")
    evictions = _split(a.eviction, EVICTIONS, "--eviction")
    if any(ev.startswith("extent") for ev in evictions) and not _extent_size(a.extent_bytes):
        raise ReplayError("--eviction extent needs --extent-bytes (the extents it evicts)")
    if a.record and any(m != stream.NO_FDP for m in modes):
        raise ReplayError(f"--record with --mode {a.mode}: the write journal carries no placement identifiers; "
                          "record with --mode no_fdp")
    if a.extent_reserve < 0:
        raise ReplayError(f"--extent-reserve {a.extent_reserve}: must be >= 0 (0: 5% of the extents, at least 2)")
    out = []
    for ev in evictions:
        for dl in deallocs:
            for adm in admissions:
                for m in modes:
                    if m == stream.SEPARATED:
                        out += [(m, s, adm, dl, ev) for s in strategies]
                    else:
                        out.append((m, None, adm, dl, ev))
    return out


def _spec(a) -> Optional[WorkloadSpec]:
    if a.trace:
        return None
    try:
        from .workload import WORKLOADS

        return WorkloadSpec(requests=a.requests, seed=a.seed, tp=a.tp,
                            chunk_bytes=_size(a.chunk_bytes, "--chunk-bytes"), families=a.families,
                            delete_on_end=a.delete_on_end, concurrency=a.concurrency, **WORKLOADS[a.workload])
    except ValueError as exc:
        raise ReplayError(str(exc).replace("workload ", "generator ")) from None


def _refuse_foreign(device: str, force: bool) -> None:
    """A device that holds a file system or partition table is not ours: refused unless
    ``--force`` (the bench's and precondition's check; an NVMe generic device is probed through
    its block device)."""
    from ..target import TargetError, find_signature
    from .precondition import write_path_for

    try:
        sig = find_signature(write_path_for(device))
    except TargetError as exc:
        if force:
            return
        raise ReplayError(str(exc)) from exc
    if sig is not None and not force:
        raise ReplayError(f"--device {device}: refusing to use it: blkid -p found {sig}; every run overwrites the "
                          "span and would destroy that data: pass --force to use it anyway")


def _check_ints(a) -> None:
    if a.trace_lookups and not a.hit_trace:
        raise ReplayError("--trace-lookups needs --hit-trace")
    if not 0.0 <= a.evict_batch < 1.0:
        raise ReplayError(f"--evict-batch {a.evict_batch}: must be a fraction of the slots in [0, 1)")
    for opt, v, low in (("--repeats", a.repeats, 1), ("--checkpoint-every", a.checkpoint_every, 0),
                        ("--trace-lookups", a.trace_lookups, 0),
                        ("--handles", a.handles, 1), ("--requests", a.requests, 0), ("--tp", a.tp, 1),
                        ("--families", a.families, 1)):
        if v < low:
            raise ReplayError(f"{opt} {v}: must be >= {low}")


def main(a, argv: Optional[list[str]] = None) -> int:
    argv = argv or [PROG]
    try:
        _check_ints(a)
        configs = _configs(a)
        spec = _spec(a)
        if a.trace:
            max_obj = _trace_max_size(a.trace) if os.path.exists(a.trace) else 0
            if not max_obj:
                _trace_events(a.trace)  # names a missing file
                raise ReplayError(f"--trace {a.trace!r} holds no put")
            hspec = _trace_spec(a.trace)
            if hspec is not None:
                a.tp = hspec.tp
        else:
            max_obj = spec.object_bytes
        refuse_held(a.device)
        target = open_target(a.device, a.size)
        if not target.created and not a.destroy_data:
            raise ReplayError(f"--device {a.device}: refusing to run without --destroy-data: every run overwrites "
                              f"the first {target.size} bytes" + (" (a file is zeroed)" if target.kind == "file"
                                                                  else ""))
        if target.kind != "file":
            _refuse_foreign(a.device, a.force)
        slot_bytes = -(-(BLOCK + max_obj) // BLOCK) * BLOCK
        _amount(a.warmup, "--warmup", target.size)
        _amount(a.measure, "--measure", target.size)
        core_config(target, a.engine, slot_bytes, stream.NO_FDP, None)  # the span and the engine
        # Refuse an FDP mode on this device before any run starts.
        for mode in dict.fromkeys(m for m, _, _, _, _ in configs):
            fdp_ids(target, mode, a.handles)
    except ReplayError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a trace's bad line names itself
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    runs = []
    rec_file = None
    try:
        if a.record:
            try:
                rec_file = open(a.record, "w")
            except OSError as exc:
                print(f"{PROG}: error: --record {a.record!r}: {exc.strerror or exc}", file=sys.stderr)
                return 2
        for rep in range(a.repeats):
            for mode, strat, adm, dl, ev in configs:
                r = run_one(a, target, mode, strat, adm, rep, spec, slot_bytes,
                            record_file=rec_file if not runs else None, dealloc=dl, eviction=ev)
                runs.append(r)
                if not a.json:
                    print(f"[{len(runs)}/{len(configs) * a.repeats}] {label(r)} {adm} repeat {rep}: "
                          f"WAF {_fmt(r['waf'], '.3f', 'n/a')}, {r['ops']['bytes_written'] / 2**20:.1f} MiB written, "
                          f"{r['wall_seconds']} s", file=sys.stderr, flush=True)
    except (ReplayError, ValueError, OSError, RuntimeError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if rec_file is not None:
            rec_file.close()
    if a.record and runs:
        print(f"recorded the write stream of the first run ({label(runs[0])}, {runs[0]['admission']}, repeat 0) "
              f"to {a.record}", file=sys.stderr)
    if a.out:
        files = write_out(a.out, runs, argv, plots=not a.no_plots)
        print("wrote: " + ", ".join(files), file=sys.stderr)
    if a.json:
        print(json.dumps(runs, indent=1))
    else:
        print(table(runs))
        for n in notes(runs):
            print(n)
    return 0
