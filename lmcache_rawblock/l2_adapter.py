"""LMCache's multiprocess (MP) raw-block L2 adapter on our C ``RawBlockCore``.

LMCache 0.5.6 drives a ``RawBlockCore`` from
``lmcache.v1.distributed.l2_adapters.raw_block_l2_adapter.RawBlockL2Adapter``. Its ``plugin``
adapter type loads an adapter class from a module named in the config, so ours is selected
from the ``--l2-adapter`` JSON alone, without changing anything in LMCache::

    {"type": "plugin", "module_path": "lmcache_rawblock.l2_adapter",
     "class_name": "RawBlockL2Adapter",
     "adapter_params": {"device_path": "/dev/nvme0n1", "slot_bytes": 1052672, ...}}

``adapter_params`` takes exactly the keys of the built-in ``raw_block`` type (LMCache's own
``RawBlockL2AdapterConfig.from_dict`` parses them; LMCache finds the config class here by the
``<class_name>Config`` convention), plus ours: ``verify_payload_checksum`` and
``allow_foreign_device``.

``RawBlockL2Adapter`` here is LMCache's adapter class, with one difference: the core it
constructs is ours. Its ``__init__`` is LMCache's own function, run with a private copy of
its module namespace in which ``RawBlockCore`` names our core; LMCache's module and classes
are left untouched, so the built-in ``raw_block`` type keeps using LMCache's core.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

from lmcache.v1.distributed.l2_adapters import raw_block_l2_adapter as _lmc  # type: ignore[import-not-found]

from .raw_block import RawBlockCore as _OurCore
from .raw_block import RawBlockCoreConfig as _OurConfig

__all__ = ["RawBlockL2Adapter", "RawBlockL2AdapterConfig"]

_OURS = ("verify_payload_checksum", "allow_foreign_device")


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.strip().lower() in ("true", "yes", "on", "1")
    raise ValueError(f"{name} must be a boolean, got {value!r}")


class RawBlockL2AdapterConfig(_lmc.RawBlockL2AdapterConfig):
    """LMCache's raw-block adapter config plus our core's own options."""

    verify_payload_checksum: bool = False
    allow_foreign_device: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> "RawBlockL2AdapterConfig":
        d = dict(d)
        ours = {name: _as_bool(name, d.pop(name)) for name in _OURS if name in d}
        base = _lmc.RawBlockL2AdapterConfig.from_dict(d)
        cfg = cls.__new__(cls)
        cfg.__dict__.update(base.__dict__)
        for name, value in ours.items():
            setattr(cfg, name, value)
        return cfg

    def to_core_config(self) -> _OurConfig:  # type: ignore[override]
        """The core config LMCache's adapter builds, as ours, with our options."""
        return _to_our_config(super().to_core_config(),
                              **{name: bool(getattr(self, name, False)) for name in _OURS})

    @classmethod
    def help(cls) -> str:
        return (_lmc.RawBlockL2AdapterConfig.help() + "\n"
                "lmcache_rawblock (the C core) adds:\n"
                "- verify_payload_checksum (bool): keep an xxh3-64 of each payload in its slot "
                "header and treat a load that fails it as a miss (default false)\n"
                "- allow_foreign_device (bool): use a device holding a file system or partition "
                "table (default false: refused)\n")


def _to_our_config(config: Any, **ours: bool) -> _OurConfig:
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
              if f.name in _OurConfig.__dataclass_fields__}
    return _OurConfig(**fields, **ours)


def _our_core(config: Any, *, key_namespace: str) -> _OurCore:
    """Our RawBlockCore, in place of LMCache's, from the core config the adapter built."""
    if not isinstance(config, _OurConfig):
        config = _to_our_config(config)
    return _OurCore(config, key_namespace=key_namespace)


_NAMESPACE = dict(vars(_lmc))
_NAMESPACE["RawBlockCore"] = _our_core
_lmc_init = _lmc.RawBlockL2Adapter.__init__
_init_with_our_core = types.FunctionType(_lmc_init.__code__, _NAMESPACE, _lmc_init.__name__,
                                         _lmc_init.__defaults__, _lmc_init.__closure__)
_init_with_our_core.__kwdefaults__ = _lmc_init.__kwdefaults__


class RawBlockL2Adapter(_lmc.RawBlockL2Adapter):
    """LMCache's MP raw-block L2 adapter, storing through our C core."""

    def __init__(self, config: Any, l1_memory_desc: Any = None) -> None:
        if isinstance(config, dict):
            config = RawBlockL2AdapterConfig.from_dict(config)
        if not isinstance(config, _lmc.RawBlockL2AdapterConfig):
            raise TypeError(f"config must be a RawBlockL2AdapterConfig or a dict, got {type(config).__name__}")
        _init_with_our_core(self, config, l1_memory_desc)
