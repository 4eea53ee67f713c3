#!/usr/bin/env bash
# Prepared for the next H200 lease (not run): the T=16 and T=128 points of the four model
# shapes re-tuned on the H200, bf16 then fp8, into a copy of the shipped files. The bf16
# qwen3 entries there date from 2026-11-29 and the others from 2026-12-01, tuned over smaller
# spaces than today's. Then both issue matrices run on that copy. REQUIRE=H200 stops at once
# on another card. Files back: tune-bf16.txt, tune-fp8.txt, cfg.tar, bf16.{json,txt},
# fp8.{json,txt}.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME"
if [ -n "${REQUIRE:-}" ] && [[ "$NAME" != *"$REQUIRE"* ]]; then echo "not $REQUIRE: stop"; exit 3; fi
S=mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3
rm -rf /tmp/cfg && cp -r moerun/backends/triton/configs /tmp/cfg
timeout 150 python3 -m moerun.cli tune --shapes $S --T 16,128 --budget-s 140 --out-dir /tmp/cfg \
    > $OUT/tune-bf16.txt 2>&1
timeout 150 python3 -m moerun.cli tune --dtype fp8 --shapes $S --T 16,128 --budget-s 140 \
    --out-dir /tmp/cfg > $OUT/tune-fp8.txt 2>&1
grep -h "^==" $OUT/tune-bf16.txt $OUT/tune-fp8.txt | cut -c1-170
tar -cf $OUT/cfg.tar -C /tmp/cfg .
MOERUN_TRITON_CONFIG_DIR=/tmp/cfg timeout 170 python3 -m moerun.cli bench --backends triton \
    --dtype bfloat16 --repeats 20 --warmup 3 --graph-max-tokens 1024 --calls-per-graph 10 \
    --check-tokens 64 --seed 0 --peers none --no-progress --out $OUT/bf16.json > $OUT/bf16.txt 2>&1
grep "^summary" $OUT/bf16.txt | cut -c1-160
MOERUN_TRITON_CONFIG_DIR=/tmp/cfg timeout $((590 - SECONDS)) python3 -m moerun.cli bench \
    --dtype fp8 --shapes $S --no-progress --out $OUT/fp8.json > $OUT/fp8.txt 2>&1
grep "geomean\|faster\|within" $OUT/fp8.txt
echo "done at ${SECONDS}s"
