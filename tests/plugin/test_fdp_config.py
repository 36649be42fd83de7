"""FDP configuration: the fdp_* settings from the settings table, the plugin's
rust_raw_block.fdp_* keys checked together (errors name the key and the value), the check of
the configured identifiers against what the device reports, and the plugin placing its writes
(on a file standing in for an FDP namespace, tests/fdp_fakes.py)."""

from __future__ import annotations

import dataclasses

import pytest

from fdp_fakes import FdpCoreOnFile
from lmcache_rawblock import _native, fdp, plugin
from lmcache_rawblock.plugin import RustRawBlockBackend, build_configs
from lmcache_rawblock.settings import SETTINGS, parse_value
from plugin_fakes import FakeEngineConfig, FakeLocalCPUBackend, FakeMetadata, LoopThread, base_extra, make_obj

MiB = 1 << 20
FDP_KEYS = ("fdp_enabled", "fdp_placement_ids", "fdp_data_placement_policy", "fdp_slot_reuse_policy", "fdp_phase")


def passthrough(**overrides):
    extra = base_extra("/dev/ng0n1", slot_bytes=65536, io_engine="io_uring", use_uring_cmd=True)
    extra.update({f"rust_raw_block.{k}": v for k, v in overrides.items()})
    return extra


def configs(extra, metadata=None):
    return build_configs(FakeEngineConfig(extra), metadata or FakeMetadata(), FakeLocalCPUBackend())


# --------------------------------------------------------------------------- the table


def test_fdp_settings_are_policy_settings_of_both_entry_points():
    for name in FDP_KEYS:
        s = SETTINGS[name]
        assert s.policy and s.plugin and not s.config, name
        assert s.lmcache_mp == (name != "fdp_phase"), name
    assert SETTINGS["fdp_placement_ids"].type == "id_list"
    assert SETTINGS["fdp_data_placement_policy"].choices == fdp.LMCACHE_POLICIES + fdp.STRATEGIES
    assert SETTINGS["fdp_slot_reuse_policy"].choices == (fdp.NONE, fdp.PID_AFFINITY)


def test_native_core_does_not_take_policy_settings(tmp_path):
    path = tmp_path / "d"
    path.write_bytes(b"")
    with pytest.raises(TypeError, match="unexpected keyword argument 'fdp_enabled'"):
        _native.Core(device_path=str(path), slot_bytes=65536, fdp_enabled=True)


@pytest.mark.parametrize("text,ids", [([3, 1, 2], (3, 1, 2)), ((4,), (4,)), ("1,2, 3", (1, 2, 3)),
                                      ("[5, 6]", (5, 6)), (["7", "8"], (7, 8)), ([65535], (65535,))])
def test_placement_id_lists_from_yaml_json_and_the_environment(text, ids):
    assert parse_value("fdp_placement_ids", text) == ids


@pytest.mark.parametrize("value,msg", [
    ([1, 0], r"fdp_placement_ids must not contain placement identifier 0 \(in \[1, 0\]\)"),
    ([2, 3, 2], r"fdp_placement_ids must not contain duplicates, got \[2, 3, 2\] \(2 repeated\)"),
    ([], r"fdp_placement_ids must not be empty, got \[\]"),
    ("", r"fdp_placement_ids must not be empty, got ''"),
    ([65536], r"fdp_placement_ids must contain placement identifiers in range 1..=65535, got 65536"),
    ([-1], r"fdp_placement_ids must contain positive integers, got -1"),
    ([True], r"fdp_placement_ids must contain integers, got True"),
    ("1,x", r"fdp_placement_ids must contain integers, got '1,x'"),
    (7, r"fdp_placement_ids must be a list of integers, got 7"),
])
def test_placement_id_list_errors_name_the_key_and_the_value(value, msg):
    with pytest.raises(ValueError, match=msg):
        parse_value("fdp_placement_ids", value)


# --------------------------------------------------------------------------- the plugin's keys


def test_plugin_defaults_without_fdp():
    cfg, f = configs(base_extra("/dev/x", slot_bytes=65536))
    assert f == fdp.FdpSettings() and not cfg.fdp_slot_affinity_enabled


def test_plugin_defaults_with_fdp_on():
    cfg, f = configs(passthrough(fdp_enabled=True))
    assert (f.enabled, f.placement_ids, f.data_policy, f.slot_reuse_policy, f.phase) == \
        (True, None, fdp.TP_WORKER, fdp.PID_AFFINITY, fdp.AUTO)
    assert cfg.fdp_slot_affinity_enabled


@pytest.mark.parametrize("policy", fdp.LMCACHE_POLICIES + fdp.STRATEGIES)
def test_plugin_takes_every_policy(policy):
    _, f = configs(passthrough(fdp_enabled="true", fdp_placement_ids="2,3", fdp_data_placement_policy=policy.upper()))
    assert f.data_policy == policy and f.placement_ids == (2, 3)


@pytest.mark.parametrize("reuse,affinity,expected", [
    ("none", None, False), ("pid_affinity", None, True), (None, False, False), (None, True, True),
    ("pid_affinity", True, True), ("none", False, False)])
def test_slot_reuse_policy_and_affinity_flag(reuse, affinity, expected):
    over = {"fdp_enabled": True}
    if reuse is not None:
        over["fdp_slot_reuse_policy"] = reuse
    if affinity is not None:
        over["fdp_slot_affinity_enabled"] = affinity
    cfg, _ = configs(passthrough(**over))
    assert cfg.fdp_slot_affinity_enabled is expected


@pytest.mark.parametrize("over,msg", [
    (dict(fdp_enabled=True, use_uring_cmd=False),
     r"extra_config\['rust_raw_block.fdp_enabled'\]=true requires extra_config\['rust_raw_block.io_engine'\]="
     r"'io_uring' and extra_config\['rust_raw_block.use_uring_cmd'\]=true \(got io_engine='io_uring', "
     r"use_uring_cmd=False\)"),
    (dict(fdp_enabled=True, io_engine="posix", use_uring_cmd=False), r"\(got io_engine='posix', use_uring_cmd=False\)"),
    (dict(fdp_placement_ids=[1, 2]),
     r"extra_config\['rust_raw_block.fdp_placement_ids'\]=\[1, 2\] requires "
     r"extra_config\['rust_raw_block.fdp_enabled'\]=true"),
    (dict(fdp_data_placement_policy="prompt"), r"fdp_data_placement_policy'\]='prompt' requires .*fdp_enabled"),
    (dict(fdp_slot_reuse_policy="pid_affinity"), r"fdp_slot_reuse_policy'\]='pid_affinity' requires .*fdp_enabled"),
    (dict(fdp_phase="decode"), r"fdp_phase'\]='decode' requires .*fdp_enabled"),
    (dict(fdp_enabled=True, fdp_placement_ids=[1, 2], meta_checkpoint_placement_id=2),
     r"fdp_placement_ids'\]=\[1, 2\] must not contain extra_config\['rust_raw_block.meta_checkpoint_placement_id'"
     r"\]=2"),
    (dict(fdp_enabled=True, fdp_placement_ids=[3], fdp_data_placement_policy="phase"),
     r"fdp_data_placement_policy'\]='phase' needs two identifiers .* got \[3\]"),
    (dict(fdp_enabled=True, fdp_phase="prefill"),
     r"fdp_phase'\]='prefill' applies to .*fdp_data_placement_policy'\]='phase' only \(it is 'tp_worker'\)"),
    (dict(fdp_enabled=True, fdp_slot_reuse_policy="none", fdp_slot_affinity_enabled=True),
     r"fdp_slot_affinity_enabled'\]=True contradicts .*fdp_slot_reuse_policy'\]='none'"),
    (dict(fdp_enabled=True, fdp_data_placement_policy="round_robin"),
     r"fdp_data_placement_policy'\] must be one of: none, cache_salt_prefix, cache_salt_rank, tp_worker, prompt, "
     r"phase; got 'round_robin'"),
    (dict(fdp_enabled="maybe"), r"fdp_enabled'\] must be a boolean \(true/false\), got 'maybe'"),
    (dict(fdp_enabled=True, fdp_placement_ids=[0, 1]), r"fdp_placement_ids'\] must not contain placement identifier 0"),
    (dict(fdp_enabled=True, fdp_placement_ids=[4, 4]), r"fdp_placement_ids'\] must not contain duplicates, got \[4, 4\]"),
    (dict(fdp_phase="lunch"), r"fdp_phase'\] must be one of: auto, prefill, decode; got 'lunch'"),
])
def test_plugin_errors_name_the_key_and_the_value(over, msg):
    with pytest.raises(ValueError, match=msg):
        configs(passthrough(**over))


def test_plugin_suggests_fdp_keys_for_typos():
    with pytest.raises(ValueError, match=r"did you mean 'rust_raw_block.fdp_placement_ids'"):
        configs(passthrough(fdp_placement_id=[1]))


# --------------------------------------------------------------------------- against the device


def test_device_identifiers_default_and_checked():
    rep = [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert fdp.data_placement_ids(rep, None, None, device="/dev/ng0n1") == (1, 2, 3)
    assert fdp.data_placement_ids(rep, None, 1, device="/dev/ng0n1") == (2, 3)
    assert fdp.data_placement_ids(rep, [3, 2], 1, device="/dev/ng0n1") == (3, 2)
    with pytest.raises(ValueError, match=r"fdp_placement_ids=\[2, 9\]: \[9\] not reported by /dev/ng0n1 "
                                         r"\(it reports \[1, 2, 3\]\)"):
        fdp.data_placement_ids(rep, [2, 9], None, device="/dev/ng0n1")
    with pytest.raises(ValueError, match=r"meta_checkpoint_placement_id=7 is not a placement identifier of "
                                         r"/dev/ng0n1 \(it reports \[1, 2, 3\]\)"):
        fdp.data_placement_ids(rep, None, 7, device="/dev/ng0n1")
    with pytest.raises(RuntimeError, match=r"/dev/ng0n1 reports no non-zero placement identifiers"):
        fdp.data_placement_ids([(0, 0)], None, None, device="/dev/ng0n1")
    with pytest.raises(ValueError, match=r"no placement identifier of /dev/ng0n1 is left for KV data"):
        fdp.data_placement_ids([(0, 0), (1, 1)], None, 1, device="/dev/ng0n1")
    with pytest.raises(ValueError, match=r"'phase' needs two placement identifiers .* leaves \[2\]"):
        fdp.data_placement_ids([(1, 1), (2, 2)], None, 1, device="/dev/ng0n1", policy=fdp.PHASE)


# --------------------------------------------------------------------------- the plugin placing writes


@dataclasses.dataclass
class PdEngineConfig(FakeEngineConfig):
    enable_pd: bool = False
    pd_role: str | None = None


@pytest.fixture
def fdp_plugin(tmp_path, monkeypatch):
    """Plugins on sparse files whose core reports FDP handles 1..4 and records placements."""
    monkeypatch.setattr(plugin, "RawBlockCore", FdpCoreOnFile)
    made = []
    loop = LoopThread()  # StorageManager's loop runs in a thread of its own

    def make(metadata=None, engine_config=None, **over):
        path = tmp_path / f"dev{len(made)}.img"
        with open(path, "wb") as f:
            f.truncate(64 * MiB)
        metadata = metadata or FakeMetadata()
        if metadata.world_size > 1:  # each TP worker has a device of its own (LMCache's rule)
            over["per_tp_device_paths"] = {str(r): str(path) if r == metadata.worker_id else f"/dev/other{r}"
                                           for r in range(metadata.world_size)}
        extra = base_extra(str(path), io_engine="io_uring", use_uring_cmd=True, fdp_enabled=True, **over)
        cfg = engine_config(extra) if engine_config else FakeEngineConfig(extra)
        be = RustRawBlockBackend(config=cfg, metadata=metadata,
                                 local_cpu_backend=FakeLocalCPUBackend(), loop=loop.loop)
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()
    loop.stop()


def store(be, keys):
    """One store call, as StorageManager.batched_put makes it; returns the placements written."""
    objs = [make_obj(i) for i in range(len(keys))]
    futs = be.batched_submit_put_task(keys, objs) or []
    for fut in futs:
        fut.result(30)
    return [be._core.placed.get(k.to_string()) for k in keys]


def key(h, worker=0, world=1, salt=None):
    from lmcache_rawblock.raw_block._lmcache import CacheEngineKey

    return CacheEngineKey("m", world, worker, h, "bfloat16", {} if salt is None else {fdp.LEGACY_SALT_CONFIG: salt})


def test_plugin_tp_worker_places_by_worker(fdp_plugin):
    be = fdp_plugin(metadata=FakeMetadata(world_size=3, worker_id=2), meta_checkpoint_placement_id=1)
    assert store(be, [key(10, 2, 3), key(11, 2, 3)]) == [4, 4]  # ids (2, 3, 4): worker 2
    st = be.report_status()
    assert st["fdp_enabled"] and st["fdp_placement_ids"] == [2, 3, 4] and st["fdp_data_placement_policy"] == "tp_worker"
    assert st["fdp_discovered_status"] == FdpCoreOnFile.reported and st["fdp_slot_affinity_enabled"]


def test_plugin_prompt_anchors_on_the_first_chunk_even_when_it_is_stored(fdp_plugin):
    be = fdp_plugin(fdp_data_placement_policy="prompt")  # ids (1, 2, 3, 4)
    assert store(be, [key(5)]) == [2]  # 5 % 4 == 1
    # the same prompt grown by two chunks: chunk 5 is on the device already, 6 and 7 follow it
    assert store(be, [key(5), key(6), key(7)]) == [2, 2, 2]
    assert be._core.put_calls[-1] == [2, 2]


def test_plugin_phase_from_the_disaggregated_role(fdp_plugin):
    be = fdp_plugin(engine_config=lambda e: PdEngineConfig(e, enable_pd=True, pd_role="receiver"),
                    fdp_data_placement_policy="phase", fdp_placement_ids=[3, 4])
    assert store(be, [key(1), key(2), key(3)]) == [4, 4, 4]


def test_plugin_phase_by_store_shape(fdp_plugin):
    be = fdp_plugin(fdp_data_placement_policy="phase", fdp_placement_ids="3,4")
    assert store(be, [key(1), key(2), key(3)]) == [3, 3, 3]
    assert store(be, [key(4)]) == [4]


def test_plugin_cache_salt_prefix_from_the_request_tag(fdp_plugin):
    be = fdp_plugin(fdp_data_placement_policy="cache_salt_prefix", fdp_placement_ids=[4, 3])
    assert store(be, [key(1, salt="alice:1"), key(2, salt="bob:7"), key(3)]) == [4, 3, None]


def test_plugin_none_writes_without_directives(fdp_plugin):
    be = fdp_plugin(fdp_data_placement_policy="none")
    assert store(be, [key(1), key(2)]) == [None, None]
    assert be._core.put_calls == [[None, None]]


@pytest.mark.parametrize("over,msg", [
    (dict(fdp_placement_ids=[2, 9]), r"extra_config\['rust_raw_block.fdp_placement_ids'\]=\[2, 9\]: \[9\] not "
                                     r"reported by .*dev0.img \(it reports \[1, 2, 3, 4\]\)"),
    (dict(meta_checkpoint_placement_id=8), r"meta_checkpoint_placement_id'\]=8 is not a placement identifier"),
])
def test_plugin_refuses_identifiers_the_device_does_not_report(fdp_plugin, over, msg):
    with pytest.raises(ValueError, match=msg):
        fdp_plugin(**over)


def test_plugin_fdp_status_failure_names_the_device(fdp_plugin, monkeypatch):
    def broken(self):
        raise RuntimeError("I/O Management Receive failed")

    monkeypatch.setattr(FdpCoreOnFile, "fetch_fdp_status", broken)
    with pytest.raises(RuntimeError, match=r"fdp_enabled'\]=true: cannot read the FDP placement identifiers of "
                                           r".*dev0.img: I/O Management Receive failed"):
        fdp_plugin()
