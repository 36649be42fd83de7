"""Crash consistency of the cache over several devices under SIGKILL
(tests/reliability/killloop_multi.py): after any kill, each device's metadata alone recovers,
every load returns exactly the bytes stored under that key or a miss, and no key made durable
by an acknowledged checkpoint is lost.

The short run is part of the default suite (a few cycles per configuration); the long one is
marked slow and runs with `make test-killloop-long`."""

from __future__ import annotations

import os

import pytest

from reliability import killloop_multi

SHORT_CYCLES = int(os.environ.get("RB_KILLLOOP_MULTI_CYCLES", "3"))
LONG_CYCLES = int(os.environ.get("RB_KILLLOOP_MULTI_LONG_CYCLES", "150"))
RNG_SEED = int(os.environ.get("RB_KILLLOOP_RNG_SEED", "1"))


def _run(cfg, cycles: int, tmp_path, capsys) -> None:
    st = killloop_multi.run_config(cfg, cycles, RNG_SEED, str(tmp_path))
    with capsys.disabled():
        print("\nkillloop " + st.row(), flush=True)
    assert st.cycles == cycles, st.failures[:3]
    assert st.stored > 0 and st.keys_checked > 0
    assert (st.wrong_bytes, st.lost, st.stale) == (0, 0, 0), "\n".join(st.failures[:10])
    assert not st.failures, "\n".join(st.failures[:10])


@pytest.mark.parametrize("cfg", killloop_multi.CONFIGS, ids=lambda c: c.name)
def test_killloop_over_several_devices(cfg, tmp_path, capsys):
    _run(cfg, SHORT_CYCLES, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", killloop_multi.CONFIGS, ids=lambda c: c.name)
def test_killloop_over_several_devices_long(cfg, tmp_path, capsys):
    _run(cfg, LONG_CYCLES, tmp_path, capsys)
