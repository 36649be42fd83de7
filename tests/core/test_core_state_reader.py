"""The plain-form checkpoint reader (csrc/core/rb_core_fastjson.c) must apply every document
exactly as the json-c path does: same verdict, same reason, same entries in the same order,
same metadata, same free slots. Documents outside the plain form fall back to json-c."""

from __future__ import annotations

import json
import random

import pytest

from core_helpers import BLOCK, HEADER, META, SLOT, make_core, make_device, okey, write_container

BASE = META  # data_base_offset with the CI geometry


def state(path, n=6, next_slot=None, **over):
    entries = {}
    for i in range(n):
        entries[okey(i).encoded] = {
            "offset": BASE + i * SLOT, "size": 100 + i, "shape": [100 + i], "dtype": "uint8", "fmt": "BINARY",
            "cached_positions": None}
    st = {"version": 1, "device_path": path, "capacity_bytes": 0, "block_align": BLOCK, "header_bytes": HEADER,
          "slot_bytes": SLOT, "meta_total_bytes": META, "meta_magic": "LMCIDX01", "meta_version": 1,
          "data_base_offset": BASE, "next_slot": n if next_slot is None else next_slot, "entries": entries}
    st.update(over)
    return st


def snapshot(core):
    n = core._native
    st = n.status()
    try:
        keys = n.snapshot_keys()
        meta = n.get_metadata_many(keys)
    except UnicodeDecodeError as e:  # a key json-c let through that is not valid UTF-8
        keys, meta = repr(e), None
    return (keys, meta, st["next_slot"], st["free_slot_count"], st["indexed_key_count"])


def both(path, doc: bytes):
    out = []
    for generic in (False, True):
        c = make_core(path, meta_verify_on_load=False)
        try:
            fn = c._native._apply_state_json_generic if generic else c._native.apply_state_json
            try:
                r = ("ok", fn(doc))
            except Exception as e:  # noqa: BLE001 - compared, not swallowed
                r = ("raise", type(e).__name__, str(e))
            out.append((r, snapshot(c)))
        finally:
            c._native.close()
    return out


def check(path, doc):
    if isinstance(doc, dict):
        doc = json.dumps(doc, separators=(",", ":"))
    if isinstance(doc, str):
        doc = doc.encode()
    fast, slow = both(path, doc)
    assert fast == slow, doc[:300]
    return fast


def test_canonical_and_spaced_documents(tmp_path):
    path = make_device(tmp_path)
    st = state(path)
    (r, snap) = check(path, st)
    assert r == ("ok", (True, "")) and len(snap[0]) == 6
    check(path, json.dumps(st, indent=2))
    check(path, json.dumps(st))  # ", " and ": " separators
    check(path, " \n" + json.dumps(st) + "\n\t ")


def test_entry_variants(tmp_path):
    path = make_device(tmp_path)
    st = state(path, n=8, next_slot=10)
    e = list(st["entries"].values())
    e[0]["cached_positions"] = [0, 5, -3, 123456789012345678]
    e[1]["shape"] = None
    e[2]["dtype"] = None
    e[2]["fmt"] = None
    del e[3]["shape"], e[3]["dtype"], e[3]["fmt"], e[3]["cached_positions"]
    e[4]["cached_positions"] = []
    e[5]["shape"] = [2, 3, 4]
    e[6]["offset"] = BASE + 9 * SLOT  # slot 9 < next_slot
    e[7]["shape"] = []
    check(path, st)
    # reordered fields, an entry with nothing, keys of the entries reordered
    st2 = state(path)
    ents = {k: dict(reversed(list(v.items()))) for k, v in reversed(list(st2["entries"].items()))}
    ents["empty"] = {}
    st2["entries"] = ents
    check(path, st2)


@pytest.mark.parametrize("field,value", [
    ("offset", BASE + 1), ("offset", BASE - SLOT), ("offset", -5), ("size", 0), ("size", -1),
    ("size", SLOT - HEADER + 1), ("size", SLOT - HEADER), ("offset", BASE + 50 * SLOT), ("offset", BASE),
    ("offset", 1.0), ("size", 100.5), ("size", "100"), ("size", True), ("offset", None), ("shape", "x"),
    ("shape", [1.5]), ("shape", [True]), ("shape", {"a": 1}), ("cached_positions", ["1"]), ("dtype", 5),
    ("fmt", ["BINARY"]), ("dtype", "ü8"), ("fmt", "a\"b"), ("extra", 1), ("size", 10**20), ("size", -(10**19)),
    ("size", 123456789012345678), ("size", 1234567890123456789),
])
def test_entry_field_values(tmp_path, field, value):
    path = make_device(tmp_path)
    st = state(path, n=4)
    list(st["entries"].values())[1][field] = value
    check(path, st)


@pytest.mark.parametrize("field,value", [
    ("version", 2), ("version", "1"), ("version", 1.0), ("version", True), ("version", None),
    ("header_bytes", 512), ("header_bytes", "4096"), ("block_align", -1), ("slot_bytes", None),
    ("meta_total_bytes", 1.5), ("meta_magic", "LMCIDX02"), ("meta_magic", 5), ("meta_magic", "LMCIDX0"),
    ("meta_version", 3), ("device_path", "/elsewhere"), ("device_path", ""), ("device_path", 7),
    ("next_slot", -1), ("next_slot", 10**9), ("next_slot", "6"), ("next_slot", 2), ("capacity_bytes", "x"),
    ("data_base_offset", None), ("entries", []), ("entries", None), ("unknown", {"a": [1, 2]}),
])
def test_top_level_values(tmp_path, field, value):
    path = make_device(tmp_path)
    check(path, state(path, **{field: value}))


def test_missing_top_level_fields(tmp_path):
    path = make_device(tmp_path)
    for f in ("version", "device_path", "capacity_bytes", "block_align", "header_bytes", "slot_bytes",
              "meta_total_bytes", "meta_magic", "meta_version", "data_base_offset", "next_slot", "entries"):
        st = state(path)
        del st[f]
        check(path, st)


def test_repeated_keys_follow_json_c(tmp_path):
    path = make_device(tmp_path)
    body = json.dumps(state(path, n=3), separators=(",", ":"))
    k0 = json.dumps(okey(0).encoded)
    bad = '{"offset":%d,"size":0,"shape":null,"dtype":null,"fmt":null,"cached_positions":null}' % BASE
    good = '{"offset":%d,"size":7,"shape":[7],"dtype":"uint8","fmt":"BINARY","cached_positions":null}' % (BASE + 2 * SLOT)
    # repeated entry key: last value, first position (json-c); valid then invalid and the reverse
    check(path, body[:-2] + "," + k0 + ":" + bad + "}}")
    check(path, body.replace('"entries":{', '"entries":{' + k0 + ":" + bad + ",", 1))
    check(path, body[:-2] + "," + k0 + ":" + good + "}}")
    # repeated field inside an entry, repeated top-level field
    check(path, body.replace('"size":100,', '"size":100,"size":0,', 1))
    check(path, body.replace('"version":1,', '"version":1,"version":2,', 1))
    check(path, body.replace('"next_slot":3,', '"next_slot":3,"next_slot":1,', 1))


def test_escapes_unicode_and_invalid_json(tmp_path):
    path = make_device(tmp_path)
    body = json.dumps(state(path, n=3), separators=(",", ":"))
    k0 = okey(0).encoded
    docs = [
        body.replace(k0, k0 + "\\u00e9", 1), body.replace(k0, k0 + "\\\\", 1), body.replace(k0, k0 + "é", 1),
        body.replace(k0, k0 + "\\u0000x", 1), body.replace(k0, k0 + "\\/", 1),
        body[:-1], body + "x", body + "}", body.replace('"size":100', '"size":0100', 1),
        body.replace('"size":100', '"size":-', 1), body.replace('"size":100', '"size":1e2', 1),
        body.replace('"size":100', '"size":100.', 1), body.replace(",", ",,", 1), body.replace("}}", ",}}", 1),
        body.replace("null", "nul", 1), body.replace("null", "NULL", 1), "", "[]", "1", "null", "{}",
        '{"version":1}', body.replace(k0, k0 + "\t", 1), body.encode().replace(b"uint8", b"uint\x008").decode(),
    ]
    for d in docs:
        check(path, d)


def test_random_mutations_agree(tmp_path):
    path = make_device(tmp_path)
    st = state(path, n=5, next_slot=7)
    list(st["entries"].values())[2]["cached_positions"] = [1, 2, 3]
    body = json.dumps(st, separators=(",", ":")).encode()
    rng = random.Random(4)
    alphabet = b'{}[],:"\\ 0123456789-.eE\nnulltrueabc\x00\xc3'
    for _ in range(300):
        b = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            op = rng.random()
            i = rng.randrange(len(b))
            if op < 0.4:
                b[i] = rng.choice(alphabet)
            elif op < 0.7:
                del b[i]
            else:
                b.insert(i, rng.choice(alphabet))
        check(path, bytes(b))


def test_recovery_at_open_uses_the_same_rules(tmp_path):
    """A checkpoint found at open (written by an independent writer) gives the index json-c gives."""
    path = make_device(tmp_path)
    st = state(path, n=500, next_slot=600)
    list(st["entries"].values())[7]["offset"] = BASE + 3  # skipped by both
    write_container(path, 0, 1, st)
    c = make_core(path, meta_verify_on_load=False)
    try:
        opened = snapshot(c)
    finally:
        c._native.close()
    assert len(opened[0]) == 499
    fast, slow = both(path, json.dumps(st).encode())
    assert fast[1] == slow[1] == opened


@pytest.mark.parametrize("value", [None, 5, "zz", ["0123456789abcdef"]])
def test_an_unreadable_checksum_refuses_its_entry(tmp_path, value):
    """A checksum field that is present but unreadable (null included) makes the entry untrusted:
    both readers skip it, where an absent field indexes the entry without a checksum."""
    path = make_device(tmp_path)
    st = state(path, n=3)
    keys = list(st["entries"])
    st["entries"][keys[1]]["xxh3"] = value
    (r, snap) = check(path, st)
    assert r[0] == "ok"
    assert snap[0] == [keys[0], keys[2]]
