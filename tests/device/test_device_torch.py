"""RawBlockDevice with torch CPU tensors, the way LMCache hands them over: through numpy, and
as ``TensorMemoryObj.byte_array`` (a ctypes array over ``tensor.data_ptr()``, which also covers
dtypes numpy lacks, such as bfloat16), with io_uring fixed buffers registered from a tensor
arena's pointer and size.

Marked ``torch``: deselected by default (the default environment has no torch);
``make test-torch`` runs them in the LMCache virtualenv, where torch is required: the import
below fails these tests rather than skipping them.
"""

from __future__ import annotations

import ctypes

import pytest

from lmcache_rawblock import RawBlockDevice

pytestmark = pytest.mark.torch

MiB = 1 << 20


@pytest.fixture(scope="module")
def torch():
    import torch  # noqa: PLC0415 - only the selected tests need it, and they must have it

    return torch


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "dev.img"
    with open(p, "wb") as f:
        f.truncate(16 * MiB)
    return str(p)


def byte_array(t, nbytes=None) -> memoryview:
    """LMCache's TensorMemoryObj.byte_array: a writable byte view over the tensor's memory."""
    n = t.numel() * t.element_size() if nbytes is None else nbytes
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr()))


def open_dev(path, engine, **kw):
    try:
        return RawBlockDevice(path, True, io_engine=engine, **kw)
    except RuntimeError as e:
        if "io_uring init failed" in str(e):
            pytest.skip(f"io_uring unavailable: {e}")
        raise


def test_tensor_through_numpy_round_trip(torch, path):
    t = torch.arange(4096, dtype=torch.float32)
    with RawBlockDevice(path, True) as dev:
        dev.pwrite_from_buffer(0, t.numpy(), t.numel() * 4)
        out = torch.zeros_like(t)
        dev.pread_into(0, out.numpy(), t.numel() * 4)
    assert torch.equal(out, t)


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "uint8"])
def test_byte_array_views_round_trip(torch, path, engine, dtype):
    """Tensors of each dtype written and read back through byte_array views: posix with
    pwrite_from_buffer / pread_into, io_uring with one batch of several tensors each way."""
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(5)
    srcs = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dt) for n in (4096, 12288, 1000)]
    outs = [torch.zeros_like(s) for s in srcs]
    offsets = [0, 1 * MiB, 2 * MiB]
    with open_dev(path, engine) as dev:
        if engine == "posix":
            for off, s, o in zip(offsets, srcs, outs):
                dev.pwrite_from_buffer(off, byte_array(s))
                dev.pread_into(off, byte_array(o), len(byte_array(o)))
        else:
            lens = [len(byte_array(s)) for s in srcs]
            assert dev.wait_iouring(dev.batched_write(offsets, [byte_array(s) for s in srcs], lens)) == ([True] * 3, [])
            assert dev.wait_iouring(dev.batched_read(offsets, [byte_array(o) for o in outs], lens)) == ([True] * 3, [])
    for s, o in zip(srcs, outs):
        assert o.dtype == dt and torch.equal(o.view(torch.uint8), s.view(torch.uint8))


def test_fixed_buffers_registered_from_a_tensor_arena(torch, path):
    """LMCache registers its pinned arena by pointer and size, then passes byte_array views of
    objects inside it: those requests use the registered buffer, others do not."""
    arena = torch.zeros(4 * MiB, dtype=torch.uint8)
    with open_dev(path, "io_uring", iouring_queue_depth=8) as dev:
        dev.register_fixed_buffers([arena.data_ptr()], [arena.numel()])
        assert dev.fixed_buffer_status() == (True, arena.numel())
        obj = arena[MiB : MiB + 8192]
        obj.copy_(torch.arange(8192, dtype=torch.int32).to(torch.uint8))
        outside = torch.zeros(8192, dtype=torch.uint8)
        before = dev.io_stats_snapshot()["fixed_buffer_attempts"]
        assert dev.wait_iouring(dev.batched_write([0], [byte_array(obj)], [8192])) == ([True], [])
        assert dev.wait_iouring(dev.batched_read([0], [byte_array(outside)], [8192])) == ([True], [])
        assert dev.io_stats_snapshot()["fixed_buffer_attempts"] - before == 1  # the write only
        assert torch.equal(outside, obj)
        back = arena[2 * MiB : 2 * MiB + 8192]
        assert dev.wait_iouring(dev.batched_read([0], [byte_array(back)], [8192])) == ([True], [])
        assert dev.io_stats_snapshot()["fixed_buffer_attempts"] - before == 2
        assert torch.equal(back, obj)


def test_a_tensor_itself_is_not_a_buffer(torch, path):
    """A tensor does not export the buffer protocol: every call raises the TypeError that
    LMCache's Rust device raises, before any I/O."""
    t = torch.zeros(1024, dtype=torch.uint8)
    msg = "^a bytes-like object is required, not 'Tensor'$"
    with open_dev(path, "io_uring") as dev:
        with pytest.raises(TypeError, match=msg):
            dev.pwrite_from_buffer(0, t, 1024)
        with pytest.raises(TypeError, match=msg):
            dev.pread_into(0, t, 1024)
        with pytest.raises(TypeError, match=msg):
            dev.batched_write([0], [t], [1024])
        with pytest.raises(TypeError, match=msg):
            dev.batched_read([0], [t], [1024])
        st = dev.io_stats_snapshot()
        assert (st["read_attempts"], st["write_attempts"], st["outstanding_requests"]) == (0, 0, 0)


def test_non_contiguous_tensor_view_is_rejected(torch, path):
    """A strided tensor's numpy view is refused by its exporter (numpy's ValueError for a
    contiguous request), a Fortran-ordered (transposed) one is accepted as contiguous memory."""
    t = torch.arange(64 * 64, dtype=torch.uint8).reshape(64, 64)
    with RawBlockDevice(path, True) as dev:
        with pytest.raises(ValueError, match="not contiguous"):
            dev.pwrite_from_buffer(0, t[:, ::2].numpy())
        dev.pwrite_from_buffer(0, t.t().numpy())  # column-major: one contiguous block
        out = torch.zeros(64 * 64, dtype=torch.uint8)
        dev.pread_into(0, out.numpy(), 64 * 64)
    assert torch.equal(out, t.flatten())  # the same bytes in memory order

