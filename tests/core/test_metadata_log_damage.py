"""Damage to the log-structured metadata (docs/metadata-log.md, "Reading a region"): a bit
flipped in a log group or in a superblock, the log cut at a group boundary, the newer
superblock lost after the ring wrapped past the older one's log. For object keys and the
plugin's legacy keys (tensor-parallel workers share a chunk hash), checksums on and off:

- no load returns bytes other than those put for its key (a miss is allowed);
- a damaged group with later groups after it is reported: recovery_outcome "damaged",
  checkpoint_last_error names its ring offset, is_healthy is False; the groups after it are
  replayed;
- the keys lost are at most those put in the damaged (or cut) groups, and a deleted key comes
  back only when its delete was in them;
- the next checkpoint writes a whole base in a new generation, after which the device opens
  clean with the same keys;
- a log cut short by a read error (an unreadable group, no later one found) is damage too, not a
  torn tail: reported, and the writer never goes on over the unreadable group in its generation.
- a clean close ends the log with an end mark (a group of no records), so damage to the last
  group of changes is reported too; after a crash (no close) damage to the last group written
  cannot be told from a torn write, and costs that group's records without a report.

The exhaustive flip of every bit is tests/c/test_mlog_read.c's (the reader alone); here a
sample of bits of each part goes through the whole core.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import textwrap
import zlib

import pytest

from lmcache_rawblock.raw_block import encode_legacy_key
from lmcache_rawblock.raw_block._lmcache import CacheEngineKey

from core_helpers import BLOCK, META, Obj, make_core, make_device, okey, payload
from helpers import REPO, TESTS, preload_shim

SIZE = 3000
GROUP_HDR = 48
SB_LEN = 256
# (puts, deletes) per checkpoint; the first checkpoint writes the base, each later one a group
# of its puts, after a group of its deletes' FREE records (every deleted key's PUT record is
# durable by then: they go ahead of the puts, in the deletes' lane).
ROUNDS = [(range(0, 20), ()), (range(20, 30), range(0, 5)), (range(30, 40), range(20, 23)),
          (range(40, 45), (30,)), (range(45, 50), (24,))]
GROUPS = [g for puts, dels in ROUNDS[1:] for g in ([((), dels)] if dels else []) + [(puts, ())]]
ALL = range(50)


def _spec(ns: str, i: int):
    if ns == "object":
        return okey(i)
    # two workers of one chunk: keys 2k and 2k + 1 carry the same slot identity (the chunk hash)
    return encode_legacy_key(CacheEngineKey("m", 2, i % 2, 0x5000 + i // 2, "bfloat16"))


def _key(ns: str, i: int) -> str:
    return _spec(ns, i).encoded


def _open(dev: str, ns: str, checksums: bool, **kw):
    return make_core(dev, namespace=ns, meta_format="log", verify_payload_checksum=checksums,
                     meta_verify_on_load=False, **kw)


def _write(dev: str, ns: str, checksums: bool, rounds=ROUNDS) -> set:
    """The workload on a blank device; the keys it leaves."""
    c = _open(dev, ns, checksums)
    live: set = set()
    for puts, dels in rounds:
        r = c.put_many([_spec(ns, i) for i in puts], [Obj(payload(i, SIZE)) for i in puts])
        assert all(r.results), r.failure
        live |= set(puts)
        if dels:
            assert all(c.delete_many([_key(ns, i) for i in dels]))
            live -= set(dels)
        c.checkpoint_now()
    c.close()
    return live


def _sb(img, off: int) -> dict | None:
    raw = bytes(img[off:off + SB_LEN])
    if raw[:8] != b"RBMETA02" or zlib.crc32(raw[:252]) != struct.unpack_from("<I", raw, 252)[0]:
        return None
    q = lambda at: struct.unpack_from("<Q", raw, at)[0]  # noqa: E731
    return {"sb_seq": q(32), "generation": q(40), "ring": (q(184), q(192)), "start": q(200), "start_seq": q(208)}


def _current_sb(img) -> dict:
    sbs = [s for s in (_sb(img, 0), _sb(img, META // 2)) if s]
    return max(sbs, key=lambda s: s["sb_seq"])


def _groups(img) -> list[tuple[int, int, int]]:
    """[(device offset, body length, length on the device)] of the live groups, in log order
    (the writer's: consecutive from the ring's start, a group that does not fit at 0); an end
    mark is a group of body length 0."""
    sb = _current_sb(img)
    ring_off, ring_len = sb["ring"]
    pos, seq, out = sb["start"], sb["start_seq"], []
    while True:
        hdr = bytes(img[ring_off + pos:ring_off + pos + GROUP_HDR])
        if hdr[:8] != b"RBMLOG02" or struct.unpack_from("<QQ", hdr, 8) != (sb["generation"], seq):
            if pos == 0:
                return out
            pos = 0
            continue
        body = struct.unpack_from("<Q", hdr, 24)[0]
        total = -(-(GROUP_HDR + body) // BLOCK) * BLOCK
        out.append((ring_off + pos, body, total))
        pos, seq = (pos + total) % ring_len, seq + 1


def _check(dev: str, ns: str, checksums: bool, live: set, lost_ok: set, back_ok: set) -> tuple[dict, set]:
    """Open the damaged device and load every key ever put: the status and the keys served.
    Fails on bytes that are not the key's, on a key lost outside lost_ok, on a deleted key back
    outside back_ok."""
    c = _open(dev, ns, checksums)
    try:
        st = c.report_status()
        served = set()
        objs = [Obj(SIZE) for _ in ALL]
        for i, o, got in zip(ALL, objs, c.load_many_into([_key(ns, i) for i in ALL], objs)):
            if got:
                assert o.bytes() == payload(i, SIZE), f"key {i} served another key's bytes"
                served.add(i)
        assert live - served <= lost_ok, f"lost {sorted(live - served - lost_ok)} outside the damaged range"
        assert served - live <= back_ok, f"deleted keys {sorted(served - live - back_ok)} came back"
    finally:
        c.close()
    return st, served


def _round_of_group(j: int) -> tuple:
    """(puts, deletes) group j of the log holds."""
    return GROUPS[j]


def _real_groups(img) -> list[tuple[int, int, int]]:
    """The groups of changes of a cleanly closed image: all but its end mark, checked last."""
    groups = _groups(img)
    assert groups and groups[-1][1] == 0, "a clean close ends the log with an end mark"
    assert all(body for _off, body, _total in groups[:-1])
    return groups[:-1]


def _put_image(dev: str, img) -> None:
    """The image written sparsely: only its MiB runs that hold a nonzero byte take disk space."""
    step = 1 << 20
    zero = bytes(step)
    with open(dev, "wb") as f:
        f.truncate(len(img))
        for off in range(0, len(img), step):
            run = img[off:off + step]
            if run != zero[:len(run)]:
                f.seek(off)
                f.write(run)


CONFIGS = [("object", False), ("object", True), ("legacy", True), ("legacy", False)]
CONFIG_IDS = ["object", "object-checksums", "legacy-checksums", "legacy"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """The workload's device image and the keys it leaves, per configuration."""
    out = {}
    for ns, checksums in CONFIGS:
        dev = make_device(tmp_path_factory.mktemp("img"))
        live = _write(dev, ns, checksums)
        with open(dev, "rb") as f:
            out[(ns, checksums)] = (f.read(), live)
    return out


def _flip_bits(body: int, total: int, rng: random.Random) -> list[tuple[int, str]]:
    """(bit offset in the group, part): bits of the header, the body and the padding."""
    bits = [(b, "header") for b in rng.sample(range(GROUP_HDR * 8), 3)]
    bits += [(b, "body") for b in rng.sample(range(GROUP_HDR * 8, (GROUP_HDR + body) * 8), 3)]
    bits += [((GROUP_HDR + body) * 8 + rng.randrange((total - GROUP_HDR - body) * 8), "padding")]
    return bits


@pytest.mark.parametrize("ns,checksums", CONFIGS, ids=CONFIG_IDS)
def test_a_flipped_bit_in_a_log_group_is_reported_and_costs_only_that_group(tmp_path, images, ns, checksums):
    """Every group of changes, the last one too: a clean close left an end mark after it."""
    img0, live = images[(ns, checksums)]
    groups = _real_groups(img0)
    assert len(groups) == len(GROUPS)
    rng = random.Random(7)
    dev = str(tmp_path / "dev.img")
    for j, (off, body, total) in enumerate(groups):
        puts, dels = _round_of_group(j)
        for bit, part in _flip_bits(body, total, rng):
            img = bytearray(img0)
            img[off + bit // 8] ^= 1 << (bit % 8)
            _put_image(dev, img)
            hit = part != "padding"
            st, _ = _check(dev, ns, checksums, live, set(puts) if hit else set(), set(dels) if hit else set())
            what = f"group {j} {part} bit {bit}"
            if hit:  # a later group follows (the end mark after the last): damage, reported
                assert st["recovery_outcome"] == "damaged", what
                assert st["is_healthy"] is False, what
                assert f"ring offset {off - _current_sb(img0)['ring'][0]}" in st["checkpoint_last_error"], what
                ml = st["metadata_log"]
                assert (ml["recovered_gaps"], ml["recovered_groups_lost"]) == (1, 1), what
                # the group's records when its header reads (its PUT and FREE records), else -1
                assert ml["recovered_records_lost"] in (-1, len(puts) + len(dels)), what
                assert (ml["recovered_records_lost"] == -1) == (part == "header" and bit < 44 * 8), what
            else:  # the padding is no part of the group
                assert st["recovery_outcome"] == "loaded" and st["is_healthy"], what


@pytest.mark.parametrize("ns,checksums", CONFIGS, ids=CONFIG_IDS)
def test_a_flipped_bit_in_the_last_group_after_a_clean_close_is_reported(tmp_path, images, ns, checksums):
    """The last group of changes damaged after a clean close: reported (the end mark follows
    it), only its records lost, no other key's bytes served; the end mark itself damaged costs
    nothing (it holds no record) and is no damage report."""
    img0, live = images[(ns, checksums)]
    groups = _groups(img0)
    (off, body, _total), (moff, _mbody, _mtotal) = groups[-2], groups[-1]
    puts, dels = _round_of_group(len(groups) - 2)
    dev = str(tmp_path / "dev.img")
    ring_off = _current_sb(img0)["ring"][0]
    for at in (off + 5, off + GROUP_HDR + body // 2, off + GROUP_HDR + body - 1):
        img = bytearray(img0)
        img[at] ^= 0x08
        _put_image(dev, img)
        st, served = _check(dev, ns, checksums, live, set(puts), set(dels))
        assert st["recovery_outcome"] == "damaged" and st["is_healthy"] is False, at
        assert f"ring offset {off - ring_off}" in st["checkpoint_last_error"], at
        ml = st["metadata_log"]
        assert (ml["recovered_gaps"], ml["recovered_groups_lost"]) == (1, 1), at
        assert ml["recovered_records_lost"] in (-1, len(puts) + len(dels)), at
        assert live - set(puts) <= served, at
    for at in (moff + 5, moff + 40):
        img = bytearray(img0)
        img[at] ^= 0x08
        _put_image(dev, img)
        st, served = _check(dev, ns, checksums, live, set(), set())
        assert st["recovery_outcome"] == "loaded" and st["is_healthy"] and served == live, at


def test_after_a_crash_damage_to_the_last_group_is_a_torn_tail(tmp_path):
    """No close, no end mark: the last group written before the crash, damaged, cannot be told
    from a write the crash tore. Its records are lost without a report (and only those); the
    next clean close marks the log's end again."""
    dev = make_device(tmp_path)
    c = _open(dev, "object", False)
    live: set = set()
    for puts, dels in ROUNDS:
        assert all(c.put_many([_spec("object", i) for i in puts], [Obj(payload(i, SIZE)) for i in puts]).results)
        live |= set(puts)
        if dels:
            assert all(c.delete_many([_key("object", i) for i in dels]))
            live -= set(dels)
        c.checkpoint_now()
    with open(dev, "rb") as f:  # the device as a crash now leaves it: every group flushed
        img0 = f.read()
    c.close()
    groups = _groups(img0)
    assert len(groups) == len(GROUPS) and all(body for _o, body, _t in groups)
    off, body, _total = groups[-1]
    puts, dels = GROUPS[-1]
    img = bytearray(img0)
    img[off + GROUP_HDR + body // 2] ^= 0x08
    _put_image(dev, img)
    st, served = _check(dev, "object", False, live, set(puts), set(dels))
    assert st["recovery_outcome"] == "loaded" and st["is_healthy"]
    assert set(puts) & live - served  # lost, unreported: the documented limit
    with open(dev, "rb") as f:  # _check's clean close wrote an end mark after the log
        after = f.read()
    assert _groups(after)[-1][1] == 0 and len(_groups(after)) == len(groups)


@pytest.mark.parametrize("ns,checksums", CONFIGS, ids=CONFIG_IDS)
def test_a_log_cut_at_a_group_boundary_costs_only_the_groups_cut(tmp_path, images, ns, checksums):
    img0, live = images[(ns, checksums)]
    groups = _real_groups(img0)
    dev = str(tmp_path / "dev.img")
    mark = _groups(img0)[-1]
    for j in range(len(groups) + 1):  # the end mark is cut too; j == len(groups): the mark alone
        img = bytearray(img0)
        for off, _body, total in groups[j:] + [mark]:
            img[off:off + total] = bytes(total)
        _put_image(dev, img)
        cut = [_round_of_group(k) for k in range(j, len(groups))]
        lost_ok = {i for puts, _d in cut for i in puts}
        back_ok = {i for _p, dels in cut for i in dels}
        st, served = _check(dev, ns, checksums, live, lost_ok, back_ok)
        # no group after the cut: a torn tail, not damage
        assert st["recovery_outcome"] == "loaded", j
        if j == len(groups):
            assert served == live


@pytest.mark.parametrize("ns,checksums", CONFIGS, ids=CONFIG_IDS)
def test_a_flipped_bit_in_a_superblock_loses_nothing(tmp_path, images, ns, checksums):
    img0, live = images[(ns, checksums)]
    rng = random.Random(11)
    dev = str(tmp_path / "dev.img")
    for at in (0, META // 2):
        for bit in rng.sample(range(SB_LEN * 8), 6):
            img = bytearray(img0)
            img[at + bit // 8] ^= 1 << (bit % 8)
            _put_image(dev, img)
            st, served = _check(dev, ns, checksums, live, set(), set())
            assert served == live
            # either copy damaged is reported: the damaged one may have been the newer
            assert st["recovery_outcome"] == "fallback" and st["checkpoint_last_error"], (at, bit)


def test_a_damaged_group_is_gone_after_the_next_checkpoint(tmp_path, images):
    img0, live = images[("object", False)]
    groups = _groups(img0)
    off, body, _total = groups[1]
    img = bytearray(img0)
    img[off + GROUP_HDR + body // 2] ^= 0x10
    dev = str(tmp_path / "dev.img")
    _put_image(dev, img)
    c = _open(dev, "object", False)
    gen = c._native.status()["metadata_log"]["generation"]
    assert c.report_status()["recovery_outcome"] == "damaged"
    c.checkpoint_now()  # nothing changed since open, yet a whole base is due
    ml = c._native.status()["metadata_log"]
    assert ml["bases_written"] == 1 and ml["generation"] != gen
    c.close()
    puts, _dels = _round_of_group(1)
    st, served = _check(dev, "object", False, live, set(puts), set(_round_of_group(1)[1]))
    assert st["recovery_outcome"] == "loaded" and st["is_healthy"] and st["checkpoint_last_error"] is None
    c = _open(dev, "object", False)
    assert c.report_status()["indexed_key_count"] == len(served)
    c.close()


def test_a_fallback_after_the_ring_wrapped_says_what_it_lost(tmp_path):
    """The newer superblock lost after its log wrapped over the older one's: recovery reads
    the older superblock's base and log, skips the groups overwritten since, replays the rest,
    and reports the loss."""
    dev = make_device(tmp_path)
    c = _open(dev, "object", False)
    live: set = set()
    put_in: dict = {}
    ring = None
    n = 0
    for i in range(200):
        r = c.put_many([_spec("object", i)], [Obj(payload(i, SIZE))])
        assert all(r.results)
        live.add(i)
        c.checkpoint_now()
        seq = c._native.status()["metadata_log"]["seq"]
        put_in[i] = seq
        if i == 10:
            assert c._native.compact_metadata()
        ml = c._native.status()["metadata_log"]
        ring = ml["ring_bytes"]
        n += 1
        if i > 10 and ml["live_bytes"] + BLOCK > ring - 4 * BLOCK:
            break
    c.close()
    with open(dev, "rb") as f:
        img = bytearray(f.read())
    new = _current_sb(img)
    old_at = 0 if _sb(img, 0)["sb_seq"] < new["sb_seq"] else META // 2
    new_at = META // 2 - old_at
    old = _sb(img, old_at)
    assert old["start_seq"] < new["start_seq"] and ring is not None
    img[new_at + 40] ^= 1  # the newer superblock's generation
    _put_image(dev, img)
    # groups the older superblock's log had that the newer lap overwrote: lost, and reported
    lost_ok = {i for i, s in put_in.items() if old["start_seq"] <= s < new["start_seq"]}
    assert lost_ok
    st, served = _check(dev, "object", False, live, lost_ok, set())
    assert st["recovery_outcome"] == "damaged" and "newest superblock is unusable" in st["checkpoint_last_error"]
    assert st["is_healthy"] is False and live - served


def test_verify_and_inspect_report_a_damaged_log(tmp_path, images):
    """`verify` exits 1 on a log that lost a group to damage (its slot headers all fine), and
    `inspect` names the damaged group; the intact image verifies clean."""
    img0, _live = images[("object", False)]
    off, body, _total = _groups(img0)[2]
    dev = str(tmp_path / "dev.img")
    for damaged in (False, True):
        img = bytearray(img0)
        if damaged:
            img[off + GROUP_HDR + body - 1] ^= 0x80
        _put_image(dev, img)
        r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "verify", dev, "--json"], capture_output=True,
                           text=True, timeout=120, cwd=str(REPO))
        res = json.loads(r.stdout)
        assert res["mismatch_count"] == 0 and r.returncode == (1 if damaged else 0), r.stderr
        assert bool(res["metadata_damage"]) == damaged
        r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "inspect", dev], capture_output=True,
                           text=True, timeout=120, cwd=str(REPO))
        assert r.returncode == 0 and ("log: DAMAGED: group 4 at ring offset" in r.stdout) == damaged, r.stdout


def test_each_group_of_a_checkpoint_is_durable_before_the_next(tmp_path):
    """A checkpoint of several pages flushes between its groups, so a crash can tear only the
    last group of the log: a failed group with a later one after it is damage, never a torn
    tail (which is what lets recovery report it)."""
    dev = make_device(tmp_path)
    c = _open(dev, "object", False)
    keys = [okey(i, model="m" * 900) for i in range(800)]  # about 1 KiB a record
    assert all(c.put_many(keys[:5], [Obj(payload(i, 100)) for i in range(5)]).results)
    c.checkpoint_now()  # the first base
    assert all(c.put_many(keys[5:], [Obj(payload(i, 100)) for i in range(5, 800)]).results)
    st0 = c._native.status()
    c.checkpoint_now()
    st1 = c._native.status()
    groups = st1["metadata_log"]["groups_written"] - st0["metadata_log"]["groups_written"]
    assert groups >= 3  # 256 KiB of records a page
    # one flush before the groups (the payloads they name), then one after each group
    assert st1["device_flushes"] - st0["device_flushes"] == groups + 1
    c.close()


# Preloaded into a child process: its reads touching device offsets [RB_EIO_FROM, +RB_EIO_LEN)
# fail with EIO (the core reads through pread or preadv2).
EIO_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int hits(off_t off, size_t len)
{
    const char *a = getenv("RB_EIO_FROM"), *b = getenv("RB_EIO_LEN");
    long long from = a ? atoll(a) : 0, n = b ? atoll(b) : 0;
    return n > 0 && off < from + n && from < off + (long long)len;
}

static size_t iov_len(const struct iovec *iov, int n)
{
    size_t t = 0;
    for (int i = 0; i < n; i++)
        t += iov[i].iov_len;
    return t;
}

#define PREAD(name)                                                                   \
    ssize_t name(int fd, void *buf, size_t len, off_t off)                            \
    {                                                                                 \
        ssize_t (*real)(int, void *, size_t, off_t) = dlsym(RTLD_NEXT, #name);        \
        if (hits(off, len)) {                                                         \
            errno = EIO;                                                              \
            return -1;                                                                \
        }                                                                             \
        return real(fd, buf, len, off);                                               \
    }
#define PREADV2(name)                                                                 \
    ssize_t name(int fd, const struct iovec *iov, int n, off_t off, int flags)        \
    {                                                                                 \
        ssize_t (*real)(int, const struct iovec *, int, off_t, int) = dlsym(RTLD_NEXT, #name); \
        if (hits(off, iov_len(iov, n))) {                                             \
            errno = EIO;                                                              \
            return -1;                                                                \
        }                                                                             \
        return real(fd, iov, n, off, flags);                                          \
    }
PREAD(pread)
PREAD(pread64)
PREADV2(preadv2)
PREADV2(preadv64v2)
"""


def _eio_shim(tmp_path) -> str:
    return preload_shim(tmp_path, "eio", EIO_SHIM, "read-error shim")


def test_a_log_cut_short_by_a_read_error_is_damage(tmp_path, images):
    """The last group cannot be read at open (a read error, no later group to go on with): the
    recovery says damaged and why, is not healthy, and the next checkpoint writes a whole base in
    a new generation (before any group could land over the unreadable one as if it were the end
    of the log). What that group alone held is lost to this open, nothing else."""
    img0, live = images[("object", False)]
    groups = _real_groups(img0)
    off, _body, _total = groups[-1]
    mark = _groups(img0)[-1]  # the close's end mark follows it: unreadable too, so no later group
    assert mark[0] > off
    eio_len = mark[0] + mark[2] - off
    dev = str(tmp_path / "dev.img")
    with open(dev, "wb") as f:
        f.write(img0)
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(TESTS)!r})
        from core_helpers import make_core
        c = make_core({dev!r}, namespace="object", meta_format="log", verify_payload_checksum=False,
                      meta_verify_on_load=False)
        st = c.report_status()
        res = {{"outcome": st["recovery_outcome"], "healthy": st["is_healthy"], "error": st["checkpoint_last_error"],
               "gen0": c._native.status()["metadata_log"]["generation"]}}
        c.checkpoint_now()
        ml = c._native.status()["metadata_log"]
        res.update(bases=ml["bases_written"], groups=ml["groups_written"], gen=ml["generation"])
        c.close()
        print(json.dumps(res))
    """)
    # after what is preloaded already (a sanitizer's runtime must come first)
    preload = " ".join(p for p in (os.environ.get("LD_PRELOAD"), _eio_shim(tmp_path)) if p)
    env = dict(os.environ, LD_PRELOAD=preload, RB_EIO_FROM=str(off), RB_EIO_LEN=str(eio_len))
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "verify", dev, "--json"], capture_output=True,
                       text=True, timeout=120, cwd=str(REPO), env=env)
    assert r.returncode == 1, r.stderr
    assert any("cut short by a read error" in d for d in json.loads(r.stdout)["metadata_damage"]), r.stdout
    r = subprocess.run([sys.executable, "-m", "lmcache_rawblock", "inspect", dev], capture_output=True,
                       text=True, timeout=120, cwd=str(REPO), env=env)
    assert r.returncode == 0 and "log: DAMAGED: cut short by a read error" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.splitlines()[-1])
    assert res["outcome"] == "damaged" and not res["healthy"], res
    assert "cut short by a read error" in res["error"] and f"device offset {off}" in res["error"], res
    assert res["bases"] == 1 and res["groups"] == 0 and res["gen"] != res["gen0"], res
    puts, dels = _round_of_group(len(groups) - 1)
    st, _served = _check(dev, "object", False, live, set(puts), set(dels))
    assert st["recovery_outcome"] == "loaded" and st["is_healthy"], st



def _ring_bytes(img) -> bytes:
    ring_off, ring_len = _current_sb(img)["ring"]
    return bytes(img[ring_off:ring_off + ring_len])


def test_open_close_cycles_without_changes_do_not_grow_the_log(tmp_path, images):
    """A close writes an end mark only when the log does not end with one: 200 open/close
    cycles without a change write nothing to the ring, and a log a crash left unmarked gets
    one mark, at the first clean close, then none."""
    img0, live = images[("object", False)]
    dev = str(tmp_path / "dev.img")
    mark = _groups(img0)[-1]
    for crashed in (False, True):
        img = bytearray(img0)
        if crashed:  # as if the writer died before its close: no end mark
            img[mark[0]:mark[0] + mark[2]] = bytes(mark[2])
        _put_image(dev, img)
        seen = set()
        for cycle in range(200):
            c = _open(dev, "object", False)
            ml = c._native.status()["metadata_log"]
            assert c.report_status()["recovery_outcome"] == "loaded", cycle
            seen.add((ml["seq"], ml["live_bytes"]))
            c.close()
            if cycle == 0:
                with open(dev, "rb") as f:
                    first = _ring_bytes(f.read())
        with open(dev, "rb") as f:
            after = f.read()
        assert _ring_bytes(after) == first
        # unmarked: the first open reads the log without a mark, the others with the one written
        assert len(seen) == (2 if crashed else 1), seen
        assert _groups(after)[-1][1] == 0 and len(_groups(after)) == len(_groups(img0))
    st, served = _check(dev, "object", False, live, set(), set())
    assert served == live and st["recovery_outcome"] == "loaded"


def test_open_change_close_cycles_are_reclaimed_by_compaction(tmp_path):
    """A cycle with a change writes its group and an end mark (two blocks); a ring of 32
    blocks takes far fewer cycles than are run here, so compaction reclaims what the marks
    use like any group's: every open recovers every key, the ring never overflows."""
    dev = make_device(tmp_path)
    live: set = set()
    start_seqs = set()
    for i in ALL:
        c = _open(dev, "object", False)
        st = c.report_status()
        ml = c._native.status()["metadata_log"]
        assert st["recovery_outcome"] == ("blank" if i == 0 else "loaded"), (i, st["recovery_outcome"])
        assert st["indexed_key_count"] == len(live), i
        assert ml["live_bytes"] <= ml["ring_bytes"], i
        assert all(c.put_many([_spec("object", i)], [Obj(payload(i, SIZE))]).results)
        live.add(i)
        c.close()
        with open(dev, "rb") as f:
            img = f.read()
        start_seqs.add(_current_sb(img)["start_seq"])
        groups = _groups(img)  # each close marked the log's end (none after a new base)
        assert not groups or groups[-1][1] == 0, i
    assert len(start_seqs) >= 3  # compacted more than once
    st, served = _check(dev, "object", False, live, set(), set())
    assert served == live and st["recovery_outcome"] == "loaded"


def test_a_close_that_finds_the_ring_full_compacts_instead_of_marking(tmp_path):
    """The final checkpoint filled the ring to its last block: no room for an end mark, so
    close compacts; the log then holds no group (nothing to mark) and every key is in the base."""
    dev = make_device(tmp_path)
    c = _open(dev, "object", False)
    live: set = set()
    for i in range(200):
        assert all(c.put_many([_spec("object", i)], [Obj(payload(i, SIZE))]).results)
        live.add(i)
        c.checkpoint_now()
        ml = c._native.status()["metadata_log"]
        if ml["live_bytes"] == ml["ring_bytes"]:
            break
    assert ml["live_bytes"] == ml["ring_bytes"] and ml["compactions"] == 0
    res = c.close()
    assert res.final_checkpoint_written is False
    assert c._native.close()["checkpoint_error"] is None
    with open(dev, "rb") as f:
        img = f.read()
    assert _groups(img) == [] and _current_sb(img)["start_seq"] == ml["seq"] + 1
    st, served = _check(dev, "object", False, live, set(), set())
    assert served == live and st["recovery_outcome"] == "loaded"
    assert st["metadata_log"]["recovered_groups"] == 0
