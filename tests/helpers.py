"""Helpers shared by the test files of every folder under tests/ (tests/ is on sys.path: the
``pythonpath`` of pyproject's pytest settings): where the checkout is."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # tests/: child interpreters put it on sys.path for core_helpers
REPO = TESTS.parent  # the checkout: README.md, docs/, csrc/, fuzz/
