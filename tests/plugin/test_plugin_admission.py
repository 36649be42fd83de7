"""rust_raw_block.admission in the plugin: the settings table's entry, second_hit writing a
chunk only when it is stored again, and errors naming the key and the value."""

from __future__ import annotations

import pytest

from lmcache_rawblock.plugin import RustRawBlockBackend
from lmcache_rawblock.settings import SETTINGS
from plugin_fakes import FakeEngineConfig, FakeLocalCPUBackend, FakeMetadata, LoopThread, base_extra, make_key, make_obj

MiB = 1 << 20


@pytest.fixture
def backend(tmp_path):
    lt = LoopThread()
    made = []

    def make(**overrides):
        path = tmp_path / "dev.img"
        with open(path, "wb") as f:
            f.truncate(64 * MiB)
        be = RustRawBlockBackend(config=FakeEngineConfig(base_extra(str(path), **overrides)), metadata=FakeMetadata(),
                                 local_cpu_backend=FakeLocalCPUBackend(), loop=lt.loop)
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()
    lt.stop()


def _put(be, keys):
    objs = [make_obj(k) for k in keys]
    for f in be.batched_submit_put_task([make_key(k) for k in keys], objs) or []:
        f.result(30)
    assert all(o.get_ref_count() == 1 for o in objs), "references given back, admitted or not"


def test_admission_is_a_plugin_policy_setting():
    s = SETTINGS["admission"]
    assert s.plugin and s.policy and not s.config and not s.lmcache_mp
    assert s.choices == ("always", "second_hit") and s.default == "always"


def test_default_always_writes_every_chunk(backend):
    be = backend()
    _put(be, [1, 2])
    assert be.indexed_key_count() == 2
    assert be.report_status()["admission"] == "always"


def test_second_hit_writes_on_the_second_store(backend):
    be = backend(admission="second_hit")
    _put(be, [1, 2])
    assert be.indexed_key_count() == 0 and be.get_blocking(make_key(1)) is None
    _put(be, [1, 3])
    assert be.indexed_key_count() == 1 and be.get_blocking(make_key(1)) is not None
    st = be.report_status()
    assert (st["admission"], st["admission_offered"], st["admission_rejected"]) == ("second_hit", 4, 3)
    assert st["admission_sketch_bytes"] == 256 * 1024


def test_bad_admission_names_the_key_and_the_value(backend):
    with pytest.raises(ValueError, match=r"rust_raw_block\.admission.*always, second_hit.*'third_hit'"):
        backend(admission="third_hit")
