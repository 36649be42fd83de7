"""Prefix-aware eviction order (``rust_raw_block.eviction_policy: prefix``).

LMCache looks a prompt up chunk by chunk and stops at the first miss, so a chunk whose
predecessor is gone from the tier is never served again. :class:`PrefixOrder` learns which
chunk follows which and orders victims so that:

1. chunks whose predecessor was evicted or removed (*unreachable*) go first, oldest first,
   then the chunks that hang below them;
2. among reachable chunks, chain tails go before heads: an LRU over the *leaves* (stored
   chunks no stored chunk follows). Evicting a leaf makes its predecessor a leaf, and it is
   taken next (its last use is no later than its child's: every lookup that reached the child
   passed it), so an old chain is eaten from its tail, as SGLang's radix cache does in memory.

Where the links come from (all O(1) per key, no I/O):

* a store call (``batched_submit_put_task``) hands the chunks of one prompt in prompt order:
  each key's predecessor is the key before it in the call (:meth:`note_call`);
* the first key of a store call usually continues a prefix that is already stored (LMCache
  stores only the chunks past what it found). LMCache's chunk hashes are chained (each hashes
  its predecessor's hash with its tokens) and the key carries only the hash, so nothing in the
  key tells a prompt's first chunk from a continuation. A lookup hands the whole prompt in
  order, so :meth:`note_lookup` records the first missing key's predecessor (the last hit): the
  store that follows links to it. A key whose predecessor is still unknown is taken as the head
  of a chain: never unreachable, only evicted as a leaf (the safe side: nothing reachable is
  ever dropped as dead);
* recovered keys (after a restart, or a device brought back) have no known predecessor and are
  heads, oldest first, until a store or lookup that names them links them again.

What it costs a put: the order is a C type (``_native.PrefixOrder``, csrc/py/prefix_order.c):
a table of nodes keyed by the key strings (their cached hashes), each node linked by index
into the leaf, unreachable, stored and pending-link lists and into its predecessor's list of
children. A store call's links are one call (``note_call``), its stored keys another
(``add_many``); only the keys a batch leaves childless join the leaf order. Eviction tests a
set of kept keys (or calls a predicate), and a removal batch makes no leaf of a predecessor
leaving in the same batch. The pure-Python order it replaced is the reference the C order is
tested against (tests/prefix_order_model.py).

It also serves :meth:`PrefixOrder.probe_bound` (a lookup need not probe past a chunk whose
predecessor is known gone) and :class:`ReachableExtents` (``eviction_policy: extent_prefix``:
the extent to evict, of the few filled longest ago, is the one losing the fewest reachable
chunks, :meth:`PrefixOrder.reachable_loss`).

The order is not metadata: it lives in memory only, a restart (or kill -9) loses it and never a
key or a byte.

Not thread-safe: the plugin calls it under its ``_lru_lock``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._native import PrefixOrder

__all__ = ["EXTENT_POLICIES", "PrefixOrder", "HINT_CAPACITY", "ReachableExtents", "extent_eviction",
           "forget_keeping_links"]

# Links learned for keys not stored yet (being written, or a lookup's first miss): kept
# first-in-first-out up to this many, so a lookup whose store never comes costs nothing lasting.
HINT_CAPACITY = 1 << 16  # PrefixOrder()'s default


class ReachableExtents:
    """Prefix weighting of whole-extent eviction (``eviction_policy: extent_prefix``): the
    hook ``lmcache_rawblock.extent_evict.ExtentEviction`` asks to choose among the
    ``candidates`` closed extents filled longest ago the one whose eviction loses the fewest
    reachable keys (:meth:`PrefixOrder.reachable_loss`; ties go to the least recently used),
    and tells of the keys it deleted and put back so the chains stay true. ``lock`` is the
    plugin's ``_lru_lock`` (a leaf: the evictor holds ``_pin_lock`` when it calls)."""

    candidates = 4

    def __init__(self, order: PrefixOrder, lock: Any) -> None:
        self._order = order
        self._lock = lock
        self.chosen_other = 0  # victims that were not the least recently used candidate

    def choose(self, extents: list[list[str]]) -> int:
        """The index in ``extents`` (each a candidate's keys, filled longest ago first) of
        the one to evict."""
        if len(extents) < 2:
            return 0
        best = 0
        with self._lock:
            least = self._order.reachable_loss(extents[0])
            for i in range(1, len(extents)):
                # Only a smaller loss wins: counting stops there (an extent holding a shared
                # head need not walk every chain below it).
                loss = self._order.reachable_loss(extents[i], least)
                if loss < least:
                    best, least = i, loss
        if best:
            self.chosen_other += 1
        return best

    def deleted(self, keys: list[str]) -> None:
        """``keys`` were evicted; their links are kept as pending ones, so a hot key put back
        rejoins its chain."""
        with self._lock:
            forget_keeping_links(self._order, keys)

    def stored(self, keys: list[str]) -> None:
        with self._lock:
            self._order.add_many(keys)


def forget_keeping_links(order: PrefixOrder, keys: list[str]) -> None:
    """``keys`` leave ``order`` as evicted keys do: their links kept as pending ones, so a key
    stored again rejoins its chain. The caller holds the order's lock."""
    links = [(k, p) for k, p in zip(keys, map(order.predecessor, keys)) if p is not None]
    order.remove_many(keys)
    order.note_links(links)


EXTENT_POLICIES = ("extent", "extent_prefix")


def extent_eviction(policy: str, core: Any, pin_lock: Any, pinned: Callable[[], set[str]], reserve: int,
                    logger: Any, reinsert: bool, label: str, order: PrefixOrder | None = None, order_lock: Any = None,
                    on_deleted: Callable[[list[str]], None] | None = None,
                    on_put_again: Callable[[list[str]], None] | None = None) -> Any:
    """The whole-extent evictor of ``eviction_policy`` ``extent`` or ``extent_prefix``, for the
    plugin and the MP adapter alike (the one place the choice is built from the setting).
    Under ``extent_prefix`` a :class:`ReachableExtents` over ``order`` (guarded by
    ``order_lock``) chooses the victim and hears of the keys deleted and put back before the
    owner's ``on_deleted`` / ``on_put_again`` do (so those must leave ``order`` alone)."""
    from .extent_evict import ExtentEviction

    if policy not in EXTENT_POLICIES:
        raise ValueError(f"eviction_policy must be one of {', '.join(EXTENT_POLICIES)} for extent eviction, "
                         f"got {policy!r}")
    if policy == "extent":
        return ExtentEviction(core, pin_lock, pinned, reserve, logger, reinsert, label, on_deleted=on_deleted,
                              on_put_again=on_put_again)
    if order is None or order_lock is None:
        raise ValueError("eviction_policy 'extent_prefix' needs the chains (a PrefixOrder) and their lock")
    chooser = ReachableExtents(order, order_lock)
    return ExtentEviction(core, pin_lock, pinned, reserve, logger, reinsert, label,
                          on_deleted=_both(chooser.deleted, on_deleted),
                          on_put_again=_both(chooser.stored, on_put_again), chooser=chooser)


def _both(first: Callable[[list[str]], None],
          then: Callable[[list[str]], None] | None) -> Callable[[list[str]], None]:
    if then is None:
        return first

    def hook(keys: list[str]) -> None:
        first(keys)
        then(keys)

    return hook
