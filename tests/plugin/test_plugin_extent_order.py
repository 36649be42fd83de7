"""Under ``eviction_policy: extent`` the plugin keeps no LRU list of its own: the core orders
the extents, and the keys an extent eviction deletes must not linger in plugin memory.

Real files in tmp_path, a real event loop thread, the stand-in LMCache objects of
tests/plugin_fakes.py. Waits are for a condition, with a bound only a hang reaches.
"""

from __future__ import annotations

from plugin.test_plugin_evict_ahead import IDLE_WAIT_S, put_keys
from plugin.test_plugin_extent_evict import EXTENT, PER, open_backend  # noqa: F401 - fixture


def test_keys_evicted_by_extent_leave_no_trace_in_plugin_memory(open_backend):  # noqa: F811 - fixture
    be = open_backend(slots=64, eviction_policy="extent", extent_bytes=EXTENT, meta_format="log")
    total = be._core.extent_counts()["extents_total"] * PER
    for start in range(0, 4 * total, PER):
        assert not put_keys(be, list(range(start, start + PER)))
        assert be._evictor.wait_idle(IDLE_WAIT_S)
    assert be.report_status()["evicted_extent_entries"] > total, "the cache turned over several times"
    # the LRU list is not this policy's order: it holds nothing, whatever went through the cache
    assert len(be._lru) <= be.indexed_key_count()
