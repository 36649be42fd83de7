"""RawBlockDevice over NVMe passthrough (io_uring_cmd on /dev/ngXnY), on the emulated FDP SSD.

What is checked against the device itself: the namespace identity, bytes written through
passthrough as seen through the block device (O_DIRECT, so not from a cache), transfers split
at the transfer limit, fixed and unaligned buffers, per-request build errors, and FDP: the
handles the namespace reports and a write with placement id P charged to handle P alone.
"""

from __future__ import annotations

import mmap
import os

import pytest

from helpers import ruamw
from lmcache_rawblock import RawBlockDevice, _native

LBA = 4096


def open_pt(path: str, **kw) -> RawBlockDevice:
    args = dict(writable=True, use_odirect=False, alignment=4096, io_engine="io_uring", iouring_queue_depth=64,
                use_uring_cmd=True)
    args.update(kw)
    return RawBlockDevice(path, **args)


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 131 + seed * 7 + (i >> 12)) & 0xFF for i in range(n))


def read_block_direct(block: str, offset: int, n: int) -> bytes:
    """Read through the block device with O_DIRECT: what the namespace holds, not a cache."""
    fd = os.open(block, os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, n)
        try:
            got = os.preadv(fd, [buf], offset)
            assert got == n
            return bytes(buf)
        finally:
            buf.close()
    finally:
        os.close(fd)


def test_identify_matches_the_block_device(nvme_char, nvme_block):
    dev = open_pt(nvme_char, writable=False)
    try:
        assert dev.nvme_nsid() == 1
        assert dev.nvme_lba_size() == LBA
        assert dev.nvme_lba_shift() == 12
        with open(nvme_block, "rb") as f:
            assert dev.size_bytes() == f.seek(0, os.SEEK_END)
        assert dev.max_data_transfer_size() % LBA == 0 and dev.max_data_transfer_size() >= LBA
    finally:
        dev.close()


def test_getters_refuse_without_passthrough(nvme_block):
    dev = RawBlockDevice(nvme_block, writable=False, io_engine="io_uring")
    try:
        for getter, what in ((dev.nvme_nsid, "namespace ID"), (dev.nvme_lba_size, "LBA size"),
                             (dev.nvme_lba_shift, "LBA shift")):
            with pytest.raises(RuntimeError, match=f"NVMe {what} not available"):
                getter()
        with pytest.raises(RuntimeError, match="fetch_fdp_status requires use_uring_cmd"):
            dev.fetch_fdp_status()
    finally:
        dev.close()


def test_block_device_is_refused_for_passthrough(nvme_block):
    with pytest.raises(ValueError, match="use_uring_cmd requires an NVMe namespace character device"):
        open_pt(nvme_block)


def test_alignment_below_lba_is_refused(nvme_char):
    with pytest.raises(ValueError, match=r"alignment \(512\) must be a non-zero multiple of NVMe LBA size \(4096\)"):
        open_pt(nvme_char, alignment=512)


def test_transfer_limit_must_be_whole_blocks(nvme_char):
    with pytest.raises(ValueError, match=r"max_data_transfer_size \(5000\) must be a multiple of the NVMe LBA size"):
        open_pt(nvme_char, max_data_transfer_size=5000)


@pytest.mark.parametrize("limit", [8192, 0])
def test_split_round_trip_lands_on_the_namespace(nvme_char, nvme_block, limit):
    """A 1 MiB write and read split into limit-sized NVMe commands (8 KiB: 128 commands; 0:
    the kernel's limit); the bytes are where the block device says."""
    dev = open_pt(nvme_char, max_data_transfer_size=limit)
    try:
        n = 1 << 20
        offs = [8 << 20, 16 << 20]
        data = [pattern(n, 1 + limit), pattern(n, 2 + limit)]
        bid = dev.batched_write(offs, [bytearray(d) for d in data], [n, n])
        assert dev.wait_iouring(bid) == ([True, True], [])
        outs = [bytearray(n), bytearray(n)]
        bid = dev.batched_read(offs, outs, [n, n])
        assert dev.wait_iouring(bid) == ([True, True], [])
        assert [bytes(o) for o in outs] == data
        st = dev.io_stats_snapshot()
        if limit:
            assert st["write_attempts"] >= 2 * n // limit
    finally:
        dev.close()
    for off, d in zip(offs, data):
        assert read_block_direct(nvme_block, off, n) == d


@pytest.mark.parametrize("sched", ["loads_first", "fifo"])
def test_every_command_of_a_request_in_flight_together(nvme_char, nvme_block, sched):
    """A write and a read of four times the transfer limit: under loads_first the four commands
    of each are in the kernel at once (the in-flight high-water marks hold all four); fifo sends
    them one after another. The bytes land either way."""
    limit = 64 << 10
    n = 4 * limit
    dev = open_pt(nvme_char, max_data_transfer_size=limit, io_scheduler=sched)
    try:
        data = pattern(n, 40)
        assert dev.wait_iouring(dev.batched_write([32 << 20], [bytearray(data)], [n])) == ([True], [])
        out = bytearray(n)
        assert dev.wait_iouring(dev.batched_read([32 << 20], [out], [n])) == ([True], [])
        assert bytes(out) == data
        st = dev.io_stats_snapshot()
        assert (st["write_attempts"], st["read_attempts"]) == (4, 4)
        together = n if sched == "loads_first" else limit
        assert (st["peak_write_inflight_bytes"], st["peak_read_inflight_bytes"]) == (together, together)
    finally:
        dev.close()
    assert read_block_direct(nvme_block, 32 << 20, n) == data


def test_unaligned_and_short_buffers_bounce_both_ways(nvme_char):
    dev = open_pt(nvme_char)
    try:
        n = 3 * LBA
        backing = bytearray(n + 1)
        src = memoryview(backing)[1:]
        src[:] = pattern(n, 9)
        bid = dev.batched_write([32 << 20], [src], [n])
        assert dev.wait_iouring(bid) == ([True], [])
        back = bytearray(n + 1)
        dst = memoryview(back)[1:]
        bid = dev.batched_read([32 << 20], [dst], [n])
        assert dev.wait_iouring(bid) == ([True], [])
        assert bytes(dst) == pattern(n, 9)
        # A buffer shorter than the transfer: the first bytes arrive, nothing past the buffer.
        short = bytearray(100)
        bid = dev.batched_read([32 << 20], [short], [LBA])
        assert dev.wait_iouring(bid) == ([True], [])
        assert bytes(short) == pattern(n, 9)[:100]
        # A payload shorter than the transfer is written zero-padded.
        bid = dev.batched_write([36 << 20], [b"abc"], [LBA], None, [3])
        assert dev.wait_iouring(bid) == ([True], [])
        out = bytearray(LBA)
        bid = dev.batched_read([36 << 20], [out], [LBA])
        assert dev.wait_iouring(bid) == ([True], [])
        assert bytes(out) == b"abc" + bytes(LBA - 3)
    finally:
        dev.close()


def test_synchronous_calls_run_through_passthrough(nvme_char, nvme_block):
    """pwrite_from_buffer / pread_into: the ng device takes no read(2)/write(2)."""
    dev = open_pt(nvme_char)
    try:
        data = pattern(5000, 3)
        dev.pwrite_from_buffer(40 << 20, data, 5000, 2 * LBA)
        out = bytearray(5000)
        dev.pread_into(40 << 20, out, 5000, 2 * LBA)
        assert bytes(out) == data
        dev.write_uring(44 << 20, data, 5000, 2 * LBA, 3)
        out2 = bytearray(5000)
        with pytest.warns(DeprecationWarning):
            dev.read_uring(44 << 20, out2, 5000, 2 * LBA)
        assert bytes(out2) == data
    finally:
        dev.close()
    assert read_block_direct(nvme_block, 40 << 20, 2 * LBA) == data + bytes(2 * LBA - 5000)


def test_fixed_buffers_are_used(nvme_char):
    """Registered memory is used where the kernel takes it in passthrough commands; where it
    refuses them (Linux 6.1 answers EINVAL), the engine falls back to plain commands once and
    the transfer still succeeds."""
    dev = open_pt(nvme_char)
    buf = mmap.mmap(-1, 1 << 20)
    try:
        import ctypes

        anchor = ctypes.c_char.from_buffer(buf)
        addr = ctypes.addressof(anchor)
        del anchor
        dev.register_fixed_buffers([addr], [len(buf)])
        view = memoryview(buf)
        view[: 256 * 1024] = pattern(256 * 1024, 4)
        before = dev.io_stats_snapshot()["fixed_buffer_attempts"]
        bid = dev.batched_write([48 << 20], [view[: 256 * 1024]], [256 * 1024])
        assert dev.wait_iouring(bid) == ([True], [])
        bid = dev.batched_read([48 << 20], [view[512 * 1024: 768 * 1024]], [256 * 1024])
        assert dev.wait_iouring(bid) == ([True], [])
        assert bytes(view[512 * 1024: 768 * 1024]) == pattern(256 * 1024, 4)
        st = dev.io_stats_snapshot()
        assert st["fixed_buffer_attempts"] > before
        assert st["fixed_buffer_fallbacks"] in (0, 1)
        if st["fixed_buffer_fallbacks"] == 0:  # the kernel takes them: every command used them
            assert st["fixed_buffer_attempts"] - before == st["write_attempts"] + st["read_attempts"]
        del view
    finally:
        dev.close()
        buf.close()


def test_middle_build_error_fails_that_request_only(nvme_char):
    dev = open_pt(nvme_char, writable=False)
    bufs = [bytearray(LBA) for _ in range(3)]
    try:
        bid = dev.batched_read([0, 1, LBA], bufs, [LBA] * 3)
        results, errors = dev.wait_iouring(bid)
        assert results == [True, False, True]
        assert len(errors) == 1 and errors[0][0] == 1
        assert "ValueError: offset must be aligned to LBA size (4096 bytes), got offset=1" == errors[0][1]
        bid = dev.batched_read([0, LBA], [bytearray(LBA), bytearray(LBA)], [LBA, 100])
        results, errors = dev.wait_iouring(bid)
        assert results == [True, False]
        assert errors == [(1, "ValueError: length must be aligned to LBA size (4096 bytes), got len=100")]
    finally:
        dev.close()


@pytest.mark.parametrize("pid,match", [(0, "placement_id must not be 0"), (65536, r"range 1..=65535"),
                                       (-1, r"range 1..=65535")])
def test_bad_placement_ids_are_refused_before_any_io(nvme_char, pid, match):
    dev = open_pt(nvme_char)
    try:
        before = dev.io_stats_snapshot()["write_attempts"]
        with pytest.raises(ValueError, match=match):
            dev.batched_write([0], [bytes(LBA)], [LBA], [pid])
        with pytest.raises(ValueError, match=match):
            dev.write_uring(0, bytes(LBA), LBA, LBA, pid)
        assert dev.io_stats_snapshot()["write_attempts"] == before
    finally:
        dev.close()


def test_fetch_fdp_status_lists_the_configured_handles(nvme_char):
    dev = open_pt(nvme_char, writable=False)
    try:
        status = dev.fetch_fdp_status()
    finally:
        dev.close()
    assert sorted(status) == [(p, p) for p in range(16)]


def test_fdp_report_describes_the_namespace(nvme_char, nvme_block):
    for path in (nvme_char, nvme_block):
        rep = _native.nvme_fdp_report(path)
        assert rep["nsid"] == 1 and rep["lba_size"] == LBA and rep["fdp_enabled"] is True
        assert rep["config"]["nruh"] == 16 and rep["config"]["nrg"] == 1
        assert sorted(r["pid"] for r in rep["ruhs"]) == list(range(16))
        assert all(r["ruamw"] > 0 for r in rep["ruhs"])


def test_fdp_report_refuses_a_file(tmp_path):
    p = tmp_path / "plain"
    p.write_bytes(b"x" * 4096)
    with pytest.raises((ValueError, OSError), match="NVMe|ioctl"):
        _native.nvme_fdp_report(str(p))


@pytest.mark.parametrize("pid", [3, 11])
def test_a_placed_write_is_charged_to_its_handle_only(nvme_char, pid):
    """Reclaim unit available media writes drop on handle pid by the blocks written, and on no
    other handle."""
    blocks = 16
    before = ruamw(nvme_char)
    dev = open_pt(nvme_char)
    try:
        bid = dev.batched_write([(64 + pid) << 20], [pattern(blocks * LBA, pid)], [blocks * LBA], [pid])
        assert dev.wait_iouring(bid) == ([True], [])
    finally:
        dev.close()
    after = ruamw(nvme_char)
    changed = {p: before[p] - after[p] for p in before if before[p] != after[p]}
    assert list(changed) == [pid]
    # A reclaim unit that filled up is replaced by a fresh one; otherwise the drop is exact.
    assert changed[pid] == blocks or after[pid] > before[pid]


def test_unplaced_writes_leave_the_other_handles_alone(nvme_char):
    before = ruamw(nvme_char)
    dev = open_pt(nvme_char)
    try:
        bid = dev.batched_write([80 << 20], [pattern(8 * LBA, 5)], [8 * LBA])
        assert dev.wait_iouring(bid) == ([True], [])
    finally:
        dev.close()
    after = ruamw(nvme_char)
    changed = [p for p in before if before[p] != after[p]]
    assert changed in ([0], [])  # the default handle (placement id 0) takes unplaced writes
