"""The drive's wear counters and `waf precondition` on the emulated FDP namespace: the counters
move by what the host wrote, and a preconditioning run reports the calibration window's WAF
(QEMU's FDP emulation writes media exactly as the host does, so WAF = 1 and the steady-state
warning is printed)."""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import struct
import subprocess
import sys

from lmcache_rawblock import _native
from lmcache_rawblock_bench.waf import counters

MiB = 1 << 20

# struct nvme_passthru_cmd (72 bytes) and _IOWR('N', 0x41 / 0x43, it): admin / I/O passthrough
PASSTHRU = struct.Struct("<BBHIIIQQIIIIIIIIII")
NVME_IOCTL_ADMIN_CMD = 0xC0484E41
NVME_IOCTL_IO_CMD = 0xC0484E43


def passthru(path: str, request: int, opcode: int, nsid: int, data: bytes, cdw10: int = 0, cdw11: int = 0,
             cdw12: int = 0) -> int:
    """One host-to-controller passthrough command; the NVMe status (0 = success)."""
    buf = ctypes.create_string_buffer(data, len(data))
    cmd = bytearray(PASSTHRU.pack(opcode, 0, 0, nsid, 0, 0, 0, ctypes.addressof(buf), 0, len(data),
                                  cdw10, cdw11, cdw12, 0, 0, 0, 0, 0))
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fcntl.ioctl(fd, request, cmd, True)
    finally:
        os.close(fd)


def write_direct(path: str, offset: int, nbytes: int) -> None:
    buf = mmap.mmap(-1, MiB)
    buf.write(os.urandom(MiB))
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    try:
        for off in range(offset, offset + nbytes, MiB):
            assert os.pwrite(fd, buf, off) == MiB
        os.fsync(fd)
    finally:
        os.close(fd)


def test_counters_have_every_part_on_an_fdp_namespace(nvme_char, nvme_block):
    c = _native.nvme_wear_counters(nvme_char)
    assert c["nsid"] == 1 and c["endgid"] >= 1 and c["fdp_enabled"] is True
    assert set(c["smart"]) == {"data_units_written", "data_units_read", "host_write_commands", "host_read_commands"}
    assert set(c["fdp_stats"]) == {"hbmw", "mbmw", "mbe"}
    assert set(c["fdp_events"]) == {"host", "controller", "by_type"}
    assert all(isinstance(v, int) for v in (c["fdp_events"]["host"], c["fdp_events"]["controller"]))
    b = counters.read_counters(nvme_block)  # the block device reaches the same namespace
    assert b["nsid"] == c["nsid"] and b["endgid"] == c["endgid"] and b["time"] > 0


def test_controller_node_is_not_a_namespace(nvme_ctrl):
    assert counters.read_counters(nvme_ctrl) is None


def test_counters_grow_by_what_the_host_wrote(nvme_char, nvme_block, nvme_geometry):
    n = 16 * MiB
    offset = nvme_geometry["size"] - 64 * MiB  # away from the other tests' usual offsets
    before = counters.read_counters(nvme_char)
    write_direct(nvme_block, offset, n)
    after = counters.read_counters(nvme_char)
    w = counters.window(before, after)
    assert w["available"] is True, w["note"]
    assert w["host_bytes"] >= n and w["media_bytes"] >= n
    assert w["smart_written_bytes"] >= n - 512_000  # 512,000-byte units
    assert after["smart"]["data_units_written"] > before["smart"]["data_units_written"]
    assert w["host_write_commands"] >= n // MiB  # one command per 1 MiB write at least
    assert w["waf"] is not None and w["waf"] >= 1.0


def precondition(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmcache_rawblock", "waf", "precondition", *args],
                          capture_output=True, text=True, timeout=600)


def test_precondition_reports_the_window_waf_with_the_warning(nvme_char):
    span = 32 * MiB
    r = precondition("--device", nvme_char, "--span", str(span), "--block", "1M", "--random-block", "64K",
                     "--overwrite", "0.5", "--calibrate", "0.25", "--destroy-data", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["write_path"] == os.environ["RB_NVME_BLOCK"] and rep["kind"] == "block-device"
    assert rep["span_bytes"] == span and rep["o_direct"] is True
    cal = rep["calibration"]
    assert cal["available"] is True, cal["note"]
    assert cal["host_bytes"] >= span // 4 and cal["written_bytes"] == span // 4
    assert abs(rep["waf"] - 1.0) <= 0.05
    assert "not in steady state" in rep["warning"]
    assert "calibration" in r.stderr  # progress


def test_precondition_text_prints_waf_and_warning(nvme_block):
    r = precondition("--device", nvme_block, "--span", "8M", "--block", "1M", "--random-block", "128K",
                     "--overwrite", "0", "--calibrate", "0.5", "--destroy-data")
    assert r.returncode == 0, r.stderr
    assert "WAF 1.0" in r.stdout
    assert "warning:" in r.stdout and "QEMU" in r.stdout


def test_reclaim_unit_swap_shows_media_writes_and_a_host_event(nvme_char, nvme_block, nvme_geometry):
    """An RUH Update (I/O Management Send) retires a reclaim unit that is not fully written: the
    emulation charges the unwritten rest of the unit to media bytes written (the garbage
    collection it would cost) and, with the event enabled, logs "RU not fully written" (type 0)."""
    nsid = _native.nvme_wear_counters(nvme_char)["nsid"]
    # Set Features, FDP Events (1Eh) for placement handle 0: one event type (0), enabled.
    st = passthru(nvme_char, NVME_IOCTL_ADMIN_CMD, 0x09, nsid, bytes([0]), cdw10=0x1E, cdw11=(1 << 16) | 0,
                  cdw12=1)
    assert st == 0, f"set features FDP events: NVMe status {st:#x}"
    write_direct(nvme_block, nvme_geometry["size"] - 128 * MiB, MiB)  # no directive: placement handle 0
    before = counters.read_counters(nvme_char)
    # I/O Management Send (1Dh), MO 1 = Reclaim Unit Handle Update, one placement identifier (0).
    st = passthru(nvme_char, NVME_IOCTL_IO_CMD, 0x1D, nsid, struct.pack("<H", 0), cdw10=1)
    assert st == 0, f"RUH update: NVMe status {st:#x}"
    after = counters.read_counters(nvme_char)
    w = counters.window(before, after)
    assert w["available"] is True and w["host_bytes"] == 0
    assert w["media_bytes"] > 0  # the unwritten rest of the retired unit
    assert w["waf"] is None and "wrote nothing" in w["note"]
    assert w["events_host"] >= 1
    assert after["fdp_events"]["by_type"].get(0, 0) >= 1

    # the same swap inside a window that also writes: WAF well above 1 and no steady-state warning
    before = counters.read_counters(nvme_char)
    write_direct(nvme_block, nvme_geometry["size"] - 128 * MiB, MiB)
    st = passthru(nvme_char, NVME_IOCTL_IO_CMD, 0x1D, nsid, struct.pack("<H", 0), cdw10=1)
    assert st == 0
    w = counters.window(before, counters.read_counters(nvme_char))
    assert w["host_bytes"] >= MiB and w["waf"] > 1.5
    assert counters.steady_state_warning(w["waf"]) is None
