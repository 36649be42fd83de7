"""When a load submitted now would finish: a live estimate per device, and the prefix worth loading.

A disk hit is worth serving only if it arrives before the engine would have recomputed it. The
estimate of one device is ``writes ahead / write rate + (reads ahead + bytes of the load) / read
rate``:

* ahead: what the device's io_uring scheduler holds and has not finished
  (``_native.Core.load_queue``): every read, plus the writes that share the device with a read.
  Under ``io_scheduler=loads_first`` a read passes queued writes, so only the writes the kernel
  may hold at once (``write_max_bytes_in_flight``) count; under ``fifo`` every queued write does.
  Under the posix engine the scheduler counts nothing: the bytes of this core's loads and puts
  in flight stand in, as reads.
* write rate: an EWMA of the device's completed write bytes per second between two readings
  with writes pending at both (each estimate and each load takes a reading).
* read rate: an EWMA of what completed loads measured, each load's sample being (reads ahead when
  it began + its bytes) / (its wall time less the time the writes ahead took at the write rate).
  Until the first load is measured the prior (``prior_bandwidth``) is used, for writes too.

For a cache over several devices the estimate of a set of keys is the largest of its devices'
estimates (the devices read their parts at the same time). :func:`worth_loading` turns the
estimate into a decision: the number of leading chunks whose load plus the recompute of the
rest finishes soonest, 0 when recomputing everything is fastest.

The estimator is attached to a core only where a policy asks for it (:func:`attach`): a core
without one measures nothing.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from .settings import finite_number

__all__ = [
    "DEFAULT_PRIOR_BANDWIDTH", "DeviceLoadCost", "LoadCost", "attach", "forget", "live", "parse_rate", "register",
    "registered", "worth_loading",
]

DEFAULT_PRIOR_BANDWIDTH = 1 << 30  # bytes/s assumed before the first load is measured
_ALPHA = 0.2  # weight of the newest bandwidth sample
_MIN_SAMPLE_SECONDS = 1e-6  # a load faster than this measures nothing (clock resolution)
_MIN_INTERVAL_SECONDS = 0.002  # write-rate samples: readings at least this far apart
_MIN_READ_SHARE = 0.1  # a load's read time is at least this share of its wall time


def parse_rate(value: Any, label: str, unit: str = "tokens per second") -> float | None:
    """A rate setting (tokens or bytes per second): None or "" (unset) is None; else a number
    > 0 (an int, a float or a decimal string, as YAML and the environment give). Booleans and
    anything else raise ValueError naming ``label`` and the value."""
    if value is None or value == "":
        return None
    number = finite_number(value)
    if number is None or number <= 0:
        raise ValueError(f"{label} must be a number > 0 ({unit}), got {value!r}")
    return number


def _payload_size(obj: Any, default: int) -> int:
    get_size = getattr(obj, "get_size", None)
    if callable(get_size):
        try:
            return int(get_size())
        except Exception:  # noqa: BLE001 - a size is a statistic: the slot's payload stands in
            return default
    return default


class DeviceLoadCost:
    """The load-finish estimate of one RawBlockCore (see the module docstring)."""

    def __init__(self, core: Any, *, prior_bandwidth: float = DEFAULT_PRIOR_BANDWIDTH) -> None:
        if not (math.isfinite(prior_bandwidth) and prior_bandwidth > 0):
            raise ValueError(f"prior_bandwidth must be a number > 0 (bytes per second), got {prior_bandwidth!r}")
        self.device_path = str(core.device_path)
        self._queue = core._native.load_queue
        sched = core._native.io_scheduler() if core.io_engine == "io_uring" else None
        self.scheduler = None if sched is None else str(sched["io_scheduler"])
        self._write_cap = 0 if sched is None else int(sched["write_max_bytes_in_flight"])
        self.prior_bandwidth = float(prior_bandwidth)
        self._lock = threading.Lock()
        self._bandwidth: float | None = None
        self._write_bandwidth: float | None = None
        self._last: tuple[float, int, int] | None = None  # (clock, write_completed, write_pending)
        self._key_bytes = float(max(1, int(core.slot_bytes) - int(core.header_bytes)))
        self.samples = 0
        self.write_samples = 0

    def ahead(self) -> tuple[int, int]:
        """(read bytes, write bytes) a load submitted now waits behind on this device; every
        reading also measures the rate at which the device completes writes while it has some."""
        reads, writes, inflight, _, written = self._queue()
        self._note_writes(time.monotonic(), int(written), int(writes))
        if self.scheduler is None:
            return int(inflight), 0
        if self.scheduler == "fifo":
            return int(reads), int(writes)
        return int(reads), int(min(writes, self._write_cap))

    def _note_writes(self, now: float, written: int, pending: int) -> None:
        with self._lock:
            last = self._last
            if last is not None and now - last[0] < _MIN_INTERVAL_SECONDS:
                return  # too close to the last reading to measure anything: keep that one
            self._last = (now, written, pending)
            if last is None or not (last[2] and pending):
                return
            sample = (written - last[1]) / (now - last[0])
            if sample > 0:
                bw = self._write_bandwidth
                self._write_bandwidth = sample if bw is None else (1 - _ALPHA) * bw + _ALPHA * sample
                self.write_samples += 1

    def ahead_bytes(self) -> int:
        """Bytes a load submitted now waits behind on this device."""
        return sum(self.ahead())

    @property
    def bandwidth(self) -> float:
        """Read bandwidth in bytes/s: measured (an EWMA), else the prior."""
        bw = self._bandwidth
        return self.prior_bandwidth if bw is None else bw

    @property
    def write_bandwidth(self) -> float:
        """Bytes/s the device completes writes at while it has some: measured, else the read
        bandwidth."""
        bw = self._write_bandwidth
        return self.bandwidth if bw is None else bw

    @property
    def key_bytes(self) -> float:
        """Bytes one key's load reads: the mean of measured loads, else the slot's payload."""
        return self._key_bytes

    def seconds(self, nbytes: float, ahead: tuple[int, int] | None = None) -> float:
        """Seconds until a load of ``nbytes`` submitted now would finish (0 for nothing): the
        writes ahead at the write rate, then the reads ahead and its own at the read rate."""
        if nbytes <= 0:
            return 0.0
        reads, writes = self.ahead() if ahead is None else ahead
        return writes / self.write_bandwidth + (reads + nbytes) / self.bandwidth

    def begin(self) -> tuple[float, tuple[int, int]]:
        """A load begins: the mark :meth:`end` takes."""
        ahead = self.ahead()
        return time.monotonic(), ahead

    def end(self, mark: tuple[float, tuple[int, int]], objs: Sequence[Any], loaded: Sequence[bool]) -> None:
        """A load begun at ``mark`` read the objects of ``loaded``: one read-bandwidth sample,
        the time it waited behind writes (at the write rate) taken out."""
        elapsed = time.monotonic() - mark[0]
        n = sum(1 for ok in loaded if ok)
        if n == 0 or elapsed < _MIN_SAMPLE_SECONDS:
            return
        default = int(self._key_bytes)
        nbytes = sum(_payload_size(o, default) for o, ok in zip(objs, loaded) if ok)
        reads, writes = mark[1]
        reading = max(elapsed - writes / self.write_bandwidth, elapsed * _MIN_READ_SHARE)
        sample = (reads + nbytes) / reading
        with self._lock:
            self._bandwidth = sample if self._bandwidth is None else (1 - _ALPHA) * self._bandwidth + _ALPHA * sample
            self._key_bytes = (1 - _ALPHA) * self._key_bytes + _ALPHA * (nbytes / n)
            self.samples += 1


def _device_cost(core: Any, prior: float) -> DeviceLoadCost:
    lc = getattr(core, "load_cost", None)
    if lc is None:
        lc = DeviceLoadCost(core, prior_bandwidth=prior)
        core.load_cost = lc
    return lc


class LoadCost:
    """The estimate of a cache: a RawBlockCore or a MultiDeviceCore (the max over its devices)."""

    def __init__(self, core: Any, *, prior_bandwidth: float = DEFAULT_PRIOR_BANDWIDTH) -> None:
        self._core = core
        self._prior = float(prior_bandwidth)
        self._multi = hasattr(core, "device_cores")
        # Keys LMCache stores per chunk of tokens (object groups x KV ranks): MP lookups note it.
        self.keys_per_chunk = 1.0
        self.devices()  # attach now: loads are measured from here on

    def note_chunks(self, nkeys: int, nchunks: int) -> None:
        """A lookup asked for ``nkeys`` keys of ``nchunks`` chunks."""
        if nkeys > 0 and nchunks > 0:
            self.keys_per_chunk = (1 - _ALPHA) * self.keys_per_chunk + _ALPHA * (nkeys / nchunks)

    def devices(self) -> list[DeviceLoadCost]:
        """The estimate of each online device (a device reopened since gets a new one)."""
        cores = [c for c in self._core.device_cores() if c is not None] if self._multi else [self._core]
        return [_device_cost(c, self._prior) for c in cores]

    def locate(self, encoded_keys: Sequence[str]) -> list[DeviceLoadCost | None]:
        """The device estimate of each key's device, None for a key no device holds."""
        keys = list(encoded_keys)
        if not keys:
            return []
        if self._multi:
            return [None if c is None else _device_cost(c, self._prior) for c in self._core.locate_cores(keys)]
        dev = _device_cost(self._core, self._prior)
        return [dev if ok else None for ok in self._core.exists_many(keys)]

    def estimate_load_seconds(self, keys: Sequence[str] | None = None, *,
                              bytes_per_device: Mapping[str, float] | None = None) -> float:
        """Seconds until a load submitted now would finish: of the encoded ``keys`` this cache
        holds, or of ``bytes_per_device`` (device path to bytes). The max over the devices."""
        if (keys is None) == (bytes_per_device is None):
            raise ValueError("estimate_load_seconds takes keys or bytes_per_device, exactly one")
        per: dict[DeviceLoadCost, float] = {}
        if keys is not None:
            for dev in self.locate(keys):
                if dev is not None:
                    per[dev] = per.get(dev, 0.0) + dev.key_bytes
        else:
            assert bytes_per_device is not None
            by_path = {d.device_path: d for d in self.devices()}
            for path, nbytes in bytes_per_device.items():
                if path not in by_path:
                    raise ValueError(f"bytes_per_device names {path!r}, not an online device of this cache "
                                     f"({sorted(by_path)})")
                per[by_path[path]] = float(nbytes)
        return max((d.seconds(b) for d, b in per.items()), default=0.0)

    def estimate_spread_seconds(self, nkeys: float) -> float:
        """Seconds until a load of ``nkeys`` keys spread evenly over the online devices would
        finish (where the keys are not known yet: LMCache's MP load policy)."""
        devs = self.devices()
        if nkeys <= 0 or not devs:
            return 0.0
        return max(d.seconds(nkeys / len(devs) * d.key_bytes) for d in devs)

    def worth_loading(self, encoded_keys: Sequence[str], tokens_per_key: float, recompute_tps: float) -> int:
        """How many leading keys of ``encoded_keys`` to load: see :func:`worth_loading`."""
        return worth_loading(self.locate(encoded_keys), tokens_per_key, recompute_tps)


def worth_loading(where: Sequence[DeviceLoadCost | None], tokens_per_key: float, recompute_tps: float) -> int:
    """The leading hits worth loading, given each key's device (None: a miss, which ends the
    prefix). Loading i keys and recomputing the rest finishes after load(i) + (n - i) * t, where
    load(i) is the max over the devices of their estimates for their part of the first i keys
    and t = tokens_per_key / recompute_tps; the i with the soonest finish wins (the longest of
    equals), 0 when recomputing everything is soonest."""
    per_key = tokens_per_key / recompute_tps
    ahead: dict[DeviceLoadCost, tuple[int, int]] = {}
    part: dict[DeviceLoadCost, float] = {}
    best, best_gain, load = 0, 0.0, 0.0
    for i, dev in enumerate(where):
        if dev is None:
            break
        if dev not in ahead:
            ahead[dev] = dev.ahead()
        part[dev] = part.get(dev, 0.0) + dev.key_bytes
        load = max(load, dev.seconds(part[dev], ahead[dev]))
        gain = (i + 1) * per_key - load  # recompute time saved minus the load's time
        if gain > 0 and gain >= best_gain:
            best, best_gain = i + 1, gain
    return best


# The caches of this process's MP adapters: LMCache builds its load policy and its L2 adapters
# apart, so the policy finds the adapters' caches here. A weak set of cores, and each core's
# estimate on the core itself (``_listed_load_cost``, once a policy asked): nothing here keeps
# a core alive, so a closed, dropped core leaves by itself.
_CACHES: weakref.WeakSet[Any] = weakref.WeakSet()
_CACHES_LOCK = threading.Lock()
_LISTED = "_listed_load_cost"


def attach(core: Any, *, prior_bandwidth: float = DEFAULT_PRIOR_BANDWIDTH) -> LoadCost:
    """The estimate of ``core``, measuring its loads from now on."""
    return LoadCost(core, prior_bandwidth=prior_bandwidth)


def register(core: Any) -> None:
    """List an MP adapter's cache for :func:`live` (nothing is measured until a policy asks)."""
    with _CACHES_LOCK:
        _CACHES.add(core)


def forget(core: Any) -> None:
    """Stop listing ``core`` (its adapter closed)."""
    with _CACHES_LOCK:
        _CACHES.discard(core)


def registered(core: Any) -> LoadCost | None:
    """The estimate a policy attached to a listed cache, None before one did (cheap: a
    lookup's keys-per-chunk note is taken only when a policy listens)."""
    return getattr(core, _LISTED, None) if core in _CACHES else None


def live(*, prior_bandwidth: float = DEFAULT_PRIOR_BANDWIDTH) -> list[LoadCost]:
    """The estimates of the listed caches, attached on first call (LMCache's MP load policy)."""
    out = []
    with _CACHES_LOCK:
        for core in list(_CACHES):
            lc = getattr(core, _LISTED, None)
            if lc is None:
                lc = LoadCost(core, prior_bandwidth=prior_bandwidth)
                setattr(core, _LISTED, lc)
            out.append(lc)
    return out


PLUGIN_RATE_SETTING = "load_cost_recompute_tokens_per_second"
PLUGIN_PRIOR_SETTING = "load_cost_prior_read_bytes_per_second"


class PrefixPricer:
    """The in-process plugin's prefix lookup, priced: how many leading keys are held and worth
    loading (:func:`worth_loading`), at ``tokens_per_key`` tokens recomputed at
    ``recompute_tps`` tokens per second."""

    def __init__(self, core: Any, *, tokens_per_key: int, recompute_tps: float,
                 prior_bandwidth: float = DEFAULT_PRIOR_BANDWIDTH) -> None:
        if tokens_per_key <= 0:
            raise ValueError(f"tokens_per_key must be > 0, got {tokens_per_key!r}")
        self.cost = attach(core, prior_bandwidth=prior_bandwidth)
        self.tokens_per_key = tokens_per_key
        self.recompute_tps = recompute_tps
        self._lock = threading.Lock()
        self.truncated_keys = 0  # held keys a lookup did not report: recomputing them was sooner
        self.lookups = 0

    @classmethod
    def from_settings(cls, core: Any, extra: Mapping[str, Any], prefix: str, chunk_size: int) -> PrefixPricer | None:
        """The pricer the plugin's settings ask for (``<prefix>load_cost_recompute_tokens_per_second``,
        ``<prefix>load_cost_prior_read_bytes_per_second``), None when the rate is unset (off)."""
        rate = parse_rate(extra.get(prefix + PLUGIN_RATE_SETTING), f"extra_config['{prefix}{PLUGIN_RATE_SETTING}']")
        prior = parse_rate(extra.get(prefix + PLUGIN_PRIOR_SETTING), f"extra_config['{prefix}{PLUGIN_PRIOR_SETTING}']",
                           "bytes per second")
        if rate is None:
            if prior is not None:
                raise ValueError(f"extra_config['{prefix}{PLUGIN_PRIOR_SETTING}'] = {prior!r} needs "
                                 f"extra_config['{prefix}{PLUGIN_RATE_SETTING}'] (it turns the priced lookup on)")
            return None
        return cls(core, tokens_per_key=chunk_size, recompute_tps=rate,
                   prior_bandwidth=prior or DEFAULT_PRIOR_BANDWIDTH)

    def status(self) -> dict:
        """What it decided, and each device's estimate inputs now."""
        with self._lock:
            out: dict[str, Any] = {"recompute_tokens_per_second": self.recompute_tps, "lookups": self.lookups,
                                   "truncated_keys": self.truncated_keys}
        out["devices"] = [{"device_path": d.device_path, "ahead": d.ahead(), "bandwidth": d.bandwidth,
                           "samples": d.samples, "write_bandwidth": d.write_bandwidth,
                           "write_samples": d.write_samples, "key_bytes": d.key_bytes} for d in self.cost.devices()]
        return out

    def prefix(self, encoded_keys: Sequence[str]) -> int:
        """Leading keys held and worth loading."""
        where = self.cost.locate(encoded_keys)
        held = next((i for i, d in enumerate(where) if d is None), len(where))
        n = worth_loading(where[:held], self.tokens_per_key, self.recompute_tps)
        with self._lock:
            self.lookups += 1
            self.truncated_keys += held - n
        return n
