"""Every setting, at every entry point, with bad values: a clear error and an untouched device.

The settings table (csrc/core/rb_config.c, read through lmcache_rawblock.settings) drives the
plugin's rust_raw_block.* keys, RawBlockCoreConfig and _native.Core. For each setting and each
kind of bad value (wrong type, boolean words, negative, zero, overflowing, huge) this checks
that each entry point raises ValueError or TypeError naming the setting and the value, and
that the device file was not written (it stays a fully sparse file).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os

import pytest

from helpers import REPO
from lmcache_rawblock import _native
from lmcache_rawblock.plugin import RustRawBlockBackend, build_core_config
from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig
from lmcache_rawblock.settings import SETTINGS
from plugin_fakes import FakeEngineConfig, FakeLocalCPUBackend, FakeMetadata

SIZE = 16 << 20
MiB = 1 << 20

# A valid configuration of every setting, small enough for a 16 MiB file.
GOOD = {
    "capacity_bytes": 0, "block_align": 4096, "header_bytes": 4096, "slot_bytes": 65536,
    "use_odirect": False, "enable_zero_copy": True, "meta_total_bytes": 1 * MiB, "meta_magic": b"LMCIDX01",
    "meta_version": 1, "meta_checkpoint_interval_sec": 60, "meta_idle_quiet_ms": 100,
    "meta_enable_periodic": False, "meta_verify_on_load": True, "max_data_transfer_size": 0,
    "load_checkpoint_on_init": True, "io_engine": "posix", "iouring_queue_depth": 64, "use_uring_cmd": False,
    "meta_checkpoint_placement_id": None, "fdp_slot_affinity_enabled": False,
    "verify_payload_checksum": False, "allow_foreign_device": False, "recovery_read_threads": 2,
    "meta_format": "log", "deallocate_freed": "auto", "io_scheduler": "loads_first",
    "read_max_bytes_in_flight": 8 * MiB, "write_max_bytes_in_flight": 2 * MiB, "write_piece_bytes": 256 * 1024,
    "extent_bytes": 0,
    "extent_victim_order": "use",
    "size_classes": 1,
}


def test_the_table_and_the_dataclass_agree():
    """RawBlockCoreConfig has exactly the table's config settings, in order, with its defaults;
    _native.Core takes exactly the table's names; GOOD above covers every setting."""
    fields = dataclasses.fields(RawBlockCoreConfig)
    config_settings = [s for s in SETTINGS.values() if s.config]
    assert [f.name for f in fields] == [s.name for s in config_settings]
    for f, s in zip(fields, config_settings):
        if s.required:
            assert f.default is dataclasses.MISSING, s.name
        else:
            assert f.default == s.default, s.name
    assert set(GOOD) | {"device_path"} == {s.name for s in config_settings}
    assert {s["name"] for s in _native.settings()} == set(SETTINGS)
    policy = {s.name for s in SETTINGS.values() if s.policy}
    assert set(SETTINGS) - {s.name for s in config_settings} - policy == {"key_namespace"}
    for s in SETTINGS.values():
        assert s.help and s.type in ("path", "int", "bool", "choice", "bytes", "id_list"), s.name
        # A placement-policy setting is the plugin's and the MP adapter's, never a core field.
        assert not (s.policy and (s.config or s.lmcache)), s.name


def bad_values(s):
    """(value, why) pairs every entry point must refuse for setting s."""
    out = []
    if s.type == "int" and not s.none_is_zero:
        out += [("abc", "not a number"), ([1], "a list"), (1.5, "not integral"), (True, "a bool"),
                (2 ** 64, "overflows 64 bits"), (2 ** 70, "huge"), (s.max + 1, "above the maximum")]
        if not s.nonpositive_is_zero and not s.clamp_to_min:
            out.append((-1, "negative"))
            if s.min > 0:
                out.append((0, "zero"))
        if s.power_of_two:
            out.append((3 * 1024, "not a power of two"))
    elif s.none_is_zero:  # a placement identifier
        out += [("abc", "not a number"), (0, "zero"), (-1, "negative"), (65536, "above 65535"), (2 ** 70, "huge"),
                (True, "a bool")]
    elif s.type == "bool":
        out += [("maybe", "not a boolean word"), (2, "not 0 or 1"), (-1, "negative"), (1.5, "a float"),
                ([True], "a list")]
    elif s.type == "choice":
        out += [("spdk", "not a choice"), (1, "an int")]
    elif s.type == "bytes":
        out += [("SHORT", "7 bytes"), (b"LMCIDX01X", "9 bytes"), (12345678, "an int"), ("LMC\u00e9DX0", "not ASCII")]
    elif s.type == "path":
        out += [(12345, "an int")]
    return out


CASES = [(name, value, why) for name, s in SETTINGS.items() if s.config
         for value, why in bad_values(s)]


def _sparse(tmp_path):
    path = tmp_path / "dev.bin"
    with open(path, "wb") as f:
        f.truncate(SIZE)
    return str(path)


def _untouched(path):
    st = os.stat(path)
    return st.st_size == SIZE and st.st_blocks == 0


def _names_it(exc, name, value):
    msg = str(exc)
    shown = (repr(value)[:40] in msg) or (str(value)[:40] in msg)
    if isinstance(value, (str, bytes)) and name == "meta_magic":
        shown = shown or str(len(value)) in msg or "ASCII" in msg
    return name in msg and shown


@pytest.mark.parametrize("name,value,why", CASES, ids=[f"{n}-{w}" for n, _, w in CASES])
def test_raw_block_core_config_refuses(tmp_path, name, value, why):
    path = _sparse(tmp_path)
    kw = dict(GOOD, device_path=path)
    kw[name] = value
    with pytest.raises((ValueError, TypeError)) as ei:
        RawBlockCore(RawBlockCoreConfig(**kw), key_namespace="object")
    assert _names_it(ei.value, name, value), f"{why}: {ei.value}"
    assert _untouched(path)


# _native.Core spells "no placement identifier" as 0.
NATIVE_CASES = [(n, v, w) for n, v, w in CASES if not (n == "meta_checkpoint_placement_id" and v == 0)]


@pytest.mark.parametrize("name,value,why", NATIVE_CASES, ids=[f"{n}-{w}" for n, _, w in NATIVE_CASES])
def test_native_core_refuses(tmp_path, name, value, why):
    path = _sparse(tmp_path)
    kw = dict(GOOD, device_path=path, key_namespace="object", meta_checkpoint_placement_id=0)
    kw[name] = value
    with pytest.raises((ValueError, TypeError)) as ei:
        _native.Core(**kw)
    assert _names_it(ei.value, name, value), f"{why}: {ei.value}"
    assert _untouched(path)


PLUGIN_CASES = [(n, v, w) for n, v, w in CASES if SETTINGS[n].plugin and n != "device_path"]


@pytest.mark.parametrize("name,value,why", PLUGIN_CASES, ids=[f"{n}-{w}" for n, _, w in PLUGIN_CASES])
def test_plugin_refuses(tmp_path, name, value, why):
    path = _sparse(tmp_path)
    extra = {f"rust_raw_block.{k}": v for k, v in GOOD.items() if v is not None}
    extra["rust_raw_block.device_path"] = path
    extra[f"rust_raw_block.{name}"] = value
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises((ValueError, TypeError)) as ei:
            RustRawBlockBackend(config=FakeEngineConfig(extra), metadata=FakeMetadata(),
                                local_cpu_backend=FakeLocalCPUBackend(), loop=loop)
    finally:
        loop.close()
    assert _names_it(ei.value, name, value), f"{why}: {ei.value}"
    assert _untouched(path)


def test_native_core_names_unknown_and_missing_keywords(tmp_path):
    path = _sparse(tmp_path)
    kw = dict(GOOD, device_path=path, meta_checkpoint_placement_id=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'slot_byte'"):
        _native.Core(**kw, slot_byte=1)
    del kw["slot_bytes"]
    with pytest.raises(TypeError, match="missing required keyword argument: 'slot_bytes'"):
        _native.Core(**kw)
    with pytest.raises(TypeError, match="keyword arguments only"):
        _native.Core(path)
    assert _untouched(path)


def test_config_refuses_unknown_field():
    with pytest.raises(TypeError, match="slot_byte"):
        RawBlockCoreConfig(**dict(GOOD, device_path="/x", slot_byte=1))


def test_plugin_refuses_unknown_key_and_suggests(tmp_path):
    path = _sparse(tmp_path)
    extra = {"rust_raw_block.device_path": path, "rust_raw_block.slot_bytes": 65536,
             "rust_raw_block.allow_foregin_device": True}
    with pytest.raises(ValueError, match=r"unknown key extra_config\['rust_raw_block.allow_foregin_device'\] = "
                                         r"True; did you mean 'rust_raw_block.allow_foreign_device'"):
        build_core_config(FakeEngineConfig(extra), FakeMetadata(), FakeLocalCPUBackend())
    # LMCache's LocalCPUBackend reads this one; other components' keys are not ours to refuse.
    extra = {"rust_raw_block.device_path": path, "rust_raw_block.slot_bytes": 65536,
             "rust_raw_block.align_local_cpu_allocator": True, "local_cpu.pinned_align_bytes": 4096}
    assert build_core_config(FakeEngineConfig(extra), FakeMetadata(), FakeLocalCPUBackend()).slot_bytes == 65536


@pytest.mark.parametrize("word,expected", [("false", False), ("False", False), ("no", False), ("off", False),
                                           ("0", False), (0, False), ("true", True), ("YES", True), ("on", True),
                                           ("1", True), (1, True)])
def test_boolean_words_mean_what_they_say(tmp_path, word, expected):
    """The string "false" is False at every entry point (a truthy string once bypassed the
    foreign-device guard)."""
    path = _sparse(tmp_path)
    cfg = RawBlockCoreConfig(**dict(GOOD, device_path=path, allow_foreign_device=word, use_odirect=word))
    assert cfg.allow_foreign_device is expected and cfg.use_odirect is expected
    extra = {"rust_raw_block.device_path": path, "rust_raw_block.slot_bytes": 65536,
             "rust_raw_block.allow_foreign_device": word, "rust_raw_block.fdp_slot_affinity_enabled": word}
    pc = build_core_config(FakeEngineConfig(extra), FakeMetadata(), FakeLocalCPUBackend())
    assert pc.allow_foreign_device is expected and pc.fdp_slot_affinity_enabled is expected


def test_strings_from_yaml_and_the_environment_are_parsed(tmp_path):
    path = _sparse(tmp_path)
    extra = {"rust_raw_block.device_path": path, "rust_raw_block.slot_bytes": "65536",
             "rust_raw_block.meta_total_bytes": " 1048576 ", "rust_raw_block.io_engine": "IO_URING",
             "rust_raw_block.meta_magic": "LMCIDX01", "rust_raw_block.capacity_bytes": ""}
    cfg = build_core_config(FakeEngineConfig(extra), FakeMetadata(), FakeLocalCPUBackend())
    assert (cfg.slot_bytes, cfg.meta_total_bytes, cfg.io_engine, cfg.meta_magic, cfg.capacity_bytes) == \
        (65536, MiB, "io_uring", b"LMCIDX01", 0)


def test_lmcache_leniencies_are_kept(tmp_path, caplog):
    """LMCache's RawBlockCoreConfig takes capacity_bytes <= 0 as the whole device, a negative
    quiet time as none, and raises an interval below 1 s to 1 s: so does ours (with a warning
    for the interval). _native.Core, which is ours alone, takes only the real range."""
    caplog.set_level(logging.WARNING, logger="lmcache_rawblock.settings")
    path = _sparse(tmp_path)
    cfg = RawBlockCoreConfig(**dict(GOOD, device_path=path, capacity_bytes=-1, meta_idle_quiet_ms=-5,
                                    meta_checkpoint_interval_sec=0))
    assert (cfg.capacity_bytes, cfg.meta_idle_quiet_ms, cfg.meta_checkpoint_interval_sec) == (0, 0, 1)
    assert "meta_checkpoint_interval_sec=0 is below the minimum 1; using 1" in caplog.text
    core = RawBlockCore(cfg, key_namespace="object")
    try:
        assert core.capacity_bytes == SIZE
    finally:
        core.close()
    with pytest.raises(ValueError, match=r"capacity_bytes must be in 0\.\.9223372036854775807, got -1"):
        _native.Core(**dict(GOOD, device_path=path, capacity_bytes=-1, meta_checkpoint_placement_id=0))
    with pytest.raises(ValueError, match=r"meta_checkpoint_interval_sec must be in 1\.\.4294967295, got 0"):
        _native.Core(**dict(GOOD, device_path=path, meta_checkpoint_interval_sec=0,
                            meta_checkpoint_placement_id=0))


@pytest.mark.parametrize("kw,msg", [
    (dict(header_bytes=8192, slot_bytes=8192), r"slot_bytes must be >= header_bytes \+ 1 \(slot_bytes=8192, "
                                               r"header_bytes=8192\)"),
    (dict(header_bytes=6144), r"header_bytes must be a multiple of block_align \(header_bytes=6144, "
                              r"block_align=4096\)"),
    (dict(meta_total_bytes=8192), r"meta_total_bytes must provide room for at least two metadata copies "
                                  r"\(meta_total_bytes=8192 gives 4096 bytes per copy"),
    (dict(meta_total_bytes=SIZE), r"metadata region exceeds usable device capacity: meta_total_bytes=16777216, "
                                  r"usable capacity 16777216 bytes"),
    (dict(slot_bytes=16 * MiB), r"slot_bytes=16777216, 15728640 bytes left after meta_total_bytes=1048576"),
])
def test_geometry_errors_name_settings_and_numbers(tmp_path, kw, msg):
    path = _sparse(tmp_path)
    with pytest.raises((ValueError, RuntimeError), match=msg):
        RawBlockCore(RawBlockCoreConfig(**dict(GOOD, device_path=path, **kw)), key_namespace="object")
    assert _untouched(path)


def test_missing_device_path_names_the_path(tmp_path):
    missing = str(tmp_path / "no" / "such" / "device")
    with pytest.raises(FileNotFoundError) as ei:
        RawBlockCore(RawBlockCoreConfig(**dict(GOOD, device_path=missing)), key_namespace="object")
    assert ei.value.filename == missing and missing in str(ei.value)


def test_plugin_passes_allow_foreign_device(tmp_path):
    """rust_raw_block.allow_foreign_device reaches the core: the refusal message recommends it,
    so it must work."""
    mkfs = "/sbin/mkfs.ext4" if os.path.exists("/sbin/mkfs.ext4") else "/usr/sbin/mkfs.ext4"
    if not os.path.exists(mkfs):
        pytest.skip("mkfs.ext4 (e2fsprogs) is not installed")
    import subprocess

    path = _sparse(tmp_path)
    subprocess.run([mkfs, "-q", "-F", path], check=True)
    extra = {"rust_raw_block.device_path": path, "rust_raw_block.slot_bytes": 65536,
             "rust_raw_block.meta_total_bytes": MiB, "rust_raw_block.meta_enable_periodic": False}
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="allow_foreign_device"):
            RustRawBlockBackend(config=FakeEngineConfig(dict(extra, **{"rust_raw_block.allow_foreign_device":
                                                                       "false"})),
                                metadata=FakeMetadata(), local_cpu_backend=FakeLocalCPUBackend(), loop=loop)
        be = RustRawBlockBackend(config=FakeEngineConfig(dict(extra, **{"rust_raw_block.allow_foreign_device":
                                                                        True})),
                                 metadata=FakeMetadata(), local_cpu_backend=FakeLocalCPUBackend(), loop=loop)
        be.close()
    finally:
        loop.close()


def test_readme_lists_every_plugin_key_with_its_default():
    """docs/configuration.md's rust_raw_block.* table has a row for every key the plugin reads and
    none it does not read (the legacy engine switches are told of under io_engine), and the
    booleans' defaults there are the table's."""
    from lmcache_rawblock.plugin import _LEGACY_KEYS, _NOT_USED_KEYS, _OWN_KEYS, _PLUGIN_KEYS

    readme = (REPO / "docs" / "configuration.md").read_text()
    rows = {}
    for line in readme.splitlines():
        if line.startswith("| `") and "|" in line[1:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            for key in cells[0].replace("`", "").split(","):
                rows[key.strip()] = cells[1]
    for s in SETTINGS.values():
        if not s.plugin:
            continue
        assert s.name in rows, f"docs/configuration.md's plugin table has no row for rust_raw_block.{s.name}"
        if s.type == "bool" and "," not in rows[s.name]:
            assert rows[s.name] == str(s.default).lower(), s.name
    assert set(rows) == _PLUGIN_KEYS - _LEGACY_KEYS, "docs/configuration.md's plugin table and the keys " \
        "the plugin reads differ"
    table = {s.name for s in SETTINGS.values() if s.plugin}
    assert not table & (_OWN_KEYS | _LEGACY_KEYS), "a plugin key is both a table row and the plugin's own"
    assert not _PLUGIN_KEYS & _NOT_USED_KEYS, "a key is both read and ignored"


DEVICE_CASES = [
    (name, value, why)
    for name in ("writable", "use_odirect", "use_iouring", "use_uring_cmd")
    for value, why in (("false", "a boolean word"), ("maybe", "not a boolean"), (2, "not 0 or 1"),
                       (1.0, "a float"), (None, "None"))
] + [
    ("alignment", "4096", "a string"), ("alignment", -1, "negative"), ("alignment", 3, "not a power of two"),
    ("alignment", 2 ** 31, "above 2^30"), ("alignment", 2 ** 70, "huge"), ("alignment", True, "a bool"),
    ("io_engine", "spdk", "not an engine"), ("io_engine", 1, "an int"),
    ("iouring_queue_depth", "256", "a string"), ("iouring_queue_depth", 32769, "above the kernel's limit"),
    ("iouring_queue_depth", 2 ** 70, "huge"), ("iouring_queue_depth", 1.5, "a float"),
]


@pytest.mark.parametrize("name,value,why", DEVICE_CASES, ids=[f"{n}-{w}" for n, _, w in DEVICE_CASES])
def test_raw_block_device_refuses(tmp_path, name, value, why):
    """RawBlockDevice's arguments: strict booleans (the string "false" once opened a device
    writable with O_DIRECT), integers whose errors name the argument, no silent clamping above
    the kernel's ring limit. The device file is not written."""
    from lmcache_rawblock import RawBlockDevice

    path = _sparse(tmp_path)
    kw = {"writable": True, name: value}
    with pytest.raises((ValueError, TypeError)) as ei:
        RawBlockDevice(path, **kw)
    assert name in str(ei.value) and (repr(value)[:30] in str(ei.value) or str(value)[:30] in str(ei.value)), \
        f"{why}: {ei.value}"
    assert _untouched(path)


def test_raw_block_device_open_error_names_the_path(tmp_path):
    from lmcache_rawblock import RawBlockDevice

    missing = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError) as ei:
        RawBlockDevice(missing, True)
    assert ei.value.strerror == "open failed" and ei.value.filename == missing


def test_for_device_takes_every_field_it_is_not_given_from_the_table():
    cfg = RawBlockCoreConfig.for_device("/dev/nvme0n1", slot_bytes=8192, block_align="512", io_engine="io_uring")
    assert (cfg.device_path, cfg.slot_bytes, cfg.block_align, cfg.io_engine) == ("/dev/nvme0n1", 8192, 512, "io_uring")
    given = {"device_path", "slot_bytes", "block_align", "io_engine"}
    for f in dataclasses.fields(cfg):
        if f.name not in given and SETTINGS[f.name].default is not None:
            assert getattr(cfg, f.name) == SETTINGS[f.name].default, f.name
    with pytest.raises(ValueError, match="header_bytes"):
        RawBlockCoreConfig.for_device("/dev/nvme0n1", slot_bytes=8192, header_bytes="many")


def test_key_spec_for_object_is_the_encoding_of_that_object_key():
    from lmcache_rawblock.raw_block import RawBlockKeySpec, encode_object_key
    from lmcache_rawblock.raw_block._lmcache import ObjectKey

    spec = RawBlockKeySpec.for_object("org/model", kv_rank=3, chunk_hash=bytes(range(32)), cache_salt="s")
    assert spec == encode_object_key(ObjectKey(chunk_hash=bytes(range(32)), model_name="org/model", kv_rank=3,
                                               cache_salt="s"))
    assert spec.encoded.startswith("org%2Fmodel@0x00000003@")
