"""The index's probe chains under forced hash collisions, the hash across its inline/XXH3 length
boundary and the blob pool classes kept in the record flags: tests/c/test_idx_probe.c, built
with AddressSanitizer and UBSan and run."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from helpers import REPO

ROOT = str(REPO)


def test_index_probe_chains_and_pool_classes(tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    exe = str(tmp_path / "test_idx_probe")
    core = os.path.join(ROOT, "csrc", "core")
    subprocess.run([cc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-g", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=undefined", "-D_GNU_SOURCE", "-I" + core,
                    os.path.join(ROOT, "tests", "c", "test_idx_probe.c"), os.path.join(core, "rb_idx.c"),
                    "-lxxhash", "-o", exe], check=True, env=env)
    out = subprocess.run([exe], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "test_idx_probe: ok" in out.stdout
