"""FDP placement strategies on the emulated FDP SSD: the plugin's and LMCache's MP adapter's
writes land on the reclaim unit handles each policy names, as the device itself accounts them
(a handle's available media writes drop by the blocks written with its placement identifier,
and no other handle's do).

Checkpoints go to placement identifier 1 (``meta_checkpoint_placement_id``), which holds no KV
data: the core may write one in the middle of a measured store (before it reuses a slot that an
older checkpoint on the namespace still lists), so the drops compared are those of the other
handles. Every key here is a 4 KiB header plus an 8 KiB (plugin) or 4 KiB (MP adapter) payload,
so a handle's drop counts its keys.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ruamw
from lmcache_rawblock import _native, fdp
from lmcache_rawblock.plugin import RustRawBlockBackend
from lmcache_rawblock.raw_block._lmcache import CacheEngineKey
from plugin_fakes import FakeEngineConfig, FakeLocalCPUBackend, FakeMetadata, LoopThread, make_obj

MiB = 1 << 20
LBA = 4096
PLUGIN_KEY_BLOCKS = 3  # header + 8 KiB payload
MP_KEY_BLOCKS = 2  # header + 4 KiB payload
ROOT = Path(__file__).resolve().parents[2]


CHECKPOINT_PID = 1


def drops(before: dict[int, int], after: dict[int, int], ru_blocks: int) -> dict[int, int]:
    """Blocks each KV handle took (the checkpoint's handle left out), modulo the reclaim unit: a
    handle that filled its unit moved on to a fresh one."""
    return {p: (before[p] - after[p]) % ru_blocks for p in before
            if before[p] != after[p] and p != CHECKPOINT_PID}


@pytest.fixture
def plugin(nvme_char, nvme_geometry):
    """Plugins on the namespace with FDP on, one at a time; measure(be, keys) stores keys in one
    call and returns the blocks each handle took."""
    loop = LoopThread()
    made = []
    ru_blocks = nvme_geometry["ru_size"] // nvme_geometry["lba"]

    def make(**over):
        while made:
            made.pop().close()
        extra = {
            "rust_raw_block.device_path": nvme_char, "rust_raw_block.io_engine": "io_uring",
            "rust_raw_block.use_uring_cmd": True, "rust_raw_block.meta_total_bytes": 4 * MiB,
            "rust_raw_block.capacity_bytes": 128 * MiB, "rust_raw_block.meta_enable_periodic": False,
            "rust_raw_block.load_checkpoint_on_init": False, "rust_raw_block.allow_foreign_device": True,
            "rust_raw_block.meta_checkpoint_placement_id": CHECKPOINT_PID, "rust_raw_block.fdp_enabled": True,
        }
        extra.update({f"rust_raw_block.{k}": v for k, v in over.items()})
        be = RustRawBlockBackend(config=FakeEngineConfig(extra), metadata=FakeMetadata(),
                                 local_cpu_backend=FakeLocalCPUBackend(chunk_bytes=8192), loop=loop.loop)
        made.append(be)
        return be

    def measure(be, keys):
        before = ruamw(nvme_char)
        futs = be.batched_submit_put_task(keys, [make_obj(i) for i in range(len(keys))]) or []
        for f in futs:
            f.result(60)
        return drops(before, ruamw(nvme_char), ru_blocks)

    yield make, measure
    for be in made:
        be.close()
    loop.stop()


def key(h: int, worker: int = 0, world: int = 1, salt: str | None = None) -> CacheEngineKey:
    configs = {} if salt is None else {fdp.LEGACY_SALT_CONFIG: salt}
    return CacheEngineKey("fdp_strategies", world, worker, h, "bfloat16", configs)


def test_device_reports_the_handles_used_here(nvme_char):
    pids = {r["pid"] for r in _native.nvme_fdp_report(nvme_char)["ruhs"]}
    assert set(range(1, 16)) <= pids


def test_plugin_tp_worker(plugin):
    make, measure = plugin
    be = make(fdp_data_placement_policy="tp_worker", fdp_placement_ids=[2, 3, 4])
    keys = [key(0x1000 + 16 * w + i, worker=w, world=4) for w in range(4) for i in range(2)]
    # workers 0 and 3 share identifier 2 (four workers, three handles)
    assert measure(be, keys) == {2: 4 * PLUGIN_KEY_BLOCKS, 3: 2 * PLUGIN_KEY_BLOCKS, 4: 2 * PLUGIN_KEY_BLOCKS}
    assert be.report_status()["fdp_placement_ids"] == [2, 3, 4]


def test_plugin_prompt(plugin):
    make, measure = plugin
    be = make(fdp_data_placement_policy="prompt", fdp_placement_ids=[5, 6, 7, 8])
    chain_a = [key(h, salt="a:1") for h in (0x2100, 0x2101, 0x2102)]  # anchor % 4 == 0 -> 5
    chain_b = [key(h, salt="b:1") for h in (0x2203, 0x2204)]  # anchor % 4 == 3 -> 8
    assert measure(be, chain_a + chain_b) == {5: 3 * PLUGIN_KEY_BLOCKS, 8: 2 * PLUGIN_KEY_BLOCKS}
    # the same prompt grown by one chunk: its stored prefix is skipped, the new chunk follows it
    assert measure(be, chain_a + [key(0x2105, salt="a:1")]) == {5: PLUGIN_KEY_BLOCKS}


def test_plugin_phase(plugin):
    make, measure = plugin
    be = make(fdp_data_placement_policy="phase", fdp_placement_ids=[9, 10])
    assert measure(be, [key(0x3000 + i) for i in range(3)]) == {9: 3 * PLUGIN_KEY_BLOCKS}  # a prefill
    assert measure(be, [key(0x3010)]) == {10: PLUGIN_KEY_BLOCKS}  # a decode step's chunk
    be = make(fdp_data_placement_policy="phase", fdp_placement_ids=[9, 10], fdp_phase="decode")
    assert measure(be, [key(0x3020 + i) for i in range(3)]) == {10: 3 * PLUGIN_KEY_BLOCKS}


def test_plugin_cache_salt_prefix(plugin):
    make, measure = plugin
    be = make(fdp_data_placement_policy="cache_salt_prefix", fdp_placement_ids=[11, 12])
    moved = measure(be, [key(0x4001, salt="x:1"), key(0x4002, salt="y:1"), key(0x4003, salt="X:2")])
    assert moved == {11: 2 * PLUGIN_KEY_BLOCKS, 12: PLUGIN_KEY_BLOCKS}
    # no bucket: no directive, the namespace's default handle (placement identifier 0)
    moved = measure(be, [key(0x4004, salt="plain")])
    assert set(moved) <= {0} and 11 not in moved and 12 not in moved


def test_plugin_refuses_an_identifier_the_namespace_lacks(plugin):
    make, _ = plugin
    with pytest.raises(ValueError, match=r"fdp_placement_ids'\]=\[2, 999\]: \[999\] not reported by /dev/ng"):
        make(fdp_placement_ids=[2, 999])


def _lmcache_python() -> str | None:
    """An interpreter with LMCache: this one, else RB_LMCACHE_PYTHON (`make test-nvme` names the
    newest LMCache virtualenv of the matrix there) when it exists (importing LMCache takes minutes
    in the emulated guest, so it is not tried twice)."""
    if importlib.util.find_spec("lmcache") is not None:
        return sys.executable
    venv = os.environ.get("RB_LMCACHE_PYTHON", "")
    return venv if venv and os.path.exists(venv) else None


def test_mp_adapter_with_fdp_starts_on_our_core_and_places_writes(nvme_char, nvme_geometry, tmp_path):
    py = _lmcache_python()
    if py is None:
        pytest.skip("LMCache is not installed here and RB_LMCACHE_PYTHON names no interpreter "
                    f"({os.environ.get('RB_LMCACHE_PYTHON')!r}; make lmcache-venv, then make test-nvme)")
    # The guest's root is read-only: LMCache's numba kernels cache their compilation elsewhere.
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    r = subprocess.run([py, str(Path(__file__).with_name("fdp_mp_probe.py")), nvme_char,
                        str(nvme_geometry["ru_size"] // nvme_geometry["lba"])],
                       capture_output=True, text=True, timeout=1200, env=env, cwd=ROOT)
    if r.returncode == 77:
        pytest.skip(f"{py} cannot import LMCache: {r.stderr.strip()[-500:]}")
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for name, res in out.items():
        assert res["core"] == "lmcache_rawblock.raw_block.core", name
        assert res["policy"] == name, name
    k = MP_KEY_BLOCKS
    moved = {name: res["moved"] for name, res in out.items()}
    assert moved == {
        "cache_salt_prefix": {"13": 2 * k, "14": k},  # alice, bob, alice
        "tp_worker": {"13": 2 * k, "14": 3 * k},  # ranks 0, 1, 0, 1, 1
        "prompt": {"14": 3 * k},  # one chain, anchor 0x31 % 3 == 1
        "phase": {"13": 2 * k},  # two chunks together: a prefill
    }
