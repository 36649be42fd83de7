"""One chunk stored on a full cache right after a remove freed its slot, our plugin beside
LMCache's, through the e2e part's stack (LMCache's LocalCPUBackend and MemoryObjs, 8 MiB
chunks, page cache, posix, periodic checkpoint off as in the e2e part).

Each round, for each plugin in alternating order, on a device whose every slot holds a chunk:
  * "right after": remove the oldest key, then at once store one new chunk (timed); ours then
    needs the slot whose checkpoint its background thread has only just begun;
  * "settled": remove the next oldest key, wait for the plugin's background work, then store
    one new chunk (timed).
Usage: python store_after_remove.py [rounds] [slots] [clean]  (in the LMCache virtualenv, with
lmcache_rawblock and lmcache_rawblock_bench importable). With "clean", each plugin's file is
fdatasync'ed before its "settled" store, so both store onto written-back pages (ours are after
its checkpoint; LMCache's never are otherwise). Prints p50s, ratios and the load.
"""
import os
import sys
import tempfile
import time

from lmcache_rawblock_bench import e2e
from lmcache_rawblock_bench.common import interleaved_order, sparse

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
slots = int(sys.argv[2]) if len(sys.argv) > 2 else 8
clean = len(sys.argv) > 3 and sys.argv[3] == "clean"
mods, why = e2e.lmcache_modules()
if mods is None:
    sys.exit(why)
classes, errors = e2e.plugin_classes()
if errors:
    sys.exit(f"plugins not loaded: {errors}")
torch, key_cls = mods["torch"], mods["CacheEngineKey"]
model, config = e2e.MODELS["1B"], "buffered_posix"
s = e2e.E2ESettings(models=["1B"], configs=[config], batch=slots, rounds=rounds, latency_samples=2)
chunk = model.chunk_bytes(s.tokens)
slot = -(-(4096 + chunk) // 4096) * 4096
size = e2e.META_BYTES + slots * slot + 4096
stack = e2e.Stack(mods, model, config, s, e2e._extra("", config))
obj = stack.alloc(7)
serial = 0
with tempfile.TemporaryDirectory() as d:
    plugins, keys = [], {}
    for name, cls in classes.items():
        plugins.append(e2e.Plugin(name, cls, stack, sparse(os.path.join(d, f"{name}.img"), size), config))
    for p in plugins:
        keys[p.name] = []
        for _ in range(slots):
            k = key_cls("store-after-remove", 1, 0, serial, torch.bfloat16)
            serial += 1
            p.store([k], [obj])
            keys[p.name].append(k)
        if not all(p.be.contains(k) for k in keys[p.name]):
            sys.exit(f"{p.name}: the device holds fewer than {slots} chunks")
        p.remove([])  # settle
    times = {p.name: {"right_after": [], "settled": []} for p in plugins}
    for rnd in range(rounds):
        for p in interleaved_order(rnd, plugins):
            for what in ("right_after", "settled"):
                old = keys[p.name].pop(0)
                if p.be.batched_remove([old], True) != 1:
                    sys.exit(f"{p.name}: remove failed")
                if what == "settled":
                    p.remove([])  # waits for the plugin's background work
                    if clean:
                        fd = os.open(p.path, os.O_RDWR)
                        os.fdatasync(fd)
                        os.close(fd)
                k = key_cls("store-after-remove", 1, 0, serial, torch.bfloat16)
                serial += 1
                t0 = time.perf_counter()
                p.store([k], [obj])
                times[p.name][what].append(time.perf_counter() - t0)
                keys[p.name].append(k)
                if not p.be.contains(k):
                    sys.exit(f"{p.name}: the new chunk was not stored")
            p.remove([])
    for p in plugins:
        p.close()
obj.ref_count_down()
stack.close()
p50 = {n: {w: e2e.percentile(v, 50) for w, v in t.items()} for n, t in times.items()}
print(f"load average {os.getloadavg()}; {rounds} rounds, {slots} slots of {chunk >> 20} MiB, page cache"
      + (", files flushed before the settled store" if clean else ""))
for n, t in p50.items():
    print(f"{n:8s} right after p50 {t['right_after'] * 1e3:7.2f} ms   settled p50 {t['settled'] * 1e3:7.2f} ms")
if len(p50) == 2:
    for w in ("right_after", "settled"):
        print(f"ours/lmcache {w}: {p50['ours'][w] / p50['lmcache'][w]:.2f}x")
