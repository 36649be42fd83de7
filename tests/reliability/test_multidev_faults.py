"""A drive that stops answering under a running writer, on real block devices: loop devices
over RAM files, one of which is moved past the end of its backing file (LOOP_SET_STATUS64) while
a thread stores and loads across all of them. Its size becomes 0 under the cache's open
descriptors: reads end at once, writes fail with ENOSPC, as a pulled drive's would fail; its
data is untouched, so moving it back is the drive coming back. The cache must mark it failed,
serve 0 wrong bytes, lose only its keys, keep serving and storing on the others, and take it
back (or a blank replacement) through reopen_device.

The rigs need root (tmpfs, loop devices); elsewhere these tests skip with the reason."""

from __future__ import annotations

import os
import threading

import pytest

from core_helpers import Obj, make_config, okey, payload
from helpers import Rig
from lmcache_rawblock.raw_block import MultiDeviceConfig, MultiDeviceCore

MiB = 1 << 20
DEV_MIB = 64
N = 40000
BATCH = 6


def _rig_devices(rig: Rig, n: int) -> tuple[list[str], list[str]]:
    fs = rig.tmpfs(n * DEV_MIB + 8)
    files = []
    for i in range(n):
        f = fs / f"drive{i}.img"
        with open(f, "wb") as fh:
            fh.truncate(DEV_MIB * MiB)
        files.append(str(f))
    return [rig.attach(f) for f in files], files


class Writer:
    """Stores batches of new keys and loads back everything stored so far, round after round,
    counting wrong bytes, misses by device, and exceptions (none may escape a load)."""

    def __init__(self, core: MultiDeviceCore) -> None:
        self.core = core
        self.stored: dict[int, str] = {}  # key id -> the device it was stored on
        self.wrong = 0
        self.errors: list[BaseException] = []
        self.rounds = 0
        self.next_id = 0
        self.cond = threading.Condition()
        self.stop = False

    def step(self) -> None:
        ids = list(range(self.next_id, self.next_id + BATCH))
        self.next_id += BATCH
        res = self.core.put_many([okey(i) for i in ids], [Obj(payload(i, N)) for i in ids])
        for i, ok in zip(ids, res.results):
            if ok:
                self.stored[i] = self.core.device_of(okey(i).encoded) or "?"
        every = sorted(self.stored)
        outs = [Obj(N) for _ in every]
        got = self.core.load_many_into([okey(i).encoded for i in every], outs, raise_on_error=True)
        self.wrong += sum(1 for i, ok, o in zip(every, got, outs) if ok and o.bytes() != payload(i, N))

    def run(self) -> None:
        try:
            while True:
                with self.cond:
                    if self.stop:
                        return
                self.step()
                with self.cond:
                    self.rounds += 1
                    self.cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - the test asserts there was none
            self.errors.append(e)
            with self.cond:
                self.cond.notify_all()

    def wait_rounds(self, n: int) -> None:
        """Wait until the writer has run n more rounds (or died)."""
        with self.cond:
            target = self.rounds + n
            self.cond.wait_for(lambda: self.rounds >= target or self.errors)


def _multi(devs: list[str], engine: str) -> MultiDeviceCore:
    cfg = make_config(devs[0], io_engine=engine, use_odirect=True, slot_bytes=64 * 1024)
    return MultiDeviceCore(MultiDeviceConfig.for_paths(cfg, devs), key_namespace="object")


def _run_until_failed(rig: Rig, core: MultiDeviceCore, victim: str) -> Writer:
    w = Writer(core)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        w.wait_rounds(4)
        core.checkpoint_now()  # what every device held so far is durable in its own metadata
        w.wait_rounds(2)
        rig.set_loop_offset(victim, DEV_MIB * MiB)  # the drive stops answering under the writer
        w.wait_rounds(6)
    finally:
        with w.cond:
            w.stop = True
        t.join()
    assert not w.errors, w.errors
    return w


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_a_drive_failing_under_the_writer_costs_only_its_keys(rig, engine):
    devs, _files = _rig_devices(rig, 3)
    core = _multi(devs, engine)
    try:
        w = _run_until_failed(rig, core, devs[1])
        states = core.device_states()
        assert [s["state"] for s in states] == ["online", "failed", "online"], states
        assert w.wrong == 0
        ids = sorted(w.stored)
        outs = [Obj(N) for _ in ids]
        got = core.load_many_into([okey(i).encoded for i in ids], outs, raise_on_error=True)
        assert all(o.bytes() == payload(i, N) for i, ok, o in zip(ids, got, outs) if ok), "0 wrong bytes"
        # only its keys are lost: every key stored on the other devices loads
        # ("?": the device failed between the key's put and the question where it went)
        assert [ok for i, ok in zip(ids, got) if w.stored[i] != "?"] == \
            [w.stored[i] != devs[1] for i in ids if w.stored[i] != "?"]
        # the others took the writer's new keys after the failure
        late = ids[-BATCH * 3:]
        assert all(w.stored[i] in (devs[0], devs[2]) for i in late)
        st = core.report_status()
        assert st["degraded"] and st["devices_failed"] == 1 and st["is_healthy"]
        lost = sum(1 for i in ids if w.stored[i] == devs[1])
        assert st["lost_keys"] <= lost and st["devices"][1]["failures"] == 1

        # the drive comes back with its data: its recovered keys serve again, right bytes
        rig.set_loop_offset(devs[1], 0)
        back = core.reopen_device(devs[1])
        assert back["recovery_outcome"] in ("loaded", "fallback")
        mine = [i for i in ids if w.stored[i] == devs[1]]
        outs = [Obj(N) for _ in mine]
        got = core.load_many_into([okey(i).encoded for i in mine], outs, raise_on_error=True)
        assert all(o.bytes() == payload(i, N) for i, ok, o in zip(mine, got, outs) if ok)
        assert sum(got) == back["indexed_key_count"] > 0, "what it recovered serves"
        assert core.report_status()["devices_online"] == 3
    finally:
        core.close()


def test_a_blank_replacement_drive_at_the_same_path(rig):
    devs, files = _rig_devices(rig, 2)
    core = _multi(devs, "posix")
    try:
        w = _run_until_failed(rig, core, devs[0])
        assert core.device_states()[0]["state"] == "failed"
        with open(files[0], "r+b") as f:  # a new, blank drive in its place
            f.truncate(0)
            f.truncate(DEV_MIB * MiB)
        rig.set_loop_offset(devs[0], 0)
        back = core.reopen_device(0)
        assert back["recovery_outcome"] == "blank" and back["indexed_key_count"] == 0
        ids = sorted(w.stored)
        outs = [Obj(N) for _ in ids]
        got = core.load_many_into([okey(i).encoded for i in ids], outs)
        assert got == [w.stored[i] == devs[1] for i in ids]
        assert all(o.bytes() == payload(i, N) for i, ok, o in zip(ids, got, outs) if ok)
        res = core.put_many([okey(i) for i in range(10**6, 10**6 + 8)],
                            [Obj(payload(i, N)) for i in range(10**6, 10**6 + 8)])
        assert all(res.results)
        assert devs[0] in {core.device_of(okey(i).encoded) for i in range(10**6, 10**6 + 8)}
    finally:
        core.close()


def test_the_other_drives_alone_recover_after_a_restart_with_one_gone(rig):
    devs, _files = _rig_devices(rig, 3)
    core = _multi(devs, "posix")
    try:
        w = _run_until_failed(rig, core, devs[2])
    finally:
        core.close()
    # restart with the drive still gone: the others open and serve, it is failed
    core = _multi(devs, "posix")
    try:
        assert [s["state"] for s in core.device_states()] == ["online", "online", "failed"]
        ids = sorted(w.stored)
        outs = [Obj(N) for _ in ids]
        got = core.load_many_into([okey(i).encoded for i in ids], outs)
        assert all(o.bytes() == payload(i, N) for i, ok, o in zip(ids, got, outs) if ok)
        assert got == [w.stored[i] != devs[2] for i in ids]
    finally:
        core.close()
    os.sync()
