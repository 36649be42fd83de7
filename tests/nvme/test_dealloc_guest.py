"""Deallocation of freed slots on the emulated NVMe controller, through the passthrough core
(io_uring NVMe commands on /dev/ng0n1): the controller advertises Dataset Management, the core's
deallocate commands reach it (the ranges it journals are the deleted slots, they read back as
the value the namespace's DLFEAT promises, the controller's DMRL bounds the ranges per command),
a crash after the deallocation recovers only the surviving keys, and the drive's wear counters
around a deallocation batch.

Raw reads go through the namespace's block device (/dev/nvme0n1) with O_DIRECT, so no page
cache stands between the test and the controller. Identify data (ONCS, DMRL, DMRSL, DLFEAT) is
read with admin passthrough ioctls of our own, independently of the C core's parsing.

The figures (DLFEAT, commands, ranges, counters before and after) are printed (pytest -s) and,
when RB_DEALLOC_REPORT names a file, written there as JSON
(benchmarks/results/dealloc/nvme-guest.md is made from it).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from core_helpers import Obj, make_config, merged_ranges as merged, okey, payload
from lmcache_rawblock.raw_block import RawBlockCore
from lmcache_rawblock_bench.waf import counters

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]

# struct nvme_passthru_cmd (72 bytes) and _IOWR('N', 0x41 / 0x43, it): admin / I/O passthrough
PASSTHRU = struct.Struct("<BBHIIIQQIIIIIIIIII")
NVME_IOCTL_ADMIN_CMD = 0xC0484E41
NVME_IOCTL_IO_CMD = 0xC0484E43
DSM_RANGE = struct.Struct("<IIQ")  # context attributes, length in blocks (1-based), starting LBA
HDR_MAGIC = b"LMCBLK01"


# ---------------------------------------------------------------- raw NVMe, independent of the core


def passthru(path: str, request: int, opcode: int, nsid: int, buf: ctypes.Array, cdw10: int = 0,
             cdw11: int = 0) -> int:
    cmd = bytearray(PASSTHRU.pack(opcode, 0, 0, nsid, 0, 0, 0, ctypes.addressof(buf), 0, len(buf),
                                  cdw10, cdw11, 0, 0, 0, 0, 0, 0))
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fcntl.ioctl(fd, request, cmd, True)
    finally:
        os.close(fd)


def identify(path: str, cns: int, nsid: int = 0, csi: int = 0) -> bytes:
    buf = ctypes.create_string_buffer(4096)
    st = passthru(path, NVME_IOCTL_ADMIN_CMD, 0x06, nsid, buf, cdw10=cns, cdw11=csi << 24)
    assert st == 0, f"Identify CNS {cns:#x}: NVMe status {st:#x}"
    return buf.raw


def dsm_identity(path: str) -> dict:
    """What the controller and namespace say about Dataset Management."""
    ctrl = identify(path, 0x01)
    ns = identify(path, 0x00, nsid=1)
    nvm = identify(path, 0x06, csi=0)  # I/O command set specific Identify Controller, NVM
    dlfeat = ns[33]
    return {
        "oncs": struct.unpack_from("<H", ctrl, 520)[0],
        "dsm": bool(struct.unpack_from("<H", ctrl, 520)[0] & 0x4),
        "dlfeat": dlfeat,
        "dlfeat_read": dlfeat & 0x7,
        "dmrl": nvm[3],
        "dmrsl": struct.unpack_from("<I", nvm, 4)[0],
        "lba_size": 1 << ns[128 + 4 * (ns[26] & 0xF) + 2],
    }


def deallocate_raw(path: str, lba_size: int, ranges: list[tuple[int, int]]) -> None:
    """One Dataset Management (deallocate) command of our own over byte ranges."""
    data = b"".join(DSM_RANGE.pack(0, ln // lba_size, off // lba_size) for off, ln in ranges)
    buf = ctypes.create_string_buffer(data, len(data))
    st = passthru(path, NVME_IOCTL_IO_CMD, 0x09, 1, buf, cdw10=len(ranges) - 1, cdw11=1 << 2)
    assert st == 0, f"Dataset Management: NVMe status {st:#x}"


def read_direct(path: str, offset: int, length: int) -> bytes:
    buf = mmap.mmap(-1, length)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    try:
        got = os.preadv(fd, [buf], offset)
    finally:
        os.close(fd)
    assert got == length, f"short read at {offset}: {got} of {length}"
    return bytes(buf)


def deallocated_byte(dlfeat_read: int) -> int:
    """The value a read of a deallocated block returns, from DLFEAT bits 2:0."""
    assert dlfeat_read in (1, 2), f"DLFEAT bits 2:0 = {dlfeat_read}: the namespace promises no read value"
    return 0x00 if dlfeat_read == 1 else 0xFF


# ---------------------------------------------------------------- the core and the report


def pt_core(path: str, **kw) -> RawBlockCore:
    kw.setdefault("slot_bytes", 256 * 1024)
    kw.setdefault("meta_total_bytes", 4 * MiB)
    kw.setdefault("capacity_bytes", 128 * MiB)
    kw.setdefault("meta_format", "log")
    cfg = make_config(path, io_engine="io_uring", use_uring_cmd=True, iouring_queue_depth=64, **kw)
    return RawBlockCore(cfg, key_namespace="object")


def dealloc_status(core: RawBlockCore) -> dict:
    return {k: v for k, v in core._native.status().items() if k.startswith("dealloc_")}


_REPORT: dict = {}


@pytest.fixture(scope="module")
def report():
    yield _REPORT
    text = json.dumps(_REPORT, indent=2, sort_keys=True)
    print("\ndealloc guest report:\n" + text)
    dest = os.environ.get("RB_DEALLOC_REPORT")
    if dest:
        Path(dest).write_text(text + "\n")


def blank_namespace(char: str, size: int, lba: int, dmrsl: int) -> None:
    """Deallocate the whole namespace (our own command): no checkpoint of a previous test or
    module is left to recover, and none of ours is left for the next module."""
    step = (dmrsl or (1 << 31) // lba) * lba
    deallocate_raw(char, lba, [(off, min(step, size - off)) for off in range(0, size, step)])


@pytest.fixture(scope="module", autouse=True)
def blank(nvme_char, nvme_geometry, ident):
    blank_namespace(nvme_char, nvme_geometry["size"], ident["lba_size"], ident["dmrsl"])
    yield
    blank_namespace(nvme_char, nvme_geometry["size"], ident["lba_size"], ident["dmrsl"])


@pytest.fixture(scope="module")
def ident(nvme_char, report) -> dict:
    d = dsm_identity(nvme_char)
    report["identify"] = dict(d, oncs=f"{d['oncs']:#x}", dlfeat=f"{d['dlfeat']:#x}")
    return d


def check_loads(core: RawBlockCore, keys: list, data: list[bytes]) -> None:
    outs = [Obj(len(d)) for d in data]
    assert core.load_many_into([k.encoded for k in keys], outs) == [True] * len(keys)
    bad = [i for i, (o, d) in enumerate(zip(outs, data)) if o.bytes() != d]
    assert not bad, f"{len(bad)} keys loaded with wrong bytes, first {bad[:5]}"


def check_misses(core: RawBlockCore, keys: list, size: int) -> None:
    assert core.load_many_into([k.encoded for k in keys], [Obj(size) for _ in keys]) == [False] * len(keys)
    assert core.exists_many([k.encoded for k in keys]) == [False] * len(keys)


def check_deallocated(block: str, ranges: list[tuple[int, int]], fill: int) -> None:
    for off, ln in ranges:
        got = read_direct(block, off, ln)
        assert got == bytes([fill]) * ln, (
            f"range ({off}, {ln}) does not read as deallocated ({fill:#04x}): first bytes {got[:16]!r}; "
            f"a drive that completes the command but keeps the data (QEMU -drive discard=ignore) looks like this")


# ---------------------------------------------------------------- 1. advertised; off means off


def test_controller_advertises_dataset_management_and_auto_turns_it_on(nvme_char, ident, report):
    assert ident["dsm"], f"ONCS {ident['oncs']:#x}: bit 2 (Dataset Management) clear"
    c = pt_core(nvme_char, load_checkpoint_on_init=False)
    try:
        st = dealloc_status(c)
        report["status_auto"] = {k: st[k] for k in ("dealloc_state", "dealloc_kind", "dealloc_unsupported_reason")}
        assert st["dealloc_state"] == "on" and st["dealloc_kind"] == "nvme_dsm"
        assert st["dealloc_unsupported_reason"] == ""
        assert st["dealloc_commands"] == 0 and st["dealloc_pending_slots"] == 0
        # the core read the same Identify data
        info = c._native.nvme_info()
        assert info["dsm_supported"] is True
        assert info["dsm_max_ranges"] == (ident["dmrl"] if 0 < ident["dmrl"] < 256 else 256)
        assert info["dsm_max_range_blocks"] == (ident["dmrsl"] or 0xFFFFFFFF)
        assert info["deallocated_reads"] == {0: "not reported", 1: "zeros", 2: "ones"}.get(
            ident["dlfeat_read"], "reserved")
    finally:
        c.close()


def test_off_deallocates_nothing(nvme_char, nvme_block, ident):
    c = pt_core(nvme_char, load_checkpoint_on_init=False, deallocate_freed="off")
    try:
        c._native.set_dealloc_log(True)
        assert dealloc_status(c)["dealloc_state"] == "off"
        keys = [okey(i, model="dl_off") for i in range(6)]
        assert c.put_many(keys, [Obj(payload(i, 100_000)) for i in range(6)]).results == [True] * 6
        offs = [c.entry_offset(k.encoded) for k in keys]
        assert c.delete_many([k.encoded for k in keys[:4]]) == [True] * 4
        c.checkpoint_now()
        c.checkpoint_now()
        st = dealloc_status(c)
        assert (st["dealloc_commands"], st["dealloc_slots"], st["dealloc_bytes"]) == (0, 0, 0)
        assert st["dealloc_pending_slots"] == 0
        assert c._native.take_dealloc_log() == []
        for off in offs[:4]:  # the freed slots still hold their headers on the drive
            assert read_direct(nvme_block, off, 4096)[:8] == HDR_MAGIC
    finally:
        c.close()


# ---------------------------------------------------------------- 2. the command reaches the drive


@pytest.mark.parametrize("meta_format", ["log", "v1"])
def test_deleted_slots_read_back_deallocated(nvme_char, nvme_block, ident, report, meta_format):
    fill = deallocated_byte(ident["dlfeat_read"])
    slot = 256 * 1024
    c = pt_core(nvme_char, load_checkpoint_on_init=False, meta_format=meta_format, slot_bytes=slot)
    try:
        c._native.set_dealloc_log(True)
        n = 16
        keys = [okey(i, model=f"dl_read_{meta_format}") for i in range(n)]
        data = [payload(i, 150_000 + 3000 * i) for i in range(n)]
        assert c.put_many(keys, [Obj(d) for d in data]).results == [True] * n
        c.checkpoint_now()
        offs = {i: c.entry_offset(k.encoded) for i, k in enumerate(keys)}
        # Runs of adjacent slots (1-2, 5-6-7) and single ones (10, 15) are freed.
        gone = [1, 2, 5, 6, 7, 10, 15]
        for i in gone:
            assert read_direct(nvme_block, offs[i], 4096)[:8] == HDR_MAGIC
        before = dealloc_status(c)
        assert c.delete_many([keys[i].encoded for i in gone]) == [True] * len(gone)
        # Reusable (and deallocated) once no durable metadata lists them. The log format: the
        # checkpoint that makes the FREE records durable. Format v1: both containers must have
        # been rewritten without them, and a checkpoint writes one container only after a change
        # (here a put, which cannot land on the deleted slots: they are not reusable yet).
        c.checkpoint_now()
        if meta_format == "v1":
            assert dealloc_status(c)["dealloc_slots"] == before["dealloc_slots"]
            extra = okey(n, model=f"dl_read_{meta_format}")
            assert c.put_many([extra], [Obj(payload(n, 5000))]).results == [True]
            assert c.entry_offset(extra.encoded) not in [offs[i] for i in gone]
            keys.append(extra)
            data.append(payload(n, 5000))
            c.checkpoint_now()
        st = dealloc_status(c)
        log = c._native.take_dealloc_log()
        expected = merged([offs[i] for i in gone], slot)
        assert log == expected
        assert st["dealloc_commands"] - before["dealloc_commands"] >= 1
        assert st["dealloc_slots"] - before["dealloc_slots"] == len(gone)
        assert st["dealloc_ranges"] - before["dealloc_ranges"] == len(expected)
        assert st["dealloc_bytes"] - before["dealloc_bytes"] == len(gone) * slot
        assert st["dealloc_failures"] == 0 and st["dealloc_pending_slots"] == 0
        check_deallocated(nvme_block, expected, fill)
        kept = [i for i in range(len(keys)) if i not in gone]
        check_loads(c, [keys[i] for i in kept], [data[i] for i in kept])
        check_misses(c, [keys[i] for i in gone], 200_000)
        report[f"read_back_{meta_format}"] = {
            "deleted_slots": len(gone), "journal_ranges": log, "commands": st["dealloc_commands"],
            "ranges": st["dealloc_ranges"], "bytes": st["dealloc_bytes"], "read_value": f"{fill:#04x}",
        }
    finally:
        c.close()


# ---------------------------------------------------------------- 3. ranges at the command's limit


def test_more_ranges_than_one_command_takes(nvme_char, nvme_block, ident, report):
    """511 non-adjacent freed slots in one batch: one command per DMRL ranges (QEMU reports 255,
    so 3 commands where 256 ranges a command would take 2)."""
    fill = deallocated_byte(ident["dlfeat_read"])
    per_cmd = ident["dmrl"] if 0 < ident["dmrl"] < 256 else 256
    slot = 64 * 1024
    c = pt_core(nvme_char, load_checkpoint_on_init=False, slot_bytes=slot)
    try:
        c._native.set_dealloc_log(True)
        n = 1022
        keys = [okey(i, model="dl_batch") for i in range(n)]
        data = [payload(i, 4096 + (i % 7) * 512) for i in range(n)]
        for lo in range(0, n, 256):
            part = range(lo, min(n, lo + 256))
            assert c.put_many([keys[i] for i in part], [Obj(data[i]) for i in part]).results == [True] * len(part)
        c.checkpoint_now()
        offs = [c.entry_offset(k.encoded) for k in keys]
        by_off = sorted(range(n), key=lambda i: offs[i])
        gone = by_off[0::2]  # every other slot in device order: no two adjacent
        expected = merged([offs[i] for i in gone], slot)
        assert len(expected) == len(gone) == 511
        before = dealloc_status(c)
        assert c.delete_many([keys[i].encoded for i in gone]) == [True] * len(gone)
        c.checkpoint_now()
        st = dealloc_status(c)
        cmds = st["dealloc_commands"] - before["dealloc_commands"]
        want = -(-len(expected) // per_cmd)
        report["batch"] = {"freed_slots": len(gone), "ranges": st["dealloc_ranges"] - before["dealloc_ranges"],
                           "commands": cmds, "ranges_per_command_limit": per_cmd,
                           "dmrl": ident["dmrl"], "dmrsl": ident["dmrsl"],
                           "seconds": round(st["dealloc_seconds"] - before["dealloc_seconds"], 6)}
        assert cmds == want, f"{len(expected)} ranges, {per_cmd} a command: {want} commands expected, {cmds} issued"
        assert st["dealloc_ranges"] - before["dealloc_ranges"] == len(expected)
        assert c._native.take_dealloc_log() == expected
        check_deallocated(nvme_block, expected, fill)
        kept = by_off[1::2]
        check_loads(c, [keys[i] for i in kept], [data[i] for i in kept])
        check_misses(c, [keys[i] for i in gone[:64]], 8192)
    finally:
        c.close()


def test_a_long_merged_range_within_dmrsl(nvme_char, nvme_block, nvme_geometry, ident, report):
    """Adjacent 64 MiB slots over most of the namespace freed at once: one merged range, as long
    as the namespace allows. Past DMRSL blocks (QEMU: 524287 x 4 KiB, about 2 GiB; a namespace
    of 3 GiB, rig --ns-size 3G, reaches it) the device splits it into ranges of at most DMRSL
    blocks in one command; QEMU skips a longer range without an error, so the read-back proves
    the split. On the rig's default 1 GiB namespace the range stays below DMRSL: the test then
    proves a range of 2^18 blocks is neither truncated nor refused."""
    fill = deallocated_byte(ident["dlfeat_read"])
    slot = 64 * MiB
    c = pt_core(nvme_char, load_checkpoint_on_init=False, slot_bytes=slot, capacity_bytes=0)
    try:
        c._native.set_dealloc_log(True)
        n = c._native.status()["max_slots"]
        assert n >= 4, f"{n} slots of 64 MiB: the namespace is too small"
        keys = [okey(i, model="dl_long") for i in range(n)]
        data = [payload(i, 8192) for i in range(n)]
        assert c.put_many(keys, [Obj(d) for d in data]).results == [True] * n
        c.checkpoint_now()
        offs = [c.entry_offset(k.encoded) for k in keys]
        expected = merged(offs, slot)
        assert len(expected) == 1, "the slots are not adjacent"
        before = dealloc_status(c)
        assert c.delete_many([k.encoded for k in keys]) == [True] * n
        c.checkpoint_now()
        c.checkpoint_now()
        st = dealloc_status(c)
        assert c._native.take_dealloc_log() == expected
        assert st["dealloc_commands"] - before["dealloc_commands"] == 1  # split ranges share one command
        assert st["dealloc_failures"] == 0
        # Only the first 12 KiB of each slot were ever written (header + payload).
        check_deallocated(nvme_block, [(o, 12288) for o in offs], fill)
        check_misses(c, keys, 8192)
        lbas = expected[0][1] // ident["lba_size"]
        report["long_range"] = {"namespace_bytes": nvme_geometry["size"], "range_bytes": expected[0][1],
                                "range_blocks": lbas, "dmrsl": ident["dmrsl"],
                                "split_into": -(-lbas // ident["dmrsl"]) if ident["dmrsl"] else 1,
                                "commands": st["dealloc_commands"] - before["dealloc_commands"]}
    finally:
        c.close()


# ---------------------------------------------------------------- 4. crash after the deallocation

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, "tests")
from core_helpers import Obj, make_config, okey, payload
from lmcache_rawblock.raw_block import RawBlockCore
MiB = 1 << 20
cfg = make_config(sys.argv[1], io_engine="io_uring", use_uring_cmd=True, iouring_queue_depth=64,
                  slot_bytes=256 * 1024, meta_total_bytes=4 * MiB, capacity_bytes=128 * MiB,
                  meta_format="log", load_checkpoint_on_init=False)
c = RawBlockCore(cfg, key_namespace="object")
c._native.set_dealloc_log(True)
keys = [okey(i, model="dl_crash") for i in range(24)]
assert c.put_many(keys, [Obj(payload(i, 120_000 + 1000 * i)) for i in range(24)]).results == [True] * 24
c.checkpoint_now()
offs = [c.entry_offset(k.encoded) for k in keys]
gone = list(range(0, 24, 3)) + [1]
assert c.delete_many([keys[i].encoded for i in gone]) == [True] * len(gone)
c.checkpoint_now()
st = c._native.status()
print(json.dumps({"offs": offs, "gone": gone, "log": c._native.take_dealloc_log(),
                  "commands": st["dealloc_commands"], "pending": st["dealloc_pending_slots"]}), flush=True)
time.sleep(600)  # killed here: no close, no final checkpoint
"""


def test_crash_after_deallocation_recovers_only_the_survivors(nvme_char, nvme_block, ident, report):
    fill = deallocated_byte(ident["dlfeat_read"])
    slot = 256 * 1024
    child = subprocess.Popen([sys.executable, "-c", CHILD, nvme_char], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert line, f"the child exited ({child.returncode}) before deallocating"
    got = json.loads(line)
    offs, gone = got["offs"], got["gone"]
    expected = merged([offs[i] for i in gone], slot)
    assert got["commands"] >= 1 and got["pending"] == 0
    assert [tuple(r) for r in got["log"]] == expected
    check_deallocated(nvme_block, expected, fill)

    keys = [okey(i, model="dl_crash") for i in range(24)]
    data = [payload(i, 120_000 + 1000 * i) for i in range(24)]
    kept = [i for i in range(24) if i not in gone]
    # Recovery with start-up validation: the FREE records are durable, nothing is dropped.
    c = pt_core(nvme_char)
    try:
        st = c.report_status()
        assert st["recovery_outcome"] == "loaded"
        assert st["indexed_key_count"] == len(kept) and st["recovery_dropped_entries"] == 0
        check_loads(c, [keys[i] for i in kept], [data[i] for i in kept])
        check_misses(c, [keys[i] for i in gone], 150_000)
    finally:
        c.close()
    # A slot the checkpoint still lists, deallocated behind the core's back (a torn order the
    # core never produces itself): with start-up validation off, the load-time header check
    # reads the deallocated header and reports a miss; every other survivor loads intact.
    victim = kept[0]
    deallocate_raw(nvme_char, ident["lba_size"], [(offs[victim], slot)])
    check_deallocated(nvme_block, [(offs[victim], slot)], fill)
    c = pt_core(nvme_char, meta_verify_on_load=False)
    try:
        assert c.report_status()["indexed_key_count"] == len(kept)
        assert c.load_many_into([keys[victim].encoded], [Obj(len(data[victim]))]) == [False]
        rest = kept[1:]
        check_loads(c, [keys[i] for i in rest], [data[i] for i in rest])
        check_misses(c, [keys[i] for i in gone], 150_000)
    finally:
        c.close()
    # Reopened with start-up validation on: the entry is gone (dropped by recovery, or already
    # by the miss above), the others load intact.
    c = pt_core(nvme_char)
    try:
        st = c.report_status()
        assert st["indexed_key_count"] == len(kept) - 1, st["recovery_dropped_entries"]
        check_misses(c, [keys[victim]], len(data[victim]))
        check_loads(c, [keys[i] for i in kept[1:]], [data[i] for i in kept[1:]])
        dropped_on_reopen = st["recovery_dropped_entries"]
    finally:
        c.close()
    report["crash"] = {"deleted": len(gone), "survivors": len(kept), "ranges": expected,
                       "commands_before_kill": got["commands"], "dropped_on_reopen": dropped_on_reopen}


# ---------------------------------------------------------------- 5. the drive's counters


def test_wear_counters_around_a_deallocation_batch(nvme_char, nvme_block, ident, report):
    """The counters are read before and after the puts (they must move by what was written:
    they are live) and before and after the checkpoint that deallocates (host and media bytes
    written must not grow by the deallocated bytes: a deallocate writes no data)."""
    slot = 256 * 1024
    c = pt_core(nvme_char, load_checkpoint_on_init=False, slot_bytes=slot)
    try:
        n, size = 64, slot - 4096
        keys = [okey(i, model="dl_wear") for i in range(n)]
        c0 = counters.read_counters(nvme_char)
        assert c0 is not None and c0["fdp_stats"] is not None, "wear counters or FDP statistics unreadable"
        assert c.put_many(keys, [Obj(payload(i, size)) for i in range(n)]).results == [True] * n
        c.checkpoint_now()
        c1 = counters.read_counters(nvme_char)
        gone = list(range(0, n, 4)) + list(range(1, n, 4)) + list(range(2, n, 4))  # 48 of 64
        assert c.delete_many([keys[i].encoded for i in gone]) == [True] * len(gone)
        before = dealloc_status(c)
        c.checkpoint_now()  # FREE records, then the deallocation batch
        after = dealloc_status(c)
        c2 = counters.read_counters(nvme_char)
    finally:
        c.close()
    puts = counters.window(c0, c1)
    batch = counters.window(c1, c2)
    dealloc_bytes = after["dealloc_bytes"] - before["dealloc_bytes"]
    report["counters"] = {
        "before_puts": {k: c0[k] for k in ("smart", "fdp_stats")},
        "after_puts": {k: c1[k] for k in ("smart", "fdp_stats")},
        "after_dealloc": {k: c2[k] for k in ("smart", "fdp_stats")},
        "puts_window": {k: puts[k] for k in ("host_bytes", "media_bytes", "erased_bytes", "smart_written_bytes",
                                             "host_write_commands")},
        "dealloc_window": {k: batch[k] for k in ("host_bytes", "media_bytes", "erased_bytes", "smart_written_bytes",
                                                 "host_write_commands")},
        "dealloc": {"slots": after["dealloc_slots"] - before["dealloc_slots"],
                    "ranges": after["dealloc_ranges"] - before["dealloc_ranges"],
                    "commands": after["dealloc_commands"] - before["dealloc_commands"], "bytes": dealloc_bytes},
    }
    assert puts["available"] and batch["available"], (puts["note"], batch["note"])
    assert puts["host_bytes"] >= n * size  # live: they count what the puts wrote
    assert dealloc_bytes == len(gone) * slot and after["dealloc_commands"] > before["dealloc_commands"]
    # The batch window holds the checkpoint's metadata writes only.
    assert batch["host_bytes"] < dealloc_bytes // 8, batch
    assert batch["media_bytes"] < dealloc_bytes // 8, batch
    assert batch["smart_written_bytes"] < dealloc_bytes // 8, batch
    assert batch["erased_bytes"] >= 0
