#!/usr/bin/env bash
# Device call 2: on the tree's files (call 1's winners copied in): the GPU tests of the
# grouped kernels and the fp8 kernels, then the fp8 matrix (issue 12's command). Files back:
# gpu.txt, fp8.json, fp8.txt, log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME"
if [ -n "${REQUIRE:-}" ] && [[ "$NAME" != *"$REQUIRE"* ]]; then echo "not $REQUIRE: stop"; exit 3; fi
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_triton_gpu.py \
    -k "benchmark_shapes or ep_local" > $OUT/gpu.txt 2>&1
tail -2 $OUT/gpu.txt
timeout $((590 - SECONDS)) python3 -m moerun.cli bench --dtype fp8 \
    --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --no-progress \
    --out $OUT/fp8.json > $OUT/fp8.txt 2>>$OUT/log.txt
tail -6 $OUT/fp8.txt
echo "done at ${SECONDS}s"
