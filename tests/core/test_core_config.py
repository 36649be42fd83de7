"""RawBlockCoreConfig defaults, validation order and messages, and the normalize helpers."""

import dataclasses
import logging

import pytest

from lmcache_rawblock.raw_block import (
    DEFAULT_IOURING_QUEUE_DEPTH,
    RAW_BLOCK_IO_ENGINES,
    RawBlockCoreConfig,
    RawBlockPutManyResult,
    normalize_raw_block_io_engine,
    normalize_raw_block_placement_ids,
    round_up,
    validate_raw_block_io_options,
)
from lmcache_rawblock.raw_block import RawBlockCore


def make_cfg(**kw):
    base = dict(device_path="/tmp/x", capacity_bytes=0, block_align=4096, header_bytes=4096,
                slot_bytes=65536, use_odirect=False, enable_zero_copy=False, meta_total_bytes=1 << 20,
                meta_magic=b"LMCIDX01", meta_version=1, meta_checkpoint_interval_sec=60,
                meta_idle_quiet_ms=0, meta_enable_periodic=False, meta_verify_on_load=True)
    base.update(kw)
    return RawBlockCoreConfig(**base)


def test_field_order_and_defaults():
    names = [f.name for f in dataclasses.fields(RawBlockCoreConfig)]
    assert names[:14] == ["device_path", "capacity_bytes", "block_align", "header_bytes", "slot_bytes",
                          "use_odirect", "enable_zero_copy", "meta_total_bytes", "meta_magic", "meta_version",
                          "meta_checkpoint_interval_sec", "meta_idle_quiet_ms", "meta_enable_periodic",
                          "meta_verify_on_load"]
    c = make_cfg()
    assert (c.max_data_transfer_size, c.load_checkpoint_on_init, c.io_engine, c.iouring_queue_depth,
            c.use_uring_cmd, c.meta_checkpoint_placement_id, c.fdp_slot_affinity_enabled,
            c.verify_payload_checksum) == (0, True, "posix", 256, False, None, False, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.block_align = 1  # type: ignore[misc]


def test_constants_and_round_up():
    assert DEFAULT_IOURING_QUEUE_DEPTH == 256
    assert set(RAW_BLOCK_IO_ENGINES) == {"posix", "io_uring"}
    assert round_up(0, 4096) == 0 and round_up(1, 4096) == 4096 and round_up(8192, 4096) == 8192


def open_core(tmp_path, **kw):
    """Open a core on a fresh 8 MiB sparse file; the configuration is built inside, so an error
    may come from RawBlockCoreConfig (one field) or from the core's own checks (geometry)."""
    path = tmp_path / "dev.bin"
    if not path.exists():
        with open(path, "wb") as f:
            f.truncate(8 << 20)
    kw.setdefault("device_path", str(path))
    return RawBlockCore(make_cfg(**kw), key_namespace="object")


def test_valid_config_opens(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="lmcache_rawblock.settings")
    core = open_core(tmp_path, meta_checkpoint_interval_sec=0)
    try:
        assert core.metadata_container_offsets() == [0, 524288]
        assert core.meta_checkpoint_interval_sec == 1  # raised to 1 s, as LMCache does
    finally:
        core.close()
    assert "meta_checkpoint_interval_sec=0 is below the minimum 1; using 1" in caplog.text


@pytest.mark.parametrize("kw,msg", [
    (dict(device_path=""), "device_path"),
    (dict(block_align=0), "block_align"),
    (dict(block_align=-1), "block_align"),
    (dict(block_align=3), "block_align"),
    (dict(block_align=4095), "block_align"),
    (dict(block_align=8, header_bytes=16, slot_bytes=64, meta_total_bytes=64), "header_bytes must be >= 24"),
    (dict(header_bytes=4000), "header_bytes must be a multiple of block_align"),
    (dict(slot_bytes=4096), "slot_bytes must be >= header_bytes \\+ 1"),
    (dict(slot_bytes=65537), "slot_bytes must be a multiple of block_align"),
    (dict(meta_total_bytes=4096), "meta_total_bytes must be > block_align"),
    (dict(meta_total_bytes=4097 * 2), "meta_total_bytes must be a multiple of block_align"),
    (dict(meta_magic=b"SHORT"), "meta_magic must be exactly 8 bytes"),
    (dict(meta_version=0), "meta_version must be > 0"),
    (dict(iouring_queue_depth=0), "iouring_queue_depth must be > 0"),
    (dict(use_uring_cmd=True), "use_uring_cmd requires io_engine"),
    (dict(io_engine="io_uring", use_uring_cmd=True, device_path="/nonexistent/ng0n1"),
     "use_uring_cmd requires an existing NVMe namespace character device path"),
    (dict(meta_magic=b"LMC\xffDX01"), "meta_magic must be ASCII bytes"),
    (dict(meta_total_bytes=8192), "meta_total_bytes must provide room for at least two metadata copies"),
    (dict(io_engine="spdk"), "io_engine must be one of: io_uring, posix"),
    (dict(meta_checkpoint_placement_id=7), "meta_checkpoint_placement_id requires"),
    (dict(meta_checkpoint_placement_id=0), "must not contain placement identifier 0"),
    (dict(verify_payload_checksum=True, block_align=8, header_bytes=32, slot_bytes=64, meta_total_bytes=64),
     "verify_payload_checksum requires header_bytes >= 40"),
])
def test_validation_messages(tmp_path, kw, msg):
    with pytest.raises(ValueError, match=msg):
        open_core(tmp_path, **kw)
    dev = tmp_path / "dev.bin"
    assert not dev.exists() or dev.stat().st_blocks == 0, "a refused configuration wrote to the device"


def test_uring_cmd_rejects_block_or_regular_file(tmp_path):
    p = tmp_path / "ng0n1"
    p.write_bytes(b"")
    with pytest.raises(ValueError, match="requires an NVMe namespace character device"):
        open_core(tmp_path, io_engine="io_uring", use_uring_cmd=True, device_path=str(p))


def test_magic_as_str_is_accepted():
    assert make_cfg(meta_magic="LMCIDX01").meta_magic == b"LMCIDX01"


def test_normalize_io_engine():
    assert normalize_raw_block_io_engine(None) == "posix"
    assert normalize_raw_block_io_engine("") == "posix"
    assert normalize_raw_block_io_engine(None, use_iouring=True) == "io_uring"
    assert normalize_raw_block_io_engine("", use_uring=True) == "io_uring"
    assert normalize_raw_block_io_engine("IO_URING") == "io_uring"
    assert normalize_raw_block_io_engine("posix", use_iouring=True) == "posix"
    with pytest.raises(ValueError, match="^io_engine must be one of: io_uring, posix$"):
        normalize_raw_block_io_engine("aio")


def test_normalize_placement_ids():
    assert normalize_raw_block_placement_ids(None, 3) == [None, None, None]
    assert normalize_raw_block_placement_ids([None, 1, 65535], 3) == [None, 1, 65535]
    with pytest.raises(ValueError, match="placement_ids must have length 2"):
        normalize_raw_block_placement_ids([1], 2)
    with pytest.raises(ValueError, match="range 1..=65535"):
        normalize_raw_block_placement_ids([65536], 1)
    with pytest.raises(ValueError, match="must not contain placement identifier 0"):
        normalize_raw_block_placement_ids([0], 1)
    with pytest.raises(ValueError, match="must contain positive integers or None"):
        normalize_raw_block_placement_ids([-1], 1)
    with pytest.raises(ValueError, match="must contain integers or None"):
        normalize_raw_block_placement_ids([True], 1)
    with pytest.raises(ValueError, match="must contain integers or None"):
        normalize_raw_block_placement_ids(["1"], 1)
    with pytest.raises(ValueError, match="^pid must contain integers$"):
        normalize_raw_block_placement_ids([None], 1, field_name="pid", allow_none=False)
    with pytest.raises(ValueError, match="range 1..=65535$"):
        normalize_raw_block_placement_ids([70000], 1, allow_none=False)


def test_validate_io_options():
    validate_raw_block_io_options(iouring_queue_depth=1)
    with pytest.raises(ValueError, match="iouring_queue_depth must be > 0"):
        validate_raw_block_io_options(iouring_queue_depth=0)


def test_put_many_result_is_frozen():
    r = RawBlockPutManyResult(results=[True], stored_keys=["k"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.results = []  # type: ignore[misc]
