"""Prefix part: prefix-aware eviction against LRU (``rust_raw_block.eviction_policy``), ours only.

A trace of multi-turn conversations: each starts on one of ``system_prompts`` shared system
prompts (Zipf popularity), some attach one of ``documents`` shared documents (Zipf too), and
each turn's prompt is the shared prefix, the conversation's history and the turn's new chunks.
Chunk keys are chained as LMCache's are: a chunk's key names its whole prefix, so a shared
system prompt or document after the same prefix has the same keys in every conversation, and
the same document after another system prompt has other keys.

Each request is replayed through the real plugin (``RustRawBlockBackend``, the real policy
code over a real ``RawBlockCore`` on a sparse file, posix engine, the product's evict-ahead
defaults) as vLLM with LMCache drives it: vLLM's own prefix cache (an LRU of ``gpu_share`` of
the working set, in chunks) serves the prompt's first chunks it holds; LMCache looks the whole
prompt up (``batched_contains``, which stops at the first miss and moves nothing), loads only the
hit chunks past vLLM's (``batched_get_blocking``, which moves them to the recent end) and then
stores the chunks past its own hits (``batched_submit_put_task``; LMCache's
``skip_leading_tokens`` is its lookup's hit count). So the chunks vLLM serves are never touched
in the tier: under LRU a conversation's first chunks age there while its later ones stay
fresh, and when they go the rest of the chain is dead until a request stores them again. The
cache holds 25 %, 50 % and 100 % of the trace's working set (its distinct chunks); both
policies run the same trace at each capacity, side by side.

Figures per capacity and policy: tokens served (hit chunks x ``chunk_tokens``), the hit ratio
(tokens served / tokens looked up), tokens served per byte of device (data slots), and the
reachable bytes: sampled every ``samples``-th of the trace, the stored chunks whose every
predecessor is stored too (a lookup can reach them), as bytes and as a share of what is stored.
Ratios are prefix / lru. Goal: tokens served at 50 % >= 1.15 x, and never below 1.0 x (0.99 x:
the replays' noise).

Per-put CPU: (1) the bookkeeping alone, the plugin's own methods on an instance holding a full
order: per stored chunk, what a store call costs the order (under prefix, learning the chain
from the call's keys, which the put encodes under either policy; then recording the stored
key) and its share of an eviction batch (evict-ahead's 5 %: picking the victims, forgetting
them), no I/O, best of ``cpu_rounds``; (2) the whole put: process CPU per
stored chunk over the store calls of ``put_rounds`` more replays per policy at 50 %, the order
alternating, median (the evictor thread's work is in it: the process's CPU). Goal: (2) <= 1.1 x.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import os
import random
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from .common import MiB, median

POLICIES = ("lru", "prefix")
# Whole-extent eviction, plain (least recently used extent) and prefix-weighted (of the few
# least recently used extents, the one losing the fewest reachable chunks).
EXTENT_POLICIES = ("extent", "extent_prefix")
GOAL_TOKENS_50 = 1.15
# "Never worse" within the replays' noise: the evictor thread's timing moves which chunks a pass
# takes, a few tenths of a percent of the tokens served between runs of one policy.
GOAL_NEVER_WORSE = 0.99
GOAL_CPU = 1.1
PAYLOAD = 4096  # bytes of a chunk's KV in the replay (one 4 KiB block after a 4 KiB header)
SLOT = 4096 + PAYLOAD
META = 4 * MiB


@dataclass
class PrefixSettings:
    conversations: int = 400
    concurrency: int = 150  # conversations in flight: a returning one finds vLLM's cache moved on
    turns: tuple = (3, 10)
    system_prompts: int = 8
    system_chunks: tuple = (2, 6)
    documents: int = 60
    document_chunks: tuple = (4, 16)
    document_share: float = 0.6  # conversations that attach a document
    turn_chunks: tuple = (1, 4)  # new chunks per turn (the user's message and the last answer)
    zipf: float = 1.0
    gpu_share: float = 0.05  # vLLM's prefix cache in front, in chunks, as a share of the working set
    put_rounds: int = 3  # replays per policy at 50 % for the whole put's CPU
    chunk_tokens: int = 256
    capacities: tuple = (0.25, 0.5, 1.0)
    samples: int = 20
    cpu_rounds: int = 5
    cpu_keys: int = 20000
    extent_slots: int = 16  # slots per extent in the extent rows (0: no extent rows)
    seed: int = 7

    def describe(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


SUITES = {
    "smoke": PrefixSettings(conversations=60, concurrency=20, documents=10, capacities=(0.5,), samples=4,
                            cpu_rounds=1, cpu_keys=2000, put_rounds=1),
    "quick": PrefixSettings(),
    "full": PrefixSettings(conversations=1500, concurrency=400, documents=150, cpu_rounds=9, cpu_keys=100000,
                           put_rounds=5),
}


def steps(s: PrefixSettings) -> int:
    extents = len(s.capacities) * len(EXTENT_POLICIES) if s.extent_slots else 0
    return (len(s.capacities) + s.put_rounds) * len(POLICIES) + 1 + extents


# --------------------------------------------------------------------------- the trace


def _zipf_weights(n: int, a: float) -> list[float]:
    return list(itertools.accumulate(1.0 / (i + 1) ** a for i in range(n)))


def make_trace(s: PrefixSettings) -> tuple[list[list[int]], dict[int, int | None]]:
    """The requests (each a prompt's chunk keys in order) and every key's predecessor."""
    rnd = random.Random(s.seed)
    pred: dict[int, int | None] = {}
    shared: dict[tuple[int | None, str, int, int], int] = {}  # (prefix key, kind, id, i) -> key
    counter = itertools.count(1)

    def chunk(prev: int | None, tag: tuple | None = None) -> int:
        if tag is not None:
            k = shared.get((prev, *tag))
            if k is not None:
                return k
        key = next(counter)
        pred[key] = prev
        if tag is not None:
            shared[(prev, *tag)] = key
        return key

    sys_len = [rnd.randint(*s.system_chunks) for _ in range(s.system_prompts)]
    doc_len = [rnd.randint(*s.document_chunks) for _ in range(s.documents)]
    sys_cum, doc_cum = _zipf_weights(s.system_prompts, s.zipf), _zipf_weights(s.documents, s.zipf)
    requests: list[list[int]] = []
    active: list[tuple[list[int], int] | None] = [None] * s.concurrency
    started = 0
    while started < s.conversations or any(active):
        i = rnd.randrange(s.concurrency)
        if active[i] is None:
            if started >= s.conversations:
                continue
            started += 1
            sp = rnd.choices(range(s.system_prompts), cum_weights=sys_cum)[0]
            prompt: list[int] = []
            prev = None
            for j in range(sys_len[sp]):
                prev = chunk(prev, ("sys", sp, j))
                prompt.append(prev)
            if rnd.random() < s.document_share:
                d = rnd.choices(range(s.documents), cum_weights=doc_cum)[0]
                for j in range(doc_len[d]):
                    prev = chunk(prev, ("doc", d, j))
                    prompt.append(prev)
            active[i] = (prompt, rnd.randint(*s.turns))
        prompt, left = active[i]  # type: ignore[misc]
        for _ in range(rnd.randint(*s.turn_chunks)):
            prompt.append(chunk(prompt[-1] if prompt else None))
        requests.append(list(prompt))
        active[i] = (prompt, left - 1) if left > 1 else None
    return requests, pred


def reachable(stored: set[int], pred: dict[int, int | None]) -> int:
    """How many of ``stored`` a prefix lookup can reach (every predecessor stored)."""
    memo: dict[int, bool] = {}

    def ok(k: int) -> bool:
        path = []
        node: int | None = k
        while node is not None and node not in memo:
            if node not in stored:
                memo[node] = False
                break
            path.append(node)
            node = pred[node]
        result = True if node is None else memo[node]
        for n in reversed(path):
            memo[n] = result
        return result

    return sum(1 for k in stored if ok(k))


# --------------------------------------------------------------------------- the plugin's world


class _Meta:
    __slots__ = ("shape", "dtype", "fmt", "cached_positions")

    def __init__(self, fmt: Any) -> None:
        self.shape = [PAYLOAD // 2]
        self.dtype = "bfloat16"
        self.fmt = fmt
        self.cached_positions = None


class _Obj:
    """A MemoryObj with reference counting over a ctypes buffer."""

    def __init__(self, fmt: Any, fill: int = 0) -> None:
        self._buf = (ctypes.c_uint8 * PAYLOAD)()
        if fill:
            ctypes.memset(self._buf, fill & 0xFF, PAYLOAD)
        self.byte_array = memoryview(self._buf).cast("B")
        self.metadata = _Meta(fmt)
        self._refs = 1
        self._lock = threading.Lock()

    @property
    def data_ptr(self) -> int:
        return ctypes.addressof(self._buf)

    def ref_count_up(self) -> None:
        with self._lock:
            self._refs += 1

    def ref_count_down(self) -> None:
        with self._lock:
            self._refs -= 1


class _LocalCPU:
    def __init__(self, fmt: Any) -> None:
        self.fmt = fmt

    def allocate(self, shape: Any, dtype: Any, fmt: Any = None, eviction: bool = True, busy_loop: bool = True) -> Any:
        return _Obj(self.fmt)

    def get_full_chunk_size_bytes(self) -> int:
        return PAYLOAD

    def get_memory_allocator(self) -> Any:
        return None


class _Config:
    def __init__(self, extra: dict) -> None:
        self.extra_config = extra


class _Metadata:
    world_size = 1
    worker_id = 0


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def open_backend(path: str, slots: int, policy: str, loop: Any, extent_slots: int = 0) -> Any:
    """The plugin over a sparse file of ``slots`` data slots under ``policy`` (with
    ``extent_slots``, extents of that many slots; the file then holds ``slots`` slots past the
    first extent boundary, plus one extent of slack)."""
    from lmcache_rawblock.plugin import RustRawBlockBackend
    from lmcache_rawblock.raw_block._lmcache import MemoryFormat

    extent = extent_slots * SLOT
    with open(path, "wb") as f:
        f.truncate(META + slots * SLOT + 2 * extent)
    extra = {"rust_raw_block.device_path": path, "rust_raw_block.block_align": 4096,
             "rust_raw_block.header_bytes": 4096, "rust_raw_block.slot_bytes": SLOT,
             "rust_raw_block.meta_total_bytes": META, "rust_raw_block.meta_enable_periodic": False,
             "rust_raw_block.eviction_policy": policy}
    if extent_slots:
        extra["rust_raw_block.extent_bytes"] = extent
    fmt = next(iter(MemoryFormat))
    return RustRawBlockBackend(config=_Config(extra), metadata=_Metadata(), local_cpu_backend=_LocalCPU(fmt),
                               loop=loop)


def _keys(requests: list[list[int]]) -> dict[int, Any]:
    from lmcache_rawblock.raw_block._lmcache import CacheEngineKey

    return {k: CacheEngineKey("bench", 1, 0, k, "bfloat16") for r in requests for k in r}


# --------------------------------------------------------------------------- the replay


def replay(s: PrefixSettings, requests: list[list[int]], pred: dict[int, int | None], keys: dict[int, Any],
           slots: int, policy: str, work: str, extent_slots: int = 0) -> dict:
    """The trace through a plugin of ``slots`` slots under ``policy``: its figures."""
    lt = _Loop()
    path = os.path.join(work, f"{policy}-{slots}.img")
    be = open_backend(path, slots, policy, lt.loop, extent_slots)
    fmt = be.local_cpu_backend.fmt
    put_obj = _Obj(fmt, 0x5A)
    by_enc = {k.to_string(): i for i, k in keys.items()}
    served = looked = stored_chunks = failed = 0
    put_cpu = 0.0
    samples: list[tuple[int, int]] = []
    every = max(1, len(requests) // max(1, s.samples))
    gpu: OrderedDict[int, None] = OrderedDict()  # vLLM's own prefix cache in front: an LRU of chunks
    try:
        usable = be._core.slot_counts().usable
        gpu_slots = int(s.gpu_share * len(pred))
        for n, prompt in enumerate(requests):
            first = _front_hits(gpu, prompt)
            ks = [keys[k] for k in prompt]
            hits = be.batched_contains(ks)  # LMCache looks the whole prompt up (no load, no touch)
            loaded = 0
            if hits > first:  # and loads only what vLLM does not hold already
                for o in be.batched_get_blocking(ks[first:hits]):
                    if o is None:
                        break
                    o.ref_count_down()
                    loaded += 1
            _front_put(gpu, prompt, gpu_slots)
            served += loaded
            looked += len(prompt) - first
            rest = ks[max(hits, first + loaded):]  # stored: what the tier did not have
            if rest:
                c0 = time.process_time()
                futs = be.batched_submit_put_task(rest, [put_obj] * len(rest)) or []
                for f in futs:
                    try:
                        f.result(60)
                    except RuntimeError:
                        failed += 1
                put_cpu += time.process_time() - c0
                stored_chunks += len(futs)
            if (n + 1) % every == 0:
                be.wait_idle(60)
                stored = {by_enc[e] for e in be._core.snapshot_indexed_keys()}
                samples.append((len(stored), reachable(stored, pred)))
        status = be.report_status()
    finally:
        be.close()
        lt.stop()
        os.unlink(path)
    tok = s.chunk_tokens
    device_bytes = usable * PAYLOAD
    late = samples[len(samples) // 2:] or samples  # after the cache filled
    return {"policy": policy, "slots": usable, "tokens_served": served * tok, "tokens_looked_up": looked * tok,
            "hit_ratio": served / looked if looked else 0.0, "tokens_per_device_byte": served * tok / device_bytes,
            "stored_chunks_mean": sum(a for a, _ in late) / len(late),
            "reachable_chunks_mean": sum(b for _, b in late) / len(late),
            "reachable_bytes_mean": sum(b for _, b in late) / len(late) * PAYLOAD,
            "reachable_share_mean": (sum(b / a for a, b in late if a) / max(1, sum(1 for a, _ in late if a))),
            "put_calls_chunks": stored_chunks, "put_failures": failed,
            "put_cpu_s_per_chunk": put_cpu / stored_chunks if stored_chunks else None,
            "evicted": status.get("evicted_ahead_entries", 0) + status.get("put_evicted_entries", 0)
            + status.get("evicted_extent_entries", 0),
            "evicted_extents": status.get("evicted_extents"),
            "extent_victims_not_oldest": status.get("extent_victims_not_oldest")}


def _front_hits(cpu: OrderedDict, prompt: list[int]) -> int:
    """The front cache's prefix hits for ``prompt`` (each moved to the recent end)."""
    n = 0
    for k in prompt:
        if k not in cpu:
            break
        cpu.move_to_end(k)
        n += 1
    return n


def _front_put(cpu: OrderedDict, keys: list[int], slots: int) -> None:
    for k in keys:
        cpu[k] = None
        cpu.move_to_end(k)
    while len(cpu) > slots:
        cpu.popitem(last=False)


# --------------------------------------------------------------------------- bookkeeping CPU


PHASES = ("store", "pick", "forget")


def bookkeeping_cpu(s: PrefixSettings, work: str) -> dict:
    """Process CPU per stored chunk of the order's bookkeeping alone (see the module
    docstring), best of ``cpu_rounds`` per policy, the policies alternating; with each
    phase's share: ``store`` (what a store call adds: under prefix learning the call's
    links, then recording the stored keys), ``pick`` (choosing an eviction batch's victims)
    and ``forget`` (dropping them), each per stored chunk."""
    from lmcache_rawblock.raw_block._lmcache import CacheEngineKey

    n = s.cpu_keys
    call = 8  # keys per store call
    enc = [CacheEngineKey("bench", 1, 0, 1_000_000 + i, "bfloat16").to_string() for i in range(2 * n)]
    lt = _Loop()
    out: dict[str, list[dict]] = {p: [] for p in POLICIES}
    try:
        bes = {p: open_backend(os.path.join(work, f"cpu-{p}.img"), 64, p, lt.loop) for p in POLICIES}
        try:
            for r in range(s.cpu_rounds):
                for p in (POLICIES if r % 2 == 0 else POLICIES[::-1]):
                    out[p].append(_bookkeeping_round(bes[p], enc, n, call))
        finally:
            for be in bes.values():
                be.close()
    finally:
        lt.stop()
    best = {p: min(r["total"] for r in v) for p, v in out.items()}
    phases = {p: {ph: min(r[ph] for r in v) for ph in PHASES} for p, v in out.items()}
    ratios = {ph: phases["prefix"][ph] / phases["lru"][ph] if phases["lru"][ph] else None for ph in PHASES}
    return {"keys": n, "keys_per_call": call, "cpu_s_per_put": best, "phases": phases, "phase_ratios": ratios,
            "rounds": {p: [r["total"] for r in v] for p, v in out.items()},
            "ratio": best["prefix"] / best["lru"] if best["lru"] else None}


def _bookkeeping_round(be: Any, enc: list[str], n: int, call: int) -> dict:
    """One round: fill the order with ``n`` keys (untimed), then time ``n`` more stored one
    call at a time; whenever the order holds more than ``n``, one eviction batch takes it down
    to 95 % (as evict-ahead does). Seconds per stored key, in all and by phase (each phase
    timed over a stretch of calls, so the clock's own cost stays out of the figures)."""
    with be._lru_lock:
        be._lru.clear()
        if be._prefix is not None:
            be._prefix.__init__()
    for i in range(0, n, call):
        _bk_store(be, enc[i:i + call])
    nothing: set[str] = set()
    held = n
    low = int(0.95 * n)
    spent = dict.fromkeys(PHASES, 0.0)
    clock = time.process_time
    i = n
    while i < 2 * n:
        c0 = clock()
        while i < 2 * n and held <= n:
            _bk_store(be, enc[i:i + call])
            held += call
            i += call
        c1 = clock()
        spent["store"] += c1 - c0
        if held > n:
            victims = be._pick_victims(held - low, nothing, frozenset(), nothing)
            c2 = clock()
            be._lru_forget(victims)
            spent["pick"] += c2 - c1
            spent["forget"] += clock() - c2
            held -= len(victims)
    out = {ph: t / n for ph, t in spent.items()}
    out["total"] = sum(spent.values()) / n
    return out


def _bk_store(be: Any, enc: list[str]) -> None:
    if be._prefix is not None:  # what batched_submit_put_task adds under prefix (keys encoded anyway)
        with be._lru_lock:
            be._prefix.note_call(enc)
    be._lru_touch(enc)  # what a put that stored the keys does


# --------------------------------------------------------------------------- the part


def run_prefix(s: PrefixSettings, bar: Any) -> dict:
    requests, pred = make_trace(s)
    keys = _keys(requests)
    working = len(pred)
    work = tempfile.mkdtemp(prefix="rb-prefix-")
    rows = []
    put_cpu: dict[str, list[float]] = {p: [] for p in POLICIES}
    try:
        for n, cap in enumerate(s.capacities):
            slots = max(8, round(cap * working))
            cell = {}
            for p in (POLICIES if n % 2 == 0 else POLICIES[::-1]):
                cell[p] = replay(s, requests, pred, keys, slots, p, work)
                bar.update(1)
            rows.append({"capacity": cap, **cell, "ratios": _ratios(cell["prefix"], cell["lru"])})
        for n in range(s.put_rounds):  # the whole put's CPU: more replays at 50 %, the order alternating
            for p in (POLICIES if n % 2 else POLICIES[::-1]):
                put_cpu[p].append(replay(s, requests, pred, keys, max(8, round(0.5 * working)), p,
                                         work)["put_cpu_s_per_chunk"])
                bar.update(1)
        cpu = bookkeeping_cpu(s, work)
        bar.update(1)
        extent_rows = run_extents(s, requests, pred, keys, work, bar) if s.extent_slots else []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    trace = {"requests": len(requests), "working_set_chunks": working,
             "chunks_looked_up": sum(map(len, requests)), "payload_bytes": PAYLOAD}
    put = {p: median(v) if v else None for p, v in put_cpu.items()}
    whole = {"cpu_s_per_chunk": put, "rounds": put_cpu,
             "ratio": put["prefix"] / put["lru"] if put["prefix"] and put["lru"] else None}
    return {"settings": s.describe(), "trace": trace, "rows": rows, "bookkeeping": cpu, "put_cpu": whole,
            "extent_rows": extent_rows, "verdict": verdict(rows, cpu, whole, extent_rows)}


def run_extents(s: PrefixSettings, requests: list[list[int]], pred: dict[int, int | None], keys: dict[int, Any],
                work: str, bar: Any) -> list[dict]:
    """The same trace with extents of ``extent_slots`` slots, plain extent eviction against
    prefix-weighted extent choice, at each capacity side by side."""
    rows = []
    working = len(pred)
    for n, cap in enumerate(s.capacities):
        slots = max(4 * s.extent_slots, round(cap * working))
        cell = {}
        for p in (EXTENT_POLICIES if n % 2 == 0 else EXTENT_POLICIES[::-1]):
            cell[p] = replay(s, requests, pred, keys, slots, p, work, s.extent_slots)
            bar.update(1)
        rows.append({"capacity": cap, **cell, "ratios": _ratios(cell["extent_prefix"], cell["extent"])})
    return rows


def _ratios(a: dict, b: dict) -> dict:
    def r(name: str) -> float | None:
        x, y = a.get(name), b.get(name)
        return x / y if x is not None and y else None

    return {"tokens_served": r("tokens_served"), "hit_ratio": r("hit_ratio"),
            "tokens_per_device_byte": r("tokens_per_device_byte"), "reachable_bytes": r("reachable_bytes_mean"),
            "put_cpu_per_chunk": r("put_cpu_s_per_chunk")}


def verdict(rows: list[dict], cpu: dict, whole: dict, extent_rows: list[dict] | None = None) -> dict:
    at50 = next((r["ratios"]["tokens_served"] for r in rows if r["capacity"] == 0.5), None)
    worst = min((r["ratios"]["tokens_served"] for r in rows if r["ratios"]["tokens_served"] is not None),
                default=None)
    put = whole.get("ratio")
    ext_worst = min((r["ratios"]["tokens_served"] for r in extent_rows or [] if r["ratios"]["tokens_served"] is not None),
                    default=None)
    return {"tokens_served_50": at50, "tokens_served_worst": worst, "goal_50": GOAL_TOKENS_50,
            "met_50": at50 is not None and at50 >= GOAL_TOKENS_50, "goal_never_worse": GOAL_NEVER_WORSE,
            "never_worse": worst is not None and worst >= GOAL_NEVER_WORSE,
            "put_cpu_ratio_50": put, "bookkeeping_cpu_ratio": cpu.get("ratio"), "goal_cpu": GOAL_CPU,
            "met_cpu": put is not None and put <= GOAL_CPU,
            "met_bookkeeping_cpu": cpu.get("ratio") is not None and cpu["ratio"] <= GOAL_CPU,
            "extent_tokens_served_worst": ext_worst,
            "extent_never_worse": ext_worst is None or ext_worst >= GOAL_NEVER_WORSE}


def _profile(s: PrefixSettings, work: str) -> None:
    """One bookkeeping round per policy under cProfile: the functions costing the most CPU of
    their own (the profiler's overhead per call inflates them all alike)."""
    import cProfile
    import pstats

    from lmcache_rawblock.raw_block._lmcache import CacheEngineKey

    n = s.cpu_keys
    enc = [CacheEngineKey("bench", 1, 0, 1_000_000 + i, "bfloat16").to_string() for i in range(2 * n)]
    lt = _Loop()
    try:
        for p in POLICIES:
            be = open_backend(os.path.join(work, f"prof-{p}.img"), 64, p, lt.loop)
            try:
                prof = cProfile.Profile()
                prof.runcall(_bookkeeping_round, be, enc, n, 8)
                print(f"--- {p}: one round under cProfile")
                pstats.Stats(prof).sort_stats("tottime").print_stats(8)
            finally:
                be.close()
    finally:
        lt.stop()


def main(argv: list[str] | None = None) -> int:
    """``python3 -m lmcache_rawblock_bench.prefix {bookkeeping,extent} [--suite S] [--out F]``:
    one piece of the part alone (the bookkeeping's CPU per chunk by phase, prefix against lru;
    or the extent rows), printed and written as JSON."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="lmcache_rawblock_bench.prefix")
    ap.add_argument("piece", choices=("bookkeeping", "extent"))
    ap.add_argument("--suite", choices=sorted(SUITES), default="quick")
    ap.add_argument("--rounds", type=int, help="bookkeeping rounds (default: the suite's cpu_rounds)")
    ap.add_argument("--out", help="write the figures here as JSON")
    ap.add_argument("--profile", action="store_true",
                    help="bookkeeping: also one round per policy under cProfile, its costliest functions")
    a = ap.parse_args(argv)
    s = SUITES[a.suite]
    if a.rounds:
        s = PrefixSettings(**{**asdict(s), "cpu_rounds": a.rounds})
    work = tempfile.mkdtemp(prefix="rb-prefix-")
    try:
        if a.piece == "bookkeeping":
            out: Any = bookkeeping_cpu(s, work)
            for p in POLICIES:
                print(p, " ".join(f"{ph} {out['phases'][p][ph] * 1e6:.3f}" for ph in PHASES),
                      f"total {out['cpu_s_per_put'][p] * 1e6:.3f} us per stored chunk")
            print("prefix/lru", " ".join(f"{ph} {out['phase_ratios'][ph]:.2f}" for ph in PHASES),
                  f"total {out['ratio']:.2f}")
            if a.profile:
                _profile(s, work)
        else:
            requests, pred = make_trace(s)

            class _NoBar:
                def update(self, _n: int) -> None:
                    pass

            out = {"settings": s.describe(), "working_set_chunks": len(pred),
                   "rows": run_extents(s, requests, pred, _keys(requests), work, _NoBar())}
            for r in out["rows"]:
                for p in EXTENT_POLICIES:
                    c = r[p]
                    print(f"{100 * r['capacity']:g} % {p:13s} slots {c['slots']:,} tokens served {c['tokens_served']:,}"
                          f" hit ratio {c['hit_ratio']:.3f} tokens/device B {c['tokens_per_device_byte']:.3f}"
                          f" reachable share {c['reachable_share_mean']:.3f} extents evicted {c['evicted_extents']}")
                print(f"  extent_prefix/extent tokens served {r['ratios']['tokens_served']:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
