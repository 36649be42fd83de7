"""Corruption fuzz: bit flips, zeroed ranges, truncation and crafted CRC-valid checkpoints
over the checkpoint containers, slot headers and payloads of a populated device, then
RawBlockCore (open + exists/load of every key, payload checksums on) and inspect/verify.

Deterministic (seeded RNG). The default run takes a few seconds; ``-m slow`` runs the long
mode (RB_FUZZ_CASES cases, default 3000). Holds: no crash, no hang, no wrong bytes (a load
that succeeds returns exactly what was put; a key never put never loads), and every entry
of the newest checkpoint that is not served again is counted in report_status().

The same for a device in the log-structured metadata format (docs/metadata-log.md): bit
flips and zeroed ranges in either superblock, the current and the older base, the live log
groups, slot headers and payloads; truncation; and crafted CRC-valid metadata (a superblock
with a field changed, the older superblock promoted over the newer, a log group appended
with hostile records: a key claiming another key's slot, a key never put, wrong sizes,
classes and checksums, frees of live slots, hostile class fragments). Holds: no crash, no
hang, open raises only a clean error and only for a device cut below one slot, every load
that succeeds returns the bytes put under that key, a key never put never loads, and
_native.read_metadata_log (the tools' reader) returns or raises a clean error. Then the
core that recovered goes on as the next writer (a put, a delete, a checkpoint) and after a
restart every load is still right and what that checkpoint made durable is there.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import zlib

import pytest

from core_helpers import Obj, make_core, okey
from helpers import REPO
from lmcache_rawblock import tools

MiB = 1 << 20
META, SLOT, HDR, BLOCK = MiB, 65536, 4096, 4096
CONTAINER = META // 2
DEV = 4 * MiB
N_FIRST, N_SECOND = 8, 4
SIZES = [1, 100, 4096, 5000, 60000, 61440, 777, 20000, 12345, 3, 40000, 9000]
# Counters that account for entries of the newest checkpoint not served again.
DROP_COUNTERS = ("recovery_dropped_entries", "recovery_lost_entries", "payload_checksum_dropped_entries",
                 "load_dropped_entries", "recovery_skipped_entries")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A device with two checkpoints: container 0 lists the first N_FIRST keys, container 1
    (the newest, written by close) all of them."""
    d = tmp_path_factory.mktemp("base")
    path = str(d / "base.img")
    with open(path, "wb") as f:
        f.truncate(DEV)
    rng = random.Random(1234)
    data = {}
    core = make_core(path, verify_payload_checksum=True, allow_foreign_device=True, meta_format="v1")
    keys = [okey(i) for i in range(N_FIRST + N_SECOND)]
    for i, k in enumerate(keys):
        data[k.encoded] = rng.randbytes(SIZES[i])
    assert all(core.put_many(keys[:N_FIRST], [Obj(data[k.encoded]) for k in keys[:N_FIRST]]).results)
    core.checkpoint_now()
    assert all(core.put_many(keys[N_FIRST:], [Obj(data[k.encoded]) for k in keys[N_FIRST:]]).results)
    core.close()
    with open(path, "rb") as f:
        image = f.read()
    states = []
    for off in (0, CONTAINER):
        _m, _v, seq, plen, _crc = struct.unpack_from("<8sIQQI", image, off)
        states.append((seq, plen, json.loads(image[off + BLOCK:off + BLOCK + plen])))
    newest = max(range(2), key=lambda i: states[i][0])
    st = states[newest][2]
    assert len(st["entries"]) == N_FIRST + N_SECOND
    return {"image": image, "data": data, "keys": {k.encoded: k for k in keys}, "states": states,
            "newest": newest, "path": path}


def regions(b) -> dict[str, list[tuple[int, int]]]:
    st = b["states"][b["newest"]][2]
    slots = [(e["offset"], e["size"]) for e in st["entries"].values()]
    out = {"container headers": [(0, 32), (CONTAINER, 32)],
           "container payloads": [(o + BLOCK, b["states"][i][1]) for i, o in enumerate((0, CONTAINER))],
           "slot headers": [(o, 40) for o, _s in slots],
           "payloads": [(o + HDR, s) for o, s in slots]}
    return out


def write_container(img: bytearray, index: int, seq: int, payload: bytes) -> None:
    off = index * CONTAINER
    struct.pack_into("<8sIQQI", img, off, b"LMCIDX01", 1, seq, len(payload), zlib.crc32(payload) & 0xFFFFFFFF)
    img[off + BLOCK:off + CONTAINER] = bytes(CONTAINER - BLOCK)
    img[off + BLOCK:off + BLOCK + len(payload)] = payload


def craft_state(rng: random.Random, st: dict) -> object:
    """One hostile but CRC-valid variation of a state v1 document."""
    st = json.loads(json.dumps(st))
    ents = st["entries"]
    names = list(ents)
    k = rng.choice(names)
    e = ents[k]
    other = ents[rng.choice(names)]
    choice = rng.randrange(16)
    if choice == 0:
        e["offset"], other["offset"] = other["offset"], e["offset"]
    elif choice == 1:
        e["offset"] += rng.choice([SLOT, -SLOT, 1, BLOCK, 1 << 40, -(1 << 20)])
    elif choice == 2:
        e["size"] = rng.choice([0, e["size"] + 1, max(1, e["size"] - 1), SLOT, 1 << 62, -5])
    elif choice == 3:
        del e[rng.choice(["offset", "size", "shape", "dtype", "fmt", "cached_positions"])]
    elif choice == 4:
        st["next_slot"] = rng.choice([0, 1, 1 << 40, -1])
    elif choice == 5:
        ents[k + "-copy"] = dict(e)
    elif choice == 6:
        e["offset"] = str(e["offset"])
    elif choice == 7:
        st["entries"] = list(ents.values())
    elif choice == 8:
        ents[k] = rng.choice([None, 5, "x", []])
    elif choice == 9:
        e["xxh3"] = rng.choice(["0" * 16, "zz", 5, "ffffffffffffffff"])
    elif choice == 10:
        e["offset"] = other["offset"]  # two keys claim one slot
    elif choice == 11:
        st[rng.choice(["block_align", "header_bytes", "slot_bytes", "meta_total_bytes"])] = rng.choice([0, 1, -1])
    elif choice == 12:
        return rng.choice([[], "x", None, 3])
    elif choice == 13:
        e["shape"] = rng.choice(["x", [1.5], [[1]], [-1], None])
    elif choice == 14:
        e["cached_positions"] = [rng.randrange(-(1 << 63), 1 << 63) for _ in range(3)]
    else:
        del st["entries"][k]
        st["entries"][k] = e  # reordered
    return st


def mutate(rng: random.Random, b, img: bytearray) -> tuple[str, int | None]:
    """Apply one corruption; returns (description, truncated length or None)."""
    kind = rng.choice(["flip", "flip", "zero", "truncate", "craft", "craft"])
    if kind == "truncate":
        n = rng.choice([rng.randrange(0, META + SLOT), rng.randrange(META + SLOT, DEV)])
        return f"truncate to {n}", n
    if kind == "craft":
        seq, _plen, st = b["states"][b["newest"]]
        doc = craft_state(rng, st)
        write_container(img, b["newest"], seq, json.dumps(doc).encode())
        return "crafted checkpoint", None
    name, spans = rng.choice(sorted(regions(b).items()))
    off, length = rng.choice(spans)
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            bit = rng.randrange(length * 8)
            img[off + bit // 8] ^= 1 << (bit % 8)
        return f"bit flips in {name} @ {off}", None
    a = rng.randrange(length)
    z = rng.randint(1, min(4096, length - a))
    img[off + a:off + a + z] = bytes(z)
    return f"zeroed {z} bytes of {name} @ {off + a}", None


def run_core_case(b, path: str, truncated: int | None, what: str) -> dict:
    try:
        core = make_core(path, verify_payload_checksum=True, allow_foreign_device=True, meta_format="v1")
    except (RuntimeError, ValueError, OSError) as e:
        # Only a device cut below the metadata region and one slot may be refused (cleanly).
        assert truncated is not None and truncated < META + SLOT, f"{what}: open failed: {e!r}"
        return {"refused": 1}
    try:
        expected = b["data"]
        keys = list(b["keys"].values())
        present = sum(core.exists_many([k.encoded for k in keys]))
        wrong = served = 0
        for k in keys:
            buf = Obj(len(expected[k.encoded]))
            ok = core.load_many_into([k.encoded], [buf])[0]
            if ok:
                served += 1
                assert buf.bytes() == expected[k.encoded], f"{what}: WRONG BYTES for {k.encoded}"
        # A key that was never put never loads (crafted copies of an entry under a new name).
        for name in [n + "-copy" for n in list(expected)[:2]]:
            assert not core.load_many_into([name], [Obj(SLOT)])[0], f"{what}: a key never put was served"
        st = core.report_status()
        missing = len(keys) - served
        # a negative counter means "not known" (e.g. the lost count of an unreadable checkpoint)
        counted = sum(max(0, int(st.get(c) or 0)) for c in DROP_COUNTERS + ("payload_checksum_failures",))
        return {"served": served, "missing": missing, "counted": counted, "present": present,
                "outcome": st.get("recovery_outcome"), "wrong": wrong}
    finally:
        core.close()


def run_tools_case(path: str, what: str) -> None:
    try:
        tools.inspect_device(path)
        tools.verify_device(path)
    except tools.NotARawBlockDevice:
        pass  # reported by the CLI as exit 2


def _cases(n: int, seed: int, tmp_path, b, *, subprocess_every: int = 0) -> dict:
    rng = random.Random(seed)
    path = b["path"]  # the checkpoints name this path: each case overwrites it
    figures = {"cases": 0, "crashes": 0, "hangs": 0, "wrong_bytes": 0, "uncounted_drops": [], "cli_runs": 0}
    for i in range(n):
        img = bytearray(b["image"])
        what, truncated = mutate(rng, b, img)
        with open(path, "wb") as f:
            f.write(img if truncated is None else img[:truncated])
        what = f"case {i} (seed {seed}): {what}"
        r = run_core_case(b, path, truncated, what)
        # A fallback to the older checkpoint is itself reported (recovery_outcome); its lost
        # count may be unknown when the newer payload is unreadable.
        if "served" in r and r["missing"] > r["counted"] and r["outcome"] == "loaded":
            figures["uncounted_drops"].append((what, r))
        # the core may have written a final checkpoint: the tools see a fresh copy
        with open(path, "wb") as f:
            f.write(img if truncated is None else img[:truncated])
        run_tools_case(path, what)
        if subprocess_every and i % subprocess_every == 0:
            for cmd in ("inspect", "verify"):
                try:
                    p = subprocess.run([sys.executable, "-m", "lmcache_rawblock", cmd, path, "--json"],
                                       capture_output=True, text=True, timeout=60)
                except subprocess.TimeoutExpired:
                    figures["hangs"] += 1
                    raise AssertionError(f"{what}: {cmd} hung")
                figures["cli_runs"] += 1
                assert p.returncode in (0, 1, 2) and "Traceback" not in p.stderr, f"{what}: {cmd}: {p.stderr}"
        figures["cases"] += 1
    return figures


def _check(figures: dict) -> None:
    # Entries of the newest checkpoint that are not served again must show in report_status()
    # (recovery drops and skips, checkpoint fallback losses, checksum drops), or recovery must
    # say it fell back to an older checkpoint.
    assert not figures["uncounted_drops"], (
        f"{len(figures['uncounted_drops'])} of {figures['cases']} cases drop entries without a "
        f"report_status() counter; first: {figures['uncounted_drops'][:3]}")


def test_corruption_fuzz_quick(tmp_path, base):
    figures = _cases(int(os.environ.get("RB_FUZZ_QUICK_CASES", "80")), 7, tmp_path, base, subprocess_every=40)
    assert figures["cases"] >= 1 and figures["cli_runs"] >= 2
    _check(figures)


@pytest.mark.slow
def test_corruption_fuzz_long(tmp_path, base):
    n = int(os.environ.get("RB_FUZZ_CASES", "3000"))
    figures = _cases(n, int(os.environ.get("RB_FUZZ_SEED", "11")), tmp_path, base, subprocess_every=25)
    print(f"\ncorruption fuzz: {figures['cases']} cases, {figures['cli_runs']} CLI runs, 0 crashes, 0 hangs, "
          f"0 wrong bytes, {len(figures['uncounted_drops'])} uncounted drops")
    _check(figures)


def test_fuzz_regressions_replay():
    """Every input under fuzz/regressions/ (a crash the libFuzzer targets once found) is
    replayed through the Python surface of the same code: the state readers via
    apply_state_json, slot headers via verify's decoder."""
    root = str(REPO / "fuzz" / "regressions")
    files = [os.path.join(dp, f) for dp, _d, fs in os.walk(root) for f in fs if not f.startswith(".")]
    if not files:
        pytest.skip("no regression inputs recorded under fuzz/regressions/ (no fuzzer crash found so far)")
    import tempfile

    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "dev.img")
        with open(path, "wb") as f:
            f.truncate(16 * MiB)
        core = make_core(path, allow_foreign_device=True, meta_format="v1")
        try:
            for fn in files:
                with open(fn, "rb") as f:
                    data = f.read()
                if "/ckpt/" in fn and data:
                    body = data[1:] if data[0] & 3 != 3 else data[1 + 32:]
                    core._native.apply_state_json(body)
                    core._native._apply_state_json_generic(body)
        finally:
            core.close()


# ---- the log-structured format -------------------------------------------------------------

SB_LEN = 256
GROUP_HDR = 48
FOLLOW_KEY = okey(99)
FOLLOW_DATA = random.Random(99).randbytes(3000)
LOG_CLEAN_ERRORS = (RuntimeError, ValueError, OSError)


def _log_core(path: str):
    return make_core(path, verify_payload_checksum=True, allow_foreign_device=True, meta_format="log")


def parse_sb(img, off: int) -> dict | None:
    """The superblock at off (docs/metadata-log.md byte layout), or None if its magic or CRC
    is wrong."""
    raw = bytes(img[off:off + SB_LEN])
    if len(raw) < SB_LEN or raw[:8] != b"RBMETA02" or zlib.crc32(raw[:252]) != struct.unpack_from("<I", raw, 252)[0]:
        return None
    q = lambda at: struct.unpack_from("<Q", raw, at)[0]  # noqa: E731
    i = lambda at: struct.unpack_from("<I", raw, at)[0]  # noqa: E731
    return {"sb_seq": q(32), "generation": q(40), "areas": [(q(112), q(120)), (q(128), q(136))],
            "base_area": i(144), "base_len": q(152), "entries": q(160), "log_seq": q(168), "next_slot": i(176),
            "ring": (q(184), q(192)), "ring_start": q(200), "start_seq": q(208), "max_slots": i(104)}


def seal_sb(img: bytearray, off: int) -> None:
    img[off + 252:off + 256] = struct.pack("<I", zlib.crc32(bytes(img[off:off + 252])))


def walk_log(img, sb: dict) -> list[tuple[int, int, int]]:
    """[(device offset, length on the device, sequence)] of the groups recovery replays."""
    ring_off, ring_len = sb["ring"]
    pos, seq, covered, out, tried_zero = sb["ring_start"], sb["start_seq"], 0, [], False
    while covered < ring_len:
        at = ring_off + pos
        hdr = bytes(img[at:at + GROUP_HDR])
        ok = (len(hdr) == GROUP_HDR and hdr[:8] == b"RBMLOG02" and struct.unpack_from("<Q", hdr, 8)[0] == sb["generation"]
              and struct.unpack_from("<Q", hdr, 16)[0] == seq)
        if not ok:
            if pos != 0 and not tried_zero:
                covered += ring_len - pos
                pos, tried_zero = 0, True
                continue
            break
        tried_zero = False
        body = struct.unpack_from("<Q", hdr, 24)[0]
        total = -(-(GROUP_HDR + body) // BLOCK) * BLOCK
        out.append((at, total, seq))
        covered += total
        pos, seq = pos + total, seq + 1
        if pos >= ring_len:
            pos = 0
    return out


def varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def rec_put(key: bytes, slot: int, size: int, cls: int, checksum: int | None = None,
            positions: list[int] | None = None) -> bytes:
    flags = (1 if checksum is not None else 0) | (2 if positions is not None else 0)
    out = b"\x01" + varint(len(key)) + key + varint(slot) + varint(size) + varint(cls) + bytes([flags])
    if checksum is not None:
        out += struct.pack("<Q", checksum)
    if positions is not None:
        out += varint(len(positions))
        prev = 0
        for p in positions:  # one run per value: zigzag delta, no repeats
            d = p - prev
            out += varint(((d << 1) ^ (d >> 63)) & ((1 << 64) - 1)) + varint(0)
            prev = p
    return out


def rec_free(slot: int) -> bytes:
    return b"\x02" + varint(slot)


def rec_class(cid: int, frag: bytes) -> bytes:
    return b"\x03" + varint(cid) + varint(len(frag)) + frag


def group(generation: int, seq: int, records: list[bytes], flags: int = 0) -> bytes:
    """A log group of raw records (flags: bits 16..31 the writer epoch, which must not be below
    the previous group's for the walk to take it)."""
    body = b"".join(records)
    hdr = bytearray(b"RBMLOG02" + struct.pack("<QQQII", generation, seq, len(body), len(records), flags))
    hdr += struct.pack("<I", zlib.crc32(bytes(hdr[:40])))
    hdr += struct.pack("<I", zlib.crc32(body, zlib.crc32(bytes(hdr[:44]))))
    g = bytes(hdr) + body
    return g + bytes(-len(g) % BLOCK)


@pytest.fixture(scope="module")
def log_base(tmp_path_factory):
    """A log-format device: a first base (keys 0-7), a group (0 and 1 deleted, 8 and 9 put), a
    compaction (the base into the other area, superblock 1 newer), then three groups: 10 and
    11 put into the slots of 0 and 1 (which the older base still lists), 2 deleted; and the end
    mark the clean close appends (a group of no records)."""
    d = tmp_path_factory.mktemp("logbase")
    path = str(d / "log.img")
    with open(path, "wb") as f:
        f.truncate(DEV)
    rng = random.Random(4321)
    keys = [okey(i) for i in range(N_FIRST + N_SECOND)]
    data = {k.encoded: rng.randbytes(SIZES[i]) for i, k in enumerate(keys)}
    core = _log_core(path)
    put = lambda ks: core.put_many(ks, [Obj(data[k.encoded]) for k in ks]).results  # noqa: E731
    assert all(put(keys[:8]))
    core.checkpoint_now()
    assert core.delete_many([k.encoded for k in keys[:2]]) == [True, True]
    assert all(put(keys[8:10]))
    core.checkpoint_now()
    assert core._native.compact_metadata() is True
    for k in keys[10:12]:  # a group each
        assert all(put([k]))
        core.checkpoint_now()
    assert core.delete_many([keys[2].encoded]) == [True]
    core.checkpoint_now()
    info = {k.encoded: core.entry_offset(k.encoded) for k in keys[3:]}
    core.close()
    with open(path, "rb") as f:
        image = f.read()
    sbs = [parse_sb(image, 0), parse_sb(image, CONTAINER)]
    assert sbs[0] and sbs[1] and sbs[1]["sb_seq"] > sbs[0]["sb_seq"], sbs
    newest = 1
    cur = sbs[newest]
    groups = walk_log(image, cur)
    assert len(groups) == 4
    assert struct.unpack_from("<QI", image, groups[-1][0] + 24) == (0, 0)  # the end mark: no body, no record
    # 10 and 11 sit in slots the older base lists for 0 and 1
    assert {info[keys[10].encoded], info[keys[11].encoded]} <= {META + s * SLOT for s in range(2)}
    live = {k.encoded for k in keys[3:]}
    return {"image": image, "data": data, "keys": {k.encoded: k for k in keys}, "live": live, "offsets": info,
            "sbs": sbs, "newest": newest, "groups": groups, "path": path}


def log_regions(b) -> dict[str, list[tuple[int, int]]]:
    cur, old = b["sbs"][b["newest"]], b["sbs"][b["newest"] ^ 1]
    base_at = lambda sb: (sb["areas"][sb["base_area"]][0], sb["base_len"])  # noqa: E731
    slots = [(o, len(b["data"][k])) for k, o in b["offsets"].items()]
    return {"superblock 0": [(0, SB_LEN)], "superblock 1": [(CONTAINER, SB_LEN)],
            "current base": [base_at(cur)], "older base": [base_at(old)],
            "log groups": [(o, n) for o, n, _s in b["groups"]],
            "log group headers": [(o, GROUP_HDR) for o, _n, _s in b["groups"]],
            "slot headers": [(o, 40) for o, _s in slots], "payloads": [(o + HDR, s) for o, s in slots]}


def craft_log(rng: random.Random, b, img: bytearray) -> str:
    """One CRC-valid hostile change to the log-format metadata of img."""
    cur_i = b["newest"]
    cur = b["sbs"][cur_i]
    gen = cur["generation"]
    names = sorted(b["live"])
    k, other = rng.sample(names, 2)
    slot_of = lambda name: (b["offsets"][name] - META) // SLOT  # noqa: E731
    size_of = lambda name: len(b["data"][name])  # noqa: E731
    choice = rng.randrange(14)
    if choice < 4:  # a superblock field changed, CRC made right
        off = rng.choice([0, CONTAINER])
        field_at, width = rng.choice([(32, 8), (40, 8), (144, 4), (148, 4), (152, 8), (160, 8), (168, 8),
                                      (176, 4), (200, 8), (208, 8), (112, 8), (120, 8), (184, 8), (192, 8)])
        fmt = "<Q" if width == 8 else "<I"
        v = struct.unpack_from(fmt, img, off + field_at)[0]
        nv = rng.choice([0, 1, v + 1, max(0, v - 1), v + BLOCK, v ^ (1 << rng.randrange(width * 8)),
                         (1 << (width * 8)) - 1])
        struct.pack_into(fmt, img, off + field_at, nv & ((1 << (width * 8)) - 1))
        seal_sb(img, off)
        return f"superblock @ {off}: field @ {field_at} {v} -> {nv}"
    if choice == 4:  # the older superblock promoted over the newer (its base lists 0 and 1 at slots 10 and 11 hold)
        old_off = (cur_i ^ 1) * CONTAINER
        struct.pack_into("<Q", img, old_off + 32, cur["sb_seq"] + 1)
        seal_sb(img, old_off)
        return "older superblock promoted"
    # a group appended at the log's head, the next sequence of the generation
    last_off, last_len, last_seq = b["groups"][-1]
    ring_off, ring_len = cur["ring"]
    at = last_off + last_len
    if at + BLOCK > ring_off + ring_len:
        at = ring_off
    cls = 0
    key_b = lambda name: name.encode()  # noqa: E731
    if choice == 5:
        recs = [rec_put(key_b(k), slot_of(other), size_of(k), cls, 0)]
        what = "a key put at another live key's slot"
    elif choice == 6:
        recs = [rec_put(key_b(k + "-copy"), slot_of(k), size_of(k), cls, 0)]
        what = "a key never put, at a live slot"
    elif choice == 7:
        recs = [rec_put(key_b(k), slot_of(k), rng.choice([0, 1, size_of(k) + 1, SLOT - HDR, SLOT, 1 << 40]), cls, 0)]
        what = "a live key with another size"
    elif choice == 8:
        recs = [rec_put(key_b(k), slot_of(k), size_of(k), rng.choice([7, 1 << 20, (1 << 32) - 1]), 0)]
        what = "a live key with a class never defined"
    elif choice == 9:
        recs = [rec_put(key_b(k), slot_of(k), size_of(k), cls, rng.getrandbits(64))]
        what = "a live key with another checksum"
    elif choice == 10:
        recs = [rec_free(slot_of(k)), rec_put(key_b(other), slot_of(k), size_of(other), cls, 0)]
        what = "a live slot freed and given to another key"
    elif choice == 11:
        recs = [rec_put(key_b(k), rng.choice([cur["max_slots"], cur["max_slots"] + 7, (1 << 32) - 1]),
                        size_of(k), cls, 0)]
        what = "a slot past the device"
    elif choice == 12:
        frag = rng.choice([b'"shape":[1,2', b"[]", b'"shape":"x","dtype":5', b"\xff\xfe", b'"shape":' + b"[" * 2000,
                           b'"shape":[99999999999999999999999]', b""])
        recs = [rec_class(rng.choice([0, 1, 5]), frag), rec_put(key_b(k), slot_of(k), size_of(k), 1, 0)]
        what = f"a hostile class fragment {frag[:20]!r}"
    else:
        recs = [rec_put(key_b(k), slot_of(k), size_of(k), cls, 0, [rng.randrange(-(1 << 40), 1 << 40)
                                                                    for _ in range(rng.choice([1, 3, 300]))])]
        what = "a live key with positions"
    epoch = struct.unpack_from("<I", img, last_off + 36)[0] & 0xFFFF0000  # the last group's writer epoch
    g = group(gen, last_seq + 1, recs, epoch)
    img[at:at + len(g)] = g
    return f"group {last_seq + 1} @ {at}: {what}"


def mutate_log(rng: random.Random, b, img: bytearray) -> tuple[str, int | None]:
    kind = rng.choice(["flip", "flip", "zero", "truncate", "craft", "craft"])
    if kind == "truncate":
        n = rng.choice([rng.randrange(0, META + SLOT), rng.randrange(META + SLOT, DEV)])
        return f"truncate to {n}", n
    if kind == "craft":
        return "crafted: " + craft_log(rng, b, img), None
    name, spans = rng.choice(sorted(log_regions(b).items()))
    off, length = rng.choice(spans)
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            bit = rng.randrange(length * 8)
            img[off + bit // 8] ^= 1 << (bit % 8)
        return f"bit flips in {name} @ {off}", None
    a = rng.randrange(length)
    z = rng.randint(1, min(4096, length - a))
    img[off + a:off + a + z] = bytes(z)
    return f"zeroed {z} bytes of {name} @ {off + a}", None


def run_log_case(b, path: str, truncated: int | None, what: str) -> dict:
    try:
        core = _log_core(path)
    except LOG_CLEAN_ERRORS as e:
        assert truncated is not None and truncated < META + SLOT, f"{what}: open failed: {e!r}"
        return {"refused": 1}
    try:
        expected = b["data"]
        names = list(b["keys"])
        served = set()
        for name in names:
            buf = Obj(len(expected[name]))
            try:
                ok = core.load_many_into([name], [buf])[0]
            except LOG_CLEAN_ERRORS:
                ok = False
            if ok:
                assert buf.bytes() == expected[name], f"{what}: WRONG BYTES for {name}"
                served.add(name)
        for name in [n + "-copy" for n in names]:
            assert not core.load_many_into([name], [Obj(SLOT)])[0], f"{what}: a key never put was served"
        st = core.report_status()
        counted = sum(max(0, int(st.get(c) or 0)) for c in DROP_COUNTERS + ("payload_checksum_failures",))
        out = {"served": served, "missing": len(b["live"] - served), "outcome": st.get("recovery_outcome"),
               "resurrected": sorted(served - b["live"]), "counted": counted,
               "error": st.get("checkpoint_last_error") or ""}
        # The next writer goes on from what recovery found: a put (into a slot recovery freed,
        # when one is), a delete of a served key, a checkpoint.
        out["follow_put"] = FOLLOW_KEY.encoded
        ok = core.put_many([FOLLOW_KEY], [Obj(FOLLOW_DATA)]).results == [True]
        gone = sorted(served)[len(served) // 2:len(served) // 2 + 1]
        if gone:
            core.delete_many(gone)
        try:
            core.checkpoint_now()
            out["follow_durable"] = ok
        except LOG_CLEAN_ERRORS:
            out["follow_durable"] = False
        out["follow_deleted"] = gone
    finally:
        core.close()
    # ... and after a restart, every load is still right, and what that checkpoint made durable
    # is there: the put, and the delete
    core = _log_core(path)
    try:
        again = set()
        for name, want in list(b["data"].items()) + [(FOLLOW_KEY.encoded, FOLLOW_DATA)]:
            buf = Obj(len(want))
            try:
                ok = core.load_many_into([name], [buf])[0]
            except LOG_CLEAN_ERRORS:
                ok = False
            if ok:
                assert buf.bytes() == want, f"{what}: after the next writer and a restart, WRONG BYTES for {name}"
                again.add(name)
        if out["follow_durable"]:
            assert FOLLOW_KEY.encoded in again, f"{what}: the next writer's checkpointed put is gone after a restart"
            kept = served - set(out["follow_deleted"])
            assert kept <= again, f"{what}: keys the next writer served and kept are gone after its checkpoint " \
                                  f"and a restart: {sorted(kept - again)}"
            assert not (set(out["follow_deleted"]) & again), f"{what}: the next writer's checkpointed delete came back"
    finally:
        core.close()
    return out


def _log_cases(n: int, seed: int, b, *, subprocess_every: int = 0) -> dict:
    from lmcache_rawblock import _native

    rng = random.Random(seed)
    path = b["path"]
    # full / partial: every live key served, or some not; uncounted: some not, with recovery
    # "loaded", no report_status() counter and no recovery error text saying so
    figures = {"cases": 0, "refused": 0, "full": 0, "partial": 0, "resurrected": 0, "uncounted": 0, "kinds": {},
               "uncounted_kinds": {}, "next_writer_checkpointed": 0, "cli_runs": 0}
    for i in range(n):
        img = bytearray(b["image"])
        what, truncated = mutate_log(rng, b, img)
        data = bytes(img if truncated is None else img[:truncated])
        with open(path, "wb") as f:
            f.write(data)
        what = f"log case {i} (seed {seed}): {what}"
        r = run_log_case(b, path, truncated, what)
        figures["cases"] += 1
        kind = what.split(": ", 1)[1]
        kind = ("crafted" if kind.startswith("crafted") else "truncated" if kind.startswith("truncate")
                else kind.split(" in ")[-1].split(" of ")[-1].split(" @")[0])
        figures["kinds"][kind] = figures["kinds"].get(kind, 0) + 1
        if "refused" in r:
            figures["refused"] += 1
        else:
            figures["full" if r["missing"] == 0 else "partial"] += 1
            figures["resurrected"] += bool(r["resurrected"])
            figures["next_writer_checkpointed"] += bool(r["follow_durable"])
            if r["missing"] > r["counted"] and r["outcome"] == "loaded" and not r["error"]:
                figures["uncounted"] += 1
                figures["uncounted_kinds"][kind] = figures["uncounted_kinds"].get(kind, 0) + 1
                if os.environ.get("RB_FUZZ_SHOW"):
                    print(f"\n{what}: {r['missing']} live keys not served, nothing counts them")
            if r["resurrected"] and os.environ.get("RB_FUZZ_SHOW"):
                print(f"\n{what}: deleted keys served again (their own bytes): {r['resurrected']} ({r['outcome']})")
        with open(path, "wb") as f:
            f.write(data)
        try:
            _native.read_metadata_log(path, BLOCK, META)
        except LOG_CLEAN_ERRORS:
            pass
        try:
            run_tools_case(path, what)
        except OSError:
            pass  # a read past the end of a truncated device (the CLI exits 2 with the message)
        if subprocess_every and i % subprocess_every == 0:
            for cmd in ("inspect", "verify"):
                try:
                    p = subprocess.run([sys.executable, "-m", "lmcache_rawblock", cmd, path, "--json"],
                                       capture_output=True, text=True, timeout=60)
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"{what}: {cmd} hung")
                figures["cli_runs"] += 1
                assert p.returncode in (0, 1, 2) and "Traceback" not in p.stderr, f"{what}: {cmd}: {p.stderr}"
    return figures


def test_log_corruption_fuzz_quick(log_base):
    figures = _log_cases(int(os.environ.get("RB_FUZZ_LOG_QUICK_CASES", "200")), 7, log_base, subprocess_every=50)
    print(f"\nlog-format corruption fuzz: {figures}")
    assert figures["cases"] >= 1
    # the cases reach recovery, and most of them leave something to serve
    assert figures["full"] + figures["partial"] > figures["refused"]


def test_log_fuzz_base_recovers_whole(log_base):
    # The undamaged image serves exactly its live keys (the fuzz's reference is right).
    with open(log_base["path"], "wb") as f:
        f.write(log_base["image"])
    r = run_log_case(log_base, log_base["path"], None, "undamaged")
    assert r["served"] == log_base["live"] and r["outcome"] == "loaded" and r["follow_durable"]


def test_log_fuzz_promoted_old_superblock_never_serves_reused_slots(log_base):
    # The older superblock's base lists 0 and 1 in the slots 10 and 11 now hold: promoted over
    # the newer one (CRC-valid), recovery may list them, but never serves 10's or 11's bytes
    # under their names.
    img = bytearray(log_base["image"])
    cur = log_base["sbs"][log_base["newest"]]
    old_off = (log_base["newest"] ^ 1) * CONTAINER
    struct.pack_into("<Q", img, old_off + 32, cur["sb_seq"] + 1)
    seal_sb(img, old_off)
    with open(log_base["path"], "wb") as f:
        f.write(img)
    r = run_log_case(log_base, log_base["path"], None, "older superblock promoted")
    assert not ({okey(0).encoded, okey(1).encoded} & r["served"])


@pytest.mark.slow
def test_log_corruption_fuzz_long(log_base):
    n = int(os.environ.get("RB_FUZZ_CASES", "3000"))
    figures = _log_cases(n, int(os.environ.get("RB_FUZZ_SEED", "11")), log_base, subprocess_every=100)
    print(f"\nlog-format corruption fuzz: {figures}")
    assert figures["cases"] == n
