"""The emulated NVMe guest is what the rig promises: the three device nodes, a namespace the
size of the backing file with 4 KiB LBAs, and FDP enabled with the configured reclaim unit
handles (checked through admin commands on the controller, as the engine will see it)."""

from __future__ import annotations

import ctypes
import fcntl
import os
import stat
import struct

import pytest

pytestmark = pytest.mark.nvme

BLKGETSIZE64 = 0x80081272
BLKSSZGET = 0x1268
# _IOWR('N', 0x41, struct nvme_passthru_cmd), 72 bytes
NVME_IOCTL_ADMIN_CMD = 0xC0484E41
PASSTHRU = struct.Struct("<BBHIIIQQIIIIIIIIII")  # opcode .. timeout_ms, result
assert PASSTHRU.size == 72


def admin(ctrl: str, opcode: int, nsid: int = 0, cdw10: int = 0, cdw11: int = 0, data_len: int = 0):
    """One admin command through NVME_IOCTL_ADMIN_CMD: (completion dw0, data)."""
    buf = ctypes.create_string_buffer(data_len) if data_len else None
    addr = ctypes.addressof(buf) if buf is not None else 0
    cmd = bytearray(PASSTHRU.pack(opcode, 0, 0, nsid, 0, 0, 0, addr, 0, data_len,
                                  cdw10, cdw11, 0, 0, 0, 0, 0, 0))
    fd = os.open(ctrl, os.O_RDONLY)
    try:
        status = fcntl.ioctl(fd, NVME_IOCTL_ADMIN_CMD, cmd, True)
    finally:
        os.close(fd)
    assert status == 0, f"admin opcode {opcode:#x}: NVMe status {status:#x}"
    return PASSTHRU.unpack(cmd)[-1], (buf.raw if buf is not None else b"")


def test_device_nodes(nvme_char, nvme_block, nvme_ctrl):
    assert stat.S_ISCHR(os.stat(nvme_char).st_mode), nvme_char
    assert stat.S_ISBLK(os.stat(nvme_block).st_mode), nvme_block
    assert stat.S_ISCHR(os.stat(nvme_ctrl).st_mode), nvme_ctrl


def test_namespace_size_and_lba(nvme_block, nvme_geometry):
    fd = os.open(nvme_block, os.O_RDONLY)
    try:
        size = struct.unpack("<Q", fcntl.ioctl(fd, BLKGETSIZE64, b"\0" * 8))[0]
        lba = struct.unpack("<i", fcntl.ioctl(fd, BLKSSZGET, b"\0" * 4))[0]
    finally:
        os.close(fd)
    assert size == nvme_geometry["size"]
    assert lba == nvme_geometry["lba"] == 4096


def test_controller_supports_fdp(nvme_ctrl):
    _, ident = admin(nvme_ctrl, 0x06, cdw10=1, data_len=4096)  # Identify Controller
    ctratt = struct.unpack_from("<I", ident, 96)[0]
    assert ctratt & (1 << 19), f"CTRATT {ctratt:#x} lacks FDPS (bit 19)"


def test_fdp_enabled_with_configured_handles(nvme_ctrl, nvme_geometry):
    dw0, _ = admin(nvme_ctrl, 0x0A, cdw10=0x1D, cdw11=1)  # Get Features: FDP, endurance group 1
    assert dw0 & 1, f"FDP feature dw0 {dw0:#x}: FDP not enabled"
    size = 4096  # FDP Configurations log page, log specific identifier = endurance group 1
    _, log = admin(nvme_ctrl, 0x02, cdw10=0x20 | ((size // 4 - 1) << 16), cdw11=1 << 16, data_len=size)
    nconfigs = struct.unpack_from("<H", log, 0)[0] + 1
    fdpa, _vss, nrg, nruh, _maxpids, _nnss, runs = struct.unpack_from("<BBIHHIQ", log, 18)
    assert nconfigs == 1
    assert fdpa & 0x80, f"FDP attributes {fdpa:#x}: configuration not valid"
    assert (nrg, nruh, runs) == (1, nvme_geometry["ruhs"], nvme_geometry["ru_size"])
