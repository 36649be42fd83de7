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
``allow_foreign_device``, ``recovery_read_threads``, ``meta_format``, ``deallocate_freed``,
``io_scheduler`` and its three byte budgets (the core's own settings, from its settings
table), ``fdp_phase``, and three more values of ``fdp_data_placement_policy``: ``tp_worker``,
``prompt`` and ``phase`` (``lmcache_rawblock.fdp``).

FDP: with ``fdp_enabled`` LMCache's adapter code asks our core for the device's placement
identifiers (``fetch_fdp_status``) and passes each store's identifiers to our core's
``put_many``. LMCache's policies (``cache_salt_prefix``, ``cache_salt_rank``) are LMCache's
code; for ours, the one method that picks a store's identifiers routes through
``lmcache_rawblock.fdp`` instead.

``RawBlockL2Adapter`` here is LMCache's adapter class, with two differences: the core it
constructs is ours, and its deletes give their slots back at once. Its ``__init__`` is
LMCache's own function, run with a private copy of its module namespace in which
``RawBlockCore`` names our core; LMCache's module and classes are left untouched, so the
built-in ``raw_block`` type keeps using LMCache's core.

Deletes: LMCache's L2 eviction controller calls ``delete(keys)`` with a batch of victims, which
LMCache's code turns into one ``delete_many(force=False)``. A freed slot is reusable only once
a checkpoint no longer lists it, so without more a put after an eviction would write that
checkpoint itself. ``delete`` here runs LMCache's and then signals a background thread
(``lmcache_rawblock.reclaim``, one per adapter, started by the first delete, stopped by
``close`` before the core closes) that writes it, off the controller's thread and off the
store workers'.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from typing import Any

from lmcache.v1.distributed.l2_adapters import raw_block_l2_adapter as _lmc

from . import fdp, metrics
from .raw_block import RawBlockCore as _OurCore
from .raw_block import RawBlockCoreConfig as _OurConfig
from .raw_block import multi
from .reclaim import Reclaimer
from .settings import SETTINGS, parse_value

__all__ = ["RawBlockL2Adapter", "RawBlockL2AdapterConfig"]

# The core's settings that LMCache's RawBlockCoreConfig does not have, and the placement-policy
# settings LMCache's MP adapter does not have (write admission is the plugin's only).
_OURS = tuple(s for s in SETTINGS.values() if s.config and not s.lmcache)
_OUR_POLICY = tuple(s for s in SETTINGS.values() if s.policy and not s.lmcache_mp and s.name != "admission")
_POLICY_KEY = "fdp_data_placement_policy"
_CLOSE_RECLAIM_WAIT_S = 30.0
logger = logging.getLogger("lmcache.v1.distributed.l2_adapters.raw_block_l2_adapter")


class RawBlockL2AdapterConfig(_lmc.RawBlockL2AdapterConfig):
    """LMCache's raw-block adapter config plus our core's own settings (class attributes
    holding their defaults, set below from the settings table)."""

    @classmethod
    def from_dict(cls, d: dict) -> RawBlockL2AdapterConfig:
        d = dict(d)
        paths = multi.mp_device_paths(d)  # several devices: one core over them (MultiDeviceCore)
        ours = {s.name: parse_value(s.name, d.pop(s.name)) for s in _OURS + _OUR_POLICY if s.name in d}
        # LMCache's parser knows its own policies only: it sees ours as "none" (no directive
        # from its code), and the adapter routes ours itself.
        strategy = d.get(_POLICY_KEY)
        if strategy is not None and strategy != "":
            strategy = parse_value(_POLICY_KEY, strategy)
            if strategy in fdp.STRATEGIES:
                d[_POLICY_KEY] = fdp.NONE
        base = _lmc.RawBlockL2AdapterConfig.from_dict(d)
        cfg = cls.__new__(cls)
        cfg.__dict__.update(base.__dict__)
        for name, value in ours.items():
            setattr(cfg, name, value)
        if strategy in fdp.STRATEGIES:
            cfg.fdp_data_placement_policy = strategy
        cfg.device_paths = paths
        # Our checks of the FDP keys together (the strategies' and fdp_phase's needs, named).
        fdp.resolve_settings(
            {"fdp_enabled": cfg.fdp_enabled, "fdp_placement_ids": cfg.fdp_placement_ids,
             _POLICY_KEY: cfg.fdp_data_placement_policy, "fdp_slot_reuse_policy": cfg.fdp_slot_reuse_policy,
             "fdp_phase": cfg.fdp_phase},
            io_engine=cfg.io_engine, use_uring_cmd=cfg.use_uring_cmd,
            meta_checkpoint_placement_id=cfg.meta_checkpoint_placement_id,
            default_policy=fdp.CACHE_SALT_PREFIX)
        return cfg

    def to_core_config(self) -> _OurConfig | multi.MultiDeviceConfig:
        """The core config LMCache's adapter builds, as ours, with our settings (with several
        ``device_paths``, that config once per device)."""
        cfg = _to_our_config(super().to_core_config(),
                             **{s.name: getattr(self, s.name, s.default) for s in _OURS})
        paths = getattr(self, "device_paths", None)
        return multi.MultiDeviceConfig.for_paths(cfg, paths) if paths and len(paths) > 1 else cfg

    @classmethod
    def help(cls) -> str:
        ours = "".join(f"- {s.name} ({s.type}, default {s.default}): {s.help}\n" for s in _OURS + _OUR_POLICY)
        strategies = (f"- {_POLICY_KEY} also takes {', '.join(fdp.STRATEGIES)}: "
                      f"{SETTINGS[_POLICY_KEY].help}\n")
        return (_lmc.RawBlockL2AdapterConfig.help() + "\nlmcache_rawblock (the C core) adds:\n" + ours
                + strategies)


for _s in _OURS + _OUR_POLICY:
    setattr(RawBlockL2AdapterConfig, _s.name, _s.default)
del _s


def _to_our_config(config: Any, **ours: Any) -> _OurConfig:
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
              if f.name in _OurConfig.__dataclass_fields__}
    return _OurConfig(**fields, **ours)


def _our_core(config: Any, *, key_namespace: str) -> _OurCore | multi.MultiDeviceCore:
    """Our RawBlockCore, in place of LMCache's, from the core config the adapter built; a
    MultiDeviceCore over several devices (one adapter over N devices: docs/compatibility.md)."""
    if isinstance(config, multi.MultiDeviceConfig):
        return multi.MultiDeviceCore(config, key_namespace=key_namespace)
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
        metrics.attach_mp(self._core, config.device_path)  # LMCache's MP observability; drops out with the core
        self._reclaimer = Reclaimer("rawblock-l2-reclaim", self._reclaim_pass, logger)
        self._fdp_role = fdp.role_phase(getattr(config, "fdp_phase", fdp.AUTO))
        if self._fdp_enabled and self._fdp_data_placement_policy == fdp.PHASE and len(self._fdp_placement_ids) < 2:
            ids = list(self._fdp_placement_ids)
            self.close()
            raise ValueError(f"{_POLICY_KEY}='phase' needs two placement identifiers for KV data (prefill, "
                             f"decode); {config.device_path} leaves {ids}")

    def delete(self, keys: list) -> None:
        """LMCache's delete (one batched ``delete_many(force=False)``, listeners told), then the
        checkpoint that makes the freed slots reusable, on the reclaim thread."""
        try:
            super().delete(keys)
        finally:
            self._reclaimer.signal()

    def _reclaim_pass(self) -> bool:
        self._core.reclaim_held_slots()
        return False

    def close(self) -> None:
        reclaimer = getattr(self, "_reclaimer", None)
        if reclaimer is not None and not reclaimer.stop(_CLOSE_RECLAIM_WAIT_S):
            logger.warning("the raw-block reclaim thread is still writing a checkpoint after %.0f s; closing anyway",
                           _CLOSE_RECLAIM_WAIT_S)
        super().close()

    def report_status(self) -> dict:
        status = super().report_status()
        reclaimer = getattr(self, "_reclaimer", None)
        if reclaimer is not None:
            status["reclaim"] = reclaimer.status()
        return status

    def _assign_fdp_placement_ids(self, keys: list) -> list | None:
        """Placement identifiers of one store task: LMCache's policies by LMCache's code, the
        strategies of ``lmcache_rawblock.fdp`` by that module."""
        policy = self._fdp_data_placement_policy
        if not self._fdp_enabled or policy not in fdp.STRATEGIES:
            return super()._assign_fdp_placement_ids(keys)
        pids = fdp.route(policy, [fdp.object_key_facts(k) for k in keys], self._fdp_placement_ids,
                         role=self._fdp_role)
        return None if all(p is None for p in pids) else pids
