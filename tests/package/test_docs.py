"""The documentation stays true to the tree: the README's front page stays short, every relative
link in README.md and docs/*.md reaches a file (and, with an anchor, a heading of that file), and
docs/architecture.md names every C file under csrc/ and every module of the runtime package and
of the benchmark package (benchmarks/lmcache_rawblock_bench).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import REPO

ROOT = REPO
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
FRONT_PAGE_MAX_LINES = 250
# The Python packages whose every module the architecture map names: the runtime and the benchmarks.
PACKAGES = (ROOT / "lmcache_rawblock", ROOT / "benchmarks" / "lmcache_rawblock_bench")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (links in code are not links)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} (.+)$", _prose(path.read_text()), re.M):
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text()))


def test_front_page_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= FRONT_PAGE_MAX_LINES, (
        f"README.md has {len(lines)} lines; the front page keeps to {FRONT_PAGE_MAX_LINES}: "
        "move the detail into docs/ and link it")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    broken = []
    for link in _links(doc):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto:, ...
            continue
        target, _, anchor = link.partition("#")
        dest = (doc.parent / target).resolve() if target else doc
        if not dest.exists():
            broken.append(f"{link}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{link}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def _named(text: str, name: str) -> bool:
    return re.search(r"(?<![\w.])" + re.escape(name) + r"(?![\w])", text) is not None


def test_architecture_names_every_c_file():
    text = (ROOT / "docs" / "architecture.md").read_text()
    c_files = sorted((ROOT / "csrc").rglob("*.c"))
    assert c_files
    missing = [str(p.relative_to(ROOT)) for p in c_files if not _named(text, p.name)]
    assert not missing, f"docs/architecture.md does not name {missing}"


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.name)
def test_architecture_names_every_python_module(pkg: Path):
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert (pkg / "__init__.py").is_file(), pkg
    missing = []
    for p in sorted(pkg.rglob("*.py")):
        rel = p.relative_to(pkg)
        # A module in a subpackage is named under its package's line: both must appear.
        if not _named(text, p.name) or any(not _named(text, d + "/") for d in (pkg.name, *rel.parts[:-1])):
            missing.append(str(p.relative_to(ROOT)))
    assert not missing, f"docs/architecture.md does not name {sorted(set(missing))}"


def _quoted_includes(path: Path) -> list[Path]:
    return [(path.parent / m).resolve() for m in re.findall(r'^#include "([^"]+)"', path.read_text(), re.M)]


def test_the_binding_reaches_the_core_through_public_headers_only():
    """No file under csrc/py includes, directly or through another header, a private core header
    (csrc/core/*_int.h): the binding sees the core only as rb_core.h and its siblings declare it."""
    private = {p.resolve() for p in (ROOT / "csrc" / "core").glob("*_int.h")}
    assert private, "no private core headers found"
    offenders = []
    for src in sorted((ROOT / "csrc" / "py").glob("*.[ch]")):
        seen: set[Path] = set()
        todo = _quoted_includes(src)
        while todo:
            h = todo.pop()
            if h in seen or not h.exists():
                continue
            seen.add(h)
            if h in private:
                offenders.append(f"{src.name} -> {h.name}")
            todo.extend(_quoted_includes(h))
    assert not offenders, offenders


def _python_block_after(path: Path, lead: str) -> str:
    """The first ```python block of ``path`` after the line starting with ``lead``."""
    text = path.read_text()
    start = text.index(lead)
    m = re.compile(r"^```python\n(.*?)^```$", re.M | re.S).search(text, start)
    assert m, f"no python block after {lead!r} in {path.name}"
    return m.group(1)


def test_the_documented_core_example_runs(tmp_path, monkeypatch):
    """docs/install.md's example of the core alone runs as written (its own assert checks the
    load), and, as it says, a reopen of the device finds the key."""
    code = _python_block_after(ROOT / "docs" / "install.md", "The core (index, slots, checkpoints, recovery)")
    assert code.count("\n") <= 12, "the example is meant to stay a few lines"
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(compile(code, "docs/install.md", "exec"), names)  # noqa: S102 - the documented example itself
    core = names["RawBlockCore"](names["config"], key_namespace="object")
    try:
        out = bytearray(8000)
        assert core.load_many_into([names["key"].encoded], [out]) == [True]
        assert out == b"kv bytes" * 1000
    finally:
        core.close()
