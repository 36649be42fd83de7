"""LMCache's "middle build error does not hang" probe, run directly in the emulated NVMe guest.

LMCache's test_uring_cmd_middle_build_error_does_not_hang runs its probe in a spawned process and
calls it hung after 10 s; under software emulation the spawned interpreter needs longer than that
just to import the test module (torch, LMCache), on the Rust wheel as on ours. This runs the same
probe function in this process for each device implementation, with the time it took, so a real
hang (a batch whose middle request failed and never completed) still shows:

    cd build/lmcache-sdist/<version> && python <checkout>/tests/nvme/lmcache_build_error_probe.py /dev/ng0n1
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time

TIMEOUT_S = 60.0  # the probe itself: a few NVMe commands


def run(impl: str, device: str) -> str | None:
    """None when the probe passed on impl's device, else what went wrong."""
    if impl == "ours":
        import lmcache_rawblock.compat as compat

        compat.install()
    else:
        sys.modules.pop("lmcache_rust_raw_block_io", None)
    # The probe imports RawBlockDevice from lmcache_rust_raw_block_io when it runs.
    probe_mod = importlib.import_module("tests.v1.storage_backend.test_raw_block_uring_cmd")
    done: list[BaseException | None] = []

    def target() -> None:
        try:
            probe_mod._run_uring_cmd_build_error_probe(device)
            done.append(None)
        except BaseException as e:  # reported below
            done.append(e)

    t0 = time.monotonic()
    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(TIMEOUT_S)
    el = time.monotonic() - t0
    if th.is_alive():
        return f"did not finish in {TIMEOUT_S:.0f} s: wait_iouring hung"
    if done[0] is not None:
        return f"failed: {done[0]!r}"
    who = "LMCache's Rust device" if impl == "rust" else "our device"
    print(f"middle build error probe: {who} passed in {el:.2f} s (results [True, False, True], "
          "the middle entry's error names the LBA alignment)", flush=True)
    return None


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "/dev/ng0n1"
    sys.path.insert(0, os.getcwd())  # the sdist root, for its tests package
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # ours
    t0 = time.monotonic()
    import lmcache  # noqa: F401  (the import the spawned process pays for)

    print(f"middle build error probe: importing LMCache took {time.monotonic() - t0:.0f} s", flush=True)
    # LMCache's device is the reference: its outcome is reported; ours must pass.
    why = run("rust", device)
    if why is not None:
        print(f"middle build error probe: LMCache's Rust device {why}", flush=True)
    why = run("ours", device)
    if why is not None:
        raise SystemExit(f"middle build error probe: our device {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
