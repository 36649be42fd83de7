"""LMCache objects the raw-block core talks about, or documented stand-ins.

When ``lmcache`` (and torch) are importable, the real classes are used: ``ObjectKey``,
``CacheEngineKey`` / ``LayerCacheEngineKey`` / ``parse_cache_key``, ``DiskCacheMetadata``,
``MemoryFormat`` and torch dtypes. Otherwise this module provides small equivalents with
the same field names, so the core works (and is tested) without LMCache:

* ``ObjectKey(chunk_hash: bytes, model_name: str, kv_rank: int, object_group_id: int = 0,
  cache_salt: str = "")`` (the fields of LMCache 0.5.6's)
* ``CacheEngineKey(model_name, world_size, worker_id, chunk_hash: int, dtype, request_configs)``
  with ``to_string()`` = ``model@world@worker@<hex hash>@<dtype>[@k%v...]``; ``dtype`` is
  the LMCache short dtype name (a ``str``) when torch is absent.
* ``LayerCacheEngineKey`` (adds ``layer_id``, written after the dtype field).
* ``DiskCacheMetadata(path, size, shape, dtype, fmt, cached_positions, pin_count=0)``;
  ``dtype`` is the short dtype name and ``cached_positions`` a list of ints when torch is
  absent.
* ``MemoryFormat``: an Enum with LMCache's member names used by the raw-block tier; an
  unknown name maps to ``UNDEFINED`` as in LMCache.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

try:  # pragma: no cover - depends on the environment
    import torch
except Exception:  # noqa: BLE001
    torch = None

HAVE_LMCACHE = False
try:  # pragma: no cover - depends on the environment
    from lmcache.utils import CacheEngineKey, DiskCacheMetadata, LayerCacheEngineKey, parse_cache_key
    from lmcache.v1.memory_management import MemoryFormat

    try:
        from lmcache.v1.distributed.api import ObjectKey
    except Exception:  # noqa: BLE001
        from lmcache.v1.multiprocess.custom_types import ObjectKey
    HAVE_LMCACHE = True
except Exception:  # noqa: BLE001
    HAVE_LMCACHE = False

try:  # pragma: no cover - depends on the environment
    from lmcache.v1.memory_management import TensorMemoryObj
except Exception:  # noqa: BLE001
    TensorMemoryObj = None
if TensorMemoryObj is not None:
    # Payloads of this class are read by the C core from raw_data.data_ptr() / get_size(),
    # the bytes its byte_array exposes, without building a ctypes memoryview per object.
    from .. import _native

    _native._set_memobj_type(TensorMemoryObj)

# LMCache's short dtype names (the strings written into checkpoints and legacy keys).
_SHORT_TO_TORCH_ATTR = {
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
    "double": "float64",
    "float64": "float64",
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "bool": "bool",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e4m3fn": "float8_e4m3fn",
    "fp8_e4m3fnuz": "float8_e4m3fnuz",
    "fp8_e5m2": "float8_e5m2",
    "fp8_e5m2fnuz": "float8_e5m2fnuz",
}
# torch attribute -> preferred short name (first wins).
_TORCH_ATTR_TO_SHORT = {
    "float16": "half",
    "bfloat16": "bfloat16",
    "float32": "float",
    "float64": "double",
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "bool": "bool",
    "float8_e4m3fn": "fp8_e4m3fn",
    "float8_e4m3fnuz": "fp8_e4m3fnuz",
    "float8_e5m2": "fp8_e5m2",
    "float8_e5m2fnuz": "fp8_e5m2fnuz",
}

# The stand-ins rebind the names the failed imports above may have bound (mypy: no-redef).
if not HAVE_LMCACHE:

    class MemoryFormat(enum.Enum):  # type: ignore[no-redef]
        """Stand-in for ``lmcache.v1.memory_management.MemoryFormat`` (member names only)."""

        UNDEFINED = 0
        KV_2LTD = 1
        KV_T2D = 2
        KV_2TD = 3
        BINARY = 4
        BINARY_BUFFER = 5
        KV_MLA_FMT = 6

    @dataclass(frozen=True)
    class ObjectKey:  # type: ignore[no-redef]
        """Stand-in for LMCache's MP ``ObjectKey``."""

        chunk_hash: bytes
        model_name: str
        kv_rank: int
        object_group_id: int = 0
        cache_salt: str = ""

    @dataclass
    class DiskCacheMetadata:  # type: ignore[no-redef]
        """Stand-in for ``lmcache.utils.DiskCacheMetadata``."""

        path: str
        size: int
        shape: Any = None
        dtype: Any = None
        cached_positions: Any = None
        fmt: Any = None
        pin_count: int = 0

    def _tags_of(request_configs: dict | None) -> tuple:
        if not request_configs:
            return ()
        return tuple(
            (k[len("lmcache.tag."):], v) for k, v in request_configs.items() if str(k).startswith("lmcache.tag.")
        )

    @dataclass
    class CacheEngineKey:  # type: ignore[no-redef]
        """Stand-in for ``lmcache.utils.CacheEngineKey`` (``dtype`` is a short name or torch dtype)."""

        model_name: str
        world_size: int
        worker_id: int
        chunk_hash: int
        dtype: Any
        request_configs: dict | None = field(default_factory=dict)

        def _dtype_str(self) -> str:
            return dtype_to_short_name(self.dtype) or str(self.dtype)

        def to_string(self) -> str:
            s = f"{self.model_name}@{self.world_size}@{self.worker_id}@{self.chunk_hash:x}@{self._dtype_str()}"
            for k, v in _tags_of(self.request_configs):
                s += f"@{k}%{v}"
            return s

        @staticmethod
        def from_string(s: str) -> CacheEngineKey:
            parts = s.split("@")
            if len(parts) < 5:
                raise ValueError(f"Invalid key string: {s}")
            cfg = {}
            for extra in parts[5:]:
                k, _, v = extra.partition("%")
                cfg[f"lmcache.tag.{k}"] = v
            return CacheEngineKey(parts[0], int(parts[1]), int(parts[2]), int(parts[3], 16),
                                  short_name_to_dtype(parts[4]), cfg)

    @dataclass
    class LayerCacheEngineKey(CacheEngineKey):  # type: ignore[no-redef]
        """Stand-in for ``lmcache.utils.LayerCacheEngineKey`` (layer id after the dtype)."""

        layer_id: int = 0

        def to_string(self) -> str:
            s = (f"{self.model_name}@{self.world_size}@{self.worker_id}@{self.chunk_hash:x}"
                 f"@{self._dtype_str()}@{self.layer_id}")
            for k, v in _tags_of(self.request_configs):
                s += f"@{k}%{v}"
            return s

    def parse_cache_key(s: str) -> CacheEngineKey:
        parts = s.split("@")
        if len(parts) >= 6 and parts[5].isdigit():
            base = CacheEngineKey.from_string("@".join(parts[:5] + parts[6:]))
            return LayerCacheEngineKey(base.model_name, base.world_size, base.worker_id, base.chunk_hash,
                                       base.dtype, base.request_configs, int(parts[5]))
        return CacheEngineKey.from_string(s)


def dtype_to_short_name(dtype: Any) -> str | None:
    """LMCache short name of a dtype (torch dtype or already a name); None for None."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        if dtype.startswith("torch."):
            return _TORCH_ATTR_TO_SHORT.get(dtype[len("torch."):], dtype)
        return dtype
    if torch is not None and isinstance(dtype, torch.dtype):
        attr = str(dtype)[len("torch."):]
        return _TORCH_ATTR_TO_SHORT.get(attr, str(dtype))
    return str(dtype)


def short_name_to_dtype(name: str | None) -> Any:
    """A checkpoint dtype string back to a dtype: torch dtype when torch exists, else the name."""
    if name is None:
        return None
    if torch is None:
        return name
    attr = _SHORT_TO_TORCH_ATTR.get(name)
    if attr is None and name.startswith("torch."):
        short = name[len("torch."):]
        attr = _SHORT_TO_TORCH_ATTR.get(short, short)
    if attr is None:
        return None
    return getattr(torch, attr, None)


def memory_format_from_name(name: str | None) -> Any:
    if name is None:
        return None
    member = getattr(MemoryFormat, name, None)
    return member if isinstance(member, MemoryFormat) else MemoryFormat.UNDEFINED


def memory_format_name(fmt: Any) -> str | None:
    if fmt is None:
        return None
    if isinstance(fmt, str):
        return fmt
    return getattr(fmt, "name", str(fmt))


def shape_from_list(shape: Any) -> Any:
    """A stored shape as LMCache hands it to allocators: ``torch.Size`` (a list without torch).

    A plain tuple would not do: ``LocalCPUBackend.allocate`` reads a tuple as a list of shapes.
    """
    if shape is None:
        return None
    dims = [int(d) for d in shape]
    return torch.Size(dims) if torch is not None else dims


def positions_from_list(pos: list[int] | None) -> Any:
    if pos is None:
        return None
    if torch is not None:
        return torch.tensor(pos, dtype=torch.int64)
    return list(pos)


def positions_to_list(pos: Any) -> list[int] | None:
    if pos is None:
        return None
    if hasattr(pos, "tolist"):
        pos = pos.tolist()
    return [int(p) for p in pos]
