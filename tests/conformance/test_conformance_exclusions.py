"""The conformance exclusion list stays consistent with our own suite: every excluded LMCache
test has a kind, a reason and a public-behaviour equivalent that names an existing test of
ours. Checked here (no LMCache needed) so a renamed test is caught by the default run, not
only by the conformance stage."""

from __future__ import annotations

import dataclasses
import importlib.util

from helpers import TESTS

RUNNER = TESTS / "lmcache_conformance" / "run.py"


def _runner():
    spec = importlib.util.spec_from_file_location("rb_conformance_runner", RUNNER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_exclusion_names_an_existing_test_of_ours():
    run = _runner()
    assert run.EXCLUSIONS, "the exclusion list is empty"
    assert run.check_exclusions() == []


def test_a_missing_equivalent_is_reported(monkeypatch):
    run = _runner()
    e = run.EXCLUSIONS[0]
    bad = dataclasses.replace(e, covered_by="tests/core/test_core_uring.py::test_that_does_not_exist")
    monkeypatch.setattr(run, "EXCLUSIONS", [bad])
    problems = run.check_exclusions()
    assert len(problems) == 1 and "test_that_does_not_exist" in problems[0]
