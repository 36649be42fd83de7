"""Write the committed input corpus of the libFuzzer targets (fuzz/corpus/<target>/).

Real checkpoint payloads and slot headers written by RawBlockCore with the geometry the
ckpt target's core uses (4 KiB blocks and headers, 64 KiB slots, 1 MiB metadata region;
device_path emptied, since the target's scratch file has another name). Deterministic.
Run from the repository root: python fuzz/make_corpus.py
"""

from __future__ import annotations

import json
import os
import struct
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from core_helpers import Obj, make_core, okey  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "corpus")


def containers(path: str) -> list[bytes]:
    out = []
    with open(path, "rb") as f:
        for off in (0, 512 << 10):
            f.seek(off)
            hdr = f.read(32)
            plen = struct.unpack("<8sIQQI", hdr)[3]
            if 0 < plen < (1 << 20):
                f.seek(off + 4096)
                out.append(hdr + f.read(plen))
    return out


def main() -> None:
    os.makedirs(f"{OUT}/ckpt", exist_ok=True)
    os.makedirs(f"{OUT}/slot_header", exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "dev.img")
        with open(path, "wb") as f:
            f.truncate(16 << 20)
        core = make_core(path, verify_payload_checksum=True)
        for n, sizes in enumerate(((100,), (5000, 65536 - 4096), (1, 2, 3))):
            keys = [okey(10 * n + i) for i in range(len(sizes))]
            objs = [Obj(bytes((i * 7 + j) & 0xFF for j in range(s)), shape=(s,)) for i, s in enumerate(sizes)]
            assert all(core.put_many(keys, objs).results)
            core.checkpoint_now()
        core.close()
        docs = []
        for c in containers(path):
            st = json.loads(c[32:])
            st["device_path"] = ""
            doc = json.dumps(st, separators=(",", ":")).encode()
            docs.append(doc)
            hdr = struct.pack("<8sIQQI", b"LMCIDX01", 1, 1, len(doc), zlib.crc32(doc) & 0xFFFFFFFF)
            docs.append(None)
            with open(f"{OUT}/ckpt/container-{len(docs)}", "wb") as f:
                f.write(b"\x03" + hdr + doc)
        docs = [d for d in docs if d]
        for i, doc in enumerate(docs):
            for mode in (0, 1, 2):
                with open(f"{OUT}/ckpt/state-{i}-mode{mode}", "wb") as f:
                    f.write(bytes([mode]) + doc)
        with open(f"{OUT}/ckpt/escapes-mode2", "wb") as f:
            f.write(b"\x02" + json.dumps({"version": 1, "device_path": "", "next_slot": 1, "entries": {
                "caf\u00e9@0x00000000@ab": {"offset": 1 << 20, "size": 1, "shape": [1], "dtype": None,
                                           "fmt": "BINARY", "cached_positions": [1, 2]}}}).encode())
        with open(path, "rb") as f:
            f.seek(1 << 20)
            for i in range(3):
                f.seek((1 << 20) + i * 65536)
                with open(f"{OUT}/slot_header/slot-{i}", "wb") as g:
                    g.write(f.read(64))
    with open(f"{OUT}/slot_header/short", "wb") as g:
        g.write(b"LMCBLK01" + bytes(16))


if __name__ == "__main__":
    main()
