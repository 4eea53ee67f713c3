#!/usr/bin/env bash
# Any card: host_profile.py at qwen3-235b-ep8-local T=2048 for the first ws candidate and for
# the shipped (grouped) entry, and at qwen3-30b T=8192 (shipped ws).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/ws-host-2026-12-06
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee $OUT/summary.txt
for a in "qwen3-235b-ep8-local:2048 ws" "qwen3-235b-ep8-local:2048 shipped" "qwen3-30b-a3b:8192 shipped"; do
  set -- $a
  timeout -k 10 120 python3 $D/host_profile.py --cell $1 --config $2 > $OUT/prof-${1%%:*}-${1##*:}-$2.txt 2>&1
  echo "$1 $2 rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
done
