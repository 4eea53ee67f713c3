#!/usr/bin/env bash
# Call 1 (device): the wide-tile A/B, then the decode points tuned with the wider direct
# candidate space, fp8 and bf16, into copies of the config folder (packed as tune.tgz).
export PYTHONPATH=.
D=benchmarks/experiments/fp8-wide-2026-12-05
timeout 330 python3 $D/ab_wide.py --out $OUT/ab-wide-h200-run1.json 2>&1 | grep -v Warn \
    | tee $OUT/ab-wide-h200-run1.txt
mkdir -p /tmp/t8 /tmp/t16
S=qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3,mixtral8x7b
timeout 120 python3 $D/tune_direct.py --dtype fp8 --shapes $S --T 1 --out-dir /tmp/t8 \
    > $OUT/tune-direct-fp8-log.txt 2>&1
timeout 120 python3 $D/tune_direct.py --shapes $S --T 1 --out-dir /tmp/t16 \
    > $OUT/tune-direct-bf16-log.txt 2>&1
tar czf $OUT/tune.tgz -C /tmp t8 t16
grep "^==" $OUT/tune-direct-*-log.txt
