"""Whether an LMCache virtualenv of the version matrix can run the LMCache suites.

Run by ``make lmcache-venv`` with the virtualenv's interpreter::

    .venv-lmcache-0.5.7rc2/bin/python tools/lmcache_venv_check.py LMCACHE_VERSION RUST_WHEEL_VERSION

Exit status 0 when the installed ``lmcache`` and ``lmcache-rust-raw-block-io`` are exactly the
versions given and every module the suites import loads: torch, pytest, numpy, the Rust wheel,
and LMCache's raw-block package, storage plugin and MP adapter from wherever the installed
LMCache keeps them (``lmcache_rawblock/lmcache_paths.py``, loaded from its file: the checkout's
extension may not be built yet). Otherwise status 1 and one line per problem on stderr.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _paths():
    spec = importlib.util.spec_from_file_location("_lmcache_paths", REPO / "lmcache_rawblock" / "lmcache_paths.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def problems(lmcache: str, rust: str) -> list[str]:
    out = []
    for dist, want in (("lmcache", lmcache), ("lmcache-rust-raw-block-io", rust)):
        try:
            have = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != want:
            out.append(f"{dist} is {have or 'not installed'}, the matrix wants {want}")
    if out:
        return out  # the wrong versions: importing them says nothing about the right ones
    paths = _paths()
    modules = ["torch", "pytest", "numpy", "lmcache_rust_raw_block_io", "lmcache",
               paths.raw_block_package(), paths.PLUGIN_MODULE, paths.L2_ADAPTER_MODULE]
    warnings.simplefilter("ignore")
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is the answer
            out.append(f"cannot import {name}: {type(exc).__name__}: {exc}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {sys.argv[0]} LMCACHE_VERSION RUST_WHEEL_VERSION", file=sys.stderr)
        return 2
    found = problems(*argv)
    for p in found:
        print(f"{sys.prefix}: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
