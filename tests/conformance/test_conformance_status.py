"""report_status() reports a failed io_uring worker as LMCache's core does: ``worker_error``
holds the reason, ``is_healthy`` is False and ``raise_if_failed()`` raises it; and the
``fixed_buffer*`` keys describe the kernel registration."""

from __future__ import annotations

import threading

import pytest

from core_helpers import Obj, make_core, make_device, okey, payload


def _run(fn, timeout=20):
    out = {}

    def body():
        try:
            out["r"] = fn()
        except BaseException as e:  # noqa: BLE001
            out["e"] = e

    th = threading.Thread(target=body, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), "the call hung"
    return out


@pytest.mark.parametrize("kinds", [1, 1 | 2], ids=["submit", "submit+reap"])
def test_worker_failure_is_reported(tmp_path, kinds):
    core = make_core(make_device(tmp_path), io_engine="io_uring")
    try:
        st = core.report_status()
        assert (st["is_healthy"], st["worker_error"]) == (True, None)
        core.raise_if_failed()
        core._native._inject_engine_fault(kinds)
        keys = [okey(i) for i in range(4)]
        _run(lambda: core.put_many(keys, [Obj(payload(i, 5000)) for i in range(4)]))
        st = core.report_status()
        assert st["is_healthy"] is False
        assert "io_uring submit failed" in (st["worker_error"] or ""), st["worker_error"]
        with pytest.raises(RuntimeError, match="io_uring submit failed"):
            core.raise_if_failed()
        # later work is refused, not hung
        out = _run(lambda: core.put_many([okey(99)], [Obj(payload(99, 100))]))
        assert out.get("r") is None or out["r"].results == [False]
    finally:
        out = _run(core.close)
        assert "e" not in out, out.get("e")
    assert core.report_status()["is_healthy"] is False


def test_posix_and_healthy_io_uring_report_no_error(tmp_path):
    for engine in ("posix", "io_uring"):
        core = make_core(make_device(tmp_path, name=engine), io_engine=engine)
        try:
            assert core.put_many([okey(1)], [Obj(payload(1, 100))]).results == [True]
            st = core.report_status()
            assert (st["is_healthy"], st["worker_error"]) == (True, None), engine
            assert (st["fixed_buffers_registered"], st["fixed_buffer_registered_bytes"]) == (False, 0)
        finally:
            core.close()
        st = core.report_status()
        assert (st["is_healthy"], st["worker_error"]) == (False, None), engine


def test_fixed_buffer_keys_follow_registration(tmp_path):
    import ctypes

    mem = (ctypes.c_ubyte * (1 << 20))()
    core = make_core(make_device(tmp_path), io_engine="io_uring")
    try:
        core.register_fixed_buffer_range(ctypes.addressof(mem), len(mem))
        st = core.report_status()
        assert (st["fixed_buffers_registered"], st["fixed_buffer_registered_bytes"]) == (True, 1 << 20)
        assert core.put_many([okey(1)], [Obj(payload(1, 100))]).results == [True]
    finally:
        core.close()
    st = core.report_status()
    assert (st["fixed_buffers_registered"], st["fixed_buffer_registered_bytes"]) == (False, 0)


def test_inject_engine_fault_needs_io_uring(tmp_path):
    core = make_core(make_device(tmp_path))
    try:
        with pytest.raises(RuntimeError, match="needs io_engine='io_uring'"):
            core._native._inject_engine_fault(1)
    finally:
        core.close()
