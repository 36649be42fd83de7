# Where the slowest 1 % of 64 KiB puts on a full cache spend their time: the plugin's store path
# (_put_with_policy) with extent eviction on a 1 GiB sparse file through the page cache, as the
# latency harness runs it, timed at three depths: the whole put, the facade's put_many, and the
# native put_many call (GIL released inside it); beside the core's own put histogram (put_ns,
# which times the C put from its entry, locks included) over the full phase, and the putting
# thread's /proc schedstat (CPU time, run-queue wait, times scheduled in) per phase.
# Run: .venv/bin/python benchmarks/results/extents/latency-8mib/put-tail-64k-probe.py
import asyncio, os, sys, tempfile, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from lmcache_rawblock_bench.common import MiB
from lmcache_rawblock_bench.core import make_obj
from lmcache_rawblock_bench.plugin import _Config, _LocalCPU, _Metadata
from lmcache_rawblock.plugin import RustRawBlockBackend
from lmcache_rawblock.raw_block import encode_legacy_key
from lmcache_rawblock.raw_block._lmcache import CacheEngineKey
chunk = 64 * 1024; slots = 16384; per = 16; slot = 4096 + chunk
d = tempfile.mkdtemp(); path = os.path.join(d, "x.img")
with open(path, "wb") as f: f.truncate(16 * MiB + slots * slot)
extra = {"rust_raw_block.device_path": path, "rust_raw_block.slot_bytes": slot, "rust_raw_block.header_bytes": 4096,
 "rust_raw_block.block_align": 4096, "rust_raw_block.meta_total_bytes": 16 * MiB, "rust_raw_block.meta_enable_periodic": True,
 "rust_raw_block.load_checkpoint_on_init": False, "rust_raw_block.eviction_policy": "extent", "rust_raw_block.extent_bytes": per * slot}
loop = asyncio.new_event_loop()
be = RustRawBlockBackend(config=_Config(extra), metadata=_Metadata(), local_cpu_backend=_LocalCPU(chunk), loop=loop)
core = be._core
inner = []
orig = core.put_many
def timed(*a, **k):
    t0 = time.perf_counter_ns(); r = orig(*a, **k); inner.append(time.perf_counter_ns() - t0); return r
core.put_many = timed
nat_t = []
class Proxy:
    def __init__(self, n): self._n = n
    def __getattr__(self, a): return getattr(self._n, a)
    def put_many(self, *a):
        t0 = time.perf_counter_ns(); r = self._n.put_many(*a); nat_t.append(time.perf_counter_ns() - t0); return r
native = core._native
core._native = Proxy(native)
obj = make_obj(chunk, 0x5A)
cap = core.extent_counts()["extents_total"] * per
def put(i):
    spec = encode_legacy_key(CacheEngineKey("bench", 1, 0, i, "bfloat16"))
    t0 = time.perf_counter_ns(); r, f = be._put_with_policy([spec], [obj]); return time.perf_counter_ns() - t0
import threading
def rq():
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f: return [int(x) for x in f.read().split()]
r0 = rq(); room = [put(i) for i in range(cap // 2)]; r1 = rq()
for i in range(cap // 2, cap): put(i)
be.wait_idle(120)
inner.clear(); nat_t.clear()
from lmcache_rawblock.metrics import quantile
h0 = native.histograms()["histograms"]["put_ns"]
f0 = rq(); outer = [put(i) for i in range(cap, cap + 3 * cap)]; f1 = rq()
print("room: puts", len(room), "run-queue wait us/put", (r1[1]-r0[1]) / len(room) / 1e3, "cpu us/put", (r1[0]-r0[0]) / len(room) / 1e3, "timeslices", r1[2]-r0[2])
print("full: puts", len(outer), "run-queue wait us/put", (f1[1]-f0[1]) / len(outer) / 1e3, "cpu us/put", (f1[0]-f0[0]) / len(outer) / 1e3, "timeslices", f1[2]-f0[2])
print("full: mean put us", sum(outer) / len(outer) / 1e3, "room mean", sum(room) / len(room) / 1e3)
be.wait_idle(120)
h1 = native.histograms()["histograms"]["put_ns"]
b0 = dict((int(u), int(c)) for u, c in h0["buckets"])
diff = {"count": h1["count"] - h0["count"], "buckets": [(u, int(c) - b0.get(int(u), 0)) for u, c in h1["buckets"]]}
print("core's own put_ns over the full phase: p50", quantile(diff, .5) / 1e3, "p99", quantile(diff, .99) / 1e3, "p999", quantile(diff, .999) / 1e3)
be.close()
slow = sorted(range(len(outer)), key=lambda i: -outer[i])[: len(outer) // 100]
def pct(xs, q): s = sorted(xs); return s[int(q * (len(s) - 1))] / 1e3
print("outer p50/p99 us", pct(outer, .5), pct(outer, .99), "inner (core.put_many) p50/p99", pct(inner, .5), pct(inner, .99))
print("slowest 1%: outer mean us", sum(outer[i] for i in slow) / len(slow) / 1e3, "inner mean us", sum(inner[i] for i in slow) / len(slow) / 1e3, "native call mean us", sum(nat_t[i] for i in slow) / len(slow) / 1e3)
