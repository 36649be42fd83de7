"""``waf replay`` on the emulated FDP namespace: every placement mode (no_fdp, mixed, and
separated for each strategy) runs the workload end to end through the real core over NVMe
passthrough, with the drive's wear counters read around the window.

QEMU's FDP emulation counts host and media bytes alike (it does no garbage collection), so the
window's WAF is 1 and the output says so; what is checked is that the counters saw at least the
payload the run wrote, and that the FDP modes wrote with the identifiers they name.
"""

from __future__ import annotations

import json

from helpers import ruamw
from lmcache_rawblock import fdp
from lmcache_rawblock.__main__ import main as cli_main

MiB = 1 << 20


def test_replay_every_mode_on_the_emulated_fdp_namespace(nvme_char, tmp_path, capsys):
    out = tmp_path / "out"
    rec = tmp_path / "stream.jsonl"
    before = ruamw(nvme_char)
    rc = cli_main(["waf", "replay", "--device", nvme_char, "--size", "64M", "--chunk-bytes", "256K",
                   "--families", "40", "--warmup", "4M", "--measure", "8M", "--checkpoint-every", "200",
                   "--mode", "no_fdp,mixed,separated", "--strategy", ",".join(fdp.STRATEGIES), "--destroy-data",
                   "--out", str(out), "--no-plots"])
    text = capsys.readouterr()
    assert rc == 0, text.err
    runs = json.loads((out / "results.json").read_text())["runs"]
    labels = [(r["mode"], r["strategy"]) for r in runs]
    assert labels == [("no_fdp", None), ("mixed", None)] + [("separated", s) for s in fdp.STRATEGIES]
    for r in runs:
        w = r["window"]
        assert w["available"], w["note"]
        assert r["ops"]["puts_stored"] > 0 and r["ops"]["payload_bytes"] > 0
        # The drive counted at least what the run handed it in the window.
        assert w["host_bytes"] >= r["ops"]["payload_bytes"], (r["mode"], r["strategy"], w)
        assert w["host_bytes"] >= r["measure_bytes"] * 0.9
        assert r["waf"] is not None and abs(r["waf"] - 1.0) < 0.05
        assert r["steady_state_warning"] and "QEMU" in r["steady_state_warning"]
        assert r["latency"]["put_many_p99_ms"] > 0
        if r["mode"] == "no_fdp":
            assert r["placement_ids"] == [] and r["checkpoint_placement_id"] is None
        elif r["mode"] == "mixed":
            assert len(r["placement_ids"]) == 1 and r["checkpoint_placement_id"] == r["placement_ids"][0]
        else:
            assert r["checkpoint_placement_id"] not in r["placement_ids"] and len(r["placement_ids"]) >= 2
    # The output states plainly that the emulator's WAF is 1.
    assert "QEMU's FDP emulation reports WAF = 1" in text.out
    # Writes went to data identifiers beyond the first one (separated routes over several).
    after = ruamw(nvme_char)
    moved = {p for p in before if before[p] != after[p]}
    sep = [r for r in runs if r["mode"] == "separated"]
    assert len(moved & set(sep[0]["placement_ids"])) >= 2, (before, after)
    # The core's write journal carries no placement identifiers: recording takes no_fdp only.
    replay = ["waf", "replay", "--device", nvme_char, "--size", "64M", "--chunk-bytes", "256K", "--families", "40",
              "--warmup", "2M", "--measure", "4M", "--destroy-data", "--record", str(rec), "--no-plots"]
    assert cli_main(replay + ["--mode", "mixed", "--out", str(tmp_path / "refused")]) == 2
    assert "--record with --mode mixed" in capsys.readouterr().err
    rc = cli_main(replay + ["--mode", "no_fdp", "--out", str(tmp_path / "recorded")])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    # The recorded stream (the core's own writes over passthrough) replays on the simulator.
    assert rec.stat().st_size > 0
    rc = cli_main(["waf", "simulate", "--stream", str(rec), "--page-bytes", str(MiB), "--ru-pages", "4",
                   "--rus", "256", "--json"])
    sim = json.loads(capsys.readouterr().out)
    assert rc == 0 and sim["records"] > 0


def test_replay_refuses_a_device_without_destroy_data(nvme_char, capsys):
    rc = cli_main(["waf", "replay", "--device", nvme_char, "--size", "64M", "--chunk-bytes", "256K"])
    err = capsys.readouterr().err
    assert rc == 2 and "--destroy-data" in err and nvme_char in err


def test_replay_refuses_fdp_modes_on_the_block_device(nvme_block, capsys):
    rc = cli_main(["waf", "replay", "--device", nvme_block, "--size", "64M", "--mode", "mixed",
                   "--chunk-bytes", "256K", "--destroy-data"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--mode mixed" in err and nvme_block in err and "/dev/ngXnY" in err
