"""Crash consistency under SIGKILL (tests/reliability/killloop.py): after any kill, a load
returns exactly the bytes stored under that key or a miss, and no durable key is lost.

Runs through `make test-reliability` (CI) and `make test-killloop-long`; the default suite
skips it because it forks writers and takes about a minute."""

from __future__ import annotations

import os
import signal
import traceback

import pytest

from reliability import killloop
from reliability.common import ALL_CONFIGS, EXTENT_CONFIGS, Config, Obj, key, make_device, open_core, payload, verify_served

ENABLED = os.environ.get("RB_CRASH_TESTS") == "1"
pytestmark = pytest.mark.skipif(not ENABLED, reason="crash harnesses run via `make test-reliability` "
                                                    "(RB_CRASH_TESTS=1): they fork and kill writer processes")
CI_CYCLES = int(os.environ.get("RB_KILLLOOP_CYCLES", "10"))          # x32 configurations (both formats, deallocation
                                                                     # on in half) = 320
LONG_CYCLES = int(os.environ.get("RB_KILLLOOP_LONG_CYCLES", "157"))  # x32 = 5024
RNG_SEED = int(os.environ.get("RB_KILLLOOP_RNG_SEED", "1"))


def _run(cfg: Config, cycles: int, tmp_path, capsys) -> None:
    st = killloop.run_config(cfg, cycles, RNG_SEED, str(tmp_path))
    with capsys.disabled():
        print("\nkillloop " + st.row(), flush=True)
    assert st.cycles == cycles, st.failures[:3]
    assert st.keys_checked > 0
    assert (st.wrong_bytes, st.lost_silent, st.lost_reported, st.stale) == (0, 0, 0, 0), "\n".join(st.failures[:10])
    assert not st.failures, "\n".join(st.failures[:10])
    if cfg.dealloc:
        # freed slots were deallocated (punched holes) and reused between the kills
        assert st.dealloc_slots > 0 and st.reused > 0, st.row()
    if cfg.meta_format == "log":
        # the loop exercised the log format's own paths: the move from v1, and bases written
        # (compactions of a full ring, compact_metadata() calls)
        assert (st.moves >= 1 or cfg.stride or cfg.classes) and st.base_switches >= st.moves
        if cycles >= 2 * killloop.MOVE_EVERY:
            assert st.compactions > 0


@pytest.mark.parametrize("cfg", ALL_CONFIGS, ids=lambda c: c.name)
def test_killloop(cfg, tmp_path, capsys):
    _run(cfg, CI_CYCLES, tmp_path, capsys)


@pytest.mark.parametrize("cfg", EXTENT_CONFIGS, ids=lambda c: c.name)
def test_killloop_with_extent_eviction(cfg, tmp_path, capsys):
    """Extents on, deallocation on, the writer evicting whole victim extents among its deletes."""
    _run(cfg, CI_CYCLES, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", ALL_CONFIGS, ids=lambda c: c.name)
def test_killloop_long(cfg, tmp_path, capsys):
    _run(cfg, LONG_CYCLES, tmp_path, capsys)


@pytest.mark.parametrize("cfg", [c for c in ALL_CONFIGS if not c.checksum and not c.odirect], ids=lambda c: c.name)
def test_reused_slot_with_unwritten_header_never_serves_the_old_key(cfg, tmp_path):
    """Key A checkpointed, then deleted; B is put and its second write fails (io_uring: B's
    header after B's payload; posix: B's payload after B's header); the process dies without
    a checkpoint. A must come back with its own bytes or not at all; B must be a miss.
    In the log format the device has one slot and the delete is checkpointed (its FREE
    record durable), so B is written into A's slot."""
    log = cfg.meta_format == "log"
    path = make_device(str(tmp_path / "dev.img"), 1 if log else 8)
    a, b = 1, 2
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            core = open_core(path, cfg)
            assert core.put_many([key(a)], [Obj(payload(a, 1, 5000))]).results == [True]
            core.checkpoint_now()
            assert core.delete_many([key(a).encoded]) == [True]
            if log:
                core.checkpoint_now()
                assert core.report_status()["free_slot_count"] == 1
            core._native._inject_fault("write", 2)
            core.put_many([key(b)], [Obj(payload(b, 1, 5000))])
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os.kill(os.getpid(), signal.SIGKILL) if code == 0 else os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"writer failed (status {status})"
    core = open_core(path, cfg)
    try:
        res = verify_served(core, {a: {1: 5000}, b: {1: 5000}}, [a, b])
    finally:
        core.close()
    assert res["wrong"] == []
    assert b not in res["served"]
