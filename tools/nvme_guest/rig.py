#!/usr/bin/env python3
"""Emulated NVMe rig: boot a QEMU/TCG guest with an FDP-enabled NVMe namespace and run
commands from this checkout inside it (the host has no NVMe device and no kernel modules).

What it does, all cached under <checkout>/build/nvme-guest/ (a second run downloads nothing):
  1. QEMU with FDP emulation (`-device nvme-subsys,help` lists `fdp`). Debian 12's qemu 7.2
     has none: qemu-system-x86 is installed from bookworm-backports through a private apt
     configuration (build/nvme-guest/apt/host-qemu/; /etc/apt is left unchanged). On Debian 13
     and later the distribution's qemu-system-x86 is installed with the system's apt sources.
  2. A Debian kernel and busybox-static, fetched with `apt-get download` (never installed)
     through a private apt configuration per suite, unpacked with dpkg-deb -x. The kernel is
     the one the suite's `linux-image-amd64` points at, unless --kernel-package names one.
  3. An initramfs (busybox cpio, gzip) holding busybox, the NVMe + virtio + 9p modules with
     their dependencies resolved from the modules' own .modinfo (depends=, softdep=, crypto
     aliases), decompressed on the host when shipped as .ko.xz/.ko.zst, and ./init.
  4. Per run: a fresh sparse namespace backing file, a writable run directory shared over 9p
     (commands in, exit codes out), the host root shared read-only over 9p; the guest mounts
     it at /host, binds proc/sys/dev, puts tmpfs on /host/run (TMPDIR) and /host/tmp, chroots
     into /host and runs the commands in the checkout. The first non-zero exit code is the
     rig's exit code.

Exit status: that of the commands; 1 on a rig failure or timeout; 0 with a "SKIP: <reason>"
line only when the guest cannot be started at all (packages needed and the Debian mirror
unreachable, with nothing cached).
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import json
import lzma
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "nvme-guest"

# Modules the guest needs; their dependencies are resolved from the kernel's modules.
ROOT_MODULES = ["nvme", "virtio_pci", "9pnet_virtio", "9p"]
NS_HANDLES = 16  # reclaim unit handles: fdp.nruh, fdp.ruhs=0-15
LBA = 4096

CTRL, BLOCK, CHAR = "/dev/nvme0", "/dev/nvme0n1", "/dev/ng0n1"
CTRL0_SERIAL = "deadbeef"
ANSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[()][0-9A-Za-z]|[A-Za-z])")


def uptime() -> float:
    """Seconds since host boot (the wall clock of the machine may drift)."""
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def log(msg: str) -> None:
    print(f"nvme-rig: {msg}", flush=True)


class Skip(Exception):
    """The guest cannot be started on this machine (reason in the message)."""


class RigError(Exception):
    pass


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if r.returncode != 0:
        raise RigError(f"{shlex.join(cmd)} failed ({r.returncode}):\n{(r.stdout + r.stderr).strip()[-3000:]}")
    return r


# ---------------------------------------------------------------- distribution, mirror, apt


def os_release() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            k, sep, v = line.partition("=")
            if sep:
                out[k] = v.strip().strip('"')
    except OSError:
        pass
    return out


def debian_mirror() -> str:
    """The Debian archive the system's apt sources use (RB_DEBIAN_MIRROR overrides)."""
    env = os.environ.get("RB_DEBIAN_MIRROR")
    if env:
        return env.rstrip("/")
    files = [Path("/etc/apt/sources.list")] + sorted(Path("/etc/apt/sources.list.d").glob("*"))
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        for m in re.finditer(r"(?:^deb\s+(?:\[[^]]*\]\s+)?|^URIs:\s*)(\S+)", text, re.M):
            uri = m.group(1).rstrip("/")
            if uri.endswith("/debian"):
                return uri
    return "http://deb.debian.org/debian"


def mirror_reachable(mirror: str, suite: str) -> str | None:
    """None if the mirror answers for the suite, else why not."""
    url = f"{mirror}/dists/{suite}/InRelease"
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            r.read(64)
        return None
    except (urllib.error.URLError, OSError) as e:
        return f"{url}: {e}"


def sudo() -> list[str]:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo"):
        return ["sudo", "-n"]
    raise RigError("installing QEMU needs root (or sudo)")


class PrivateApt:
    """An apt configuration of its own (sources, lists, cache) under build/nvme-guest/apt/."""

    def __init__(self, name: str, lines: list[str], host_status: bool = False):
        self.dir = CACHE / "apt" / name
        self.lines = lines
        self.opts = [
            "-o", f"Dir::Etc::sourcelist={self.dir / 'sources.list'}",
            "-o", "Dir::Etc::sourceparts=/nonexistent",
            "-o", f"Dir::State::Lists={self.dir / 'lists'}",
            "-o", f"Dir::Cache={self.dir / 'cache'}",
            "-o", "APT::Sandbox::User=root",
        ]
        if not host_status:  # downloads only: the host's installed packages do not matter
            self.opts += ["-o", "Dir::State::status=/dev/null"]
        self.updated = False

    def update(self) -> None:
        if self.updated:
            return
        (self.dir / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (self.dir / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (self.dir / "sources.list").write_text("".join(line + "\n" for line in self.lines))
        run(["apt-get", *self.opts, "-q", "update"])
        self.updated = True

    def cmd(self, tool: str, *args: str) -> list[str]:
        return [tool, *self.opts, *args]


def suite_sources(mirror: str, suite: str) -> list[str]:
    kr = "[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
    base = suite.split("-")[0]
    lines = [f"deb {kr} {mirror} {base} main"]
    if suite != base:
        lines.append(f"deb {kr} {mirror} {suite} main")
    else:  # a release: its current kernel is in -updates / -security
        sec = re.sub(r"/debian$", "/debian-security", mirror)
        lines += [f"deb {kr} {mirror} {base}-updates main", f"deb {kr} {sec} {base}-security main"]
    return lines


# ---------------------------------------------------------------- QEMU


def qemu_has_fdp(qemu: str | None) -> bool:
    if not qemu:
        return False
    try:
        r = subprocess.run([qemu, "-device", "nvme-subsys,help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return re.search(r"^\s*fdp\b", r.stdout, re.M) is not None


def ensure_qemu(mirror: str, codename: str) -> str:
    qemu = shutil.which("qemu-system-x86_64")
    if qemu_has_fdp(qemu):
        return qemu
    why = "qemu-system-x86_64 is not installed" if not qemu else f"{qemu} has no FDP emulation"
    if codename == "bookworm":
        suite = "bookworm-backports"
        kr = "[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
        sec = re.sub(r"/debian$", "/debian-security", mirror)
        apt = PrivateApt("host-qemu", [
            f"deb {kr} {mirror} bookworm main",
            f"deb {kr} {mirror} bookworm-updates main",
            f"deb {kr} {sec} bookworm-security main",
            f"deb {kr} {mirror} bookworm-backports main",
        ], host_status=True)
    else:
        suite, apt = codename, None
    unreachable = mirror_reachable(mirror, suite)
    if unreachable:
        raise Skip(f"{why}, and the Debian mirror cannot be reached to install one ({unreachable})")
    log(f"{why}: installing qemu-system-x86 from {suite}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # up to 10 minutes for the dpkg lock (a fresh VM's unattended upgrades hold it)
    lock = ["-o", "DPkg::Lock::Timeout=600"]
    install = [*lock, "install", "-y", "-q", "--no-install-recommends"]
    if apt:
        apt.update()
        run(sudo() + apt.cmd("apt-get", *install, "-t", suite, "qemu-system-x86"), env=env)
    else:
        run(sudo() + ["apt-get", *lock, "-q", "update"], env=env)
        run(sudo() + ["apt-get", *install, "qemu-system-x86"], env=env)
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu_has_fdp(qemu):
        raise RigError(f"qemu-system-x86 from {suite} installed, but {qemu} still lists no FDP for nvme-subsys")
    return qemu


# ---------------------------------------------------------------- kernel, busybox, modules


def read_modinfo(data: bytes) -> list[tuple[str, str]]:
    """key=value pairs of an ELF64 kernel module's .modinfo section."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise RigError("not an ELF64 kernel module")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = secs[shstrndx][4]
    for name_off, _t, _f, _a, off, size in secs:
        end = data.index(b"\0", strtab + name_off)
        if data[strtab + name_off:end] == b".modinfo":
            out = []
            for item in data[off:off + size].split(b"\0"):
                k, sep, v = item.decode("utf-8", "replace").partition("=")
                if sep:
                    out.append((k, v))
            return out
    return []


def module_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(raw)
    if path.name.endswith(".ko.zst"):
        if not shutil.which("zstd"):
            raise RigError(f"{path.name} is zstd-compressed and zstd is not installed (apt-get install zstd)")
        return subprocess.run(["zstd", "-dc"], input=raw, capture_output=True, check=True).stdout
    if path.name.endswith(".ko.gz"):
        return gzip.decompress(raw)
    return raw


def mod_key(name: str) -> str:
    return name.replace("-", "_")


def mod_name(path: Path) -> str:
    return re.sub(r"\.ko(\.(xz|zst|gz))?$", "", path.name)


def resolve_modules(moddir: Path) -> list[tuple[str, bytes]]:
    """The modules to insmod, in load order, each with its uncompressed image.

    Dependencies come from each module's `depends=`; `softdep=pre:` names and the crypto
    algorithm a library module requests by its own name (crc64-rocksoft asks the crypto API
    for "crc64-rocksoft", served by crc64_rocksoft_generic) are resolved through the aliases of
    the generic implementations under kernel/crypto/. Built-in modules are skipped."""
    files = {mod_key(mod_name(p)): p for p in moddir.rglob("*.ko*") if re.search(r"\.ko(\.(xz|zst|gz))?$", p.name)}
    builtin: set[str] = set()
    bf = moddir / "modules.builtin"
    if bf.exists():
        builtin = {mod_key(mod_name(Path(line.strip()))) for line in bf.read_text().splitlines() if line.strip()}
    aliases: dict[str, list[str]] = {}
    for key, p in files.items():
        if "/kernel/crypto/" in str(p):
            for k, v in read_modinfo(module_bytes(p)):
                if k == "alias":
                    aliases.setdefault(v, []).append(key)

    def providers(name: str, exclude: str) -> list[str]:
        cands = [m for m in aliases.get("crypto-" + name, []) + aliases.get(name, []) if m != exclude]
        generic = [m for m in cands if m.endswith("_generic")]
        return sorted(set(generic or cands))

    order: list[tuple[str, bytes]] = []
    state: dict[str, str] = {}

    def visit(name: str, required: bool) -> None:
        key = mod_key(name)
        if state.get(key) or key in builtin:
            return
        if key not in files:
            if required:
                raise RigError(f"module {name} is neither in {moddir} nor built in")
            return
        state[key] = "visiting"
        data = module_bytes(files[key])
        info = read_modinfo(data)
        for k, v in info:
            if k == "depends":
                for dep in filter(None, v.split(",")):
                    visit(dep, True)
            elif k == "softdep":
                pre = re.search(r"pre:\s*(.*?)(?:\s+post:|$)", v)
                for soft in (pre.group(1).split() if pre else []):
                    if mod_key(soft) in files:
                        visit(soft, False)
                    for prov in providers(soft, key):
                        visit(prov, False)
        for prov in providers(mod_name(files[key]), key):
            visit(prov, False)
        state[key] = "done"
        order.append((mod_name(files[key]), data))

    for root in ROOT_MODULES:
        visit(root, True)
    return order


INIT = r"""#!/bin/busybox sh
# Guest init: modules, devices, the host root over 9p, then the run's commands in a chroot.
/bin/busybox mkdir -p /proc /sys /dev /host /rig /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "rb-guest: kernel $(uname -r)"
while read m; do insmod /lib/modules/$m.ko || echo "rb-guest: insmod $m failed"; done < /modules.list
i=0
while [ ! -e /dev/nvme0n1 ] || [ ! -e /dev/ng0n1 ] || [ ! -e /dev/nvme0 ]; do
  i=$((i + 1)); [ $i -gt 300 ] && { echo "rb-guest: no NVMe devices after 30 s"; break; }; sleep 0.1
done
fail() { echo "rb-guest: $*"; echo "rb-guest: exit 125"; poweroff -f; sleep 5; exit 1; }
mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,ro,cache=loose host /host || fail "mount of the host root failed"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 rig /rig || fail "mount of the run directory failed"
mount --bind /proc /host/proc && mount --bind /sys /host/sys && mount --rbind /dev /host/dev || fail "bind mounts failed"
mount -t tmpfs -o mode=1777 tmpfs /host/run || fail "tmpfs on /run failed"
mkdir -p /host/run/rig /host/run/tmp && chmod 1777 /host/run/tmp && mount --bind /rig /host/run/rig || fail "run directory bind failed"
grep -q 'rb.tmpfs_tmp=1' /proc/cmdline && { mount -t tmpfs -o mode=1777 tmpfs /host/tmp || fail "tmpfs on /tmp failed"; }
echo "rb-guest: ready"
chroot /host /bin/sh /run/rig/guest.sh
echo "rb-guest: exit $?"
sync
poweroff -f
"""


def apt_download(apt: PrivateApt, dest: Path, pkgs: list[str]) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.deb"))
    run(apt.cmd("apt-get", "-q", "download", *pkgs), cwd=dest)
    return sorted(set(dest.glob("*.deb")) - before) or sorted(dest.glob("*.deb"))


def depends_of(apt: PrivateApt, pkg: str) -> list[str]:
    out = run(apt.cmd("apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-enhances", pkg)).stdout
    return re.findall(r"^\s*\|?(?:Pre)?Depends:\s*(\S+)", out, re.M)


def pick_kernel(apt: PrivateApt, suite: str) -> str:
    """The versioned image the suite's linux-image-amd64 depends on."""
    deps = [d for d in depends_of(apt, "linux-image-amd64") if re.match(r"linux-image-\d", d)]
    if not deps:
        raise RigError(f"linux-image-amd64 in {suite} depends on no versioned linux-image package")
    return deps[0]


class Guest:
    """Kernel image + initramfs for one kernel package, cached in build/nvme-guest/kernels/."""

    def __init__(self, suite: str, package: str | None, mirror: str, refresh: bool):
        self.suite, self.mirror, self.refresh = suite, mirror, refresh
        self.apt = PrivateApt(f"guest-{suite}", suite_sources(mirror, suite))
        if "-" in suite:  # backports: prefer the suite's kernel over the release's (a release keeps
            self.apt.opts += ["-o", f"APT::Default-Release={suite}"]  # -updates/-security candidates)
        self.pick_file = CACHE / "kernels" / f"{suite}.package"
        self.package = package

    def _ensure_lists(self) -> None:
        unreachable = mirror_reachable(self.mirror, self.suite)
        if unreachable:
            raise Skip(f"guest kernel not cached and the Debian mirror cannot be reached ({unreachable})")
        self.apt.update()

    def prepare(self) -> tuple[Path, Path, str]:
        """(vmlinuz, initrd, kernel release). Kept: the .debs, vmlinuz, initrd; the unpacked
        tree only while the initramfs is built."""
        if not self.package:
            if self.pick_file.exists() and not self.refresh:
                self.package = self.pick_file.read_text().strip()
            else:
                self._ensure_lists()
                self.package = pick_kernel(self.apt, self.suite)
                self.pick_file.parent.mkdir(parents=True, exist_ok=True)
                if self.pick_file.exists() and self.pick_file.read_text().strip() != self.package:
                    shutil.rmtree(CACHE / "kernels" / self.pick_file.read_text().strip(), ignore_errors=True)
                self.pick_file.write_text(self.package + "\n")
        kdir = CACHE / "kernels" / self.package
        vmlinuz, initrd, done = kdir / "vmlinuz", kdir / "initrd.cpio.gz", kdir / "ready"
        key = hashlib.sha256((INIT + " ".join(ROOT_MODULES)).encode()).hexdigest()
        if done.exists() and done.read_text().split()[1:] == [key] and vmlinuz.exists() and initrd.exists():
            return vmlinuz, initrd, done.read_text().split()[0]
        debs, tree = kdir / "debs", kdir / "root"
        if not (debs / "complete").exists():
            self._ensure_lists()
            shutil.rmtree(debs, ignore_errors=True)
            abi = self.package.removeprefix("linux-image-")
            # Newer Debian kernels split the image package into linux-binary-* / linux-modules-*.
            extra = [d for d in depends_of(self.apt, self.package) if d.startswith("linux-") and abi in d]
            log(f"downloading {' '.join([self.package, *extra])} busybox-static ({self.suite})")
            apt_download(self.apt, debs, [self.package, *extra, "busybox-static"])
            (debs / "complete").write_text("")
        shutil.rmtree(tree, ignore_errors=True)
        for deb in sorted(debs.glob("*.deb")):
            run(["dpkg-deb", "-x", str(deb), str(tree)])
        # /boot/vmlinuz-<kver>, or (kernels split into linux-binary-*) /usr/lib/modules/<kver>/vmlinuz
        found = [(p, p.name.removeprefix("vmlinuz-")) for p in sorted((tree / "boot").glob("vmlinuz-*"))]
        found += [(p, p.parent.name) for lib in ("lib", "usr/lib") for p in sorted((tree / lib / "modules").glob("*/vmlinuz"))]
        if not found:
            raise RigError(f"no vmlinuz in {self.package} (looked in /boot and /usr/lib/modules/*)")
        image, kver = found[0]
        moddir = next((d for d in (tree / "lib/modules" / kver, tree / "usr/lib/modules" / kver) if d.is_dir()), None)
        if moddir is None:
            raise RigError(f"no modules directory for {kver} in {self.package}")
        busybox = next((p for p in (tree / "bin/busybox", tree / "usr/bin/busybox") if p.exists()), None)
        if busybox is None:
            raise RigError("busybox-static unpacked, but no busybox binary found")
        self._build_initrd(busybox, moddir, kdir)
        shutil.copyfile(image, vmlinuz)
        shutil.rmtree(tree)
        done.write_text(f"{kver} {key}\n")
        return vmlinuz, initrd, kver

    @staticmethod
    def _build_initrd(busybox: Path, moddir: Path, kdir: Path) -> None:
        mods = resolve_modules(moddir)
        log("initramfs modules: " + " ".join(n for n, _ in mods))
        stage = kdir / "initramfs"
        shutil.rmtree(stage, ignore_errors=True)
        (stage / "bin").mkdir(parents=True)
        (stage / "lib" / "modules").mkdir(parents=True)
        shutil.copy2(busybox, stage / "bin" / "busybox")
        for name, data in mods:
            (stage / "lib" / "modules" / f"{name}.ko").write_bytes(data)
        (stage / "modules.list").write_text("".join(n + "\n" for n, _ in mods))
        (stage / "init").write_text(INIT)
        (stage / "init").chmod(0o755)
        names = sorted(str(p.relative_to(stage)) for p in stage.rglob("*"))
        cpio = subprocess.run([str(busybox), "cpio", "-o", "-H", "newc"], cwd=stage,
                              input=("\n".join(names) + "\n").encode(), capture_output=True)
        if cpio.returncode != 0:
            raise RigError(f"busybox cpio failed: {cpio.stderr.decode(errors='replace')}")
        tmp = kdir / "initrd.cpio.gz.tmp"
        with gzip.open(tmp, "wb", compresslevel=6) as f:
            f.write(cpio.stdout)
        tmp.rename(kdir / "initrd.cpio.gz")
        shutil.rmtree(stage)


# ---------------------------------------------------------------- several controllers, hot-plug
#
# With --nvme-count N > 1 the guest gets N - 1 more controllers (ctrl1..), each a plain NVMe
# controller with namespace 1 over its own sparse file (no FDP), on the pc machine's PCI bus,
# where QEMU's ACPI hot-plug lets a guest remove and add them. The guest asks through files in
# the run directory (/run/rig/hotplug in the guest): it writes <id>.req ("del K" or "add K"),
# the host's HotPlug thread runs the QMP command and writes <id>.resp ("ok" or "error: ...").
# device_del answers once QEMU reports DEVICE_DELETED (the guest's kernel let go of it);
# device_add puts the controller back with the same backing file (its data as it was).


def extra_serial(k: int) -> str:
    return CTRL0_SERIAL if k == 0 else f"rbnvme{k}"


def extra_device_args(k: int, img: Path) -> tuple[dict, dict]:
    """(blockdev-add, device_add) arguments of extra controller k (k >= 1)."""
    node = {"driver": "file", "filename": str(img), "node-name": f"nvm{k}", "discard": "unmap"}
    dev = {"driver": "nvme", "id": f"ctrl{k}", "serial": extra_serial(k), "drive": f"nvm{k}",
           "logical_block_size": LBA, "physical_block_size": LBA}
    return node, dev


def qemu_opts(d: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in d.items())


class HotPlug:
    """Serves the guest's hot-plug requests over QEMU's QMP socket."""

    def __init__(self, rundir: Path, sock: Path, count: int, devices: dict[int, dict]) -> None:
        self.dir = rundir / "hotplug"
        self.dir.mkdir()
        self.sock, self.count, self.devices = sock, count, devices
        self.stop = threading.Event()
        self.f = None
        self.events: list[dict] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    def _connect(self) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(self.sock))
        except OSError:
            s.close()
            return False
        self.f = s.makefile("rw", encoding="utf-8")
        self._read()  # greeting
        self.qmp("qmp_capabilities")
        return True

    def _read(self) -> dict:
        assert self.f is not None
        line = self.f.readline()
        if not line:
            raise RigError("QMP connection closed")
        return json.loads(line)

    def qmp(self, cmd: str, **arguments) -> dict:
        assert self.f is not None
        self.f.write(json.dumps({"execute": cmd, "arguments": arguments}) + "\n")
        self.f.flush()
        while True:
            msg = self._read()
            if "event" in msg:
                self.events.append(msg)
            elif "error" in msg:
                raise RigError(f"QMP {cmd}: {msg['error'].get('desc', msg['error'])}")
            elif "return" in msg:
                return msg["return"]

    def _wait_deleted(self, dev_id: str, timeout: float) -> None:
        end = uptime() + timeout
        while uptime() < end:
            if any(e.get("event") == "DEVICE_DELETED" and e.get("data", {}).get("device") == dev_id
                   for e in self.events):
                return
            self.qmp("query-status")  # collects the events that arrived meanwhile
            time.sleep(0.2)
        raise RigError(f"device_del {dev_id}: no DEVICE_DELETED within {timeout:.0f} s "
                       "(the guest did not release the controller)")

    def handle(self, text: str) -> str:
        op, _, arg = text.strip().partition(" ")
        try:
            k = int(arg)
        except ValueError:
            return f"error: bad request {text.strip()!r} (want 'del K' or 'add K')"
        if k not in self.devices:
            return f"error: controller {k} cannot be hot-plugged (1..{self.count - 1} can)"
        dev = self.devices[k]
        if op == "del":
            self.events = [e for e in self.events if e.get("data", {}).get("device") != dev["id"]]
            self.qmp("device_del", id=dev["id"])
            self._wait_deleted(dev["id"], 120)
        elif op == "add":
            self.qmp("device_add", **dev)
        else:
            return f"error: unknown operation {op!r} (want del or add)"
        log(f"hot-plug: {op} ctrl{k} done")
        return "ok"

    def _serve(self) -> None:
        while not self.stop.is_set() and self.f is None:
            if not self._connect():
                time.sleep(0.2)
        while not self.stop.is_set():
            for req in sorted(self.dir.glob("*.req")):
                text = req.read_text()
                req.unlink()
                try:
                    out = self.handle(text)
                except (RigError, OSError) as e:
                    out = f"error: {e}"
                tmp = req.with_suffix(".tmp")
                tmp.write_text(out + "\n")
                tmp.rename(req.with_suffix(".resp"))
            time.sleep(0.1)


GUEST_DEVICE_MAP = r"""# Controller k's device nodes, found by its serial (probe order names them).
rb_nvme_find() {
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat $c/serial 2>/dev/null | tr -d ' ')" = "$1" ] || continue
    n=${c##*/}; b=$(ls -d $c/nvme*n1 2>/dev/null | head -1); b=${b##*/}
    # in a subsystem with several controllers the path is hidden (nvmeScCn1): the disk is nvmeSn1
    echo "/dev/$n /dev/$(echo "$b" | sed 's/c[0-9]*n/n/') /dev/ng${n#nvme}n1"; return 0
  done
  return 1
}
"""


def guest_device_lines(count: int) -> list[str]:
    """Shell lines (in guest.sh) waiting for the extra controllers and exporting their paths."""
    if count <= 1:
        return []
    lines = GUEST_DEVICE_MAP.splitlines()
    for k in range(count):
        lines += [
            "i=0",
            f"until set -- $(rb_nvme_find {extra_serial(k)}) && [ -e \"$2\" ] && [ -e \"$3\" ]; do",
            f"  i=$((i + 1)); [ $i -gt 300 ] && {{ echo \"rb-guest: controller {k} missing after 30 s\"; exit 125; }}; sleep 0.1",
            "done",
            f"export RB_NVME_CTRL_{k}=$1 RB_NVME_BLOCK_{k}=$2 RB_NVME_CHAR_{k}=$3",
        ]
    # controllers probe in parallel, so controller 0 need not be nvme0
    lines.append("export RB_NVME_CTRL=$RB_NVME_CTRL_0 RB_NVME_BLOCK=$RB_NVME_BLOCK_0 RB_NVME_CHAR=$RB_NVME_CHAR_0")
    return lines



# ---------------------------------------------------------------- one boot


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMGT]?)(i?B)?", text.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2).upper()]


def guest_python(python: str) -> str:
    """The interpreter's real path (a pyenv shim is a shell script that needs pyenv)."""
    r = run([python, "-c", "import sys; print(sys.executable)"])
    return r.stdout.strip()


def write_guest_script(rundir: Path, commands: list[str], env: dict[str, str], count: int = 1) -> None:
    lines = ["# Runs inside the guest, chrooted into the host root: the rig's commands in order.",
             "for v in $(env | sed -n 's/^\\([A-Za-z_][A-Za-z0-9_]*\\)=.*/\\1/p'); do",
             "  case $v in PWD|OLDPWD|SHLVL) ;; *) unset $v ;; esac; done"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += guest_device_lines(count)
    lines += [f"cd {shlex.quote(str(REPO))} || exit 125", "status=0"]
    for i, cmd in enumerate(commands, 1):
        (rundir / f"cmd.{i}.sh").write_text(cmd + "\n")
        lines += [
            f"echo \"rb-guest: command {i}: $(cat /run/rig/cmd.{i}.sh)\"",
            "t0=$(cut -d' ' -f1 /proc/uptime)",
            f"sh /run/rig/cmd.{i}.sh",
            "rc=$?",
            f"echo \"rb-guest: command {i} exit $rc after $(awk -v t0=$t0 '{{printf \"%.1f\", $1 - t0}}' /proc/uptime) s\"",
            f"echo $rc > /run/rig/rc.{i}",
            '[ "$status" = 0 ] && status=$rc',
        ]
    lines += ["echo $status > /run/rig/rc", "exit $status"]
    (rundir / "guest.sh").write_text("\n".join(lines) + "\n")


def boot(args, qemu: str, vmlinuz: Path, initrd: Path, kver: str, commands: list[str]) -> int:
    runs = CACHE / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for old in runs.iterdir():  # failed runs are kept for their console log: for a day
        if old.name.isdigit() and not Path(f"/proc/{old.name}").exists() \
                and os.stat(old).st_mtime < time.time() - 86400:
            shutil.rmtree(old, ignore_errors=True)
    rundir = runs / f"{os.getpid()}"
    shutil.rmtree(rundir, ignore_errors=True)
    rundir.mkdir()
    img = rundir / "nvme.img"
    with open(img, "wb") as f:
        f.truncate(args.ns_size)
    runs_size = max(1 << 20, (args.ns_size // NS_HANDLES) >> 20 << 20)  # 16 RUs fill the namespace
    env = {
        "PATH": f"{Path(args.guest_python).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "TMPDIR": "/run/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PY_COLORS": "0",
        "RB_NVME_GUEST": "1",
        "RB_NVME_CTRL": CTRL,
        "RB_NVME_BLOCK": BLOCK,
        "RB_NVME_CHAR": CHAR,
        "RB_NVME_SIZE": str(args.ns_size),
        "RB_NVME_LBA": str(LBA),
        "RB_NVME_RUHS": str(NS_HANDLES),
        "RB_NVME_RU_SIZE": str(runs_size),
        "RB_NVME_KERNEL": kver,
    }
    for k in ("RB_ALLOWED_SKIPS",):
        if k in os.environ:
            env[k] = os.environ[k]
    for kv in args.env:
        k, _, v = kv.partition("=")
        env[k] = v
    trace = []
    if args.trace:  # the controller's side of the commands, readable in the guest while it runs
        (rundir / "qemu-trace.log").touch()
        trace = [a for pat in args.trace for a in ("-trace", f"enable={pat},file={rundir / 'qemu-trace.log'}")]
        env["RB_NVME_TRACE"] = "/run/rig/qemu-trace.log"
    if args.nvme_count > 1:
        env["RB_NVME_COUNT"] = str(args.nvme_count)
        env["RB_NVME_HOTPLUG"] = "/run/rig/hotplug"
    write_guest_script(rundir, commands, env, args.nvme_count)
    extra, hotplug_devices = [], {}
    for k in range(1, args.nvme_count):
        kimg = rundir / f"nvme{k}.img"
        with open(kimg, "wb") as f:
            f.truncate(args.ns_size)
        node, dev = extra_device_args(k, kimg)
        extra += ["-blockdev", qemu_opts(node), "-device", qemu_opts(dev)]
        hotplug_devices[k] = dev
    hotplug = None
    if hotplug_devices:
        sock = rundir / "qmp.sock"
        extra += ["-qmp", f"unix:{sock},server=on,wait=off"]
        hotplug = HotPlug(rundir, sock, args.nvme_count, hotplug_devices)
    tmpfs_tmp = not (str(REPO) + "/").startswith("/tmp/")  # a checkout under /tmp stays visible
    cmdline = "console=ttyS0 quiet panic=-1" + (" rb.tmpfs_tmp=1" if tmpfs_tmp else "")
    qcmd = [
        qemu, "-accel", "tcg", "-m", str(args.mem), "-smp", str(args.smp), "-nographic", "-no-reboot",
        "-kernel", str(vmlinuz), "-initrd", str(initrd), "-append", cmdline,
        # discard=unmap: a Dataset Management deallocate (or a discard) punches a hole in the
        # backing file. QEMU's default (ignore) completes the command and keeps the data, so a
        # read would not return the zeros the namespace promises (Identify Namespace DLFEAT 1).
        "-drive", f"file={img},if=none,id=nvm,format=raw,discard=unmap",
        "-device", f"nvme-subsys,id=subsys0,nqn=subsys0,fdp=on,fdp.runs={runs_size >> 20}M,fdp.nrg=1,fdp.nruh={NS_HANDLES}",
        "-device", f"nvme,id=ctrl0,serial={CTRL0_SERIAL},subsys=subsys0",
        "-device", f"nvme-ns,drive=nvm,nsid=1,logical_block_size={LBA},physical_block_size={LBA},fdp.ruhs=0-{NS_HANDLES - 1}",
        "-nic", "none",
        "-virtfs", "local,path=/,mount_tag=host,security_model=passthrough,readonly=on,multidevs=remap",
        "-virtfs", f"local,path={rundir},mount_tag=rig,security_model=passthrough",
        *extra,
        *trace,
        *args.qemu_arg,
    ]
    more = f"; {args.nvme_count - 1} more controller(s), hot-pluggable" if args.nvme_count > 1 else ""
    log(f"booting {kver} ({args.ns_size >> 20} MiB namespace, FDP: {NS_HANDLES} handles, "
        f"reclaim unit {runs_size >> 20} MiB{more}); timeout {args.timeout} s")
    console = open(rundir / "console.log", "w")
    t0 = uptime()
    proc = subprocess.Popen(qcmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def reader() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\r\n").replace("\r", "")
            lines.put(ANSI.sub("", text))  # firmware screen resets and colours
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    if hotplug:
        hotplug.start()
    t_ready = t_exit = None
    marker_rc = None
    timed_out = False
    while True:
        left = t0 + args.timeout - uptime()
        if t_ready is None:
            left = min(left, t0 + args.boot_timeout - uptime())
        try:
            line = lines.get(timeout=max(0.1, min(left, 5)))
        except queue.Empty:
            if left <= 0:
                timed_out = True
                break
            continue
        if line is None:
            break
        console.write(line + "\n")
        print(line, flush=True)
        if t_ready is None and line.startswith("rb-guest: ready"):
            t_ready = uptime()
            log(f"guest booted in {t_ready - t0:.1f} s")
        m = re.match(r"rb-guest: exit (\d+)", line)
        if m:
            marker_rc, t_exit = int(m.group(1)), uptime()
    if timed_out or proc.poll() is None:
        try:
            proc.wait(timeout=0 if timed_out else 60)
        except subprocess.TimeoutExpired:
            pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    console.close()
    if hotplug:
        hotplug.close()
    t_end = uptime()
    if timed_out:
        stage = "boot" if t_ready is None else "the commands"
        log(f"FAILED: timeout after {t_end - t0:.0f} s during {stage}; QEMU killed "
            f"(console: {rundir / 'console.log'})")
        return 1
    rcfile = rundir / "rc"
    rc = int(rcfile.read_text().strip()) if rcfile.exists() else marker_rc
    per = []
    for i in range(1, len(commands) + 1):
        f = rundir / f"rc.{i}"
        per.append(f.read_text().strip() if f.exists() else "not run")
    boot_s = f"{t_ready - t0:.1f} s" if t_ready else "did not finish"
    cmd_s = f"{(t_exit or t_end) - t_ready:.1f} s" if t_ready else "-"
    log(f"boot {boot_s}, commands {cmd_s}, total {t_end - t0:.1f} s (QEMU exit {proc.returncode}); "
        f"exit codes: {', '.join(per)}")
    if rc is None:
        log(f"FAILED: the guest reported no exit code (console: {rundir / 'console.log'})")
        return 1
    if rc == 0 and not args.keep:
        shutil.rmtree(rundir, ignore_errors=True)
    elif rc != 0:
        log(f"console log and run directory kept in {rundir}")
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter for the default pytest command (default: this one)")
    ap.add_argument("--cmd", action="append", default=[],
                    help="shell command to run in the guest, in the checkout; repeat for several (replaces the default pytest run)")
    ap.add_argument("--script", type=Path, help="file with one guest command per line (# comments allowed)")
    ap.add_argument("--kernel-suite", default=None,
                    help="Debian suite to take the guest kernel from (default: the host's release, e.g. bookworm; "
                         "trixie-backports gives Linux >= 6.16)")
    ap.add_argument("--kernel-package", default=None, help="a specific linux-image-* package of that suite")
    ap.add_argument("--ns-size", type=parse_size, default=1 << 30, help="namespace size (default 1G)")
    ap.add_argument("--nvme-count", type=int, default=1, metavar="N",
                    help="NVMe controllers (default 1); controllers 1..N-1 each have namespace 1 over their own "
                         "file, no FDP, and the guest can pull and put them back (RB_NVME_HOTPLUG)")
    ap.add_argument("--mem", type=int, default=2048, help="guest RAM in MiB")
    ap.add_argument("--smp", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900, help="seconds before QEMU is killed (default 900)")
    ap.add_argument("--boot-timeout", type=int, default=300, help="seconds allowed until the guest is ready")
    ap.add_argument("--qemu-arg", action="append", default=[], metavar="ARG", help="extra QEMU argument (repeatable)")
    ap.add_argument("--trace", action="append", default=[], metavar="PATTERN",
                    help="enable QEMU trace events matching PATTERN (repeatable, e.g. 'pci_nvme_dsm*'), logged to "
                         "qemu-trace.log in the run directory, which the guest reads at $RB_NVME_TRACE")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="extra environment for the guest commands")
    ap.add_argument("--refresh", action="store_true", help="pick the suite's kernel again (apt-get update)")
    ap.add_argument("--prepare-only", action="store_true", help="install/download/build, do not boot")
    ap.add_argument("--keep", action="store_true", help="keep the run directory (console log) after success")
    ap.add_argument("pytest_args", nargs="*", help="extra arguments for the default pytest command (after --)")
    args = ap.parse_args()

    t0 = uptime()
    rel = os_release()
    codename = rel.get("VERSION_CODENAME", "")
    if rel.get("ID") != "debian" and "debian" not in rel.get("ID_LIKE", ""):
        print(f"SKIP: the rig needs Debian (apt, dpkg-deb); this is {rel.get('PRETTY_NAME', 'unknown')}")
        return 0
    suite = args.kernel_suite or codename
    mirror = debian_mirror()
    args.guest_python = guest_python(args.python)
    commands = list(args.cmd)
    if args.script:
        commands += [ln for ln in args.script.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not 1 <= args.nvme_count <= 8:
        ap.error(f"--nvme-count must be 1..8, not {args.nvme_count}")
    if commands and args.pytest_args:
        ap.error("arguments after -- extend the default pytest command; with --cmd/--script put them in the command")
    if not commands:
        commands = [f"PYTHONPATH=tests:benchmarks {shlex.quote(args.guest_python)} -m pytest -m nvme tests/nvme "
                    f"-p no:cacheprovider -p strict_skips -q {shlex.join(args.pytest_args)}".rstrip()]
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        with open(CACHE / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one preparation at a time per checkout
            qemu = ensure_qemu(mirror, codename)
            vmlinuz, initrd, kver = Guest(suite, args.kernel_package, mirror, args.refresh).prepare()
        qver = run([qemu, "--version"]).stdout.splitlines()[0]
        log(f"ready in {uptime() - t0:.1f} s: {qver}; kernel {kver}; guest python {args.guest_python}")
        if args.prepare_only:
            return 0
        return boot(args, qemu, vmlinuz, initrd, kver, commands)
    except Skip as e:
        print(f"SKIP: {e}", flush=True)
        return 0
    except RigError as e:
        log(f"FAILED: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
