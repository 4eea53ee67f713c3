#!/usr/bin/env bash
# Any card (sm90): the ws GPU tests and the launcher tests with the Gluon kernels behind
# FastLauncher, then ab_launch.py (FastLauncher against Triton's launch path, same process).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/ws-host-2026-12-06
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee $OUT/summary.txt
timeout -k 10 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8_ws.py \
    tests/test_triton_fp8.py > $OUT/gpu.txt 2>&1
echo "gpu tests rc=$? at ${SECONDS}s: $(tail -1 $OUT/gpu.txt)" | tee -a $OUT/summary.txt
timeout -k 10 200 python3 $D/ab_launch.py --out $OUT/ab.json > $OUT/ab.txt 2>&1
echo "ab rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
grep -v -i warn $OUT/ab.txt | tail -10
