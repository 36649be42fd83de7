"""Bytes per entry and one thread's speed of a metadata-log base (csrc/core/rb_mlog.c).

Keys are made by the package's object key codec (``object_key_to_string``, the same
function and output as LMCache's raw-block key codec) from ``ObjectKey``s shaped like
LMCache 0.5.6's multiprocess mode: model ``meta-llama/Llama-3.1-8B-Instruct``, kv_rank
0..7, object_group_id 0, no salt, and a chunk hash of 32 bytes (``TokenHasher`` with its
default blake3, or sha256_cbor: a 32-byte digest; the ``builtin`` hash gives 8 bytes, the
``--hash-bytes 8`` variant). One class for all, 8 MiB payloads, dense slots.

Layouts: ``random`` (every entry its own chunk hash and a random rank: nothing but the model
prefix repeats; the worst case for compression), ``tp8`` (the 8 ranks of one chunk hash in
consecutive slots, as a tensor-parallel store of 8 workers lands them).

Builds benchmarks/mlog_bench.c with the codec into build/mlog_bench and runs it per case.
Run from the repository root:

    python3 benchmarks/mlog_size.py                 # 100k and 1M entries, the table
    python3 benchmarks/mlog_size.py --levels 1,2,6,9 --sizes 1000000 --variants null
    python3 benchmarks/mlog_size.py --group 10000  # a log group of 10k PUTs + 10k FREEs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lmcache_rawblock.raw_block._lmcache import ObjectKey  # noqa: E402
from lmcache_rawblock.raw_block.key_codec import object_key_to_string  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BIN = os.path.join(ROOT, "build", "mlog_bench")
SRC = ["benchmarks/mlog_bench.c", "csrc/core/rb_mlog.c", "csrc/core/rb_mlog_read.c", "csrc/core/rb_ckpt.c",
       "csrc/core/rb_err.c"]


def build() -> None:
    os.makedirs(os.path.dirname(BIN), exist_ok=True)
    cc = os.environ.get("CC", "cc")
    # the decoder the extension uses (libdeflate), or zlib's with RB_MLOG_DECODER=zlib
    zlib_only = os.environ.get("RB_MLOG_DECODER") == "zlib"
    dec = [] if zlib_only else ["-DRB_HAVE_LIBDEFLATE"]
    libs = ([] if zlib_only else ["-ldeflate"]) + ["-ljson-c", "-lz", "-lpthread"]
    subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", *dec, "-Icsrc/core", *SRC,
                    *libs, "-o", BIN], cwd=ROOT, check=True)


def okey(chunk_hash: bytes, rank: int) -> ObjectKey:
    try:
        return ObjectKey(chunk_hash=chunk_hash, model_name=MODEL, kv_rank=rank, object_group_id=0)
    except TypeError:  # an ObjectKey without groups (LMCache before 0.5.6)
        return ObjectKey(chunk_hash=chunk_hash, model_name=MODEL, kv_rank=rank)


def write_keys(path: str, n: int, layout: str, hash_bytes: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        i = 0
        while i < n:
            h = rng.randbytes(hash_bytes)
            if layout == "tp8":
                for r in range(min(8, n - i)):
                    f.write(object_key_to_string(okey(h, r)) + "\n")
                i += 8
            else:
                f.write(object_key_to_string(okey(h, rng.randrange(8))) + "\n")
                i += 1


VARIANTS = {"null": [], "pos256": ["--pos", "256"], "checksum": ["--sum"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--layouts", default="random,tp8")
    ap.add_argument("--variants", default="null,pos256,checksum")
    ap.add_argument("--levels", default="1", help="zlib levels (the codec's default is 1; with --group, 0 = raw)")
    ap.add_argument("--hash-bytes", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3, help="runs per case; the fastest counts")
    ap.add_argument("--json", action="store_true", help="one JSON object a line instead of the table")
    ap.add_argument("--read", default="",
                    help="also read each base back through rb_mlog_read with these thread counts (e.g. 1,2,4)")
    ap.add_argument("--group", type=int, default=0,
                    help="measure a sealed log group of N PUTs and N FREEs (random layout keys) instead of bases")
    a = ap.parse_args()
    build()
    if a.group:
        group(a)
        return
    rows = []
    with tempfile.TemporaryDirectory() as td:
        for layout in a.layouts.split(","):
            for n in (int(x) for x in a.sizes.split(",")):
                keys = os.path.join(td, f"{layout}-{n}.txt")
                write_keys(keys, n, layout, a.hash_bytes)
                for v in a.variants.split(","):
                    for lv in a.levels.split(","):
                        extra = ["--read", a.read] if a.read else []
                        out = subprocess.run([BIN, keys, "--level", lv, "--reps", str(a.reps), *VARIANTS[v], *extra],
                                             check=True, capture_output=True, text=True).stdout
                        r = json.loads(out)
                        r.update(layout=layout, variant=v, hash_bytes=a.hash_bytes)
                        rows.append(r)
                        if a.json:
                            print(json.dumps(r), flush=True)
    if a.json:
        return
    print(f"keys: object keys of {MODEL}, {a.hash_bytes}-byte chunk hash, "
          f"{rows[0]['key_bytes_avg']:.0f} bytes each; 8 MiB payloads, one class, dense slots\n")
    threads = [t for t in a.read.split(",") if t]
    print("| layout | entries | variant | level | bytes/entry | raw bytes/entry | chunks | encode ns/entry | "
          "encode MB/s (raw) | decode ns/entry | decode MB/s (raw) |" + "".join(f" read ns/entry, {t} thr |" for t in threads))
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(threads))
    for r in rows:
        print(f"| {r['layout']} | {r['entries']:,} | {r['variant']} | {r['level']} | {r['bytes_per_entry']:.2f} | "
              f"{r['raw_bytes_per_entry']:.1f} | {r['chunks']} | {r['encode_ns_per_entry']:.0f} | "
              f"{r['encode_raw_MBps']:.0f} | {r['decode_ns_per_entry']:.0f} | {r['decode_raw_MBps']:.0f} |"
              + "".join(f" {r['read_ns_per_entry_' + t]:.0f} |" for t in threads))


def group(a: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as td:
        keys = os.path.join(td, "group.txt")
        write_keys(keys, a.group, "random", a.hash_bytes)
        for lv in a.levels.split(","):
            out = subprocess.run([BIN, keys, "--group", str(a.group), "--level", lv, "--reps", str(a.reps)],
                                 check=True, capture_output=True, text=True).stdout
            r = json.loads(out)
            rows.append(r)
            if a.json:
                print(json.dumps(r), flush=True)
    if a.json:
        return
    print(f"log group of {a.group:,} PUTs + {a.group:,} FREEs (interleaved), object keys of {MODEL} "
          f"({a.hash_bytes}-byte chunk hash, random layout), slots random below 2^21, 4 KiB blocks\n")
    print("| level | bytes/PUT alone | bytes/FREE alone | bytes/PUT in the mix | bytes/FREE in the mix | "
          "bytes/record (mixed) | add ns/record | seal ns/record | decode ns/record (raw body) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['level']} | {r['bytes_per_put']:.2f} | {r['bytes_per_free']:.2f} | {r['mixed_bytes_per_put']:.2f} | "
              f"{r['mixed_bytes_per_free']:.2f} | {r['bytes_per_record']:.2f} | {r['add_ns_per_record']:.0f} | "
              f"{r['seal_ns_per_record']:.0f} | {r['decode_ns_per_record']:.0f} ({r['decode_raw_ns_per_record']:.0f}) |")


if __name__ == "__main__":
    main()
