"""A ``KVLoadPolicy`` for LMCache 0.5.7's MP mode: recompute a prompt whose load from our
devices would finish after the engine's prefill of it.

LMCache's lookup handler asks the server's policy, once per lookup and before any prefetch,
whether to serve the lookup or report a miss (``KVLoadPolicy.should_load``). The policy sees
the number of chunk-aligned tokens the lookup covers, the chunk size and the request's configs,
not the keys or the hits, and answers yes or no: it cannot shorten the prefix. This one
estimates when a load of those tokens submitted now would finish on the caches of this
process's raw-block adapters (``lmcache_rawblock.load_cost``: the bytes queued on each device
and its measured read bandwidth, the keys spread evenly over the devices, the slowest device
deciding) and refuses the lookup when the recompute, at ``recompute tokens per second``, would
be sooner. Tokens the engine already holds (``lmcache.hint.engine_computed_tokens``) are not
loaded and do not count; ``lmcache.skip_load`` is honoured as LMCache's default policy does.

Turn it on in the MP server's command line (docs/configuration.md)::

    --kv-load-policy lmcache_rawblock.load_policy:RawBlockLoadCostPolicy
    --runtime-plugin-config '{"rust_raw_block.load_cost_recompute_tokens_per_second": 8000}'

LMCache is imported by this module (it is only ever imported by LMCache's policy factory).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from . import load_cost
from .lmcache_paths import import_kv_load_policy

_KVLoadPolicy: Any = import_kv_load_policy().KVLoadPolicy

__all__ = ["PRIOR_KEY", "RATE_KEY", "RawBlockLoadCostPolicy"]

RATE_KEY = "rust_raw_block.load_cost_recompute_tokens_per_second"
PRIOR_KEY = "rust_raw_block.load_cost_prior_read_bytes_per_second"
logger = logging.getLogger(__name__)


class RawBlockLoadCostPolicy(_KVLoadPolicy):
    """Serve a lookup unless loading it would finish after recomputing it (module docstring).

    Reads from the server's runtime-plugin config: ``rust_raw_block.load_cost_recompute_tokens_per_second``
    (required: the engine's prefill speed for this model and GPU) and
    ``rust_raw_block.load_cost_prior_read_bytes_per_second`` (optional: the read bandwidth
    assumed before the first load is measured). ``decisions`` counts what it answered.
    """

    def __init__(self, configs: Mapping[str, Any]) -> None:
        super().__init__(configs)
        raw = (configs or {}).get(RATE_KEY)
        rate = load_cost.parse_rate(raw, f"runtime-plugin config {RATE_KEY!r}")
        if rate is None:
            raise ValueError(f"runtime-plugin config {RATE_KEY!r} must be set (tokens per second the engine "
                             f"prefills) for RawBlockLoadCostPolicy, got {raw!r}")
        self.recompute_tps = rate
        prior = load_cost.parse_rate((configs or {}).get(PRIOR_KEY), f"runtime-plugin config {PRIOR_KEY!r}",
                                       "bytes per second")
        self.prior_bandwidth = float(prior or load_cost.DEFAULT_PRIOR_BANDWIDTH)
        self._lock = threading.Lock()
        self.decisions = {"served": 0, "refused": 0, "skip_load": 0, "no_cache": 0}
        self.last: dict[str, float] = {}

    def _count(self, what: str) -> None:
        with self._lock:
            self.decisions[what] += 1

    def estimate(self, tokens: int, chunk_size: int) -> float | None:
        """Seconds until a load of ``tokens`` submitted now would finish (the slowest cache's),
        None when no raw-block cache is listed in this process."""
        chunks = -(-tokens // max(1, chunk_size))
        worst: float | None = None
        for cache in load_cost.live(prior_bandwidth=self.prior_bandwidth):
            try:
                est = cache.estimate_spread_seconds(chunks * cache.keys_per_chunk)
            except RuntimeError as e:  # a cache closed meanwhile: it serves nothing
                logger.debug("load estimate skipped a closed cache: %s", e)
                continue
            worst = est if worst is None else max(worst, est)
        return worst

    def should_load(self, ctx: Any) -> bool:
        configs = ctx.request_configs or {}
        if configs.get("lmcache.skip_load", False):
            self._count("skip_load")
            return False
        held = int(configs.get("lmcache.hint.engine_computed_tokens", 0) or 0)
        chunk = max(1, int(ctx.chunk_size))
        tokens = int(ctx.num_lookup_tokens) - held // chunk * chunk
        if tokens <= 0:
            self._count("served")
            return True
        est = self.estimate(tokens, chunk)
        if est is None:
            self._count("no_cache")
            return True
        recompute = tokens / self.recompute_tps
        self.last = {"tokens": float(tokens), "load_seconds": est, "recompute_seconds": recompute}
        if est > recompute:
            self._count("refused")
            logger.debug("request %s: load of %d tokens would take %.3f s, recompute %.3f s: recompute",
                         ctx.request_id, tokens, est, recompute)
            return False
        self._count("served")
        return True
