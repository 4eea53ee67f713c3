#!/usr/bin/env bash
# H200 only (stops at once on another card). One call, at most about 585 s:
# 1. /tmp/new: the tree's files with tail_split on the H200 file's mixtral8x7b T=1024 entry;
#    the mixtral bf16 rows (flags of run c) on /tmp/new and the tree's files, new/old x2;
# 2. `moerun tune` into /tmp/tuned, a copy of /tmp/new: bf16 at T=1 and T=1024 of the four
#    model shapes (the H200 T=1024 entries date from 2026-12-02 and 2026-12-03, before the
#    tail split; T=1 now offers the swap_ab direct configs), then fp8 at T=1, 16 and 128
#    (the swap_ab direct configs and grouped forms: chosen at 10 of these 12 fp8 points on an
#    H100);
# 3. the whole bf16 matrix on /tmp/tuned, then the fp8 matrix on it as time allows
#    (`call-b.sh`, issued on the warm machine right after if the lease allows, runs the bf16
#    matrices on /tmp/new and /tmp/tuned and the fp8 matrix on both file sets).
# Files back: summary.txt, runs.tar, tuned.tar (the tuned folder, also left in build/tuned).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME" | tee $OUT/summary.txt
if [[ "$NAME" != *H200* ]]; then echo "not an H200: stop"; exit 3; fi
date -u +"start %H:%M:%S" >> $OUT/summary.txt
source benchmarks/experiments/tail-split-2026-12-06/bench_lib.sh  # new_dir; bench NAME DIR [FLAGS]
rm -rf /tmp/tuned /tmp/runs && mkdir -p /tmp/runs && new_dir
for r in new-1 old-1 new-2 old-2; do
  d=""; [[ $r == new* ]] && d=/tmp/new
  bench $r "$d" --shapes mixtral8x7b
done
cp -r /tmp/new /tmp/tuned
date -u +"tune start %H:%M:%S" >> $OUT/summary.txt
S=mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3
timeout 190 python3 -m moerun.cli tune --shapes $S --T 1,1024 --budget-s 160 --out-dir /tmp/tuned \
    > /tmp/runs/tune.txt 2>&1
echo "tune rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
timeout 100 python3 -m moerun.cli tune --dtype fp8 --shapes $S --T 1,16,128 --budget-s 80 \
    --out-dir /tmp/tuned > /tmp/runs/tune-fp8.txt 2>&1
echo "tune fp8 rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
grep -h "^==" /tmp/runs/tune.txt /tmp/runs/tune-fp8.txt | cut -c1-200 | tee -a $OUT/summary.txt
tar -cf $OUT/tuned.tar -C /tmp/tuned . && rm -rf build/tuned && mkdir -p build && cp -r /tmp/tuned build/tuned
export BENCH_TIMEOUT=120
bench matrix-tuned-1 /tmp/tuned
date -u +"fp8 start %H:%M:%S" >> $OUT/summary.txt
if [ $SECONDS -lt 480 ]; then  # the fp8 matrix on the tuned copy (its fp8 T<=128 entries)
  MOERUN_TRITON_CONFIG_DIR=/tmp/tuned timeout $((585 - SECONDS)) python3 -m moerun.cli bench \
      --dtype fp8 --shapes $S --no-progress --out /tmp/runs/fp8-tuned.json \
      > /tmp/runs/fp8-tuned.txt 2>&1
  echo "fp8 tuned rc=$? at ${SECONDS}s: $(grep -h 'geomean\|faster\|within' /tmp/runs/fp8-tuned.txt | cut -c1-150 | tr '\n' ' ')" \
      | tee -a $OUT/summary.txt
fi
tar -cf $OUT/runs.tar -C /tmp/runs .
date -u +"end %H:%M:%S" >> $OUT/summary.txt
