"""From trace events to the device's write stream: the cache in front of the drive.

:class:`CacheModel` does what our storage plugin and core do with a trace, without a device:
lookups hit or miss, a store hands over the chunks from the first one not stored, write
admission (:mod:`lmcache_rawblock.admission`) may refuse a chunk, a full cache evicts its
least-recently-used entries (the plugin's ``eviction_policy=lru``; with ``evict_ahead`` the
plugin's evict-ahead: at ``trigger`` of the slots in use, down to ``trigger - ratio``), deletes
free slots. A freed slot is *held* until a checkpoint records it free (``log`` metadata: the next
checkpoint; ``v1``: the second), as in the core; a put that finds no reusable slot writes that
checkpoint itself, and evicts only when nothing is held.

Slot reuse (``reuse``):

* ``lifo``: the most recently freed reusable slot first (with FDP, first one last written under
  the same placement identifier: ``fdp_slot_reuse_policy=pid_affinity``), as
  ``csrc/core/rb_slots.c`` does today;
* ``fifo``: the oldest freed first;
* ``ru_groups``: the slots are cut into groups of ``group_slots`` consecutive slots (one reclaim
  unit's worth); puts fill one open group (per placement identifier with FDP) slot by slot, and
  eviction frees whole groups: the group whose most recent access (put or hit) is the oldest
  loses every entry (region eviction, as CacheLib's block cache does). A group is reused once
  all its slots are reusable.

Deallocation (``dealloc``): when held slots become reusable, at the checkpoint, their ranges are
deallocated in one batch (adjacent slots coalesced, ``DSM_RANGES`` ranges per command), before
any put can take them: the core's ``deallocate_freed`` with the plugin's evict path (evict,
write the checkpoint, retry the put). With ``dealloc_skip_on_demand`` the slots a put itself
makes reusable are taken undeallocated (``dealloc_skipped``), as when the core writes the
checkpoint for room inside a put: the put's own write retires the old bytes, except a shorter
chunk's tail.

Each write carries the placement identifier of the mode:

* ``no_fdp``: none;
* ``mixed``: FDP on, every write (data and checkpoint) on the first identifier;
* ``ckpt_apart``: FDP on, KV data on the first identifier, checkpoints on one of their own;
* ``separated``: KV data routed by ``strategy`` through :class:`lmcache_rawblock.fdp.PlacementRouter`
  (tp_worker, prompt, phase, cache_salt_prefix, cache_salt_rank), the checkpoint on an identifier
  of its own.

The device sees, per put, one write of the slot's header and payload, and per checkpoint (every
``checkpoint_every`` puts, and each one that makes freed slots reusable) the metadata write:
``v1``, the whole index (``checkpoint_entry_bytes`` per entry) into the older of two copies at
the start of the device; ``log``, the changes since the last one (``log_record_bytes`` per put
or free, at least one 4 KiB block) appended to a circular log over the metadata region, handed
to the device in whole ``meta_io_bytes`` pieces as the log fills them (the simulator's page: a
drive maps 4 KiB blocks, so a page of log blocks is programmed once).

Write stream format (``--record``; JSON lines): ``{"op": "write", "offset": B, "length": B,
"pid": P}`` (``pid`` null without a directive) and ``{"op": "deallocate", "offset": B,
"length": B}``, byte offsets into the namespace.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import IO, Iterable, Optional

from lmcache_rawblock import fdp
from lmcache_rawblock.admission import Admission

NO_FDP = "no_fdp"
MIXED = "mixed"
SEPARATED = "separated"
CKPT_APART = "ckpt_apart"
MODES = (NO_FDP, MIXED, SEPARATED, CKPT_APART)
LIFO = "lifo"
FIFO = "fifo"
RU_GROUPS = "ru_groups"
REUSE_ORDERS = (LIFO, FIFO, RU_GROUPS)
META_V1 = "v1"
META_LOG = "log"
META_FORMATS = (META_LOG, META_V1)
DSM_RANGES = 256  # ranges per NVMe Dataset Management command
STRATEGIES = fdp.STRATEGIES + (fdp.CACHE_SALT_PREFIX, fdp.CACHE_SALT_RANK)
MODEL = "sim-model"


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0
    puts_offered: int = 0  # chunks a store handed to the tier (after the already-stored prefix)
    puts_refused: int = 0  # refused by admission
    puts_written: int = 0
    evictions: int = 0
    evicted_ahead: int = 0  # of which by evict-ahead (before a put needed the room)
    deletes: int = 0
    checkpoints: int = 0
    reclaims: int = 0  # of which written to make freed slots reusable
    host_bytes: int = 0  # bytes the cache asked the device to write
    kv_bytes: int = 0  # of which KV payload and headers
    meta_bytes: int = 0  # of which checkpoints
    dealloc_slots: int = 0  # freed slots deallocated
    dealloc_ranges: int = 0  # contiguous ranges they made
    dealloc_commands: int = 0  # deallocate commands (up to 256 ranges each, as NVMe DSM)
    dealloc_bytes: int = 0
    dealloc_skipped: int = 0  # reusable slots a put took before their deallocation

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["hit_ratio"] = self.hits / self.lookups if self.lookups else float("nan")
        return d


class Recorder:
    """A sink that writes the write stream as JSON lines (see the module docstring)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.n = 0

    def write_bytes(self, offset: int, length: int, pid: Optional[int]) -> None:
        self.out.write(json.dumps({"op": "write", "offset": offset, "length": length, "pid": pid}) + "\n")
        self.n += 1

    def dealloc_bytes(self, offset: int, length: int) -> None:
        self.out.write(json.dumps({"op": "deallocate", "offset": offset, "length": length}) + "\n")
        self.n += 1


class SimSink:
    """A sink that feeds :class:`lmcache_rawblock_bench.waf.ftl.FlashSim` (bytes to pages: a write
    covers every page it touches, a deallocation only the pages it covers whole)."""

    def __init__(self, sim) -> None:
        self.sim = sim
        self.pb = sim.geometry.page_bytes

    def write_bytes(self, offset: int, length: int, pid: Optional[int]) -> None:
        first = offset // self.pb
        last = -(-(offset + length) // self.pb)
        self.sim.write(first, last - first, pid)

    def dealloc_bytes(self, offset: int, length: int) -> None:
        first = -(-offset // self.pb)
        last = (offset + length) // self.pb
        if last > first:
            self.sim.deallocate(first, last - first)


def stream_span(lines: Iterable[str], *, source: str = "stream") -> int:
    """The end of the highest byte range a recorded write stream touches (its span)."""
    end = 0
    for no, line in enumerate(lines, 1):
        if line.strip():
            try:
                r = json.loads(line)
                end = max(end, int(r["offset"]) + int(r["length"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{source}:{no}: expected {{op, offset, length}}: {exc}") from None
    return end


def replay_stream(lines: Iterable[str], sink, *, source: str = "stream", mark_after: Optional[int] = None,
                  on_mark=None) -> int:
    """Feed a recorded write stream to ``sink``; errors name the line and the field. With
    ``mark_after``, ``on_mark()`` is called once, before the first record after that many bytes
    have been written (the start of a measurement window)."""
    n = 0
    written = 0
    for no, line in enumerate(lines, 1):
        if mark_after is not None and written >= mark_after:
            on_mark()
            mark_after = None
        line = line.strip()
        if not line:
            continue
        try:
            r = json.loads(line)
            op, off, length = r["op"], r["offset"], r["length"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{source}:{no}: expected {{op, offset, length}}: {exc}") from None
        if not (isinstance(off, int) and isinstance(length, int) and off >= 0 and length > 0):
            raise ValueError(f"{source}:{no}: offset and length must be integers >= 0 and > 0, "
                             f"got offset={off!r} length={length!r}")
        if op == "write":
            sink.write_bytes(off, length, r.get("pid"))
            written += length
        elif op == "deallocate":
            sink.dealloc_bytes(off, length)
        else:
            raise ValueError(f"{source}:{no}: op must be write or deallocate, got {op!r}")
        n += 1
    return n


class _Slots:
    """Free slots in the order of ``reuse`` (see the module docstring), with per-identifier
    pools for ``lifo`` / ``fifo`` with FDP (``affinity``), as csrc/core/rb_slots.c allocates them."""

    def __init__(self, n: int, affinity: bool, order: str = LIFO, group: int = 0) -> None:
        if order not in REUSE_ORDERS:
            raise ValueError(f"reuse must be one of {', '.join(REUSE_ORDERS)}, got {order!r}")
        self.n = n
        self.next = 0
        self.free: OrderedDict = OrderedDict()  # slot -> None, most recently freed last
        self.pools: dict = {}  # pid -> OrderedDict of free slots last written with it
        self.pid: dict = {}
        self.affinity = affinity
        self.order = order
        self.last = order == LIFO
        if order == RU_GROUPS:
            if not isinstance(group, int) or group < 1:
                raise ValueError(f"reuse ru_groups needs group_slots >= 1, got {group!r}")
            self.g = min(group, n)
            self.n_groups = -(-n // self.g)
            self.gfree: deque = deque(range(self.n_groups))  # groups whose every slot is reusable
            self.gcount = [self.gsize(i) for i in range(self.n_groups)]  # reusable slots per group
            self.gfree_slots = n
            self.open: dict = {}  # pid (None without affinity) -> [group, next slot]
            self.is_open = [False] * self.n_groups

    def gsize(self, grp: int) -> int:
        return min(self.g, self.n - grp * self.g)

    def available(self) -> int:
        """Slots a put could take now."""
        if self.order != RU_GROUPS:
            return len(self.free) + self.n - self.next
        left = self.gfree_slots
        for c in self.open.values():
            if c is not None:
                left += min((c[0] + 1) * self.g, self.n) - c[1]
        return left

    def alloc(self, pid) -> Optional[int]:
        if self.order == RU_GROUPS:
            return self._alloc_grouped(pid)
        if self.affinity and pid:
            pool = self.pools.get(pid)
            if pool:
                x = pool.popitem(last=self.last)[0]
                del self.free[x]
                return x
        if self.free:
            x = self.free.popitem(last=self.last)[0]
            if self.affinity:
                old = self.pid.get(x)
                if old:
                    self.pools[old].pop(x, None)
                self.pid[x] = pid
            return x
        if self.next < self.n:
            x = self.next
            self.next += 1
            self.pid[x] = pid
            return x
        return None

    def _alloc_grouped(self, pid) -> Optional[int]:
        key = pid if self.affinity else None
        cur = self.open.get(key)
        if cur is not None and cur[1] >= min((cur[0] + 1) * self.g, self.n):
            self._close(cur[0])
            cur = self.open[key] = None
        if cur is None:
            if not self.gfree:
                return None
            grp = self.gfree.popleft()
            self.gfree_slots -= self.gsize(grp)
            self.is_open[grp] = True
            cur = self.open[key] = [grp, grp * self.g]
        x = cur[1]
        cur[1] += 1
        self.gcount[cur[0]] -= 1
        return x

    def _close(self, grp: int) -> None:
        self.is_open[grp] = False
        if self.gcount[grp] == self.gsize(grp):
            self.gfree.append(grp)
            self.gfree_slots += self.gsize(grp)

    def group_of(self, x: int) -> int:
        return x // self.g

    def closed_groups(self):
        """Groups neither open nor wholly reusable (the candidates for region eviction)."""
        return (grp for grp in range(self.n_groups) if not self.is_open[grp] and self.gcount[grp] < self.gsize(grp))

    def release(self, x: int) -> None:
        if self.order == RU_GROUPS:
            grp = x // self.g
            self.gcount[grp] += 1
            if self.gcount[grp] == self.gsize(grp) and not self.is_open[grp]:
                self.gfree.append(grp)
                self.gfree_slots += self.gsize(grp)
            return
        self.free[x] = None
        if self.affinity:
            p = self.pid.get(x)
            if p:
                self.pools.setdefault(p, OrderedDict())[x] = None


@dataclass
class CacheConfig:
    capacity_bytes: int  # bytes of the namespace the cache uses (checkpoint region + slots)
    slot_bytes: int
    header_bytes: int = 4096
    meta_total_bytes: int = 128 << 20
    checkpoint_every: int = 2000  # puts between checkpoints (0: none but those that free slots)
    checkpoint_entry_bytes: int = 160  # v1: bytes per index entry
    log_record_bytes: int = 64  # log: bytes per PUT / FREE record
    meta_format: str = META_LOG
    meta_io_bytes: int = 4096  # log: the device sees the log in pieces of this size
    ids: tuple = (1, 2, 3, 4)
    checkpoint_pid: int = 5
    dealloc: bool = True
    tp: int = 2
    reuse: str = LIFO
    group_slots: int = 0  # reuse ru_groups: slots per group
    evict_ahead: Optional[tuple] = None  # (trigger, ratio) of the plugin's evict-ahead, None: on demand
    dealloc_skip_on_demand: bool = False  # slots a put frees for itself are taken undeallocated

    def __post_init__(self) -> None:
        if self.slot_bytes <= self.header_bytes:
            raise ValueError(f"slot_bytes={self.slot_bytes} must exceed header_bytes={self.header_bytes}")
        if self.n_slots < 2:
            raise ValueError(f"capacity_bytes={self.capacity_bytes} holds {self.n_slots} slots of "
                             f"slot_bytes={self.slot_bytes} after meta_total_bytes={self.meta_total_bytes}; need 2")
        if self.meta_format not in META_FORMATS:
            raise ValueError(f"meta_format must be one of {', '.join(META_FORMATS)}, got {self.meta_format!r}")
        if self.reuse not in REUSE_ORDERS:
            raise ValueError(f"reuse must be one of {', '.join(REUSE_ORDERS)}, got {self.reuse!r}")
        if self.reuse == RU_GROUPS and self.group_slots < 1:
            raise ValueError(f"reuse ru_groups needs group_slots >= 1 (slots per reclaim unit), "
                             f"got {self.group_slots!r}")
        if self.evict_ahead is not None:
            trig, ratio = self.evict_ahead
            if not (0 < trig <= 1 and 0 < ratio < trig):
                raise ValueError(f"evict_ahead must be (trigger, ratio) with 0 < ratio < trigger <= 1, "
                                 f"got {self.evict_ahead!r}")
        if self.meta_io_bytes < 1 or self.meta_total_bytes % self.meta_io_bytes:
            raise ValueError(f"meta_io_bytes={self.meta_io_bytes} must divide meta_total_bytes={self.meta_total_bytes}")

    @property
    def n_slots(self) -> int:
        return max(0, (self.capacity_bytes - self.meta_total_bytes) // self.slot_bytes)


@dataclass
class CacheModel:
    cfg: CacheConfig
    mode: str
    strategy: Optional[str]
    sink: object
    admission: Admission = field(default_factory=Admission)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == SEPARATED:
            if self.strategy not in STRATEGIES:
                raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)} with mode separated, "
                                 f"got {self.strategy!r}")
            self.router = fdp.PlacementRouter(self.strategy, self.cfg.ids, ranks=self.cfg.tp)
        else:
            self.router = None
        cfg = self.cfg
        self.slots = _Slots(cfg.n_slots, affinity=self.mode == SEPARATED, order=cfg.reuse, group=cfg.group_slots)
        self.grouped = cfg.reuse == RU_GROUPS
        self.index: OrderedDict = OrderedDict()  # (hash, worker) -> (slot, pid), LRU order
        self.owner: dict = {}  # slot -> key (ru_groups: what region eviction evicts)
        self.stats = CacheStats()
        self._batch_id = None
        self._batch: list = []
        self._ckpt_copy = 0
        self._since_ckpt = 0
        self._changes = 0
        self.held: list = []  # freed, waiting for the checkpoint that records it
        self.held2: list = []  # v1: recorded by one checkpoint, waiting for the second
        self._log_pos = 0  # log: bytes appended (the device has the whole pieces below it)
        self._log_sent = 0
        self._clock = 0
        if self.grouped:
            self.grecent = [0] * self.slots.n_groups
        if cfg.evict_ahead is not None:
            trig, ratio = cfg.evict_ahead
            n = cfg.n_slots
            self._trigger = max(1, -int(-(trig * n - 1e-9) // 1))
            self._low = min(self._trigger - 1, max(0, int((trig - ratio) * n + 1e-9)))
        self.data_pid_fixed = {NO_FDP: None, MIXED: cfg.ids[0], CKPT_APART: cfg.ids[0]}.get(self.mode)
        self.ckpt_pid = {NO_FDP: None, MIXED: cfg.ids[0]}.get(self.mode, cfg.checkpoint_pid)

    # ---- events ---------------------------------------------------------------------------

    def feed(self, events: Iterable[dict], *, stop_bytes: Optional[int] = None) -> None:
        """Apply trace events until they end or the device has been sent ``stop_bytes``."""
        for e in events:
            op = e["op"]
            if op != "put" or e.get("batch") != self._batch_id:
                self._flush()
            if op == "get":
                self._get(e)
            elif op == "put":
                self._batch_id = e.get("batch")
                self._batch.append(e)
            else:
                self._delete(e)
            if stop_bytes is not None and self.stats.host_bytes >= stop_bytes:
                break
        self._flush()

    def _key(self, e: dict) -> tuple:
        return (int(e["key"], 16), int(e.get("worker", 0)))

    def _touch(self, slot: int) -> None:
        if self.grouped:
            self._clock += 1
            self.grecent[self.slots.group_of(slot)] = self._clock

    def _get(self, e: dict) -> None:
        self.stats.lookups += 1
        k = self._key(e)
        ent = self.index.get(k)
        if ent is not None:
            self.stats.hits += 1
            self.index.move_to_end(k)
            self._touch(ent[0])

    def _delete(self, e: dict) -> None:
        ent = self.index.pop(self._key(e), None)
        if ent is not None:
            self.stats.deletes += 1
            self._free(ent[0])

    def _free(self, slot: int) -> None:
        self.owner.pop(slot, None)
        self.held.append(slot)
        self._changes += 1

    def _offset(self, slot: int) -> int:
        return self.cfg.meta_total_bytes + slot * self.cfg.slot_bytes

    def _facts(self, e: dict) -> fdp.KeyFacts:
        w = int(e.get("worker", 0))
        salt = e.get("salt", "") or ""
        return fdp.KeyFacts(chunk_hash=int(e["key"], 16), worker=w, local_rank=w, salt=salt,
                            stream=(MODEL, self.cfg.tp, w, salt))

    def _flush(self) -> None:
        batch, self._batch, self._batch_id = self._batch, [], None
        if not batch:
            return
        # LMCache hands over the chunks from the first one not stored; placement is decided over
        # that store, as the plugin does.
        first = 0
        while first < len(batch) and self._key(batch[first]) in self.index:
            self.index.move_to_end(self._key(batch[first]))
            first += 1
        batch = batch[first:]
        if not batch:
            return
        if self.mode != SEPARATED:
            pids = [self.data_pid_fixed] * len(batch)
        else:
            pids = self.router.placements([self._facts(e) for e in batch]) or [None] * len(batch)
        self._make_room(batch)
        for e, pid in zip(batch, pids):
            self._put(e, pid)

    def _make_room(self, batch: list) -> None:
        """As the plugin does for a store call that does not fit: evict what the whole call
        needs at once, then write the checkpoint(s) that make the freed slots reusable (one
        room-making checkpoint per store call, not per chunk). RU groups and write admission
        keep making room per put (:meth:`_alloc`)."""
        if self.grouped or self.admission.policy != "always":
            return
        need = sum(1 for k in {self._key(e) for e in batch} if k not in self.index)
        over = need - self.slots.available() - len(self.held) - len(self.held2)
        n = 0
        while n < over:
            k = self._evict_one()
            if not k:
                break
            n += k
        self.stats.evictions += n
        if need > self.slots.available() and (self.held or self.held2):
            self._checkpoint(reclaim=True, on_demand=True)
            if self.cfg.meta_format == META_V1 and self.held2:
                self._checkpoint(reclaim=True, on_demand=True)

    # ---- eviction and reuse ---------------------------------------------------------------

    def _evict_one(self) -> int:
        """Evict the least-recently-used entry (ru_groups: every entry of the least recently
        used group); the number evicted."""
        if not self.grouped:
            if not self.index:
                return 0
            _, (slot, _) = self.index.popitem(last=False)
            self._free(slot)
            return 1
        cands = list(self.slots.closed_groups())
        best, n = None, 0
        for grp in sorted(cands, key=self.grecent.__getitem__):
            g = self.slots.g
            keys = [self.owner[s] for s in range(grp * g, grp * g + self.slots.gsize(grp)) if s in self.owner]
            if keys:
                best = keys
                break
        if best is None:
            return 0
        for k in best:
            slot, _ = self.index.pop(k)
            self._free(slot)
            n += 1
        return n

    def _used(self) -> int:
        return self.cfg.n_slots - self.slots.available() - len(self.held) - len(self.held2)

    def _alloc(self, pid) -> int:
        slot = self.slots.alloc(pid)
        while slot is None:
            if self.held or self.held2:
                self._checkpoint(reclaim=True, on_demand=True)
            else:
                n = self._evict_one()
                if not n:
                    raise RuntimeError(f"no slot is free and nothing is left to evict ({self.cfg.n_slots} slots)")
                self.stats.evictions += n
            slot = self.slots.alloc(pid)
        return slot

    def _evict_ahead(self) -> None:
        if self._used() < self._trigger:
            return
        n = 0
        while self._used() > self._low:
            k = self._evict_one()
            if not k:
                break
            n += k
        self.stats.evictions += n
        self.stats.evicted_ahead += n
        if self.held or self.held2:
            self._checkpoint(reclaim=True)
            if self.held:  # v1: the second checkpoint that frees them
                self._checkpoint(reclaim=True)

    def _put(self, e: dict, pid) -> None:
        k = self._key(e)
        if k in self.index:
            self.index.move_to_end(k)
            return
        st = self.stats
        st.puts_offered += 1
        if not self.admission.admit(k):
            st.puts_refused += 1
            return
        size = int(e["size"])
        if size > self.cfg.slot_bytes - self.cfg.header_bytes:
            raise ValueError(f"put of key {e['key']} with size={size} does not fit slot_bytes={self.cfg.slot_bytes} "
                             f"with header_bytes={self.cfg.header_bytes}")
        slot = self._alloc(pid)
        self.index[k] = (slot, pid)
        self.owner[slot] = k
        self._touch(slot)
        n = self.cfg.header_bytes + size
        self.sink.write_bytes(self._offset(slot), n, pid)
        st.puts_written += 1
        st.host_bytes += n
        st.kv_bytes += n
        self._changes += 1
        self._since_ckpt += 1
        if self.cfg.checkpoint_every and self._since_ckpt >= self.cfg.checkpoint_every:
            self._checkpoint()
        if self.cfg.evict_ahead is not None:
            self._evict_ahead()

    # ---- checkpoints and deallocation -----------------------------------------------------

    def _checkpoint(self, reclaim: bool = False, on_demand: bool = False) -> None:
        cfg = self.cfg
        self._since_ckpt = 0
        if cfg.meta_format == META_V1:
            copy_bytes = cfg.meta_total_bytes // 2
            n = min(copy_bytes, max(4096, len(self.index) * cfg.checkpoint_entry_bytes))
            n = -(-n // 4096) * 4096
            self.sink.write_bytes(self._ckpt_copy * copy_bytes, n, self.ckpt_pid)
            self._ckpt_copy ^= 1
            freed, self.held2, self.held = self.held2, self.held, []
        else:
            n = -(-max(4096, self._changes * cfg.log_record_bytes) // 4096) * 4096
            self._log_pos += n
            io = cfg.meta_io_bytes
            while self._log_sent + io <= self._log_pos:
                self.sink.write_bytes(self._log_sent % cfg.meta_total_bytes, io, self.ckpt_pid)
                self._log_sent += io
            freed, self.held = self.held, []
        self._changes = 0
        self.stats.checkpoints += 1
        self.stats.reclaims += bool(reclaim)
        self.stats.host_bytes += n
        self.stats.meta_bytes += n
        if freed:
            self._reusable(freed, skip=on_demand and self.cfg.dealloc_skip_on_demand)

    def _reusable(self, freed: list, skip: bool = False) -> None:
        for x in freed:
            self.slots.release(x)
        if not self.cfg.dealloc:
            return
        st = self.stats
        if skip:
            st.dealloc_skipped += len(freed)
            return
        runs = []
        for x in sorted(freed):
            if runs and runs[-1][1] == x:
                runs[-1][1] = x + 1
            else:
                runs.append([x, x + 1])
        sb = self.cfg.slot_bytes
        for a, b in runs:
            self.sink.dealloc_bytes(self._offset(a), (b - a) * sb)
        st.dealloc_slots += len(freed)
        st.dealloc_ranges += len(runs)
        st.dealloc_commands += -(-len(runs) // DSM_RANGES)
        st.dealloc_bytes += len(freed) * sb
