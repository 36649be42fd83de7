"""Pieces of the benchmark harness that the CLI runs do not pin down: the kernel-floor program
(compiled on demand from the package), its mapping onto the per-key CPU media, and the wording
of what the harness prints. No timing is asserted."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lmcache_rawblock.bench import cpu, floor

PKG = Path(__file__).resolve().parent.parent / "lmcache_rawblock"


def _have_liburing_headers() -> bool:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return False
    proc = subprocess.run([cc, "-E", "-x", "c", "-"], input="#include <liburing.h>\n", capture_output=True,
                          text=True)
    return proc.returncode == 0


@pytest.mark.skipif(not _have_liburing_headers(), reason="no C compiler with liburing headers")
def test_floor_program_compiles_into_the_cache_dir_and_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    exe, why = floor.build()
    assert why is None and exe.startswith(str(tmp_path / "cache" / "lmcache-rawblock"))
    assert floor.build() == (exe, None)  # cached: the same binary, not compiled again
    img = cpu.written(str(tmp_path / "f.img"), floor.FILE_BYTES)
    res = floor.run(exe, img, odirect=False, rounds=2)
    assert set(res) == {(e, op, fixed) for e in ("posix", "io_uring") for op in ("put", "load")
                        for fixed in (False, True) if e == "io_uring" or not fixed}
    assert all(v >= 0 for v in res.values())


def test_floor_build_failure_names_the_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "false")
    exe, why = floor.build(str(tmp_path))
    assert exe is None and why.startswith("false failed")
    assert not [p for p in os.listdir(tmp_path) if p.startswith("io_floor")]


def test_kernel_floor_maps_rows_onto_media(tmp_path, monkeypatch):
    seen = []

    def fake_run(exe, path, odirect, rounds):
        seen.append((odirect, os.path.getsize(path)))
        base = 10e-6 if odirect else 5e-6
        return {("posix", "put", False): base, ("io_uring", "put", False): base / 2,
                ("io_uring", "put", True): base / 4}

    monkeypatch.setattr(floor, "build", lambda: ("/bin/true", None))
    monkeypatch.setattr(floor, "run", fake_run)
    res = cpu.kernel_floor(list(cpu.MEDIA), 3, str(tmp_path))
    assert res["available"] and seen == [(False, floor.FILE_BYTES), (True, floor.FILE_BYTES)]
    assert cpu.floor_of(res, "page cache", "posix", "put") == 5e-6
    assert cpu.floor_of(res, "O_DIRECT", "io_uring", "put") == 5e-6
    assert cpu.floor_of(res, cpu.REGISTERED, "io_uring", "put") == 2.5e-6
    assert cpu.floor_of(res, cpu.REGISTERED, "posix", "put") is None
    assert not os.listdir(tmp_path)  # the floor's file is removed
    assert cpu.kernel_floor(["page cache"], 0, str(tmp_path))["error"] == "not measured in this suite"


# Words of the project's own bookkeeping, which the product does not speak.
TRACKING = re.compile(r"\b(issues?|seeds?|sessions?|tickets?)\b|#\d", re.IGNORECASE)


def test_bench_speaks_of_measurements_not_of_work_tracking():
    files = sorted((PKG / "bench").glob("*.py")) + [PKG / "__main__.py"]
    hits = [f"{f.name}:{n}: {line.strip()}" for f in files
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if TRACKING.search(line)]
    assert hits == []
