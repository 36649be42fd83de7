"""Log groups written with pwritev2(RWF_DSYNC) (docs/metadata-log.md, "The core's side"): where
the file or the kernel refuses the flag (EOPNOTSUPP from a file without its own write path, EINVAL
or ENOSYS from a kernel or sandbox without it), a group is written and flushed as before, and
nothing a checkpoint made durable is dropped.

The refusal is a preloaded shim over pwritev2: every call with RWF_DSYNC fails with the errno
named by RB_DSYNC_ERRNO, as such a system would.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest

from core_helpers import Obj, make_core, make_device, okey, payload
from helpers import TESTS, preload_shim

SIZE = 3000
SLOT_BYTES = 8192
LOG_META = 16 << 20
CFG = dict(meta_format="log", slot_bytes=SLOT_BYTES, meta_total_bytes=LOG_META, meta_enable_periodic=False,
           meta_idle_quiet_ms=600_000)

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/uio.h>

#ifndef RWF_DSYNC
#define RWF_DSYNC 0x00000002
#endif

#define PWRITEV2(name)                                                                \
    ssize_t name(int fd, const struct iovec *iov, int n, off_t off, int flags)        \
    {                                                                                 \
        ssize_t (*real)(int, const struct iovec *, int, off_t, int) = dlsym(RTLD_NEXT, #name); \
        if (flags & RWF_DSYNC) {                                                      \
            errno = atoi(getenv("RB_DSYNC_ERRNO"));                                   \
            return -1;                                                                \
        }                                                                             \
        return real(fd, iov, n, off, flags);                                          \
    }
PWRITEV2(pwritev2)
PWRITEV2(pwritev64v2)
"""


def _shim(tmp_path) -> str:
    return preload_shim(tmp_path, "dsync", SHIM, "pwritev2 shim")


@pytest.mark.parametrize("refusal", ["EOPNOTSUPP", "EINVAL", "ENOSYS"])
def test_groups_are_flushed_where_rwf_dsync_is_refused(tmp_path, refusal):
    """Puts, deletes (a group of FREE records alone) and puts into the freed slots, each made
    durable by a checkpoint under a kernel refusing RWF_DSYNC: every checkpoint succeeds, no
    write-back failure is counted, no entry is dropped, and after a crash (the child dies
    without closing) every key the checkpoints covered is served with its own bytes and no
    deleted key comes back."""
    dev = make_device(tmp_path, size=2 * LOG_META + 300 * SLOT_BYTES)
    out = tmp_path / "res.json"
    code = textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {str(TESTS)!r})
        from core_helpers import Obj, make_core, okey, payload
        c = make_core({dev!r}, **{CFG!r})
        def put(ids):
            assert all(c.put_many([okey(i) for i in ids], [Obj(payload(i, {SIZE})) for i in ids]).results)
        put(range(40))
        c.checkpoint_now()
        c.delete_many([okey(i).encoded for i in range(20)])
        c.checkpoint_now()
        put(range(100, 120))
        c.checkpoint_now()
        st = c._native.status()
        res = dict(failures=st["writeback_failures"], held=st["checkpoint_held_slots"],
                   ckpt_failures=st["checkpoint_failures"], n=st["indexed_key_count"])
        with open({str(out)!r}, "w") as f:
            json.dump(res, f)
        os._exit(0)
    """)
    preload = " ".join(p for p in (os.environ.get("LD_PRELOAD"), _shim(tmp_path)) if p)
    env = dict(os.environ, LD_PRELOAD=preload, RB_DSYNC_ERRNO=str(getattr(errno, refusal)))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res == dict(failures=0, held=0, ckpt_failures=0, n=40), res
    c = make_core(dev, **CFG)
    try:
        assert c.exists_many([okey(i).encoded for i in range(20)]) == [False] * 20
        live = list(range(20, 40)) + list(range(100, 120))
        objs = [Obj(SIZE) for _ in live]
        assert c.load_many_into([okey(i).encoded for i in live], objs) == [True] * len(live)
        assert all(o.bytes() == payload(i, SIZE) for i, o in zip(live, objs))
    finally:
        c.close()
