"""Helpers shared by the benchmark parts: sizes, formatting, statistics, interleaved rounds,
scratch files, the machine and source description, competitor discovery and progress bars.

Conventions used throughout the results:

* times are seconds internally and microseconds (``*_us``) in reports;
* ``ratio`` is always *ours / rust* of a time, so lower is better and 1.0 is parity
  (for throughput rows the time ratio equals rust throughput / our throughput);
* every figure is the median over the repeat rounds, and both implementations are
  measured alternately inside each round so that machine drift hits both.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import importlib.metadata as _md
import mmap
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

RUST_DIST = "lmcache-rust-raw-block-io"
# The versions --install-competitors installs: the newest line of the Makefile's LMCACHE_MATRIX
# (tests/package/test_lmcache_matrix.py keeps them equal).
RUST_VERSION = "0.5.7rc2"
LMCACHE_VERSION = "0.5.7rc2"
RUST_MODULE = "lmcache_rust_raw_block_io"
RUST_PIP = f"pip install {RUST_DIST}=={RUST_VERSION}"

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB}


def parse_size(text: str) -> int:
    """Parse ``4096``, ``4k``, ``64K``, ``1M``, ``256MiB``, ``4G``, ``1.5G`` into bytes.

    Suffixes are binary (K = 1024). Raises ValueError naming the value on anything else,
    including zero and negative sizes.
    """
    if not isinstance(text, str):
        raise ValueError(f"invalid size {text!r}: expected a string such as 4k, 256M or 1G")
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(
            f"invalid size {text!r}: expected a positive number with an optional K/M/G/T suffix "
            "(binary units), e.g. 4k, 256M, 1G"
        )
    number, unit, rest = m.groups()
    if rest.lower() == "i":  # "4ki" is not a unit
        raise ValueError(f"invalid size {text!r}: unknown unit suffix {unit + rest!r}")
    value = float(number) * _UNITS[unit.lower()]
    if value != int(value):
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    if int(value) <= 0:
        raise ValueError(f"invalid size {text!r}: must be greater than zero")
    return int(value)


def fmt_size(n: int) -> str:
    """4096 -> '4 KiB', 1048576 -> '1 MiB', 1536 -> '1536 B'."""
    for unit, div in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def fmt_us(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    us = seconds * 1e6
    if us >= 1000:
        return f"{us:,.0f}"
    if us >= 100:
        return f"{us:.1f}"
    return f"{us:.2f}"


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def fmt_rate(bytes_per_s: float | None) -> str:
    if bytes_per_s is None:
        return "-"
    return f"{bytes_per_s / MiB:,.0f} MiB/s"


def fmt_time(sec: float | None) -> str:
    """0.0000123 -> '12.3 µs', 0.0123 -> '12.30 ms', 1.5 -> '1.50 s'."""
    if sec is None:
        return "-"
    if sec < 1e-3:
        return f"{sec * 1e6:.1f} µs"
    if sec < 1:
        return f"{sec * 1e3:.2f} ms"
    return f"{sec:.2f} s"


def fmt_x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def median(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def spread(values: Sequence[float]) -> float | None:
    """Relative interquartile spread (IQR / median); None with fewer than 3 values."""
    vals = sorted(v for v in values if v is not None)
    if len(vals) < 3:
        return None
    q = statistics.quantiles(vals, n=4, method="inclusive")
    med = statistics.median(vals)
    return (q[2] - q[0]) / med if med else None


def ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or theirs <= 0:
        return None
    return ours / theirs


def aligned_buffer(size: int) -> memoryview:
    """A writable, page-aligned buffer (anonymous mmap), good for O_DIRECT."""
    return memoryview(mmap.mmap(-1, max(size, mmap.PAGESIZE)))[:size]


def interleaved_order(round_index: int, names: Sequence[Any]) -> list[Any]:
    """Alternate the order of the implementations from one repeat round to the next."""
    names = list(names)
    return names if round_index % 2 == 0 else names[::-1]


def interleave(names: Sequence[str], rounds: int, measure: Callable[[str, int], float]) -> dict[str, list[float]]:
    """``measure(name, round)`` for every name in every round, the order alternating from round
    to round so that drift of a shared machine hits every implementation alike."""
    samples: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(rounds):
        for name in interleaved_order(rnd, names):
            samples[name].append(measure(name, rnd))
    return samples


def sparse(path: str, size: int) -> str:
    """Create (or truncate) a sparse file of *size* bytes; returns the path."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def remove_file(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# --------------------------------------------------------------------------- competitors


@dataclass
class Competitor:
    """One implementation under test (ours, or an optional competitor)."""

    name: str
    dist: str
    module: str
    cls: Any = None
    version: str | None = None
    error: str | None = None
    install: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.cls is not None

    def describe(self) -> dict:
        return {"name": self.name, "distribution": self.dist, "module": self.module, "available": self.available,
                "version": self.version, "error": self.error, "install": self.install}


def _dist_version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def ours() -> Competitor:
    from lmcache_rawblock import RawBlockDevice, __version__

    return Competitor(
        name="ours",
        dist="lmcache-rawblock",
        module="lmcache_rawblock._native",
        cls=RawBlockDevice,
        version=__version__,
    )


def rust() -> Competitor:
    """The published Rust wheel, never our compat shim registered under its name."""
    comp = Competitor(name="rust", dist=RUST_DIST, module=RUST_MODULE)
    shim = sys.modules.get(RUST_MODULE)
    if shim is not None and getattr(shim, "__lmcache_rawblock__", False):
        comp.error = "lmcache_rawblock.compat shim is installed in this process; the Rust wheel is hidden"
        return comp
    try:
        mod = importlib.import_module(RUST_MODULE)
    except ImportError as exc:
        comp.error = f"not installed ({exc.__class__.__name__}: {exc})"
        comp.install = RUST_PIP
        return comp
    cls = getattr(mod, "RawBlockDevice", None)
    if cls is None:
        comp.error = f"{RUST_MODULE} has no RawBlockDevice"
        return comp
    comp.cls = cls
    comp.version = _dist_version(RUST_DIST) or getattr(mod, "__version__", None)
    return comp


def pip_install(cmd: list[str], timeout: float, run: Callable[..., Any] = subprocess.run) -> str | None:
    """Run one pip command; None on success, else what went wrong (never raises)."""
    try:
        proc = run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(cmd)} failed: {exc}"
    importlib.invalidate_caches()
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        return f"{' '.join(cmd)} exited {proc.returncode}: {' | '.join(tail)}"
    return None


def install_competitors(run: Callable[..., Any] = subprocess.run) -> tuple[bool, str]:
    """``python -m pip install lmcache-rust-raw-block-io==RUST_VERSION`` with this interpreter.

    Returns (ok, message); never raises, so the benchmark carries on without the wheel.
    """
    err = pip_install([sys.executable, "-m", "pip", "install", "-q", f"{RUST_DIST}=={RUST_VERSION}"], 600, run)
    if err:
        return False, err
    return True, f"installed {RUST_DIST} {_dist_version(RUST_DIST) or ''}".strip()


# --------------------------------------------------------------------------- machine


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _cpu_model() -> str | None:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _mem_total() -> int | None:
    text = _read("/proc/meminfo") or ""
    m = re.search(r"^MemTotal:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(m.group(1)) * KiB if m else None


def _os_release() -> str | None:
    text = _read("/etc/os-release") or ""
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.MULTILINE)
    return m.group(1) if m else None


def _tool_version(argv: list[str]) -> str | None:
    if not shutil.which(argv[0]):
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else None


def machine_info(argv: Sequence[str] | None = None) -> dict:
    """Describe the machine and software the results were taken on."""
    packages = {}
    for dist in ("lmcache-rawblock", RUST_DIST, "numpy", "tqdm", "matplotlib"):
        packages[dist] = _dist_version(dist)
    try:
        from lmcache_rawblock import __version__ as ours_version

        packages["lmcache-rawblock"] = packages["lmcache-rawblock"] or ours_version
    except ImportError:
        pass
    return {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(argv) if argv is not None else list(sys.argv),
        "hostname": platform.node(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_bytes": _mem_total(),
        "os": _os_release(),
        "debian_version": (_read("/etc/debian_version") or "").strip() or None,
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "python_executable": sys.executable,
        "packages": packages,
        "fio": _tool_version(["fio", "--version"]),
        "source": source_info(),
    }


def source_info() -> dict | None:
    """Which code the figures belong to: the git commit of the checkout lmcache_rawblock is
    imported from, the tracked files that differ from it, and when the extension was built.
    None for an installed package outside a git checkout."""
    try:
        import lmcache_rawblock._native as native
    except ImportError:
        return None
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(native.__file__)))

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", pkg, *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.rstrip("\n") if proc.returncode == 0 else None

    built = _dt.datetime.fromtimestamp(os.path.getmtime(native.__file__), _dt.timezone.utc)
    info: dict[str, Any] = {"extension_built": built.isoformat(timespec="seconds"), "commit": None,
                            "modified": []}
    top = git("rev-parse", "--show-toplevel")
    commit = git("rev-parse", "HEAD") if top and os.path.realpath(top) == os.path.realpath(pkg) else None
    if commit:
        info["commit"] = commit
        status = git("status", "--porcelain", "--untracked-files=no", "--", "csrc", "lmcache_rawblock",
                     "benchmarks/lmcache_rawblock_bench") or ""
        info["modified"] = [line[3:] for line in status.splitlines() if len(line) > 3]
    return info


def machine_summary(m: dict) -> str:
    mem = m.get("memory_bytes")
    mem_s = f"{mem / GiB:.0f} GiB" if mem else "? GiB"
    return (
        f"{m.get('os') or 'unknown OS'} (debian {m.get('debian_version') or '-'}), kernel {m.get('kernel')}, "
        f"{m.get('cpu_model') or 'unknown CPU'}, {m.get('cores')} cores, {mem_s} RAM, "
        f"Python {m.get('python')}"
    )


# --------------------------------------------------------------------------- progress


class _NullBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_description_str(self, s: str, refresh: bool = True) -> None:
        pass

    def write(self, s: str) -> None:
        print(s, file=sys.stderr)

    def close(self) -> None:
        pass


@contextlib.contextmanager
def progress(total: int, desc: str, enabled: bool = True) -> Iterator[Any]:
    """A tqdm bar when tqdm is importable and enabled, else a silent stand-in."""
    bar: Any = _NullBar()
    if enabled:
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, desc=desc, unit="step", leave=False, dynamic_ncols=True)
        except ImportError:
            pass
    try:
        yield bar
    finally:
        bar.close()
