"""Per-key CPU of ``put_many`` / ``load_many_into`` (64 keys x 64 KiB), our core against LMCache's.

CPU is ``time.process_time()`` of the calling process (all threads, so our io_uring worker and
LMCache's Rust worker are counted); wall time comes from the same calls. Both cores run in one
process, interleaved round by round, each on a file of its own. Media:

* ``page cache``: buffered I/O, ``enable_zero_copy`` off;
* ``O_DIRECT``: ``use_odirect``, ``block_align`` 4096, ``enable_zero_copy`` and 4096-aligned
  memory objects on both sides, so neither bounces;
* ``O_DIRECT, registered buffers`` (io_uring only): the same, with the objects in one arena
  both cores register through ``register_fixed_buffers_from_allocator``, as LMCache's plugin
  does with its allocator.

Beside each row: the kernel floor (``floor.py``), the CPU per key of the same transfers from a
bare C loop, and *LMCache / floor*, the best ratio the machine allows.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any, Sequence

from . import floor as floor_prog
from .common import MiB, Competitor, interleaved_order, median, remove_file, sparse
from .core import BLOCK, CPU_KEYS, CPU_SIZE, Arena, CoreSettings, clear, close_core, object_keys, open_core, payload

REGISTERED = "O_DIRECT, registered buffers"
MEDIA = {
    "page cache": {"use_odirect": False, "enable_zero_copy": False},
    "O_DIRECT": {"use_odirect": True, "enable_zero_copy": True},
    REGISTERED: {"use_odirect": True, "enable_zero_copy": True},
}
OPS = (("put", "put_many"), ("load", "load_many_into"))


def written(path: str, size: int) -> str:
    """A file of *size* zero bytes, written and synced: O_DIRECT writes into holes would allocate
    extents, which a device never does."""
    chunk = bytes(MiB)
    with open(path, "wb") as f:
        for off in range(0, size, MiB):
            f.write(chunk[:min(MiB, size - off)])
        f.flush()
        os.fsync(f.fileno())
    return path


def kernel_floor(media: Sequence[str], rounds: int, workdir: str) -> dict:
    """The floor rows for *media*: {"available", "error", "rows": [{medium, engine, op, cpu_per_key_s}]}."""
    out: dict[str, Any] = {"available": False, "error": None, "rounds": rounds, "rows": []}
    if rounds <= 0:
        out["error"] = "not measured in this suite"
        return out
    exe, why = floor_prog.build()
    if exe is None:
        out["error"] = why
        return out
    for odirect in sorted({MEDIA[m]["use_odirect"] for m in media}):
        path = written(os.path.join(workdir, "floor.img"), floor_prog.FILE_BYTES)
        try:
            res = floor_prog.run(exe, path, odirect, rounds)
        except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
            return out
        finally:
            remove_file(path)
        for medium in media:
            if MEDIA[medium]["use_odirect"] != odirect:
                continue
            for (engine, op, fixed), v in res.items():
                if fixed == (medium == REGISTERED):
                    out["rows"].append({"medium": medium, "engine": engine, "op": op, "cpu_per_key_s": v})
    out["available"] = True
    return out


def floor_of(floor: dict, medium: str, engine: str, op: str) -> float | None:
    for r in floor.get("rows", []):
        if (r["medium"], r["engine"], r["op"]) == (medium, engine, op):
            return r["cpu_per_key_s"]
    return None


def measure_cpu(comps: Sequence[Competitor], s: CoreSettings, workdir: str, engine: str, real: bool,
                floor: dict) -> dict:
    rows: list[dict] = []
    errors: dict[str, str] = {}
    if real:
        import torch

        torch.set_num_threads(1)  # an intra-op worker spinning after a torch op would be billed to us
    for medium in s.cpu_media:
        if medium == REGISTERED and engine != "io_uring":
            continue
        try:
            rows += measure_medium(comps, s.cpu_repeats, workdir, engine, medium, real, floor)
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            errors[medium] = f"{type(exc).__name__}: {exc}"
    return {"rows": rows, "errors": errors}


def measure_medium(comps: Sequence[Competitor], repeats: int, workdir: str, engine: str, medium: str, real: bool,
                   floor: dict) -> list[dict]:
    slot = CPU_SIZE + BLOCK
    opts = MEDIA[medium]
    arena = Arena(2 * CPU_KEYS, CPU_SIZE, real)
    objs = [arena.obj(i, 0x41 + i % 32) for i in range(CPU_KEYS)]
    dst = [arena.obj(CPU_KEYS + i, 0) for i in range(CPU_KEYS)]
    cores: dict[str, Any] = {}
    paths: list[str] = []
    # samples[(what, op)][name]: per-key seconds, what = "cpu" | "wall"
    samples: dict[tuple[str, str], dict[str, list[float]]] = {(w, op): {} for w in ("cpu", "wall") for op, _ in OPS}
    try:
        for c in comps:
            path = os.path.join(workdir, f"cpu-{c.name}-{engine}.img")
            paths.append(path)
            size = MiB + (CPU_KEYS + 2) * slot
            written(path, size) if opts["use_odirect"] else sparse(path, size)
            cores[c.name] = open_core(c, path, slot_bytes=slot, io_engine=engine, meta_verify_on_load=False, **opts)
            if medium == REGISTERED:
                cores[c.name].register_fixed_buffers_from_allocator(arena)
        for rnd in range(repeats):
            keys = object_keys(CPU_KEYS, f"cpu{rnd}")
            enc = [k.encoded for k in keys]
            for name in interleaved_order(rnd, list(cores)):
                core = cores[name]
                for d in dst:
                    clear(d)
                w0, p0 = time.perf_counter(), time.process_time()
                put = core.put_many(keys, objs)
                w1, p1 = time.perf_counter(), time.process_time()
                got = core.load_many_into(enc, dst)
                w2, p2 = time.perf_counter(), time.process_time()
                if not all(put.results) or not all(got) or any(payload(dst[i]) != payload(objs[i]) for i in (5, -1)):
                    raise RuntimeError(f"{name}: put/load round trip failed")
                core.delete_many(enc)
                for what, op, v in (("cpu", "put", p1 - p0), ("cpu", "load", p2 - p1),
                                    ("wall", "put", w1 - w0), ("wall", "load", w2 - w1)):
                    samples[(what, op)].setdefault(name, []).append(v / CPU_KEYS)
        if medium == REGISTERED and "ours" in cores and not cores["ours"].report_status()["rust_io"].get(
                "fixed_buffer_attempts"):
            raise RuntimeError("registered buffers were not used by our core")
    finally:
        for core in cores.values():
            close_core(core)
        for p in paths:
            remove_file(p)
    rows = []
    for op, call in OPS:
        cpu, wall = samples[("cpu", op)], samples[("wall", op)]
        o, lm = median(cpu.get("ours", [])), median(cpu.get("lmcache", []))
        ow, lw = median(wall.get("ours", [])), median(wall.get("lmcache", []))
        fl = floor_of(floor, medium, engine, op)
        rows.append({"op": call, "engine": engine, "medium": medium, "keys": CPU_KEYS, "size": CPU_SIZE,
                     "repeats": repeats, "ours_cpu_per_key_s": o, "lmcache_cpu_per_key_s": lm,
                     "ours_wall_per_key_s": ow, "lmcache_wall_per_key_s": lw,
                     "speedup": lm / o if (o and lm) else None, "wall_speedup": lw / ow if (ow and lw) else None,
                     "floor_cpu_per_key_s": fl, "best_possible": lm / fl if (lm and fl) else None,
                     "samples_s": {"cpu": cpu, "wall": wall}})
    return rows
