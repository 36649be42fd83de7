"""RawBlockCoreConfig, the module constants and the small validation helpers of LMCache's
``lmcache.v1.storage_backend.raw_block`` package (same names, defaults and messages)."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Optional, Sequence

PlacementId = Optional[int]

RAW_BLOCK_IO_ENGINES = frozenset({"posix", "io_uring"})
DEFAULT_IOURING_QUEUE_DEPTH = 256
DEFAULT_RECOVERY_READ_THREADS = 8
_DEFAULT_META_MAGIC = b"LMCIDX01"
_DEFAULT_META_VERSION = 1
_META_HEADER_FORMAT = "<8sIQQI"  # magic, version, seq, payload_len, crc32 (32 bytes)
_SLOT_HEADER_MAGIC = b"LMCBLK01"
_MAX_PUT_MANY_IO_URING_BATCH_KEYS = 64
_MAX_FDP_PLACEMENT_ID = 0xFFFF
_NG_NAME = re.compile(r"ng(\d+)n(\d+)")
# Ours: bytes 24..40 of a slot header hold the optional payload checksum (marker + xxh3-64).
PAYLOAD_CHECKSUM_HEADER_BYTES = 40


def round_up(x: int, align: int) -> int:
    """Smallest multiple of ``align`` that is >= ``x``."""
    return ((x + align - 1) // align) * align


def normalize_raw_block_io_engine(io_engine: str | None = None, *, use_iouring: bool | None = None,
                                  use_uring: bool | None = None) -> str:
    """Resolve the engine name; legacy booleans select io_uring when ``io_engine`` is unset."""
    if io_engine is None or io_engine == "":
        return "io_uring" if (use_iouring or use_uring) else "posix"
    name = str(io_engine).lower()
    if name not in RAW_BLOCK_IO_ENGINES:
        raise ValueError("io_engine must be one of: " + ", ".join(sorted(RAW_BLOCK_IO_ENGINES)))
    return name


def normalize_raw_block_placement_ids(placement_ids: Sequence[PlacementId] | None, expected_len: int, *,
                                      field_name: str = "placement_ids",
                                      allow_none: bool = True) -> list[PlacementId]:
    """Check a per-key list of FDP placement ids (None = no directive, else 1..=65535)."""
    if placement_ids is None:
        return [None] * expected_len
    pids = list(placement_ids)
    if len(pids) != expected_len:
        raise ValueError(f"{field_name} must have length {expected_len}")
    suffix = " or None" if allow_none else ""
    out: list[PlacementId] = []
    for pid in pids:
        if pid is None:
            if not allow_none:
                raise ValueError(f"{field_name} must contain integers")
            out.append(None)
            continue
        if not isinstance(pid, int) or isinstance(pid, bool):
            raise ValueError(f"{field_name} must contain integers{suffix}")
        if pid == 0:
            raise ValueError(f"{field_name} must not contain placement identifier 0")
        if pid < 0:
            raise ValueError(f"{field_name} must contain positive integers{suffix}")
        if pid > _MAX_FDP_PLACEMENT_ID:
            raise ValueError(f"{field_name} must contain placement identifiers in range 1..=65535{suffix}")
        out.append(int(pid))
    return out


def validate_raw_block_io_options(*, iouring_queue_depth: int) -> None:
    if int(iouring_queue_depth) <= 0:
        raise ValueError("iouring_queue_depth must be > 0")


def _resolve_sysfs_queue_dir(path: str) -> str | None:
    m = _NG_NAME.fullmatch(os.path.basename(path))
    if not m:
        return None
    return f"/sys/block/nvme{m.group(1)}n{m.group(2)}/queue"


def _read_sysfs_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except Exception:  # noqa: BLE001
        return None


@dataclass(frozen=True)
class RawBlockCoreConfig:
    """Geometry and behaviour of one raw-block core (LMCache's field names and defaults).

    ``verify_payload_checksum`` is ours (default off): an xxh3-64 of each payload is kept in
    slot-header bytes LMCache does not read, and a load whose bytes fail it is a miss.
    ``allow_foreign_device`` is ours (default off): without it a device on which libblkid finds
    a file system, RAID/LVM member or partition table is refused instead of overwritten.
    """

    device_path: str
    capacity_bytes: int
    block_align: int
    header_bytes: int
    slot_bytes: int
    use_odirect: bool
    enable_zero_copy: bool
    meta_total_bytes: int
    meta_magic: bytes
    meta_version: int
    meta_checkpoint_interval_sec: int
    meta_idle_quiet_ms: int
    meta_enable_periodic: bool
    meta_verify_on_load: bool
    max_data_transfer_size: int = 0
    load_checkpoint_on_init: bool = True
    io_engine: str = "posix"
    iouring_queue_depth: int = DEFAULT_IOURING_QUEUE_DEPTH
    use_uring_cmd: bool = False
    meta_checkpoint_placement_id: PlacementId = None
    fdp_slot_affinity_enabled: bool = False
    verify_payload_checksum: bool = False
    allow_foreign_device: bool = False


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated config with LMCache's coercions applied (what the native core receives)."""

    device_path: str
    capacity_bytes: int
    block_align: int
    header_bytes: int
    slot_bytes: int
    use_odirect: bool
    enable_zero_copy: bool
    meta_total_bytes: int
    meta_magic: bytes
    meta_version: int
    meta_checkpoint_interval_sec: int
    meta_idle_quiet_ms: int
    meta_enable_periodic: bool
    meta_verify_on_load: bool
    max_data_transfer_size: int
    load_checkpoint_on_init: bool
    io_engine: str
    iouring_queue_depth: int
    use_uring_cmd: bool
    meta_checkpoint_placement_id: PlacementId
    fdp_slot_affinity_enabled: bool
    verify_payload_checksum: bool
    allow_foreign_device: bool
    container_bytes: int


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def resolve_config(config: RawBlockCoreConfig, *, logger=None) -> ResolvedConfig:
    """Validate ``config`` in LMCache's order and return the coerced values.

    Raises ValueError for config problems and RuntimeError when the NVMe transfer size
    cannot be derived from sysfs.
    """
    engine = normalize_raw_block_io_engine(config.io_engine)
    use_uring_cmd = bool(config.use_uring_cmd)
    ckpt_pid = normalize_raw_block_placement_ids([config.meta_checkpoint_placement_id], 1,
                                                 field_name="meta_checkpoint_placement_id")[0]
    if ckpt_pid is not None and not (engine == "io_uring" and use_uring_cmd):
        raise ValueError("meta_checkpoint_placement_id requires io_engine='io_uring' and use_uring_cmd=true")
    use_odirect = bool(config.use_odirect)
    if use_uring_cmd and use_odirect:
        if logger is not None:
            logger.warning("use_odirect is ignored for NVMe namespace character devices when use_uring_cmd=true")
        use_odirect = False

    device_path = str(config.device_path or "")
    block_align = int(config.block_align)
    header_bytes = int(config.header_bytes)
    slot_bytes = int(config.slot_bytes)
    meta_total = int(config.meta_total_bytes)
    meta_version = int(config.meta_version)
    depth = int(config.iouring_queue_depth)
    if not device_path:
        raise ValueError("device_path must be non-empty")
    if not _is_pow2(block_align):
        raise ValueError(f"block_align must be a power of two > 0, got {block_align}")
    if header_bytes < 24:
        raise ValueError("header_bytes must be >= 24")
    if header_bytes % block_align:
        raise ValueError("header_bytes must be a multiple of block_align")
    if slot_bytes < header_bytes + 1:
        raise ValueError("slot_bytes must be >= header_bytes + 1")
    if slot_bytes % block_align:
        raise ValueError("slot_bytes must be a multiple of block_align")
    if meta_total <= block_align:
        raise ValueError("meta_total_bytes must be > block_align")
    if meta_total % block_align:
        raise ValueError("meta_total_bytes must be a multiple of block_align")
    magic = config.meta_magic
    if isinstance(magic, str):
        magic = magic.encode("utf-8")
    if not isinstance(magic, (bytes, bytearray)) or len(magic) != 8:
        raise ValueError("meta_magic must be exactly 8 bytes")
    magic = bytes(magic)
    if meta_version <= 0:
        raise ValueError("meta_version must be > 0")
    validate_raw_block_io_options(iouring_queue_depth=depth)
    if use_uring_cmd and engine != "io_uring":
        raise ValueError("use_uring_cmd requires io_engine='io_uring'")
    mdts = int(config.max_data_transfer_size)
    if use_uring_cmd:
        try:
            st = os.stat(device_path)
        except OSError as e:
            raise ValueError("use_uring_cmd requires an existing NVMe namespace character device path") from e
        if not stat.S_ISCHR(st.st_mode) or not _NG_NAME.fullmatch(os.path.basename(device_path)):
            raise ValueError("use_uring_cmd requires an NVMe namespace character device (for example /dev/ng0n1)")
        mdts = _resolve_max_data_transfer_size(device_path, mdts, block_align, logger)
    if config.verify_payload_checksum and header_bytes < PAYLOAD_CHECKSUM_HEADER_BYTES:
        raise ValueError(f"verify_payload_checksum requires header_bytes >= {PAYLOAD_CHECKSUM_HEADER_BYTES}")
    try:
        magic.decode("ascii")
    except UnicodeDecodeError as e:
        raise ValueError("meta_magic must be ASCII bytes") from e
    container = ((meta_total // 2) // block_align) * block_align
    if container <= block_align:
        raise ValueError("meta_total_bytes must provide room for at least two metadata copies")
    return ResolvedConfig(
        device_path=device_path,
        capacity_bytes=int(config.capacity_bytes),
        block_align=block_align,
        header_bytes=header_bytes,
        slot_bytes=slot_bytes,
        use_odirect=use_odirect,
        enable_zero_copy=bool(config.enable_zero_copy),
        meta_total_bytes=meta_total,
        meta_magic=magic,
        meta_version=meta_version,
        meta_checkpoint_interval_sec=max(1, int(config.meta_checkpoint_interval_sec)),
        meta_idle_quiet_ms=max(0, int(config.meta_idle_quiet_ms)),
        meta_enable_periodic=bool(config.meta_enable_periodic),
        meta_verify_on_load=bool(config.meta_verify_on_load),
        max_data_transfer_size=mdts,
        load_checkpoint_on_init=bool(config.load_checkpoint_on_init),
        io_engine=engine,
        iouring_queue_depth=depth,
        use_uring_cmd=use_uring_cmd,
        meta_checkpoint_placement_id=ckpt_pid,
        fdp_slot_affinity_enabled=bool(config.fdp_slot_affinity_enabled),
        verify_payload_checksum=bool(config.verify_payload_checksum),
        allow_foreign_device=bool(config.allow_foreign_device),
        container_bytes=container,
    )


def _resolve_max_data_transfer_size(device_path: str, requested: int, block_align: int, logger) -> int:
    if requested > 0:
        if requested % block_align:
            raise ValueError(
                f"max_data_transfer_size ({requested}) must be a multiple of block_align ({block_align})")
        return requested
    qdir = _resolve_sysfs_queue_dir(device_path)
    if qdir is None:
        raise RuntimeError(f"unable to derive NVMe sysfs queue path from {device_path}")
    kb = _read_sysfs_int(os.path.join(qdir, "max_hw_sectors_kb"))
    if kb is None or kb <= 0:
        raise RuntimeError(f"failed to read max_hw_sectors_kb from {qdir}")
    size = kb * 1024
    segs = _read_sysfs_int(os.path.join(qdir, "max_segments"))
    if segs is not None and segs > 0:
        size = min(size, segs * os.sysconf("SC_PAGE_SIZE"))
    size = max(block_align, (size // block_align) * block_align)
    if logger is not None:
        logger.info("RawBlockCore auto max_data_transfer_size=%d from %s", size, qdir)
    return size


@dataclass(frozen=True)
class RawBlockPutManyResult:
    """``results`` is aligned with the input keys; ``stored_keys`` lists keys newly committed
    by this call, in commit order (keys already present are True but not listed)."""

    results: list[bool]
    stored_keys: list[str]
