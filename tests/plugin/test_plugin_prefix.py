"""Prefix-aware eviction (``rust_raw_block.eviction_policy: prefix``).

The order alone (``lmcache_rawblock.prefix_evict.PrefixOrder``) and the plugin over a real core
on sparse files, in both metadata formats: chunks whose predecessor is gone go first, chain
tails before heads, pinned keys stay, chains are learned from store calls and lookups and
relearned after a restart, and the same scenario that leaves LRU with chunks no lookup can
reach leaves prefix with none. Nothing here is timed.
"""

from __future__ import annotations

import asyncio

import pytest

from lmcache_rawblock.plugin import RustRawBlockBackend
from lmcache_rawblock.prefix_evict import PrefixOrder
from plugin_fakes import (
    FakeEngineConfig,
    FakeLocalCPUBackend,
    FakeMetadata,
    base_extra,
    make_key,
    make_obj,
)

MiB = 1 << 20
SLOT = 4096 + 8192  # header + one 8 KiB chunk (plugin_fakes.SHAPE in bfloat16)
FORMATS = ("v1", "log")


def never(_key: str) -> bool:
    return False


# --------------------------------------------------------------------------- the order alone


def chain(order: PrefixOrder, keys: list[str]) -> None:
    """One store call of ``keys`` whose writes all land."""
    order.note_call(keys)
    for k in keys:
        order.add(k)


def test_unreachable_chunks_go_first_then_what_hangs_below_them():
    order = PrefixOrder()
    chain(order, ["old0", "old1"])  # older, reachable
    chain(order, ["a0", "a1", "a2", "a3"])
    order.remove("a1")  # a2 and a3 can no longer be reached
    assert order.is_unreachable("a2") and not order.is_unreachable("a3")
    assert order.victims(2, never) == ["a2", "a3"]
    assert order.victims(3, never)[:2] == ["a2", "a3"]


def test_tails_go_before_heads_and_a_chain_is_eaten_from_its_tail():
    order = PrefixOrder()
    chain(order, ["a0", "a1", "a2"])
    chain(order, ["b0", "b1"])
    for k in ("a0", "a1", "a2"):
        order.touch(k)  # chain a used last
    assert order.victims(1, never) == ["b1"]
    assert order.victims(2, never) == ["b1", "b0"]
    assert order.victims(5, never) == ["b1", "b0", "a2", "a1", "a0"]
    order.remove("b1")
    assert order.victims(1, never) == ["b0"], "the head left childless is the next leaf"


def test_a_shared_head_stays_while_any_chain_below_it_does():
    order = PrefixOrder()
    chain(order, ["sys", "c1", "c2"])
    order.note_lookup(["sys", "d1"], 1)  # a second conversation on the same system prompt
    chain(order, ["d1", "d2"])
    assert order.predecessor("d1") == "sys"
    assert order.victims(3, never) == ["c2", "c1", "d2"]
    assert order.victims(5, never) == ["c2", "c1", "d2", "d1", "sys"]


def test_kept_keys_are_never_victims():
    order = PrefixOrder()
    chain(order, ["a0", "a1", "a2"])
    chain(order, ["b0", "b1"])
    kept = {"a2", "b1"}
    got = order.victims(5, kept.__contains__)
    assert not kept & set(got)
    assert set(got) == {"a0", "a1", "b0"}, "with every leaf kept, keys below them go, never the kept ones"


def test_a_store_call_continuing_a_lookup_links_to_its_last_hit():
    order = PrefixOrder()
    chain(order, ["a0", "a1"])
    order.note_lookup(["a0", "a1", "a2", "a3"], 2)  # found a0 a1; LMCache stores from a2
    chain(order, ["a2", "a3"])
    assert order.predecessor("a2") == "a1"
    assert order.victims(4, never) == ["a3", "a2", "a1", "a0"]


def test_a_write_finishing_before_its_predecessors_still_links():
    order = PrefixOrder()
    order.note_call(["a0", "a1", "a2"])
    for k in ("a2", "a0", "a1"):  # completion order of one write per key
        order.add(k)
    assert [order.predecessor(k) for k in ("a0", "a1", "a2")] == [None, "a0", "a1"]
    assert order.victims(3, never) == ["a2", "a1", "a0"]


def test_recovered_keys_are_heads_until_a_call_names_them():
    order = PrefixOrder()
    order.add_recovered(["r0", "r1", "r2"])
    chain(order, ["n0"])
    assert order.victims(1, never) == ["r0"], "recovered keys go before keys learned since"
    assert all(order.predecessor(k) is None for k in ("r0", "r1", "r2"))
    order.note_call(["r0", "r1", "r2", "r3"])  # a store of the same prompt, one chunk longer
    order.add("r3")
    assert [order.predecessor(k) for k in ("r1", "r2", "r3")] == ["r0", "r1", "r2"]
    assert order.victims(5, never) == ["n0", "r3", "r2", "r1", "r0"]


def test_a_chunk_stored_again_makes_what_follows_it_reachable_again():
    # a1 left (a2 and a3 could not be reached), a2 stayed (a lookup held it); then the prompt was
    # recomputed and a1 stored again: a lookup reaches a2 and a3 once more.
    order = PrefixOrder()
    chain(order, ["a0", "a1", "a2", "a3"])
    order.remove("a1")
    assert order.is_unreachable("a2")
    chain(order, ["a0", "a1", "a2", "a3"])  # the store call of the recompute (a2, a3 held already)
    assert not order.is_unreachable("a2")
    assert order.unreachable(never) == [], "nothing is unreachable: MP drop_unreachable would delete it"
    assert order.victims(4, never) == ["a3", "a2", "a1", "a0"], "the chain is eaten from its tail"
    order.remove("a2")
    assert order.unreachable(never) == ["a3"]


def test_a_chunk_recovered_again_makes_what_follows_it_reachable_again():
    # a device of several went offline: the eviction that tried its a1 forgot it; reopened,
    # the device brings a1 back and a lookup reaches a2 again
    order = PrefixOrder()
    chain(order, ["a0", "a1", "a2"])
    order.remove("a1")
    order.add_recovered(["a1"])
    assert order.unreachable(never) == []
    # a0 lost its child (a leaf until a lookup links a1 to it again); a2 is a tail again
    assert order.victims(3, never) == ["a0", "a2", "a1"]


def test_a_chunk_stored_again_after_its_children_were_removed_is_a_leaf():
    order = PrefixOrder()
    chain(order, ["a0", "a1", "a2"])
    order.remove("a1")
    order.remove("a2")
    chain(order, ["a0", "a1"])
    assert order.victims(2, never) == ["a1", "a0"]
    assert order.counts() == {"prefix_keys": 2, "prefix_leaves": 1, "prefix_unreachable": 0,
                              "prefix_pending_links": 0}


def test_pending_links_are_bounded():
    order = PrefixOrder(hint_capacity=4)
    for i in range(100):
        order.note_lookup([f"h{i}", f"m{i}"], 1)  # lookups whose store never comes
        order.note_call([f"c{i}", f"d{i}", f"e{i}"])  # and store calls whose writes never land
    # trimmed in bulk (a dictionary rebuilt, not a key dropped per link): at most twice the capacity
    assert 4 <= order.counts()["prefix_pending_links"] <= 8
    order.note_lookup(["h99", "m99"], 1)
    order.add("m99")
    assert order.predecessor("m99") == "h99", "the newest links are the ones kept"


# --------------------------------------------------------------------------- the plugin


@pytest.fixture
def open_backend(tmp_path, loop_thread):
    made: list[RustRawBlockBackend] = []

    def make(slots: int, meta_format: str, name: str = "dev", devices: int = 1, **overrides) -> RustRawBlockBackend:
        paths = []
        for d in range(devices):
            path = tmp_path / f"{name}{d}.img"
            if not path.exists():
                with open(path, "wb") as f:
                    f.truncate(4 * MiB + slots * SLOT)
            paths.append(str(path))
        extra = base_extra(paths[0], meta_format=meta_format, **overrides)
        if devices > 1:
            del extra["rust_raw_block.device_path"]
            extra["rust_raw_block.device_paths"] = paths
        be = RustRawBlockBackend(config=FakeEngineConfig(extra), metadata=FakeMetadata(),
                                 local_cpu_backend=FakeLocalCPUBackend(), loop=loop_thread.loop)
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


def store(be, ids: list[int]) -> None:
    """One store call of ``ids`` (a prompt's chunks in order); every write must land."""
    futs = be.batched_submit_put_task([make_key(i) for i in ids], [make_obj(i) for i in ids])
    for f in futs or []:
        f.result(60)


def lookup(be, ids: list[int], loop_thread) -> int:
    coro = be.batched_async_contains("lookup", [make_key(i) for i in ids])
    return asyncio.run_coroutine_threadsafe(coro, loop_thread.loop).result(60)


def fill_with_chains(be, loop_thread, heads: list[int], length: int, *, touch_first: bool) -> None:
    """Chains head..head+length-1, one store call each, each then looked up and loaded (which
    orders its keys head first: the writes of one call finish in any order); then
    (``touch_first``) the first chain again, as a returning conversation does."""
    for h in heads:
        store(be, list(range(h, h + length)))
    for h in heads + ([heads[0]] if touch_first else []):
        keys = [make_key(i) for i in range(h, h + length)]
        assert lookup(be, list(range(h, h + length)), loop_thread) == length
        assert all(o is not None for o in be.batched_get_blocking(keys))


def unreachable_chunks(be, heads: list[int], length: int, loop_thread) -> int:
    """Stored chunks of the chains that a prompt lookup (stopping at the first miss) never
    reaches: dead bytes."""
    dead = 0
    for h in heads:
        ids = list(range(h, h + length))
        stored = sum(be.contains(make_key(i)) for i in ids)
        dead += stored - lookup(be, ids, loop_thread)
    return dead


def evict_scenario(open_backend, loop_thread, policy: str, meta_format: str, devices: int = 1) -> int:
    """A full cache of chains, the oldest one used again, then new chunks that need room:
    the chunks left that no lookup can reach."""
    be = open_backend(slots=16, meta_format=meta_format, devices=devices, eviction_policy=policy,
                      eviction_ratio=0)
    usable = be._core.slot_counts().usable
    length = 4
    heads = [100 * (c + 1) for c in range(usable // length)]
    fill_with_chains(be, loop_thread, heads, length, touch_first=True)
    for i in range(usable - len(heads) * length + 3):  # three chunks past full
        store(be, [10_000 + i])
    return unreachable_chunks(be, heads, length, loop_thread)


@pytest.mark.parametrize("meta_format", FORMATS)
def test_prefix_leaves_no_unreachable_chunk_where_lru_does(open_backend, loop_thread, meta_format):
    assert evict_scenario(open_backend, loop_thread, "prefix", meta_format) == 0


@pytest.mark.parametrize("meta_format", FORMATS)
def test_lru_leaves_unreachable_chunks_in_the_same_trace(open_backend, loop_thread, meta_format):
    # LRU evicts the head of the chain used least recently (a lookup moves a chain's keys to the
    # recent end head first, so its head is always its oldest key): the rest is dead bytes.
    assert evict_scenario(open_backend, loop_thread, "lru", meta_format) > 0


def test_prefix_over_several_devices(open_backend, loop_thread):
    assert evict_scenario(open_backend, loop_thread, "prefix", "log", devices=2) == 0


@pytest.mark.parametrize("meta_format", FORMATS)
def test_plugin_evicts_unreachable_chunks_first(open_backend, loop_thread, meta_format):
    be = open_backend(slots=16, meta_format=meta_format, eviction_policy="prefix", eviction_ratio=0)
    usable = be._core.slot_counts().usable
    store(be, [0, 1, 2, 3])
    assert be.remove(make_key(1))  # 2 and 3 can no longer be reached
    assert be.report_status()["prefix_unreachable"] == 1
    be.wait_idle(60)
    filler = list(range(100, 100 + usable - 3))
    store(be, filler)  # newer than 2 and 3, and reachable: LRU would take key 0 and these first
    store(be, [200, 201])  # full: two must go
    assert not be.contains(make_key(2)) and not be.contains(make_key(3))
    assert be.contains(make_key(0)) and all(be.contains(make_key(i)) for i in filler)


@pytest.mark.parametrize("meta_format", FORMATS)
def test_plugin_evicts_tails_before_heads_and_never_pinned(open_backend, loop_thread, meta_format):
    be = open_backend(slots=16, meta_format=meta_format, eviction_policy="prefix", eviction_ratio=0)
    usable = be._core.slot_counts().usable
    store(be, [0, 1, 2, 3])
    store(be, list(range(100, 100 + usable - 4)))
    assert be.pin(make_key(3))
    store(be, [500])  # full: the only chain with a free tail is the second; its tail goes
    assert not be.contains(make_key(100 + usable - 5)) and all(be.contains(make_key(i)) for i in range(4))
    store(be, [501, 502])
    assert all(be.contains(make_key(i)) for i in range(4)), "pinned keys, and the chain before them, stay"
    second = [be.contains(make_key(i)) for i in range(100, 100 + usable - 4)]
    kept = second.index(False)
    assert kept >= usable - 12 and not any(second[kept:]), "the second chain lost its tail only"
    be.unpin(make_key(3))


@pytest.mark.parametrize("meta_format", FORMATS)
def test_chains_are_relearned_after_a_restart(open_backend, loop_thread, meta_format):
    be = open_backend(slots=16, meta_format=meta_format, eviction_policy="prefix", eviction_ratio=0)
    store(be, [0, 1, 2])
    be.close()
    be = open_backend(slots=16, meta_format=meta_format, eviction_policy="prefix", eviction_ratio=0)
    st = be.report_status()
    assert st["prefix_keys"] == 3 and st["prefix_leaves"] == 3, "recovered keys are heads: nothing is lost"
    assert lookup(be, [0, 1, 2, 3], loop_thread) == 3
    store(be, [3, 4])
    st = be.report_status()
    assert (st["prefix_keys"], st["prefix_leaves"]) == (5, 1), "the lookup and the store linked the chain again"


def test_policy_setting_is_checked(open_backend):
    with pytest.raises(ValueError, match=r"eviction_policy'\] must be one of none, lru, prefix, extent, extent_prefix; got 'radix'"):
        open_backend(slots=16, meta_format="log", eviction_policy="radix")
    be = open_backend(slots=16, meta_format="log", name="ok", eviction_policy=" Prefix ")
    assert be.eviction_policy == "prefix" and be.report_status()["eviction_policy"] == "prefix"


def test_a_store_after_a_storage_manager_lookup_continues_the_chain(open_backend):
    """LMCache's storage manager looks up through ``batched_contains`` and then stores the
    chunks past the hits: the store's first chunk follows the last hit."""
    be = open_backend(slots=16, meta_format="log", eviction_policy="prefix", eviction_ratio=0)
    store(be, [0, 1])
    assert be.batched_contains([make_key(i) for i in (0, 1, 2, 3)]) == 2
    store(be, [2, 3])
    st = be.report_status()
    assert (st["prefix_keys"], st["prefix_leaves"]) == (4, 1), "one chain 0-1-2-3, with 3 its only leaf"
    assert be.remove(make_key(1))
    assert be.report_status()["prefix_unreachable"] == 1, "2 lost its predecessor"


# --------------------------------------------------------------------------- lookups stop early


def test_probe_bound_stops_at_a_chunk_whose_predecessor_left():
    order = PrefixOrder()
    chain(order, ["a0", "a1", "a2", "a3"])
    assert order.probe_bound(["a0", "a1", "a2", "a3"]) == 4, "nothing unreachable: probe all"
    order.remove("a1")
    assert order.probe_bound(["a0", "a1", "a2", "a3"]) == 1, "a1 left: neither it nor a2 is probed"
    assert order.probe_bound(["x", "a2", "a3"]) == 1, "another predecessor named: a2 itself is not probed"
    chain(order, ["a0", "a1"])  # stored again: a2 is reachable again
    assert order.probe_bound(["a0", "a1", "a2", "a3"]) == 4


@pytest.mark.parametrize("meta_format", FORMATS)
def test_a_lookup_does_not_probe_past_a_broken_chain(open_backend, loop_thread, meta_format, monkeypatch):
    be = open_backend(slots=16, meta_format=meta_format, eviction_policy="prefix", eviction_ratio=0)
    store(be, [0, 1, 2, 3, 4])
    assert be.remove(make_key(2))  # 3 and 4 can no longer be reached
    probed: list[int] = []
    exists_many = be._core.exists_many

    def counting(keys, *args, **kwargs):
        probed.append(len(keys))
        return exists_many(keys, *args, **kwargs)

    monkeypatch.setattr(be._core, "exists_many", counting)
    assert lookup(be, [0, 1, 2, 3, 4, 5], loop_thread) == 2
    assert probed == [2], "keys 0 and 1 probed; not 2 (known gone), nor what follows it"
    store(be, [2])  # a recompute stores 2 again: the chain is whole
    probed.clear()
    assert lookup(be, [0, 1, 2, 3, 4, 5], loop_thread) == 5
    assert probed == [6]
