"""Callgrind driver: put N object keys (64-byte payloads, posix engine), then one delete_many over
them (skipped with a second argument "nodel"). Run: python driver.py N [nodel]"""
import os
import sys
import tempfile

import lmcache_rawblock._native as _nat
from lmcache_rawblock_bench.core import object_keys, config_kwargs, meta_bytes_for
from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig

print("native:", _nat.__file__, file=sys.stderr)

class Obj:
    def __init__(self, b):
        self.byte_array = memoryview(bytearray(b))

n = int(sys.argv[1])
do_delete = len(sys.argv) < 3 or sys.argv[2] != "nodel"
keys = object_keys(n, "drv")
enc = [k.encoded for k in keys]
objs = [Obj(b"x" * 64) for _ in range(256)]
d = tempfile.mkdtemp()
path = os.path.join(d, "img")
meta = meta_bytes_for(n)
with open(path, "wb") as f:
    f.truncate(meta + (n + 2) * 8192)
core = RawBlockCore(RawBlockCoreConfig(**config_kwargs(path, slot_bytes=8192, meta_total_bytes=meta, io_engine="posix")),
                    key_namespace="object")
for i in range(0, n, 256):
    assert all(core.put_many(keys[i:i + 256], objs[:min(256, n - i)]).results)
if do_delete:
    r = core.delete_many(enc)
    assert all(r), "missed"
core.close()
os.remove(path); os.rmdir(d)
