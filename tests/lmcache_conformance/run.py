"""Run LMCache's own raw-block tests in three modes and compare them.

Run with the interpreter of an LMCache virtualenv (one per version of the matrix) from the
repository root (``make test-conformance`` runs it for each)::

    .venv-lmcache-0.5.7rc2/bin/python tests/lmcache_conformance/run.py [--modes baseline,compat,native]
                                                                       [--write-readme]

``--write-readme`` replaces the installed version's table of LMCache's own tests in
``docs/compatibility.md``.

1. The test files come from the ``lmcache`` sdist of the installed version, downloaded with pip
   into ``build/lmcache-sdist/<version>/`` (only its ``tests/`` tree and ``pytest.ini`` are
   kept: the sdist's ``lmcache/`` sources must not shadow the installed package). Nothing of
   LMCache is committed. ``pytest-asyncio`` and ``pytest-timeout``, which those tests need, are
   installed into the running environment if missing.
2. Each mode runs in its own pytest process with ``-p rb_conformance`` (see
   ``rb_conformance.py``), writing ``build/lmcache-conformance/<version>/<mode>.json`` (per-test outcomes
   and the substitution proof), ``junit-<mode>.xml`` and ``<mode>.log``.
3. The summary is a file x mode table of passed / failed / skipped / errors. Exit status is
   non-zero when a mode's substitution check failed, when a mode did not run, or when a test
   that passed in baseline did not pass in compat or native and is not listed in
   ``exclusions.py``. A listed test that passes is reported.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SDIST_CACHE = REPO / "build" / "lmcache-sdist"
OUT = REPO / "build" / "lmcache-conformance"
README = REPO / "docs" / "compatibility.md"  # the table of LMCache's own tests
MODES = ("baseline", "compat", "native")
# One table per LMCache version, between these markers (the version in each).
TABLE_BEGIN = "<!-- lmcache-conformance-table:begin {version} -->"
TABLE_END = "<!-- lmcache-conformance-table:end {version} -->"

# LMCache's raw-block test files, relative to the sdist root. An entry is one glob, or several
# separated by "|" where LMCache versions keep the files in different places (0.5.7 moved the
# raw-block tests from tests/v1/storage_backend/test_raw_block_*.py to tests/v1/distributed/
# raw_block/test_*.py, leaving test_raw_block_uring_cmd.py): the files of every alternative that
# matches are run, and an entry none of whose alternatives matches is an error.
TEST_FILES = (
    "tests/v1/distributed/raw_block/test_*.py|tests/v1/storage_backend/test_raw_block_*.py",
    "tests/v1/storage_backend/test_rust_raw_block_backend.py",
    "tests/v1/distributed/test_raw_block_l2_adapter.py",
    "tests/v1/multiprocess/test_raw_block_l2_adapter.py",
    "tests/v1/distributed/test_l2_adapter_factory.py",
)
PER_TEST_TIMEOUT_S = 300

sys.path.insert(0, str(HERE))
from exclusions import EXCLUSIONS, Exclusion, current_nodeid  # noqa: E402


def log(msg: str) -> None:
    print(f"[conformance] {msg}", flush=True)


# --------------------------------------------------------------------------- fetching


def lmcache_version() -> str:
    try:
        return importlib.metadata.version("lmcache")
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"lmcache is not installed in {sys.prefix} (make lmcache-venv)")


def _find_tree(root: Path) -> Path | None:
    for ini in sorted(root.rglob("pytest.ini")):
        if (ini.parent / "tests" / "v1").is_dir():
            return ini.parent
    return None


def fetch_tests(version: str) -> Path:
    """``build/lmcache-sdist/<version>`` holding the sdist's ``tests/`` and ``pytest.ini``."""
    dest = SDIST_CACHE / version
    if (dest / ".complete").exists():
        return dest
    SDIST_CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=SDIST_CACHE) as tmp:
        tmp_path = Path(tmp)
        # pip unpacks the sdist before building its metadata; that build needs CUDA and fails
        # here, so --no-clean keeps the unpacked tree, and --no-build-isolation spares it
        # installing the build dependencies first.
        cmd = [sys.executable, "-m", "pip", "download", "--no-clean", "--no-deps",
               "--no-build-isolation", "--no-binary", "lmcache", f"lmcache=={version}",
               "-d", str(tmp_path / "out")]
        log(f"fetching the lmcache {version} sdist: {' '.join(cmd[1:])}")
        env = dict(os.environ, TMPDIR=str(tmp_path))
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        for archive in (tmp_path / "out").glob("lmcache-*.tar.gz") if (tmp_path / "out").exists() else ():
            with tarfile.open(archive) as tf:
                try:
                    tf.extractall(tmp_path / "unpacked", filter="data")
                except TypeError:  # Python without extraction filters (before 3.11.4)
                    tf.extractall(tmp_path / "unpacked")
        tree = _find_tree(tmp_path)
        if tree is None:
            sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
            sys.exit(f"could not fetch the lmcache {version} sdist's tests (pip exit {r.returncode})")
        staging = SDIST_CACHE / f".{version}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        shutil.copytree(tree / "tests", staging / "tests")
        shutil.copy2(tree / "pytest.ini", staging / "pytest.ini")
        (staging / ".complete").write_text(f"lmcache {version} sdist: tests/ and pytest.ini\n")
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
    return dest


def ensure_test_deps() -> None:
    missing = [pkg for mod, pkg in (("pytest_asyncio", "pytest-asyncio"), ("pytest_timeout", "pytest-timeout"))
               if importlib.util.find_spec(mod) is None]
    if missing:
        log(f"installing {' '.join(missing)}")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)


def test_files(tree: Path, patterns: tuple[str, ...] = TEST_FILES) -> list[str]:
    files: list[str] = []
    for entry in patterns:
        hits = sorted({h for alt in entry.split("|") for h in glob.glob(alt, root_dir=tree)})
        if not hits:
            moved = sorted({str(p.relative_to(tree)) for alt in entry.split("|")
                            for p in tree.rglob(Path(alt).name)})
            sys.exit(f"no {entry} in the lmcache sdist" + (f" (found {moved})" if moved else ""))
        files.extend(h for h in hits if h not in files)
    return files


# --------------------------------------------------------------------------- running


def run_mode(mode: str, tree: Path, files: list[str], extra: list[str]) -> dict:
    OUT.mkdir(parents=True, exist_ok=True)
    record = OUT / f"{mode}.json"
    record.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE)
    env["RB_CONFORMANCE_MODE"] = mode
    env["RB_CONFORMANCE_RECORD"] = str(record)
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-c", str(tree / "pytest.ini"), "--rootdir", str(tree),
           "-p", "rb_conformance", "-p", "no:cacheprovider", "-q", "-rfE", "--continue-on-collection-errors", "-o", "log_cli=false",
           f"--timeout={PER_TEST_TIMEOUT_S}", f"--junitxml={OUT / f'junit-{mode}.xml'}", *extra, *files]
    log(f"{mode}: running {len(files)} files")
    t0 = time.monotonic()
    with open(OUT / f"{mode}.log", "w") as logf:
        proc = subprocess.run(cmd, cwd=tree, env=env, stdout=logf, stderr=subprocess.STDOUT)
    elapsed = time.monotonic() - t0
    tail = (OUT / f"{mode}.log").read_text(errors="replace").splitlines()
    summary = next((ln for ln in reversed(tail) if re.search(r"\b(passed|failed|error|skipped)\b", ln)), "")
    log(f"{mode}: pytest exit {proc.returncode} in {elapsed:.0f} s: {summary.strip('= ')}")
    if not record.exists():
        return {"mode": mode, "returncode": proc.returncode, "seconds": elapsed, "outcomes": {},
                "problems": [f"pytest wrote no record (exit {proc.returncode}); see {OUT / f'{mode}.log'}"]}
    data = json.loads(record.read_text())
    data["returncode"] = proc.returncode
    data["seconds"] = elapsed
    if proc.returncode not in (0, 1):
        data["problems"].append(f"pytest exit status {proc.returncode}; see {OUT / f'{mode}.log'}")
    return data


# --------------------------------------------------------------------------- summary


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def table(results: dict[str, dict], files: list[str]) -> list[str]:
    modes = [m for m in MODES if m in results]
    lines = ["| file | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    totals = {m: Counter() for m in modes}
    for f in files:
        cells = []
        for m in modes:
            c = Counter(o for n, o in results[m]["outcomes"].items() if file_of(n) == f)
            totals[m].update(c)
            cells.append(_cell(c))
        lines.append(f"| `{f.removeprefix('tests/v1/')}` | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(f"**{_cell(totals[m])}**" for m in modes) + " |")
    return lines


def _cell(c: Counter) -> str:
    return f"{c['passed']} / {c['failed']} / {c['skipped']} / {c['error']}"


def excluded(mode: str, nodeid: str) -> Exclusion | None:
    nodeid = current_nodeid(nodeid)  # the exclusions name the newest layout's files
    for e in EXCLUSIONS:
        if mode in e.modes and fnmatch.fnmatchcase(nodeid, e.test):
            return e
    return None


def check_exclusions() -> list[str]:
    problems = []
    for e in EXCLUSIONS:
        if not set(e.modes) <= {"compat", "native"} or e.kind not in ("private", "differs"):
            problems.append(f"exclusion {e.test}: bad modes {e.modes} or kind {e.kind!r}")
        if not e.reason.strip():
            problems.append(f"exclusion {e.test}: no reason")
        path, _, name = e.covered_by.partition("::")
        src = REPO / path
        if not name or not src.exists() or not re.search(rf"^\s*(async\s+)?def {re.escape(name)}\(",
                                                          src.read_text(), re.M):
            problems.append(f"exclusion {e.test}: covered_by {e.covered_by} does not name a test of ours")
    return problems


def compare(results: dict[str, dict]) -> tuple[list[str], list[str], list[str]]:
    """(violations, excluded failures, exclusions that pass) against the baseline."""
    violations, held, now_pass = [], [], []
    base = results["baseline"]["outcomes"]
    for mode in ("compat", "native"):
        if mode not in results:
            continue
        got = results[mode]["outcomes"]
        for nodeid, outcome in sorted(base.items()):
            if outcome != "passed":
                continue
            mine = got.get(nodeid, "not run")
            e = excluded(mode, nodeid)
            if mine == "passed":
                if e is not None:
                    now_pass.append(f"{mode}: {nodeid} passes (listed in exclusions.py: {e.kind})")
            elif e is not None:
                held.append(f"{mode}: {nodeid}: {mine} (excluded, {e.kind}: {e.reason})")
            else:
                violations.append(f"{mode}: {nodeid}: {mine} (passed in baseline)")
        for nodeid, outcome in sorted(got.items()):
            if outcome == "error" and nodeid not in base:
                violations.append(f"{mode}: {nodeid}: error (not in baseline: a collection error?)")
    return violations, held, now_pass


def write_readme(version: str, lines: list[str]) -> None:
    """Replace the version's table in docs/compatibility.md; a version without one gets a new
    block after the last table."""
    text = README.read_text()
    begin, end = TABLE_BEGIN.format(version=version), TABLE_END.format(version=version)
    block = begin + "\n" + "\n".join(lines) + "\n" + end
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        last_end = max((m.end() for m in re.finditer(r"<!-- lmcache-conformance-table:end [^ ]+ -->", text)),
                       default=-1)
        if last_end < 0:
            sys.exit(f"{README.relative_to(REPO)} has no {TABLE_BEGIN} ... {TABLE_END} block to add to")
        text = text[:last_end] + f"\n\nLMCache {version}:\n\n" + block + text[last_end:]
    README.write_text(text)
    log(f"{README.relative_to(REPO)}: the table of lmcache {version} updated")


def main() -> int:
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--write-readme", action="store_true",
                    help="replace the table in docs/compatibility.md (LMCache's own tests) with this run's")
    ap.add_argument("--files", help="comma-separated globs of LMCache test files (relative to the sdist; "
                    "a|b: whichever of a and b this version has) "
                    "instead of the raw-block set, e.g. the NVMe ones in the emulated NVMe guest")
    ap.add_argument("--out", help=f"directory for the records and logs (default {OUT}/<lmcache version>)")
    ap.add_argument("--fetch-only", action="store_true",
                    help="fetch the sdist's tests and install the test plugins, then stop (before a run in a "
                         "guest whose root is read-only)")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args()
    version = lmcache_version()
    OUT = Path(args.out) if args.out else OUT / version  # one directory per version of the matrix
    modes = [m for m in MODES if m in args.modes.split(",")]
    if "baseline" not in modes:
        modes.insert(0, "baseline")  # every comparison is against the baseline
    problems = check_exclusions()
    tree = fetch_tests(version)
    ensure_test_deps()
    if args.fetch_only:
        log(f"tests of lmcache {version} ready in {tree}")
        return 0
    files = test_files(tree, tuple(args.files.split(",")) if args.files else TEST_FILES)
    results = {m: run_mode(m, tree, files, args.pytest_args) for m in modes}

    for m, r in results.items():
        problems.extend(f"{m}: substitution check: {p}" for p in r.get("problems", []))
    violations, held, now_pass = compare(results)
    lines = table(results, files)
    times = ", ".join(f"{m} {results[m]['seconds']:.0f} s" for m in modes)
    wheel = _dist_version("lmcache-rust-raw-block-io")
    caption = (f"lmcache {version} sdist, Rust wheel {wheel}; cells: passed / failed / skipped / errors; "
               f"wall time {times} (2-core machine).")
    report = ["", *lines, caption, ""]
    for title, items in (("excluded (exclusions.py)", held), ("listed but now passing", now_pass),
                         ("NOT CONFORMING: passed in baseline, not here, not listed", violations),
                         ("PROBLEMS", problems)):
        if items:
            report.append(f"{title}:")
            report.extend(f"  {it}" for it in items)
    print("\n".join(report))
    (OUT / "summary.txt").write_text("\n".join(report) + "\n")
    if args.write_readme and set(modes) == set(MODES) and not args.files:
        write_readme(version, lines + ["", caption])
    ok = not violations and not problems
    log("OK" if ok else "FAILED")
    return 0 if ok else 1


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
