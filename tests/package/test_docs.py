"""The documentation stays true to the tree: the README's front page stays short, every relative
link in README.md and docs/*.md reaches a file (and, with an anchor, a heading of that file), and
docs/architecture.md names every C file under csrc/ and every module of the runtime package.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import REPO

ROOT = REPO
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
FRONT_PAGE_MAX_LINES = 250
# Packages the architecture map may name as a whole instead of module by module.
WHOLE_PACKAGES = ("bench", "waf")


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


def test_architecture_names_every_python_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    pkg = ROOT / "lmcache_rawblock"
    missing = []
    for p in sorted(pkg.rglob("*.py")):
        rel = p.relative_to(pkg)
        if rel.parts[0] in WHOLE_PACKAGES:
            if not _named(text, rel.parts[0] + "/"):
                missing.append(f"lmcache_rawblock/{rel.parts[0]}/")
            continue
        # A module in a subpackage is named under its package's line: both must appear.
        if not _named(text, p.name) or any(not _named(text, d + "/") for d in rel.parts[:-1]):
            missing.append(f"lmcache_rawblock/{rel}")
    assert not missing, f"docs/architecture.md does not name {sorted(set(missing))}"
