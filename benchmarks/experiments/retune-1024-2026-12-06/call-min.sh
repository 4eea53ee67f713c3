#!/usr/bin/env bash
# H200 only, at most LIMIT seconds (default 300; the lease's last minutes): the tail split's
# H200 A/B (the mixtral bf16 rows, flags of run c, /tmp/new against the tree's files,
# new/old twice), the whole bf16 matrix on /tmp/new (the tree's files with tail_split on the
# H200 mixtral T=1024 entry), then the fp8 matrix on the tree's files if time is left.
# Files back: summary.txt, runs.tar.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-300}
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
BENCH_TIMEOUT=$(( LIMIT - 5 - SECONDS < 110 ? LIMIT - 5 - SECONDS : 110 )) bench matrix-new /tmp/new
if [ $SECONDS -lt $((LIMIT - 80)) ]; then
  timeout $((LIMIT - 5 - SECONDS)) python3 -m moerun.cli bench --dtype fp8 \
      --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --no-progress \
      --out /tmp/runs/fp8.json > /tmp/runs/fp8.txt 2>&1
  echo "fp8 rc=$? at ${SECONDS}s: $(grep -h 'geomean\|faster\|within' /tmp/runs/fp8.txt | cut -c1-150 | tr '\n' ' ')" \
      | tee -a $OUT/summary.txt
fi
tar -cf $OUT/runs.tar -C /tmp/runs .
date -u +"end %H:%M:%S" >> $OUT/summary.txt
