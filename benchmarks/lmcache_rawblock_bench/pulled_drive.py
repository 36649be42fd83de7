"""A drive pulled out of a multi-device cache under a mixed workload, and put back.

Run in the emulated NVMe guest with several hot-pluggable controllers
(tools/nvme_guest/rig.py --nvme-count 4): a MultiDeviceCore over controllers 1..3's block
devices (io_uring, O_DIRECT), one writer thread storing new keys and loading a sample of the
stored ones, round after round. Phases: `before`; controller --pull removed (QEMU device_del)
under the writer, `during`; put back (device_add, same backing file) and `reopen_device`,
`after`. Per phase and device: keys and bytes stored and loaded, misses, wrong bytes, and
throughput (bytes moved per second of the phase). Prints one JSON document.

    python -m lmcache_rawblock_bench.pulled_drive --phase-seconds 30 --out result.json

The test tests/nvme/test_pulled_drive.py runs the same workload by rounds (no timing).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from collections import defaultdict
from typing import Any

from lmcache_rawblock.raw_block import MultiDeviceConfig, MultiDeviceCore, RawBlockCoreConfig, encode_object_key
from lmcache_rawblock.raw_block._lmcache import ObjectKey
from lmcache_rawblock_bench import nvme_hotplug

MiB = 1 << 20
COUNTERS = ("put_keys", "put_bytes", "put_failed", "load_keys", "load_bytes", "misses", "wrong")


class _Meta:
    def __init__(self, n: int) -> None:
        self.shape, self.dtype, self.fmt, self.cached_positions = (n,), "uint8", "BINARY", None


class Obj:
    """A memory object as the core takes it: a writable byte_array and metadata."""

    def __init__(self, data: bytes | int) -> None:
        self._buf = bytearray(data)
        self.byte_array = memoryview(self._buf)
        self.metadata = _Meta(len(self._buf))

    def bytes(self) -> bytes:
        return bytes(self._buf)


def key(i: int):
    return encode_object_key(ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="pulled_drive", kv_rank=0))


def payload(i: int, n: int) -> bytes:
    """Key i's bytes: its id in every 8-byte word, so a block of another key cannot pass."""
    word = i.to_bytes(8, "little")
    return (word * (n // 8 + 1))[:n]


def open_cache(paths: list[str], *, capacity: int, slot: int, meta_format: str = "log") -> MultiDeviceCore:
    cfg = RawBlockCoreConfig(
        device_path=paths[0], capacity_bytes=capacity, slot_bytes=slot, block_align=4096, header_bytes=4096,
        use_odirect=True, enable_zero_copy=False, io_engine="io_uring", iouring_queue_depth=32,
        meta_format=meta_format, meta_total_bytes=4 * MiB, meta_magic=b"LMCIDX01", meta_version=1,
        meta_checkpoint_interval_sec=60, meta_idle_quiet_ms=0, meta_enable_periodic=False,
        meta_verify_on_load=True, load_checkpoint_on_init=True)
    return MultiDeviceCore(MultiDeviceConfig.for_paths(cfg, paths), key_namespace="object")


class Workload:
    """Stores `batch` new keys and loads `sample` stored ones per round; counts per phase and
    device. A load never raises: a key of a failed device is a miss."""

    def __init__(self, core: MultiDeviceCore, *, obj_bytes: int, batch: int = 4, sample: int = 8,
                 seed: int = 1) -> None:
        self.core, self.n, self.batch, self.sample = core, obj_bytes, batch, sample
        self.rng = random.Random(seed)
        self.stored: dict[int, str] = {}  # key id -> device it was stored on ("?" if it failed meanwhile)
        self.phase = "before"
        self.counts: dict[str, dict[str, dict[str, int]]] = defaultdict(
            lambda: defaultdict(lambda: dict.fromkeys(COUNTERS, 0)))
        self.phase_time: dict[str, float] = defaultdict(float)
        self.errors: list[BaseException] = []
        self.rounds = 0
        self.next_id = 0
        self.cond = threading.Condition()
        self.stop = False
        self.thread: threading.Thread | None = None

    def set_phase(self, name: str) -> None:
        with self.cond:
            self.phase = name

    def _count(self, dev: str, what: str, n: int = 1) -> None:
        self.counts[self.phase][dev][what] += n

    def step(self) -> None:
        ids = list(range(self.next_id, self.next_id + self.batch))
        self.next_id += self.batch
        res = self.core.put_many([key(i) for i in ids], [Obj(payload(i, self.n)) for i in ids])
        for i, ok in zip(ids, res.results):
            if ok:
                dev = self.core.device_of(key(i).encoded) or "?"
                self.stored[i] = dev
                self._count(dev, "put_keys")
                self._count(dev, "put_bytes", self.n)
            else:
                self._count("?", "put_failed")
        have = sorted(self.stored)
        pick = self.rng.sample(have, min(self.sample, len(have)))
        outs = [Obj(self.n) for _ in pick]
        got = self.core.load_many_into([key(i).encoded for i in pick], outs, raise_on_error=True)
        for i, ok, o in zip(pick, got, outs):
            dev = self.stored[i]
            if not ok:
                self._count(dev, "misses")
            elif o.bytes() != payload(i, self.n):
                self._count(dev, "wrong")
            else:
                self._count(dev, "load_keys")
                self._count(dev, "load_bytes", self.n)

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    if self.stop:
                        return
                    phase = self.phase
                t0 = time.monotonic()
                self.step()
                with self.cond:
                    self.phase_time[phase] += time.monotonic() - t0
                    self.rounds += 1
                    self.cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - reported: the callers assert there was none
            self.errors.append(e)
            with self.cond:
                self.cond.notify_all()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="pulled-drive-writer")
        self.thread.start()

    def finish(self) -> None:
        with self.cond:
            self.stop = True
        if self.thread is not None:
            self.thread.join()

    def wait_rounds(self, n: int) -> None:
        with self.cond:
            target = self.rounds + n
            self.cond.wait_for(lambda: self.rounds >= target or bool(self.errors))

    def verify_all(self) -> tuple[list[int], list[bool], int]:
        """(ids, loaded?, wrong) over every key ever stored."""
        ids = sorted(self.stored)
        got: list[bool] = []
        wrong = 0
        for at in range(0, len(ids), 32):  # a batch at a time: the guest's memory is small
            part = ids[at:at + 32]
            outs = [Obj(self.n) for _ in part]
            ok = self.core.load_many_into([key(i).encoded for i in part], outs, raise_on_error=True)
            wrong += sum(1 for i, hit, o in zip(part, ok, outs) if hit and o.bytes() != payload(i, self.n))
            got += ok
        return ids, got, wrong

    def summary(self, pulled: str) -> dict[str, Any]:
        """Per phase: its seconds, MB/s of all devices and of those other than `pulled`, and
        each device's counts and MB/s (stored plus loaded bytes per second of the phase)."""
        out: dict[str, Any] = {}
        for phase, devs in self.counts.items():
            secs = self.phase_time[phase]
            moved = {d: c["put_bytes"] + c["load_bytes"] for d, c in devs.items()}
            out[phase] = {"seconds": round(secs, 2), "rounds_mb_per_s": None, "others_mb_per_s": None,
                          "devices": {}}
            if secs:
                out[phase]["rounds_mb_per_s"] = round(sum(moved.values()) / secs / 1e6, 3)
                out[phase]["others_mb_per_s"] = round(sum(v for d, v in moved.items() if d != pulled) / secs / 1e6, 3)
            for dev, c in sorted(devs.items()):
                out[phase]["devices"][dev] = dict(c, mb_per_s=round(moved[dev] / secs / 1e6, 3) if secs else None)
        return out


def _phase(w: Workload, name: str, seconds: float) -> None:
    w.set_phase(name)
    end = time.monotonic() + seconds
    while time.monotonic() < end and not w.errors:
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--controllers", default="1,2,3", help="controllers whose namespaces form the cache")
    ap.add_argument("--pull", type=int, default=2, help="controller pulled mid-run")
    ap.add_argument("--phase-seconds", type=float, default=30.0)
    ap.add_argument("--obj-bytes", type=int, default=256 * 1024)
    ap.add_argument("--capacity", type=int, default=960 * MiB,
                    help="bytes used on each namespace (1 GiB each on the rig)")
    ap.add_argument("--links", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "pulled-drive"))
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args(argv)
    ctrls = [int(c) for c in a.controllers.split(",")]
    paths = [nvme_hotplug.stable_path(k, a.links) for k in ctrls]
    victim = paths[ctrls.index(a.pull)]
    core = open_cache(paths, capacity=a.capacity, slot=a.obj_bytes + 4096)
    w = Workload(core, obj_bytes=a.obj_bytes)
    events: dict[str, Any] = {}
    try:
        w.start()
        _phase(w, "before", a.phase_seconds)
        core.checkpoint_now()
        t0 = time.monotonic()
        w.set_phase("pulling")  # the kernel removing the controller under the writer
        nvme_hotplug.pull(a.pull)
        events["pull_seconds"] = round(time.monotonic() - t0, 2)
        w.wait_rounds(1)  # the round in flight at the pull ends
        _phase(w, "during", a.phase_seconds)
        events["states_during"] = [s["state"] for s in core.device_states()]
        t0 = time.monotonic()
        w.set_phase("back")
        nvme_hotplug.put_back(a.pull)
        nvme_hotplug.stable_path(a.pull, a.links)
        events["reopen"] = core.reopen_device(victim)
        events["back_seconds"] = round(time.monotonic() - t0, 2)
        _phase(w, "after", a.phase_seconds)
    finally:
        w.finish()
    try:
        ids, got, wrong = w.verify_all()
        st = core.report_status()
    finally:
        core.close()
    lost = [i for i, ok in zip(ids, got) if not ok]
    doc = {
        "devices": paths, "pulled": victim, "obj_bytes": a.obj_bytes, "phase_seconds": a.phase_seconds,
        "errors": [repr(e) for e in w.errors], "events": events, "phases": w.summary(victim),
        "final": {"keys": len(ids), "loaded": sum(got), "wrong_bytes_keys": wrong,
                  "lost_keys": len(lost),
                  "lost_not_on_pulled": sum(1 for i in lost if w.stored[i] != victim),
                  "lost_keys_reported": st["lost_keys"], "devices_online": st["devices_online"]},
    }
    text = json.dumps(doc, indent=1, default=str)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0 if not w.errors and wrong == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
