"""pytest plugin for the make targets that exist to run one group of tests (test-lmcache,
test-torch): there, a skipped test means the group did not run, so every skip fails the
session, except those whose reason matches the regular expression in RB_ALLOWED_SKIPS (for a
limit of the machine, such as a file system that refuses O_DIRECT).

Loaded with ``-p strict_skips`` and ``tests`` on PYTHONPATH (it is not a conftest: the default
run keeps its ordinary skips).
"""

from __future__ import annotations

import os
import re

import pytest

_skips: list[tuple[str, str]] = []


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_collectreport(report) -> None:
    if report.skipped:  # a whole module skipped at import (importorskip, pytest.skip(allow_module_level))
        _skips.append((report.nodeid, _reason(report)))


def pytest_runtest_logreport(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skips.append((report.nodeid, _reason(report)))


def pytest_sessionfinish(session, exitstatus) -> None:
    allowed = os.environ.get("RB_ALLOWED_SKIPS", "")
    bad = [(node, why) for node, why in _skips if not (allowed and re.search(allowed, why))]
    if not bad:
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_sep("=", f"{len(bad)} skipped where this target requires every selected test to run", red=True)
        for node, why in bad:
            tr.write_line(f"SKIPPED {node}: {why}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
