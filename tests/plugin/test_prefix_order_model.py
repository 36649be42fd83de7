"""The C prefix order (``lmcache_rawblock.prefix_evict.PrefixOrder``, csrc/py/prefix_order.c)
against the pure-Python order it replaced (tests/prefix_order_model.py): the same random
operation sequences (store calls, lookups, stores, recoveries, removals, evictions; keys from a
small set so that chains share heads, calls repeat keys, links point back into a chain and the
pending links overflow) give the same victims, unreachable keys, probe bounds, reachable losses,
predecessors and counts after every step. Plus what the model does not cover: bad arguments,
a predicate calling back into the order, str subclasses. Nothing here is timed.
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from lmcache_rawblock.prefix_evict import HINT_CAPACITY, PrefixOrder, ReachableExtents
from prefix_order_model import ModelPrefixOrder


def _keys(rng: random.Random, universe: list[str], lo: int, hi: int) -> list[str]:
    if rng.random() < 0.6:  # a run of one prompt's chain (keys in order), sometimes cut
        start = rng.randrange(len(universe))
        return universe[start:start + rng.randint(lo, hi)] or [universe[start]]
    return [rng.choice(universe) for _ in range(rng.randint(lo, hi))]


def _skip(rng: random.Random, universe: list[str]) -> tuple[Any, Any]:
    """The same skip for both orders: nothing, a set, a frozenset or a predicate."""
    kind = rng.randrange(4)
    if kind == 0:
        return (), ()
    kept = set(rng.sample(universe, rng.randint(0, 4)))
    if kind == 1:
        return kept, set(kept)
    if kind == 2:
        return frozenset(kept), frozenset(kept)
    return kept.__contains__, (lambda k: k in kept)


def _step(rng: random.Random, model: ModelPrefixOrder, order: PrefixOrder, universe: list[str],
          log: list[str]) -> None:
    op = rng.randrange(14)
    if op <= 2:
        keys = _keys(rng, universe, 1, 8)
        log.append(f"note_call {keys}")
        model.note_call(keys)
        order.note_call(keys)
        if rng.random() < 0.8:  # the call's writes land (all, or some, in order or not)
            stored = keys if rng.random() < 0.7 else rng.sample(keys, rng.randint(1, len(keys)))
            log.append(f"add_many {stored}")
            model.add_many(stored)
            order.add_many(stored)
    elif op == 3:
        keys = _keys(rng, universe, 1, 8)
        hits = rng.randint(-1, len(keys) + 1)
        log.append(f"note_lookup {keys} {hits}")
        model.note_lookup(keys, hits)
        order.note_lookup(keys, hits)
    elif op == 4:
        links = [(rng.choice(universe), rng.choice(universe)) for _ in range(rng.randint(0, 3))]
        log.append(f"note_links {links}")
        model.note_links(iter(links))
        order.note_links(iter(links))
    elif op == 5:
        keys = _keys(rng, universe, 0, 5)
        log.append(f"add_recovered {keys}")
        model.add_recovered(keys)
        order.add_recovered(keys)
    elif op == 6:
        key = rng.choice(universe)
        log.append(f"touch/add {key}")
        if rng.random() < 0.5:
            model.touch(key)
            order.touch(key)
        else:
            model.add(key)
            order.add(key)
    elif op <= 8:
        keys = _keys(rng, universe, 1, 6)
        log.append(f"remove_many {keys}")
        if len(keys) == 1 and rng.random() < 0.5:
            model.remove(keys[0])
            order.remove(keys[0])
        else:
            model.remove_many(keys)
            order.remove_many(tuple(keys))
    elif op <= 11:
        want = rng.randint(-1, 12)
        skip_c, skip_m = _skip(rng, universe)
        log.append(f"victims {want} {skip_m}")
        got = order.victims(want, skip_c)
        assert got == model.victims(want, skip_m), "\n".join(log[-30:])
        if got and rng.random() < 0.7:  # evicted
            log.append(f"remove_many {got}")
            model.remove_many(got)
            order.remove_many(got)
    elif op == 12:
        keys = _keys(rng, universe, 0, 8)
        log.append(f"reachable_loss/probe_bound {keys}")
        loss = model.reachable_loss(keys)
        assert order.reachable_loss(keys) == loss, "\n".join(log[-30:])
        limit = rng.randint(0, 6)  # counting stops at a limit: the smaller of the two
        assert order.reachable_loss(keys, limit) == min(loss, limit), "\n".join(log[-30:])
        assert order.probe_bound(keys) == model.probe_bound(keys), "\n".join(log[-30:])
        extents = [_keys(rng, universe, 1, 4) for _ in range(rng.randint(1, 4))]
        losses = [model.reachable_loss(e) for e in extents]  # the extent choice: fewest lost, then oldest
        want = min(range(len(extents)), key=lambda i: (losses[i], i))
        assert ReachableExtents(order, threading.Lock()).choose(extents) == want, "\n".join(log[-30:])
    else:
        skip_c, skip_m = _skip(rng, universe)
        log.append(f"unreachable {skip_m}")
        assert order.unreachable(skip_c) == model.unreachable(skip_m), "\n".join(log[-30:])


def _same_state(model: ModelPrefixOrder, order: PrefixOrder, universe: list[str], log: list[str]) -> None:
    where = "\n".join(log[-30:])
    assert order.counts() == model.counts(), where
    assert len(order) == len(model), where
    for key in universe:
        assert (key in order) == (key in model), where
        assert order.predecessor(key) == model.predecessor(key), where
        assert order.is_unreachable(key) == model.is_unreachable(key), where
    everything = len(universe) + 1  # the whole eviction order, nothing kept
    assert order.victims(everything, ()) == model.victims(everything, ()), where


@pytest.mark.parametrize("seed", range(40))
def test_c_order_matches_the_python_model_step_by_step(seed: int) -> None:
    rng = random.Random(seed)
    universe = [f"k{i}" for i in range(rng.choice((6, 12, 30)))]
    cap = rng.choice((1, 3, 8, 1000))
    model, order = ModelPrefixOrder(hint_capacity=cap), PrefixOrder(hint_capacity=cap)
    log: list[str] = []
    for _ in range(250):
        _step(rng, model, order, universe, log)
        _same_state(model, order, universe, log)


def test_c_order_matches_the_model_over_many_keys_and_reset() -> None:
    """Thousands of keys (the table and node array grow, freed nodes are reused), then
    ``__init__`` again empties the order (what the bookkeeping benchmark does)."""
    rng = random.Random(7)
    universe = [f"key-{i:05d}" for i in range(3000)]
    model, order = ModelPrefixOrder(hint_capacity=64), PrefixOrder(hint_capacity=64)
    for i in range(0, len(universe), 8):
        call = universe[i:i + 8]
        for o in (model, order):
            o.note_call(call)
            o.add_many(call)
        if i % 400 == 0:
            want = rng.randint(50, 300)
            got = order.victims(want, ())
            assert got == model.victims(want, ())
            model.remove_many(got)
            order.remove_many(got)
    assert order.counts() == model.counts()
    assert order.victims(len(universe), ()) == model.victims(len(universe), ())
    for key in rng.sample(universe, 200):
        assert order.predecessor(key) == model.predecessor(key)
    order.__init__()  # type: ignore[misc]
    assert len(order) == 0 and order.counts()["prefix_pending_links"] == 0
    assert order.victims(10, ()) == []
    assert PrefixOrder().counts() == {"prefix_keys": 0, "prefix_leaves": 0, "prefix_unreachable": 0,
                                      "prefix_pending_links": 0}
    assert HINT_CAPACITY == 1 << 16


def test_bad_keys_are_refused_by_name_and_leave_the_order_usable() -> None:
    order = PrefixOrder()
    order.note_call(["a0", "a1"])
    with pytest.raises(TypeError, match=r"PrefixOrder: a key must be str; got int"):
        order.add_many(["a0", 5])
    assert "a0" not in order and len(order) == 0, "nothing was stored, not even the keys before the bad one"
    with pytest.raises(TypeError, match="must be str; got bytes"):
        order.note_call(["a1", b"a2"])
    with pytest.raises(ValueError, match=r"a \(key, predecessor\) pair; got 3 items"):
        order.note_links([("a", "b", "c")])
    with pytest.raises(TypeError, match="keys must be iterable"):
        order.remove_many(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit must be >= 0 or None; got -1"):
        order.reachable_loss(["a0"], -1)
    assert 5 not in order
    order.add_many(["a0", "a1"])
    assert order.victims(2, ()) == ["a1", "a0"]


def test_a_refused_lookup_links_nothing() -> None:
    """note_lookup refusing a bad key anywhere in the prompt relinks no recovered head and
    leaves no pending link, in the C order and the model alike."""
    for order in (PrefixOrder(), ModelPrefixOrder()):
        order.add_recovered(["a0", "a1", "a2"])
        for bad in (["a0", "a1", "a2", 5], ["a0", "a1", b"a2"], ["a0", "a1", "a3", None]):
            with pytest.raises(TypeError, match="PrefixOrder: a key must be str; got "):
                order.note_lookup(bad, 2)  # type: ignore[arg-type]
        assert [order.predecessor(k) for k in ("a1", "a2")] == [None, None], type(order)
        assert order.counts()["prefix_pending_links"] == 0, type(order)
        order.note_lookup(["a0", "a1", "a3"], 2)
        assert order.predecessor("a1") == "a0" and order.counts()["prefix_pending_links"] == 1, type(order)


def _fingerprint(order: Any, universe: list[str]) -> tuple:
    """What can be seen of an order from outside, the whole eviction order included."""
    return (order.counts(), len(order), [(k in order, order.predecessor(k), order.is_unreachable(k)) for k in universe],
            order.victims(len(universe) + 1, ()), order.unreachable(()), order.probe_bound(universe))


def _model_state(model: ModelPrefixOrder) -> dict:
    """The model's structures, orders included (the pending links' order decides what a trim
    keeps)."""
    return {name: (list(v.items()) if isinstance(v, dict) else sorted(v) if isinstance(v, set) else v)
            for name, v in vars(model).items()}


_BAD_KEYS = (5, b"k1", None, 2.5)


def _refused_call(rng: random.Random, universe: list[str]) -> tuple[str, Callable[[Any], None]]:
    """One call of a changing method whose input holds one bad key among good ones."""
    keys: list[Any] = _keys(rng, universe, 1, 8)
    keys.insert(rng.randint(1, len(keys)), rng.choice(_BAD_KEYS))
    method = rng.choice(("add_many", "note_lookup", "note_call", "note_links", "add_recovered", "remove_many"))
    if method == "note_lookup":
        hits = rng.randint(0, len(keys))
        return f"note_lookup {keys} {hits}", lambda o: o.note_lookup(keys, hits)
    if method == "note_links":
        links = [(rng.choice(universe), rng.choice(universe)) for _ in range(rng.randint(1, 4))]
        links.insert(rng.randint(1, len(links)), (rng.choice(universe), rng.choice(_BAD_KEYS)))
        return f"note_links {links}", lambda o: o.note_links(iter(links))
    return f"{method} {keys}", lambda o: getattr(o, method)(keys)


@pytest.mark.parametrize("seed", range(20))
def test_a_call_refusing_a_bad_key_changes_neither_order(seed: int) -> None:
    """A changing method given a key that is not a str part-way through its input refuses the
    whole call: the C order and the model raise the same TypeError and are left as they were
    (the model to the last structure, the C order as far as it can be seen), and go on to
    agree on every step after."""
    rng = random.Random(1000 + seed)
    universe = [f"k{i}" for i in range(rng.choice((6, 12, 30)))]
    cap = rng.choice((1, 3, 1000))
    model, order = ModelPrefixOrder(hint_capacity=cap), PrefixOrder(hint_capacity=cap)
    log: list[str] = []
    for _ in range(120):
        _step(rng, model, order, universe, log)
        if rng.random() < 0.3:
            what, call = _refused_call(rng, universe)
            log.append(f"refused {what}")
            before_c, before_m = _fingerprint(order, universe), _model_state(model)
            with pytest.raises(TypeError, match="must be str; got") as got_c:
                call(order)
            with pytest.raises(TypeError, match="must be str; got") as got_m:
                call(model)
            assert str(got_c.value) == str(got_m.value), what
            assert _model_state(model) == before_m, "\n".join(log[-30:])
            assert _fingerprint(order, universe) == before_c, "\n".join(log[-30:])
        _same_state(model, order, universe, log)


def test_a_refused_removal_leaves_the_keys_it_named_unmarked() -> None:
    """remove_many refusing a bad key removes nothing; the stored keys named before it still
    become leaves (taken first) when their last child leaves later."""
    order = PrefixOrder()
    order.note_call(["a", "b"])
    order.add_many(["a", "b"])
    order.add("x")
    with pytest.raises(TypeError, match="must be str; got int"):
        order.remove_many(["a", 5])  # type: ignore[list-item]
    assert "a" in order and "b" in order
    order.remove("b")
    assert order.counts()["prefix_leaves"] == 2
    assert order.victims(1, ()) == ["a"], "a childless predecessor is the first leaf"


def test_str_subclass_keys_are_the_same_keys() -> None:
    class Key(str):
        pass

    order = PrefixOrder()
    order.note_call([Key("a0"), Key("a1")])
    order.add_many([Key("a0"), "a1"])
    assert order.predecessor("a1") == "a0" and type(order.victims(1, ())[0]) is str
    assert Key("a1") in order and order.probe_bound([Key("a0"), Key("a1")]) == 2


def test_a_predicate_calling_back_into_the_order_is_refused() -> None:
    order = PrefixOrder()
    order.note_call(["a0", "a1", "a2"])
    order.add_many(["a0", "a1", "a2"])

    def meddle(key: str) -> bool:
        order.remove(key)
        return False

    with pytest.raises(RuntimeError, match="called again from inside one of its calls"):
        order.victims(3, meddle)
    assert order.victims(3, ()) == ["a2", "a1", "a0"], "the order is unchanged and usable"

    def fail(_key: str) -> bool:
        raise KeyError("from the predicate")

    with pytest.raises(KeyError, match="from the predicate"):
        order.victims(2, fail)
    tail_pinned: Callable[[str], bool] = lambda k: k == "a2"  # noqa: E731
    assert order.victims(3, tail_pinned) == ["a1", "a0"], "below a kept leaf, newest stored first"


def test_keys_the_order_no_longer_needs_are_released() -> None:
    """A key that left, with no pending link and nothing naming it, holds no reference: the
    order's memory follows what it knows, not every key it ever saw."""
    keys = ["".join(("key-", str(i))) for i in range(50)]  # objects of their own
    base = [sys.getrefcount(k) for k in keys]
    order = PrefixOrder(hint_capacity=1)
    order.note_call(keys)
    order.add_many(keys)
    order.note_lookup([keys[0], "elsewhere"], 1)  # a pending link naming keys[0]
    assert sys.getrefcount(keys[0]) > base[0] and sys.getrefcount(keys[25]) > base[25]
    order.remove_many(keys[1:])
    assert [sys.getrefcount(k) for k in keys][1:] == base[1:]
    order.remove(keys[0])
    assert sys.getrefcount(keys[0]) > base[0], "still named by the pending link"
    order.note_links([("x", "y"), ("z", "w"), ("v", "u")])  # the oldest links go (capacity 1)
    assert sys.getrefcount(keys[0]) == base[0]
    assert order.counts() == {"prefix_keys": 0, "prefix_leaves": 0, "prefix_unreachable": 0,
                              "prefix_pending_links": 1}


def test_a_refused_call_holds_no_reference_to_its_keys() -> None:
    keys = ["".join(("fresh-", str(i))) for i in range(3)]
    base = [sys.getrefcount(k) for k in keys]
    order = PrefixOrder()
    with pytest.raises(TypeError, match="must be str; got int"):
        order.note_call([*keys, 5])  # type: ignore[list-item]  # the keys before the bad one were looked up, not linked
    with pytest.raises(TypeError, match="must be str; got NoneType"):
        order.note_links([(keys[0], None)])
    assert [sys.getrefcount(k) for k in keys] == base
    assert order.counts()["prefix_pending_links"] == 0
