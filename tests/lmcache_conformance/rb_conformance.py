"""pytest plugin that runs LMCache's own raw-block tests against one of three stacks.

Loaded with ``-p rb_conformance`` (this directory on ``PYTHONPATH``) from ``run.py``. The mode
comes from ``RB_CONFORMANCE_MODE``:

``baseline``
    LMCache as installed: its Python ``RawBlockCore`` / ``RustRawBlockBackend`` on the Rust
    wheel's ``RawBlockDevice``. Nothing is substituted.
``compat``
    LMCache's Python stack on our device: ``lmcache_rawblock.compat.install()`` runs when this
    plugin is imported, before any conftest or test module can import the Rust module.
``native``
    Our stack in full: ``compat.install()`` as above, then every class and function our
    ``lmcache_rawblock.raw_block`` package exports replaces the object of the same name in
    LMCache's ``raw_block`` package, and our ``lmcache_rawblock.plugin.RustRawBlockBackend``
    replaces LMCache's plugin class. The replacement is done on every already imported
    ``lmcache.*`` module global that holds LMCache's object, so modules that did
    ``from ...raw_block import RawBlockCore`` before the test modules are collected see ours,
    and modules imported later pick ours up from the patched package.

Proof that the substitution is in effect: constructors of both implementations (and the device
LMCache's core opens) are counted, and at the end of the session this plugin checks, per mode,
that the expected classes were constructed and the others never were, and that no test or
LMCache module still holds an object the mode replaced. A failed check makes the session fail
and is written, with the per-test outcomes, to the JSON file named by ``RB_CONFORMANCE_RECORD``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

MODES = ("baseline", "compat", "native")
MODE = os.environ.get("RB_CONFORMANCE_MODE", "")
RECORD_PATH = os.environ.get("RB_CONFORMANCE_RECORD", "")
REPO_ROOT = Path(__file__).resolve().parents[2]
RUST_MODULE = "lmcache_rust_raw_block_io"



def _lmcache_paths() -> types.ModuleType:
    """lmcache_rawblock.lmcache_paths, loaded from its file: the baseline mode must not import our
    package (its ``__init__`` loads the C extension), and the module imports nothing of ours."""
    path = REPO_ROOT / "lmcache_rawblock" / "lmcache_paths.py"
    spec = importlib.util.spec_from_file_location("_rb_conformance_lmcache_paths", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_paths = _lmcache_paths()
LMC_RAW_BLOCK = _paths.raw_block_package()  # where the installed LMCache version has it
LMC_PLUGIN = _paths.PLUGIN_MODULE
LMC_L2 = _paths.L2_ADAPTER_MODULE

constructed: Counter[str] = Counter()  # "<impl>.<Class>" -> constructions
devices: Counter[str] = Counter()  # device types LMCache's core opened through _rawdev()
substituted: dict[str, str] = {}  # name -> "ours" (native mode)
replaced_globals: list[str] = []  # "module.name" rebound at start-up
outcomes: dict[str, str] = {}  # nodeid -> passed / failed / error / skipped
_replaced_ids: dict[int, Any] = {}  # id -> LMCache object the mode replaced (kept alive)


def _type_name(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _count_init(cls: type, label: str) -> None:
    """Count constructions of ``cls`` under ``label`` without changing the class's identity."""
    orig = cls.__dict__.get("__init__", cls.__init__)

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):  # noqa: N807
        constructed[label] += 1
        return orig(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]


def _count_rawdev(core_cls: type) -> None:
    """Record the device type LMCache's core opens (its lazy ``_rawdev()``)."""
    orig = core_cls._rawdev

    @functools.wraps(orig)
    def _rawdev(self):
        dev = orig(self)
        devices[_type_name(dev)] += 1
        return dev

    core_cls._rawdev = _rawdev


def _instrument_lmcache() -> None:
    import importlib

    core_mod = importlib.import_module(f"{LMC_RAW_BLOCK}.core")
    plugin_mod = importlib.import_module(LMC_PLUGIN)
    l2_mod = importlib.import_module(LMC_L2)
    _count_init(core_mod.RawBlockCore, "lmcache.RawBlockCore")
    _count_rawdev(core_mod.RawBlockCore)
    _count_init(plugin_mod.RustRawBlockBackend, "lmcache.RustRawBlockBackend")
    _count_init(l2_mod.RawBlockL2Adapter, "lmcache.RawBlockL2Adapter")


def _instrument_ours() -> None:
    from lmcache_rawblock import plugin
    from lmcache_rawblock.raw_block import core

    _count_init(core.RawBlockCore, "ours.RawBlockCore")
    _count_init(plugin.RustRawBlockBackend, "ours.RustRawBlockBackend")


def _substitute_native() -> None:
    import importlib

    import lmcache_rawblock.raw_block as ours
    from lmcache_rawblock.plugin import RustRawBlockBackend as OurPlugin

    lmc = importlib.import_module(LMC_RAW_BLOCK)
    plugin_mod = importlib.import_module(LMC_PLUGIN)
    importlib.import_module(LMC_L2)
    mapping: dict[int, tuple[Any, Any, str]] = {}
    for name in ours.__all__:
        if not hasattr(lmc, name):
            continue  # ours only (e.g. RawBlockCloseOutcome): nothing to replace
        theirs, mine = getattr(lmc, name), getattr(ours, name)
        if theirs is mine:
            continue  # we re-export LMCache's own object (e.g. an enum)
        if not callable(theirs):
            # Constants are compared, not replaced: a small int is shared by every module.
            if theirs != mine:
                raise RuntimeError(f"native: {name} differs: LMCache {theirs!r}, ours {mine!r}")
            continue
        mapping[id(theirs)] = (theirs, mine, name)
    theirs_plugin = plugin_mod.RustRawBlockBackend
    mapping[id(theirs_plugin)] = (theirs_plugin, OurPlugin, "RustRawBlockBackend")
    for theirs, mine, name in mapping.values():
        substituted[name] = f"{mine.__module__}.{mine.__qualname__}"
        _replaced_ids[id(theirs)] = theirs
    for modname, mod in list(sys.modules.items()):
        if not (modname == "lmcache" or modname.startswith("lmcache.")) or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            hit = mapping.get(id(value))
            if hit is not None and hit[0] is value:
                setattr(mod, attr, hit[1])
                replaced_globals.append(f"{modname}.{attr}")


def _start() -> None:
    if MODE not in MODES:
        raise pytest.UsageError(f"RB_CONFORMANCE_MODE must be one of {MODES}, got {MODE!r}")
    if MODE in ("compat", "native"):
        if str(REPO_ROOT) not in sys.path:
            sys.path.append(str(REPO_ROOT))
        if RUST_MODULE in sys.modules:
            raise pytest.UsageError(f"{RUST_MODULE} was imported before the {MODE} substitution")
        import lmcache_rawblock.compat as compat

        compat.install()
        _instrument_ours()
    _instrument_lmcache()
    if MODE == "native":
        _substitute_native()


_start()


# --------------------------------------------------------------------------- outcomes


def pytest_collectreport(report):
    if report.failed:
        outcomes[report.nodeid or "<collection>"] = "error"


def pytest_runtest_logreport(report):
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            outcome = "skipped" if report.skipped else "passed"
        else:
            outcome = report.outcome
    elif report.failed:
        outcome = "error"
    elif report.skipped:
        outcome = "skipped"
    else:
        outcome = "passed"
    prev = outcomes.get(report.nodeid)
    if prev is None or rank[outcome] > rank[prev]:
        outcomes[report.nodeid] = outcome


# --------------------------------------------------------------------------- proof


def _is_rust_device_type(name: str) -> bool:
    """``module.qualname`` of the Rust wheel's device class (PyO3 reports it as ``builtins``)."""
    module, _, qualname = name.rpartition(".")
    return module.split(".")[0] == RUST_MODULE or (module == "builtins" and qualname == "RawBlockDevice")


def _rust_device_module(value: Any) -> bool:
    """The Rust wheel's module or device class (anything of that name that is not ours)."""
    if getattr(value, "__lmcache_rawblock__", False):
        return False
    if isinstance(value, types.ModuleType):
        return value.__name__.split(".")[0] == RUST_MODULE
    if isinstance(value, type):
        return _is_rust_device_type(f"{value.__module__}.{value.__qualname__}")
    return False


def _leaks() -> list[str]:
    """Globals of test and LMCache modules that still hold an object this mode replaced."""
    found = []
    for modname, mod in list(sys.modules.items()):
        if mod is None or not (modname.startswith(("tests.", "lmcache.")) or modname == "lmcache"):
            continue
        for attr, value in list(vars(mod).items()):
            if MODE == "native" and id(value) in _replaced_ids and _replaced_ids[id(value)] is value:
                found.append(f"{modname}.{attr}")
            elif MODE in ("compat", "native") and _rust_device_module(value):
                found.append(f"{modname}.{attr}")
    if MODE in ("compat", "native") and not getattr(sys.modules.get(RUST_MODULE), "__lmcache_rawblock__", False):
        found.append(f"sys.modules[{RUST_MODULE!r}] is not lmcache_rawblock's module")
    return found


def check() -> list[str]:
    """Per-mode proof; returns the problems found (empty when the mode was in effect)."""
    problems = []

    def need(label: str) -> None:
        if constructed[label] == 0:
            problems.append(f"{label} was never constructed")

    def never(label: str) -> None:
        if constructed[label]:
            problems.append(f"{label} was constructed {constructed[label]} times")

    ours_dev = sum(n for t, n in devices.items() if t.startswith("lmcache_rawblock."))
    rust_dev = sum(n for t, n in devices.items() if _is_rust_device_type(t))
    if MODE == "baseline":
        need("lmcache.RawBlockCore")
        need("lmcache.RustRawBlockBackend")
        if rust_dev == 0:
            problems.append("LMCache's core never opened the Rust wheel's RawBlockDevice")
        if RUST_MODULE in sys.modules and getattr(sys.modules[RUST_MODULE], "__lmcache_rawblock__", False):
            problems.append("the Rust module was replaced in baseline mode")
    elif MODE == "compat":
        need("lmcache.RawBlockCore")
        need("lmcache.RustRawBlockBackend")
        never("ours.RawBlockCore")
        never("ours.RustRawBlockBackend")
        if ours_dev == 0:
            problems.append("LMCache's core never opened lmcache_rawblock's RawBlockDevice")
        if rust_dev:
            problems.append(f"LMCache's core opened the Rust wheel's RawBlockDevice {rust_dev} times")
    elif MODE == "native":
        need("ours.RawBlockCore")
        need("ours.RustRawBlockBackend")
        never("lmcache.RawBlockCore")
        never("lmcache.RustRawBlockBackend")
    problems.extend(f"still bound to the replaced object: {leak}" for leak in _leaks())
    return problems


def pytest_sessionfinish(session, exitstatus):
    problems = check()
    record = {
        "mode": MODE,
        "constructed": dict(constructed),
        "devices_opened_by_lmcache_core": dict(devices),
        "substituted": substituted,
        "replaced_globals": replaced_globals,
        "problems": problems,
        "outcomes": outcomes,
    }
    if RECORD_PATH:
        Path(RECORD_PATH).write_text(json.dumps(record, indent=1, sort_keys=True))
    if problems and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    problems = check()
    tr = terminalreporter
    tr.section(f"raw-block conformance: {MODE} mode")
    for label, n in sorted(constructed.items()):
        tr.write_line(f"constructed {label}: {n}")
    for t, n in sorted(devices.items()):
        tr.write_line(f"device opened by LMCache's core: {t}: {n}")
    if substituted:
        tr.write_line(f"substituted {len(substituted)} names in {len(replaced_globals)} module globals")
    for p in problems:
        tr.write_line(f"SUBSTITUTION CHECK FAILED: {p}", red=True)
    if not problems:
        tr.write_line(f"substitution check: {MODE} mode was in effect", green=True)
