"""Checks of what `make wheel` builds.

`wheel WHEEL`: `auditwheel show` reports a manylinux tag equal to the one in the
file name, every shared library the wheel's ELF files need is either bundled in the wheel or
on that manylinux policy's list, the libraries the extension is built against (libnvme, json-c,
libblkid, xxhash) are bundled, and liburing is not needed at all (linked statically).

`sdist SDIST`: the source distribution holds what a build from source and the tests need
(setup.py, pyproject.toml, every C source and header under csrc/, the tests, the benchmark
package the tests of the harness import) and nothing generated (no shared library, object file,
build/ or dist/ tree, virtualenv or bytecode cache).

Both: the runtime package only, never the benchmark package (benchmarks/, its own distribution)
inside the wheel or inside lmcache_rawblock/.

    python tools/check_dist.py sdist dist/lmcache_rawblock-*.tar.gz
    python tools/check_dist.py wheel dist/lmcache_rawblock-*.whl

Each prints what it checked in one line (wheel: `auditwheel show` first) and exits 1 with the
reasons on any failure. Needs auditwheel (and its pyelftools) in the running Python.
"""

from __future__ import annotations

import importlib.resources
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

EXPECT_BUNDLED = ("libnvme", "libjson-c", "libblkid", "libxxhash", "libdeflate")


def needed(data: bytes) -> list[str]:
    elf = ELFFile(io.BytesIO(data))
    out: list[str] = []
    for sec in elf.iter_sections():
        if isinstance(sec, DynamicSection):
            out += [t.needed for t in sec.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    return out


def policy_whitelist(tag: str) -> set[str]:
    name = re.sub(r"_(x86_64|aarch64|i686|ppc64le|s390x|armv7l)$", "", tag)
    policies = json.loads((importlib.resources.files("auditwheel") / "policy" / "manylinux-policy.json").read_text())
    for p in policies:
        if p["name"] == name or name in p.get("aliases", []):
            return set(p["lib_whitelist"])
    raise SystemExit(f"check_dist wheel: no manylinux policy named {name!r} in auditwheel")


def check_wheel(path: str) -> int:
    show = subprocess.run([sys.executable, "-m", "auditwheel", "show", path], capture_output=True, text=True)
    print(show.stdout.strip())
    if show.returncode != 0:
        print(show.stderr, file=sys.stderr)
        return 1
    text = " ".join(show.stdout.split())
    errors: list[str] = []
    m = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    tag = m.group(1) if m else ""
    if not tag.startswith("manylinux_"):
        errors.append(f"auditwheel show reports platform tag {tag or '(none)'!r}, not a manylinux tag")
    if "need to be eliminated" in text:
        errors.append("auditwheel show lists external libraries that have to be eliminated")
    file_tags = os.path.basename(path).removesuffix(".whl").split("-")[-1].split(".")
    if tag and tag not in file_tags:
        errors.append(f"file name carries {'.'.join(file_tags)}, auditwheel show reports {tag}")

    bundled: list[str] = []
    external: set[str] = set()
    with zipfile.ZipFile(path) as zf:
        elves = {n: zf.read(n) for n in zf.namelist() if re.search(r"\.so(\.[0-9.]+)?$", n)}
        if not any(re.search(r"\.dist-info/licenses/LICENSE$", n) for n in zf.namelist()):
            errors.append("the licence text (LICENSE) is not in the wheel's .dist-info/licenses/")
    for name in elves:
        if ".libs/" in name:
            bundled.append(os.path.basename(name))
    for name, data in elves.items():
        for lib in needed(data):
            if lib not in bundled:
                external.add(lib)
                if "liburing" in lib:
                    errors.append(f"{name} needs {lib}: liburing must be linked statically")
    if tag.startswith("manylinux_"):
        allowed = policy_whitelist(tag)
        # The dynamic loader is part of glibc, which every manylinux policy assumes.
        allowed |= {lib for lib in external if re.match(r"ld-linux[-.\w]*\.so\.\d$|ld64\.so\.\d$", lib)}
        for lib in sorted(external - allowed):
            errors.append(f"external library {lib} is neither bundled nor allowed by {tag}")
    for want in EXPECT_BUNDLED:
        if not any(b.startswith(want + "-") for b in bundled):
            errors.append(f"{want} is not bundled in the wheel")
    with zipfile.ZipFile(path) as zf:
        errors += [f"tooling in the runtime wheel: {n}" for n in zf.namelist() if TOOLING_IN_RUNTIME.match(n)]
    print(f"check_dist wheel: {os.path.basename(path)}: {os.path.getsize(path) / 1e6:.2f} MB, tag {tag}; "
          f"bundled: {', '.join(sorted(bundled))}; external (manylinux policy): {', '.join(sorted(external))}")
    for e in errors:
        print(f"check_dist wheel: FAIL: {e}", file=sys.stderr)
    return 1 if errors else 0


# The benchmark package, or the tooling's old places inside the runtime package.
TOOLING_IN_RUNTIME = re.compile(r"(lmcache_rawblock_bench|lmcache_rawblock/(bench|waf))/")

# Generated or local-only paths that must never be in the sdist (matched per path component).
SDIST_FORBIDDEN = re.compile(r"(^|/)(build|dist|bench-out|__pycache__|\.pytest_cache|\.venv[^/]*|\.git)(/|$)"
                             r"|\.(so|o|a|pyc|pyo)$")


def check_sdist(path: str) -> int:
    with tarfile.open(path) as tf:
        names = [n.split("/", 1)[1] for n in tf.getnames() if "/" in n]
    files = set(names)
    errors = [f"generated file in the sdist: {n}" for n in sorted(files) if SDIST_FORBIDDEN.search(n)]
    errors += [f"tooling inside the runtime package: {n}" for n in sorted(files) if n.startswith("lmcache_rawblock/")
               and TOOLING_IN_RUNTIME.match(n)]
    errors += [f"benchmark results or scripts in the sdist: {n}" for n in sorted(files)
               if re.match(r"benchmarks/(results|scripts)/", n)]
    for need in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "Makefile", "PKG-INFO",
                 "lmcache_rawblock/__init__.py", "lmcache_rawblock/_native.pyi", "lmcache_rawblock/py.typed",
                 "tests/conftest.py", "tests/c/test_core_ds.c", "benchmarks/pyproject.toml",
                 "benchmarks/lmcache_rawblock_bench/__init__.py"):
        if need not in files:
            errors.append(f"missing from the sdist: {need}")
    c_files = sorted(n for n in files if n.startswith("csrc/") and n.endswith((".c", ".h")))
    if not any(n.endswith(".h") for n in c_files):
        errors.append("no C header under csrc/ in the sdist")
    tests = sorted(n for n in files if n.startswith("tests/") and os.path.basename(n).startswith("test_"))
    print(f"check_dist sdist: {os.path.basename(path)}: {os.path.getsize(path) / 1e6:.2f} MB, {len(files)} entries: "
          f"{len(c_files)} C sources and headers, {len(tests)} test files, nothing generated"
          + (" (failed)" if errors else ""))
    for e in errors:
        print(f"check_dist sdist: FAIL: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("wheel", "sdist"):
        raise SystemExit("usage: check_dist.py {wheel WHEEL | sdist SDIST}")
    raise SystemExit((check_wheel if sys.argv[1] == "wheel" else check_sdist)(sys.argv[2]))
