"""delete_many of N keys, ours vs LMCache's RawBlockCore, through the bench's own measure_size
(interleaved rounds, fresh sparse files, medians)."""
import sys, tempfile, json
from lmcache_rawblock_bench.core import measure_size, ours_core, lmcache_core
import lmcache_rawblock._native as nat
n = int(sys.argv[1]); rounds = int(sys.argv[2])
comps = [ours_core(), lmcache_core()]
comps = [c for c in comps if c.cls is not None]
with tempfile.TemporaryDirectory() as d:
    res = measure_size(comps, n, rounds, d)
print("native:", nat.__file__, "errors:", res["errors"])
for r in res["rows"]:
    if r["op"] in ("delete_many", "exists_many"):
        print(json.dumps({k: r[k] for k in ("op", "entries", "ours_s", "lmcache_s", "speedup", "ours_spread", "lmcache_spread")}))
