"""A fixed number of load_many_into calls of one load-check cell, the header check on or off, for
perf (``perf record -e cpu-clock -g``; this VM has no hardware counters) or callgrind:

    PYTHONPATH=.:benchmarks perf record -e cpu-clock -F 4999 -g -o on.data -- \\
        python3 benchmarks/scripts/load-check/profile_loads.py io_uring O_DIRECT /dev/shm on 20000

Arguments: engine (posix, io_uring), medium (O_DIRECT, "page cache"), directory, mode (on, off),
calls, and optionally chunk size in bytes (default 65536) and keys per call (default 64). The core
is built as the bench part builds it (benchmarks/lmcache_rawblock_bench/loadcheck.py); prints the
wall and CPU time per call. Same calls in both modes, so sample counts compare directly.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time

from lmcache_rawblock_bench.common import MiB, sparse
from lmcache_rawblock_bench.core import BLOCK, Arena, PlainObj, close_core, object_keys, open_core, ours_core
from lmcache_rawblock_bench.loadcheck import MEDIA


def main() -> None:
    engine, medium, directory, mode, calls = sys.argv[1:6]
    size = int(sys.argv[6]) if len(sys.argv) > 6 else 64 * 1024
    n = int(sys.argv[7]) if len(sys.argv) > 7 else 64
    logging.getLogger("lmcache_rawblock").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = sparse(os.path.join(tmp, "profile.img"), MiB + (n + 1) * (size + BLOCK))
        arena = Arena(n, size)
        dst = [arena.obj(i, 0) for i in range(n)]
        src = memoryview(os.urandom(n * size))
        keys = object_keys(n, "profile")
        enc = [k.encoded for k in keys]
        core = open_core(ours_core(), path, slot_bytes=size + BLOCK, io_engine=engine,
                         use_odirect=MEDIA[medium], enable_zero_copy=True)
        try:
            if engine == "io_uring":
                core.register_fixed_buffers_from_allocator(arena)
            assert all(core.put_many(keys, [PlainObj(size, view=src[i * size:(i + 1) * size])
                                            for i in range(n)]).results)
            core.hooks.set_load_check(mode == "on")
            assert all(core.load_many_into(enc, dst))
            assert all(dst[i].byte_array == src[i * size:(i + 1) * size] for i in range(n))
            w, c = time.perf_counter(), time.process_time()
            for _ in range(int(calls)):
                core.load_many_into(enc, dst)
            w, c = time.perf_counter() - w, time.process_time() - c
            print(f"{engine} {medium} {mode}: {w / int(calls) * 1e6:.1f} us wall, "
                  f"{c / int(calls) * 1e6:.1f} us CPU per call of {n} x {size} B")
        finally:
            close_core(core)


if __name__ == "__main__":
    main()
