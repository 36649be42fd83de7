"""The compat shim: code written against lmcache_rust_raw_block_io runs on our device."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

from lmcache_rawblock import RawBlockDevice, compat


def test_install_and_uninstall():
    saved = {k: sys.modules.get(k) for k in ("lmcache_rust_raw_block_io", "lmcache_rust_raw_block_io.lmcache_rust_raw_block_io")}
    try:
        mod = compat.install()
        assert compat.is_installed()
        import lmcache_rust_raw_block_io  # noqa: F401

        assert lmcache_rust_raw_block_io.RawBlockDevice is RawBlockDevice
        from lmcache_rust_raw_block_io import RawBlockDevice as R

        assert R is RawBlockDevice
        inner = importlib.import_module("lmcache_rust_raw_block_io.lmcache_rust_raw_block_io")
        assert inner.RawBlockDevice is RawBlockDevice
        assert compat.install() is mod, "install() is idempotent"
        compat.uninstall()
        assert not compat.is_installed()
    finally:
        compat.uninstall()
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_unchanged_client_code_runs_on_our_device(tmp_path):
    """A program written for LMCache's Rust module, run in a fresh interpreter."""
    img = tmp_path / "dev.img"
    img.write_bytes(b"")
    with open(img, "r+b") as f:
        f.truncate(1 << 20)
    client = textwrap.dedent(
        f"""
        import lmcache_rawblock.compat
        lmcache_rawblock.compat.install()

        # --- code as written against lmcache_rust_raw_block_io, unchanged ---
        import lmcache_rust_raw_block_io as rbio
        dev = rbio.RawBlockDevice({str(img)!r}, writable=True, use_odirect=False, alignment=4096,
                                  io_engine="posix", iouring_queue_depth=64, use_uring_cmd=False)
        assert dev.size_bytes() == 1 << 20
        dev.pwrite_from_buffer(4096, b"kv-cache-chunk", 14, 4096)
        out = bytearray(14)
        dev.pread_into(4096, out, 14, 4096)
        assert bytes(out) == b"kv-cache-chunk"
        try:
            dev.pread_into(1 << 20, bytearray(1), 1)
        except RuntimeError as e:
            assert "unexpected EOF" in str(e)
        else:
            raise AssertionError("EOF must raise")
        dev.close()
        print("OK", type(dev).__module__)
        """
    )
    r = subprocess.run([sys.executable, "-c", client], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["OK", "lmcache_rawblock._native"]
