"""_native.Core's methods carry text signatures (what inspect.signature and stubtest read), and
each method takes, as keywords, exactly the names its signature documents."""

from __future__ import annotations

import inspect

import pytest

from core_helpers import Obj, make_config, make_device, okey
from lmcache_rawblock import _native
from lmcache_rawblock.raw_block.core import _meta_names


def _methods() -> list[str]:
    return sorted(n for n, v in vars(_native.Core).items() if callable(v) and not n.startswith("__"))


def test_every_core_method_has_a_text_signature():
    missing = []
    for name in _methods():
        try:
            inspect.signature(getattr(_native.Core, name))
        except ValueError:
            missing.append(name)
    assert not missing, f"no text signature: {missing}"


def _call(obj, name: str, **kw):
    """obj.name(**kw), after checking the keywords are the signature's names: every one it
    requires, none it lacks."""
    params = inspect.signature(getattr(obj, name)).parameters
    keywords = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    required = {n for n in keywords if params[n].default is inspect.Parameter.empty}
    assert required <= set(kw) <= keywords, (name, sorted(kw), sorted(keywords))
    return getattr(obj, name)(**kw)


def test_core_methods_take_their_documented_keywords(tmp_path):
    core = _native.Core(**make_config(make_device(tmp_path)).native_kwargs(key_namespace="object"))
    try:
        k = okey(1)
        data = bytes(range(256)) * 4
        res, stored, failure = _call(core, "put_many", keys=[k.encoded], identities=[k.slot_identity],
                                     payloads=[Obj(data)], placement_ids=[None], metas=_meta_names)
        assert (res, stored, failure) == ([True], [0], None)
        out = Obj(len(data))
        res, positions, errors = _call(core, "load_many_into", keys=[k.encoded], payloads=[out], set_positions=None)
        assert res == [True] and out.bytes() == data and errors == [None]
        assert _call(core, "exists_many", keys=[k.encoded], lock=True) == [True]
        assert core.lock_refcount(k.encoded) == 1
        assert len(_call(core, "get_metadata_prefix", keys=[k.encoded], lock=False, skip=None)) == 1
        core.unlock_many([k.encoded])
        assert _call(core, "snapshot_keys", limit=1) == [k.encoded]
        assert _call(core, "checkpoint_now", force=True) is True
        assert _call(core, "delete_many", keys=[k.encoded], force=False) == [True]
        assert _call(_native.Core, "_key_identity", key=k.encoded, namespace="object") == k.slot_identity
    finally:
        core.close()


def test_the_old_buffers_keyword_is_gone(tmp_path):
    core = _native.Core(**make_config(make_device(tmp_path)).native_kwargs(key_namespace="object"))
    try:
        k = okey(1)
        with pytest.raises(TypeError, match="buffers"):
            core.put_many(keys=[k.encoded], identities=[k.slot_identity], buffers=[b"x"], placement_ids=[None],
                          metas=_meta_names)
        with pytest.raises(TypeError, match="buffers"):
            core.load_many_into(keys=[k.encoded], buffers=[bytearray(1)])
    finally:
        core.close()
