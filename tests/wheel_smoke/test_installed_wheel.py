"""Smoke suite for the installed wheel (``make test-wheel``).

Runs in a fresh virtualenv that holds only the repaired wheel and pytest, from a temporary
directory, so ``lmcache_rawblock`` can only come from the wheel. Checks that the package and
its bundled libraries are the installed ones, then exercises each layer once: the device on
both engines, the core across a restart, the compatibility shim and the command line. The wheel
is the runtime: at least 90% of its Python lines are runtime code, none is the benchmark
package's, and without that package ``bench`` / ``waf`` exit 2 saying how to install it
(``bench/`` holds the tests run once the benchmark wheel is added: ``make test-wheel``).

Not collected by the default run (``--ignore=tests/wheel_smoke`` in pyproject's addopts): in
the checkout the first two tests would fail by design.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import lmcache_rawblock
from lmcache_rawblock import RawBlockDevice
from lmcache_rawblock.raw_block import RawBlockCore, RawBlockCoreConfig, encode_object_key
from lmcache_rawblock.raw_block._lmcache import ObjectKey

MiB = 1 << 20
SITE = Path(sysconfig.get_path("purelib")).resolve()
# Shared libraries the extension needs besides glibc; auditwheel puts them next to the package.
BUNDLED = ("libnvme", "libjson-c", "libblkid", "libxxhash", "libdeflate")


def _inside(path: str | os.PathLike, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root)


def test_package_is_the_installed_wheel():
    assert sys.prefix != sys.base_prefix, "the smoke suite must run in a virtualenv"
    assert _inside(lmcache_rawblock.__file__, SITE), lmcache_rawblock.__file__
    assert _inside(lmcache_rawblock._native.__file__, SITE), lmcache_rawblock._native.__file__
    source = os.environ.get("RB_SOURCE_TREE")
    if source:
        on_path = [p for p in sys.path if p and _inside(p, Path(source).resolve())]
        assert not on_path, f"the source tree is on sys.path: {on_path}"
        assert not _inside(os.getcwd(), Path(source).resolve()), "run from outside the source tree"
    dist = metadata.distribution("lmcache-rawblock")
    assert dist.version == lmcache_rawblock.__version__
    assert dist.metadata["License-Expression"] == "Apache-2.0"
    assert dist.metadata["Requires-Python"] == ">=3.11"
    wheel_info = dist.read_text("WHEEL") or ""
    assert "-manylinux_" in wheel_info, wheel_info


def test_native_libraries_come_from_the_wheel():
    """The loaded libnvme, json-c, libblkid and xxhash are the wheel's copies; liburing is
    linked in statically, so no liburing is mapped at all."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    mapped = sorted({line.split()[-1] for line in maps if line.split()[-1].startswith("/")})
    libs_dir = SITE / "lmcache_rawblock.libs"
    assert libs_dir.is_dir(), f"no bundled libraries in {libs_dir}"
    for lib in BUNDLED:
        hits = [p for p in mapped if Path(p).name.startswith(lib + "-") or Path(p).name.startswith(lib + ".so")]
        assert hits, f"{lib} is not loaded: {mapped}"
        for p in hits:
            assert _inside(p, libs_dir), f"{lib} loaded from outside the wheel: {p}"
    assert not [p for p in mapped if "liburing" in Path(p).name], "liburing must be linked statically"


@pytest.fixture
def image(tmp_path):
    def make(size: int = 16 * MiB, name: str = "dev.img") -> str:
        p = tmp_path / name
        with open(p, "wb") as f:
            f.truncate(size)
        return str(p)

    return make


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_device_round_trip(image, engine):
    path = image()
    data = bytes(range(256)) * 64  # 16 KiB
    with RawBlockDevice(path, True, use_odirect=False, alignment=4096, io_engine=engine) as dev:
        assert dev.size_bytes() == 16 * MiB
        dev.pwrite_from_buffer(8192, data, len(data), len(data) + 4096)
        out = bytearray(len(data))
        dev.pread_into(8192, out, len(data))
        assert bytes(out) == data
        if engine == "io_uring":
            batch = [bytes([i]) * 4096 for i in range(1, 9)]
            offsets = [MiB + i * 4096 for i in range(len(batch))]
            assert dev.wait_iouring(dev.batched_write(offsets, batch, [4096] * len(batch))) == ([True] * 8, [])
            outs = [bytearray(4096) for _ in batch]
            assert dev.wait_iouring(dev.batched_read(offsets, outs, [4096] * len(batch))) == ([True] * 8, [])
            assert [bytes(o) for o in outs] == batch


class _Meta:
    def __init__(self, n: int):
        self.shape = (n,)
        self.dtype = "uint8"
        self.fmt = "BINARY"
        self.cached_positions = None


class _Obj:
    """The part of LMCache's MemoryObj the core uses: byte_array and metadata."""

    def __init__(self, data: bytes | int):
        self.buf = bytearray(data)
        self.byte_array = memoryview(self.buf)
        self.metadata = _Meta(len(self.buf))


def _config(path: str, engine: str) -> RawBlockCoreConfig:
    return RawBlockCoreConfig(
        device_path=path, capacity_bytes=0, block_align=4096, header_bytes=4096, slot_bytes=64 * 1024,
        use_odirect=False, enable_zero_copy=False, meta_total_bytes=MiB, meta_magic=b"LMCIDX01",
        meta_version=1, meta_checkpoint_interval_sec=60, meta_idle_quiet_ms=0, meta_enable_periodic=False,
        meta_verify_on_load=True, io_engine=engine, iouring_queue_depth=8,
    )


def _key(i: int):
    return encode_object_key(ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="wheel_smoke", kv_rank=0))


def _payload(i: int, n: int = 3000) -> bytes:
    return bytes((i * 31 + j) % 251 for j in range(n))


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_core_put_load_recover(image, engine):
    path = image(64 * MiB)
    keys = [_key(i) for i in range(6)]
    core = RawBlockCore(_config(path, engine), key_namespace="object")
    core.put_many(keys, [_Obj(_payload(i)) for i in range(6)])
    core.delete_many([keys[2].encoded])
    got = _Obj(3000)
    assert core.load_many_into([keys[4].encoded], [got]) == [True]
    assert bytes(got.buf) == _payload(4)
    outcome = core.close()
    assert outcome.final_checkpoint_written

    again = RawBlockCore(_config(path, engine), key_namespace="object")
    try:
        assert again.exists_many([k.encoded for k in keys]) == [True, True, False, True, True, True]
        outs = [_Obj(3000) for _ in range(5)]
        live = [k.encoded for i, k in enumerate(keys) if i != 2]
        assert again.load_many_into(live, outs) == [True] * 5
        assert [bytes(o.buf) for o in outs] == [_payload(i) for i in range(6) if i != 2]
    finally:
        again.close()


def _run(args: list[str], cwd, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, LMCACHE_RAWBLOCK_COMPETITORS=str(Path(cwd) / "no-competitors"))
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_compat_shim_serves_rust_module_name(tmp_path, image):
    path = image(MiB)
    client = textwrap.dedent(
        f"""
        import lmcache_rawblock.compat
        lmcache_rawblock.compat.install()
        import lmcache_rust_raw_block_io as rbio
        dev = rbio.RawBlockDevice({path!r}, writable=True, use_odirect=False, alignment=4096,
                                  io_engine="posix", iouring_queue_depth=64, use_uring_cmd=False)
        dev.pwrite_from_buffer(4096, b"kv-cache-chunk", 14, 4096)
        out = bytearray(14)
        dev.pread_into(4096, out, 14, 4096)
        assert bytes(out) == b"kv-cache-chunk"
        dev.close()
        print(type(dev).__module__, rbio.__name__)
        """
    )
    r = _run([sys.executable, "-c", client], tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["lmcache_rawblock._native", "lmcache_rust_raw_block_io"]


def test_inspect_command(tmp_path, image):
    path = image(64 * MiB)
    core = RawBlockCore(_config(path, "posix"), key_namespace="object")
    core.put_many([_key(i) for i in range(3)], [_Obj(_payload(i)) for i in range(3)])
    core.close()
    r = _run([sys.executable, "-m", "lmcache_rawblock", "inspect", path, "--json"], tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["size_bytes"] == 64 * MiB
    assert info["checkpoint_in_use"] is not None
    assert len(info["sample_entries"]) == 3
    script = Path(sysconfig.get_path("scripts")) / "lmcache-rawblock"
    r = _run([str(script), "inspect", path], tmp_path, timeout=60)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


def test_wheel_is_the_runtime():
    """At least 90% of the wheel's Python lines (.py and .pyi) are runtime code: the
    lmcache_rawblock package outside any tooling folder; none is the benchmark package's."""
    files = [f for f in metadata.distribution("lmcache-rawblock").files or [] if f.suffix in (".py", ".pyi")]
    assert files, "the wheel lists no Python file"
    tooling = {"bench", "waf", "benchmarks", "lmcache_rawblock_bench", "tests", "tools"}
    runtime = total = 0
    for f in files:
        n = len(f.read_text(encoding="utf-8").splitlines())
        total += n
        if f.parts[0] == "lmcache_rawblock" and not tooling & set(f.parts[1:]):
            runtime += n
    assert not [str(f) for f in files if f.parts[0] == "lmcache_rawblock_bench"]
    print(f"runtime code: {runtime} of {total} Python lines ({runtime / total:.1%})")
    assert runtime / total >= 0.90, f"runtime code is {runtime} of the wheel's {total} Python lines"


@pytest.mark.parametrize("command", ["bench", "waf"])
def test_tooling_commands_say_how_to_install_the_benchmark_package(tmp_path, command):
    assert importlib.util.find_spec("lmcache_rawblock_bench") is None
    r = _run([sys.executable, "-m", "lmcache_rawblock", command, "--help"], tmp_path, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "lmcache-rawblock-bench" in lines[0] and "pip install ./benchmarks" in lines[0], lines
