"""inspect / verify on checkpoints whose container CRC is valid but whose JSON is hostile:
every field's type and range is checked, and the tools report the problem and exit 2
(never a traceback, an unbounded allocation or a division by zero)."""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import zlib

import pytest

from lmcache_rawblock import tools

MiB = 1 << 20
GOOD = {
    "version": 1, "device_path": "", "capacity_bytes": 8 * MiB, "block_align": 4096, "header_bytes": 4096,
    "slot_bytes": 65536, "meta_total_bytes": MiB, "meta_magic": "LMCIDX01", "meta_version": 1,
    "data_base_offset": MiB, "next_slot": 1,
    "entries": {"k@0x00000000@00": {"offset": MiB, "size": 100, "shape": [100], "dtype": "uint8", "fmt": "BINARY",
                                    "cached_positions": None}},
}


def write_checkpoint(path: str, payload: bytes, *, size: int = 8 * MiB, seq: int = 1, offset: int = 0) -> None:
    """A container with a valid CRC around arbitrary payload bytes (container 0 by default)."""
    with open(path, "r+b" if offset else "wb") as f:
        if not offset:
            f.truncate(size)
        f.seek(offset)
        f.write(struct.pack("<8sIQQI", b"LMCIDX01", 1, seq, len(payload), zlib.crc32(payload) & 0xFFFFFFFF))
        f.seek(offset + 4096)
        f.write(payload)


def run_cli(cmd: str, path: str, capsys) -> tuple[int, str]:
    p = argparse.ArgumentParser()
    tools.add_arguments(p, cmd == "verify")
    args = p.parse_args([path])
    rc = (tools.main_verify if cmd == "verify" else tools.main_inspect)(args)
    return rc, capsys.readouterr().err


def with_entry(**fields) -> dict:
    st = json.loads(json.dumps(GOOD))
    e = st["entries"]["k@0x00000000@00"]
    for k, v in fields.items():
        if v is KeyError:
            del e[k]
        else:
            e[k] = v
    return st


def with_top(**fields) -> dict:
    st = json.loads(json.dumps(GOOD))
    for k, v in fields.items():
        if v is KeyError:
            del st[k]
        else:
            st[k] = v
    return st


HOSTILE = {
    "top-level list": ([], "JSON list, not an object"),
    "top-level string": ("x", "JSON str, not an object"),
    "top-level null": (None, "JSON NoneType, not an object"),
    "top-level number": (7, "JSON int, not an object"),
    "entries list": (with_top(entries=[1, 2]), "entries must be an object"),
    "entries string": (with_top(entries="abc"), "entries must be an object"),
    "entry not an object": (with_top(entries={"k": 5}), "must be an object, got int"),
    "entry offset None": (with_entry(offset=None), "offset must be an integer, got NoneType"),
    "entry offset missing": (with_entry(offset=KeyError), "offset is missing"),
    "entry offset 2^64": (with_entry(offset=1 << 64), "offset = 18446744073709551616 is out of range"),
    "entry offset 2^63": (with_entry(offset=1 << 63), "is out of range"),
    "entry offset negative": (with_entry(offset=-4096), "offset = -4096 is out of range"),
    "entry offset float": (with_entry(offset=4096.0), "offset must be an integer, got float"),
    "entry offset bool": (with_entry(offset=True), "offset must be an integer, got bool"),
    "entry offset string": (with_entry(offset="1048576"), "offset must be an integer, got str"),
    "entry size negative": (with_entry(size=-1), "size = -1 is out of range"),
    "entry size list": (with_entry(size=[1]), "size must be an integer, got list"),
    "entry shape string": (with_entry(shape="100"), "shape must be a list of integers or null"),
    "entry shape float": (with_entry(shape=[1.5]), "shape element must be an integer"),
    "entry shape nested": (with_entry(shape=[[1]]), "shape element must be an integer"),
    "entry positions object": (with_entry(cached_positions={"a": 1}), "cached_positions must be a list"),
    "entry dtype number": (with_entry(dtype=5), "dtype must be a string or null"),
    "entry fmt list": (with_entry(fmt=["BINARY"]), "fmt must be a string or null"),
    "version missing": (with_top(version=KeyError), "version is missing"),
    "version string": (with_top(version="1"), "version must be an integer"),
    "version 2": (with_top(version=2), "not the supported state version 1"),
    "block_align zero": (with_top(block_align=0), "block_align = 0 is out of range"),
    "block_align negative": (with_top(block_align=-4096), "block_align = -4096 is out of range"),
    "block_align not a power of two": (with_top(block_align=3000), "block_align = 3000 is not a power of two"),
    "block_align huge": (with_top(block_align=1 << 62), "block_align = 4611686018427387904 is out of range"),
    "block_align string": (with_top(block_align="4096"), "block_align must be an integer"),
    "header_bytes small": (with_top(header_bytes=8), "header_bytes = 8 is out of range"),
    "header_bytes huge": (with_top(header_bytes=1 << 40), "header_bytes = 1099511627776 is out of range"),
    "slot_bytes negative": (with_top(slot_bytes=-65536), "slot_bytes = -65536 is out of range"),
    "slot_bytes not above header": (with_top(slot_bytes=4096), "slot_bytes = 4096 is not larger than header_bytes"),
    "meta_total_bytes zero": (with_top(meta_total_bytes=0), "meta_total_bytes = 0 is out of range"),
    "meta_total_bytes negative": (with_top(meta_total_bytes=-MiB), "meta_total_bytes = -1048576 is out of range"),
    "meta_total_bytes float": (with_top(meta_total_bytes=1e6), "meta_total_bytes must be an integer, got float"),
    "capacity negative": (with_top(capacity_bytes=-1), "capacity_bytes = -1 is out of range"),
    "data_base_offset 2^64": (with_top(data_base_offset=1 << 64), "data_base_offset = 18446744073709551616"),
    "next_slot string": (with_top(next_slot="1"), "next_slot must be an integer"),
    "meta_version negative": (with_top(meta_version=-1), "meta_version = -1 is out of range"),
    "device_path number": (with_top(device_path=5), "device_path must be a string"),
    "meta_magic list": (with_top(meta_magic=[1]), "meta_magic must be a string"),
}


@pytest.mark.parametrize("cmd", ["inspect", "verify"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_field_is_reported_with_exit_2(tmp_path, capsys, cmd, name):
    state, expected = HOSTILE[name]
    path = str(tmp_path / "dev.img")
    write_checkpoint(path, json.dumps(state).encode())
    rc, err = run_cli(cmd, path, capsys)
    assert rc == 2, err
    assert err.startswith("error: ") and "no valid LMCache raw-block checkpoint" in err
    assert "checkpoint JSON is not a valid state" in err and expected in err, err


RAW_HOSTILE = {
    "deep nesting": (b"[" * 200000 + b"]" * 200000, "nested too deeply"),
    "deep object nesting": (b'{"a":' * 100000 + b"1" + b"}" * 100000, "nested too deeply"),
    "integer with 5000 digits": (b'{"version":1,"next_slot":' + b"9" * 5000 + b"}", "JSON:"),
    "NaN offset": (b'{"version":1,"entries":{"k":{"offset":NaN,"size":1}}}', "offset must be an integer, got float"),
    "Infinity size": (b'{"version":1,"entries":{"k":{"offset":0,"size":Infinity}}}', "size must be an integer"),
    "invalid UTF-8": (b'{"version":1,"device_path":"\xff\xfe"}', "JSON:"),
    "truncated JSON": (json.dumps(GOOD).encode()[:-7], "JSON:"),
    "empty object": (b"{}", "version is missing"),
    "NUL bytes": (b"\x00" * 64, "JSON:"),
}


@pytest.mark.parametrize("cmd", ["inspect", "verify"])
@pytest.mark.parametrize("name", sorted(RAW_HOSTILE))
def test_hostile_json_text_is_reported_with_exit_2(tmp_path, capsys, cmd, name):
    payload, expected = RAW_HOSTILE[name]
    path = str(tmp_path / "dev.img")
    write_checkpoint(path, payload)
    rc, err = run_cli(cmd, path, capsys)
    assert rc == 2, err
    assert "no valid LMCache raw-block checkpoint" in err and expected in err, err


def test_payload_len_beyond_the_device_is_not_allocated(tmp_path, capsys):
    path = str(tmp_path / "dev.img")
    with open(path, "wb") as f:
        f.truncate(8 * MiB)
        f.write(struct.pack("<8sIQQI", b"LMCIDX01", 1, 1, (1 << 64) - 1, 0))
    rc, err = run_cli("inspect", path, capsys)
    assert rc == 2 and "payload_len 18446744073709551615 does not fit the metadata region" in err


def test_hostile_newest_container_falls_back_to_the_other(tmp_path):
    path = str(tmp_path / "dev.img")
    write_checkpoint(path, json.dumps(GOOD).encode(), seq=1)
    write_checkpoint(path, json.dumps(with_top(entries=[1])).encode(), seq=2, offset=MiB // 2)
    info = tools.inspect_device(path)
    assert info["checkpoint_in_use"] == 0 and info["geometry"]["entries"] == 1
    bad = [c for c in info["containers"] if c["index"] == 1][0]
    assert bad["crc_ok"] and "entries must be an object" in bad["error"]
    assert "entries must be an object" in tools.format_inspect(info)


def test_entries_outside_the_device_are_verify_mismatches(tmp_path, capsys):
    st = json.loads(json.dumps(GOOD))
    st["entries"] = {
        "far@0x00000000@00": {"offset": (1 << 63) - 1, "size": 1},
        "end@0x00000000@00": {"offset": 8 * MiB - 100, "size": 1},
        "null@0x00000000@00": {"offset": MiB, "size": (1 << 63) - 1},
    }
    path = str(tmp_path / "dev.img")
    write_checkpoint(path, json.dumps(st).encode())
    for engine_ok in (True, False):
        res = tools.verify_device(path, batch=2) if engine_ok else tools.verify_device(path, batch=1)
        problems = {m["key"]: m["problem"] for m in res["mismatches"]}
        assert res["checked"] == 3 and res["ok"] == 0
        assert "beyond the end of the device" in problems["far@0x00000000@00"]
        assert "beyond the end of the device" in problems["end@0x00000000@00"]
        assert problems["null@0x00000000@00"] == "no slot header (magic)"
    rc, err = run_cli("verify", path, capsys)
    assert rc == 1


def test_control_characters_from_the_device_are_escaped_in_text_output(tmp_path):
    st = json.loads(json.dumps(GOOD))
    st["entries"] = {"\x1b[2Jevil": {"offset": MiB, "size": 1, "dtype": "\x07", "fmt": None, "shape": None}}
    path = str(tmp_path / "dev.img")
    write_checkpoint(path, json.dumps(st).encode())
    text = tools.format_inspect(tools.inspect_device(path))
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[2Jevil" in text
    text = tools.format_verify(tools.verify_device(path))
    assert "\x1b" not in text


@pytest.mark.parametrize("opt,value,expected", [
    ("--block-align", "0", "--block-align must be a power of two"),
    ("--block-align", "3", "--block-align must be a power of two"),
    ("--block-align", "-4096", "--block-align must be a power of two"),
    ("--meta-total-bytes", "0", "--meta-total-bytes must be >= 2"),
    ("--meta-total-bytes", "-1", "--meta-total-bytes must be >= 2"),
])
def test_bad_override_options_exit_2(tmp_path, opt, value, expected):
    path = str(tmp_path / "dev.img")
    write_checkpoint(path, json.dumps(GOOD).encode())
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "inspect", path, opt, value], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr
