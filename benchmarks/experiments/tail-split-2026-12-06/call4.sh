#!/usr/bin/env bash
# The tail split (parts form), one call for any sm90 card: the persistent GPU tests; ab.py
# (head/off/on) at four cells; then, on an H200 only, mixtral8x7b T=1024 re-tuned (bf16) into
# a copy of the shipped files (the persistent candidates include the split) and the bf16
# matrix (flags of run c) on the copy and on the shipped files.
# Files back: summary.txt, gpu-tests.txt, ab.txt, ab.json, tune.txt, cfg.tar, runs.tar.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME" | tee $OUT/summary.txt
date -u +"start %H:%M:%S" >> $OUT/summary.txt
timeout -k 10 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_triton_persistent.py \
    > $OUT/gpu-tests.txt 2>&1
echo "gpu tests rc=$? at ${SECONDS}s: $(tail -1 $OUT/gpu-tests.txt)" | tee -a $OUT/summary.txt
timeout -k 10 120 python3 benchmarks/experiments/tail-split-2026-12-06/ab.py --out $OUT/ab.json \
    --cells mixtral8x7b:1024,deepseek-v3-ep8-local:2048,qwen3-235b-a22b:8192,deepseek-v3:8192 \
    > $OUT/ab.txt 2>&1
echo "ab rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
grep -v Warn $OUT/ab.txt | grep -v _warn_once
if [[ "$NAME" != *H200* ]]; then echo "not an H200: no matrices"; exit 0; fi
rm -rf /tmp/cfg /tmp/runs && cp -r moerun/backends/triton/configs /tmp/cfg && mkdir -p /tmp/runs
timeout 110 python3 -m moerun.cli tune --shapes mixtral8x7b --T 1024 --budget-s 90 \
    --out-dir /tmp/cfg > $OUT/tune.txt 2>&1
echo "tune rc=$? at ${SECONDS}s" >> $OUT/summary.txt
grep -h "^==" $OUT/tune.txt | cut -c1-220 | tee -a $OUT/summary.txt
tar -cf $OUT/cfg.tar -C /tmp/cfg .
source benchmarks/experiments/tail-split-2026-12-06/bench_lib.sh  # bench NAME DIR [FLAGS]
bench copy-1 /tmp/cfg
[ $SECONDS -lt 440 ] && BENCH_TIMEOUT=$((590 - SECONDS)) bench shipped-1 ""
date -u +"end %H:%M:%S" >> $OUT/summary.txt
cat $OUT/summary.txt
