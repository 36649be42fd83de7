#!/bin/bash
# The 64 KiB storm, two builds side by side: BEFORE and AFTER are checkouts, each built (make
# build); their runs interleaved, 3 rounds, both dirty regimes; results under OUT as
# main-dDIRTY-rROUND (BEFORE) and wt-gap-dDIRTY-rROUND (AFTER), which summarize.py reads.
# Run as root (the harness sets the dirty limits and holds page reporting).
: "${BEFORE:?a checkout of the build before}" "${AFTER:?a checkout of the build after}"
OUT=${OUT:-$PWD}
for round in 1 2 3; do
  for tree in main wt-gap; do
    src=$BEFORE; [ "$tree" = wt-gap ] && src=$AFTER
    for dirty in 67108864 0; do
      sync; echo 3 > /proc/sys/vm/drop_caches
      (cd "$src/benchmarks" && ../.venv/bin/python -m lmcache_rawblock_bench.extent_latency --slots 16384 \
        --repeat 8 --warmup 2 --page-reporting hold --dealloc auto --policies extent --dirty-bytes $dirty \
        --evictor-pass native --out "$OUT/$tree-d$dirty-r$round" > "$OUT/$tree-d$dirty-r$round.log" 2>&1)
    done
  done
done
