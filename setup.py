"""Build of the lmcache_rawblock._native extension.

Native libraries are found with pkg-config where its .pc files work, with a plain -l
fallback where they do not (Debian 12's libnvme.pc needs json-c's). liburing is linked
statically when liburing.a exists, so an installed wheel does not depend on the build
machine's liburing. Environment knobs:

  RB_SANITIZE=1   build with ASan + UBSan (see `make test-asan`), and RB_DEBUG's checks
  RB_WERROR=1     turn warnings into errors (CI)
  RB_DEBUG=1      -O1 -g, with the core's lock order and slot states checked
                  (RB_DEBUG_INVARIANTS, csrc/core/rb_debug.h)
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

from setuptools import Extension, setup

VERSION = "0.1.0"

NATIVE_LIBS = [
    # (pkg-config name, -l fallback)
    ("liburing", "uring"),
    ("libnvme", "nvme"),
    ("json-c", "json-c"),
    ("zlib", "z"),
    ("libdeflate", "deflate"),  # decodes bases and log groups (zlib encodes them)
    ("blkid", "blkid"),
    ("libxxhash", "xxhash"),
]

LIB_DIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]


def _pkg_config(*args: str) -> list[str] | None:
    if not shutil.which("pkg-config"):
        return None
    try:
        out = subprocess.run(["pkg-config", *args], check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError:
        return None
    return out.split()


def _static_archive(name: str) -> str | None:
    for d in LIB_DIRS:
        path = os.path.join(d, f"lib{name}.a")
        if os.path.exists(path):
            return path
    return None


def native_flags() -> tuple[list[str], list[str], list[str]]:
    """Return (compile flags, libraries, extra link objects/flags)."""
    cflags: list[str] = []
    libs: list[str] = []
    link: list[str] = []
    for pc, lib in NATIVE_LIBS:
        flags = _pkg_config("--cflags", pc)
        if flags:
            cflags += [f for f in flags if f not in cflags]
        if lib == "uring":
            archive = _static_archive("uring")
            if archive:
                link.append(archive)
                continue
        libs.append(lib)
    return cflags, libs, link


def extension() -> Extension:
    cflags, libs, link = native_flags()
    compile_args = ["-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden", "-DRB_HAVE_LIBDEFLATE", *cflags]
    link_args = [*link, "-lpthread"]
    if os.environ.get("RB_WERROR") == "1":
        compile_args.append("-Werror")
    if os.environ.get("RB_DEBUG") == "1" or os.environ.get("RB_SANITIZE") == "1":
        # with the core's lock order and slot states checked (csrc/core/rb_debug.h)
        compile_args += ["-O1", "-g", "-fno-omit-frame-pointer", "-DRB_DEBUG_INVARIANTS"]
    else:
        compile_args += ["-O2"]
    if os.environ.get("RB_SANITIZE") == "1":
        san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
        compile_args += san
        link_args += san
    sources = sorted(glob.glob("csrc/core/*.c")) + sorted(glob.glob("csrc/py/*.c"))
    return Extension(
        "lmcache_rawblock._native",
        sources=sources,
        depends=sorted(glob.glob("csrc/core/*.h")) + sorted(glob.glob("csrc/py/*.h")),
        define_macros=[("RB_VERSION", f'"{VERSION}"'), ("_GNU_SOURCE", None)],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        libraries=libs,
    )


setup(version=VERSION, ext_modules=[extension()])
