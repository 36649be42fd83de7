"""RawBlockCoreConfig, the module constants and the small validation helpers of LMCache's
raw-block package (``lmcache_rawblock.lmcache_paths.raw_block_package()``) (same names, defaults and messages).

RawBlockCoreConfig's fields come from the core's settings table (``lmcache_rawblock.settings``),
so a field, the plugin's ``rust_raw_block.<field>`` key and ``_native.Core``'s keyword are one
setting with one name, type, range and default.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import stat
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from ..settings import SETTINGS, check_placement_id, parse_value

# Also the run-time type of the placement-id fields of RawBlockCoreConfig (dataclasses.fields).
PlacementId = Optional[int]  # noqa: UP045 - kept as the typing object those fields have always had

RAW_BLOCK_IO_ENGINES = frozenset(SETTINGS["io_engine"].choices or ())
DEFAULT_IOURING_QUEUE_DEPTH = SETTINGS["iouring_queue_depth"].default
DEFAULT_RECOVERY_READ_THREADS = SETTINGS["recovery_read_threads"].default
_NG_NAME = re.compile(r"ng(\d+)n(\d+)")

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
    return [check_placement_id(pid, field_name, allow_none=allow_none) for pid in pids]


def validate_raw_block_io_options(*, iouring_queue_depth: int) -> None:
    parse_value("iouring_queue_depth", iouring_queue_depth)


def _resolve_sysfs_queue_dir(path: str) -> str | None:
    m = _NG_NAME.fullmatch(os.path.basename(path))
    if not m:
        return None
    return f"/sys/block/nvme{m.group(1)}n{m.group(2)}/queue"


def _read_sysfs_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except Exception:  # noqa: BLE001 - missing or unreadable sysfs attribute: unknown
        return None


_TYPES = {"path": str, "int": int, "bool": bool, "choice": str, "bytes": bytes}


def _config_field(setting) -> tuple:
    typ = PlacementId if setting.none_is_zero else _TYPES[setting.type]
    if setting.required:
        return (setting.name, typ)
    return (setting.name, typ, dataclasses.field(default=setting.default))


def _post_init(self) -> None:
    # Every field through the settings table: "false" is False, "4096" is 4096, a wrong type
    # or an out-of-range value raises ValueError naming the field and the value.
    for f in dataclasses.fields(self):
        object.__setattr__(self, f.name, parse_value(f.name, getattr(self, f.name)))


def _native_kwargs(self, *, key_namespace: str) -> dict[str, Any]:
    """The keyword arguments of ``_native.Core`` for this configuration (same names)."""
    kw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    kw["key_namespace"] = key_namespace
    return kw


def _for_device(cls, device_path: str, *, slot_bytes: int, **fields: Any) -> Any:
    """A configuration of ``device_path`` (a block device or a pre-sized file) with slots of
    ``slot_bytes``: every other field at the settings table's default, the plugin's, unless
    given in ``fields``. LMCache's constructor, which this class keeps, needs 14 of them."""
    values = {s.name: s.default for s in SETTINGS.values() if s.config and s.default is not None}
    values.update(fields, device_path=device_path, slot_bytes=slot_bytes)
    return cls(**values)


if TYPE_CHECKING:

    class RawBlockCoreConfig:
        """What the type checker sees of the class below: its fields come from the settings
        table at run time, so it knows them only as attributes of any type."""

        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

        def __init__(self, **fields: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
        def native_kwargs(self, *, key_namespace: str) -> dict[str, Any]: ...
        @classmethod
        def for_device(cls, device_path: str, *, slot_bytes: int, **fields: Any) -> RawBlockCoreConfig: ...

else:
    RawBlockCoreConfig = dataclasses.make_dataclass(
        "RawBlockCoreConfig",
        [_config_field(s) for s in SETTINGS.values() if s.config],
        frozen=True,
        namespace={"__post_init__": _post_init, "native_kwargs": _native_kwargs,
                   "for_device": classmethod(_for_device), "__module__": __name__},
    )
RawBlockCoreConfig.__doc__ = """Geometry and behaviour of one raw-block core.

LMCache's fields, names, order and defaults, then ours (``verify_payload_checksum``,
``allow_foreign_device``, ``recovery_read_threads``): ``lmcache_rawblock.settings.SETTINGS``
lists them with their ranges and help. Values are parsed on construction: booleans accept
True/False, 0/1 and the words true/false, yes/no, on/off; integers accept ints and decimal
strings; a bad value raises ValueError naming the field. As in LMCache, ``capacity_bytes``,
``meta_idle_quiet_ms`` and ``max_data_transfer_size`` <= 0 mean 0, and a
``meta_checkpoint_interval_sec`` below 1 is raised to 1 (with a warning). The geometry across
fields is checked by the core when it opens, before any I/O.
"""


def resolve_passthrough(config: RawBlockCoreConfig, *, logger: logging.Logger | None = None
                        ) -> RawBlockCoreConfig:
    """LMCache's checks and coercions that need the file system, in LMCache's order: the
    checkpoint placement id needs io_uring passthrough; passthrough ignores O_DIRECT (warning),
    needs an NVMe namespace character device, and takes its transfer size from sysfs when
    none is given. Returns the configuration the core opens with."""
    uring_cmd = config.use_uring_cmd
    if config.meta_checkpoint_placement_id is not None and not (config.io_engine == "io_uring" and uring_cmd):
        raise ValueError("meta_checkpoint_placement_id requires io_engine='io_uring' and use_uring_cmd=true")
    if not uring_cmd:
        return config
    if config.io_engine != "io_uring":
        raise ValueError("use_uring_cmd requires io_engine='io_uring'")
    changes: dict[str, Any] = {}
    if config.use_odirect:
        if logger is not None:
            logger.warning("use_odirect is ignored for NVMe namespace character devices when use_uring_cmd=true")
        changes["use_odirect"] = False
    try:
        st = os.stat(config.device_path)
    except OSError as e:
        raise ValueError("use_uring_cmd requires an existing NVMe namespace character device path") from e
    if not stat.S_ISCHR(st.st_mode) or not _NG_NAME.fullmatch(os.path.basename(config.device_path)):
        raise ValueError("use_uring_cmd requires an NVMe namespace character device (for example /dev/ng0n1)")
    changes["max_data_transfer_size"] = _resolve_max_data_transfer_size(
        config.device_path, config.max_data_transfer_size, config.block_align, logger)
    return dataclasses.replace(config, **changes)


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


@dataclasses.dataclass(frozen=True)
class RawBlockPutManyResult:
    """``results`` is aligned with the input keys; ``stored_keys`` lists keys newly committed
    by this call, in commit order (keys already present are True but not listed).
    ``failure`` (ours) says why the first key that is False failed: an ``OSError`` naming the
    operation, offset, path and errno for a device error, or the reason no slot could be had;
    None when no key failed."""

    results: list[bool]
    stored_keys: list[str]
    failure: BaseException | None = None
