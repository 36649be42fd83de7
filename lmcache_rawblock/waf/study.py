"""The simulated study: WAF per placement mode and strategy on the LMCache-shaped workload at
several utilisations, with write admission off and on; the validation figures; the published
anchors. Writes results.json, summary.md and PNG plots."""

from __future__ import annotations

import json
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Optional

from .analytic import greedy_uniform_waf
from .classes import WriteClass, cumulative_at, run_classes
from .ftl import FlashSim, Geometry
from .run import simulate_lmcache
from .workload import WorkloadSpec

STUDY_GEOMETRY = Geometry(ru_pages=64, n_rus=1024, n_groups=1, op=0.07, max_handles=8, page_bytes=1 << 20)
CONFIGS = (("no_fdp", None), ("mixed", None), ("separated", "tp_worker"), ("separated", "prompt"),
           ("separated", "phase"), ("separated", "cache_salt_prefix"), ("separated", "cache_salt_rank"))
VALIDATION_GEOMETRY = dict(ru_pages=64, n_rus=256, max_handles=1, page_bytes=4096)


def label(mode: str, strategy: Optional[str]) -> str:
    return mode if mode != "separated" else f"separated:{strategy}"


def _one(args: tuple) -> dict:
    geometry, spec, kw = args
    return simulate_lmcache(geometry, spec, **kw)


def uniform_random_waf(op: float, *, policy: str = "greedy", warmup: float = 2.0, measure: float = 2.0,
                       seed: int = 1, geometry: Optional[dict] = None) -> float:
    """Simulated WAF of uniform random single-page overwrites at spare factor ``op``."""
    import random

    g = Geometry(op=op, **(geometry or VALIDATION_GEOMETRY))
    sim = FlashSim(g, policy=policy)
    L = g.logical_pages
    rnd = random.Random(seed)
    for p in range(L):
        sim.write(p, 1)
    for _ in range(int(warmup * L)):
        sim.write(rnd.randrange(L), 1)
    sim.mark()
    for _ in range(int(measure * L)):
        sim.write(rnd.randrange(L), 1)
    return sim.window().waf()


def validation() -> dict:
    ops = (0.1, 0.2, 0.28, 0.5, 1.0)
    out = {"geometry": VALIDATION_GEOMETRY, "model": "Desnoyers' FIFO/LRU model, u = exp(-(1+op)(1-u)), "
           "WAF = 1/(1-u)", "uniform": []}
    for op in ops:
        out["uniform"].append({"op": op, "model": greedy_uniform_waf(op), "greedy": uniform_random_waf(op),
                               "cost_benefit": uniform_random_waf(op, policy="cost_benefit")})
    g = Geometry(ru_pages=64, n_rus=256, op=0.28, max_handles=2, page_bytes=4096)
    two = [WriteClass("short", 0.1, 0.9, "random", 1), WriteClass("long", 0.9, 0.1, "random", 1)]
    out["two_lifetimes"] = {"mixed": run_classes(g, two, separated=False)["waf"],
                            "separated": run_classes(g, two, separated=True)["waf"],
                            "separated_persistent": run_classes(g, two, separated=True, isolation="persistent")["waf"]}
    return out


def anchors() -> dict:
    g = Geometry(ru_pages=64, n_rus=512, op=0.07, max_handles=4, page_bytes=4096)
    share = 0.76  # the one calibrated parameter: the small-object cache's share of host writes
    cachelib = [WriteClass("small_object_cache", 0.04, share, "random", 1),
                WriteClass("large_object_cache", 0.96, 1 - share, "sequential", 16)]
    res = {"cachelib": {"published": {"util_1.0": [3.22, 1.03], "util_0.5": [1.22, 1.03]},
                        "model": "small-object cache: 4% of the space, 1-page random overwrites, "
                                 f"{share:.0%} of host writes (calibrated to the 100% non-FDP figure); "
                                 "large-object cache: a 16-page circular log; drive op 7%",
                        "simulated": {}}}
    for util in (1.0, 0.5):
        res["cachelib"]["simulated"][f"util_{util}"] = [
            run_classes(g, cachelib, util=util, separated=sep, warmup=2, measure=1)["waf"] for sep in (False, True)]
    lmc = [WriteClass("short_lived", 0.05, 0.9, "random", 8), WriteClass("long_lived", 0.95, 0.1, "random", 8)]
    sims = {}
    for name, sep, iso in (("mixed", False, "initial"), ("separated", True, "initial"),
                           ("separated_persistent", True, "persistent")):
        r = run_classes(g, lmc, util=0.89, separated=sep, isolation=iso, warmup=3, measure=1)
        sims[name] = {"cumulative_4x": cumulative_at(r, 4.0), "steady": r["waf"]}
    res["lmcache"] = {"published": {"mixed": 2.600, "separated": 1.425, "util": 0.89, "capacity_written": 4},
                      "model": "two classes of 8-page slots reused at random: 5% of the space takes 90% of the "
                               "writes, 95% takes 10%; 89% of the logical space in use, the rest unwritten; "
                               "drive op 7%; WAF from the start over 4x the space written",
                      "simulated": sims}
    return res


def run_study(*, utils=(0.5, 0.8, 0.95), admissions=("always", "second_hit"), repeats: int = 2,
              warmup: float = 2.0, measure: float = 2.0, spec: Optional[WorkloadSpec] = None,
              geometry: Geometry = STUDY_GEOMETRY, jobs: int = 0, progress=None) -> dict:
    spec = spec or WorkloadSpec()
    tasks = []
    for util in utils:
        for adm in admissions:
            for mode, strat in CONFIGS:
                for rep in range(repeats):
                    kw = dict(util=util, mode=mode, strategy=strat, admission=adm, warmup=warmup, measure=measure,
                              dealloc=False)
                    tasks.append((geometry, replace(spec, seed=spec.seed + rep), kw))
    jobs = jobs or max(1, min(len(tasks), os.cpu_count() or 1))
    runs = []
    with ProcessPoolExecutor(jobs) as ex:
        for i, r in enumerate(ex.map(_one, tasks)):
            r["seed"] = tasks[i][1].seed
            runs.append(r)
            if progress:
                progress(i + 1, len(tasks), r)
    return {"geometry": geometry.to_dict(), "workload": spec.to_dict(), "repeats": repeats, "warmup": warmup,
            "measure": measure, "runs": runs}


def summarize(study: dict) -> list[dict]:
    rows = {}
    for r in study["runs"]:
        k = (r["util"], r["admission"], label(r["mode"], r["strategy"]))
        rows.setdefault(k, []).append(r)
    out = []
    for (util, adm, lab), rs in sorted(rows.items()):
        wafs = [r["waf"] for r in rs]
        out.append({"util": util, "admission": adm, "config": lab, "waf": statistics.mean(wafs),
                    "waf_min": min(wafs), "waf_max": max(wafs), "n": len(rs),
                    "host_gib": statistics.mean(r["window"]["host_pages"] for r in rs) *
                    study["geometry"]["page_bytes"] / 2**30,
                    "hit_ratio": statistics.mean(r["cache"]["hit_ratio"] for r in rs),
                    # the window is a fixed volume of host writes, so admission shows as more work per byte
                    "host_mib_per_k_lookups": statistics.mean(
                        r["window"]["host_pages"] * study["geometry"]["page_bytes"] / 2**20 /
                        (r["cache"]["lookups"] / 1000) for r in rs),
                    "media_mib_per_k_lookups": statistics.mean(
                        r["window"]["media_pages"] * study["geometry"]["page_bytes"] / 2**20 /
                        (r["cache"]["lookups"] / 1000) for r in rs),
                    "puts_written": statistics.mean(r["cache"]["puts_written"] for r in rs),
                    "lookups": statistics.mean(r["cache"]["lookups"] for r in rs)})
    return out


def markdown(study: dict, rows: list[dict], val: Optional[dict], anc: Optional[dict], argv: list[str]) -> str:
    g = study["geometry"]
    lines = ["# Simulated write amplification of LMCache's SSD tier", "",
             f"Command: `{' '.join(argv)}`", "",
             f"Drive: {g['n_rus']} reclaim units of {g['ru_pages']} pages of {g['page_bytes'] >> 20} MiB, one "
             f"reclaim group, over-provisioning {g['op']:.0%}, greedy GC, initially isolated handles. Workload: "
             f"`{json.dumps(study['workload'])}`. Warm-up {study['warmup']} drive writes, WAF measured over the next "
             f"{study['measure']}; {study['repeats']} seeds per cell (mean, [min, max]). Host writes and hit "
             "ratio are per measured window; the window is a fixed volume of host writes, so the work done "
             "in it is compared per 1000 lookups (host and media MiB written per 1000 lookups). No deallocation "
             "on eviction (our core does not deallocate).", "",
             "| util | admission | placement | WAF | host MiB / 1k lookups | media MiB / 1k lookups | hit ratio |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['util']:.0%} | {r['admission']} | {r['config']} | {r['waf']:.3f} "
                     f"[{r['waf_min']:.3f}, {r['waf_max']:.3f}] | {r['host_mib_per_k_lookups']:.0f} | "
                     f"{r['media_mib_per_k_lookups']:.0f} | {r['hit_ratio']:.3f} |")
    if val:
        lines += ["", "## Validation", "", f"Uniform random single-page overwrites, {val['geometry']}; model: "
                  f"{val['model']}.", "", "| op | model | greedy | cost-benefit |", "|---|---|---|---|"]
        for u in val["uniform"]:
            lines.append(f"| {u['op']} | {u['model']:.3f} | {u['greedy']:.3f} | {u['cost_benefit']:.3f} |")
        t = val["two_lifetimes"]
        lines += ["", f"Two lifetimes (10% of the space takes 90% of the writes, op 28%): mixed {t['mixed']:.3f}, "
                  f"separated {t['separated']:.3f}, separated with persistently isolated handles "
                  f"{t['separated_persistent']:.3f}."]
    if anc:
        c, m = anc["cachelib"], anc["lmcache"]
        lines += ["", "## Published anchors", "", f"CacheLib with FDP ({c['model']}):", "",
                  "| util | published no FDP -> FDP | simulated no FDP -> FDP |", "|---|---|---|"]
        for u in ("1.0", "0.5"):
            p, s = c["published"][f"util_{u}"], c["simulated"][f"util_{u}"]
            lines.append(f"| {float(u):.0%} | {p[0]:.2f} -> {p[1]:.2f} | {s[0]:.2f} -> {s[1]:.2f} |")
        s = m["simulated"]
        lines += ["", f"LMCache's FDP change ({m['model']}): published 2.600 -> 1.425; simulated "
                  f"{s['mixed']['cumulative_4x']:.3f} -> {s['separated']['cumulative_4x']:.3f} (initially isolated), "
                  f"{s['separated_persistent']['cumulative_4x']:.3f} (persistently isolated); in steady state "
                  f"{s['mixed']['steady']:.3f} -> {s['separated']['steady']:.3f} / "
                  f"{s['separated_persistent']['steady']:.3f}."]
    return "\n".join(lines) + "\n"


def plots(study: dict, rows: list[dict], out: str) -> tuple[list[str], Optional[str]]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "matplotlib is not importable: no plots (pip install matplotlib)"
    files = []
    utils = sorted({r["util"] for r in rows})
    configs = list(dict.fromkeys(r["config"] for r in rows))
    adms = list(dict.fromkeys(r["admission"] for r in rows))
    fig, axes = plt.subplots(1, len(adms), figsize=(6 * len(adms), 4.5), sharey=True, squeeze=False)
    for ax, adm in zip(axes[0], adms):
        width = 0.8 / len(utils)
        for j, util in enumerate(utils):
            sel = {r["config"]: r for r in rows if r["util"] == util and r["admission"] == adm}
            xs = [i + j * width for i in range(len(configs))]
            ys = [sel[c]["waf"] for c in configs]
            err = [[sel[c]["waf"] - sel[c]["waf_min"] for c in configs], [sel[c]["waf_max"] - sel[c]["waf"]
                                                                        for c in configs]]
            ax.bar(xs, ys, width, yerr=err, capsize=2, label=f"util {util:.0%}")
        ax.set_xticks([i + width * (len(utils) - 1) / 2 for i in range(len(configs))])
        ax.set_xticklabels(configs, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"admission {adm}")
        ax.set_ylabel("WAF (media / host writes)")
        ax.legend(fontsize=8)
    fig.suptitle("Simulated WAF per placement mode (bars: mean, whiskers: min-max over seeds)")
    fig.tight_layout()
    p = os.path.join(out, "waf_per_placement_mode.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    files.append(p)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for c in configs:
        for adm, style in zip(adms, ("-", "--")):
            pts = sorted((r["util"], r["waf"]) for r in rows if r["config"] == c and r["admission"] == adm)
            ax.plot([u for u, _ in pts], [w for _, w in pts], style, marker="o", label=f"{c} ({adm})")
    ax.set_xlabel("utilisation (fraction of the drive's logical space the cache uses)")
    ax.set_ylabel("WAF")
    ax.set_title("Simulated WAF against utilisation")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    p = os.path.join(out, "waf_vs_utilisation.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    files.append(p)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for util in utils:
        pts = []
        for c in configs:
            a = next((r for r in rows if r["config"] == c and r["util"] == util and r["admission"] == "always"), None)
            b = next((r for r in rows if r["config"] == c and r["util"] == util and r["admission"] == "second_hit"),
                     None)
            if a and b:
                pts.append((a["hit_ratio"] - b["hit_ratio"],
                            1 - b["media_mib_per_k_lookups"] / a["media_mib_per_k_lookups"]))
        ax.scatter([x for x, _ in pts], [y for _, y in pts], label=f"util {util:.0%}")
    ax.set_xlabel("hit ratio lost to second_hit admission")
    ax.set_ylabel("media writes per lookup saved (fraction)")
    ax.set_title("Write admission: media writes saved against hit ratio lost")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = os.path.join(out, "admission_media_writes_saved_vs_hit_ratio_lost.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    files.append(p)
    return files, None


def write_study(out: str, study: dict, val: Optional[dict], anc: Optional[dict], argv: list[str],
                plot: bool = True) -> list[str]:
    os.makedirs(out, exist_ok=True)
    rows = summarize(study)
    doc = dict(study, command=" ".join(argv), summary=rows, validation=val, anchors=anc)
    files = []
    p = os.path.join(out, "results.json")
    with open(p, "w") as f:
        json.dump(doc, f, indent=1)
    files.append(p)
    p = os.path.join(out, "summary.md")
    with open(p, "w") as f:
        f.write(markdown(study, rows, val, anc, argv))
    files.append(p)
    if plot:
        more, note = plots(study, rows, out)
        files += more
        if note:
            print(f"note: {note}", file=sys.stderr)
    return files
