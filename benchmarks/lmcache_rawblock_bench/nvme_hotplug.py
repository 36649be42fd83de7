"""Pull an emulated NVMe controller out of the running guest and put it back
(tools/nvme_guest/rig.py --nvme-count N): the guest writes a request file into the run
directory, the rig runs QEMU's device_del / device_add over its monitor and answers.

Controller k's device nodes are found by its serial, since the kernel names a controller that
comes back by the first free instance number."""

from __future__ import annotations

import itertools
import os
import re
import time
from pathlib import Path

_ids = itertools.count()
CTRL0_SERIAL = "deadbeef"


def count() -> int:
    return int(os.environ.get("RB_NVME_COUNT", "1"))


def serial(k: int) -> str:
    return CTRL0_SERIAL if k == 0 else f"rbnvme{k}"


def find(k: int) -> dict[str, str] | None:
    """{"ctrl", "block", "char"} of controller k, or None while the guest has no such controller."""
    for c in sorted(Path("/sys/class/nvme").glob("nvme*")):
        try:
            if (c / "serial").read_text().strip() != serial(k):
                continue
        except OSError:
            continue
        disks = sorted(p.name for p in c.glob("nvme*n1"))
        if not disks:
            return None
        block = re.sub(r"c\d+n", "n", disks[0])  # nvmeScCn1: a path of subsystem S's disk nvmeSn1
        paths = {"ctrl": f"/dev/{c.name}", "block": f"/dev/{block}", "char": f"/dev/ng{c.name[4:]}n1"}
        return paths if all(os.path.exists(p) for p in paths.values()) else None
    return None


def _wait(what: str, cond, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(f"{what} after {timeout:.0f} s")
        time.sleep(0.1)


def _request(text: str, timeout: float) -> None:
    d = Path(os.environ["RB_NVME_HOTPLUG"])
    rid = f"{os.getpid()}-{next(_ids)}"
    tmp = d / f"{rid}.part"
    tmp.write_text(text + "\n")
    tmp.rename(d / f"{rid}.req")
    resp = d / f"{rid}.resp"
    _wait(f"no answer from the rig to {text!r}", resp.exists, timeout)
    out = resp.read_text().strip()
    resp.unlink()
    if out != "ok":
        raise RuntimeError(f"hot-plug {text!r}: {out}")


def stable_path(k: int, directory: str | os.PathLike) -> str:
    """A name for controller k's block device that stays the same when it comes back under
    another node name (as /dev/disk/by-id names a real drive): a symlink, updated here."""
    paths = find(k)
    if paths is None:
        raise FileNotFoundError(f"controller {k} (serial {serial(k)}) is not in the guest")
    link = Path(directory) / f"ctrl{k}"
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_suffix(".new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(paths["block"])
    tmp.rename(link)
    return str(link)


def pull(k: int, timeout: float = 180) -> None:
    """device_del of controller k; returns once QEMU removed it and its nodes are gone."""
    _request(f"del {k}", timeout)
    _wait(f"controller {k} still present", lambda: find(k) is None, timeout)


def put_back(k: int, timeout: float = 180) -> dict[str, str]:
    """device_add of controller k over the same file; returns its (possibly renamed) nodes."""
    _request(f"add {k}", timeout)
    _wait(f"controller {k} did not come back", lambda: find(k) is not None, timeout)
    paths = find(k)
    assert paths is not None
    return paths
