"""Crash states of a cache over several devices (tests/reliability/crashstates_multi.py): one
device cut at its crash points while the others complete, and every device cut at once; each
device's metadata recovers alone without wrong bytes, lost durable keys or versions its cut does
not allow, and the cache over all devices serves a key found on two devices from the first device
in the list at start-up, and from the device that stayed online when the cut one returns.

The short run (a seeded sample of the states of the fixed workload, in both metadata formats,
over two and three devices) is part of the default suite and of `make test-reliability`; the
long one (every state, and seeded random workloads) is marked slow and runs with
`make test-crash-states-long`."""

from __future__ import annotations

import os

import pytest

from lmcache_rawblock.raw_block import MultiDeviceCore
from reliability import crashstates_multi as csm
from reliability.common import Config

SHORT_LIMIT = int(os.environ.get("RB_CRASH_MULTI_STATES", "40"))
LONG_RANDOM = int(os.environ.get("RB_CRASH_MULTI_RANDOM_WORKLOADS", "3"))
RNG_SEED = int(os.environ.get("RB_CRASH_MULTI_RNG_SEED", "1"))
CASES = [("posix", 2), ("io_uring", 3)]


def _assert_clean(r: csm.Result) -> None:
    assert r.states > 0 and r.keys_checked > 0, r.row()
    assert (r.wrong, r.lost, r.stale, r.damage, r.rule) == (0, 0, 0, 0, 0), "\n".join(r.failures[:10])


@pytest.mark.parametrize("fmt", ["v1", "log"])
@pytest.mark.parametrize("engine,ndev", CASES, ids=[f"{e}-{n}dev" for e, n in CASES])
def test_crash_states_over_several_devices(engine, ndev, fmt, tmp_path, capsys):
    wl = csm.workloads(fmt, ndev, 0, RNG_SEED)[0]
    rec = csm.record(engine, str(tmp_path), wl, ndev)
    assert rec.moved >= 3, rec.moved  # keys stored on another device than the one that held them
    for kind in ("one", "all"):
        r = csm.check_recording(rec, engine, kind, RNG_SEED, SHORT_LIMIT)
        with capsys.disabled():
            print("\ncrash states " + r.row(), flush=True)
        _assert_clean(r)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["v1", "log"])
@pytest.mark.parametrize("engine", ["posix", "io_uring"])
@pytest.mark.parametrize("ndev", [2, 3])
def test_crash_states_over_several_devices_long(engine, ndev, fmt, tmp_path, capsys):
    on_two = 0
    for wl in csm.workloads(fmt, ndev, LONG_RANDOM, RNG_SEED):
        rec = csm.record(engine, str(tmp_path), wl, ndev)
        for kind in ("one", "all"):
            r = csm.check_recording(rec, engine, kind, RNG_SEED)
            with capsys.disabled():
                print(f"\ncrash states {r.row()} moved={rec.moved}", flush=True)
            _assert_clean(r)
            on_two += r.on_two
    assert on_two > 0


@pytest.mark.parametrize("fmt", ["v1", "log"])
def test_moves_workload_leaves_keys_on_two_devices(fmt, tmp_path):
    # The fixed workload reaches what the rule is about: crash states, of both kinds, in which
    # two devices' metadata each list the same key (every "all" state: they are a few of them,
    # and which ones depends on how the devices' checkpoints interleaved).
    rec = csm.record("posix", str(tmp_path), csm.workloads(fmt, 2, 0, RNG_SEED)[0], 2)
    for kind, limit in (("one", 100), ("all", 0)):
        r = csm.check_recording(rec, "posix", kind, RNG_SEED, limit)
        assert r.on_two > 0, r.row()
        _assert_clean(r)


def test_keeping_both_copies_breaks_the_rule(tmp_path, monkeypatch):
    """The check has teeth: a cache that keeps a key's copies on both devices (no duplicate
    dropped at start-up or on reopen) is caught: the copies survive its close, and the device
    returning first in the list serves its own copy over the online one's."""
    rec = csm.record("posix", str(tmp_path), csm.workloads("v1", 2, 0, RNG_SEED)[0], 2)
    monkeypatch.setattr(MultiDeviceCore, "_drop_duplicates", lambda self, *args: 0)
    r = csm.check_recording(rec, "posix", "one", RNG_SEED, 60)
    assert r.rule > 0 and (r.wrong, r.lost, r.stale) == (0, 0, 0), r.row()
    assert any("still on two devices" in f for f in r.failures)
    assert any("after reopen_device(0)" in f for f in r.failures)


def test_a_device_losing_its_metadata_is_caught(tmp_path):
    """The check has teeth for lost keys: a device whose metadata region reads zeros (as if its
    checkpoints never landed) lacks its durable keys, alone and in the cache."""
    rec = csm.record("posix", str(tmp_path), csm.workloads("v1", 2, 0, RNG_SEED)[0], 2)
    img = bytearray(rec.final[1])
    img[:csm.cs.META] = bytes(csm.cs.META)
    st = csm.State("device 1's metadata zeroed", [rec.final[0], bytes(img)], [(csm.INF, csm.INF)] * 2)
    res = csm.Result("moves-v1", 2, "posix", "one")
    csm.check_state(rec, st, Config("posix", False, False, True, "v1"), res)
    assert res.lost == 1 and res.wrong == 0, res.failures
    assert any("device 1 alone lacks durable keys" in f for f in res.failures)
    assert any("the cache at start-up lacks durable keys" in f for f in res.failures)


FUZZ_WORKLOADS = int(os.environ.get("RB_CRASH_MULTI_FUZZ_WORKLOADS", "2"))
FUZZ_STATES = int(os.environ.get("RB_CRASH_MULTI_FUZZ_STATES", "20"))


def _fuzz(engine: str, ndev: int, fmt: str, nworkloads: int, nstates: int, tmp_path, capsys) -> None:
    total = csm.Result(f"r*-{fmt}", ndev, engine, "mixed")
    for wl in csm.workloads(fmt, ndev, nworkloads, RNG_SEED)[1:]:
        rec = csm.record(engine, str(tmp_path), wl, ndev)
        total.add(csm.check_recording(rec, engine, "mixed", RNG_SEED, nstates))
    with capsys.disabled():
        print(f"\ncrash states (random workloads, each device cut at its own random point) {total.row()}",
              flush=True)
    assert total.states == nworkloads * nstates
    _assert_clean(total)


@pytest.mark.parametrize("fmt", ["v1", "log"])
def test_random_workloads_with_each_device_cut_at_its_own_point(fmt, tmp_path, capsys):
    # The fuzzing of several devices: seeded random workloads (puts placed by the cache or on a
    # device of the draw, deletes, checkpoints, compactions), each device stopped at a random
    # crash point of its own or completing, a random device returning last.
    _fuzz("posix", 3, fmt, FUZZ_WORKLOADS, FUZZ_STATES, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["v1", "log"])
@pytest.mark.parametrize("engine", ["posix", "io_uring"])
@pytest.mark.parametrize("ndev", [2, 3])
def test_random_workloads_with_each_device_cut_at_its_own_point_long(engine, ndev, fmt, tmp_path, capsys):
    _fuzz(engine, ndev, fmt, int(os.environ.get("RB_CRASH_MULTI_FUZZ_LONG_WORKLOADS", "12")), 60, tmp_path, capsys)
