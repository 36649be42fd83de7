"""Extents on the emulated FDP namespace, with the product's core and its extent allocator:

- `extent_bytes: auto` resolves to the namespace's reclaim unit (the FDP configuration log page's
  nominal size), through passthrough and through the NVMe block device; format v1 to whole slots;
- an extent's deallocation reaches the controller as one Dataset Management command of one range
  (two adjacent extents: still one), counted by the core (dealloc_commands / dealloc_ranges) and
  by the controller itself: QEMU's `pci_nvme_dsm` / `pci_nvme_dsm_deallocate` trace events, which
  the rig logs into the run directory (`rig.py --trace`, RB_NVME_TRACE);
- the writes of one extent land on the handle of its stream (placement identifier, with slot
  affinity): the handle's reclaim unit available media writes (RUAMW) drop by exactly the
  extent's blocks and no other data handle moves; an extent the size of the reclaim unit, begun
  on a fresh unit, ends it exactly (RUAMW back to a whole unit at its last write);
- the core's room-making put (a put that finds no free slot and writes the checkpoint that frees
  some) takes a wholly freed extent without deallocating it (extent_dealloc_skipped), while the
  deletes-then-checkpoint order the extent evictor keeps deallocates it first.

The figures are printed (pytest -s) and, when RB_EXTENT_FDP_REPORT names a file, written there
as JSON (benchmarks/results/fdp-extents/).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core_helpers import Obj, make_config, okey, payload
from helpers import ruamw
from lmcache_rawblock import _native
from lmcache_rawblock.raw_block import RawBlockCore
from nvme.test_dealloc_guest import (
    NVME_IOCTL_IO_CMD,
    blank_namespace,
    deallocated_byte,
    dsm_identity,
    passthru,
    read_direct,
)

MiB = 1 << 20
HEADER = 4096
_REPORT: dict = {}


@pytest.fixture(scope="module")
def report():
    yield _REPORT
    text = json.dumps(_REPORT, indent=2, sort_keys=True)
    print("\nextent FDP guest report:\n" + text)
    dest = os.environ.get("RB_EXTENT_FDP_REPORT")
    if dest:
        Path(dest).write_text(text + "\n")


@pytest.fixture(scope="module")
def ident(nvme_char) -> dict:
    return dsm_identity(nvme_char)


@pytest.fixture(scope="module", autouse=True)
def blank(nvme_char, nvme_geometry, ident):
    blank_namespace(nvme_char, nvme_geometry["size"], ident["lba_size"], ident["dmrsl"])
    yield
    blank_namespace(nvme_char, nvme_geometry["size"], ident["lba_size"], ident["dmrsl"])


def core_on(path: str, *, passthrough: bool = True, **kw) -> RawBlockCore:
    kw.setdefault("slot_bytes", 4 * MiB)
    kw.setdefault("meta_total_bytes", 4 * MiB)
    kw.setdefault("meta_format", "log")
    kw.setdefault("extent_bytes", "auto")
    kw.setdefault("load_checkpoint_on_init", False)
    if passthrough:
        kw.update(io_engine="io_uring", use_uring_cmd=True, iouring_queue_depth=64)
    else:
        kw.update(io_engine="posix", use_odirect=True)
    return RawBlockCore(make_config(path, **kw), key_namespace="object")


def status(core: RawBlockCore) -> dict:
    return core._native.status()


def extent_of(core: RawBlockCore, key) -> int:
    st = status(core)
    eb = st["extent_bytes"]
    return core.entry_offset(key.encoded) // eb  # extents lie on extent_bytes boundaries of the device


# ---------------------------------------------------------------- the controller's own count


class Trace:
    """QEMU's trace log of the controller (rig.py --trace 'pci_nvme_dsm*'): the Dataset
    Management commands it executed and their deallocated ranges, from a point on."""

    def __init__(self) -> None:
        self.path = os.environ.get("RB_NVME_TRACE")
        self.at = os.path.getsize(self.path) if self.path else 0

    def since(self) -> tuple[list[int], list[tuple[int, int]]]:
        """(ranges per DSM command, [(slba, nlb)] deallocated) logged since construction."""
        assert self.path
        with open(self.path, encoding="utf-8", errors="replace") as f:
            f.seek(self.at)
            text = f.read()
        cmds = [int(m.group(1)) for m in re.finditer(r"pci_nvme_dsm nr (\d+) attr 0x([0-9a-f]+)", text)]
        ranges = [(int(m.group(1)), int(m.group(2)))
                  for m in re.finditer(r"pci_nvme_dsm_deallocate slba (\d+) nlb (\d+)", text)]
        return cmds, ranges


def needs_trace() -> None:
    if not os.environ.get("RB_NVME_TRACE"):
        pytest.skip("the controller's trace is not logged: run the rig with --trace 'pci_nvme_dsm*' "
                    "(make test-nvme does)")


# ---------------------------------------------------------------- 1. auto is the reclaim unit


@pytest.mark.parametrize("fmt,slot", [("log", 4 * MiB), ("log", 3 * MiB), ("v1", 3 * MiB)])
def test_auto_is_the_namespaces_reclaim_unit_through_passthrough(nvme_char, nvme_geometry, report, fmt, slot):
    ru = nvme_geometry["ru_size"]
    cfg = _native.nvme_fdp_report(nvme_char)["config"]
    assert cfg["runs"] == ru, cfg  # the drive's own answer, read independently of the core
    c = core_on(nvme_char, meta_format=fmt, slot_bytes=slot, capacity_bytes=0)
    try:
        st = status(c)
        want = ru if fmt == "log" else ru // slot * slot  # v1: whole slots, rounded down
        got = {k: st[k] for k in ("extent_bytes", "extent_bytes_source", "extent_reclaim_unit_bytes")}
        assert got == {"extent_bytes": want, "extent_bytes_source": "fdp_reclaim_unit",
                       "extent_reclaim_unit_bytes": ru}
        assert st["extent_slots"] == ru // slot
        assert st["extent_stride"] == (ru if fmt == "log" and ru % slot else 0)  # strided: log format only
        rep = c.report_status()
        assert rep["extent_bytes"] == want and rep["extent_bytes_source"] == "fdp_reclaim_unit"
        report.setdefault("auto", {})[f"ng {fmt} slot {slot}"] = dict(got, extents=st["extents_total"],
                                                                       slots_per_extent=st["extent_slots"])
    finally:
        c.close()


def test_auto_is_the_reclaim_unit_through_the_block_device(nvme_block, nvme_geometry, report):
    c = core_on(nvme_block, passthrough=False, capacity_bytes=0)
    try:
        st = status(c)
        assert (st["extent_bytes"], st["extent_bytes_source"]) == (nvme_geometry["ru_size"], "fdp_reclaim_unit")
        report.setdefault("auto", {})["nvme block log slot 4 MiB"] = st["extent_bytes"]
    finally:
        c.close()


# ---------------------------------------------------------------- 2. one command per extent


def data(i: int, size: int) -> bytes:
    """A payload of key i: core_helpers' pattern for small ones; one repeated byte for whole
    slots (building megabytes byte by byte in Python costs minutes under emulation)."""
    return payload(i, size) if size <= 65536 else bytes([i % 251 + 1]) * size


def fill(c: RawBlockCore, model: str, n: int, size: int = 8192, first: int = 0, pids=None) -> list:
    keys = [okey(first + i, model=model) for i in range(n)]
    for lo in range(0, n, 32):
        part = range(lo, min(n, lo + 32))
        pl = None if pids is None else [pids[i] for i in part]
        r = c.put_many([keys[i] for i in part], [Obj(data(first + i, size)) for i in part], placement_ids=pl)
        assert r.results == [True] * len(part), r.failure
    return keys


@pytest.mark.parametrize("slot,whole", [(4 * MiB, 1), (4 * MiB, 2), (3 * MiB, 2)])
def test_an_extent_is_deallocated_by_one_command(nvme_char, nvme_block, nvme_geometry, ident, report, slot, whole):
    """whole = 1: one extent freed; 2: two adjacent extents freed together: one merged range with
    whole slots, one range per extent (its unused tail included) with the strided layout (3 MiB
    slots in a 64 MiB unit), in one command either way."""
    ru, lba = nvme_geometry["ru_size"], ident["lba_size"]
    fill_byte = deallocated_byte(ident["dlfeat_read"])
    c = core_on(nvme_char, capacity_bytes=0, slot_bytes=slot)
    try:
        c._native.set_dealloc_log(True)
        per = status(c)["extent_slots"]
        keys = fill(c, f"ext_dl{whole}", (whole + 1) * per)  # the next extent opened: these are closed
        c.checkpoint_now()
        exts = sorted({extent_of(c, k) for k in keys[:whole * per]})
        assert len(exts) == whole and exts == list(range(exts[0], exts[0] + whole))
        offs = [c.entry_offset(k.encoded) for k in keys[:whole * per]]
        before, trace = status(c), Trace()
        assert c.delete_many([k.encoded for k in keys[:whole * per]]) == [True] * (whole * per)
        c.checkpoint_now()  # FREE records durable: the extents are whole free, then deallocated
        st = status(c)
        got = {k: st[k] - before[k] for k in ("dealloc_commands", "dealloc_ranges", "dealloc_bytes",
                                              "extent_deallocs", "extent_dealloc_skipped")}
        journal = c._native.take_dealloc_log()
        want = [(e * ru, ru) for e in exts] if ru % slot else [(exts[0] * ru, whole * ru)]
        assert journal == want
        assert got == {"dealloc_commands": 1, "dealloc_ranges": len(want), "dealloc_bytes": whole * ru,
                       "extent_deallocs": whole, "extent_dealloc_skipped": 0}
        # The headers the keys left read back as the namespace promises for deallocated blocks.
        for off in offs:
            assert read_direct(nvme_block, off, 4096) == bytes([fill_byte]) * 4096
        seen = None
        if os.environ.get("RB_NVME_TRACE"):
            cmds, ranges = trace.since()
            seen = {"commands": len(cmds), "ranges_per_command": cmds, "ranges": ranges}
            assert cmds == [len(want)], f"the controller executed {cmds} (ranges per DSM command)"
            assert ranges == [(off // lba, ln // lba) for off, ln in want]
        report[f"dealloc_{whole}_extent_slot_{slot >> 20}M"] = {"core": got, "journal": journal, "controller": seen,
                                             "extent_bytes": ru, "slots_per_extent": per}
    finally:
        c.close()


def test_the_controller_trace_is_logged(nvme_char, ident):
    """The drive-side count above needs the trace: a command of our own shows in it."""
    needs_trace()
    trace = Trace()
    buf = ctypes.create_string_buffer(16)
    # one range of 8 blocks at LBA 4096 (our own command, independent of the core)
    ctypes.memmove(buf, (0).to_bytes(4, "little") + (8).to_bytes(4, "little") + (4096).to_bytes(8, "little"), 16)
    assert passthru(nvme_char, NVME_IOCTL_IO_CMD, 0x09, 1, buf, cdw10=0, cdw11=1 << 2) == 0
    assert trace.since() == ([1], [(4096, 8)])


# ---------------------------------------------------------------- 3. an extent on its handle


def ruh_update(path: str, pids: list[int]) -> None:
    """I/O Management Send, Reclaim Unit Handle Update: each handle moves to a fresh unit."""
    data = b"".join(p.to_bytes(2, "little") for p in pids)
    buf = ctypes.create_string_buffer(data, max(4, len(data)))
    st = passthru(path, NVME_IOCTL_IO_CMD, 0x1D, 1, buf, cdw10=1 | ((len(pids) - 1) << 16))
    assert st == 0, f"I/O Management Send (RUH update): NVMe status {st:#x}"


def test_an_extents_writes_land_on_its_streams_handle(nvme_char, nvme_geometry, ident, report):
    ru, lba, slot = nvme_geometry["ru_size"], ident["lba_size"], 4 * MiB
    full = ru // lba  # blocks of a whole reclaim unit
    c = core_on(nvme_char, capacity_bytes=0, slot_bytes=slot, fdp_slot_affinity_enabled=True,
                meta_checkpoint_placement_id=9)
    try:
        per = status(c)["extent_slots"]
        assert per * slot == ru, "a whole-slot extent of the reclaim unit's size"
        a, b = 2, 3
        ruh_update(nvme_char, [a, b])  # the extents below start on fresh units of both handles
        start = ruamw(nvme_char)
        assert start[a] == start[b] == full, start
        # All but the last slot of one extent per stream, the two streams' puts interleaved.
        n = 2 * (per - 1)
        pids = [a if i % 2 == 0 else b for i in range(n)]
        keys = fill(c, "ext_place", n, size=slot - HEADER, pids=pids)
        mid = ruamw(nvme_char)
        moved = {p: start[p] - mid[p] for p in start if start[p] != mid[p] and p != 9}  # 9: checkpoints
        assert moved == {a: (per - 1) * slot // lba, b: (per - 1) * slot // lba}, moved
        ext = {p: {extent_of(c, k) for k, q in zip(keys, pids) if q == p} for p in (a, b)}
        assert len(ext[a]) == 1 and len(ext[b]) == 1 and ext[a] != ext[b], ext
        # The last slot of each extent: its unit is written to its end, and the handle takes a
        # fresh one (QEMU: RUAMW back to a whole unit); no byte of either extent went elsewhere.
        last = fill(c, "ext_place", 2, size=slot - HEADER, first=n, pids=[a, b])
        end = ruamw(nvme_char)
        assert {extent_of(c, k) for k in last} == ext[a] | ext[b]
        outs = [Obj(slot - HEADER) for _ in keys + last]
        assert c.load_many_into([k.encoded for k in keys + last], outs) == [True] * (n + 2)
        assert [o.bytes() for o in outs] == [data(i, slot - HEADER) for i in range(n + 2)]
        assert end[a] == end[b] == full, end
        assert {p for p in start if p not in (a, b, 9) and start[p] != end[p]} == set()
        report["placement"] = {"handles": [a, b], "slots_per_extent": per, "slot_bytes": slot,
                               "blocks_moved_before_last_slot": moved, "ruamw_at_start": {a: start[a], b: start[b]},
                               "ruamw_after_the_extents": {a: end[a], b: end[b]}, "unit_blocks": full,
                               "extents": {str(p): sorted(e) for p, e in ext.items()}}
    finally:
        c.close()


def test_without_slot_affinity_one_extent_takes_both_streams(nvme_char):
    """The contrast: with one writer stream (affinity off) an extent mixes placement ids, so its
    unit is no handle's (the plugin and MP adapter turn affinity on with fdp_enabled)."""
    c = core_on(nvme_char, capacity_bytes=0)
    try:
        keys = fill(c, "ext_mixed", 4, pids=[2, 3, 2, 3])
        assert len({extent_of(c, k) for k in keys}) == 1
    finally:
        c.close()


# ---------------------------------------------------------------- 4. the room-making put


def test_room_making_put_takes_a_freed_extent_undeallocated(nvme_char, nvme_geometry, report):
    c = core_on(nvme_char, capacity_bytes=5 * nvme_geometry["ru_size"])  # 4 whole extents
    try:
        st = status(c)
        per, total = st["extent_slots"], st["extents_total"]
        keys = fill(c, "ext_room", per * total)  # every slot of every extent
        c.checkpoint_now()
        first = sorted(keys, key=lambda k: c.entry_offset(k.encoded))
        victim, other = first[:per], first[per:2 * per]
        # The room-making put: deletes with no checkpoint after them, then a put that finds no
        # free slot writes the checkpoint that frees them and takes the extent at once.
        before, trace = status(c), Trace()
        assert c.delete_many([k.encoded for k in victim]) == [True] * per
        extra = okey(10**6, model="ext_room")
        assert c.put_many([extra], [Obj(payload(1, 8192))]).results == [True]
        st = status(c)
        room = {k: st[k] - before[k] for k in ("dealloc_commands", "dealloc_skipped", "extent_dealloc_skipped",
                                               "extent_deallocs")}
        assert room == {"dealloc_commands": 0, "dealloc_skipped": per, "extent_dealloc_skipped": 1,
                        "extent_deallocs": 0}
        if os.environ.get("RB_NVME_TRACE"):
            assert trace.since() == ([], [])
        # The evictor's order: deletes, the checkpoint, then puts: deallocated before any reuse.
        before, trace = status(c), Trace()
        assert c.delete_many([k.encoded for k in other]) == [True] * per
        c.checkpoint_now()
        st = status(c)
        ahead = {k: st[k] - before[k] for k in ("dealloc_commands", "dealloc_skipped", "extent_dealloc_skipped",
                                                "extent_deallocs")}
        assert ahead == {"dealloc_commands": 1, "dealloc_skipped": 0, "extent_dealloc_skipped": 0,
                         "extent_deallocs": 1}
        if os.environ.get("RB_NVME_TRACE"):
            assert trace.since()[0] == [1]
        report["room_making_put"] = {"room_making": room, "delete_checkpoint_put": ahead,
                                     "slots_per_extent": per, "extents": total}
    finally:
        c.close()


# ---------------------------------------------------------------- 5. the error names everything

CHILD = r"""
import json, sys
sys.path.insert(0, "tests")
from core_helpers import make_config
from lmcache_rawblock.raw_block import RawBlockCore
cfg = make_config(sys.argv[1], io_engine="posix", use_odirect=True,
                  slot_bytes=4 << 20, meta_total_bytes=4 << 20, meta_format="log", extent_bytes="auto",
                  load_checkpoint_on_init=False)
try:
    RawBlockCore(cfg, key_namespace="object").close()
    print(json.dumps({"opened": True}))
except Exception as e:
    print(json.dumps({"type": type(e).__name__, "errno": getattr(e, "errno", None), "text": str(e)}))
"""


def test_auto_that_cannot_read_the_fdp_configuration_is_refused_naming_it(nvme_block):
    """Root without CAP_SYS_ADMIN: the NVMe block device opens and takes reads and writes, but
    not the admin commands auto reads the FDP configuration with: the open fails naming the
    setting, its value, the path and the errno, rather than opening without extents. (Through
    passthrough, Linux 6.1 refuses the namespace's Identify before: no core opens there.)"""
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("setpriv (util-linux) is not installed: cannot drop CAP_SYS_ADMIN")
    r = subprocess.run([setpriv, "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", "--",
                        sys.executable, "-c", CHILD, nvme_block], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[2], timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got.get("type") == "PermissionError" and got.get("errno") == 13, got
    assert "extent_bytes=auto" in got["text"] and nvme_block in got["text"] and "errno 13" in got["text"], got
