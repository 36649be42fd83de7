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

The order is not metadata: it lives in memory only, a restart (or kill -9) loses it and never a
key or a byte.

Not thread-safe: the plugin calls it under its ``_lru_lock``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

__all__ = ["PrefixOrder", "HINT_CAPACITY"]

# Links learned for keys not stored yet (being written, or a lookup's first miss): kept
# first-in-first-out up to this many, so a lookup whose store never comes costs nothing lasting.
HINT_CAPACITY = 1 << 16
_MISSING = object()


class PrefixOrder:
    """Chains of stored keys and their eviction order (see the module docstring)."""

    def __init__(self, hint_capacity: int = HINT_CAPACITY) -> None:
        self._pred: dict[str, str | None] = {}  # every stored key -> predecessor (None: head)
        self._kids: dict[str, list[str]] = {}  # key (stored or not) -> its stored children
        self._leaves: OrderedDict[str, None] = OrderedDict()  # reachable, no stored child; LRU first
        self._orphans: OrderedDict[str, None] = OrderedDict()  # predecessor gone; oldest first
        self._hints: OrderedDict[str, str] = OrderedDict()  # not stored yet -> predecessor
        self._hint_capacity = max(1, int(hint_capacity))

    # ---- learning -----------------------------------------------------------------------

    def note_call(self, encoded: list[str]) -> None:
        """The keys of one store call, in prompt order: each one's predecessor is the key before
        it (the first's, a link a lookup left, if any)."""
        pred_of, hints = self._pred, self._hints
        prev: str | None = None
        for key in encoded:
            if prev is not None and key != prev:
                if key not in pred_of:
                    hints[key] = prev
                elif pred_of[key] is None:
                    self._relink(key, prev)
            prev = key
        while len(hints) > self._hint_capacity:
            hints.popitem(last=False)

    def note_lookup(self, encoded: list[str], hits: int) -> None:
        """A lookup of ``encoded`` (a prompt's keys in order) that found the first ``hits``:
        the first missing key follows the last hit; hits without a known predecessor (keys
        recovered after a restart) are linked to the key before them."""
        pred_of = self._pred
        for i in range(1, min(hits, len(encoded))):
            key = encoded[i]
            if pred_of.get(key, "") is None and encoded[i - 1] != key:
                self._relink(key, encoded[i - 1])
        if 0 < hits < len(encoded) and encoded[hits] not in pred_of:
            hints = self._hints
            hints[encoded[hits]] = encoded[hits - 1]
            if len(hints) > self._hint_capacity:
                hints.popitem(last=False)

    def _relink(self, key: str, pred: str) -> None:
        """Give the stored head ``key`` the predecessor ``pred`` (a recovered key named by a
        call or lookup): ``pred`` stops being a leaf when it is stored."""
        if pred not in self._pred or self._reaches(pred, key):
            return  # not stored here (stays a head), or a cycle
        self._pred[key] = pred
        self._kids.setdefault(pred, []).append(key)
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
        pred_of, leaves = self._pred, self._leaves
        if key in pred_of:
            if key in leaves:
                leaves.move_to_end(key)
            return
        pred = self._hints.pop(key, None)
        pred_of[key] = pred
        if pred is not None:
            # The predecessor is stored, or being written (its write may finish after this one)
            siblings = self._kids.get(pred)
            if siblings is None:
                self._kids[pred] = [key]
                leaves.pop(pred, None)
            else:
                siblings.append(key)
            if self._orphans and pred in self._orphans:
                self._orphans[key] = None
                return
        if not self._adopt(key):
            leaves[key] = None

    def _adopt(self, key: str) -> bool:
        """``key`` is stored (again): whether it has stored children (children that finished
        writing before it, or that stayed while it had left); those its leaving made
        unreachable are reachable again."""
        children = self._kids.get(key)
        if children is None:
            return False
        for child in children:
            if self._orphans.pop(child, _MISSING) is not _MISSING and child not in self._kids:
                self._leaves[child] = None
        return True

    def add_recovered(self, keys: Iterable[str]) -> None:
        """Keys found on the device (oldest first) that are not known yet: heads, evicted
        before every key learned since (placed at the old end of the order)."""
        fresh = [k for k in keys if k not in self._pred]
        for key in reversed(fresh):
            self._pred[key] = None
            if not self._adopt(key):
                self._leaves[key] = None
                self._leaves.move_to_end(key, last=False)

    def touch(self, key: str) -> None:
        """``key`` was loaded (or stored again): the most recently used of the leaves."""
        if key in self._leaves:
            self._leaves.move_to_end(key)

    def remove(self, key: str) -> None:
        """``key`` left the tier (evicted, removed, dropped): its stored children become
        unreachable (until it is stored again), and its predecessor may become a leaf (taken
        before other leaves)."""
        pred_of = self._pred
        if key not in pred_of:
            self._hints.pop(key, None)
            return
        pred = pred_of.pop(key)
        if self._leaves.pop(key, _MISSING) is _MISSING and self._orphans:
            self._orphans.pop(key, None)
        kids = self._kids
        children = kids.get(key)
        if children is not None:
            # The children stay listed under the key: stored again, it makes them reachable.
            for child in children:
                self._leaves.pop(child, None)
                self._orphans[child] = None
        if pred is None:
            return
        siblings = kids.get(pred)
        if siblings is not None:
            if len(siblings) == 1:
                if siblings[0] != key:
                    return
                del kids[pred]
                if pred in pred_of and pred not in self._orphans:
                    self._leaves[pred] = None
                    self._leaves.move_to_end(pred, last=False)
            elif key in siblings:
                siblings.remove(key)

    # ---- eviction -----------------------------------------------------------------------

    def victims(self, want: int, skip: Callable[[str], bool]) -> list[str]:
        """Up to ``want`` keys to evict, in order: unreachable keys and what hangs below them,
        then leaves oldest first, each followed by the predecessors its eviction turns into
        leaves. ``skip`` names keys that must stay (pinned, protected, refused before)."""
        out: list[str] = []
        chosen: set[str] = set()
        if want <= 0:
            return out
        self._pick_unreachable(want, skip, out, chosen)
        if len(out) < want:
            self._pick_leaves(want, skip, out, chosen)
        if len(out) < want:
            # Every leaf is kept (pinned: a lookup holds the chain's tail): rather than fail a
            # put that LRU would serve, take keys below them, newest stored first (deepest
            # first, as chains are stored head to tail). Rare, and a scan of the keys.
            for key in reversed(self._pred):
                if key not in chosen and not skip(key):
                    out.append(key)
                    chosen.add(key)
                    if len(out) >= want:
                        break
        return out

    def _pick_unreachable(self, want: int, skip: Callable[[str], bool], out: list[str], chosen: set[str]) -> None:
        kids = self._kids
        for key in self._orphans:
            if not skip(key):
                out.append(key)
                chosen.add(key)
                if len(out) >= want:
                    return
        i = 0
        while i < len(out):  # below an unreachable key everything is unreachable too
            for child in kids.get(out[i], ()):
                if child in self._pred and child not in chosen and not skip(child):
                    out.append(child)
                    chosen.add(child)
                    if len(out) >= want:
                        return
            i += 1

    def _pick_leaves(self, want: int, skip: Callable[[str], bool], out: list[str], chosen: set[str]) -> None:
        pred_of, kids = self._pred, self._kids
        taken: dict[str, int] = {}  # children of a key chosen so far
        for leaf in self._leaves:
            if leaf in chosen or skip(leaf):
                continue
            node: str | None = leaf
            while node is not None:  # the leaf, then each predecessor it leaves childless
                out.append(node)
                chosen.add(node)
                if len(out) >= want:
                    return
                pred = pred_of.get(node)
                if pred is None or pred not in pred_of or pred in chosen or pred in self._orphans:
                    break
                taken[pred] = n = taken.get(pred, 0) + 1
                # Children lists hold stored keys only: a count says whether all were chosen,
                # so a head with many children (a shared system prompt) costs nothing to check.
                if n < len(kids.get(pred, ())):
                    break
                if skip(pred):
                    break
                node = pred

    def unreachable(self, skip: Callable[[str], bool]) -> list[str]:
        """Every stored key a lookup can no longer reach (its predecessor is gone, or one of
        its ancestors'), none that ``skip`` names."""
        out: list[str] = []
        self._pick_unreachable(len(self._pred), skip, out, set())
        return out

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
