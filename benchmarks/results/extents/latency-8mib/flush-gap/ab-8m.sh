#!/bin/bash
# 8 MiB puts on an 8 GiB zram device (reset before each run), two builds side by side: BEFORE
# and AFTER are checkouts, each built; 2 rounds interleaved; results under OUT/zram-8m as
# main-rROUND (BEFORE) and wt-gap-rROUND (AFTER). Run as root.
: "${BEFORE:?a checkout of the build before}" "${AFTER:?a checkout of the build after}"
OUT=${OUT:-$PWD}/zram-8m
mkdir -p "$OUT"
for round in 1 2; do
  for tree in main wt-gap; do
    src=$BEFORE; [ "$tree" = wt-gap ] && src=$AFTER
    sync; echo 3 > /proc/sys/vm/drop_caches
    (cd "$src/benchmarks" && ../.venv/bin/python -m lmcache_rawblock_bench.rig run -n 1 --backend zram --size 8Gi \
      --read-cap 0 --write-cap 0 -- sh -c "../.venv/bin/python -m lmcache_rawblock_bench.extent_latency \
      --policies extent --device \$RIG_DEVICES --chunk 8388608 --per 8 --rounds 3 --dealloc on --free-lane on \
      --evictor-pass native --repeat 6 --warmup 2 --dirty-bytes 268435456 --reset-device --page-reporting hold \
      --out $OUT/$tree-r$round" > "$OUT/$tree-r$round.log" 2>&1)
  done
done
