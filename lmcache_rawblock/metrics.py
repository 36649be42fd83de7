"""The tier's metrics: the core's histograms and counters in Prometheus form.

One table, :data:`METRICS`, names every metric; :func:`families` turns cores' snapshots into
metric families by it, and every exporter serves those families:

* :func:`render` - the Prometheus text exposition format (the standalone endpoint, :func:`serve`);
* :class:`Collector` - a ``prometheus_client`` collector (LMCache's in-process mode: registered
  in ``prometheus_client.REGISTRY``, which LMCache's internal API server serves at ``/metrics``,
  with labels ``device`` and ``model``); see :func:`register`;
* :func:`install_mp_metrics` - LMCache's MP mode: OpenTelemetry observable instruments on the
  global meter provider the MP server configures (OTLP push or its Prometheus pull port), and
  the same collector in ``prometheus_client.REGISTRY``.

Latency histograms are in seconds, their buckets the powers of two of nanoseconds from 1.024 µs
to 34.4 s (the core's buckets nest inside them, so each cumulative count is exact); size
histograms in bytes, powers of two from 1 KiB to 16 GiB. Counters end in ``_total``.
"""

from __future__ import annotations

import http.server
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

PREFIX = "lmcache_rawblock_"
LABELS = ("device", "model")

# (name, type, help, extra labels). Histograms named *_seconds are latencies (the core's
# nanoseconds); *_bytes histograms sizes. The order is the order served.
METRICS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("put_seconds", "histogram", "Time of one put_many call", ()),
    ("load_seconds", "histogram", "Time of one load_many_into call", ()),
    ("delete_seconds", "histogram", "Time of one delete_many call", ()),
    ("checkpoint_seconds", "histogram", "Time of one checkpoint that wrote metadata", ()),
    ("compaction_seconds", "histogram", "Time of one metadata-log compaction (a base written)", ()),
    ("deallocation_seconds", "histogram", "Time of one deallocation run over freed slots", ()),
    ("validation_seconds", "histogram", "Time of one slot-header validation pass", ()),
    ("io_queue_wait_seconds", "histogram", "io_uring batch: handed to the engine until the kernel took it", ()),
    ("io_device_seconds", "histogram", "io_uring batch: taken by the kernel until its last completion", ()),
    ("put_bytes", "histogram", "Payload bytes of one put_many call", ()),
    ("load_bytes", "histogram", "Payload bytes one load_many_into call served", ()),
    ("inflight_bytes", "histogram", "Bytes of loads and puts in flight, seen as each call begins", ()),
    ("inflight_peak_bytes", "gauge", "Most bytes of loads and puts in flight at once", ()),
    ("load_hits_total", "counter", "Keys a load served", ()),
    ("load_misses_total", "counter", "Keys a load did not serve, by reason", ("reason",)),
    ("evictions_total", "counter", "Entries that left the index, by cause", ("cause",)),
    ("read_bytes_total", "counter", "Bytes the device read completed (data and metadata)", ()),
    ("written_bytes_total", "counter", "Bytes the device write completed (data and metadata)", ()),
    ("io_errors_total", "counter", "Device transfers that failed (the fault journal)", ()),
    ("capacity_bytes", "gauge", "Bytes of the device the cache may use", ()),
    ("slots", "gauge", "Slots of the cache", ()),
    ("free_slots", "gauge", "Slots free for a put", ()),
    ("indexed_keys", "gauge", "Keys in the index", ()),
)

MISS_REASONS = ("absent", "evicted", "refused_header", "checksum", "device_error")
# cause -> where the count comes from: the snapshot's "deleted", or a status() key
EVICTION_CAUSES = (("deleted", None), ("refused_header", "load_rejected_entries"),
                   ("checksum", "payload_checksum_dropped_entries"), ("writeback_failure", "writeback_dropped_entries"),
                   ("device_shrank", "shrink_dropped_entries"), ("validation", "recovery_dropped_entries"))
_NATIVE_HIST = {"put_seconds": "put_ns", "load_seconds": "load_ns", "delete_seconds": "delete_ns",
                "checkpoint_seconds": "checkpoint_ns", "compaction_seconds": "compaction_ns",
                "deallocation_seconds": "dealloc_ns", "validation_seconds": "validate_ns",
                "io_queue_wait_seconds": "queue_wait_ns", "io_device_seconds": "device_ns",
                "put_bytes": "put_bytes", "load_bytes": "load_bytes", "inflight_bytes": "inflight_bytes"}
TIME_BOUNDS = tuple(1 << k for k in range(10, 36))  # ns: 1.024 µs .. 34.4 s
SIZE_BOUNDS = tuple(1 << k for k in range(10, 35))  # bytes: 1 KiB .. 16 GiB


def _native_of(core: Any) -> Any:
    return getattr(core, "_native", core)


def snapshot(core: Any) -> dict:
    """One core's figures: ``histograms()`` of the native core plus what ``status()`` adds
    (evictions by cause, fill, device bytes). Works on a RawBlockCore or its ``_native``."""
    n = _native_of(core)
    h = n.histograms()
    st = n.status()
    io = st.get("io") or {}
    ev = {cause: (h["deleted"] if key is None else int(st.get(key) or 0)) for cause, key in EVICTION_CAUSES}
    return {**h, "evictions": ev, "status": {
        "max_slots": int(st["max_slots"]), "free_slots": _free_slots(st), "indexed_keys": int(st["indexed_key_count"]),
        "read_bytes": int(io.get("read_completed_bytes", 0)), "written_bytes": int(io.get("write_completed_bytes", 0)),
        "io_errors": int(st.get("faults_total", 0)), "capacity": int(st.get("capacity_bytes", 0)),
        "closed": bool(st.get("closed"))}}


def _free_slots(st: dict) -> int:
    """Slots a put may take now: free ones plus the never-used ones inside the device."""
    fresh = max(0, int(st.get("usable_slots", st["max_slots"])) - int(st["next_slot"]))
    return int(st["free_slot_count"]) + fresh


def cumulative(buckets: Sequence[Sequence[int]], bounds: Sequence[int]) -> list[int]:
    """Cumulative counts of the native buckets ((exclusive upper, count) pairs) at each bound:
    the samples below it. Every bound is a native bucket edge, so each count is exact."""
    out, acc, i = [], 0, 0
    b = sorted((int(u), int(c)) for u, c in buckets)
    for bound in bounds:
        while i < len(b) and b[i][0] <= bound:
            acc += b[i][1]
            i += 1
        out.append(acc)
    return out


def quantile(hist: dict, q: float) -> float | None:
    """The q-quantile of a native histogram (its unit), interpolated inside the bucket that holds
    it (log-linear buckets: within 25 %); None when it holds no sample."""
    total = int(hist["count"])
    if not total:
        return None
    rank = q * total
    lo, acc = 0, 0
    for up, c in sorted((int(u), int(c)) for u, c in hist["buckets"]):
        lo = _lower(up)
        if acc + c >= rank:
            return lo + (up - lo) * max(0.0, rank - acc) / c
        acc += c
    return float(lo)


def _lower(up: int) -> int:
    """The inclusive lower edge of the native bucket whose exclusive upper edge is up."""
    if up <= 4:
        return up - 1
    msb = up.bit_length() - 1
    if up == 1 << msb:  # (8 << (m - 2)) ends the octave: the bucket [7 << (m - 3), 8 << (m - 3))
        return up - (up >> 3)
    return up - (1 << (msb - 2))


@dataclass
class Family:
    name: str
    type: str
    help: str
    samples: list[tuple[str, dict, float]] = field(default_factory=list)


def _hist_samples(fam: Family, hist: dict, labels: dict, seconds: bool) -> None:
    bounds = TIME_BOUNDS if seconds else SIZE_BOUNDS
    scale = 1e-9 if seconds else 1.0
    for bound, cnt in zip(bounds, cumulative(hist["buckets"], bounds)):
        fam.samples.append((fam.name + "_bucket", {**labels, "le": _fmt(bound * scale)}, cnt))
    fam.samples.append((fam.name + "_bucket", {**labels, "le": "+Inf"}, int(hist["count"])))
    fam.samples.append((fam.name + "_count", labels, int(hist["count"])))
    fam.samples.append((fam.name + "_sum", labels, int(hist["sum"]) * scale))


def _scalar(name: str, snap: dict, extra: dict) -> float:
    st = snap["status"]
    table: dict[str, Callable[[], float]] = {
        "inflight_peak_bytes": lambda: snap["peak_inflight_bytes"], "load_hits_total": lambda: snap["hits"],
        "load_misses_total": lambda: snap["misses"][extra["reason"]],
        "evictions_total": lambda: snap["evictions"][extra["cause"]], "read_bytes_total": lambda: st["read_bytes"],
        "written_bytes_total": lambda: st["written_bytes"], "io_errors_total": lambda: st["io_errors"],
        "capacity_bytes": lambda: st["capacity"], "slots": lambda: st["max_slots"],
        "free_slots": lambda: st["free_slots"], "indexed_keys": lambda: st["indexed_keys"]}
    return table[name]()


def _extra_values(labels: tuple[str, ...]) -> list[dict]:
    if labels == ("reason",):
        return [{"reason": r} for r in MISS_REASONS]
    if labels == ("cause",):
        return [{"cause": c} for c, _ in EVICTION_CAUSES]
    return [{}]


def families(sources: Iterable[tuple[dict, dict]]) -> list[Family]:
    """The families of METRICS over (labels, snapshot) pairs (labels: device and model)."""
    srcs = list(sources)
    out = []
    for name, typ, doc, extra in METRICS:
        fam = Family(PREFIX + name, typ, doc)
        for labels, snap in srcs:
            if typ == "histogram":
                _hist_samples(fam, snap["histograms"][_NATIVE_HIST[name]], labels, name.endswith("_seconds"))
                continue
            for ex in _extra_values(extra):
                fam.samples.append((fam.name, {**labels, **ex}, _scalar(name, snap, ex)))
        out.append(fam)
    return out


def _fmt(v: float) -> str:
    return repr(float(v)) if v != int(v) or abs(v) >= 1e15 else f"{int(v)}.0"


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(fams: Iterable[Family]) -> str:
    """The Prometheus text exposition format (version 0.0.4) of fams."""
    lines = []
    for f in fams:
        lines.append(f"# HELP {f.name} {f.help}")
        lines.append(f"# TYPE {f.name} {f.type}")
        for name, labels, value in f.samples:
            lab = ",".join(f'{k}="{_esc(str(v))}"' for k, v in labels.items())
            lines.append(f"{name}{{{lab}}} {_fmt(value) if isinstance(value, float) else value}")
    return "\n".join(lines) + "\n"


def parts(core: Any, labels: dict) -> list[tuple[Any, dict]]:
    """The single-device cores behind core, each with its labels: core itself, or for a cache
    over several devices (``MultiDeviceCore``) each device online now, labelled by its path (a
    failed device has no series until it is reopened; a reopened one serves its new core's)."""
    if core is None:
        return []
    cores = getattr(core, "device_cores", None)
    if cores is None:
        return [(core, labels)]
    return [(c, {**labels, "device": path}) for c, path in zip(cores(), core.device_paths) if c is not None]


# ---- sources: the cores an exporter serves -----------------------------------------------


class Sources:
    """Cores and their labels, held weakly: a core that is gone drops out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[weakref.ref, dict]] = []

    def add(self, core: Any, device: str, model: str = "") -> None:
        with self._lock:
            self._items.append((weakref.ref(core), {"device": str(device), "model": str(model)}))

    def remove(self, core: Any) -> None:
        with self._lock:
            self._items = [(r, lab) for r, lab in self._items if r() is not None and r() is not core]

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for r, _ in self._items if r() is not None)

    def snapshots(self) -> list[tuple[dict, dict]]:
        with self._lock:
            items = [(r(), lab) for r, lab in self._items]
        out = []
        for core, lab in items:
            for part, part_lab in parts(core, lab):
                try:
                    out.append((part_lab, snapshot(part)))
                except RuntimeError:  # closed and freed meanwhile
                    continue
        return out

    def families(self) -> list[Family]:
        return families(self.snapshots())


class Collector:
    """A ``prometheus_client`` collector of Sources (``REGISTRY.register(Collector(s))``)."""

    def __init__(self, sources: Sources):
        self.sources = sources

    def describe(self) -> list:
        return []  # unchecked collector: names are checked against METRICS by the tests

    def collect(self) -> Iterable[Any]:
        from prometheus_client.metrics_core import Metric

        for f in self.sources.families():
            name = f.name[:-len("_total")] if f.type == "counter" else f.name
            m = Metric(name, f.help, f.type)
            for sname, labels, value in f.samples:
                m.add_sample(sname, {k: str(v) for k, v in labels.items()}, float(value))
            yield m


# ---- LMCache in-process mode: one collector in prometheus_client.REGISTRY per process ------

_PROCESS_SOURCES = Sources()
_process_lock = threading.Lock()
_process_collector: Collector | None = None


def register(core: Any, device: str, model: str = "", registry: Any = None) -> Callable[[], None]:
    """Serve core's metrics from ``prometheus_client``'s registry (default REGISTRY, which
    LMCache's internal API server serves at /metrics) under labels device and model; returns the
    function that stops serving it. Does nothing (returns a no-op) without prometheus_client."""
    global _process_collector
    try:
        import prometheus_client
    except ImportError:
        return lambda: None
    with _process_lock:
        _PROCESS_SOURCES.add(core, device, model)
        if _process_collector is None:
            _process_collector = Collector(_PROCESS_SOURCES)
            (registry or prometheus_client.REGISTRY).register(_process_collector)
    return lambda: _PROCESS_SOURCES.remove(core)


def process_sources() -> Sources:
    """The cores this process serves through :func:`register`."""
    return _PROCESS_SOURCES


# ---- standalone endpoint -------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    sources: Sources

    def do_GET(self) -> None:
        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is served")
            return
        body = render(self.sources.families()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def serve(sources: Sources, port: int = 0, addr: str = "127.0.0.1") -> http.server.ThreadingHTTPServer:
    """A standalone /metrics endpoint on addr:port (0: any free port; ``server_address`` says
    which) serving sources from a daemon thread; ``shutdown()`` and ``server_close()`` stop it."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
    handler = type("RawBlockMetricsHandler", (_Handler,), {"sources": sources})
    srv = http.server.ThreadingHTTPServer((addr, port), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="rawblock-metrics", daemon=True).start()
    return srv


def attach_inprocess(core: Any, device: str, metadata: Any = None) -> Callable[[], None]:
    """LMCache's in-process mode (the storage plugin): serve core's metrics from
    ``prometheus_client.REGISTRY`` under its device and LMCache's model name, and publish its
    live figures for ``python -m lmcache_rawblock stats`` (lmcache_rawblock.livestats). Returns
    the function that undoes both."""
    from . import livestats

    model = str(getattr(metadata, "model_name", "") or "") if metadata is not None else ""
    undo = register(core, device, model)
    pub = livestats.publish(core, device)

    def detach() -> None:
        pub.stop()
        undo()
    return detach


# ---- LMCache's MP mode: OpenTelemetry, as LMCache's own L2 metrics ----------------------------

MP_PREFIX = "lmcache_mp.l2_raw_block_"
_MP_OPS = ("put", "load", "delete", "checkpoint", "compaction", "deallocation", "validation", "io_queue_wait",
           "io_device")
_mp_lock = threading.Lock()
_MP_SOURCES = Sources()
_mp_installed: set[int] = set()


def _obs(make: Callable[..., Any], rows_of: Callable[[], list[tuple[float, dict]]]) -> Callable[..., Any]:
    def cb(options: Any = None) -> Iterable[Any]:
        return [make(v, attrs) for v, attrs in rows_of()]
    return cb


def _mp_series(sources: Sources) -> dict[str, Callable[[], list[tuple[float, dict]]]]:
    """OTel instrument name -> the (value, attributes) observations of every core served."""
    def attrs(lab: dict, **more: str) -> dict:
        return {"l2_name": "raw_block", "device": lab["device"], **more}

    def per_op(fn: Callable[[dict], float]) -> Callable[[], list[tuple[float, dict]]]:
        return lambda: [(fn(snap["histograms"][_NATIVE_HIST[op + "_seconds"]]), attrs(lab, op=op))
                        for lab, snap in sources.snapshots() for op in _MP_OPS]

    def q(p: float) -> Callable[[dict], float]:
        return lambda h: (quantile(h, p) or 0.0) * 1e-9

    return {
        "ops": per_op(lambda h: h["count"]),
        "op_seconds": per_op(lambda h: h["sum"] * 1e-9),
        "op_p50_seconds": per_op(q(0.5)),
        "op_p99_seconds": per_op(q(0.99)),
        "load_hits": lambda: [(s["hits"], attrs(lab)) for lab, s in sources.snapshots()],
        "load_misses": lambda: [(n, attrs(lab, reason=r)) for lab, s in sources.snapshots()
                                for r, n in s["misses"].items()],
        "evictions": lambda: [(n, attrs(lab, cause=c)) for lab, s in sources.snapshots()
                              for c, n in s["evictions"].items()],
        "free_slots": lambda: [(s["status"]["free_slots"], attrs(lab)) for lab, s in sources.snapshots()],
        "inflight_peak_bytes": lambda: [(s["peak_inflight_bytes"], attrs(lab)) for lab, s in sources.snapshots()],
    }


def install_mp_metrics(sources: Sources, meter_provider: Any = None) -> bool:
    """Observable OpenTelemetry instruments over sources on the meter provider (default the
    global one LMCache's MP server configures): counters ``lmcache_mp.l2_raw_block_ops`` and
    ``..._op_seconds`` per ``op``, gauges of each op's p50 and p99, counters of load hits,
    misses per ``reason`` and evictions per ``cause``, gauges of free slots and peak bytes in
    flight; attributes ``l2_name`` and ``device``. False when OpenTelemetry is missing."""
    try:
        from opentelemetry import metrics as otel
        from opentelemetry.metrics import Observation
    except ImportError:
        return False
    meter = (meter_provider or otel.get_meter_provider()).get_meter("lmcache.l2.raw_block")
    counters = {"ops": "calls", "op_seconds": "s", "load_hits": "keys", "load_misses": "keys", "evictions": "keys"}
    for name, rows in _mp_series(sources).items():
        cb = _obs(Observation, rows)
        if name in counters:
            meter.create_observable_counter(MP_PREFIX + name, callbacks=[cb], unit=counters[name])
        else:
            meter.create_observable_gauge(MP_PREFIX + name, callbacks=[cb])
    return True


def attach_mp(core: Any, device: str) -> Callable[[], None]:
    """LMCache's MP mode (the L2 adapter): core's figures through LMCache's MP observability (the
    OpenTelemetry instruments of :func:`install_mp_metrics` on the global meter provider, set up
    once a process) and in ``prometheus_client.REGISTRY``, which the MP server's Prometheus pull
    port serves; and its live figures for ``python -m lmcache_rawblock stats``. Returns the
    function that stops serving the core."""
    with _mp_lock:
        _MP_SOURCES.add(core, device, "")
        if id(_MP_SOURCES) not in _mp_installed:
            install_mp_metrics(_MP_SOURCES)
            _mp_installed.add(id(_MP_SOURCES))
    from . import livestats

    undo = register(core, device, "")
    pub = livestats.publish(core, device)  # stops by itself once the core is closed

    def detach() -> None:
        pub.stop()
        _MP_SOURCES.remove(core)
        undo()
    return detach
