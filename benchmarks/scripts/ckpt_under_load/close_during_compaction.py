"""close() while the periodic thread compacts: how long it waits.

    python3 benchmarks/scripts/ckpt_under_load/close_during_compaction.py   (from the repository root)

fill.py's core (log format, defaults, interval 1 s) on a 3M-slot sparse file; puts until the
first compaction is done and the ring is past half full again (the periodic thread starts the
next one at its next wake), 0.3 s more, then close() timed; the compaction count before and
after says whether the compaction finished; a reopen checks every key put is there.
"""

import os
import sys
import time

sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "benchmarks"), os.path.dirname(os.path.abspath(__file__))]
from fill import _open  # noqa: E402
from lmcache_rawblock_bench.common import sparse  # noqa: E402
from lmcache_rawblock_bench.core import PlainObj  # noqa: E402
from lmcache_rawblock_bench.scale import SLOT, meta_log_for, object_keys  # noqa: E402

N = 3_000_000
path = sparse("/var/tmp/ckl-stop.img", meta_log_for(N) + N * SLOT)
c = _open(path, 1)
obj = PlainObj(64, 1)
done = 0
hit = None
while done < N:
    c.put_many(object_keys(256, done), [obj] * 256)
    done += 256
    log = c._native.status()["metadata_log"]
    if log["compactions"] >= 1 and log["live_bytes"] * 2 > log["ring_bytes"]:
        hit = (done, log["compactions"], log["base_last_seconds"])
        break
print("hit", hit)
time.sleep(0.3)  # the thread is building a base now (its last took base_last_seconds)
st0 = c._native.status()["metadata_log"]
t = time.perf_counter()
out = c.close()
dt = time.perf_counter() - t
st = c._native.status()
print("close_s", round(dt, 3), "final checkpoint written", out.final_checkpoint_written, "compactions",
      st0["compactions"], "->", st["metadata_log"]["compactions"], "error", repr(st["checkpoint_last_error"]))
c2 = _open(path, 1)
print("reopen indexed", c2._native.status()["indexed_key_count"], "put", done)
c2.close()
os.unlink(path)
