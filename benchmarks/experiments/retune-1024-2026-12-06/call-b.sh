#!/usr/bin/env bash
# The second call after call.sh, on the same warm H200: whole bf16 matrices on the tuned copy
# (build/tuned, left by call.sh) and on /tmp/new (rebuilt: the tree's files with tail_split on
# the H200 mixtral T=1024 entry), in the order new, tuned; then the fp8 matrix on the tuned
# copy and on the tree's files. Files back: summary.txt, runs.tar.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME" | tee $OUT/summary.txt
if [[ "$NAME" != *H200* ]]; then echo "not an H200: stop"; exit 3; fi
[ -d build/tuned ] || { echo "no build/tuned: run call.sh first" | tee -a $OUT/summary.txt; exit 4; }
date -u +"start %H:%M:%S" >> $OUT/summary.txt
source benchmarks/experiments/tail-split-2026-12-06/bench_lib.sh  # new_dir; bench NAME DIR [FLAGS]
rm -rf /tmp/tuned /tmp/runs && mkdir -p /tmp/runs && new_dir
cp -r build/tuned /tmp/tuned
export BENCH_TIMEOUT=120
for r in new-4 tuned-2; do bench matrix-$r /tmp/${r%-*}; done
fp8() {  # fp8 NAME DIR (empty: the tree's files)
  date -u +"fp8 $1 start %H:%M:%S" >> $OUT/summary.txt
  if [ -n "$2" ]; then export MOERUN_TRITON_CONFIG_DIR=$2; else unset MOERUN_TRITON_CONFIG_DIR; fi
  timeout $(( (590 - SECONDS) < 150 ? 590 - SECONDS : 150 )) python3 -m moerun.cli bench \
      --dtype fp8 --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --no-progress \
      --out /tmp/runs/fp8-$1.json > /tmp/runs/fp8-$1.txt 2>&1
  echo "fp8 $1 rc=$? at ${SECONDS}s: $(grep -h 'geomean\|faster\|within' /tmp/runs/fp8-$1.txt | cut -c1-150 | tr '\n' ' ')" \
      | tee -a $OUT/summary.txt
  unset MOERUN_TRITON_CONFIG_DIR
  tar -cf $OUT/runs.tar -C /tmp/runs .
}
fp8 tuned /tmp/tuned
[ $SECONDS -lt 500 ] && fp8 tree ""
tar -cf $OUT/runs.tar -C /tmp/runs .
date -u +"end %H:%M:%S" >> $OUT/summary.txt
