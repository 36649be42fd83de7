"""Rounds of put_many + load_many_into + delete_many of 64 x 64 KiB LMCache TensorMemoryObjs on a
posix page-cache core, for callgrind (valgrind deadlocks on the io_uring worker). The rounds run
inside functools.reduce, so its C function marks them for --toggle-collect:

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=functools_reduce \\
        /root/.pyenv/versions/3.11.7/bin/python3 benchmarks/scripts/floor/callgrind_put_load.py 100

(the interpreter's real binary: the pyenv shim breaks valgrind). The LMCache virtualenv's
site-packages are put first on sys.path; TREE (default: this checkout) is the tree imported, so
two builds can be counted alike. Divide the collected instructions by 64 x the rounds counted.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.environ.get("TREE", os.path.normpath(os.path.join(HERE, "..", "..", "..")))
sys.path[:0] = [TREE, os.path.join(TREE, "benchmarks")]
sys.path[:0] = [os.path.join(os.path.normpath(os.path.join(HERE, "..", "..", "..")), ".venv-lmcache", "lib",
                             f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")]

import torch  # noqa: E402

from lmcache_rawblock_bench.core import (BLOCK, CPU_KEYS, CPU_SIZE, MiB, Arena,  # noqa: E402
                                         object_keys, open_core, ours_core)
from lmcache_rawblock_bench.cpu import MEDIA, sparse  # noqa: E402


def main() -> None:
    rounds = int(sys.argv[1])
    torch.set_num_threads(1)
    logging.getLogger("lmcache_rawblock").setLevel(logging.ERROR)
    arena = Arena(2 * CPU_KEYS, CPU_SIZE, True)
    objs = [arena.obj(i, 0x41) for i in range(CPU_KEYS)]
    dst = [arena.obj(CPU_KEYS + i, 0) for i in range(CPU_KEYS)]
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        path = os.path.join(tmp, "cg.img")
        sparse(path, MiB + (CPU_KEYS + 2) * (CPU_SIZE + BLOCK))
        core = open_core(ours_core(), path, slot_bytes=CPU_SIZE + BLOCK, io_engine="posix",
                         meta_verify_on_load=False, **MEDIA["page cache"])
        keys = object_keys(CPU_KEYS)
        enc = [k.encoded for k in keys]

        def one(acc, _):
            core.put_many(keys, objs)
            core.load_many_into(enc, dst)
            core.delete_many(enc)
            return acc

        one(None, None)  # outside the count: the name table, the index's first growth
        functools.reduce(one, range(rounds), None)
        core.close()


if __name__ == "__main__":
    main()
