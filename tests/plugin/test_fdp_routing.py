"""FDP routing (lmcache_rawblock.fdp): each policy's placement of keys, as pure functions of the
keys LMCache passes (CacheEngineKey for the plugin, ObjectKey for the MP adapter) and the
placement identifiers. No device."""

from __future__ import annotations

import logging

import pytest

from lmcache_rawblock import fdp
from lmcache_rawblock.raw_block._lmcache import CacheEngineKey, ObjectKey

IDS = (2, 3, 4)


def legacy(chunk_hash: int, worker: int = 0, world: int = 1, salt: str | None = None, model: str = "m"):
    configs = {} if salt is None else {fdp.LEGACY_SALT_CONFIG: salt}
    return CacheEngineKey(model, world, worker, chunk_hash, "bfloat16", configs)


def kv_rank(world: int, global_rank: int, local_world: int, local_rank: int) -> int:
    # LMCache's ObjectKey.ComputeKVRank packing
    return (world << 24) | (global_rank << 16) | (local_world << 8) | local_rank


def obj(chunk_hash: int, rank: int = 0, world: int = 1, salt: str = "", group: int = 0):
    return ObjectKey(chunk_hash.to_bytes(8, "big"), "m", kv_rank(world, rank, world, rank), group, salt)


def facts_l(keys):
    return [fdp.legacy_key_facts(k) for k in keys]


def facts_o(keys):
    return [fdp.object_key_facts(k) for k in keys]


# --------------------------------------------------------------------------- key facts


def test_facts_of_plugin_keys():
    f = fdp.legacy_key_facts(legacy(0xABC, worker=3, world=4, salt="Team:x"))
    assert (f.chunk_hash, f.worker, f.local_rank, f.salt) == (0xABC, 3, 3, "Team:x")
    # the string form LMCache also hands the plugin
    assert fdp.legacy_key_facts(legacy(0xABC, worker=3, world=4).to_string()).chunk_hash == 0xABC


def test_facts_of_mp_keys_unpack_kv_rank():
    f = fdp.object_key_facts(obj(0x1234, rank=5, world=8, salt="a:b"))
    assert (f.chunk_hash, f.worker, f.local_rank, f.salt) == (0x1234, 5, 5, "a:b")
    # TP 4 x PP 2, worker 1 on the second node: global rank 5, local rank 1
    k = ObjectKey(b"\x01", "m", kv_rank(8, 5, 4, 1))
    assert (fdp.object_key_facts(k).worker, fdp.object_key_facts(k).local_rank) == (5, 1)


# --------------------------------------------------------------------------- per TP worker


def test_tp_worker_gives_each_worker_its_handle_plugin_keys():
    keys = [legacy(100 + w, worker=w, world=6) for w in range(6)]
    assert fdp.route(fdp.TP_WORKER, facts_l(keys), IDS) == [2, 3, 4, 2, 3, 4]


def test_tp_worker_mp_keys_use_the_global_rank():
    keys = [obj(7, rank=r, world=4) for r in range(4)] + [obj(8, rank=1, world=4)]
    assert fdp.route(fdp.TP_WORKER, facts_o(keys), IDS) == [2, 3, 4, 2, 3]


def test_tp_worker_same_worker_same_handle_whatever_the_chunk():
    keys = [legacy(h, worker=1, world=2) for h in (1, 99, 12345, 2 ** 63)]
    assert set(fdp.route(fdp.TP_WORKER, facts_l(keys), IDS)) == {3}


# --------------------------------------------------------------------------- per prompt


def test_prompt_chain_shares_the_handle_of_its_first_chunk():
    chain = [legacy(h) for h in (10, 11, 12, 13)]  # 10 % 3 == 1 -> IDS[1]
    assert fdp.route(fdp.PROMPT, facts_l(chain), IDS) == [3, 3, 3, 3]


def test_prompt_two_chains_in_one_batch_split_by_stream():
    # two tenants' prompts back to back: the salt changes, so does the chain
    batch = [legacy(9, salt="a:1"), legacy(40, salt="a:1"), legacy(41, salt="b:2"), legacy(7, salt="b:2")]
    assert fdp.chain_runs(facts_l(batch)) == [range(0, 2), range(2, 4)]
    assert fdp.route(fdp.PROMPT, facts_l(batch), IDS) == [IDS[9 % 3]] * 2 + [IDS[41 % 3]] * 2


def test_prompt_mp_keys_anchor_on_the_first_chunk_hash_bytes():
    anchor = 0xDEADBEEF
    keys = [obj(anchor), obj(5), obj(6)]
    assert fdp.route(fdp.PROMPT, facts_o(keys), IDS) == [IDS[anchor % 3]] * 3
    # another object group (hybrid models) is another stream
    keys = [obj(anchor), obj(5, group=1)]
    assert fdp.route(fdp.PROMPT, facts_o(keys), IDS) == [IDS[anchor % 3], IDS[5 % 3]]


def test_prompt_spreads_chains_over_all_handles():
    pids = {fdp.prompt_placement(h, IDS) for h in range(30)}
    assert pids == set(IDS)


# --------------------------------------------------------------------------- phase


def test_phase_by_store_shape_when_the_role_is_unknown():
    prefill = [legacy(h) for h in (1, 2, 3)]
    decode = [legacy(4)]
    assert fdp.route(fdp.PHASE, facts_l(prefill), IDS) == [2, 2, 2]
    assert fdp.route(fdp.PHASE, facts_l(decode), IDS) == [3]
    # a batch holding a prefill chain and another request's decode chunk
    mixed = [legacy(1, salt="x:"), legacy(2, salt="x:"), legacy(3, salt="y:")]
    assert fdp.route(fdp.PHASE, facts_l(mixed), IDS) == [2, 2, 3]


@pytest.mark.parametrize("role,expected", [(fdp.PREFILL, 2), (fdp.DECODE, 3)])
def test_phase_known_role_wins_over_the_shape(role, expected):
    for n in (1, 4):
        keys = [obj(h) for h in range(n)]
        assert fdp.route(fdp.PHASE, facts_o(keys), IDS, role=role) == [expected] * n


def test_phase_role_from_settings_and_lmcache_pd_config():
    class Cfg:
        def __init__(self, enable_pd, pd_role):
            self.enable_pd, self.pd_role = enable_pd, pd_role

    assert fdp.role_phase("decode") == fdp.DECODE
    assert fdp.role_phase("prefill", Cfg(True, "receiver")) == fdp.PREFILL  # the setting wins
    assert fdp.role_phase("auto", Cfg(True, "sender")) == fdp.PREFILL
    assert fdp.role_phase("auto", Cfg(True, "receiver")) == fdp.DECODE
    assert fdp.role_phase("auto", Cfg(True, "both")) is None
    assert fdp.role_phase("auto", Cfg(False, "sender")) is None  # pd_role means nothing without enable_pd
    assert fdp.role_phase("auto", None) is None


def test_phase_needs_two_identifiers():
    with pytest.raises(ValueError, match=r"two placement identifiers.*\[7\]"):
        fdp.phase_placement(fdp.PREFILL, (7,))


# --------------------------------------------------------------------------- cache salt


@pytest.mark.parametrize("salt,bucket", [("Tenant:abc", "tenant"), ("TENANT:x:y", "tenant"), ("plain", None),
                                         (":x", None), ("", None), ("a:", "a")])
def test_salt_bucket(salt, bucket):
    assert fdp.salt_bucket(salt) == bucket


def test_cache_salt_prefix_first_seen_order_and_overflow(caplog):
    caplog.set_level(logging.WARNING, logger="lmcache_rawblock.fdp")
    router = fdp.PlacementRouter(fdp.CACHE_SALT_PREFIX, (5, 6))
    salts = ["b:1", "A:2", "a:3", "nobucket", "c:4", "d:5", "B:6"]
    pids = router.placements(facts_l([legacy(i, salt=s) for i, s in enumerate(salts)]))
    assert pids == [5, 6, 6, None, None, None, 5]
    assert caplog.text.count("more cache_salt buckets") == 1
    assert router.salts.fallback_count == 2
    assert router.salts.assignments() == {"b": [5], "a": [6], "c": [], "d": []}


def test_cache_salt_rank_gives_each_rank_of_a_bucket_its_identifier():
    router = fdp.PlacementRouter(fdp.CACHE_SALT_RANK, (2, 3, 4, 5, 6), ranks=2)
    keys = [legacy(1, worker=0, world=2, salt="t:1"), legacy(1, worker=1, world=2, salt="t:1"),
            legacy(2, worker=1, world=2, salt="u:1"), legacy(3, worker=0, world=2, salt="v:1")]
    # bucket t -> 2, 3; u -> 4, 5; v -> 6 (rank 0), its rank 1 would overflow
    assert router.placements(facts_l(keys)) == [2, 3, 5, 6]
    assert router.placements(facts_l([legacy(3, worker=1, world=2, salt="v:1")])) is None


def test_router_none_and_batches_without_any_directive():
    assert fdp.PlacementRouter(fdp.NONE, IDS).placements(facts_l([legacy(1)])) is None
    assert fdp.PlacementRouter(fdp.CACHE_SALT_PREFIX, IDS).placements(facts_l([legacy(1)])) is None
    assert fdp.PlacementRouter(fdp.TP_WORKER, IDS).placements([]) is None


def test_route_refuses_lmcache_policies():
    with pytest.raises(ValueError, match="'cache_salt_prefix' is not one of tp_worker, prompt, phase"):
        fdp.route(fdp.CACHE_SALT_PREFIX, facts_l([legacy(1)]), IDS)
