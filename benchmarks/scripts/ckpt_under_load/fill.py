"""Checkpoints while a cache fills at full speed: how many changes are made durable per minute.

    python3 benchmarks/scripts/ckpt_under_load/fill.py [--entries N] [--seconds S] [--out FILE]
        [--interval SEC] [--reopen]                                (from the repository root)

A log-format core (the product default) on a sparse file in /var/tmp with N slots of 1 KiB
(512 B header, 64 B payloads; the scale part's geometry), opened with the default settings a
user gets (meta_total_bytes at LMCache's default, so the region is sized from the slots; the
periodic checkpoint thread on, meta_checkpoint_interval_sec 60 unless --interval, the idle rule
of 100 ms). The main thread puts LMCache-shaped object keys (32-byte chunk hashes) in batches of
256 as fast as it can, with no pause, until N entries are in or S seconds have passed; a sampler
thread reads the status every second: checkpoints_written, metadata_persisted against
metadata_dirty_total (changes made durable / made), the journal's pending records and bytes,
index_memory_bytes(). Then one explicit checkpoint and close(); with --reopen, the device is
opened again in a new process (`python3 -c`, the constructor alone timed) and in this one.

Prints one line per sample and a summary; --out writes both as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "benchmarks")]

from lmcache_rawblock_bench.common import remove_file, sparse  # noqa: E402
from lmcache_rawblock_bench.core import PlainObj, close_core, open_core, ours_core  # noqa: E402
from lmcache_rawblock_bench.scale import ALIGN, DEFAULT_META, HEADER, PAYLOAD, SLOT, meta_log_for, object_keys  # noqa: E402

BATCH = 256


def _open(path: str, interval: int, verify: bool = False):
    return open_core(ours_core(), path, block_align=ALIGN, header_bytes=HEADER, slot_bytes=SLOT,
                     meta_total_bytes=DEFAULT_META, meta_format="log", meta_enable_periodic=True,
                     meta_checkpoint_interval_sec=interval, meta_idle_quiet_ms=100, meta_verify_on_load=verify)


def _sample(core, t0: float) -> dict:
    st = core._native.status()
    log = st.get("metadata_log") or {}
    return {"t": round(time.monotonic() - t0, 2), "indexed": st["indexed_key_count"],
            "changes": st["metadata_dirty_total"], "persisted": st["metadata_persisted"],
            "checkpoints_written": st["checkpoints_written"], "groups_written": log.get("groups_written"),
            "bases_written": log.get("bases_written"), "compactions": log.get("compactions"),
            "pending_pages": log.get("pending_pages"), "pending_records": log.get("pending_records"),
            "journal_bytes": log.get("journal_bytes"), "mem_bytes": core.index_memory_bytes(),
            "checkpoint_failures": st["checkpoint_failures"]}


def _sampler(core, t0: float, out: list, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        s = _sample(core, t0)
        out.append(s)
        print(json.dumps(s), flush=True)


def _fresh_process_reopen(path: str, interval: int) -> dict:
    """This script run again as `--reopen-child PATH`: a new process opens the device."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--reopen-child", path, "--interval", str(interval)],
                       check=True, capture_output=True, text=True)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    got["process_s"] = round(time.perf_counter() - t, 3)
    return got


def _reopen_child(path: str, interval: int) -> None:
    t = time.perf_counter()
    c = _open(path, interval)
    wall = time.perf_counter() - t
    st = c._native.status()
    print(json.dumps({"constructor_s": round(wall, 3), "recovery_seconds": round(st["recovery_seconds"], 3),
                      "indexed": st["indexed_key_count"]}))
    c.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=2_000_000)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--interval", type=int, default=60)
    ap.add_argument("--path", default="/var/tmp/ckpt-under-load.img")
    ap.add_argument("--out", default=None)
    ap.add_argument("--reopen", action="store_true")
    ap.add_argument("--reopen-child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.reopen_child:
        _reopen_child(a.reopen_child, a.interval)
        return
    if a.entries <= 0 or a.seconds <= 0 or a.interval <= 0:
        ap.error(f"--entries, --seconds and --interval must be > 0, got {a.entries}, {a.seconds}, {a.interval}")
    meta = meta_log_for(a.entries)
    path = sparse(a.path, meta + a.entries * SLOT)
    core = _open(path, a.interval)
    obj = PlainObj(PAYLOAD, 0x5A)
    samples: list = []
    stop = threading.Event()
    t0 = time.monotonic()
    first = _sample(core, t0)
    th = threading.Thread(target=_sampler, args=(core, t0, samples, stop), daemon=True)
    th.start()
    done = 0
    while done < a.entries and time.monotonic() - t0 < a.seconds:
        n = min(BATCH, a.entries - done)
        res = core.put_many(object_keys(n, done), [obj] * n)
        if not all(res.results):
            raise RuntimeError(f"put_many stored {sum(res.results)} of {n}: {res.failure}")
        done += n
    fill_s = time.monotonic() - t0
    stop.set()
    th.join()
    last = _sample(core, t0)
    t = time.perf_counter()
    core.checkpoint_now()
    final_ckpt_s = time.perf_counter() - t
    t = time.perf_counter()
    outcome = core.close()
    close_s = time.perf_counter() - t
    summary = {
        "entries_put": done, "fill_seconds": round(fill_s, 2), "puts_per_second": round(done / fill_s),
        "checkpoints_written_during_fill": last["checkpoints_written"] - first["checkpoints_written"],
        "changes_during_fill": last["changes"] - first["changes"],
        "persisted_during_fill": last["persisted"] - first["persisted"],
        "persisted_per_minute": round((last["persisted"] - first["persisted"]) * 60 / fill_s),
        "pending_records_at_end_of_fill": last["pending_records"],
        "journal_bytes_at_end_of_fill": last["journal_bytes"],
        "max_journal_bytes": max((s["journal_bytes"] or 0 for s in samples), default=None),
        "max_pending_records": max((s["pending_records"] or 0 for s in samples), default=None),
        "final_checkpoint_seconds": round(final_ckpt_s, 3), "close_seconds": round(close_s, 3),
        "close": outcome.reason, "region_bytes": meta,
    }
    if a.reopen:
        summary["reopen_fresh_process"] = _fresh_process_reopen(path, a.interval)
        t = time.perf_counter()
        c = _open(path, a.interval)
        summary["reopen_same_process_s"] = round(time.perf_counter() - t, 3)
        close_core(c)
    print(json.dumps(summary, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "summary": summary, "samples": [first, *samples, last]}, f, indent=1)
    remove_file(path)


if __name__ == "__main__":
    main()
