"""Interleaved A/B of put_many / load_many_into per-key CPU in one process, with LMCache's real
TensorMemoryObjs (run it with the LMCache virtualenv's python from the repository root):

    PYTHONPATH=.:benchmarks .venv-lmcache/bin/python benchmarks/scripts/floor/ab_metadata.py ENGINE MEDIUM ROUNDS

ENGINE is posix or io_uring; MEDIUM pc (page cache), od (O_DIRECT) or reg (O_DIRECT, registered
buffers). Three ways of doing the same 64 x 64 KiB put and load on one core, in turns (the order
alternating per round), each round as the bench's cpu rows do it (fresh keys, destinations zeroed
first, a delete after):

* ``python``: the facade as it was before the metadata moved to C: one ``_meta_of`` tuple per
  key for put_many, positions set on the objects by a Python loop after load_many_into (both
  through the binding's older argument forms, which it still takes);
* ``property``: the current facade with the ``obj.meta`` shortcut turned off (every object's
  ``metadata`` property is called, once per put and once per load);
* ``current``: the current facade.

Prints the median CPU (process_time) per key of each. The process is the same for all three,
so machine noise hits them alike; only their differences mean much.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time

import torch

from lmcache_rawblock_bench.core import (BLOCK, CPU_KEYS, CPU_SIZE, MiB, Arena, clear, object_keys, open_core,
                                         ours_core, payload)
from lmcache_rawblock_bench.cpu import MEDIA, REGISTERED, sparse, written
from lmcache_rawblock.raw_block import core as C
from lmcache_rawblock.raw_block._lmcache import positions_from_list
from lmcache_rawblock.raw_block.config import RawBlockPutManyResult, normalize_raw_block_placement_ids


def python_put(core, keys, objs):
    pids = normalize_raw_block_placement_ids(None, len(keys))
    enc = [k.encoded for k in keys]
    metas = [C._meta_of(o) for o in objs]
    results, stored, _failure = core._native.put_many(enc, [int(k.slot_identity) for k in keys], list(objs), pids, metas)
    return RawBlockPutManyResult(results=results, stored_keys=[enc[i] for i in stored])


def python_load(core, enc, objs):
    results, positions, errors = core._native.load_many_into(list(enc), list(objs))
    for ok, obj, pos in zip(results, objs, positions):
        if ok and getattr(obj, "metadata", None) is not None:
            obj.metadata.cached_positions = positions_from_list(pos)
    assert all(e is None for e in errors)
    return results


def without_shortcut(core, call):
    def run(*args):
        core._native._set_metadata_shortcut(None, None, None)
        try:
            return call(*args)
        finally:
            core._native._set_metadata_shortcut(*C._METADATA_SHORTCUT)
    return run


def main() -> None:
    engine, medium, rounds = sys.argv[1], {"pc": "page cache", "od": "O_DIRECT", "reg": REGISTERED}[sys.argv[2]], \
        int(sys.argv[3])
    torch.set_num_threads(1)
    logging.getLogger("lmcache_rawblock").setLevel(logging.ERROR)
    if C._METADATA_SHORTCUT is None:
        raise SystemExit("LMCache's TensorMemoryObj is not importable, or its metadata property changed")
    slot = CPU_SIZE + BLOCK
    arena = Arena(2 * CPU_KEYS, CPU_SIZE, True)
    objs = [arena.obj(i, 0x41 + i % 32) for i in range(CPU_KEYS)]
    dst = [arena.obj(CPU_KEYS + i, 0) for i in range(CPU_KEYS)]
    opts = MEDIA[medium]
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as tmp:
        path = os.path.join(tmp, "ab.img")
        size = MiB + (CPU_KEYS + 2) * slot
        written(path, size) if opts["use_odirect"] else sparse(path, size)
        core = open_core(ours_core(), path, slot_bytes=slot, io_engine=engine, meta_verify_on_load=False, **opts)
        if medium == REGISTERED:
            core.register_fixed_buffers_from_allocator(arena)
        ways = {
            "python": (lambda k, o: python_put(core, k, o), lambda e, o: python_load(core, e, o)),
            "property": (without_shortcut(core, core.put_many), without_shortcut(core, core.load_many_into)),
            "current": (core.put_many, core.load_many_into),
        }
        cpu: dict[str, tuple[list[float], list[float]]] = {w: ([], []) for w in ways}
        for rnd in range(rounds):
            keys = object_keys(CPU_KEYS, f"ab{rnd}")
            enc = [k.encoded for k in keys]
            for w in (list(ways) if rnd % 2 == 0 else list(ways)[::-1]):
                put, load = ways[w]
                for d in dst:
                    clear(d)
                p0 = time.process_time()
                res = put(keys, objs)
                p1 = time.process_time()
                got = load(enc, dst)
                p2 = time.process_time()
                if not all(res.results) or not all(got) or payload(dst[-1]) != payload(objs[-1]):
                    raise RuntimeError(f"{w}: put/load round trip failed")
                core.delete_many(enc)
                cpu[w][0].append((p1 - p0) / CPU_KEYS)
                cpu[w][1].append((p2 - p1) / CPU_KEYS)
        core.close()
    for w, (put_s, load_s) in cpu.items():
        print(f"{engine:8s} {sys.argv[2]:3s} {w:8s}  put {statistics.median(put_s) * 1e6:6.2f} us/key  "
              f"load {statistics.median(load_s) * 1e6:6.2f} us/key")


if __name__ == "__main__":
    main()
