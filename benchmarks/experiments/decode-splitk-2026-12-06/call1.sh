#!/usr/bin/env bash
# On an H200: the prepared H200 call (../retune-1024-2026-12-06/call.sh). On any other card:
# the split-K emulation probe (probe.py; fp8 at the four T=1 model cells, then bf16 at
# qwen3-30b and qwen3-235b), under a time limit, its JSON written after every cell.
set -u
source benchmarks/experiments/retune-1024-2026-12-06/h200_first.sh  # H200: call.sh
D=benchmarks/experiments/decode-splitk-2026-12-06
timeout -k 10 ${LIMIT:-380} python3 $D/probe.py --out $OUT/probe-fp8.json --dtypes fp8 \
    > $OUT/log-fp8.txt 2>&1
echo "fp8 rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
timeout -k 10 $((560 - SECONDS)) python3 $D/probe.py --out $OUT/probe-bf16.json --dtypes bf16 \
    --cells qwen3-30b-a3b,qwen3-235b-a22b > $OUT/log-bf16.txt 2>&1
echo "bf16 rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
tail -n 30 $OUT/log-fp8.txt $OUT/log-bf16.txt
