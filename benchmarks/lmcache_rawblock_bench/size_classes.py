"""Space with size classes: payload bytes stored per byte of the data area when a device is
filled with a stream of objects of mixed sizes, fixed slots (``size_classes`` 1) against
``size_classes`` 2 and 4, side by side on the same stream, in one run.

The objects are LMCache's chunks, scaled down (a full chunk is ``--chunk`` bytes; every ratio
below is a ratio of bytes, so the scale changes only block_align rounding):

* ``full``: LMCache's store defaults (``save_unfull_chunk: false``): every object a full chunk.
  The case with one size only: size classes must cost nothing here beyond their slot ids.
* ``unfull_long``: ``save_unfull_chunk: true`` with prompts of 256-8192 tokens (uniform), 256
  tokens a chunk: each request stores its full chunks and one partial last chunk of (length mod
  256) tokens (~6 % of the objects partial).
* ``unfull_chat``: the same with chat-turn prompts of 1-1024 tokens (~45 % partial).
* ``fp8_half``: two models on one device (MP mode), one serving fp8 KV (LMCache's serde halves
  the bytes of a bf16 chunk): half the requests' chunks are half a chunk, no partial chunks.
* ``mixed``: ``fp8_half`` with ``save_unfull_chunk: true`` and 1-4096-token prompts.

Each configuration gets its own sparse file (tmpfs by default), the log format, extents of
``--extent-slots`` full slots, no eviction: objects are put in stream order until 256 puts in a
row fail (a class with no extent left refuses its objects while others still take theirs), and
the figure is the payload bytes indexed over the data area's bytes.

Run: PYTHONPATH=benchmarks python3 -m lmcache_rawblock_bench.size_classes [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
from typing import Any, Iterator

from .common import MiB
from .core import config_kwargs, make_obj

HEADER = 4096
TOKENS = 256  # LMCache's default chunk_size
WORKLOADS = ("full", "unfull_long", "unfull_chat", "fp8_half", "mixed")


def _requests(name: str, chunk: int, rng: random.Random) -> Iterator[list[int]]:
    """Each request's object sizes, in order."""
    lo, hi, unfull, fp8 = {"full": (TOKENS, 8192, False, False), "unfull_long": (TOKENS, 8192, True, False),
                           "unfull_chat": (1, 1024, True, False), "fp8_half": (TOKENS, 8192, False, True),
                           "mixed": (1, 4096, True, True)}[name]
    while True:
        tokens = rng.randint(lo, hi)
        full = chunk // 2 if fp8 and rng.random() < 0.5 else chunk
        sizes = [full] * (tokens // TOKENS)
        if unfull and tokens % TOKENS:
            sizes.append(max(1, full * (tokens % TOKENS) // TOKENS))
        if sizes:
            yield sizes


def fill(path: str, workload: str, classes: int, chunk: int, ext_slots: int, seed: int) -> dict:
    from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig, encode_object_key
    from lmcache_rawblock.raw_block._lmcache import ObjectKey

    slot = HEADER + chunk
    cfg = config_kwargs(path, slot_bytes=slot, header_bytes=HEADER, meta_format="log", meta_total_bytes=8 * MiB,
                        extent_bytes=ext_slots * slot, size_classes=classes, deallocate_freed="off")
    core = RawBlockCore(RawBlockCoreConfig(**cfg), key_namespace="object")
    rng = random.Random(seed)
    objs: dict[int, Any] = {}
    stored = bytes_in = objects = refused = run = i = 0
    by_size: dict[str, list[int]] = {"full": [0, 0], "partial": [0, 0]}
    t0 = time.perf_counter()
    try:
        for sizes in _requests(workload, chunk, rng):
            for n in sizes:
                key = encode_object_key(ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="bench", kv_rank=0))
                i += 1
                obj = objs.get(n) or objs.setdefault(n, make_obj(n, 0x5A))
                ok = core.put_many([key], [obj]).results[0]
                kind = "full" if n in (chunk, chunk // 2) else "partial"
                by_size[kind][0] += 1
                bytes_in += n
                if ok:
                    stored += n
                    objects += 1
                    by_size[kind][1] += 1
                    run = 0
                else:
                    refused += 1
                    run += 1
            if run >= 256:
                break
        st = core._native.status()
    finally:
        core.close()
    data = st["capacity_bytes"] - st["data_base_offset"] if "data_base_offset" in st else None
    return {"workload": workload, "size_classes": classes, "objects_stored": objects, "payload_bytes": stored,
            "data_area_bytes": data, "stored_per_device_byte": round(stored / data, 4) if data else None,
            "puts_refused": refused, "puts": i, "mean_object_bytes": round(bytes_in / max(1, i)),
            "partial_fraction": round(by_size["partial"][0] / max(1, i), 3),
            "class_slot_bytes": st.get("size_class_slot_bytes"), "class_extents": st.get("size_class_extents"),
            "extents_total": st["extents_total"], "seconds": round(time.perf_counter() - t0, 2)}


def _device(workdir: str, name: str, size: int) -> str:
    path = os.path.join(workdir, name)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def run(workdir: str, workloads: list[str], classes: list[int], chunk: int, ext_slots: int, dev_bytes: int,
        seed: int) -> dict:
    rows = []
    for w in workloads:
        for n in classes:
            path = _device(workdir, f"{w}-{n}.img", dev_bytes)
            try:
                rows.append(fill(path, w, n, chunk, ext_slots, seed))
            finally:
                os.unlink(path)
            print(json.dumps(rows[-1]), file=sys.stderr)
    by = {(r["workload"], r["size_classes"]): r["stored_per_device_byte"] for r in rows}
    gain = {w: {str(n): round(by[(w, n)] / by[(w, classes[0])], 3) for n in classes[1:]} for w in workloads}
    return {"chunk_bytes": chunk, "slot_bytes": HEADER + chunk, "extent_slots": ext_slots, "device_bytes": dev_bytes,
            "seed": seed, "rows": rows, "gain_over_fixed_slots": gain}


def _table(res: dict) -> str:
    classes = sorted({r["size_classes"] for r in res["rows"]})
    head = "| workload | partial objects | " + " | ".join(f"stored/device, {n} class{'es' * (n > 1)}" for n in classes)
    head += " | " + " | ".join(f"gain, {n} classes" for n in classes[1:]) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(classes) - 1)]
    for w, gains in res["gain_over_fixed_slots"].items():
        rs = {r["size_classes"]: r for r in res["rows"] if r["workload"] == w}
        cells = [w, f"{rs[classes[0]]['partial_fraction']:.1%}"] + [f"{rs[n]['stored_per_device_byte']:.3f}" for n in classes]
        cells += [f"{gains[str(n)]:.3f}x" for n in classes[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lmcache_rawblock_bench.size_classes", description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--classes", default="1,2,4", help="size_classes values, the first the baseline (1: fixed slots)")
    ap.add_argument("--chunk", type=int, default=256 * 1024, help="a full chunk's payload bytes")
    ap.add_argument("--extent-slots", type=int, default=32, help="extent_bytes in full slots")
    ap.add_argument("--device-mib", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None, help="where the sparse files go")
    ap.add_argument("--out", help="directory for results.json and table.md")
    a = ap.parse_args(argv)
    from lmcache_rawblock.lmcache_paths import raw_block_core_logger

    logging.getLogger(raw_block_core_logger()).setLevel(logging.ERROR)  # every refused put warns: the figure counts them
    workloads = [w for w in a.workloads.split(",") if w]
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        ap.error(f"--workloads: unknown {bad}; choose from {', '.join(WORKLOADS)}")
    classes = [int(x) for x in a.classes.split(",")]
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="rb-sizeclass-") as wd:
        res = run(wd, workloads, classes, a.chunk, a.extent_slots, a.device_mib * MiB, a.seed)
    res["command"] = "PYTHONPATH=benchmarks python3 -m lmcache_rawblock_bench.size_classes " + " ".join(argv or sys.argv[1:])
    table = _table(res)
    print(table)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(res, f, indent=1)
        with open(os.path.join(a.out, "table.md"), "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
