"""During a long deallocation run (10,000 scattered slots), what a put and a second checkpoint see.

    python3 benchmarks/scripts/dealloc/during_a_run.py on|off [N]    (from the repository root)

A core on a 2 x N-slot sparse file in /var/tmp (N = 10,000 by default), every slot taken; every
other key deleted;
one thread runs the checkpoint that deallocates them; 0.2 s in, the main thread reads the status,
puts one key, and a third thread asks for another checkpoint.
"""
import os, sys, threading, time
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "benchmarks")]
from lmcache_rawblock_bench.core import open_core, ours_core, object_keys, Arena, close_core
from lmcache_rawblock_bench.common import sparse, MiB, KiB
N = int(sys.argv[2]) if len(sys.argv) > 2 else 10000; slot = 64 * KiB; meta = 128 * MiB
mode = sys.argv[1]
path = sparse(f"/var/tmp/during-a-run-{mode}.img", meta + 2 * N * slot)
core = open_core(ours_core(), path, slot_bytes=slot, meta_total_bytes=meta, meta_format="log",
                 deallocate_freed=mode, use_odirect=True, enable_zero_copy=True)
ar = Arena(64, slot - 4096); objs = [ar.obj(i, i) for i in range(64)]
keys = object_keys(2 * N, "c0")
assert all(core.put_many(keys, [objs[i % 64] for i in range(2 * N)]).results)
core.checkpoint_now(); fd = os.open(path, os.O_RDONLY); os.fsync(fd); os.close(fd)
offs = sorted((core.entry_offset(k.encoded), i) for i, k in enumerate(keys))
gone = [keys[i].encoded for j, (o, i) in enumerate(offs) if j % 2 == 0]
assert all(core.delete_many(gone))
res = {}
def ck():
    t = time.perf_counter(); core.checkpoint_now(); res["ckpt_s"] = time.perf_counter() - t
th = threading.Thread(target=ck); th.start()
time.sleep(0.2)
st = core._native.status()
res["free_slots_reported"] = st.get("free_slots", st.get("free_slot_count")); res["pending"] = st["dealloc_pending_slots"]
t = time.perf_counter(); r = core.put_many(object_keys(1, "c1"), [objs[0]]); res["put1_s"] = time.perf_counter() - t
res["put1_ok"] = list(r.results); res["put1_failure"] = str(r.failure)
def ck2():
    t = time.perf_counter(); core.checkpoint_now(); res["ckpt2_s"] = time.perf_counter() - t
th2 = threading.Thread(target=ck2); th2.start(); th2.join(); th.join()
res["dealloc_s"] = core._native.status()["dealloc_seconds"]
print(mode, N, res)
close_core(core); os.unlink(path)
