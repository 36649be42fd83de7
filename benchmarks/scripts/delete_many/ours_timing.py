"""Our delete_many of N keys only: min and median over R fresh fills (put N, time one delete_many)."""
import os, sys, tempfile, time, statistics
from lmcache_rawblock_bench.core import object_keys, config_kwargs, meta_bytes_for
from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig
import lmcache_rawblock._native as nat
class Obj:
    def __init__(self, b): self.byte_array = memoryview(bytearray(b))
n, R = int(sys.argv[1]), int(sys.argv[2])
keys = object_keys(n, "tmin"); enc = [k.encoded for k in keys]
objs = [Obj(b"x" * 64) for _ in range(256)]
d = tempfile.mkdtemp(); path = os.path.join(d, "img"); meta = meta_bytes_for(n)
with open(path, "wb") as f: f.truncate(meta + (n + 2) * 8192)
core = RawBlockCore(RawBlockCoreConfig(**config_kwargs(path, slot_bytes=8192, meta_total_bytes=meta, io_engine="posix")), key_namespace="object")
ts = []
for _ in range(R):
    for i in range(0, n, 256):
        assert all(core.put_many(keys[i:i + 256], objs[:min(256, n - i)]).results)
    t0 = time.perf_counter(); r = core.delete_many(enc); ts.append(time.perf_counter() - t0)
    assert all(r)
core.close(); os.remove(path); os.rmdir(d)
print(f"{nat.__file__}: n={n} min={min(ts)*1e3:.3f} ms median={statistics.median(ts)*1e3:.3f} ms")
