#!/usr/bin/env bash
# The tail split on the H200 (H200 only: stops at once on another card): ab.py at mixtral
# T=1024 (head/off/on), then the bf16 matrix (flags of run c) on the tree's files ("new":
# mixtral T=1024 with tail_split) and on a copy holding HEAD a24d6c3's mixtral bf16 H200 file
# ("old"), interleaved new/old/new while time lasts.
# Files back: summary.txt, ab.txt, ab.json, runs.tar.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME" | tee $OUT/summary.txt
if [[ "$NAME" != *H200* ]]; then echo "not an H200: stop"; exit 3; fi
date -u +"start %H:%M:%S" >> $OUT/summary.txt
timeout -k 10 90 python3 benchmarks/experiments/tail-split-2026-12-06/ab.py --out $OUT/ab.json \
    --cells mixtral8x7b:1024 > $OUT/ab.txt 2>&1
echo "ab rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
grep -v Warn $OUT/ab.txt | grep -v _warn_once | tee -a $OUT/summary.txt
rm -rf /tmp/old /tmp/runs && cp -r moerun/backends/triton/configs /tmp/old && mkdir -p /tmp/runs
cp benchmarks/experiments/tail-split-2026-12-06/mixtral-bf16-H200-a24d6c3.json \
    /tmp/old/S8_N14336_K4096_bfloat16_NVIDIA_H200.json
bench() {  # $1: run name, $2: config dir ('' = the tree's), $3: timeout
  date -u +"$1 start %H:%M:%S" >> $OUT/summary.txt
  MOERUN_TRITON_CONFIG_DIR=$2 timeout $3 python3 -m moerun.cli bench --backends triton \
    --dtype bfloat16 --repeats 20 --warmup 3 --graph-max-tokens 1024 --calls-per-graph 10 \
    --check-tokens 64 --seed 0 --peers none --no-progress --out /tmp/runs/$1.json \
    > /tmp/runs/$1.txt 2>&1
  echo "$1 rc=$? at ${SECONDS}s: $(grep '^summary' /tmp/runs/$1.txt | cut -c1-150 | tr '\n' ' ')" \
    | tee -a $OUT/summary.txt
  tar -cf $OUT/runs.tar -C /tmp/runs .
}
bench new-1 "" 160
[ $SECONDS -lt 380 ] && bench old-1 /tmp/old 160
[ $SECONDS -lt 440 ] && bench new-2 "" $((590 - SECONDS))
date -u +"end %H:%M:%S" >> $OUT/summary.txt
