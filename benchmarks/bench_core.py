#!/usr/bin/env python3
"""Benchmarks of the native RawBlockCore against LMCache's Python RawBlockCore.

Run from the repository root with the LMCache virtualenv (it imports both implementations in
one process; the in-place built extension is picked up from the checkout):

    .venv-lmcache/bin/python benchmarks/bench_core.py [--parts recovery,delete,open,cpu] [--reps N]

Every comparison runs both sides in the same process, interleaved round by round; the
report gives medians and ratios (never single runs). Parts:

  recovery  startup slot-header validation with 100..3000 slots: LMCache's io_uring batched
            reader and its sequential reader (one pread per header, as before its fix), ours
            batched (io_uring) and ours sequential; page cache, and O_DIRECT on a loop device
            with the page cache dropped before every round (root only).
  delete    delete_many of 10..10000 keys: ours, LMCache's core, a plain Python dict loop.
  open      open + recovery of a 100k-entry device (verify on), ours vs LMCache's core; index
            memory per entry (Core.mem_bytes()).
  cpu       per-key CPU time (time.process_time, all threads) and wall time of put_many /
            load_many_into, 64 x 64 KiB: page cache, and O_DIRECT (block_align 4096, zero copy,
            4096-aligned MemoryObjs on both sides), posix and io_uring engines; and io_uring
            with the MemoryObjs in buffers both cores register. Beside each row the kernel
            floor: benchmarks/io_floor.c (compiled with cc -luring) doing the same transfers
            from a bare C loop on the same file.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import warnings
import zlib

sys.path.insert(0, os.getcwd())
warnings.simplefilter("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj  # noqa: E402
from lmcache.v1.storage_backend import raw_block as lmc_rb  # noqa: E402

from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig, encode_object_key  # noqa: E402
from lmcache_rawblock.raw_block._lmcache import ObjectKey  # noqa: E402

logging.disable(logging.CRITICAL)
# No intra-op pool: an OpenMP worker spinning after a torch op would be billed to process_time.
torch.set_num_threads(1)

MiB = 1 << 20
BLOCK = 4096


def med(xs):
    return statistics.median(xs)


def keys_for(n, tag="bench"):
    return [encode_object_key(ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name=tag, kv_rank=0))
            for i in range(n)]


def cfg_kwargs(path, **kw):
    base = dict(device_path=path, capacity_bytes=0, block_align=BLOCK, header_bytes=BLOCK, slot_bytes=64 * 1024,
                use_odirect=False, enable_zero_copy=False, meta_total_bytes=MiB, meta_magic=b"LMCIDX01",
                meta_version=1, meta_checkpoint_interval_sec=60, meta_idle_quiet_ms=0, meta_enable_periodic=False,
                meta_verify_on_load=True, io_engine="posix", iouring_queue_depth=256)
    base.update(kw)
    return base


def ours(path, **kw):
    return RawBlockCore(RawBlockCoreConfig(**cfg_kwargs(path, **kw)), key_namespace="object")


def theirs(path, **kw):
    return lmc_rb.RawBlockCore(lmc_rb.RawBlockCoreConfig(**cfg_kwargs(path, **kw)), key_namespace="object")


def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed(fn):
    t = time.perf_counter()
    r = fn()
    return time.perf_counter() - t, r


# ---- recovery: slot-header validation -----------------------------------------------------

def _state_for(path, keys, slot_bytes, meta, sizes):
    entries = {k.encoded: {"offset": meta + i * slot_bytes, "size": sizes, "shape": [sizes], "dtype": "uint8",
                           "fmt": "BINARY", "cached_positions": None} for i, k in enumerate(keys)}
    return {"version": 1, "device_path": path, "capacity_bytes": os.path.getsize(path) if os.path.isfile(path) else 0,
            "block_align": BLOCK, "header_bytes": BLOCK, "slot_bytes": slot_bytes, "meta_total_bytes": meta,
            "meta_magic": "LMCIDX01", "meta_version": 1, "data_base_offset": meta, "next_slot": len(keys),
            "entries": entries}


def write_image(path, keys, slot_bytes, meta, payload_len=100, corrupt=()):
    """Slot headers + one checkpoint (container 0, seq 1), written with plain file I/O."""
    fd = os.open(path, os.O_RDWR)
    try:
        blob = bytearray(BLOCK)
        for i, k in enumerate(keys):
            magic = b"LMCBLK01" if i not in corrupt else b"BROKEN01"
            struct.pack_into("<8sQQ", blob, 0, magic, k.slot_identity, payload_len)
            os.pwrite(fd, bytes(blob), meta + i * slot_bytes)
        st = _state_for(path, keys, slot_bytes, meta, payload_len)
        body = json.dumps(st, separators=(",", ":"), ensure_ascii=True).encode()
        assert len(body) <= meta // 2 - BLOCK, "metadata region too small for the checkpoint"
        hdr = struct.pack("<8sIQQI", b"LMCIDX01", 1, 1, len(body), zlib.crc32(body))
        os.pwrite(fd, body + bytes((-len(body)) % BLOCK), BLOCK)
        os.pwrite(fd, hdr + bytes(BLOCK - len(hdr)), 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def bench_recovery(out, reps, workdir, loop_ok):
    sizes = [100, 200, 500, 1000, 3000]
    modes = [("page cache", False)]
    if loop_ok:
        modes.append(("O_DIRECT, loop device, caches dropped", True))
    rows = []
    for mode, odirect in modes:
        for n in sizes:
            img = sparse(os.path.join(workdir, f"rec{n}.img"), MiB + (n + 1) * 64 * 1024)
            loopdev = None
            path = img
            if odirect:
                loopdev = subprocess.run(["losetup", "-f", "--show", "--direct-io=on", img], check=True,
                                         capture_output=True, text=True).stdout.strip()
                path = loopdev
            try:
                keys = keys_for(n, f"rec{n}")
                corrupt = {i for i in range(0, n, 97)}
                write_image(path, keys, 64 * 1024, MiB, corrupt=corrupt)
                # LMCache: open without verification, then time its readers directly.
                their = {}
                for engine in ("posix", "io_uring"):
                    their[engine] = theirs(path, io_engine=engine, use_odirect=odirect, meta_verify_on_load=False)
                offsets = [MiB + i * 64 * 1024 for i in range(n)]
                ours_c = ours(path, io_engine="io_uring", use_odirect=odirect, meta_verify_on_load=False)
                assert ours_c.indexed_key_count() == n
                res = {k: [] for k in ("lmc_seq", "lmc_batched", "ours_seq", "ours_batched")}
                drops = {}
                for r in range(reps):
                    order = list(res) if r % 2 == 0 else list(reversed(list(res)))
                    for name in order:
                        if odirect:
                            drop_caches()
                        if name == "lmc_seq":
                            c = their["posix"]
                            t, hs = timed(lambda: [c._read_slot_header(o) for o in offsets])
                            drops[name] = sum(1 for h in hs if h is None)
                        elif name == "lmc_batched":
                            c = their["io_uring"]
                            t, hs = timed(lambda: c._read_slot_headers(offsets))
                            drops[name] = sum(1 for h in hs if h is None)
                        else:
                            # _revalidate drops the bad entries; re-apply so every round sees them
                            seq = name == "ours_seq"
                            t, d = timed(lambda: ours_c._native._revalidate(seq))
                            if d:
                                drops[name] = d
                                ours_c._native.apply_state_json(json.dumps(
                                    _state_for(path, keys, 64 * 1024, MiB, 100)).encode())
                        res[name].append(t)
                for c in their.values():
                    c.close()
                ours_c.close()
                m = {k: med(v) for k, v in res.items()}
                rows.append((mode, n, m, drops, len(corrupt)))
                print(f"recovery {mode} n={n}: " + " ".join(f"{k}={v * 1e3:.2f}ms" for k, v in m.items())
                      + f" drops={drops}", flush=True)
            finally:
                if loopdev:
                    subprocess.run(["losetup", "-d", loopdev], check=False)
                os.unlink(img)
    out.append("## Recovery: startup slot-header validation\n")
    out.append("Median time to read and judge every slot header (ms). `LMCache seq` = its "
               "`_read_slot_header` per offset (one pread per header, the pre-#3753 path); `LMCache "
               "batched` = its io_uring `_read_slot_headers` (queue depth 256); `ours seq` = our C "
               "validator with one pread per header on one thread; `ours batched` = our io_uring "
               "validator (one batch per queue depth). Every ~97th header is corrupted; the drop "
               "counts must agree.\n")
    out.append("| medium | slots | LMCache seq | LMCache batched | ours seq | ours batched | LMCache batched vs seq "
               "(seed: 5–6×) | ours batched vs LMCache seq (target ≥ 8×) | met? | ours batched vs ours seq | "
               "drops (LMCache / ours) |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, n, m, drops, nc in rows:
        seed = m["lmc_seq"] / m["lmc_batched"]
        ratio = m["lmc_seq"] / m["ours_batched"]
        own = m["ours_seq"] / m["ours_batched"]
        same = drops.get("lmc_seq") == drops.get("lmc_batched") == drops.get("ours_batched") == drops.get(
            "ours_seq") == nc
        out.append(f"| {mode} | {n} | {m['lmc_seq'] * 1e3:.2f} | {m['lmc_batched'] * 1e3:.2f} | "
                   f"{m['ours_seq'] * 1e3:.2f} | {m['ours_batched'] * 1e3:.2f} | {seed:.1f}× | {ratio:.1f}× | "
                   f"{'yes' if ratio >= 8 else 'no'} | {own:.1f}× | "
                   f"{drops.get('lmc_batched')} / {drops.get('ours_batched')}{'' if same else ' MISMATCH'} |")
    out.append("")


# ---- delete_many ----------------------------------------------------------------------------

def bench_delete(out, reps, workdir):
    sizes = [10, 100, 1000, 10000]
    path = sparse(os.path.join(workdir, "del.img"), 8 * MiB + 10001 * 8192)
    kw = dict(slot_bytes=8192, meta_total_bytes=8 * MiB, meta_verify_on_load=False)
    o = ours(path, **kw)
    t = theirs(path, **kw)
    rows = []
    for n in sizes:
        keys = keys_for(n, "del")
        enc = [k.encoded for k in keys]
        state = _state_for(path, keys, 8192, 8 * MiB, 100)
        blob = json.dumps(state, separators=(",", ":")).encode()
        res = {"ours": [], "lmcache": [], "dict": []}
        for r in range(reps):
            order = list(res) if r % 2 == 0 else list(reversed(list(res)))
            for name in order:
                if name == "ours":
                    assert o._native.apply_state_json(blob)[0]
                    dt, got = timed(lambda: o.delete_many(enc))
                elif name == "lmcache":
                    assert t.apply_loaded_state(state)
                    dt, got = timed(lambda: t.delete_many(enc))
                else:
                    d = {k: (i, 100) for i, k in enumerate(enc)}

                    def loop():
                        return [d.pop(k, None) is not None for k in enc]

                    dt, got = timed(loop)
                assert got == [True] * n, name
                res[name].append(dt)
        m = {k: med(v) for k, v in res.items()}
        rows.append((n, m))
        print(f"delete n={n}: " + " ".join(f"{k}={v * 1e6:.1f}us" for k, v in m.items()), flush=True)
    o.close()
    t.close()
    os.unlink(path)
    out.append("## delete_many\n")
    out.append("Median wall time of one `delete_many(keys)` over an index holding exactly those keys "
               "(µs); the dict loop is `[d.pop(k, None) is not None for k in keys]`.\n")
    out.append("| keys | ours | LMCache core | dict loop | LMCache / ours (target ≥ 30× at 10000) | met? | "
               "dict loop / ours |")
    out.append("|---|---|---|---|---|---|---|")
    for n, m in rows:
        r = m["lmcache"] / m["ours"]
        met = ("yes" if r >= 30 else "no") if n == 10000 else "–"
        out.append(f"| {n} | {m['ours'] * 1e6:.1f} | {m['lmcache'] * 1e6:.1f} | {m['dict'] * 1e6:.1f} | {r:.1f}× | "
                   f"{met} | {m['dict'] / m['ours']:.2f}× |")
    out.append("")


# ---- open / recovery with 100k entries ------------------------------------------------------

def bench_open(out, reps, workdir):
    n = 100_000
    slot = 8192
    meta = 64 * MiB
    path = sparse(os.path.join(workdir, "open.img"), meta + (n + 1) * slot)
    keys = keys_for(n, "open")
    write_image(path, keys, slot, meta)
    kw = dict(slot_bytes=slot, meta_total_bytes=meta, meta_verify_on_load=True)
    res = {"ours posix": [], "lmcache posix": [], "ours io_uring": [], "lmcache io_uring": []}
    mem = None
    for r in range(reps):
        order = list(res) if r % 2 == 0 else list(reversed(list(res)))
        for name in order:
            engine = name.split()[1]
            make = ours if name.startswith("ours") else theirs
            dt, c = timed(lambda: make(path, io_engine=engine, **kw))
            assert c.indexed_key_count() == n, (name, c.indexed_key_count())
            if name.startswith("ours") and mem is None:
                mem = c._native.mem_bytes()
            if name.startswith("ours"):
                c._native.close()  # nothing dirty: no checkpoint written
            else:
                c.close()
            res[name].append(dt)
        print(f"open round {r}: " + " ".join(f"{k}={v[-1]:.3f}s" for k, v in res.items()), flush=True)
    os.unlink(path)
    key_bytes = sum(len(k.encoded) + 1 for k in keys)
    per = (mem - key_bytes) / n
    m = {k: med(v) for k, v in res.items()}
    out.append("## Open + recovery of 100,000 entries\n")
    out.append("Median wall time of the constructor on a device holding one checkpoint with 100,000 "
               "entries and their slot headers (verify on: every header read and checked), page cache warm.\n")
    out.append("| engine | ours (s) | LMCache core (s) | LMCache / ours (target ≥ 10×) | met? |")
    out.append("|---|---|---|---|---|")
    for engine in ("posix", "io_uring"):
        r = m[f"lmcache {engine}"] / m[f"ours {engine}"]
        out.append(f"| {engine} | {m['ours ' + engine]:.3f} | {m['lmcache ' + engine]:.3f} | {r:.1f}× | "
                   f"{'yes' if r >= 10 else 'no'} |")
    out.append("")
    out.append(f"Index memory (`Core.mem_bytes()` after open, index + in-flight table + slot allocator): "
               f"{mem} bytes for {n} entries = {mem / n:.1f} bytes/entry; minus the key bytes "
               f"({key_bytes / n:.1f} bytes/entry incl. NUL): **{per:.1f} bytes/entry** "
               f"(target ≤ 150 + key bytes: {'met' if per <= 150 else 'not met'}).\n")


# ---- per-key CPU cost ----------------------------------------------------------------------

def aligned_memobj(data: bytes | int, align: int = BLOCK, base=None):
    """A TensorMemoryObj (BINARY, uint8) of n bytes whose first byte is align-aligned (what O_DIRECT
    zero copy needs; LMCache's own allocators page-align the same way: over-allocate, slice).
    With base (an aligned uint8 tensor slice of n bytes), the object views that memory."""
    n = data if isinstance(data, int) else len(data)
    if base is None:
        base = torch.zeros(n + align, dtype=torch.uint8)
        off = -base.data_ptr() % align
        t = base[off:off + n]
    else:
        t = base
    if not isinstance(data, int):
        t.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    assert t.data_ptr() % align == 0
    md = MemoryObjMetadata(shape=torch.Size([n]), dtype=torch.uint8, address=0, phy_size=n, ref_count=1,
                           fmt=MemoryFormat.BINARY)
    return TensorMemoryObj(raw_data=t, metadata=md, parent_allocator=None)  # t keeps base's storage alive


class PagedArena:
    """One aligned tensor carved into n payload-sized MemoryObjs; get_paged_buffers() is what
    register_fixed_buffers_from_allocator registers (as LMCache's paged CPU allocator does)."""

    def __init__(self, n, size, align=BLOCK):
        raw = torch.zeros(n * size + align, dtype=torch.uint8)
        off = -raw.data_ptr() % align
        self.buf = raw[off:off + n * size]
        self.size = size

    def get_paged_buffers(self):
        return [self.buf]

    def obj(self, i, data):
        return aligned_memobj(data, base=self.buf[i * self.size:(i + 1) * self.size])


def written(path):
    """Fill the file with zeros and fsync it, so that every block is allocated and written."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        for off in range(0, size, MiB):
            f.write(bytes(min(MiB, size - off)))
        f.flush()
        os.fsync(f.fileno())
    return path


def build_floor(workdir):
    """Compile benchmarks/io_floor.c; (path, None) or (None, why not)."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "io_floor.c")
    exe = os.path.join(workdir, "io_floor")
    cc = os.environ.get("CC", "cc")
    r = subprocess.run([cc, "-O2", "-o", exe, src, "-luring"], capture_output=True, text=True)
    return (exe, None) if r.returncode == 0 else (None, (r.stderr.strip().splitlines() or ["cc failed"])[-1])


def run_floor(exe, path, odirect, rounds=40):
    """{(engine, op, fixed): median CPU us per key} from io_floor on path."""
    r = subprocess.run([exe, path, "1" if odirect else "0", str(rounds)], capture_output=True, text=True,
                       check=True)
    out = {}
    for line in r.stdout.splitlines():
        engine, op, fixed, med, _mean = line.split()
        out[(engine, op, fixed == "fixed=1")] = float(med)
    return out


# (label, core options, io_uring fixed buffers registered on both sides)
CPU_MEDIA = (("page cache", dict(use_odirect=False, enable_zero_copy=False), False),
             ("O_DIRECT", dict(use_odirect=True, enable_zero_copy=True), False),
             ("O_DIRECT, registered buffers", dict(use_odirect=True, enable_zero_copy=True), True))


def bench_cpu(out, reps, workdir):
    """process_time and wall time per key of put_many / load_many_into, 64 x 64 KiB.

    Page cache: buffered file I/O (the kernel copies every 64 KiB through the page cache).
    O_DIRECT: the same file opened with O_DIRECT (block_align 4096), both cores with
    enable_zero_copy and 4096-aligned MemoryObjs, so both do direct I/O from/to the caller's
    memory without a bounce buffer and per-key software cost is what remains.
    Registered buffers (io_uring only): the MemoryObjs live in one arena that both cores
    register with register_fixed_buffers_from_allocator, as LMCache's plugin does with its
    allocator, so payload transfers are READ_FIXED / WRITE_FIXED (no page pinning per I/O).
    Beside each row: the kernel floor, io_floor.c's CPU per key for the same transfers from
    a bare C loop on the same file."""
    nkeys, size = 64, 64 * 1024
    slot = size + BLOCK
    rows = []
    floor_exe, floor_why = build_floor(workdir)
    for medium, mkw, fixed in CPU_MEDIA:
        for engine in (("io_uring",) if fixed else ("posix", "io_uring")):
            path = sparse(os.path.join(workdir, f"cpu-{engine}.img"), MiB + (nkeys + 1) * slot)
            if mkw["use_odirect"]:
                written(path)  # no holes: direct writes do not allocate extents, as on a device
            kw = dict(slot_bytes=slot, io_engine=engine, meta_verify_on_load=False, **mkw)
            o = ours(path, **kw)
            t = theirs(path, **kw)
            arena = PagedArena(2 * nkeys, size)
            objs = [arena.obj(i, os.urandom(size)) for i in range(nkeys)]
            dst = [arena.obj(nkeys + i, size) for i in range(nkeys)]
            if fixed:
                o.register_fixed_buffers_from_allocator(arena)
                t.register_fixed_buffers_from_allocator(arena)
            res = {f"{w} {c} {op}": [] for w in ("cpu", "wall") for c in ("ours", "lmcache")
                   for op in ("put", "load")}
            for r in range(reps):
                keys = keys_for(nkeys, f"cpu{r}")
                enc = [k.encoded for k in keys]
                order = [o, t] if r % 2 == 0 else [t, o]
                for c in order:
                    name = "ours" if c is o else "lmcache"
                    for d in dst:
                        ctypes.memset(d.raw_data.data_ptr(), 0, size)  # not a torch op: no OpenMP spin
                    w0, p0 = time.perf_counter(), time.process_time()
                    pr = c.put_many(keys, objs)
                    w1, p1 = time.perf_counter(), time.process_time()
                    got = c.load_many_into(enc, dst)
                    w2, p2 = time.perf_counter(), time.process_time()
                    assert pr.results == [True] * nkeys and got == [True] * nkeys, name
                    assert bytes(dst[5].byte_array) == bytes(objs[5].byte_array), name
                    assert bytes(dst[-1].byte_array) == bytes(objs[-1].byte_array), name
                    c.delete_many(enc)
                    res[f"cpu {name} put"].append((p1 - p0) / nkeys)
                    res[f"cpu {name} load"].append((p2 - p1) / nkeys)
                    res[f"wall {name} put"].append((w1 - w0) / nkeys)
                    res[f"wall {name} load"].append((w2 - w1) / nkeys)
            if fixed and o.report_status()["rust_io"]["fixed_buffer_attempts"] == 0:
                raise AssertionError("registered buffers were not used by our core")
            o.close()
            t.close()
            floor = run_floor(floor_exe, path, mkw["use_odirect"]) if floor_exe else {}
            os.unlink(path)
            m = {k: med(v) for k, v in res.items()}
            for op in ("put", "load"):
                m[f"floor {op}"] = floor.get((engine, op, fixed))
            rows.append((medium, engine, m))
            print(f"cpu {medium} {engine}: " + " ".join(f"{k}={v * 1e6:.1f}us/key" for k, v in m.items()
                                                       if not k.startswith("floor"))
                  + f" floor={floor.get((engine, 'put', fixed))}/{floor.get((engine, 'load', fixed))}", flush=True)
    out.append("## Per-key CPU cost, 64 × 64 KiB\n")
    out.append("Median per key of one `put_many` / `load_many_into` of 64 keys × 64 KiB, µs per key: "
               "**CPU** = `time.process_time()` (all threads of the process, so our io_uring worker and "
               "LMCache's Rust worker are included; the target is on this), **wall** = "
               "`time.perf_counter()`, both from the same calls. Both cores run in one process, "
               "interleaved round by round, on a sparse file on ext4. `page cache`: buffered I/O, "
               "`enable_zero_copy` off. `O_DIRECT`: `use_odirect=True`, `block_align=4096`, "
               "`enable_zero_copy=True` and 4096-aligned MemoryObjs (TensorMemoryObj over an aligned "
               "torch buffer) on both sides, so neither side bounces. `registered buffers`: the same, "
               "with the MemoryObjs in one arena both cores register through "
               "`register_fixed_buffers_from_allocator` (io_uring only). **Kernel floor**: CPU per key of "
               "the same transfers (a put = payload + header write) from a bare C loop "
               "(`benchmarks/io_floor.c`: pread/pwrite, or one io_uring submission per 64 keys) on the same "
               "file; no implementation can go below it, so `LMCache / floor` is the best ratio this "
               "machine allows.\n")
    if not floor_exe:
        out.append(f"Kernel floor not measured: io_floor.c did not compile ({floor_why}).\n")
    out.append("| engine | op | medium | ours CPU | LMCache CPU | LMCache / ours CPU (target ≥ 5×) | met? | "
               "kernel floor | LMCache / floor (best possible) | ours wall | LMCache wall | LMCache / ours wall |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for medium, engine, m in rows:
        for op in ("put", "load"):
            r = m[f"cpu lmcache {op}"] / m[f"cpu ours {op}"]
            rw = m[f"wall lmcache {op}"] / m[f"wall ours {op}"]
            fl = m[f"floor {op}"]
            fl_s = f"{fl:.1f}" if fl else "–"
            best = f"{m[f'cpu lmcache {op}'] * 1e6 / fl:.1f}×" if fl else "–"
            out.append(f"| {engine} | {op} | {medium} | {m['cpu ours ' + op] * 1e6:.1f} | "
                       f"{m['cpu lmcache ' + op] * 1e6:.1f} | {r:.1f}× | {'yes' if r >= 5 else 'no'} | "
                       f"{fl_s} | {best} | "
                       f"{m['wall ours ' + op] * 1e6:.1f} | {m['wall lmcache ' + op] * 1e6:.1f} | {rw:.1f}× |")
    out.append("")


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{platform.node()}: {os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM, Linux {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}; shared with other jobs")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="recovery,delete,open,cpu")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--open-reps", type=int, default=3)
    ap.add_argument("--workdir", default=None, help="directory for the sparse files (default: a temp dir)")
    ap.add_argument("--out", default=None, help="write the markdown report here")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="bench_core.", dir=args.workdir)
    loop_ok = os.geteuid() == 0 and shutil.which("losetup") is not None and os.path.exists("/dev/loop-control")
    out = ["# Native RawBlockCore vs LMCache's RawBlockCore\n",
           f"Command: `{' '.join([os.path.relpath(sys.executable)] + sys.argv)}`  ",
           f"Machine: {machine()}  ",
           f"LMCache {__import__('importlib.metadata').metadata.version('lmcache')}, "
           f"median of {args.reps} interleaved rounds per figure (open: {args.open_reps}).\n"]
    try:
        parts = args.parts.split(",")
        if "recovery" in parts:
            bench_recovery(out, args.reps, workdir, loop_ok)
        if "delete" in parts:
            bench_delete(out, args.reps, workdir)
        if "open" in parts:
            bench_open(out, args.open_reps, workdir)
        if "cpu" in parts:
            bench_cpu(out, args.reps, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = "\n".join(out) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
