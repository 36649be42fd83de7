"""From trace events to the device's write stream: the cache in front of the drive.

:class:`CacheModel` does what our storage plugin and core do with a trace, without a device:
lookups hit or miss, a store hands over the chunks from the first one not stored, write
admission (:mod:`lmcache_rawblock.admission`) may refuse a chunk, a full cache evicts its
least-recently-used entry (the plugin's ``eviction_policy=lru``), deletes free slots, and the
slot allocator reuses the most recently freed slot (with FDP, first one last written under the
same placement identifier: ``fdp_slot_reuse_policy=pid_affinity``), as ``csrc/core/rb_slots.c``
does. Each write carries the placement identifier of the mode:

* ``no_fdp``: none;
* ``mixed``: FDP on, every write (data and checkpoint) on the first identifier;
* ``separated``: KV data routed by ``strategy`` through :class:`lmcache_rawblock.fdp.PlacementRouter`
  (tp_worker, prompt, phase, cache_salt_prefix, cache_salt_rank), the checkpoint on an identifier
  of its own.

The device sees, per put, one write of the slot's header and payload, and every
``checkpoint_every`` puts one write of a checkpoint copy (alternating between the two copies at
the start of the device, ``checkpoint_entry_bytes`` per entry). With ``dealloc`` an evicted or
deleted entry's slot is deallocated.

Write stream format (``--record``; JSON lines): ``{"op": "write", "offset": B, "length": B,
"pid": P}`` (``pid`` null without a directive) and ``{"op": "deallocate", "offset": B,
"length": B}``, byte offsets into the namespace.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import IO, Iterable, Optional

from .. import fdp
from ..admission import Admission

NO_FDP = "no_fdp"
MIXED = "mixed"
SEPARATED = "separated"
MODES = (NO_FDP, MIXED, SEPARATED)
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
    deletes: int = 0
    checkpoints: int = 0
    host_bytes: int = 0  # bytes the cache asked the device to write
    kv_bytes: int = 0  # of which KV payload and headers

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
    """A sink that feeds :class:`lmcache_rawblock.waf.ftl.FlashSim` (bytes to pages: a write
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


def replay_stream(lines: Iterable[str], sink, *, source: str = "stream") -> int:
    """Feed a recorded write stream to ``sink``; errors name the line and the field."""
    n = 0
    for no, line in enumerate(lines, 1):
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
        elif op == "deallocate":
            sink.dealloc_bytes(off, length)
        else:
            raise ValueError(f"{source}:{no}: op must be write or deallocate, got {op!r}")
        n += 1
    return n


class _Slots:
    """LIFO free slots with per-identifier pools, as csrc/core/rb_slots.c allocates them."""

    def __init__(self, n: int, affinity: bool) -> None:
        self.n = n
        self.next = 0
        self.free: OrderedDict = OrderedDict()  # slot -> None, most recently freed last
        self.pools: dict = {}  # pid -> OrderedDict of free slots last written with it
        self.pid: dict = {}
        self.affinity = affinity

    def alloc(self, pid) -> Optional[int]:
        if self.affinity and pid:
            pool = self.pools.get(pid)
            if pool:
                x = pool.popitem()[0]
                del self.free[x]
                return x
        if self.free:
            x = self.free.popitem()[0]
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

    def release(self, x: int) -> None:
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
    checkpoint_every: int = 2000  # puts between checkpoints (0: none)
    checkpoint_entry_bytes: int = 160
    ids: tuple = (1, 2, 3, 4)
    checkpoint_pid: int = 5
    dealloc: bool = True
    tp: int = 2

    def __post_init__(self) -> None:
        if self.slot_bytes <= self.header_bytes:
            raise ValueError(f"slot_bytes={self.slot_bytes} must exceed header_bytes={self.header_bytes}")
        if self.n_slots < 2:
            raise ValueError(f"capacity_bytes={self.capacity_bytes} holds {self.n_slots} slots of "
                             f"slot_bytes={self.slot_bytes} after meta_total_bytes={self.meta_total_bytes}; need 2")

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
        self.slots = _Slots(self.cfg.n_slots, affinity=self.mode == SEPARATED)
        self.index: OrderedDict = OrderedDict()  # (hash, worker) -> (slot, pid), LRU order
        self.stats = CacheStats()
        self._batch_id = None
        self._batch: list = []
        self._ckpt_copy = 0
        self._since_ckpt = 0

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

    def _get(self, e: dict) -> None:
        self.stats.lookups += 1
        k = self._key(e)
        if k in self.index:
            self.stats.hits += 1
            self.index.move_to_end(k)

    def _delete(self, e: dict) -> None:
        ent = self.index.pop(self._key(e), None)
        if ent is not None:
            self.stats.deletes += 1
            self._free(ent[0])

    def _free(self, slot: int) -> None:
        self.slots.release(slot)
        if self.cfg.dealloc:
            self.sink.dealloc_bytes(self._offset(slot), self.cfg.slot_bytes)

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
        if self.mode == NO_FDP:
            pids = [None] * len(batch)
        elif self.mode == MIXED:
            pids = [self.cfg.ids[0]] * len(batch)
        else:
            pids = self.router.placements([self._facts(e) for e in batch]) or [None] * len(batch)
        for e, pid in zip(batch, pids):
            self._put(e, pid)

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
        slot = self.slots.alloc(pid)
        while slot is None:
            old, (oslot, _) = self.index.popitem(last=False)
            st.evictions += 1
            self._free(oslot)
            slot = self.slots.alloc(pid)
        self.index[k] = (slot, pid)
        n = self.cfg.header_bytes + size
        self.sink.write_bytes(self._offset(slot), n, pid)
        st.puts_written += 1
        st.host_bytes += n
        st.kv_bytes += n
        self._since_ckpt += 1
        if self.cfg.checkpoint_every and self._since_ckpt >= self.cfg.checkpoint_every:
            self._checkpoint()

    def _checkpoint(self) -> None:
        self._since_ckpt = 0
        copy_bytes = self.cfg.meta_total_bytes // 2
        n = min(copy_bytes, max(4096, len(self.index) * self.cfg.checkpoint_entry_bytes))
        n = -(-n // 4096) * 4096
        pid = None if self.mode == NO_FDP else (self.cfg.ids[0] if self.mode == MIXED else self.cfg.checkpoint_pid)
        self.sink.write_bytes(self._ckpt_copy * copy_bytes, n, pid)
        self._ckpt_copy ^= 1
        self.stats.checkpoints += 1
        self.stats.host_bytes += n
