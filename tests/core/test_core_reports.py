"""What the core tells its user when something ends or fails: a close() interrupted after the
core closed is reported as it ended by the next close(); a missing device names its errno; a
full metadata log names why compaction could not empty it."""

from __future__ import annotations

import errno
import hashlib

import pytest

from lmcache_rawblock.raw_block import encode_object_key
from lmcache_rawblock.raw_block._lmcache import ObjectKey
from lmcache_rawblock.raw_block.core import NativeQuiescence

from core_helpers import Obj, make_core, make_device, okey


class _InterruptedClose:
    """The core's native object, whose close() completes and then raises KeyboardInterrupt, as
    a Ctrl-C that arrived while the native close ran is raised once it returns."""

    def __init__(self, native):
        self._n = native

    def close(self):
        self._n.close()
        raise KeyboardInterrupt

    def __getattr__(self, name):
        return getattr(self._n, name)


def test_a_close_after_an_interrupted_close_reports_how_the_core_closed(tmp_path):
    c = make_core(make_device(tmp_path))
    c.put_many([okey(1)], [Obj(10)])
    native = c._native
    c._native = _InterruptedClose(native)
    with pytest.raises(KeyboardInterrupt):
        c.close()
    c._native = native
    out = c.close()
    assert out.quiescence is NativeQuiescence.PROVEN, out
    assert out.final_checkpoint_written and not out.poisoned
    assert c.close() == out  # and every close after it: the same, nothing attempted again


def test_a_missing_device_names_the_errno_and_the_path(tmp_path):
    missing = str(tmp_path / "no-such-device.img")
    with pytest.raises(FileNotFoundError) as ei:
        make_core(missing)
    assert ei.value.errno == errno.ENOENT and ei.value.filename == missing
    text = str(ei.value)
    assert "ENOENT" in text and "No such file or directory" in text and missing in text, text


def _hkey(i):
    return encode_object_key(ObjectKey(chunk_hash=hashlib.sha256(i.to_bytes(8, "big")).digest(),
                                       model_name="meta-llama/Llama-3.1-8B-Instruct", kv_rank=i % 8))


def test_a_full_log_that_compaction_cannot_empty_says_why(tmp_path):
    # 1 MiB region: a 128 KiB ring and base areas of 380 KiB. 12,000 keys with random 32-byte
    # hashes take about 490 KB as a base (41 B each) and about 560 KB as log groups: the ring
    # fills, and the compaction that would empty it finds the base too large for its area.
    dev = make_device(tmp_path)
    c = make_core(dev, meta_format="log", slot_bytes=8192)
    try:
        c.put_many([okey(0)], [Obj(10)])
        c.checkpoint_now()
        obj = Obj(10)
        for b in range(0, 12000, 1000):
            assert all(c.put_many([_hkey(i) for i in range(b, b + 1000)], [obj] * 1000).results)
        with pytest.raises(RuntimeError) as ei:
            c.checkpoint_now()
        text = str(ei.value)
        assert "metadata log is full" in text and "meta_total_bytes" in text, text
        st = c._native.status()
        assert "meta_total_bytes" in st["checkpoint_last_error"], st["checkpoint_last_error"]
        assert st["metadata_log"]["base_too_large"] >= 1
    finally:
        c._native.close()
