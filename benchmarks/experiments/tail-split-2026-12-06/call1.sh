#!/usr/bin/env bash
# Tail split, first device call: the persistent GPU tests (tail_split 1 and 4, the kernels'
# counters), then the A/B of ab.py over the shipped persistent bf16 cells, then t128.py
# (mixtral T=128 tiles with grouped program order). Any sm90 card;
# REQUIRE=H200 stops at once on another.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card" | tee $OUT/summary.txt
if [ "${REQUIRE:-}" = "H200" ] && [[ "$card" != *H200* ]]; then echo "not an H200: stop"; exit 3; fi
date -u +"start %H:%M:%S" >> $OUT/summary.txt
timeout -k 10 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_triton_persistent.py \
    > $OUT/gpu-tests.txt 2>&1
echo "gpu tests rc=$? at ${SECONDS}s: $(tail -1 $OUT/gpu-tests.txt)" | tee -a $OUT/summary.txt
timeout -k 10 $((470 - SECONDS)) python3 benchmarks/experiments/tail-split-2026-12-06/ab.py \
    --out $OUT/ab.json > $OUT/ab.txt 2>&1
echo "ab rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
timeout -k 10 $((575 - SECONDS)) python3 benchmarks/experiments/tail-split-2026-12-06/t128.py \
    --out $OUT/t128.json > $OUT/t128.txt 2>&1
echo "t128 rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
date -u +"end %H:%M:%S" >> $OUT/summary.txt
tail -70 $OUT/ab.txt; cat $OUT/t128.txt | tail -20
