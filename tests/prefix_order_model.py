"""The prefix-aware eviction order in Python: the reference model the C order
(``lmcache_rawblock._native.PrefixOrder``, behind ``lmcache_rawblock.prefix_evict``) is tested
against, operation by operation (tests/plugin/test_prefix_order_model.py). Same methods, same
results; ``lmcache_rawblock/prefix_evict.py`` says what the order does and why. A method
that changes the order refuses a key that is not a str (TypeError, worded as the C order words
it) before it changes anything, as the C order does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Container, Iterable
from itertools import islice
from typing import Any

HINT_CAPACITY = 1 << 16
_MISSING: Any = object()


def _strs(keys: Iterable[Any], what: str = "a key") -> list[str]:
    """``keys`` as a list, each a str: else TypeError for the first that is not."""
    keys = keys if isinstance(keys, list) else list(keys)
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"PrefixOrder: {what} must be str; got {type(key).__name__}")
    return keys


def _links(links: Iterable[Any]) -> list[tuple[str, str]]:
    """``links`` as a list of (key, predecessor) pairs of str: else the C order's refusal."""
    out = []
    for link in links:
        if not isinstance(link, (list, tuple)):
            try:
                link = list(link)
            except TypeError:
                raise TypeError("PrefixOrder.note_links: each link must be a (key, predecessor) pair") from None
        if len(link) != 2:
            raise ValueError(f"PrefixOrder.note_links: a link must be a (key, predecessor) pair; got {len(link)} items")
        key, pred = _strs(link)
        out.append((key, pred))
    return out


class ModelPrefixOrder:
    """Chains of stored keys and their eviction order (see the module docstring)."""

    def __init__(self, hint_capacity: int = HINT_CAPACITY) -> None:
        self._pred: dict[str, str | None] = {}  # every stored key -> predecessor (None: head)
        # key (stored or not) -> its stored children: the child itself when there is one (no list
        # made per key: the common case, a chain), a list of two or more
        self._kids: dict[str, str | list[str]] = {}
        self._leaves: OrderedDict[str, None] = OrderedDict()  # reachable, no stored child; LRU first
        self._orphans: OrderedDict[str, None] = OrderedDict()  # predecessor gone; oldest first
        # Links learned for keys a call or lookup named (the keys of a call already stored among
        # them: only their first store reads the link), oldest first; trimmed in bulk.
        self._hints: dict[str, str] = {}
        self._heads: set[str] = set()  # stored keys without a known predecessor
        self._hint_capacity = max(1, int(hint_capacity))

    # ---- learning -----------------------------------------------------------------------

    def note_call(self, encoded: list[str]) -> None:
        """The keys of one store call, in prompt order: each one's predecessor is the key before
        it (the first's, a link a lookup left, if any). One dictionary update for the call; a
        stored head the call names after its first key (a recovered key) is linked here."""
        encoded = _strs(encoded)
        if len(encoded) < 2:
            return
        later = encoded[1:]
        self._hints.update(zip(later, encoded))
        heads = self._heads
        if heads and not heads.isdisjoint(later):
            for key, prev in zip(later, encoded):
                if key in heads and key != prev:
                    self._relink(key, prev)
        if len(self._hints) > 2 * self._hint_capacity:
            self._trim_hints()

    def note_lookup(self, encoded: list[str], hits: int) -> None:
        """A lookup of ``encoded`` (a prompt's keys in order) that found the first ``hits``:
        the first missing key follows the last hit; hits without a known predecessor (keys
        recovered after a restart) are linked to the key before them."""
        encoded = _strs(encoded)
        heads = self._heads
        hits = min(hits, len(encoded))
        if hits > 1 and heads and not heads.isdisjoint(encoded[1:hits]):
            for i in range(1, hits):
                key = encoded[i]
                if key in heads and encoded[i - 1] != key:
                    self._relink(key, encoded[i - 1])
        if 0 < hits < len(encoded) and encoded[hits] not in self._pred:
            self._hints[encoded[hits]] = encoded[hits - 1]
            if len(self._hints) > 2 * self._hint_capacity:
                self._trim_hints()

    def note_links(self, links: Iterable[tuple[str, str]]) -> None:
        """(key, predecessor) pairs known for keys not stored now (read before they left)."""
        self._hints.update(_links(links))
        if len(self._hints) > 2 * self._hint_capacity:
            self._trim_hints()

    def _trim_hints(self) -> None:
        """Keep the newest ``hint_capacity`` links (a lookup whose store never comes costs
        nothing lasting); amortised over the links added since the last trim."""
        hints = self._hints
        drop = len(hints) - self._hint_capacity
        self._hints = dict(islice(hints.items(), drop, None))

    def _relink(self, key: str, pred: str) -> None:
        """Give the stored head ``key`` the predecessor ``pred`` (a recovered key named by a
        call or lookup): ``pred`` stops being a leaf when it is stored."""
        if pred not in self._pred or self._reaches(pred, key):
            return  # not stored here (stays a head), or a cycle
        self._pred[key] = pred
        self._heads.discard(key)
        _add_child(self._kids, pred, key)
        self._leaves.pop(pred, None)
        if pred in self._orphans and key in self._leaves:
            self._leaves.pop(key)
            self._orphans[key] = None

    def _reaches(self, start: str, target: str) -> bool:
        """Whether walking predecessors from ``start`` meets ``target`` (bounded by the chain)."""
        seen = 0
        node: str | None = start
        while node is not None and seen <= len(self._pred):
            if node == target:
                return True
            node = self._pred.get(node)
            seen += 1
        return False

    # ---- stored keys --------------------------------------------------------------------

    def add(self, key: str) -> None:
        """``key`` was stored (or, stored already, used again: then only its recency moves)."""
        self.add_many((key,))

    def add_many(self, keys: Iterable[str]) -> None:
        """``keys`` were stored (those stored already were used again: only their recency
        moves). Every put's share, so it is lean: the structures in locals, a child recorded
        as itself (no list), and only the keys the batch leaves childless enter the leaves
        (a call's chain adds one leaf, not one per key)."""
        keys = _strs(keys)
        pred_of, leaves, hints, kids, orphans = self._pred, self._leaves, self._hints, self._kids, self._orphans
        last = None  # the key stored just before, not placed yet: a leaf unless this key follows it
        for key in keys:
            if key in pred_of:
                if key in leaves:
                    leaves.move_to_end(key)
                continue
            pred = hints.pop(key, None)
            if pred is None or pred == key:
                pred = None
                pred_of[key] = None
                self._heads.add(key)
            else:
                # The predecessor is stored, or being written (its write may finish after this one)
                pred_of[key] = pred
                siblings = kids.get(pred)
                if siblings is None:
                    kids[pred] = key
                    if pred != last:  # the key before in the batch never entered the leaves
                        leaves.pop(pred, None)
                elif isinstance(siblings, str):
                    kids[pred] = [siblings, key]
                else:
                    siblings.append(key)
            if last is not None and (pred != last or orphans):
                self._place(last)
            if orphans and pred in orphans:
                orphans[key] = None
                last = None
            else:
                last = key
        if last is not None:
            self._place(last)

    def _place(self, key: str) -> None:
        """The newly stored ``key``: a leaf when no stored key follows it; else the children
        its leaving made unreachable are reachable again."""
        if key not in self._kids:
            self._leaves[key] = None
        elif self._orphans:
            self._adopt(key)

    def _adopt(self, key: str) -> None:
        """``key`` is stored (again) and has stored children (children that finished writing
        before it, or that stayed while it had left): those its leaving made unreachable are
        reachable again."""
        for child in _children(self._kids, key):
            if self._orphans.pop(child, _MISSING) is not _MISSING and child not in self._kids:
                self._leaves[child] = None

    def add_recovered(self, keys: Iterable[str]) -> None:
        """Keys found on the device (oldest first) that are not known yet: heads, evicted
        before every key learned since (placed at the old end of the order)."""
        fresh = [k for k in _strs(keys) if k not in self._pred]
        for key in reversed(fresh):
            self._pred[key] = None
            self._heads.add(key)
            if key in self._kids:
                self._adopt(key)
            else:
                self._leaves[key] = None
                self._leaves.move_to_end(key, last=False)

    def touch(self, key: str) -> None:
        """``key`` was loaded (or stored again): the most recently used of the leaves."""
        _strs((key,), "key")
        if key in self._leaves:
            self._leaves.move_to_end(key)

    def remove(self, key: str) -> None:
        """``key`` left the tier (evicted, removed, dropped): see :meth:`remove_many`."""
        self.remove_many((key,))

    def remove_many(self, keys: Iterable[str]) -> None:
        """``keys`` left the tier (evicted, removed, dropped): their stored children become
        unreachable (until they are stored again), and their predecessors may become leaves
        (taken before other leaves; not a predecessor that leaves in the same batch)."""
        keys = _strs(keys)
        going = set(keys) if len(keys) > 1 else ()
        pred_of, leaves, kids, orphans = self._pred, self._leaves, self._kids, self._orphans
        for key in keys:
            pred = pred_of.pop(key, _MISSING)
            if pred is _MISSING:
                self._hints.pop(key, None)
                continue
            if leaves.pop(key, _MISSING) is _MISSING and orphans:
                orphans.pop(key, None)
            if key in kids:
                self._orphan_children(key)
            if pred is None:
                self._heads.discard(key)
                continue
            siblings = kids.get(pred)
            if siblings == key:  # its predecessor's only child
                del kids[pred]
                if pred in pred_of and pred not in going and pred not in orphans:
                    leaves[pred] = None
                    leaves.move_to_end(pred, last=False)
            elif siblings is not None and not isinstance(siblings, str):
                self._drop_sibling(pred, key, siblings)

    def _orphan_children(self, key: str) -> None:
        """``key`` left: its stored children become unreachable. They stay listed under it:
        stored again, it makes them reachable."""
        for child in _children(self._kids, key):
            if child in self._pred:
                self._leaves.pop(child, None)
                self._orphans[child] = None

    def _drop_sibling(self, pred: str, key: str, siblings: list[str]) -> None:
        """``key`` left: one of several children of ``pred`` no more."""
        if key in siblings:
            siblings.remove(key)
            if len(siblings) == 1:
                self._kids[pred] = siblings[0]

    # ---- eviction -----------------------------------------------------------------------

    def victims(self, want: int, skip: Callable[[str], bool] | Container[str]) -> list[str]:
        """Up to ``want`` keys to evict, in order: unreachable keys and what hangs below them,
        then leaves oldest first, each followed by the predecessors its eviction turns into
        leaves. ``skip`` names keys that must stay (pinned, protected, refused before): a
        predicate, or a set (cheaper: a membership test per key looked at)."""
        out: list[str] = []
        chosen: set[str] = set()
        if want <= 0:
            return out
        kept = _kept(skip)
        self._pick_unreachable(want, kept, out, chosen)
        if len(out) < want:
            self._pick_leaves(want, kept, out, chosen)
        if len(out) < want:
            # Every leaf is kept (pinned: a lookup holds the chain's tail): rather than fail a
            # put that LRU would serve, take keys below them, newest stored first (deepest
            # first, as chains are stored head to tail). Rare, and a scan of the keys.
            for key in reversed(self._pred):
                if key not in chosen and key not in kept:
                    out.append(key)
                    chosen.add(key)
                    if len(out) >= want:
                        break
        return out

    def _pick_unreachable(self, want: int, kept: Container[str], out: list[str], chosen: set[str]) -> None:
        kids = self._kids
        for key in self._orphans:
            if key not in kept:
                out.append(key)
                chosen.add(key)
                if len(out) >= want:
                    return
        i = 0
        while i < len(out):  # below an unreachable key everything is unreachable too
            for child in _children(kids, out[i]):
                if child in self._pred and child not in chosen and child not in kept:
                    out.append(child)
                    chosen.add(child)
                    if len(out) >= want:
                        return
            i += 1

    def _pick_leaves(self, want: int, kept: Container[str], out: list[str], chosen: set[str]) -> None:
        pred_of, kids, orphans = self._pred, self._kids, self._orphans
        taken: dict[str, int] = {}  # children of a key chosen so far
        for leaf in self._leaves:
            if leaf in chosen or leaf in kept:
                continue
            node = leaf
            while True:  # the leaf, then each predecessor it leaves childless
                out.append(node)
                chosen.add(node)
                if len(out) >= want:
                    return
                pred = pred_of.get(node)
                if pred is None or pred not in pred_of or pred in chosen or (orphans and pred in orphans):
                    break
                siblings = kids.get(pred)
                if not isinstance(siblings, str):  # several children: were they all chosen?
                    taken[pred] = n = taken.get(pred, 0) + 1
                    # Children lists hold stored keys only: a count says whether all were chosen,
                    # so a head with many children (a shared system prompt) costs nothing to check.
                    if n < len(siblings or ()):
                        break
                if pred in kept:
                    break
                node = pred

    def unreachable(self, skip: Callable[[str], bool] | Container[str]) -> list[str]:
        """Every stored key a lookup can no longer reach (its predecessor is gone, or one of
        its ancestors'), none that ``skip`` names (a predicate or a set)."""
        out: list[str] = []
        self._pick_unreachable(len(self._pred), _kept(skip), out, set())
        return out

    def probe_bound(self, encoded: list[str]) -> int:
        """How many of a prompt's keys ``encoded`` a lookup needs to probe: up to the first one
        whose predecessor is known to have left (it and that predecessor miss, so nothing after
        them is served). All of them while no key is known unreachable (one test)."""
        orphans = self._orphans
        if not orphans:
            return len(encoded)
        for i, key in enumerate(encoded):
            if key in orphans:
                return i - 1 if i and encoded[i - 1] == self._pred.get(key) else i
        return len(encoded)

    def reachable_loss(self, keys: Iterable[str]) -> int:
        """How many stored keys a lookup reaches now would be lost if ``keys`` left: those of
        ``keys`` that are reachable, and every stored key below one of them that is not in
        ``keys`` (its leaving makes them unreachable: an extent holding a chain's head costs
        its whole tail). Walks the chains above and below ``keys`` (for extent choice, at
        eviction time)."""
        going = set(keys)
        memo: dict[str, bool] = {}
        frontier = [k for k in going if k in self._pred and self._reachable(k, memo)]
        lost = len(frontier)
        seen = set(going)
        while frontier:
            for child in _children(self._kids, frontier.pop()):
                if child not in seen and child in self._pred:
                    seen.add(child)
                    lost += 1
                    frontier.append(child)
        return lost

    def _reachable(self, key: str, memo: dict[str, bool]) -> bool:
        """Whether every predecessor of the stored ``key`` is stored (a lookup reaches it)."""
        pred_of, orphans = self._pred, self._orphans
        path: list[str] = []
        node: str | None = key
        result = True
        while node is not None:
            known = memo.get(node)
            if known is not None:
                result = known
                break
            if node not in pred_of or node in orphans or len(path) > len(pred_of):
                result = False
                break
            path.append(node)
            node = pred_of[node]
        for n in path:
            memo[n] = result
        return result

    # ---- figures ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._pred)

    def __contains__(self, key: object) -> bool:
        return key in self._pred

    def predecessor(self, key: str) -> str | None:
        return self._pred.get(key)

    def is_unreachable(self, key: str) -> bool:
        return key in self._orphans

    def counts(self) -> dict[str, int]:
        """Keys known, leaves, unreachable keys and pending links (for report_status)."""
        return {"prefix_keys": len(self._pred), "prefix_leaves": len(self._leaves),
                "prefix_unreachable": len(self._orphans), "prefix_pending_links": len(self._hints)}


class _Predicate:
    """A predicate seen as a set (``key in kept``), so the eviction loops test one way."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[str], bool]) -> None:
        self._fn = fn

    def __contains__(self, key: object) -> bool:
        return bool(self._fn(key))  # type: ignore[arg-type]


def _kept(skip: Callable[[str], bool] | Container[str]) -> Container[str]:
    return skip if not callable(skip) else _Predicate(skip)


def _children(kids: dict[str, str | list[str]], key: str) -> list[str] | tuple[str, ...]:
    """The stored children ``kids`` lists for ``key`` (see ``PrefixOrder._kids``)."""
    got = kids.get(key)
    if got is None:
        return ()
    return (got,) if isinstance(got, str) else got


def _add_child(kids: dict[str, str | list[str]], pred: str, key: str) -> None:
    got = kids.get(pred)
    if got is None:
        kids[pred] = key
    elif isinstance(got, str):
        kids[pred] = [got, key]
    else:
        got.append(key)
