"""FDP data placement: which reclaim unit handle each KV write goes to.

NVMe Flexible Data Placement lets the host tag each write with a placement identifier; the
device keeps data written under different identifiers in different reclaim units, so data that
is deleted together is erased together and garbage collection has less to copy. The storage
plugin (``rust_raw_block.fdp_*`` keys) and the MP adapter (``fdp_*`` JSON keys) both route
writes with this module; the core only carries the identifier of each write to the device.

Data placement policies (``fdp_data_placement_policy``):

* ``none``: no directive; the device places writes itself.
* ``cache_salt_prefix`` / ``cache_salt_rank``: LMCache's MP adapter policies. A cache salt
  ``"tenant:rest"`` belongs to bucket ``"tenant"`` (case-folded); buckets take identifiers in
  the order they are first seen (``cache_salt_rank``: one per bucket and TP rank), salts
  without a bucket and buckets beyond the identifiers get no directive. In the MP adapter
  LMCache's own code applies them; :class:`SaltPlacements` applies them in the plugin, where
  the salt is the request tag ``lmcache.tag.cache_salt``.
* ``tp_worker``: each TP worker's KV on its own handle, ``ids[worker % len(ids)]``.
* ``prompt``: the chunks of one prompt's prefix chain share a handle,
  ``ids[anchor % len(ids)]``, where the anchor is the chunk hash of the chain's first chunk in
  the store batch (see :func:`chain_runs`).
* ``phase``: prefill KV on ``ids[0]``, decode KV on ``ids[1]`` (see :func:`phase_of_run`).

The strategies are pure functions of a key's :class:`KeyFacts` and the identifiers, so they are
tested without a device. What LMCache passes, and so what the facts can hold:

* The plugin gets ``CacheEngineKey`` objects (``model_name, world_size, worker_id, chunk_hash,
  dtype, request_configs``) from one ``LMCacheEngine.store`` call per request: the request's
  not-yet-stored chunks, in prefix order.
* The MP adapter gets ``ObjectKey`` objects (``chunk_hash: bytes, model_name, kv_rank,
  object_group_id, cache_salt``) in store tasks that group, by model and ``kv_rank``, the keys
  whose L1 writes finished together: usually one request's new chunks in order, sometimes
  several requests' back to back. ``kv_rank`` packs ``world_size << 24 | global_rank << 16 |
  local_world_size << 8 | local_rank``.
* Neither carries a request id nor the request's phase.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

NONE = "none"
CACHE_SALT_PREFIX = "cache_salt_prefix"
CACHE_SALT_RANK = "cache_salt_rank"
TP_WORKER = "tp_worker"
PROMPT = "prompt"
PHASE = "phase"
LMCACHE_POLICIES = (NONE, CACHE_SALT_PREFIX, CACHE_SALT_RANK)
STRATEGIES = (TP_WORKER, PROMPT, PHASE)

PID_AFFINITY = "pid_affinity"

AUTO = "auto"
PREFILL = "prefill"
DECODE = "decode"

# The plugin's keys have no cache salt field: a request carries one as this request config
# (LMCache turns lmcache.tag.* request configs into key tags).
LEGACY_SALT_CONFIG = "lmcache.tag.cache_salt"
SALT_BUCKET_SEPARATOR = ":"

PlacementIds = Sequence[int]


# --------------------------------------------------------------------------- key facts


@dataclass(frozen=True)
class KeyFacts:
    """What routing needs from one key, whatever LMCache's key type."""

    chunk_hash: int  # the chunk's content hash (LMCache chains it over the prefix)
    worker: int  # TP worker: CacheEngineKey.worker_id, or the global rank packed in kv_rank
    local_rank: int  # the rank on this node (cache_salt_rank)
    salt: str  # cache salt, "" when none
    stream: tuple  # adjacent keys of a batch with equal streams belong to one prefix chain


def legacy_key_facts(key: Any) -> KeyFacts:
    """Facts of the plugin's keys: LMCache's ``CacheEngineKey`` / ``LayerCacheEngineKey``
    (or their string form)."""
    if isinstance(key, str):
        from .raw_block._lmcache import parse_cache_key

        key = parse_cache_key(key)
    configs = getattr(key, "request_configs", None) or {}
    salt = str(configs.get(LEGACY_SALT_CONFIG, "") or "")
    worker = int(key.worker_id)
    # A layer's keys of one chunk share the chunk hash, so layerwise stores route as the chunk.
    return KeyFacts(chunk_hash=int(key.chunk_hash), worker=worker, local_rank=worker, salt=salt,
                    stream=(key.model_name, int(key.world_size), worker, salt))


def object_key_facts(key: Any) -> KeyFacts:
    """Facts of the MP adapter's keys: LMCache's ``ObjectKey``."""
    kv_rank = int(key.kv_rank)
    salt = str(getattr(key, "cache_salt", "") or "")
    group = int(getattr(key, "object_group_id", 0) or 0)
    return KeyFacts(chunk_hash=int.from_bytes(bytes(key.chunk_hash), "big"), worker=(kv_rank >> 16) & 0xFF,
                    local_rank=kv_rank & 0xFF, salt=salt, stream=(key.model_name, kv_rank, group, salt))


# --------------------------------------------------------------------------- the strategies


def tp_worker_placement(facts: KeyFacts, ids: PlacementIds) -> int:
    """Per TP worker: worker w writes on ``ids[w % len(ids)]`` (workers share handles only when
    there are more workers than identifiers)."""
    return ids[facts.worker % len(ids)]


def prompt_placement(anchor_hash: int, ids: PlacementIds) -> int:
    """Per prompt: every chunk of a chain goes where its anchor chunk's hash points. LMCache's
    chunk hashes are uniform, so the modulo spreads prompts evenly over the handles."""
    return ids[anchor_hash % len(ids)]


def phase_placement(phase: str, ids: PlacementIds) -> int:
    """Per phase: prefill KV on the first identifier, decode KV on the second."""
    if len(ids) < 2:
        raise ValueError(f"the phase strategy needs two placement identifiers (prefill, decode), got {list(ids)}")
    return ids[0] if phase == PREFILL else ids[1]


def chain_runs(facts: Sequence[KeyFacts]) -> list[range]:
    """Split a store batch into prefix chains: maximal runs of adjacent keys of one stream
    (model, rank, cache salt; group in the MP adapter).

    LMCache hands a request's new chunks over in prefix order, and a chunk's hash depends on
    every chunk before it, so nothing in a key links it to its predecessor: adjacency in a batch
    is the only chain information there is. A run therefore starts at the first chunk of the
    prefix that is new in this store (earlier chunks are already stored, wherever they went),
    and in an MP store task that holds two requests of one stream back to back the two are taken
    as one chain."""
    runs: list[range] = []
    start = 0
    for i in range(1, len(facts) + 1):
        if i == len(facts) or facts[i].stream != facts[start].stream:
            runs.append(range(start, i))
            start = i
    return runs


def phase_of_run(run_len: int, role: str | None) -> str:
    """Prefill or decode for a chain of ``run_len`` chunks written in one store.

    A known role wins (an instance that only prefills or only decodes: ``fdp_phase``, or
    LMCache's ``pd_role``). Without one the phase is read off the store's shape: LMCache's vLLM
    connectors save a decoding request's KV one chunk at a time (the chunk its newest tokens
    completed), while a prefill saves the prompt's chunks together; so a run of one chunk is
    decode and a longer run prefill. A prompt that fits in one chunk, and a chunked-prefill step
    that completes a single chunk, are therefore taken as decode."""
    if role in (PREFILL, DECODE):
        return role
    return DECODE if run_len == 1 else PREFILL


def route(policy: str, facts: Sequence[KeyFacts], ids: PlacementIds, *, role: str | None = None
          ) -> list[int | None]:
    """Placement identifier of each key of one store batch under one of the three strategies."""
    if policy == TP_WORKER:
        return [tp_worker_placement(f, ids) for f in facts]
    if policy not in (PROMPT, PHASE):
        raise ValueError(f"fdp_data_placement_policy {policy!r} is not one of {', '.join(STRATEGIES)}")
    out: list[int | None] = [None] * len(facts)
    for run in chain_runs(facts):
        if policy == PROMPT:
            pid = prompt_placement(facts[run.start].chunk_hash, ids)
        else:
            pid = phase_placement(phase_of_run(len(run), role), ids)
        for i in run:
            out[i] = pid
    return out


def role_phase(fdp_phase: str, lmcache_config: Any = None) -> str | None:
    """The phase every write of this instance has, or None when it is decided per store.
    ``fdp_phase`` prefill/decode says so; with ``auto`` a disaggregated LMCache instance
    (``enable_pd``) is the prefiller when its ``pd_role`` is ``sender`` and the decoder when it
    is ``receiver``."""
    if fdp_phase in (PREFILL, DECODE):
        return fdp_phase
    if lmcache_config is not None and getattr(lmcache_config, "enable_pd", False):
        return {"sender": PREFILL, "receiver": DECODE}.get(getattr(lmcache_config, "pd_role", ""))
    return None


# --------------------------------------------------------------------------- cache salt


def salt_bucket(salt: str) -> str | None:
    """The bucket of a cache salt: its case-folded prefix before ':'; None without one."""
    head, sep, _ = (salt or "").partition(SALT_BUCKET_SEPARATOR)
    if not sep:
        return None
    return head.casefold() or None


class SaltPlacements:
    """LMCache's cache-salt policies for the plugin: a bucket takes the next free identifier the
    first time it is seen (``cache_salt_rank``: ``ranks`` consecutive identifiers, one per rank,
    so the TP workers of one bucket, each in its own process and seeing the same requests in the
    same order, agree without talking). Buckets beyond the identifiers get no directive, with
    one warning. The assignment lives in this process only."""

    def __init__(self, policy: str, ids: PlacementIds, *, ranks: int = 1) -> None:
        if policy not in (CACHE_SALT_PREFIX, CACHE_SALT_RANK):
            raise ValueError(f"SaltPlacements takes {CACHE_SALT_PREFIX} or {CACHE_SALT_RANK}, got {policy!r}")
        self.policy = policy
        self.ids = tuple(ids)
        self.ranks = max(1, int(ranks)) if policy == CACHE_SALT_RANK else 1
        self._buckets: dict[str, int] = {}  # bucket -> its index in first-seen order
        self._lock = threading.Lock()
        self._warned = False
        self.fallback_count = 0

    def placement(self, facts: KeyFacts) -> int | None:
        bucket = salt_bucket(facts.salt)
        if bucket is None:
            return None
        with self._lock:
            index = self._buckets.setdefault(bucket, len(self._buckets))
            slot = index * self.ranks + (facts.local_rank % self.ranks)
            if slot < len(self.ids):
                return self.ids[slot]
            self.fallback_count += 1
            if not self._warned:
                self._warned = True
                logger.warning("more cache_salt buckets than FDP placement identifiers (%d): writes of bucket "
                               "%r and later ones carry no placement directive", len(self.ids), bucket)
        return None

    def assignments(self) -> dict[str, list[int]]:
        with self._lock:
            return {b: [self.ids[i * self.ranks + r] for r in range(self.ranks) if i * self.ranks + r < len(self.ids)]
                    for b, i in self._buckets.items()}


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class FdpSettings:
    """The FDP settings of one entry point, checked against each other (not yet against the
    device: see :func:`data_placement_ids`)."""

    enabled: bool = False
    placement_ids: tuple[int, ...] | None = None  # None: every identifier the device reports
    data_policy: str = NONE
    slot_reuse_policy: str = NONE
    phase: str = AUTO

    @property
    def slot_affinity(self) -> bool:
        return self.slot_reuse_policy == PID_AFFINITY


def resolve_settings(values: Mapping[str, Any], *, io_engine: str, use_uring_cmd: bool,
                     meta_checkpoint_placement_id: int | None, default_policy: str,
                     label: Callable[[str], str] = str) -> FdpSettings:
    """FdpSettings from parsed values (absent or None: unset). ``default_policy`` is the data
    policy when FDP is on and none is given (the plugin's and LMCache's defaults differ);
    ``label`` turns a setting name into the name the user wrote. Errors name the setting and
    its value."""
    enabled = bool(values.get("fdp_enabled") or False)
    ids = values.get("fdp_placement_ids")
    policy = values.get("fdp_data_placement_policy")
    reuse = values.get("fdp_slot_reuse_policy")
    phase = values.get("fdp_phase") or AUTO
    if not enabled:
        _check_unused_when_off(ids, policy, reuse, phase, label)
        return FdpSettings(phase=phase)
    if io_engine != "io_uring" or not use_uring_cmd:
        raise ValueError(f"{label('fdp_enabled')}=true requires {label('io_engine')}='io_uring' and "
                         f"{label('use_uring_cmd')}=true (got io_engine={io_engine!r}, use_uring_cmd={use_uring_cmd})")
    policy = policy or default_policy
    _check_on_settings(ids, policy, phase, meta_checkpoint_placement_id, label)
    return FdpSettings(enabled=True, placement_ids=None if ids is None else tuple(ids), data_policy=policy,
                       slot_reuse_policy=reuse or PID_AFFINITY, phase=phase)


def _check_unused_when_off(ids: Any, policy: Any, reuse: Any, phase: str, label: Callable[[str], str]) -> None:
    """With FDP off, raise for the first FDP setting given a value other than its idle one."""
    # Each of these only means something with FDP on; taking it silently would leave the
    # user believing writes are placed.
    for name, value, idle in (("fdp_placement_ids", ids, None), ("fdp_data_placement_policy", policy, NONE),
                              ("fdp_slot_reuse_policy", reuse, NONE), ("fdp_phase", phase, AUTO)):
        if value is not None and value != idle:
            shown = list(value) if isinstance(value, tuple) else value
            raise ValueError(f"{label(name)}={shown!r} requires {label('fdp_enabled')}=true")


def _check_on_settings(ids: Any, policy: str, phase: str, meta_checkpoint_placement_id: int | None,
                       label: Callable[[str], str]) -> None:
    """With FDP on, raise when the identifiers, the data policy and the phase disagree."""
    if ids is not None and meta_checkpoint_placement_id is not None and meta_checkpoint_placement_id in ids:
        raise ValueError(f"{label('fdp_placement_ids')}={list(ids)} must not contain "
                         f"{label('meta_checkpoint_placement_id')}={meta_checkpoint_placement_id}: checkpoint "
                         "writes need a handle of their own")
    if policy == PHASE and ids is not None and len(ids) < 2:
        raise ValueError(f"{label('fdp_data_placement_policy')}='phase' needs two identifiers in "
                         f"{label('fdp_placement_ids')} (prefill, decode), got {list(ids)}")
    if phase != AUTO and policy != PHASE:
        raise ValueError(f"{label('fdp_phase')}={phase!r} applies to {label('fdp_data_placement_policy')}='phase' "
                         f"only (it is {policy!r})")


def data_placement_ids(reported: Iterable[tuple[int, int]], configured: Sequence[int] | None,
                       meta_checkpoint_placement_id: int | None, *, device: str, policy: str = NONE,
                       label: Callable[[str], str] = str) -> tuple[int, ...]:
    """The identifiers KV data is written with, checked against the device's report
    (``fetch_fdp_status()``: (placement id, reclaim unit handle id) pairs): the configured ones,
    each of which the device must report, or every non-zero reported one except the
    checkpoint's."""
    device_ids = _device_placement_ids(reported, meta_checkpoint_placement_id, device, label)
    if configured is not None:
        missing = [p for p in configured if p not in device_ids]
        if missing:
            raise ValueError(f"{label('fdp_placement_ids')}={list(configured)}: {missing} not reported by {device} "
                             f"(it reports {device_ids})")
        ids = tuple(configured)
    else:
        ids = tuple(p for p in device_ids if p != meta_checkpoint_placement_id)
    if not ids:
        raise ValueError(f"no placement identifier of {device} is left for KV data: it reports {device_ids} and "
                         f"{label('meta_checkpoint_placement_id')}={meta_checkpoint_placement_id} takes it")
    if policy == PHASE and len(ids) < 2:
        raise ValueError(f"{label('fdp_data_placement_policy')}='phase' needs two placement identifiers for KV "
                         f"data (prefill, decode); {device} leaves {list(ids)}")
    return ids


def _device_placement_ids(reported: Iterable[tuple[int, int]], meta_checkpoint_placement_id: int | None,
                          device: str, label: Callable[[str], str]) -> list[int]:
    """The non-zero placement identifiers the device reports; raises when there is none or
    when the checkpoint's identifier is not among them."""
    reported = [(int(p), int(r)) for p, r in reported]
    device_ids = [p for p, _ in reported if p != 0]
    if not device_ids:
        raise RuntimeError(f"FDP is enabled but {device} reports no non-zero placement identifiers "
                           f"(reclaim unit handle status: {reported})")
    if meta_checkpoint_placement_id is not None and meta_checkpoint_placement_id not in device_ids:
        raise ValueError(f"{label('meta_checkpoint_placement_id')}={meta_checkpoint_placement_id} is not a "
                         f"placement identifier of {device} (it reports {device_ids})")
    return device_ids


class PlacementRouter:
    """The plugin's router: one policy over the identifiers, for one store batch at a time."""

    def __init__(self, policy: str, ids: PlacementIds, *, role: str | None = None, ranks: int = 1) -> None:
        self.policy = policy
        self.ids = tuple(ids)
        self.role = role
        self.salts = SaltPlacements(policy, self.ids, ranks=ranks) if policy in (CACHE_SALT_PREFIX,
                                                                                  CACHE_SALT_RANK) else None

    def placements(self, facts: Sequence[KeyFacts]) -> list[int | None] | None:
        """Identifiers aligned with ``facts``; None when no key gets a directive."""
        if self.policy == NONE or not facts:
            return None
        if self.salts is not None:
            pids = [self.salts.placement(f) for f in facts]
        else:
            pids = route(self.policy, facts, self.ids, role=self.role)
        return None if all(p is None for p in pids) else pids


__all__ = [
    "AUTO", "CACHE_SALT_PREFIX", "CACHE_SALT_RANK", "DECODE", "FdpSettings", "KeyFacts", "LEGACY_SALT_CONFIG",
    "LMCACHE_POLICIES", "NONE", "PHASE", "PID_AFFINITY", "PREFILL", "PROMPT", "PlacementRouter", "STRATEGIES",
    "SaltPlacements", "TP_WORKER", "chain_runs", "data_placement_ids", "legacy_key_facts", "object_key_facts",
    "phase_of_run", "phase_placement", "prompt_placement", "resolve_settings", "role_phase", "route", "salt_bucket",
    "tp_worker_placement",
]
