"""LMCache tests that are not expected to pass in the compat or native mode, with the reason.

Every other test that passes in the baseline mode (LMCache on the Rust wheel) must pass in
both other modes, or ``run.py`` fails. An entry that starts passing is reported, not an error.

``kind`` is one of:

``private``
    The test patches LMCache's private internals (a fake device planted in ``sys.modules``,
    private methods of LMCache's ``RawBlockCore`` such as ``_rawdev``), which our C core never
    calls, so the patch has no effect on our stack. ``covered_by`` names a test of ours that
    checks the same public behaviour on a real file.
``differs``
    Our behaviour differs from LMCache's on purpose (README, Compatibility notes).
    ``covered_by`` names the test of ours that pins our behaviour.

``test`` is a pytest node id relative to the sdist's root; ``fnmatch`` patterns are allowed
(e.g. ``...::test_x[*]`` for every parameter set).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exclusion:
    modes: tuple[str, ...]
    test: str
    kind: str
    reason: str
    covered_by: str


EXCLUSIONS: list[Exclusion] = []
