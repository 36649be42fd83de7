# The extent evictor pass with its reclaim as a second call (after a GIL round trip, as before
# the one-call pass), to set beside the product in one harness run: the runs labelled
# native-single are that variant here (at 8 MiB chunks in 64 MiB extents the pass takes one
# extent either way). A measurement aid, not product code.
# Run: python3 -m lmcache_rawblock_bench.rig run ... -- sh -c "python3 THIS_FILE <extent_latency options>"
import sys
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__import__("os").path.abspath(__file__)), "..", "..", ".."))
from lmcache_rawblock_bench import extent_latency as el
from lmcache_rawblock.raw_block.core import RawBlockCore
FLAG = {"split": False}
orig_ev = RawBlockCore.extent_evict
def ev(self, reserve, **k):
    if FLAG["split"]:
        k["reclaim"] = False  # the reclaim as a second call, after a GIL round trip
    return orig_ev(self, reserve, **k)
RawBlockCore.extent_evict = ev
orig_rp = el.run_policy
def rp(*a, **k):
    FLAG["split"] = a[14] == "native-single"
    return orig_rp(*a, **k)
el.run_policy = rp
sys.exit(el.main(sys.argv[1:]))
