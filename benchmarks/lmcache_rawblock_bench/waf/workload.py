"""An LMCache-shaped workload, and the JSON-lines trace it is written to and read from.

Trace format (one JSON object per line, UTF-8; a first line ``{"trace": "lmcache-kv", ...}``
carries the generator's parameters and is optional):

===========  ==========================================================================
``op``       ``"get"`` (a lookup), ``"put"`` (a store request) or ``"delete"``
``key``      the chunk hash, 16 hex digits (LMCache chains it over the prefix)
``size``     payload bytes of the object (``put``; 0 otherwise)
``worker``   the TP worker (rank) the key belongs to
``phase``    ``"prefill"`` or ``"decode"``: which phase produced the KV
``time``     seconds since the start of the trace
``batch``    ``put`` only: keys with equal ``batch`` form one store call, in prefix order
``salt``     the request's cache salt (``"tenant:..."``), ``""`` when none
===========  ==========================================================================

A ``put`` batch lists a prompt's whole chain; like LMCache's store, the consumer (the cache model
in :mod:`.stream`, or ``waf replay``) hands over only the chunks from the first one not yet
stored. Evictions are not in the trace: they follow from the cache's capacity, which the
consumer decides.

The generator: conversations start at random, each on one of ``families`` shared system
prompts (a chain of full chunks, picked with a Zipf law) owned by one of ``tenants``. Each turn
looks up the prompt chain (shared prefix, then the conversation's history), stores the prompt
(prefill: the chain plus the turn's new user chunks, the last one partial) and then the answer
one chunk per store (decode: the last one partial). Full chunks join the history that later
turns look up; partial chunks are never read again (the next turn completes them under a new
hash). When a conversation ends its chunks are deleted with probability ``delete_on_end``.
Every chunk is stored once per TP worker, with ``chunk_bytes / tp`` bytes each.

LMCache's store switches (``save_decode_cache``, ``save_unfull_chunk``; both default to false in
LMCache's configuration, true in the generator's study workload): without
``save_decode_cache`` nothing is stored during decode, and the answer's full chunks reach the
cache as part of the next turn's prompt chain (LMCache stores them with that prefill); without
``save_unfull_chunk`` a prompt's (and an answer's) last, partial chunk is not stored, so every
stored object is a full chunk. :data:`LMCACHE_DEFAULTS` is LMCache's default store pattern.

Chunk hashes are uniform 64-bit values (never 0), as LMCache's chained hashes are, so a
placement by ``hash % handles`` spreads evenly.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import asdict, dataclass, fields
from typing import IO, Iterator

PREFILL = "prefill"
DECODE = "decode"
OPS = ("get", "put", "delete")


@dataclass(frozen=True)
class WorkloadSpec:
    requests: int = 4000  # conversation turns; 0 = no end (the consumer stops)
    families: int = 2000  # shared prefixes (system prompts, documents)
    family_chunks: tuple = (1, 8)  # chunks per shared prefix, inclusive range
    zipf: float = 0.9  # popularity exponent of the shared prefixes
    tenants: int = 4  # cache-salt buckets; family f belongs to tenant f % tenants
    concurrency: int = 32  # conversations in flight
    turns: float = 3.0  # mean turns per conversation (geometric)
    user_chunks: tuple = (1, 4)  # new prompt chunks per turn, inclusive
    answer_chunks: tuple = (1, 6)  # decode chunks per turn, inclusive
    tp: int = 2  # TP workers
    chunk_bytes: int = 16 << 20  # bytes of a full chunk's KV over all workers
    delete_on_end: float = 0.0  # probability a finished conversation's chunks are deleted
    seed: int = 1
    save_decode_cache: bool = True  # store the answer's chunks as decode produces them
    save_unfull_chunk: bool = True  # store a prompt's / an answer's last, partial chunk

    def __post_init__(self) -> None:
        if not isinstance(self.requests, int) or isinstance(self.requests, bool) or self.requests < 0:
            raise ValueError(f"workload requests must be a non-negative integer, got {self.requests!r}")
        for name in ("families", "tenants", "concurrency", "tp", "chunk_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"workload {name} must be a positive integer, got {v!r}")
        for name in ("family_chunks", "user_chunks", "answer_chunks"):
            v = getattr(self, name)
            if len(v) != 2 or not (1 <= v[0] <= v[1]):
                raise ValueError(f"workload {name} must be (low, high) with 1 <= low <= high, got {v!r}")
        if not 0.0 <= self.delete_on_end <= 1.0:
            raise ValueError(f"workload delete_on_end must be in [0, 1], got {self.delete_on_end!r}")
        for name in ("save_decode_cache", "save_unfull_chunk"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"workload {name} must be true or false, got {getattr(self, name)!r}")
        if not self.turns >= 1.0:
            raise ValueError(f"workload turns must be >= 1 (mean turns per conversation), got {self.turns!r}")

    @property
    def object_bytes(self) -> int:
        return self.chunk_bytes // self.tp

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> "WorkloadSpec":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown workload parameter(s) {unknown}: known are {sorted(names)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


LMCACHE_DEFAULTS = {"save_decode_cache": False, "save_unfull_chunk": False}  # LMCache's store defaults
WORKLOADS = {"study": {}, "lmcache_defaults": LMCACHE_DEFAULTS}  # named store patterns


def chunk_hash(rnd: random.Random) -> int:
    """A uniform 64-bit chunk hash, never 0."""
    return rnd.getrandbits(64) or 1


class _Conv:
    __slots__ = ("family", "history", "turns_left", "written")

    def __init__(self, family: int, turns_left: int) -> None:
        self.family = family
        self.history: list[int] = []
        self.turns_left = turns_left
        self.written: list[int] = []  # every chunk hash this conversation stored


def generate(spec: WorkloadSpec) -> Iterator[dict]:
    """The trace events of ``spec`` (see the module docstring), deterministic in ``spec.seed``."""
    rnd = random.Random(spec.seed)
    fam_chains = []
    for f in range(spec.families):
        frnd = random.Random(spec.seed * 1_000_003 + f)
        fam_chains.append([chunk_hash(frnd) for _ in range(frnd.randint(*spec.family_chunks))])
    # cumulative weights once (choices() would add them up again per call: the same draws)
    cum = list(itertools.accumulate(1.0 / (i + 1) ** spec.zipf for i in range(spec.families)))
    fams = range(spec.families)
    p_end = 1.0 / spec.turns
    convs: list[_Conv | None] = [None] * spec.concurrency
    t = 0.0
    batch = 0
    obj = spec.object_bytes

    def salt_of(fam: int) -> str:
        return f"tenant{fam % spec.tenants}:family{fam}"

    def ev(op: str, h: int, size: int, w: int, phase: str, salt: str, b: int | None = None) -> dict:
        e = {"op": op, "key": f"{h:016x}", "size": size, "worker": w, "phase": phase, "time": round(t, 6)}
        if b is not None:
            e["batch"] = b
        e["salt"] = salt
        return e

    for _ in (itertools.count() if spec.requests == 0 else range(spec.requests)):
        i = rnd.randrange(spec.concurrency)
        c = convs[i]
        if c is None:
            turns = 1
            while rnd.random() > p_end:
                turns += 1
            c = convs[i] = _Conv(rnd.choices(fams, cum_weights=cum)[0], turns)
        salt = salt_of(c.family)
        chain = fam_chains[c.family] + c.history
        for w in range(spec.tp):
            for h in chain:
                yield ev("get", h, 0, w, PREFILL, salt)
        n_user = rnd.randint(*spec.user_chunks)
        new = [chunk_hash(rnd) for _ in range(n_user)]
        last = rnd.randint(obj // 16, obj)  # the prompt's last chunk is partial
        stored = chain + (new if spec.save_unfull_chunk else new[:-1])
        for w in range(spec.tp):
            for j, h in enumerate(stored):
                size = last if j == len(chain) + n_user - 1 else obj
                yield ev("put", h, size, w, PREFILL, salt, batch)
            batch += 1
        c.history += new[:-1]
        c.written += new
        t += rnd.expovariate(50.0)
        n_ans = rnd.randint(*spec.answer_chunks)
        for j in range(n_ans):
            h = chunk_hash(rnd)
            size = rnd.randint(obj // 16, obj) if j == n_ans - 1 else obj
            if spec.save_decode_cache and (size == obj or spec.save_unfull_chunk):
                for w in range(spec.tp):
                    yield ev("put", h, size, w, DECODE, salt, batch)
                    batch += 1
            if j < n_ans - 1:
                c.history.append(h)
            c.written.append(h)
            t += rnd.expovariate(200.0)
        c.turns_left -= 1
        if c.turns_left <= 0:
            if spec.delete_on_end and rnd.random() < spec.delete_on_end:
                for h in c.written:
                    for w in range(spec.tp):
                        yield ev("delete", h, 0, w, PREFILL, salt)
            convs[i] = None


def write_trace(events, out: IO[str], spec: WorkloadSpec | None = None) -> int:
    """Write events as JSON lines (a header line first when ``spec`` is given); returns the count."""
    n = 0
    if spec is not None:
        out.write(json.dumps({"trace": "lmcache-kv", "version": 1, "workload": spec.to_dict()}) + "\n")
    for e in events:
        out.write(json.dumps(e, separators=(",", ":")) + "\n")
        n += 1
    return n


def read_trace(lines, *, source: str = "trace") -> Iterator[dict]:
    """Events of a JSON-lines trace; errors name the line and the field."""
    for no, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            e = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}:{no}: not JSON ({exc.msg})") from None
        if not isinstance(e, dict):
            raise ValueError(f"{source}:{no}: expected an object, got {line[:60]!r}")
        if "trace" in e:
            continue
        op = e.get("op")
        if op not in OPS:
            raise ValueError(f"{source}:{no}: op must be one of {', '.join(OPS)}, got {op!r}")
        key = e.get("key")
        try:
            int(key, 16)
        except (TypeError, ValueError):
            raise ValueError(f"{source}:{no}: key must be hex digits, got {key!r}") from None
        for name in ("size", "worker"):
            v = e.get(name, 0)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{source}:{no}: {name} must be a non-negative integer, got {v!r}")
        if op == "put" and (e.get("size", 0) < 1 or "batch" not in e):
            raise ValueError(f"{source}:{no}: a put needs size >= 1 and a batch, got size={e.get('size')!r} "
                             f"batch={e.get('batch')!r}")
        if e.get("phase", PREFILL) not in (PREFILL, DECODE):
            raise ValueError(f"{source}:{no}: phase must be prefill or decode, got {e.get('phase')!r}")
        yield e
