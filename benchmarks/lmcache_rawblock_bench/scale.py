"""Scale part: what the metadata costs as the index grows, for both formats of our core (``v1``,
LMCache 0.5.6's JSON checkpoint of the whole index, and ``log``, superblocks + a compacted base
+ a log of change records) and LMCache's core side by side, in one run, as ratios.

Every core runs on a sparse file of its own with tiny slots (``block_align`` = ``header_bytes``
= 512, ``slot_bytes`` = 1024, payloads of ``PAYLOAD`` bytes): a million entries take a GiB of
file, ten million ten (4 slots per page-cache page, so the page cache holds the whole device).
The posix engine on the page cache, periodic checkpoints off.

Keys are LMCache-shaped object keys (what ``encode_object_key`` makes, built here directly and
checked against it): model ``meta-llama/Llama-3.1-8B-Instruct``, ``kv_rank`` 0..7,
``object_group_id`` 0, and a 32-byte chunk hash of its own per entry (blake2b of the entry's
number: 32 bytes of entropy, like ``benchmarks/mlog_size.py``'s ``random`` layout), so
112-character keys.

Variants: ``ours v1`` and ``ours log`` (``meta_format``), ``lmcache`` (``RawBlockCore`` of
``lmcache.v1.storage_backend.raw_block`` over the Rust wheel) where it is installed and the index
is not larger than ``lmcache_max_entries``.

* ``sizes``: per index size N, N puts (``put_many`` in batches), the first checkpoint (the first
  base of the log format), then rounds of 1 % churn (delete the oldest 1 %, put 1 % new) each
  followed by one timed ``checkpoint_now()``: wall and CPU time and the bytes it put on the
  device (v1: the payload length in the newest container header; log: ``bytes_written`` of
  ``status()['metadata_log']`` before and after, every group of the checkpoint). Then, log
  format, a full base (``compact_metadata()``, timed; ``base_last_bytes`` /
  ``base_last_seconds``), beside which the churn checkpoint is set; the v1 checkpoint is a full
  one by nature. Bytes per entry on the device: ``base_last_bytes`` / entries (log), the v1
  payload / entries. Index memory per entry (``index_memory_bytes()`` / N, and without the keys'
  own bytes). Reopen: close, then the constructor on the same file (page cache) with
  ``meta_verify_on_load`` False and True, alternating; the entries it found. With verification
  on, the slot headers it read per second beside fio's random-read IOPS over the same file at
  the same depth (``recovery_read_threads`` synchronous readers, 512-byte reads, page cache).
  The metadata region: v1 sized for two JSON copies of N; the log format is opened with
  LMCache's default ``meta_total_bytes`` (128 MiB), which on a blank device makes the core size
  the region from the slot count (at least 128 MiB, base areas of 64 bytes per slot); the
  harness computes the same size to make the file hold exactly the slots it wants, and checks
  the core chose it.
* ``limit``: the default region (128 MiB: two v1 containers of 64 MiB) and a v1 checkpoint of at
  most (container - header) / (bytes per entry) entries; probes at a fraction of that count put
  that many entries on a core with the default region and checkpoint: written, refused
  (raised), or skipped silently. The log format gets the same probes.
* ``full-cache puts``: a device of S slots all taken (a checkpoint written after the fill, as the
  periodic one would have), then P one-key puts of new keys, each timed, beside the same puts
  into a cache of S entries with room. Two ways: our plugin with ``eviction_policy: lru`` (ours
  only: LMCache's plugin has no eviction policy), and the core with MP-style eviction (LMCache's
  L2 eviction: one ``delete_many`` of the oldest ``eviction_ratio`` x S keys, timed apart, then
  the puts), and, to tell the core's part of the plugin's cost from the plugin's own, the core
  with the plugin's pattern (delete the oldest key, timed apart, then put one: ``each``; full
  only, over the core's rows with room). Each device runs the thread counts one after the other (a full MP-style device is
  topped up to full again, untimed, before its next batch delete); a case stops putting after
  ``put_budget_s`` (v1 pays two whole-index checkpoints per put on a full cache). Per case:
  p50 / p99 / max per put, failed puts, checkpoints written per put and those written to free a
  slot (``checkpoints_for_room``).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import shutil
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence
from urllib.parse import quote

from .common import MiB, Competitor, median, remove_file, sparse
from .core import PlainObj, close_core, open_core
from .plugin import _Config, _LocalCPU, _Metadata

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MODEL_Q = quote(MODEL, safe="")
ALIGN = 512
HEADER = 512
SLOT = 1024
PAYLOAD = 64
PUT_BATCH = 8192  # keys per put_many while filling
DEFAULT_META = 128 * MiB  # RawBlockCoreConfig's meta_total_bytes default
LOG_AREA_PER_SLOT = 64  # base-area bytes per slot of a region the core sizes (RB_MLOG_AREA_PER_SLOT)
HDR_FMT = "<8sIQQI"  # container header: magic, version, seq, payload length, crc32
MAGIC = b"LMCIDX01"
FORMATS = ("v1", "log")


@dataclass
class FullCase:
    """A full-cache case: ``slots`` slots all taken, then ``puts`` timed puts per thread count."""

    slots: int
    puts: int

    def describe(self) -> dict:
        return {"slots": self.slots, "puts": self.puts}


@dataclass
class ScaleSettings:
    sizes: list[int]
    ckpt_rounds: int
    reopen_rounds: int
    reopen_rounds_large: int = 1  # N >= 1M
    churn: float = 0.01
    formats: list[str] = field(default_factory=lambda: list(FORMATS))
    v1_max_entries: int = 1_000_000  # larger indexes: v1 is not run (its region and rewrite grow with N)
    lmcache_max_entries: int = 1_000_000  # larger indexes: LMCache's core is not run
    limit_factors: list[float] = field(default_factory=lambda: [1.05])
    limit_meta_bytes: int = DEFAULT_META
    full: list[FullCase] = field(default_factory=lambda: [FullCase(2000, 300)])
    threads: list[int] = field(default_factory=lambda: [1])
    eviction_ratio: float = 0.2  # LMCache's L2 eviction default
    put_budget_s: float = 10.0  # per case and thread count: stop putting after this long
    lmcache_ckpt_rounds_large: int = 1  # LMCache's core at N >= 1M (its checkpoint takes ~10 s there)
    fio_seconds: float = 2.0  # fio's random-read run beside the verified reopen; 0: none

    def describe(self) -> dict:
        return {"sizes": list(self.sizes), "ckpt_rounds": self.ckpt_rounds, "reopen_rounds": self.reopen_rounds,
                "reopen_rounds_large": self.reopen_rounds_large, "churn": self.churn, "formats": list(self.formats),
                "v1_max_entries": self.v1_max_entries, "lmcache_max_entries": self.lmcache_max_entries,
                "limit_factors": list(self.limit_factors), "limit_meta_bytes": self.limit_meta_bytes,
                "full": [c.describe() for c in self.full], "threads": list(self.threads),
                "eviction_ratio": self.eviction_ratio, "put_budget_s": self.put_budget_s,
                "lmcache_ckpt_rounds_large": self.lmcache_ckpt_rounds_large,
                "fio_seconds": self.fio_seconds, "block_align": ALIGN, "header_bytes": HEADER, "slot_bytes": SLOT,
                "payload_bytes": PAYLOAD, "io_engine": "posix", "medium": "page cache", "model": MODEL,
                "chunk_hash_bytes": 32}


SUITES = {
    "smoke": ScaleSettings(sizes=[1000], ckpt_rounds=1, reopen_rounds=1, limit_meta_bytes=MiB,
                           full=[FullCase(200, 20)], put_budget_s=10.0, fio_seconds=0.0),
    "quick": ScaleSettings(sizes=[10_000, 100_000], ckpt_rounds=3, reopen_rounds=3,
                           full=[FullCase(2000, 300)], threads=[1, 8], put_budget_s=10.0, fio_seconds=1.0),
    "full": ScaleSettings(sizes=[100_000, 1_000_000], ckpt_rounds=3, reopen_rounds=3,
                          limit_factors=[0.95, 1.05], full=[FullCase(20_000, 500), FullCase(1_000_000, 300)],
                          threads=[1, 8]),
}


def steps(s: ScaleSettings) -> int:
    return len(s.sizes) + (1 if s.limit_factors else 0) + len(s.full)


# --------------------------------------------------------------------------- variants


@dataclass(frozen=True)
class Variant:
    """One implementation under test: our core in one metadata format, or LMCache's core."""

    comp: Competitor
    fmt: str | None = None  # ours: "v1" / "log"

    @property
    def name(self) -> str:
        return f"{self.comp.name} {self.fmt}" if self.fmt else self.comp.name

    @property
    def ours(self) -> bool:
        return self.comp.name == "ours"


def variants(comps: Sequence[Competitor], formats: Sequence[str]) -> list[Variant]:
    out: list[Variant] = []
    for c in comps:
        if not c.available:
            continue
        if c.name == "ours":
            out += [Variant(c, f) for f in formats]
        else:
            out.append(Variant(c))
    return out


def runs_at(v: Variant, n: int, s: ScaleSettings) -> str | None:
    """None when v runs at index size n, else why not."""
    if v.ours and v.fmt == "v1" and n > s.v1_max_entries:
        return (f"not run past {s.v1_max_entries:,} entries (v1_max_entries): a v1 checkpoint of {n:,} entries "
                f"needs a region of about {meta_for(n) / MiB:,.0f} MiB and rewrites half of it every time")
    if not v.ours and n > s.lmcache_max_entries:
        return f"not run past {s.lmcache_max_entries:,} entries (lmcache_max_entries)"
    return None


# --------------------------------------------------------------------------- keys, files, containers


def _identity(encoded: str) -> int:
    # encode_object_key's slot identity (lmcache_rawblock.raw_block.key_codec)
    return int.from_bytes(hashlib.blake2b(encoded.encode("utf-8"), digest_size=8).digest(), "little")


def encoded_key(i: int) -> str:
    """The i-th key: LMCache's encoding of ObjectKey(model, kv_rank i % 8, group 0, a 32-byte hash)."""
    h = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=32).hexdigest()
    return f"{MODEL_Q}@0x{i % 8:08x}@0@{h}"


def object_keys(n: int, start: int = 0) -> list:
    """n LMCache-shaped object keys (RawBlockKeySpec), numbered from start (deterministic)."""
    from lmcache_rawblock.raw_block import RawBlockKeySpec

    out = []
    for i in range(start, start + n):
        e = encoded_key(i)
        out.append(RawBlockKeySpec(encoded=e, slot_identity=_identity(e)))
    return out


def check_keys() -> None:
    """The keys built here are the package's own encoding of such ObjectKeys."""
    from lmcache_rawblock.raw_block import encode_object_key
    from lmcache_rawblock.raw_block._lmcache import ObjectKey

    for i in (0, 5, 12345):
        h = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=32).digest()
        want = encode_object_key(ObjectKey(chunk_hash=h, model_name=MODEL, kv_rank=i % 8))
        if object_keys(1, i)[0] != want:
            raise RuntimeError(f"key {i}: built {object_keys(1, i)[0]!r}, encode_object_key gives {want!r}")


def meta_for(n: int) -> int:
    """A v1 metadata region with room for two checkpoint containers of n entries (~215 B each)."""
    need = 2 * (n * 280 + MiB)
    return -(-need // MiB) * MiB


def _log_area(m: int, ba: int = ALIGN) -> int:
    """A base area's bytes in a log-format region of m bytes (rb_mlog_layout_of); 0: too small."""
    c = m // 2 // ba * ba
    span = -(-256 // ba) * ba
    r = c // 4 // ba * ba
    return c - r - span if r >= 4 * ba and c >= span + r + 4 * ba else 0


def meta_log_for(slots: int) -> int:
    """The region the core gives a blank log-format device of ``slots`` slots when opened with
    LMCache's default ``meta_total_bytes`` (rb_mlog_auto_meta_total: the smallest multiple of
    1 MiB, at least 128 MiB, whose base areas hold 64 bytes for every slot left). A file of
    this plus slots x SLOT bytes has exactly ``slots`` slots under that rule."""
    m = max(DEFAULT_META, -(-int(2 * (LOG_AREA_PER_SLOT * slots + MiB) / 0.75) // MiB) * MiB)
    while _log_area(m) // LOG_AREA_PER_SLOT < slots:
        m += MiB
    while m - MiB >= DEFAULT_META and _log_area(m - MiB) // LOG_AREA_PER_SLOT >= slots:
        m -= MiB
    return m


def region_for(v: Variant, n: int, slots: int) -> int:
    return meta_log_for(slots) if v.fmt == "log" else meta_for(n)


def newest_container(path: str, meta: int) -> tuple[int, int] | None:
    """(seq, payload length) of the newest v1 container header in the metadata region; None if none."""
    best = None
    with open(path, "rb") as f:
        for k in range(2):
            f.seek(k * (meta // 2))
            m, v, seq, plen, _crc = struct.unpack(HDR_FMT, f.read(struct.calcsize(HDR_FMT)))
            if m == MAGIC and v == 1 and (best is None or seq > best[0]):
                best = (seq, plen)
    return best


def _open(v: Variant, path: str, meta: int, verify: bool = False) -> Any:
    """A core of v on path. The log format is opened as a user would, with LMCache's default
    ``meta_total_bytes``, and must size its region to ``meta`` (meta_log_for) itself."""
    kw: dict[str, Any] = {"meta_format": v.fmt} if v.ours else {}
    core = open_core(v.comp, path, block_align=ALIGN, header_bytes=HEADER, slot_bytes=SLOT,
                     meta_total_bytes=DEFAULT_META if v.fmt == "log" else meta, meta_verify_on_load=verify, **kw)
    if v.fmt == "log":
        got = _native_status(core).get("data_base_offset")
        if got != meta:
            close_core(core)
            raise RuntimeError(f"the log-format core sized its region {got} bytes, expected {meta}")
    return core


def _fill_keys(core: Any, keys: Sequence[Any], obj: Any) -> None:
    for i in range(0, len(keys), PUT_BATCH):
        part = keys[i:i + PUT_BATCH]
        res = core.put_many(part, [obj] * len(part))
        if not all(res.results):
            raise RuntimeError(f"put_many stored {sum(res.results)} of {len(part)} keys: {res.failure}")


def _fill(core: Any, start: int, n: int, obj: Any) -> None:
    """Put keys start .. start+n-1, built a batch at a time (a 10M-entry fill holds no key list)."""
    for i in range(start, start + n, PUT_BATCH):
        _fill_keys(core, object_keys(min(PUT_BATCH, start + n - i), i), obj)


def _status(core: Any) -> dict:
    try:
        return core.report_status()
    except Exception:  # noqa: BLE001 - a core without it
        return {}


def _native_status(core: Any) -> dict:
    nat = getattr(core, "_native", None)
    return nat.status() if nat is not None else {}


def _log_status(core: Any) -> dict:
    return _native_status(core).get("metadata_log") or {}


def _pct(vals: Sequence[float], q: float) -> float | None:
    if not vals:
        return None
    v = sorted(vals)
    return v[min(len(v) - 1, int(q * len(v)))]


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    gc.collect()
    c0, w0 = time.process_time(), time.perf_counter()
    got = fn()
    return time.perf_counter() - w0, time.process_time() - c0, got


# --------------------------------------------------------------------------- fio beside the verified reopen


def fio_randread(path: str, offset: int, length: int, jobs: int, seconds: float) -> dict:
    """fio's random 512-byte reads over [offset, offset + length) of path through the page cache
    with ``jobs`` synchronous readers (one read in flight each: the depth of the core's header
    readers there). {"iops", "command"} or {"error"}."""
    if shutil.which("fio") is None:
        return {"error": "fio not installed (make apt-deps installs it; or apt-get install fio)"}
    cmd = ["fio", "--name=headers", f"--filename={path}", "--ioengine=psync", "--direct=0", "--rw=randread",
           f"--bs={ALIGN}", f"--offset={offset}", f"--size={length}", f"--numjobs={jobs}", "--group_reporting",
           "--norandommap", "--invalidate=0", "--time_based", f"--runtime={seconds}", "--output-format=json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60 + 4 * seconds)
        if proc.returncode != 0:
            return {"error": f"fio exited {proc.returncode}: {proc.stderr.strip()[-300:]}", "command": cmd}
        job = json.loads(proc.stdout)["jobs"][0]
        return {"iops": job["read"]["iops"], "command": cmd}
    except (OSError, ValueError, KeyError, IndexError, subprocess.SubprocessError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "command": cmd}


# --------------------------------------------------------------------------- checkpoint, reopen, memory


def measure_size(v: Variant, n: int, s: ScaleSettings, workdir: str) -> dict:
    """One variant at index size n: checkpoint after churn beside a full base, bytes per entry,
    index memory, reopen (and fio beside it)."""
    k = max(1, int(n * s.churn))
    rounds = s.ckpt_rounds if v.ours or n < 1_000_000 else min(s.ckpt_rounds, s.lmcache_ckpt_rounds_large)
    slots = n + k * (rounds + 2)
    meta = region_for(v, n, slots)
    path = sparse(os.path.join(workdir, f"scale-{v.name.replace(' ', '-')}-{n}.img"), meta + slots * SLOT)
    obj = PlainObj(PAYLOAD, 0x5A)
    row: dict[str, Any] = {"impl": v.comp.name, "variant": v.name, "format": v.fmt or "v1", "entries": n,
                           "churn_keys": k, "ckpt_rounds": rounds, "meta_total_bytes": meta, "slots": slots}
    core = _open(v, path, meta)
    log = v.fmt == "log"
    try:
        t0 = time.perf_counter()
        _fill(core, 0, n, obj)
        row["fill_s"] = time.perf_counter() - t0
        w, c, _ = _timed(core.checkpoint_now)
        row.update(first_ckpt_s=w, first_ckpt_cpu_s=c)
        if log:
            row["first_base"] = {x: _log_status(core).get(x) for x in ("base_last_bytes", "base_last_seconds")}
        oldest, nxt = 0, n
        wall, cpu, sizes, groups = [], [], [], []
        for _ in range(rounds):
            core.delete_many([x.encoded for x in object_keys(k, oldest)])
            oldest += k
            _fill(core, nxt, k, obj)
            nxt += k
            before = _log_status(core) if log else newest_container(path, meta)
            w, c, _ = _timed(core.checkpoint_now)
            wall.append(w)
            cpu.append(c)
            if log:
                after = _log_status(core)
                if after["bytes_written"] == before["bytes_written"]:
                    raise RuntimeError("checkpoint_now() wrote no log group")
                sizes.append(after["bytes_written"] - before["bytes_written"])
                groups.append(after["groups_written"] - before["groups_written"])
            else:
                after = newest_container(path, meta)
                if after is None or after == before:
                    raise RuntimeError("checkpoint_now() wrote no container header")
                sizes.append(after[1])
        row.update({"ckpt_s": median(wall), "ckpt_cpu_s": median(cpu), "ckpt_bytes": median(sizes),
                    "ckpt_samples_s": wall, "ckpt_samples_bytes": sizes})
        if log:
            row["ckpt_groups"] = median(groups)
            w, c, done = _timed(core._native.compact_metadata)
            st = _log_status(core)
            row["base"] = {"wall_s": w, "cpu_s": c, "written": bool(done), "bytes": st.get("base_last_bytes"),
                           "entries": st.get("base_last_entries"), "core_seconds": st.get("base_last_seconds"),
                           "bases_written": st.get("bases_written"), "compactions": st.get("compactions")}
            row["metadata_log"] = st
            row["bytes_per_entry"] = st["base_last_bytes"] / st["base_last_entries"] if st.get(
                "base_last_entries") else None
            row["ckpt_vs_base_bytes"] = row["ckpt_bytes"] / st["base_last_bytes"] if st.get("base_last_bytes") else None
            row["ckpt_vs_base_s"] = row["ckpt_s"] / w if w else None
            row["ckpt_vs_base_cpu"] = row["ckpt_cpu_s"] / c if c else None
        else:
            row["bytes_per_entry"] = row["ckpt_bytes"] / n
        if hasattr(core, "index_memory_bytes"):
            mem = core.index_memory_bytes()
            key_bytes = (len(encoded_key(0)) + 1) * n  # every key has the same length
            row.update(index_memory_bytes=mem, index_memory_per_entry=mem / n,
                       index_memory_per_entry_without_keys=(mem - key_bytes) / n, key_bytes_per_entry=key_bytes / n)
        if v.ours:
            row["recovery_read_threads"] = core.config.recovery_read_threads
        close_core(core)
        core = None
        reps = s.reopen_rounds_large if n >= 1_000_000 else s.reopen_rounds
        times: dict[bool, list[float]] = {False: [], True: []}
        found: dict[bool, int] = {}
        for rnd in range(reps):
            for verify in ((False, True) if rnd % 2 == 0 else (True, False)):
                gc.collect()
                t0 = time.perf_counter()
                core = _open(v, path, meta, verify)
                times[verify].append(time.perf_counter() - t0)
                found[verify] = core.indexed_key_count()
                close_core(core)
                core = None
        row.update({"reopen_s": median(times[False]), "reopen_verify_s": median(times[True]),
                    "reopen_rounds": reps, "reopen_found": found[False], "reopen_verify_found": found[True]})
        if found[False] != n or found[True] != n:
            row["reopen_incomplete"] = f"reopen found {found[False]} (verify off) / {found[True]} (on) of {n} entries"
        if v.ours and s.fio_seconds > 0:
            jobs = int(row.get("recovery_read_threads") or 2)
            f = fio_randread(path, meta, n * SLOT, jobs, s.fio_seconds)
            row["fio"] = {**f, "jobs": jobs}
            if f.get("iops") and row["reopen_verify_s"]:
                row["fio"]["ours_headers_per_s"] = n / row["reopen_verify_s"]
                row["fio"]["ours_vs_fio"] = n / row["reopen_verify_s"] / f["iops"]
    finally:
        if core is not None:
            close_core(core)
        remove_file(path)
    return row


def probe_limit(v: Variant, n: int, meta: int, workdir: str) -> dict:
    """n entries on a core with a ``meta`` region (the log format: what the default gives it):
    does one checkpoint of them land?"""
    if v.fmt == "log":
        meta = meta_log_for(n + 2)
    path = sparse(os.path.join(workdir, f"scale-limit-{v.name.replace(' ', '-')}.img"), meta + (n + 2) * SLOT)
    out: dict[str, Any] = {"impl": v.comp.name, "variant": v.name, "entries": n, "meta_total_bytes": meta}
    core = _open(v, path, meta)
    log = v.fmt == "log"
    try:
        _fill(core, 0, n, PlainObj(PAYLOAD, 0x5A))
        before = _log_status(core) if log else newest_container(path, meta)
        t0 = time.perf_counter()
        try:
            core.checkpoint_now()
        except Exception as exc:  # noqa: BLE001 - the refusal is the figure
            out.update(outcome="refused", error=f"{type(exc).__name__}: {exc}")
        else:
            if log:
                after = _log_status(core)
                if after.get("bases_written", 0) > before.get("bases_written", 0):
                    out.update(outcome="written", ckpt_bytes=after["base_last_bytes"])
                else:
                    out["outcome"] = "skipped silently"
            else:
                after = newest_container(path, meta)
                if after is None or after == before:
                    out["outcome"] = "skipped silently"
                else:
                    out.update(outcome="written", ckpt_bytes=after[1])
        out["ckpt_s"] = time.perf_counter() - t0
        st = _status(core)
        if "checkpoint_too_large_count" in st:
            out["too_large_count"] = st["checkpoint_too_large_count"]
        if log:
            out["base_too_large"] = _log_status(core).get("base_too_large")
    finally:
        close_core(core)
        remove_file(path)
    return out


# --------------------------------------------------------------------------- full-cache puts


class RefObj(PlainObj):
    """A MemoryObj with the reference counting the plugin uses (no torch)."""

    def __init__(self, n: int, fill: int = 0):
        super().__init__(n, fill)
        self._refs = 1
        self._lock = threading.Lock()

    def ref_count_up(self) -> None:
        with self._lock:
            self._refs += 1

    def ref_count_down(self) -> None:
        with self._lock:
            self._refs -= 1

    def get_ref_count(self) -> int:
        return self._refs


def _cache_keys(n: int, start: int) -> list:
    from lmcache_rawblock.raw_block._lmcache import CacheEngineKey, torch

    dtype = torch.bfloat16 if torch is not None else "bfloat16"
    return [CacheEngineKey(MODEL, 1, 0, (i * 0x9E3779B97F4A7C15) & (1 << 64) - 1, dtype)
            for i in range(start, start + n)]


class _Driver:
    """One way of putting into a cache: fill, then ``put(key)`` one key at a time."""

    def __init__(self, kind: str, v: Variant, path: str, meta: int):
        self.kind = kind
        self.loop = None
        if kind == "plugin":
            from lmcache_rawblock.plugin import RustRawBlockBackend

            self.loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self._thread.start()
            extra = {"rust_raw_block.device_path": path, "rust_raw_block.slot_bytes": SLOT,
                     "rust_raw_block.header_bytes": HEADER, "rust_raw_block.block_align": ALIGN,
                     "rust_raw_block.meta_total_bytes": DEFAULT_META if v.fmt == "log" else meta,
                     "rust_raw_block.meta_enable_periodic": False,
                     "rust_raw_block.meta_verify_on_load": False, "rust_raw_block.eviction_policy": "lru",
                     "rust_raw_block.meta_format": v.fmt}
            self.be = RustRawBlockBackend(config=_Config(extra), metadata=_Metadata(), local_cpu_backend=_LocalCPU(PAYLOAD),
                                          loop=self.loop, dst_device="cpu")
            self.core = self.be._core
            self.obj = RefObj(PAYLOAD, 0x5A)
        else:
            self.core = _open(v, path, meta)
            self.obj = PlainObj(PAYLOAD, 0x5A)
        if v.ours:
            st = _native_status(self.core)
            if st.get("meta_format", "v1") != v.fmt or (v.fmt == "log" and st.get("data_base_offset") != meta):
                self.close()
                raise RuntimeError(f"{v.name}: the core writes meta_format {st.get('meta_format')!r} with a region "
                                   f"of {st.get('data_base_offset')} bytes, expected {meta}")

    def keys(self, n: int, start: int) -> list:
        return _cache_keys(n, start) if self.kind == "plugin" else object_keys(n, start)

    def fill(self, start: int, n: int) -> None:
        """Put keys start .. start+n-1 (untimed)."""
        for i in range(start, start + n, PUT_BATCH):
            keys = self.keys(min(PUT_BATCH, start + n - i), i)
            if self.kind == "plugin":
                from lmcache_rawblock.raw_block import encode_legacy_key

                _fill_keys(self.core, [encode_legacy_key(k) for k in keys], self.obj)
                self.be._lru_touch([k.to_string() for k in keys])
            else:
                _fill_keys(self.core, keys, self.obj)

    def put(self, key: Any) -> str | None:
        """Put one key: None when it was stored, else why not."""
        if self.kind == "plugin":
            futs = self.be.batched_submit_put_task([key], [self.obj])
            try:
                for f in futs or []:
                    f.result(120)
            except Exception as exc:  # noqa: BLE001 - a failed put is counted
                return str(exc)
            return None if futs and self.core.contains_key(key.to_string()) else "not stored"
        res = self.core.put_many([key], [self.obj])
        return None if res.results[0] else str(res.failure or "not stored")

    def delete_many(self, encoded: list[str]) -> None:
        for i in range(0, len(encoded), 65536):
            self.core.delete_many(encoded[i:i + 65536])

    def close(self) -> None:
        if self.kind == "plugin":
            try:
                self.be.close()
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(5)
                self.loop.close()
        else:
            close_core(self.core)


def measure_puts(kind: str, v: Variant, case: FullCase, full: bool, s: ScaleSettings, workdir: str) -> list[dict]:
    """Into one cache holding case.slots entries (full, or with room), for each thread count in
    turn: ``case.puts`` timed puts of new keys. One row per thread count."""
    phases = len(s.threads)
    slots = case.slots if full else case.slots + case.puts * phases + 16
    meta = meta_log_for(slots) if v.fmt == "log" else meta_for(case.slots + case.puts * phases + 16)
    path = sparse(os.path.join(workdir, f"scale-puts-{kind}-{v.name.replace(' ', '-')}.img"), meta + slots * SLOT)
    mp = kind == "core" and full  # MP-style: a batch delete of the oldest, then the puts
    each = kind == "each"  # the oldest key deleted before each put (the plugin's LRU, without the plugin)
    d = _Driver("plugin" if kind == "plugin" else "core", v, path, meta)
    rows: list[dict] = []
    try:
        t0 = time.perf_counter()
        d.fill(0, case.slots)
        d.core.checkpoint_now()
        fill_s = time.perf_counter() - t0
        oldest, nxt = 0, case.slots  # the live keys are oldest .. nxt-1 (MP-style), new keys from nxt
        for threads in s.threads:
            row: dict[str, Any] = {"impl": v.comp.name, "variant": v.name, "format": v.fmt or "v1", "path": kind,
                                   "slots": case.slots, "full": full, "threads": threads, "puts": case.puts,
                                   "meta_total_bytes": meta, "fill_s": fill_s}
            if mp:
                top = case.slots - d.core.indexed_key_count()
                if top > 0:  # full again (untimed), checkpointed as the periodic one would
                    d.fill(nxt, top)
                    nxt += top
                    d.core.checkpoint_now()
                ndel = max(case.puts, int(case.slots * s.eviction_ratio))
                victims = [k.encoded for k in object_keys(ndel, oldest)]
                w, _c, _ = _timed(lambda: d.delete_many(victims))
                oldest += ndel
                row.update(delete_keys=ndel, delete_s=w)
            olds = [k.encoded for k in object_keys(case.puts, oldest)] if each else []
            if each:
                oldest += case.puts
            new = d.keys(case.puts, nxt)
            nxt += case.puts
            st0, log0 = _status(d.core), _log_status(d.core)
            seq0 = (newest_container(path, meta) or (0, 0))[0]
            lat: list[list[float]] = [[] for _ in range(threads)]
            dele: list[list[float]] = [[] for _ in range(threads)]
            failed = [0] * threads
            whys: list[str] = []
            start = time.perf_counter()

            def worker(t: int) -> None:
                mine = olds[t::threads]
                for i, key in enumerate(new[t::threads]):
                    if time.perf_counter() - start > s.put_budget_s:
                        break
                    if each:
                        t0 = time.perf_counter()
                        d.core.delete_many([mine[i]])
                        dele[t].append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    why = d.put(key)
                    lat[t].append(time.perf_counter() - t0)
                    if why is not None:
                        failed[t] += 1
                        whys.append(why)

            gc.collect()
            start = time.perf_counter()
            if threads == 1:
                worker(0)
            else:
                ths = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
                for th in ths:
                    th.start()
                for th in ths:
                    th.join()
            row["wall_s"] = time.perf_counter() - start
            st1, log1 = _status(d.core), _log_status(d.core)
            seq1 = (newest_container(path, meta) or (0, 0))[0]
            alls = [x for xs in lat for x in xs]
            dels = [x for xs in dele for x in xs]
            if dels:
                row["delete_p50_s"] = _pct(dels, 0.5)
            done = len(alls)
            row.update({"puts_done": done, "p50_s": _pct(alls, 0.5), "p99_s": _pct(alls, 0.99),
                        "max_s": max(alls) if alls else None, "mean_s": sum(alls) / done if done else None,
                        "failed": sum(failed), "first_failure": whys[0] if whys else None,
                        "budget_hit": done < case.puts})
            for key, name in (("checkpoints_written", "ckpts_per_put"), ("checkpoints_for_room", "room_ckpts_per_put")):
                row[name] = (st1[key] - st0[key]) / done if done and key in st0 and key in st1 else None
            if row["ckpts_per_put"] is None and done and v.fmt != "log":
                # A core that does not count them (LMCache's): the container sequence on the device.
                row["ckpts_per_put"] = (seq1 - seq0) / done
                row["ckpts_from"] = "container sequence"
            if log1:
                row["log_groups_per_put"] = (log1["groups_written"] - log0["groups_written"]) / done if done else None
                row["log_bytes_per_put"] = (log1["bytes_written"] - log0["bytes_written"]) / done if done else None
                lane0, lane1 = (x.get("free_lane", {}).get("groups", 0) for x in (log0, log1))
                row["free_groups_per_put"] = (lane1 - lane0) / done if done else None  # deletes' FREE groups ahead
                row["compactions"] = log1["compactions"] - log0["compactions"]
            rows.append(row)
    finally:
        d.close()
        remove_file(path)
    return rows


# --------------------------------------------------------------------------- the part


def run_scale(comps: Sequence[Competitor], s: ScaleSettings, workdir: str, bar: Any) -> dict:
    """Every measurement of the part; a measurement that fails is reported under errors."""
    from .core import _quiet

    _quiet()
    check_keys()
    vs = variants(comps, s.formats)
    out: dict[str, Any] = {"settings": s.describe(), "rows": [], "limit": {}, "puts": [], "errors": {},
                           "notes": [], "competitors": [c.name for c in comps if c.available],
                           "variants": [v.name for v in vs], "skipped": []}
    for c in comps:
        if not c.available:
            out["notes"].append(f"{c.name}: not measured: {c.error}")

    def attempt(label: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            out["errors"][label] = f"{type(exc).__name__}: {exc}"
            return None

    for n in s.sizes:
        bar.set_description_str(f"scale {n:,} entries")
        for v in vs:
            why = runs_at(v, n, s)
            if why:
                out["skipped"].append({"variant": v.name, "entries": n, "why": why})
                continue
            r = attempt(f"{v.name}/{n}", lambda v=v: measure_size(v, n, s, workdir))
            if r:
                out["rows"].append(r)
            gc.collect()
        bar.update(1)
    if s.limit_factors:
        bar.set_description_str("scale default metadata region")
        cap = s.limit_meta_bytes // 2 - ALIGN
        lim: dict[str, Any] = {"meta_total_bytes": s.limit_meta_bytes, "payload_capacity": cap, "by_impl": {},
                               "probes": []}
        for v in vs:
            src = v if v.fmt != "log" else Variant(v.comp, "v1")  # the log format is probed at v1's counts
            rows = [r for r in out["rows"] if r["variant"] == src.name]
            if not rows:
                continue
            bpe = max(rows, key=lambda r: r["entries"])["bytes_per_entry"]
            lim["by_impl"][src.name] = {"bytes_per_entry": bpe, "max_entries": int(cap // bpe)}
            for f in s.limit_factors:
                n = int(cap // bpe * f)
                r = attempt(f"limit/{v.name}/{n}", lambda v=v, n=n: probe_limit(v, n, s.limit_meta_bytes, workdir))
                if r:
                    lim["probes"].append({**r, "factor": f, "max_entries": int(cap // bpe)})
        out["limit"] = lim
        bar.update(1)
    for case in s.full:
        bar.set_description_str(f"scale full-cache puts, {case.slots:,} slots")
        for kind in ("plugin", "core", "each"):
            for v in vs:
                if kind == "plugin" and not v.ours:
                    continue
                if not v.ours and case.slots > s.lmcache_max_entries:
                    continue
                for full in ((True,) if kind == "each" else (False, True)):
                    rs = attempt(f"puts/{kind}/{v.name}/{case.slots}/{'full' if full else 'room'}",
                                 lambda v=v, kind=kind, full=full: measure_puts(kind, v, case, full, s, workdir))
                    out["puts"] += rs or []
                    gc.collect()
        bar.update(1)
    if any(not v.ours for v in vs):
        out["notes"].append("lmcache: the full-cache puts through the plugin are ours only: LMCache's plugin has "
                            "no eviction policy (a put on its full device fails)")
    out["targets"] = targets(out)
    return out


# --------------------------------------------------------------------------- targets


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def put_ratios(sc: dict) -> list[dict]:
    """p50 and p99 of each full-cache row over the same case with room."""
    room = {(r["path"], r["variant"], r["slots"], r["threads"]): r for r in sc.get("puts", []) if not r["full"]}
    out = []
    for r in sc.get("puts", []):
        if not r["full"]:
            continue
        base = room.get(("core" if r["path"] == "each" else r["path"], r["variant"], r["slots"], r["threads"]))
        if base is None:
            continue
        out.append({"path": r["path"], "variant": r["variant"], "slots": r["slots"], "threads": r["threads"],
                    "p50_ratio": _ratio(r.get("p50_s"), base.get("p50_s")),
                    "p99_ratio": _ratio(r.get("p99_s"), base.get("p99_s")),
                    "failed": r.get("failed", 0) + base.get("failed", 0), "puts_done": r.get("puts_done")})
    return out


def targets(sc: dict) -> list[dict]:
    """The log format's targets, each with the figure measured (log rows; v1 / LMCache beside)."""
    out: list[dict] = []

    def add(what: str, value: float | None, goal: float, shown: str, goal_text: str, detail: str = "") -> None:
        if value is None:
            return
        out.append({"label": what, "value": value, "goal": goal, "met": value <= goal, "shown": shown,
                    "goal_text": goal_text, "detail": detail})

    for p in put_ratios(sc):
        if p["variant"] != "ours log" or p["path"] == "each":  # "each" tells costs apart; no target of its own
            continue
        how = "plugin LRU" if p["path"] == "plugin" else "core, MP-style batch delete"
        add(f"put p50 full / room, {how}, {p['slots']:,} slots, {p['threads']} thr", p["p50_ratio"], 1.2,
            f"{p['p50_ratio']:.2f}x", "<= 1.2x", f"p99 {p['p99_ratio']:.2f}x" if p["p99_ratio"] else "")
        add(f"failed puts, {how}, {p['slots']:,} slots, {p['threads']} thr", p["failed"], 0, str(p["failed"]), "0",
            f"of {p['puts_done']} (full) + room")
    for r in sc.get("rows", []):
        if r["variant"] != "ours log":
            continue
        n = r["entries"]
        if r.get("ckpt_vs_base_bytes") is not None:
            add(f"checkpoint after 1 % churn / full base, bytes, {n:,} entries", r["ckpt_vs_base_bytes"], 0.02,
                f"{r['ckpt_vs_base_bytes'] * 100:.2f} %", "<= 2 %",
                f"{r['ckpt_bytes']:,.0f} of {r['base']['bytes']:,} B")
            add(f"checkpoint after 1 % churn / full base, time, {n:,} entries", r["ckpt_vs_base_s"], 0.02,
                f"{r['ckpt_vs_base_s'] * 100:.2f} %", "<= 2 %",
                f"{r['ckpt_s'] * 1e3:.1f} ms of {r['base']['wall_s'] * 1e3:.0f} ms; CPU "
                f"{r['ckpt_cpu_s'] * 1e3:.1f} of {r['base']['cpu_s'] * 1e3:.0f} ms = {r['ckpt_vs_base_cpu'] * 100:.2f} %")
        if r.get("bytes_per_entry") is not None and n >= 1_000_000:
            add(f"metadata bytes per entry on the device, {n:,} entries", r["bytes_per_entry"], 48,
                f"{r['bytes_per_entry']:.1f} B", "<= 48 B")
        if n >= 1_000_000 and not r.get("reopen_incomplete"):
            goal = 0.3 if n <= 1_000_000 else 3.0
            add(f"reopen, page cache, verify off, {n:,} entries", r.get("reopen_s"), goal,
                f"{r['reopen_s']:.3f} s", f"<= {goal:g} s")
            fio = r.get("fio") or {}
            add(f"reopen, page cache, verify on, {n:,} entries", r.get("reopen_verify_s"), goal,
                f"{r['reopen_verify_s']:.3f} s", f"<= {goal:g} s",
                f"{fio['ours_vs_fio']:.2f}x fio's IOPS" if fio.get("ours_vs_fio") else "")
        if r.get("index_memory_per_entry_without_keys") is not None:
            add(f"index memory per entry without the key, {n:,} entries", r["index_memory_per_entry_without_keys"],
                150, f"{r['index_memory_per_entry_without_keys']:.1f} B", "<= 150 B + key",
                f"{r['index_memory_per_entry']:.1f} B with the key")
    return out
