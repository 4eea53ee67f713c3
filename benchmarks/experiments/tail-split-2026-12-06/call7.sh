#!/usr/bin/env bash
# The tail split on the H200 (H200 only: stops at once on another card). /tmp/new: the tree's
# files with tail_split on the H200 file's mixtral8x7b T=1024 entry (the tree ships it only
# in the H100 file). The mixtral bf16 rows of the matrix (flags of run c) on /tmp/new and on
# the tree's files, interleaved new/old/new/old, then the whole bf16 matrix on /tmp/new and
# the fp8 matrix on the tree's files.
# Files back: summary.txt, runs.tar.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME" | tee $OUT/summary.txt
if [[ "$NAME" != *H200* ]]; then echo "not an H200: stop"; exit 3; fi
date -u +"start %H:%M:%S" >> $OUT/summary.txt
source benchmarks/experiments/tail-split-2026-12-06/bench_lib.sh  # new_dir; bench NAME DIR [FLAGS]
rm -rf /tmp/runs && mkdir -p /tmp/runs && new_dir
for r in new-1 old-1 new-2 old-2; do
  d=""; [[ $r == new* ]] && d=/tmp/new
  bench $r "$d" --shapes mixtral8x7b
done
bench matrix-new /tmp/new
# the fp8 matrix on the tree's files (no fp8 matrix has run on exactly them since the
# deepseek-v3 T=128 fp8 entry of 2026-12-06 04:11 UTC)
date -u +"fp8 start %H:%M:%S" >> $OUT/summary.txt
timeout $((590 - SECONDS)) python3 -m moerun.cli bench --dtype fp8 \
    --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --no-progress \
    --out /tmp/runs/fp8.json > /tmp/runs/fp8.txt 2>&1
echo "fp8 rc=$? at ${SECONDS}s: $(grep -h 'geomean\|faster\|within' /tmp/runs/fp8.txt | cut -c1-150 | tr '\n' ' ')" \
    | tee -a $OUT/summary.txt
tar -cf $OUT/runs.tar -C /tmp/runs .
date -u +"end %H:%M:%S" >> $OUT/summary.txt
