"""Crash-state enumeration (tests/reliability/crashstates.py): every device image a power loss
could leave during a recorded workload recovers without wrong bytes and without losing a
durable key. Runs through `make test-reliability`."""

from __future__ import annotations

import os

import pytest

from reliability import crashstates

pytestmark = pytest.mark.skipif(os.environ.get("RB_CRASH_TESTS") != "1",
                                reason="crash harnesses run via `make test-reliability` (RB_CRASH_TESTS=1)")


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_write_log_rebuilds_the_device(engine, tmp_path):
    # The recorder misses nothing: the pre-workload image plus every logged write is the
    # device as the workload left it.
    rec = crashstates.record_workload(engine, str(tmp_path))
    assert sum(r.kind == crashstates.WRITE for r in rec.recs) >= 2 * len(crashstates.WORKLOAD)
    assert crashstates.replay_all(rec) == rec.final


@pytest.mark.parametrize("tear", [0, 4096], ids=["whole-writes", "torn-4k"])
@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_crash_states(engine, tear, tmp_path, capsys):
    results = crashstates.check_recorded(engine, ["posix", "io_uring"], str(tmp_path), tear=tear)
    with capsys.disabled():
        for r in results:
            print(f"\ncrash states{' (torn 4 KiB)' if tear else ''} " + r.row(), flush=True)
    for r in results:
        assert r.states > r.writes and r.keys_checked > 0
        assert (r.wrong_states, r.lost_states) == (0, 0), "\n".join(r.failures[:10])
