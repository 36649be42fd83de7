#!/usr/bin/env bash
# The static checks of `make lint`, in one place. Each check runs even when an earlier one
# failed; the script prints each one's verdict and time and fails if any failed.
#
#   ruff          lint of the runtime package lmcache_rawblock and of tests/
#                 (rules and exclusions: pyproject.toml, [tool.ruff])
#   mypy          types of the runtime package (pyproject.toml, [tool.mypy])
#   stubtest      lmcache_rawblock/_native.pyi against the built extension
#                 (exceptions, each with its reason: tools/stubtest-allowlist.txt)
#   clang-format  csrc/*/*.[ch] exactly as .clang-format formats them (clang-format 18.1.8)
#   lizard        no C function in csrc/ and no Python function of the runtime package
#                 lmcache_rawblock over 80 lines or cyclomatic complexity 15
#                 (docs/development.md: how to split one, when "#lizard forgives" is fine)
#   commits       every commit since the tree was first formatted has a subject of at most
#                 72 characters and, unless it is a merge, a body saying why
#
# Usage: tools/lint.sh [PYTHON]. PYTHON (default python3) must have the tools installed at the
# versions the Makefile's LINT_TOOLS pins, which `make lint` does first, and the extension
# built in place (`make build`), which stubtest imports.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
CLANG_FORMAT_VERSION=18.1.8

# The clang-format of PYTHON's scripts directory (the PyPI wheel), else the one on PATH; it
# must be CLANG_FORMAT_VERSION, since other versions format some constructs differently.
clang_format() {
  local bin
  bin="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/clang-format"
  [ -x "$bin" ] || bin=$(command -v clang-format) || { echo "clang-format not found: pip install clang-format==$CLANG_FORMAT_VERSION" >&2; return 1; }
  if ! "$bin" --version | grep -q "version $CLANG_FORMAT_VERSION"; then
    echo "$bin is not clang-format $CLANG_FORMAT_VERSION: pip install clang-format==$CLANG_FORMAT_VERSION" >&2
    return 1
  fi
  "$bin" --dry-run -Werror csrc/*/*.[ch]
}

# lizard lists every function over a limit (-w: warnings only) and exits non-zero if any is:
# the C of csrc/ and the Python of the runtime package, with the same limits. Both run, so one
# verdict lists every finding.
function_sizes() {
  local rc=0
  lizard_over c "C" csrc || rc=1
  lizard_over python "Python" lmcache_rawblock || rc=1
  return $rc
}

# lizard_over LANGUAGE NAME PATH: lizard's findings for LANGUAGE under PATH, and their count.
lizard_over() {
  local out
  out=$("$PY" -m lizard -l "$1" -C 15 -L 80 -w "$3") && return 0
  printf '%s\n' "$out"
  echo "$(printf '%s\n' "$out" | grep -c ': warning: ') $2 function(s) in $3 over 80 lines or CCN 15"
  return 1
}

# The commits since SUBJECTS_SINCE (the first one made under this rule): a subject of at most 72
# characters, and a body (the why) on every commit but a merge. Older history is left as it is.
# A checkout without that commit (a shallow clone, an sdist) has nothing to check.
SUBJECTS_SINCE=9d60e69
commit_messages() {
  git rev-parse -q --verify "$SUBJECTS_SINCE^{commit}" >/dev/null 2>&1 || { echo "no $SUBJECTS_SINCE in this checkout: nothing to check"; return 0; }
  local bad
  bad=$(git log --format='%h%x09%p%x09%s%x09%b%x1e' "$SUBJECTS_SINCE^..HEAD" | awk -v RS='\x1e' -F'\t' '
    NF < 3 { next }
    { sub(/^\n+/, "", $1); merge = split($2, parents, " ") > 1 }
    length($3) > 72 { print $1 ": subject of " length($3) " characters (at most 72): " $3 }
    !merge && $4 !~ /[^[:space:]]/ { print $1 ": no body saying why: " $3 }')
  [ -z "$bad" ] && return 0
  printf '%s\n' "$bad"
  return 1
}

failed=()
check() {
  local name=$1 t0=$SECONDS
  shift
  echo "lint: $name"
  if "$@"; then
    echo "lint: $name passed in $((SECONDS - t0)) s"
  else
    echo "lint: $name FAILED in $((SECONDS - t0)) s"
    failed+=("$name")
  fi
}

check ruff "$PY" -m ruff check lmcache_rawblock tests
check mypy "$PY" -m mypy
check stubtest env PYTHONPATH="$PWD" "$PY" -m mypy.stubtest lmcache_rawblock._native \
  --allowlist tools/stubtest-allowlist.txt
check clang-format clang_format
check lizard function_sizes
check commits commit_messages

if [ ${#failed[@]} -gt 0 ]; then
  echo "lint: FAILED: ${failed[*]}"
  exit 1
fi
echo "lint: all checks passed"
