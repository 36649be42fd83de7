"""The public surface LMCache code reads: every public attribute of LMCache 0.5.6's
``RawBlockCore`` and ``RustRawBlockBackend`` instances exists on ours, with the same values
where they are configuration, and ``report_status()`` has at least LMCache's keys.

Marked ``lmcache``: run with ``make test-lmcache``.
"""

from __future__ import annotations

import logging

import pytest

from core_helpers import make_config, make_device
from helpers import lmcache_imports
from lmcache_rawblock import lmcache_paths

with lmcache_imports() as lmc:
    import torch
    lmc_rb = lmcache_paths.import_raw_block()  # where the installed LMCache version has it

from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig  # noqa: E402

pytestmark = lmc.marks

logging.getLogger("LMCache").setLevel(logging.ERROR)

# Configuration attributes: same value on both cores.
CONFIG_ATTRS = ["device_path", "capacity_bytes", "block_align", "header_bytes", "slot_bytes", "use_odirect",
                "enable_zero_copy", "meta_total_bytes", "meta_magic", "meta_magic_text", "meta_version",
                "meta_checkpoint_interval_sec", "meta_idle_quiet_ms", "meta_enable_periodic",
                "load_checkpoint_on_init", "meta_verify_on_load", "io_engine", "iouring_queue_depth",
                "use_uring_cmd", "fdp_slot_affinity_enabled", "meta_checkpoint_placement_id", "key_namespace"]


def _public(obj) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def _kwargs(dev, **kw):
    base = dict(make_config(dev, **kw).__dict__)
    return {k: v for k, v in base.items() if k in lmc_rb.RawBlockCoreConfig.__dataclass_fields__}


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_core_instance_surface_matches_lmcache(tmp_path, engine):
    kw = dict(io_engine=engine, meta_magic=b"TESTMAG1", meta_version=3, meta_idle_quiet_ms=7,
              iouring_queue_depth=16)
    theirs = lmc_rb.RawBlockCore(lmc_rb.RawBlockCoreConfig(**_kwargs(make_device(tmp_path, name="a"), **kw)),
                                 key_namespace="object")
    ours = RawBlockCore(RawBlockCoreConfig(**_kwargs(make_device(tmp_path, name="b"), **kw)),
                        key_namespace="object")
    try:
        assert sorted(_public(theirs) - _public(ours)) == []
        for name in CONFIG_ATTRS:
            want, got = getattr(theirs, name), getattr(ours, name)
            if name == "device_path":
                continue  # two devices
            assert (name, got) == (name, want)
            assert type(got) is type(want), name
        assert sorted(set(theirs.report_status()) - set(ours.report_status())) == []
        for name in ("is_healthy", "worker_error", "fixed_buffers_registered", "fixed_buffer_registered_bytes"):
            assert ours.report_status()[name] == theirs.report_status()[name], name
    finally:
        theirs.close()
        ours.close()


def _paged_buffer(mib=4):
    t = torch.zeros(mib << 20, dtype=torch.uint8)
    return t, t.data_ptr(), t.numel()


def test_register_fixed_buffer_range_like_lmcache(tmp_path):
    """Same signature, validation and effect as LMCache's: fixed_buffer* keys of
    report_status() show the registration; a second registration raises the same
    RuntimeError and keeps the first (LMCache's MP adapter catches that and carries on);
    posix ignores the call."""
    for core_cls, cfg_cls, name in ((lmc_rb.RawBlockCore, lmc_rb.RawBlockCoreConfig, "theirs"),
                                    (RawBlockCore, RawBlockCoreConfig, "ours")):
        core = core_cls(cfg_cls(**_kwargs(make_device(tmp_path, name=name), io_engine="io_uring")),
                        key_namespace="object")
        mem, ptr, size = _paged_buffer()
        try:
            for bad in ((0, size), (ptr, 0), (-1, size)):
                with pytest.raises(ValueError, match="must be > 0"):
                    core.register_fixed_buffer_range(*bad)
            st = core.report_status()
            assert (st["fixed_buffers_registered"], st["fixed_buffer_registered_bytes"]) == (False, 0), name
            core.register_fixed_buffer_range(ptr, size)
            st = core.report_status()
            assert (st["fixed_buffers_registered"], st["fixed_buffer_registered_bytes"]) == (True, size), name
            with pytest.raises(RuntimeError, match="^fixed buffers are already registered$"):
                core.register_fixed_buffer_range(ptr, size)
            st = core.report_status()  # the first registration stays
            assert (st["fixed_buffers_registered"], st["fixed_buffer_registered_bytes"]) == (True, size), name
        finally:
            core.close()
        assert core.report_status()["fixed_buffers_registered"] is False, name
        assert core.report_status()["is_healthy"] is False, name
    posix = RawBlockCore(RawBlockCoreConfig(**_kwargs(make_device(tmp_path, name="p"))), key_namespace="object")
    try:
        assert posix.register_fixed_buffer_range(0, 0) is None  # ignored, as LMCache does
        assert posix.report_status()["fixed_buffers_registered"] is False
    finally:
        posix.close()


def test_fixed_buffer_range_over_1_gib_is_split_like_lmcache(tmp_path, monkeypatch):
    core = RawBlockCore(RawBlockCoreConfig(**_kwargs(make_device(tmp_path), io_engine="io_uring")),
                        key_namespace="object")
    calls = []

    class Spy:
        def __init__(self, native):
            self._n = native

        def register_buffers(self, ptrs, sizes):
            calls.append((list(ptrs), list(sizes)))

        def __getattr__(self, name):
            return getattr(self._n, name)

    native = core._native
    monkeypatch.setattr(core, "_native", Spy(native))
    try:
        G = 1 << 30
        core.register_fixed_buffer_range(4096, 2 * G + 5)
        assert calls == [([4096, 4096 + G, 4096 + 2 * G], [G, G, 5])]
    finally:
        monkeypatch.setattr(core, "_native", native)
        core.close()


def test_set_raw_device_for_testing_is_refused_clearly(tmp_path):
    core = RawBlockCore(RawBlockCoreConfig(**_kwargs(make_device(tmp_path))), key_namespace="object")
    try:
        with pytest.raises(NotImplementedError, match="owned by the C core.*got object"):
            core.set_raw_device_for_testing(object())
    finally:
        core.close()


def test_plugin_instance_surface_matches_lmcache(tmp_path):
    from lmcache_stack import LMC_MODULE, OUR_MODULE, Stack, make_config as plugin_config, small_extra

    made = []
    try:
        plugins = {}
        for module, name in ((LMC_MODULE, "theirs"), (OUR_MODULE, "ours")):
            dev = make_device(tmp_path, size=64 << 20, name=name)
            st = Stack(plugin_config(small_extra(dev, module=module)))
            made.append(st)
            be = st.launch()
            assert be is not None, f"{module} did not load"
            plugins[name] = (be, dev)
        theirs, ours = plugins["theirs"][0], plugins["ours"][0]
        assert sorted(_public(theirs) - _public(ours)) == []
        assert ours.device_path == plugins["ours"][1] and theirs.device_path == plugins["theirs"][1]
        for name in ("meta_magic_text", "meta_version", "block_align", "header_bytes", "slot_bytes",
                     "meta_total_bytes", "capacity_bytes", "data_base_offset"):
            assert (name, getattr(ours, name)) == (name, getattr(theirs, name))
        # LMCache's plugin has no report_status(); ours hands out its core's, which has all of
        # LMCache's core keys (test above) and the eviction policy.
        assert ours.report_status()["meta_total_bytes"] == theirs.meta_total_bytes
    finally:
        for st in made:
            st.close()
