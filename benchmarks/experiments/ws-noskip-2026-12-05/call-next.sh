#!/usr/bin/env bash
# Prepared for the next session with an H200 (not run yet): the skip A/B on the H200's ws
# cells, then `moerun tune --dtype fp8` of the ws points with the skip candidates into a
# copy of the shipped files, then the issue 12 matrix on that copy and the ws GPU tests.
# REQUIRE=H200 stops at once on another card. Files back: ab.json, tune.txt, cfg.tar,
# fp8.json, fp8.txt, gpu.txt, log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME"
if [ -n "${REQUIRE:-}" ] && [[ "$NAME" != *"$REQUIRE"* ]]; then echo "not $REQUIRE: stop"; exit 3; fi
timeout 120 python3 benchmarks/experiments/ws-noskip-2026-12-05/ab_noskip.py --out $OUT/ab.json \
    2>>$OUT/log.txt | cut -c1-150
rm -rf /tmp/cfg && cp -r moerun/backends/triton/configs /tmp/cfg
timeout 200 python3 -m moerun.cli tune --dtype fp8 \
    --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --T 1024,8192 \
    --budget-s 170 --out-dir /tmp/cfg > $OUT/tune.txt 2>&1
grep "^==\|^tune: wrote" $OUT/tune.txt | cut -c1-200
tar -cf $OUT/cfg.tar -C /tmp/cfg .
MOERUN_TRITON_CONFIG_DIR=/tmp/cfg timeout 120 python3 -m moerun.cli bench --dtype fp8 \
    --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --no-progress \
    --out $OUT/fp8.json > $OUT/fp8.txt 2>>$OUT/log.txt
grep "geomean\|faster\|within" $OUT/fp8.txt
MOERUN_TRITON_CONFIG_DIR=/tmp/cfg timeout $((590 - SECONDS)) python3 -m pytest -m gpu -q \
    -p no:cacheprovider tests/test_fp8_ws.py > $OUT/gpu.txt 2>&1
tail -1 $OUT/gpu.txt
echo "done at ${SECONDS}s"
