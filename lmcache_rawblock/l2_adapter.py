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
``<class_name>Config`` convention), plus ours: ``verify_payload_checksum``,
``allow_foreign_device`` and ``recovery_read_threads`` (the core's own settings, from its
settings table).

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
from .settings import SETTINGS, parse_value

__all__ = ["RawBlockL2Adapter", "RawBlockL2AdapterConfig"]

# The core's settings that LMCache's RawBlockCoreConfig does not have.
_OURS = tuple(s for s in SETTINGS.values() if s.config and not s.lmcache)


class RawBlockL2AdapterConfig(_lmc.RawBlockL2AdapterConfig):
    """LMCache's raw-block adapter config plus our core's own settings (class attributes
    holding their defaults, set below from the settings table)."""

    @classmethod
    def from_dict(cls, d: dict) -> "RawBlockL2AdapterConfig":
        d = dict(d)
        ours = {s.name: parse_value(s.name, d.pop(s.name)) for s in _OURS if s.name in d}
        base = _lmc.RawBlockL2AdapterConfig.from_dict(d)
        cfg = cls.__new__(cls)
        cfg.__dict__.update(base.__dict__)
        for name, value in ours.items():
            setattr(cfg, name, value)
        return cfg

    def to_core_config(self) -> _OurConfig:  # type: ignore[override]
        """The core config LMCache's adapter builds, as ours, with our settings."""
        return _to_our_config(super().to_core_config(),
                              **{s.name: getattr(self, s.name, s.default) for s in _OURS})

    @classmethod
    def help(cls) -> str:
        ours = "".join(f"- {s.name} ({s.type}, default {s.default}): {s.help}\n" for s in _OURS)
        return _lmc.RawBlockL2AdapterConfig.help() + "\nlmcache_rawblock (the C core) adds:\n" + ours


for _s in _OURS:
    setattr(RawBlockL2AdapterConfig, _s.name, _s.default)
del _s


def _to_our_config(config: Any, **ours: Any) -> _OurConfig:
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
