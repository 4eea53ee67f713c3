#!/usr/bin/env bash
# Stream-K tail, any sm90 card: the persistent GPU tests, then ab.py (head/off/on) over the
# shipped persistent bf16 cells. Files back: summary.txt, gpu-tests.txt, ab.txt, ab.json.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card" | tee $OUT/summary.txt
date -u +"start %H:%M:%S" >> $OUT/summary.txt
timeout -k 10 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_triton_persistent.py \
    > $OUT/gpu-tests.txt 2>&1
echo "gpu tests rc=$? at ${SECONDS}s: $(tail -1 $OUT/gpu-tests.txt)" | tee -a $OUT/summary.txt
timeout -k 10 $((560 - SECONDS)) python3 benchmarks/experiments/tail-split-2026-12-06/ab.py \
    --out $OUT/ab.json > $OUT/ab.txt 2>&1
echo "ab rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
date -u +"end %H:%M:%S" >> $OUT/summary.txt
grep -v Warn $OUT/ab.txt | grep -v _warn_once | tail -60
