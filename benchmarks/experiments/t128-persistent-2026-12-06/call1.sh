#!/usr/bin/env bash
# On an H200: the prepared H200 call (../retune-1024-2026-12-06/call.sh). Elsewhere: probe.py
# (mixtral T=128 bf16 with persistent configs against the card's shipped entry), twice.
set -u
source benchmarks/experiments/retune-1024-2026-12-06/h200_first.sh  # H200: call.sh
D=benchmarks/experiments/t128-persistent-2026-12-06
for r in 1 2; do
  timeout -k 10 200 python3 $D/probe.py --out $OUT/probe-$r.json > $OUT/probe-$r.txt 2>&1
  echo "probe $r rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
  cat $OUT/probe-$r.txt | tail -12
done
