#!/usr/bin/env bash
# `make test-wheel-bare`: the repaired wheel installed and smoke-tested on a Debian without any
# compiler or -dev package. A minimal root of the host's Debian release (debootstrap
# --variant=minbase plus python3, python3-venv and ca-certificates only) is built once and cached
# in CACHE_DIR; each run then checks that it holds no compiler, no -dev package and none of the
# build headers, prints which of the runtime libraries the extension links against it has (the
# wheel must not need them), mounts /proc, /sys, /dev, the wheel directory and the smoke suite
# into it (read-only for the last two), creates a virtualenv with its python3 in its /tmp, installs
# pytest from PyPI and the wheel with --no-index, and runs tests/wheel_smoke/ there; any skip fails.
# The mounts are undone on any exit. Needs root (re-runs itself under sudo otherwise).
#
#   tools/wheel_bare.sh WHEEL_DIR SMOKE_DIR STRICT_SKIPS_PY CACHE_DIR [pytest args...]
#
# WHEEL_DIR must hold a manylinux wheel whose Python tag is that of the root's python3 (cp311 on
# Debian 12); BARE_MIRROR overrides the Debian mirror (default http://deb.debian.org/debian).
set -euo pipefail

if [ "$#" -lt 4 ]; then
  echo "usage: $0 WHEEL_DIR SMOKE_DIR STRICT_SKIPS_PY CACHE_DIR [pytest args...]" >&2
  exit 2
fi
if [ "$(id -u)" != 0 ]; then
  exec sudo -E "$0" "$@"
fi
wheel_dir=$(realpath "$1") smoke_dir=$(realpath "$2") strict_skips=$(realpath "$3")
mkdir -p "$4"
cache=$(realpath "$4")
shift 4
say() { echo "test-wheel-bare: $*"; }
die() { echo "test-wheel-bare: $*" >&2; exit 1; }

. /etc/os-release
[ "${ID:-}" = debian ] && [ -n "${VERSION_CODENAME:-}" ] || die "the host is not Debian (/etc/os-release: ID=${ID:-?}); debootstrap needs a Debian release"
suite=$VERSION_CODENAME
mirror=${BARE_MIRROR:-http://deb.debian.org/debian}
include=python3,python3-venv,ca-certificates
root=$cache/$suite-minbase
stamp_text="debootstrap --variant=minbase --include=$include $suite $mirror"

# Mount points at or below a directory, deepest first (from /proc/self/mountinfo).
mounts_under() {
  awk -v d="$1" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r
}
unmount_all() {
  local m
  for m in $(mounts_under "$1"); do
    umount -R "$m" 2>/dev/null || umount -lR "$m" 2>/dev/null || true
  done
  [ -z "$(mounts_under "$1")" ]
}
# A run killed with SIGKILL leaves its mounts behind; never rm -rf or reuse a root with mounts.
unmount_all "$root" || die "cannot unmount $(mounts_under "$root" | tr '\n' ' ')under $root"
[ ! -d "$root/tmp" ] || { rm -rf "$root/tmp" && mkdir -m 1777 "$root/tmp"; }

# The cached root: rebuilt when missing, unfinished or made with other debootstrap arguments.
if [ "$(cat "$root/.wheel-bare-stamp" 2>/dev/null)" != "$stamp_text" ]; then
  command -v debootstrap >/dev/null || {
    say "installing debootstrap"
    apt-get -o DPkg::Lock::Timeout=600 update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null
  }
  say "building the root: $stamp_text (cached in $root)"
  unmount_all "$root.partial" || die "mounts left under $root.partial"
  rm -rf "$root" "$root.partial"
  debootstrap --variant=minbase --include="$include" "$suite" "$root.partial" "$mirror" \
    >"$cache/debootstrap.log" 2>&1 || { tail -30 "$cache/debootstrap.log" >&2; die "debootstrap failed (log: $cache/debootstrap.log)"; }
  echo "$stamp_text" >"$root.partial/.wheel-bare-stamp"
  mv "$root.partial" "$root"
fi

# What a bare machine of this network has besides Debian's packages: its resolver and its own
# certificate authorities (a TLS-intercepting egress proxy's, for instance), for pip's download of pytest.
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
if [ -d /usr/local/share/ca-certificates ] && ! diff -rq /usr/local/share/ca-certificates "$root/usr/local/share/ca-certificates" >/dev/null 2>&1; then
  rm -rf "$root/usr/local/share/ca-certificates"
  cp -r /usr/local/share/ca-certificates "$root/usr/local/share/ca-certificates"
  chroot "$root" /usr/sbin/update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in the root"
fi

# The root must be bare: no compiler, no -dev package, no build headers.
errors=()
for b in cc gcc c++ g++ clang tcc; do
  for d in usr/bin usr/local/bin; do [ -e "$root/$d/$b" ] && errors+=("compiler present: /$d/$b"); done
done
for h in libnvme.h liburing.h xxhash.h json-c/json.h blkid/blkid.h; do
  [ -e "$root/usr/include/$h" ] && errors+=("header present: /usr/include/$h")
done
installed=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" { print $2 }')
dev=$(echo "$installed" | grep -E -- '-dev$' || true)
[ -z "$dev" ] || errors+=("-dev packages installed: $(echo $dev)")
if [ "${#errors[@]}" -gt 0 ]; then printf 'test-wheel-bare: %s\n' "${errors[@]}" >&2; die "the root is not bare"; fi
present=() absent=()
for p in libnvme1 libjson-c5 libblkid1 libxxhash0 libdeflate0 liburing2; do
  if echo "$installed" | grep -qx "$p"; then present+=("$p"); else absent+=("$p"); fi
done
say "root $root: $(echo "$installed" | wc -l) packages, no compiler, no -dev package, no build headers"
say "runtime libraries present in the root: ${present[*]:-none}; absent: ${absent[*]:-none}"

# The wheel for the root's python3.
pytag=$(chroot "$root" /usr/bin/python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
pyver=$(chroot "$root" /usr/bin/python3 -V)
wheels=("$wheel_dir"/*manylinux*.whl)
[ -e "${wheels[0]}" ] || die "no manylinux wheel in $wheel_dir (make wheel)"
wheel=
for w in "${wheels[@]}"; do
  [ "$(basename "$w" | cut -d- -f3)" = "$pytag" ] && wheel=$w
done
[ -n "$wheel" ] || die "the root's python3 is $pyver ($pytag), the wheel in $wheel_dir is for \
$(for w in "${wheels[@]}"; do basename "$w" | cut -d- -f3; done | tr '\n' ' ')- build one for it: make wheel PYTHON=python3.${pytag#cp3}"
wheel=$(basename "$wheel")
say "$wheel on $pyver ($PRETTY_NAME minbase)"

# Mounts, undone on any exit. rslave: unmounting the recursive binds does not reach the host's.
mnt=()
cleanup() {
  local rc=$? m
  for m in "${mnt[@]}"; do umount -R "$m" 2>/dev/null || umount -lR "$m" 2>/dev/null || true; done
  if [ -n "$(mounts_under "$root")" ]; then
    echo "test-wheel-bare: mounts left under $root: $(mounts_under "$root" | tr '\n' ' ')" >&2
    rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
bind() {  # bind SRC DEST [OPTIONS]: DEST is unmounted on exit
  mnt=("$2" "${mnt[@]}")
  mount "${@:3}" "$1" "$2"
}
for fs in proc sys dev; do
  bind "/$fs" "$root/$fs" --rbind --make-rslave
done
mkdir -p "$root/mnt/wheels" "$root/mnt/smoke"
touch "$root/mnt/strict_skips.py"
bind "$wheel_dir" "$root/mnt/wheels" --bind -o ro
bind "$smoke_dir" "$root/mnt/smoke" --bind -o ro
bind "$strict_skips" "$root/mnt/strict_skips.py" --bind -o ro

# Inside the root, with a clean environment (none of the host's pip settings): a virtualenv of
# Debian's python3 in a temporary directory, pytest from PyPI, the wheel from /mnt/wheels alone.
# RB_SOURCE_TREE=/mnt: nothing under the mounted project files may be on sys.path.
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
  PIP_DISABLE_PIP_VERSION_CHECK=1 /bin/sh -euc '
  if command -v cc || command -v gcc; then echo "test-wheel-bare: a compiler is on PATH" >&2; exit 1; fi
  tmp=$(mktemp -d /tmp/wheel-bare.XXXXXX)
  trap "rm -rf $tmp" EXIT
  python3 -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install -q "pytest>=7"
  "$tmp/venv/bin/python" -m pip install -q --no-index --find-links /mnt/wheels lmcache-rawblock
  mkdir "$tmp/smoke" && cp /mnt/smoke/*.py /mnt/strict_skips.py "$tmp/smoke/"
  printf "[pytest]\n" >"$tmp/pytest.ini" && cd "$tmp"
  echo "test-wheel-bare: $(venv/bin/python -m pip list 2>/dev/null | grep -i "^lmcache-rawblock") in $(venv/bin/python -V) at $tmp/venv (inside the root)"
  PYTHONPATH="$tmp/smoke" RB_SOURCE_TREE=/mnt venv/bin/python -m pytest -q -p no:cacheprovider -p strict_skips smoke "$@"
' wheel-bare "$@"
