"""The put-latency harness with extents: its run record, the test device's reset between runs and
the guest's free page reporting held for the runs. No timing is asserted: only what a run records
and what it leaves behind."""

from __future__ import annotations

import json
import os

import pytest

from lmcache_rawblock_bench import extent_latency as el

MiB = 1 << 20


def test_a_small_run_records_its_settings_and_the_pages_reported(tmp_path, capsys):
    out = tmp_path / "out"
    rc = el.main(["--policies", "extent", "--slots", "128", "--per", "8", "--chunk", str(64 * 1024),
                  "--rounds", "1", "--dealloc", "on,off", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "latency.json").read_text())
    assert doc["page_reporting"] == "as-is"
    assert [r["deallocate_freed"] for r in doc["runs"]] == ["on", "off"]
    for r in doc["runs"]:
        assert r["device_reset"] is False  # a sparse file is made afresh for every run
        assert r["room"]["puts"] > 0 and r["full"]["puts"] == r["slots_in_extents"]
        state = el.reporting_state()
        if state["reported_kib"] is None:
            assert r["reported_kib_during_run"] is None
        else:
            assert r["reported_kib_during_run"] >= 0
    assert "pooled extent" in capsys.readouterr().out


def test_the_evictor_pass_setting_chooses_the_native_call_or_a_victim_at_a_time(tmp_path, monkeypatch):
    from lmcache_rawblock.extent_evict import ExtentEviction
    from lmcache_rawblock.raw_block.core import RawBlockCore

    calls = {"native": 0, "python": 0}
    native, by_victims = RawBlockCore.extent_evict, ExtentEviction._pass_by_victims

    def count_native(self, *a, **k):
        calls["native"] += 1
        return native(self, *a, **k)

    def count_python(self):
        calls["python"] += 1
        return by_victims(self)

    monkeypatch.setattr(RawBlockCore, "extent_evict", count_native)
    monkeypatch.setattr(ExtentEviction, "_pass_by_victims", count_python)
    out = tmp_path / "out"
    assert el.main(["--policies", "extent", "--slots", "128", "--per", "8", "--rounds", "1",
                    "--evictor-pass", "native", "--out", str(out)]) == 0
    assert calls["native"] > 0 and calls["python"] == 0
    assert el.main(["--policies", "extent", "--slots", "128", "--per", "8", "--rounds", "1",
                    "--evictor-pass", "python", "--out", str(out)]) == 0
    assert calls["python"] > 0
    doc = json.loads((out / "latency.json").read_text())
    assert [r["evictor_pass"] for r in doc["runs"]] == ["python"]
    assert doc["runs"][0]["status"]["evicted_extents"] > 0


def test_reset_device_is_refused_without_a_device(capsys):
    with pytest.raises(SystemExit):
        el.main(["--reset-device", "--policies", "extent"])
    assert "--reset-device" in capsys.readouterr().err


def test_reset_device_deallocates_the_whole_device_and_drops_its_cached_pages(loop_device, tmp_path):
    dev = loop_device(size=8 * MiB)
    backing = tmp_path / "loop0.img"
    fd = os.open(dev, os.O_RDWR)
    try:
        os.pwrite(fd, b"\xa5" * (8 * MiB), 0)  # written through the device's page cache
        os.fsync(fd)
        assert os.stat(backing).st_blocks * 512 >= 8 * MiB
        el.reset_device(dev)
        # the bytes come back as zeros through the same descriptor: no cached page survived
        assert os.pread(fd, 8 * MiB, 0) == bytes(8 * MiB)
    finally:
        os.close(fd)
    assert os.stat(backing).st_blocks * 512 < MiB  # the backing file's blocks given back


def test_page_reporting_hold_raises_the_order_for_the_block_and_puts_it_back(tmp_path, monkeypatch):
    knob = tmp_path / "page_reporting_order"
    knob.write_text("9\n")
    monkeypatch.setattr(el, "PAGE_REPORTING", str(tmp_path))
    touched = []
    monkeypatch.setattr(el, "_touch_free_memory", lambda: touched.append(True) or 0)
    with el.page_reporting("hold"):
        assert int(knob.read_text()) == el.HOLD_ORDERS[0]
        assert touched == [True]
    assert int(knob.read_text()) == 9
    with el.page_reporting("as-is"):
        assert int(knob.read_text()) == 9
    assert touched == [True]


def test_page_reporting_hold_is_a_no_op_where_the_kernel_has_none(tmp_path, monkeypatch):
    monkeypatch.setattr(el, "PAGE_REPORTING", str(tmp_path / "absent"))
    monkeypatch.setattr(el, "_touch_free_memory", lambda: pytest.fail("nothing to hold: no memory touched"))
    with el.page_reporting("hold"):
        pass
    assert el.reporting_state() == {"order": None, "reported_kib": None}


def test_gap_us_puts_each_setting_to_sleep_after_every_put(tmp_path, monkeypatch):
    slept = []
    real_sleep = el.time.sleep

    def sleep(s):
        slept.append(s)
        real_sleep(s)

    monkeypatch.setattr(el.time, "sleep", sleep)
    out = tmp_path / "out"
    assert el.main(["--policies", "extent", "--slots", "128", "--per", "8", "--rounds", "1", "--gap-us", "0,200",
                    "--out", str(out)]) == 0
    doc = json.loads((out / "latency.json").read_text())
    assert [r["gap_us"] for r in doc["runs"]] == [0, 200]
    assert sorted(p["gap_us"] for p in doc["pooled"]) == [0, 200]
    gapped = doc["runs"][1]
    puts = gapped["room_untimed_puts"] + gapped["room"]["puts"] + (gapped["slots_in_extents"] - gapped["room"]["puts"]
                                                                   - gapped["room_untimed_puts"]) + gapped["full"]["puts"]
    assert slept.count(200e-6) == puts


def test_gap_us_refuses_what_is_not_a_whole_number(capsys):
    with pytest.raises(SystemExit):
        el.main(["--gap-us", "-5", "--policies", "extent"])
    assert "--gap-us" in capsys.readouterr().err
