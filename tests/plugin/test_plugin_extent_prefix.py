"""Extent choice weighed by reachable chunks (``rust_raw_block.eviction_policy: extent_prefix``).

The scoring alone (``PrefixOrder.reachable_loss``, ``ReachableExtents``) and the plugin over a
real core with extents on sparse files, in both metadata formats: among the extents used least
recently, the one whose eviction loses the fewest chunks a lookup reaches goes; an extent holding
a chain's head counts its tail in other extents. Plain ``extent`` evicts the oldest extent in
the same scenario. Nothing here is timed.
"""

from __future__ import annotations

import logging
import threading

import pytest

from lmcache_rawblock.plugin import RustRawBlockBackend
from core_helpers import make_core
from lmcache_rawblock.prefix_evict import PrefixOrder, ReachableExtents, extent_eviction
from plugin_fakes import FakeEngineConfig, FakeLocalCPUBackend, FakeMetadata, base_extra, make_key
from plugin.test_plugin_prefix import chain, lookup, store

MiB = 1 << 20
SLOT = 4096 + 8192  # header + one 8 KiB chunk (plugin_fakes.SHAPE in bfloat16)
PER = 4


# --------------------------------------------------------------------------- the scoring alone


def test_reachable_loss_counts_the_tail_a_head_takes_with_it():
    order = PrefixOrder()
    chain(order, ["a0", "a1", "a2", "a3"])
    chain(order, ["b0", "b1"])
    assert order.reachable_loss(["a3"]) == 1
    assert order.reachable_loss(["a1"]) == 3, "a1, and a2 and a3 below it"
    assert order.reachable_loss(["a0", "b1"]) == 5
    assert order.reachable_loss(["a2", "a3"]) == 2, "keys of the set are counted once"
    order.remove("a1")
    assert order.reachable_loss(["a2", "a3"]) == 0, "unreachable chunks cost nothing"
    assert order.reachable_loss(["gone", "a1"]) == 0


def test_reachable_loss_counts_every_chain_below_a_shared_head():
    order = PrefixOrder()
    chain(order, ["sys", "c1", "c2"])
    order.note_lookup(["sys", "d1"], 1)
    chain(order, ["d1", "d2", "d3"])
    assert order.reachable_loss(["sys"]) == 6


def test_the_extent_losing_fewest_reachable_chunks_is_chosen_ties_to_the_oldest():
    order = PrefixOrder()
    chain(order, ["h0", "h1", "t0", "t1"])
    chain(order, ["u0", "u1", "u2"])
    order.remove("u0")
    chooser = ReachableExtents(order, threading.Lock())
    assert chooser.choose([["h0", "h1"], ["t0", "t1"], ["u1", "u2"]]) == 2
    assert chooser.choose([["u1", "u2"], ["u2"]]) == 0, "a tie goes to the least recently used"
    assert chooser.chosen_other == 1
    chooser.deleted(["h1"])
    assert order.is_unreachable("t0")
    chooser.stored(["h1"])  # a hot key put back rejoins its chain
    assert order.predecessor("h1") == "h0" and not order.is_unreachable("t0")


def test_one_builder_gives_extent_prefix_its_chooser_and_tells_it_before_the_owner(tmp_path):
    """prefix_evict.extent_eviction, which the plugin and the MP adapter both build their
    evictor with: under extent_prefix the chains hear of a victim's keys before the owner's
    hook runs; under extent there is no chooser; a bad policy is named."""
    path = tmp_path / "dev.img"
    with open(path, "wb") as f:
        f.truncate(4 * MiB + 8 * PER * SLOT)
    core = make_core(str(path), slot_bytes=SLOT, extent_bytes=PER * SLOT)
    try:
        order, told = PrefixOrder(), []
        chain(order, ["a", "b"])
        owner = [lambda keys: told.append((list(keys), order.is_unreachable("b")))]
        ev = extent_eviction("extent_prefix", core, threading.Lock(), set, 1, logging.getLogger(), False, "r",
                             order, threading.Lock(), on_deleted=owner[0])
        assert isinstance(ev.chooser, ReachableExtents)
        ev._on_deleted(["a"])
        assert told == [(["a"], True)], "the chains forgot the key before the owner heard"
        assert extent_eviction("extent", core, threading.Lock(), set, 1, logging.getLogger(), False, "r").chooser is None
        with pytest.raises(ValueError, match=r"eviction_policy must be one of extent, extent_prefix .*got 'lru'"):
            extent_eviction("lru", core, threading.Lock(), set, 1, logging.getLogger(), False, "r")
        with pytest.raises(ValueError, match="extent_prefix' needs the chains"):
            extent_eviction("extent_prefix", core, threading.Lock(), set, 1, logging.getLogger(), False, "r")
    finally:
        core.close()


# --------------------------------------------------------------------------- the plugin


@pytest.fixture
def open_backend(tmp_path, loop_thread):
    made: list[RustRawBlockBackend] = []

    def make(extents: int, meta_format: str, policy: str) -> RustRawBlockBackend:
        path = tmp_path / f"{policy}.img"
        with open(path, "wb") as f:
            f.truncate(4 * MiB + (extents + 1) * PER * SLOT)
        extra = base_extra(str(path), meta_format=meta_format, eviction_policy=policy, extent_bytes=PER * SLOT,
                           extent_reserve=1, extent_reinsert=False, io_engine="posix")
        be = RustRawBlockBackend(config=FakeEngineConfig(extra), metadata=FakeMetadata(),
                                 local_cpu_backend=FakeLocalCPUBackend(), loop=loop_thread.loop)
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


def heads_scenario(open_backend, loop_thread, meta_format: str, policy: str) -> tuple[bool, bool]:
    """The oldest extent holds a chain's first chunks, the next its tail, a third chunks no
    lookup reaches; then puts until one extent is evicted: (the chain's head kept, the
    unreachable chunks kept)."""
    be = open_backend(extents=8, meta_format=meta_format, policy=policy)
    total = be._core.extent_counts()["extents_total"]
    store(be, [0, 1, 2, 3])  # extent A: the chain's head
    assert lookup(be, [0, 1, 2, 3, 4, 5, 6, 7], loop_thread) == 4
    store(be, [4, 5, 6, 7])  # extent B: its tail
    store(be, [10, 11, 12, 13])  # extent C: another chain, whose head then goes
    assert be.remove(make_key(10))
    be.wait_idle(60)
    nxt = 100
    while be.report_status()["evicted_extents"] == 0:
        assert nxt < 100 + 4 * PER * total, "no extent was evicted"
        store(be, list(range(nxt, nxt + PER)))  # newer extents of chains of their own
        be.wait_idle(60)
        nxt += PER
    assert be.report_status()["evicted_extents"] == 1
    head_kept = all(be.contains(make_key(i)) for i in range(8))
    dead_kept = any(be.contains(make_key(i)) for i in (11, 12, 13))
    return head_kept, dead_kept


@pytest.mark.parametrize("meta_format", ["v1", "log"])
def test_extent_prefix_evicts_the_unreachable_extent_before_a_chains_head(open_backend, loop_thread, meta_format):
    assert heads_scenario(open_backend, loop_thread, meta_format, "extent_prefix") == (True, False)


@pytest.mark.parametrize("meta_format", ["v1", "log"])
def test_plain_extent_evicts_the_oldest_extent_in_the_same_scenario(open_backend, loop_thread, meta_format):
    assert heads_scenario(open_backend, loop_thread, meta_format, "extent") == (False, True)


def test_extent_prefix_reports_its_order_and_victims_chosen_past_the_oldest(open_backend):
    be = open_backend(extents=8, meta_format="log", policy="extent_prefix")
    st = be.report_status()
    assert st["eviction_policy"] == "extent_prefix"
    assert st["prefix_keys"] == 0 and st["extent_victims_not_oldest"] == 0
