"""A page-mapped flash translation layer with FDP reclaim units, for write-amplification studies.

The model: the physical space is ``n_rus`` reclaim units (RUs) of ``ru_pages`` pages each, split
evenly over ``n_groups`` reclaim groups (RGs). The host sees ``logical_pages`` pages, fewer than
the physical ones by the over-provisioning ``op`` = (physical - logical) / logical. A page is the
mapping unit (its size in bytes only matters when a byte stream is turned into pages).

Placement: every host write names a placement handle (None: the device's default handle). Each
handle has one open RU per reclaim group that its host writes fill in order; a write command goes
to one reclaim group, the next one round-robin. Garbage collection (GC) picks a victim RU in the
group that needs space, copies its valid pages to a GC destination and erases it:

* ``isolation="initial"`` (FDP's initially isolated handles, and a conventional SSD's separate GC
  stream): one GC destination per group, shared by every handle, so data of different handles
  mixes once it has been moved;
* ``isolation="persistent"``: one GC destination per handle and group, so a handle's data never
  shares an RU with another handle's.

Victim choice: ``greedy`` (fewest valid pages), ``fifo`` (the RU programmed longest ago: the
cleaning the closed-form model of :mod:`.analytic` describes exactly, for validation) or
``cost_benefit`` (largest
(1 - u) * age / (1 + u), u the RU's valid fraction and age the host pages written since it was
last programmed: the cleaning policy of Rosenblum and Ousterhout's log-structured file system).

GC runs when a host write needs a fresh RU and its group has no more free RUs than the reserve
(one per GC destination that may open, plus one). Deallocations (TRIM / NVMe Deallocate)
invalidate pages without writing. Write amplification (WAF) = media pages programmed (host + GC
copies) / host pages written, over a window (:meth:`FlashSim.mark` starts one).

Speed: pure Python, measured at 5-25 microseconds per host page (more at low spare factors,
where GC copies more) on one core, i.e. a drive write of a 16k-page drive in 0.1-0.4 s; a few
drive writes of the small geometries used here take seconds, so the model is not in C.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

GREEDY = "greedy"
COST_BENEFIT = "cost_benefit"
FIFO = "fifo"
POLICIES = (GREEDY, COST_BENEFIT, FIFO)
INITIAL = "initial"
PERSISTENT = "persistent"
ISOLATIONS = (INITIAL, PERSISTENT)
RESERVE_RUS = 2  # erased RUs per group GC keeps in reserve with one GC stream (see FlashSim)


@dataclass(frozen=True)
class Geometry:
    """A simulated drive. ``op`` is the spare factor (physical - logical) / logical. The default
    is a drive with reclaim units of 1 GiB (1024 pages of 1 MiB), 256 of them, 10% spare.

    Garbage collection keeps :data:`RESERVE_RUS` reclaim units per group erased and empty (the
    reserve it collects into; see :class:`FlashSim`), so they never hold data. With
    ``count_reserve`` (the default) they are counted outside the spare: the logical space is
    (``n_rus`` - the reserve) RUs over 1 + ``op``, and the RUs that hold data have exactly the
    stated spare factor, as the closed-form model assumes. Without it (the simulator before this
    accounting) the reserve came out of the stated spare, and the drive had less than ``op``: at
    1 GiB RUs and 10% spare, 256 RUs, 2 of the 23 spare RUs, WAF about 6% above the model's."""

    ru_pages: int = 1024
    n_rus: int = 256
    n_groups: int = 1
    op: float = 0.1
    max_handles: int = 8
    page_bytes: int = 1 << 20
    count_reserve: bool = True

    def __post_init__(self) -> None:
        for name in ("ru_pages", "n_rus", "n_groups", "max_handles", "page_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"geometry {name} must be a positive integer, got {value!r}")
        if not (isinstance(self.op, (int, float)) and 0 < self.op <= 10):
            raise ValueError(f"geometry op must be in (0, 10] (spare pages per logical page), got {self.op!r}")
        if self.n_rus % self.n_groups:
            raise ValueError(f"geometry n_rus={self.n_rus} must be a multiple of n_groups={self.n_groups}")
        if self.rus_per_group < 4:
            raise ValueError(f"geometry n_rus={self.n_rus} over n_groups={self.n_groups} leaves "
                             f"{self.rus_per_group} RUs per group; need at least 4")

    @property
    def physical_pages(self) -> int:
        return self.n_rus * self.ru_pages

    @property
    def reserve_rus(self) -> int:
        """RUs the garbage collector keeps empty (one GC stream: initially isolated handles)."""
        return self.n_groups * RESERVE_RUS

    @property
    def logical_pages(self) -> int:
        data = self.physical_pages - (self.reserve_rus * self.ru_pages if self.count_reserve else 0)
        return int(data / (1.0 + self.op))

    @property
    def rus_per_group(self) -> int:
        return self.n_rus // self.n_groups

    @property
    def logical_bytes(self) -> int:
        return self.logical_pages * self.page_bytes

    def to_dict(self) -> dict:
        return {"ru_pages": self.ru_pages, "n_rus": self.n_rus, "n_groups": self.n_groups, "op": self.op,
                "max_handles": self.max_handles, "page_bytes": self.page_bytes,
                "count_reserve": self.count_reserve, "reserve_rus": self.reserve_rus,
                "logical_pages": self.logical_pages, "physical_pages": self.physical_pages}


@dataclass
class Counters:
    host_pages: int = 0  # pages the host wrote
    gc_pages: int = 0  # pages GC copied
    erases: int = 0  # RUs erased
    dealloc_pages: int = 0  # mapped pages a deallocation invalidated
    host_writes: int = 0  # write commands
    deallocs: int = 0  # deallocate commands

    @property
    def media_pages(self) -> int:
        return self.host_pages + self.gc_pages

    def waf(self) -> float:
        return self.media_pages / self.host_pages if self.host_pages else float("nan")

    def minus(self, other: "Counters") -> "Counters":
        return Counters(**{k: getattr(self, k) - getattr(other, k) for k in self.__dataclass_fields__})

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["media_pages"] = self.media_pages
        d["waf"] = self.waf()
        return d


class FlashSim:
    """The FTL model (see the module docstring). ``write(lpn, n, pid)`` and ``deallocate(lpn, n)``
    take logical page ranges; ``pid`` is a placement identifier (any hashable; None = the
    default handle)."""

    def __init__(self, geometry: Geometry, *, policy: str = GREEDY, isolation: str = INITIAL) -> None:
        if policy not in POLICIES:
            raise ValueError(f"gc policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        g = geometry
        self.geometry = g
        self.policy = policy
        self.isolation = isolation
        # Spare RUs must cover every open RU (host and GC destinations) plus the GC reserve, or GC
        # could find no victim with an invalid page.
        # (Persistent isolation keeps one more per extra GC stream, which Geometry.logical_pages
        # does not count: such a drive has somewhat less than the stated spare.)
        gc_streams = g.max_handles if isolation == PERSISTENT else 1
        self.reserve = gc_streams + RESERVE_RUS - 1
        needed = g.n_groups * (g.max_handles + gc_streams + self.reserve + 1) * g.ru_pages
        spare = g.physical_pages - g.logical_pages
        if spare < needed:
            raise ValueError(f"geometry op={g.op} leaves {spare} spare pages; {needed} are needed for the open "
                             f"and reserved RUs of max_handles={g.max_handles} handles in n_groups={g.n_groups} "
                             f"groups with ru_pages={g.ru_pages} (raise op or n_rus, or lower ru_pages)")
        self._handles: dict = {}
        self.counters = Counters()
        self._mark = Counters()
        self._rr = 0
        self._ftl = _Ftl(g, policy, isolation, self.reserve)

    # ---- the host interface -------------------------------------------------------------

    def handle_of(self, pid) -> int:
        h = self._handles.get(pid)
        if h is None:
            if len(self._handles) >= self.geometry.max_handles:
                raise ValueError(f"placement id {pid!r} would be handle {len(self._handles) + 1} of a drive with "
                                 f"max_handles={self.geometry.max_handles} (ids seen: {list(self._handles)})")
            h = self._handles[pid] = len(self._handles)
        return h

    def _check_range(self, lpn: int, n: int, what: str) -> None:
        if n < 1 or lpn < 0 or lpn + n > self.geometry.logical_pages:
            raise ValueError(f"{what} of pages [{lpn}, {lpn + n}) is outside the drive's "
                             f"{self.geometry.logical_pages} logical pages")

    def write(self, lpn: int, n: int, pid=None) -> None:
        self._check_range(lpn, n, "write")
        h = self.handle_of(pid)
        group = self._rr
        self._rr = (self._rr + 1) % self.geometry.n_groups
        self._ftl.write(lpn, n, h, group)
        self.counters.host_pages += n
        self.counters.host_writes += 1
        self._sync()

    def deallocate(self, lpn: int, n: int) -> None:
        self._check_range(lpn, n, "deallocate")
        self._ftl.deallocate(lpn, n)
        self.counters.deallocs += 1
        self._sync()

    def _sync(self) -> None:
        gc, erases, dealloc = self._ftl.stats()
        self.counters.gc_pages = gc
        self.counters.erases = erases
        self.counters.dealloc_pages = dealloc

    # ---- windows ------------------------------------------------------------------------

    def mark(self) -> None:
        """Start a measurement window: :meth:`window` counts from here."""
        self._mark = self.counters.minus(Counters())

    def window(self) -> Counters:
        return self.counters.minus(self._mark)

    def valid_pages(self) -> int:
        return self._ftl.valid_total()


class _Ftl:
    """The per-page state and rules."""

    def __init__(self, g: Geometry, policy: str, isolation: str, reserve: int) -> None:
        self.rp = g.ru_pages
        self.ng = g.n_groups
        self.greedy = policy == GREEDY
        self.fifo = policy == FIFO
        self.persistent = isolation == PERSISTENT
        self.reserve = reserve
        self.l2p = [-1] * g.logical_pages
        self.p2l = [-1] * g.physical_pages
        self.valid = [0] * g.n_rus
        self.stamp = [0] * g.n_rus  # host-page clock when the RU was last programmed
        # Free RUs per group: erased ones join at the left, allocation takes from the right.
        self.free = [deque(range((grp + 1) * g.rus_per_group - 1, grp * g.rus_per_group - 1, -1))
                     for grp in range(g.n_groups)]
        self.ru_handle = [0] * g.n_rus  # whose data an RU holds (persistent isolation)
        self.closed: list[set] = [set() for _ in range(g.n_groups)]
        self.open: dict = {}  # (kind, handle, group) -> [ru, write pointer]
        self.now = 0
        self.gc = 0
        self.erases = 0
        self.dealloc = 0

    def stats(self) -> tuple[int, int, int]:
        return self.gc, self.erases, self.dealloc

    def valid_total(self) -> int:
        return sum(self.valid)

    def _invalidate(self, lpn: int) -> bool:
        ppn = self.l2p[lpn]
        if ppn < 0:
            return False
        self.p2l[ppn] = -1
        self.valid[ppn // self.rp] -= 1
        self.l2p[lpn] = -1
        return True

    def _slot(self, key: tuple, group: int, host: bool) -> list:
        cur = self.open.get(key)
        if cur is None or cur[1] == self.rp:
            if cur is not None:
                self.closed[group].add(cur[0])
                self.open[key] = None
            if host:
                while len(self.free[group]) <= self.reserve:
                    self._collect(group)
            ru = self.free[group].pop()
            cur = self.open[key] = [ru, 0]
            self.ru_handle[ru] = key[1]
        return cur

    def write(self, lpn: int, n: int, h: int, group: int) -> None:
        key = (0, h, group)
        l2p, p2l, valid, stamp, rp = self.l2p, self.p2l, self.valid, self.stamp, self.rp
        for p in range(lpn, lpn + n):
            ppn = l2p[p]
            if ppn >= 0:
                p2l[ppn] = -1
                valid[ppn // rp] -= 1
            self.now += 1
            cur = self.open.get(key)
            if cur is None or cur[1] == rp:
                cur = self._slot(key, group, True)
            ru = cur[0]
            ppn = ru * rp + cur[1]
            cur[1] += 1
            p2l[ppn] = p
            l2p[p] = ppn
            valid[ru] += 1
            stamp[ru] = self.now

    def deallocate(self, lpn: int, n: int) -> None:
        for p in range(lpn, lpn + n):
            if self._invalidate(p):
                self.dealloc += 1

    def _victim(self, group: int) -> int:
        cands = self.closed[group]
        if not cands:
            raise RuntimeError(f"garbage collection in reclaim group {group} found no closed reclaim unit")
        valid = self.valid
        if self.greedy:
            return min(cands, key=valid.__getitem__)
        if self.fifo:
            return min(cands, key=self.stamp.__getitem__)
        rp, now, stamp = self.rp, self.now, self.stamp
        return max(cands, key=lambda r: (rp - valid[r]) * (now - stamp[r] + 1) / (rp + valid[r]))

    def _collect(self, group: int) -> None:
        ru = self._victim(group)
        rp = self.rp
        if self.valid[ru] == rp:
            raise RuntimeError(f"garbage collection in reclaim group {group}: every reclaim unit is fully valid "
                               "(the logical space does not fit the physical space left for data)")
        self.closed[group].discard(ru)
        base = ru * rp
        for off in range(rp):
            lpn = self.p2l[base + off]
            if lpn < 0:
                continue
            # The handle whose data this is: under persistent isolation an RU holds one handle's.
            h = self.ru_handle[ru] if self.persistent else 0
            self.p2l[base + off] = -1
            self.valid[ru] -= 1
            self._program_gc(lpn, h, group)
            self.gc += 1
        self.erases += 1
        self.free[group].appendleft(ru)

    def _program_gc(self, lpn: int, h: int, group: int) -> None:
        key = (1, h, group)
        cur = self.open.get(key)
        if cur is None or cur[1] == self.rp:
            if cur is not None:
                self.closed[group].add(cur[0])
                self.open[key] = None
            if not self.free[group]:
                raise RuntimeError(f"garbage collection in reclaim group {group} ran out of free reclaim units")
            ru = self.free[group].pop()
            cur = self.open[key] = [ru, 0]
            self.ru_handle[ru] = h
        ru = cur[0]
        ppn = ru * self.rp + cur[1]
        cur[1] += 1
        self.p2l[ppn] = lpn
        self.l2p[lpn] = ppn
        self.valid[ru] += 1
        self.stamp[ru] = self.now
