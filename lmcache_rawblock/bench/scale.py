"""Scale part: what the v1 metadata (one JSON checkpoint of the whole index) costs as the index
grows, our core and LMCache's side by side; the baseline a log-structured format must beat.

Every core runs on a sparse file of its own with tiny slots (``block_align`` = ``header_bytes``
= 512, ``slot_bytes`` = 1024, payloads of ``PAYLOAD`` bytes), so a million entries fit in
about a GiB; the posix engine on the page cache, periodic checkpoints off.

Keys are LMCache-shaped object keys (``encode_object_key``): model
``meta-llama/Llama-3.1-8B-Instruct``, ``kv_rank`` 0..7, a 32-byte chunk hash (the shape of
LMCache 0.5.6's multiprocess mode; 112-character encoded keys).

* ``checkpoint``: per index size N, N puts, one untimed base checkpoint, then rounds of 1 %
  churn (delete the oldest 1 %, put 1 % new) each followed by one timed ``checkpoint_now()``:
  wall and CPU time, the bytes the checkpoint put on the device (the v1 container's payload
  length, read from the newest container header) and bytes per entry. The metadata region is
  sized for N (``meta_total_bytes``).
* ``limit``: the default region (``meta_total_bytes`` 128 MiB, two containers of 64 MiB) holds
  a checkpoint of at most (container - header) / (bytes per entry) entries, computed from the
  largest N measured; probes at a fraction of that count open a core with the default region,
  put that many entries and checkpoint: written, refused (raised), or skipped silently (no new
  container header on the device).
* ``reopen``: close, then the constructor on the same file (in the page cache) with
  ``meta_verify_on_load`` False and True, alternating; medians.
* ``index memory``: ``index_memory_bytes()`` / N (ours; LMCache's core does not report it).
* ``full-cache puts``: a device whose S slots are all taken, then P puts of new keys, one key
  per put, each timed: through our plugin with ``eviction_policy: lru`` (ours only: LMCache's
  plugin has no eviction policy), and through the core with MP-style deletes (delete the oldest
  key, then put one); beside the same puts on a cache of the same S entries with free room.
  A checkpoint is written after the fill (as the periodic one would have). Per case: p50 / p99
  per put, failed puts, checkpoints written per put and those written to free a slot
  (``checkpoints_for_room``), with 1 thread and, where the suite says so, 4 threads.
"""

from __future__ import annotations

import asyncio
import gc
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .common import MiB, Competitor, median, remove_file, sparse
from .core import PlainObj, close_core, open_core
from .plugin import _Config, _LocalCPU, _Metadata

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ALIGN = 512
HEADER = 512
SLOT = 1024
PAYLOAD = 64
PUT_BATCH = 1024
DEFAULT_META = 128 * MiB  # RawBlockCoreConfig's meta_total_bytes default
HDR_FMT = "<8sIQQI"  # container header: magic, version, seq, payload length, crc32
MAGIC = b"LMCIDX01"


@dataclass
class FullCase:
    """A full-cache case: ``slots`` slots all taken, then ``puts`` timed puts."""

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
    limit_factors: list[float] = field(default_factory=lambda: [1.05])
    limit_meta_bytes: int = DEFAULT_META
    full: list[FullCase] = field(default_factory=lambda: [FullCase(2000, 300)])
    threads: list[int] = field(default_factory=lambda: [1])

    def describe(self) -> dict:
        return {"sizes": list(self.sizes), "ckpt_rounds": self.ckpt_rounds, "reopen_rounds": self.reopen_rounds,
                "reopen_rounds_large": self.reopen_rounds_large, "churn": self.churn,
                "limit_factors": list(self.limit_factors), "limit_meta_bytes": self.limit_meta_bytes,
                "full": [c.describe() for c in self.full], "threads": list(self.threads),
                "block_align": ALIGN, "header_bytes": HEADER, "slot_bytes": SLOT, "payload_bytes": PAYLOAD,
                "io_engine": "posix", "medium": "page cache", "model": MODEL, "chunk_hash_bytes": 32}


SUITES = {
    "smoke": ScaleSettings(sizes=[1000], ckpt_rounds=1, reopen_rounds=1, limit_meta_bytes=MiB,
                           full=[FullCase(200, 20)]),
    "quick": ScaleSettings(sizes=[10_000, 100_000], ckpt_rounds=3, reopen_rounds=3,
                           full=[FullCase(2000, 300)], threads=[1, 4]),
    "full": ScaleSettings(sizes=[10_000, 100_000, 1_000_000], ckpt_rounds=3, reopen_rounds=3,
                          limit_factors=[0.95, 1.05], full=[FullCase(2000, 500), FullCase(20_000, 200)],
                          threads=[1, 4]),
}


def steps(s: ScaleSettings) -> int:
    return len(s.sizes) + (1 if s.limit_factors else 0) + len(s.full)


# --------------------------------------------------------------------------- keys, files, containers


def object_keys(n: int, start: int = 0) -> list:
    """n LMCache-shaped object keys (32-byte chunk hashes, kv_rank 0..7), numbered from start."""
    from lmcache_rawblock.raw_block import encode_object_key
    from lmcache_rawblock.raw_block._lmcache import ObjectKey

    return [encode_object_key(ObjectKey(chunk_hash=(i * 0x9E3779B97F4A7C15 & (1 << 256) - 1).to_bytes(32, "big"),
                                        model_name=MODEL, kv_rank=i % 8)) for i in range(start, start + n)]


def meta_for(n: int) -> int:
    """A metadata region with room for two checkpoint containers of n entries (~215 B each)."""
    need = 2 * (n * 280 + MiB)
    return -(-need // MiB) * MiB


def newest_container(path: str, meta: int) -> tuple[int, int] | None:
    """(seq, payload length) of the newest container header in the metadata region; None if none."""
    best = None
    with open(path, "rb") as f:
        for k in range(2):
            f.seek(k * (meta // 2))
            m, v, seq, plen, _crc = struct.unpack(HDR_FMT, f.read(struct.calcsize(HDR_FMT)))
            if m == MAGIC and v == 1 and (best is None or seq > best[0]):
                best = (seq, plen)
    return best


def _open(comp: Competitor, path: str, meta: int, verify: bool = False) -> Any:
    return open_core(comp, path, block_align=ALIGN, header_bytes=HEADER, slot_bytes=SLOT, meta_total_bytes=meta,
                     meta_verify_on_load=verify)


def _fill(core: Any, keys: Sequence[Any], obj: Any) -> None:
    for i in range(0, len(keys), PUT_BATCH):
        part = keys[i:i + PUT_BATCH]
        res = core.put_many(part, [obj] * len(part))
        if not all(res.results):
            raise RuntimeError(f"put_many stored {sum(res.results)} of {len(part)} keys: {res.failure}")


def _status(core: Any) -> dict:
    try:
        return core.report_status()
    except Exception:  # noqa: BLE001 - a core without it
        return {}


def _pct(vals: Sequence[float], q: float) -> float | None:
    if not vals:
        return None
    v = sorted(vals)
    return v[min(len(v) - 1, int(q * len(v)))]


# --------------------------------------------------------------------------- checkpoint, reopen, memory


def measure_size(comp: Competitor, n: int, s: ScaleSettings, workdir: str) -> dict:
    """One implementation at index size n: checkpoint after churn, reopen, index memory."""
    meta = meta_for(n)
    k = max(1, int(n * s.churn))
    path = sparse(os.path.join(workdir, f"scale-{comp.name}-{n}.img"), meta + (n + k * (s.ckpt_rounds + 2)) * SLOT)
    obj = PlainObj(PAYLOAD, 0x5A)
    keys = object_keys(n)
    row: dict[str, Any] = {"impl": comp.name, "entries": n, "churn_keys": k, "meta_total_bytes": meta}
    core = _open(comp, path, meta)
    try:
        t0 = time.perf_counter()
        _fill(core, keys, obj)
        row["fill_s"] = time.perf_counter() - t0
        core.checkpoint_now()
        live = list(keys)
        nxt = n
        wall, cpu, sizes = [], [], []
        for _ in range(s.ckpt_rounds):
            old, live = live[:k], live[k:]
            core.delete_many([x.encoded for x in old])
            new = object_keys(k, nxt)
            nxt += k
            _fill(core, new, obj)
            live += new
            before = newest_container(path, meta)
            gc.collect()
            c0, w0 = time.process_time(), time.perf_counter()
            core.checkpoint_now()
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
            after = newest_container(path, meta)
            if after is None or after == before:
                raise RuntimeError("checkpoint_now() wrote no container header")
            sizes.append(after[1])
        row.update({"ckpt_s": median(wall), "ckpt_cpu_s": median(cpu), "ckpt_bytes": median(sizes),
                    "ckpt_samples_s": wall})
        row["bytes_per_entry"] = row["ckpt_bytes"] / n
        if hasattr(core, "index_memory_bytes"):
            row["index_memory_bytes"] = core.index_memory_bytes()
            row["index_memory_per_entry"] = row["index_memory_bytes"] / n
        close_core(core)
        core = None
        reps = s.reopen_rounds_large if n >= 1_000_000 else s.reopen_rounds
        times: dict[bool, list[float]] = {False: [], True: []}
        for rnd in range(reps):
            for verify in ((False, True) if rnd % 2 == 0 else (True, False)):
                gc.collect()
                t0 = time.perf_counter()
                core = _open(comp, path, meta, verify)
                times[verify].append(time.perf_counter() - t0)
                got = core.indexed_key_count()
                close_core(core)
                core = None
                if got != n:
                    raise RuntimeError(f"reopen (verify {verify}) found {got} of {n} entries")
        row.update({"reopen_s": median(times[False]), "reopen_verify_s": median(times[True]),
                    "reopen_rounds": reps})
    finally:
        if core is not None:
            close_core(core)
        remove_file(path)
    return row


def probe_limit(comp: Competitor, n: int, meta: int, workdir: str) -> dict:
    """n entries on a core with a ``meta`` region: does one checkpoint of them land?"""
    path = sparse(os.path.join(workdir, f"scale-limit-{comp.name}.img"), meta + (n + 2) * SLOT)
    out: dict[str, Any] = {"impl": comp.name, "entries": n, "meta_total_bytes": meta}
    core = _open(comp, path, meta)
    try:
        _fill(core, object_keys(n), PlainObj(PAYLOAD, 0x5A))
        before = newest_container(path, meta)
        t0 = time.perf_counter()
        try:
            core.checkpoint_now()
        except Exception as exc:  # noqa: BLE001 - the refusal is the figure
            out.update(outcome="refused", error=f"{type(exc).__name__}: {exc}")
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
    """One way of putting into a cache: fill, then ``put(i, t)`` for the i-th timed put of thread t."""

    def __init__(self, kind: str, comp: Competitor, path: str, meta: int, workdir: str):
        self.kind = kind
        self.loop = None
        if kind == "plugin":
            from lmcache_rawblock.plugin import RustRawBlockBackend

            self.loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self._thread.start()
            extra = {"rust_raw_block.device_path": path, "rust_raw_block.slot_bytes": SLOT,
                     "rust_raw_block.header_bytes": HEADER, "rust_raw_block.block_align": ALIGN,
                     "rust_raw_block.meta_total_bytes": meta, "rust_raw_block.meta_enable_periodic": False,
                     "rust_raw_block.meta_verify_on_load": False, "rust_raw_block.eviction_policy": "lru"}
            self.be = RustRawBlockBackend(config=_Config(extra), metadata=_Metadata(), local_cpu_backend=_LocalCPU(PAYLOAD),
                                          loop=self.loop, dst_device="cpu")
            self.core = self.be._core
            self.obj = RefObj(PAYLOAD, 0x5A)
            self.keys = _cache_keys
        else:
            self.core = _open(comp, path, meta)
            self.obj = PlainObj(PAYLOAD, 0x5A)
            self.keys = object_keys

    def fill(self, keys: list) -> None:
        if self.kind == "plugin":
            from lmcache_rawblock.raw_block import encode_legacy_key

            _fill(self.core, [encode_legacy_key(k) for k in keys], self.obj)
            self.be._lru_touch([k.to_string() for k in keys])
        else:
            _fill(self.core, keys, self.obj)
        self.core.checkpoint_now()

    def put(self, key: Any) -> str | None:
        """Put one key: None when it was stored, else why not."""
        if self.kind == "plugin":
            futs = self.be.batched_submit_put_task([key], [self.obj])
            try:
                for f in futs or []:
                    f.result(60)
            except Exception as exc:  # noqa: BLE001 - a failed put is counted
                return str(exc)
            return None if futs and self.core.contains_key(key.to_string()) else "not stored"
        res = self.core.put_many([key], [self.obj])
        return None if res.results[0] else str(res.failure or "not stored")

    def delete(self, key: Any) -> None:
        self.core.delete_many([key.encoded])

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


def measure_puts(kind: str, comp: Competitor, case: FullCase, full: bool, threads: int, workdir: str) -> dict:
    """P timed puts of new keys into a cache holding case.slots entries, full or with room."""
    slots = case.slots if full else case.slots + case.puts + 16
    meta = meta_for(case.slots + case.puts)
    path = sparse(os.path.join(workdir, f"scale-puts-{kind}-{comp.name}.img"), meta + slots * SLOT)
    row: dict[str, Any] = {"impl": comp.name, "path": kind, "slots": case.slots, "full": full, "threads": threads,
                           "puts": case.puts}
    d = _Driver(kind, comp, path, meta, workdir)
    try:
        resident = d.keys(case.slots, 0)
        d.fill(resident)
        new = d.keys(case.puts, case.slots)
        st0 = _status(d.core)
        seq0 = (newest_container(path, meta) or (0, 0))[0]
        lat: list[list[float]] = [[] for _ in range(threads)]
        dele: list[list[float]] = [[] for _ in range(threads)]
        failed = [0] * threads
        whys: list[str] = []
        mp = kind == "core" and full  # MP-style: delete the oldest, then put

        def worker(t: int) -> None:
            mine = new[t::threads]
            oldest = resident[t::threads]
            for i, key in enumerate(mine):
                if mp:
                    t0 = time.perf_counter()
                    d.delete(oldest[i])
                    dele[t].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                why = d.put(key)
                lat[t].append(time.perf_counter() - t0)
                if why is not None:
                    failed[t] += 1
                    whys.append(why)

        gc.collect()
        t0 = time.perf_counter()
        if threads == 1:
            worker(0)
        else:
            ths = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
        row["wall_s"] = time.perf_counter() - t0
        st1 = _status(d.core)
        seq1 = (newest_container(path, meta) or (0, 0))[0]
        alls = [x for xs in lat for x in xs]
        dels = [x for xs in dele for x in xs]
        row.update({"p50_s": _pct(alls, 0.5), "p99_s": _pct(alls, 0.99), "max_s": max(alls) if alls else None,
                    "mean_s": sum(alls) / len(alls) if alls else None, "failed": sum(failed),
                    "delete_p50_s": _pct(dels, 0.5) if dels else None,
                    "first_failure": whys[0] if whys else None})
        for key, name in (("checkpoints_written", "ckpts_per_put"), ("checkpoints_for_room", "room_ckpts_per_put")):
            row[name] = (st1[key] - st0[key]) / case.puts if key in st0 and key in st1 else None
        if row["ckpts_per_put"] is None:
            # A core that does not count them (LMCache's): the container sequence on the device.
            row["ckpts_per_put"] = (seq1 - seq0) / case.puts
            row["ckpts_from"] = "container sequence"
    finally:
        d.close()
        remove_file(path)
    return row


# --------------------------------------------------------------------------- the part


def run_scale(comps: Sequence[Competitor], s: ScaleSettings, workdir: str, bar: Any) -> dict:
    """Every measurement of the part; a measurement that fails is reported under errors."""
    from .core import _quiet

    _quiet()
    have = [c for c in comps if c.available]
    out: dict[str, Any] = {"settings": s.describe(), "rows": [], "limit": {}, "puts": [], "errors": {},
                           "notes": [], "competitors": [c.name for c in have]}
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
        for c in have:
            r = attempt(f"{c.name}/{n}", lambda c=c: measure_size(c, n, s, workdir))
            if r:
                out["rows"].append(r)
        bar.update(1)
    if s.limit_factors:
        bar.set_description_str("scale default metadata region")
        cap = s.limit_meta_bytes // 2 - ALIGN
        lim: dict[str, Any] = {"meta_total_bytes": s.limit_meta_bytes, "payload_capacity": cap, "by_impl": {},
                               "probes": []}
        for c in have:
            rows = [r for r in out["rows"] if r["impl"] == c.name]
            if not rows:
                continue
            bpe = max(rows, key=lambda r: r["entries"])["bytes_per_entry"]
            lim["by_impl"][c.name] = {"bytes_per_entry": bpe, "max_entries": int(cap // bpe)}
            for f in s.limit_factors:
                n = int(cap // bpe * f)
                r = attempt(f"limit/{c.name}/{n}", lambda c=c, n=n: probe_limit(c, n, s.limit_meta_bytes, workdir))
                if r:
                    lim["probes"].append({**r, "factor": f})
        out["limit"] = lim
        bar.update(1)
    for case in s.full:
        bar.set_description_str(f"scale full-cache puts, {case.slots:,} slots")
        for threads in s.threads:
            for kind in ("plugin", "core"):
                for c in have:
                    if kind == "plugin" and c.name != "ours":
                        continue
                    for full in (False, True):
                        r = attempt(f"puts/{kind}/{c.name}/{case.slots}/{'full' if full else 'room'}/{threads}t",
                                    lambda c=c, kind=kind, full=full, threads=threads:
                                    measure_puts(kind, c, case, full, threads, workdir))
                        if r:
                            out["puts"].append(r)
        bar.update(1)
    if any(c.name == "lmcache" for c in have):
        out["notes"].append("lmcache: the full-cache puts through the plugin are ours only: LMCache's plugin has "
                            "no eviction policy (a put on its full device fails)")
    return out
