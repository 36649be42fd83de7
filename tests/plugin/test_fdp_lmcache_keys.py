"""FDP routing of the plugin's keys as LMCache builds them: CacheEngineKey with torch dtypes and
request configs, LayerCacheEngineKey for layerwise stores, and their string forms.

Marked ``lmcache``: run with ``make test-lmcache``.
"""

from __future__ import annotations

from helpers import lmcache_imports

with lmcache_imports() as lmc:
    import torch
    from lmcache.utils import CacheEngineKey, LayerCacheEngineKey

pytestmark = lmc.marks

from lmcache_rawblock import fdp  # noqa: E402

IDS = (2, 3, 4, 5)


def test_facts_of_lmcache_keys_and_their_strings():
    k = CacheEngineKey("org/m", 4, 2, 0xABCDEF, torch.bfloat16, {fdp.LEGACY_SALT_CONFIG: "Tenant:1", "x": 1})
    f = fdp.legacy_key_facts(k)
    assert (f.chunk_hash, f.worker, f.salt) == (0xABCDEF, 2, "Tenant:1")
    # the salt is a tag, so it survives the string form LMCache also passes
    g = fdp.legacy_key_facts(k.to_string())
    assert (g.chunk_hash, g.worker, g.salt) == (0xABCDEF, 2, "Tenant:1")
    assert fdp.salt_bucket(g.salt) == "tenant"


def test_layerwise_keys_of_one_chunk_route_together():
    layers = [LayerCacheEngineKey("org/m", 2, 1, 0x77, torch.float16, {}, layer_id=i) for i in range(4)]
    facts = [fdp.legacy_key_facts(k) for k in layers]
    for policy in (fdp.TP_WORKER, fdp.PROMPT):
        assert len(set(fdp.route(policy, facts, IDS))) == 1, policy
    assert fdp.route(fdp.TP_WORKER, facts, IDS)[0] == 3


def test_a_store_call_of_one_request_is_one_chain():
    chain = [CacheEngineKey("org/m", 1, 0, h, torch.bfloat16) for h in (0x1001, 0x9F3, 0x55)]
    assert fdp.route(fdp.PROMPT, [fdp.legacy_key_facts(k) for k in chain], IDS) == [IDS[0x1001 % 4]] * 3
    assert fdp.route(fdp.PHASE, [fdp.legacy_key_facts(k) for k in chain], IDS) == [2, 2, 2]
