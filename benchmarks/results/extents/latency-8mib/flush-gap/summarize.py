# The A/B of the 64 KiB storm (ab.sh): per tree and dirty regime, the runs of all rounds
# (warm-ups left out): the median of the runs' own full/room ratios, the checkpoints a run
# wrote and their duration, and what the puts had to do for room themselves.
# Run: python3 summarize.py DIR   (DIR holds TREE-dDIRTY-rROUND/latency.json)
import glob
import json
import statistics as S
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
print("| dirty limit | build | runs | p50 | p99 | mean | checkpoints a run | their mean / p99 ms "
      "| keys a put evicted itself | checkpoints for room |")
print("|---|---|---|---|---|---|---|---|---|---|")
for d, dname in (("67108864", "64 MiB"), ("0", "the machine's")):
    for tree, tname in (("main", "before"), ("wt-gap", "after")):
        runs = [r for f in sorted(glob.glob(f"{root}/{tree}-d{d}-r*/latency.json"))
                for r in json.load(open(f))["runs"] if not r.get("warmup")]
        if not runs:
            continue
        m = lambda k: S.median(r[k] for r in runs)  # noqa: E731
        ck = [r["checkpoint_count_mean_p99_us"] for r in runs]
        print(f"| {dname} | {tname} | {len(runs)} | {m('full_over_room_p50'):.2f} | {m('full_over_room_p99'):.2f} "
              f"| {m('full_over_room_mean'):.2f} | {S.median(c[0] for c in ck):.0f} "
              f"| {S.median(c[1] for c in ck) / 1e3:.1f} / {S.median(c[2] for c in ck) / 1e3:.1f} "
              f"| {sum(r['status']['put_evicted_entries'] for r in runs)} "
              f"| {sum(r['status']['checkpoints_for_room'] for r in runs)} |")
