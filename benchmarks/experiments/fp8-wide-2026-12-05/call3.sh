#!/usr/bin/env bash
# Call 3 (device): moerun tune --dtype fp8 at the prefill points into a copy of the config
# folder (the shipped entries as incumbents), the fp8 matrix on those configs, then the fp8
# GPU tests. Files back: cfg.tgz (the fp8 files), the logs, the matrix json/txt.
export PYTHONPATH=.
C=/tmp/cfg
mkdir -p $C && cp moerun/backends/triton/configs/*.json $C/
S=mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3
timeout 260 python3 -m moerun.cli tune --dtype fp8 --shapes $S --T 1024,8192 --budget-s 200 \
    --out-dir $C > $OUT/tune-fp8-log.txt 2>&1
tar czf $OUT/cfg.tgz -C $C $(cd $C && ls *float8*)
grep "^==" $OUT/tune-fp8-log.txt
MOERUN_TRITON_CONFIG_DIR=$C timeout 100 python3 -m moerun.cli bench --dtype fp8 --shapes $S \
    --peers none --no-progress --out $OUT/fp8-matrix.json > $OUT/fp8-matrix.txt 2>&1
tail -8 $OUT/fp8-matrix.txt
timeout 180 python3 -m pytest -m gpu -q -x tests/test_fp8_ws.py tests/test_triton_fp8.py \
    > $OUT/pytest-gpu.txt 2>&1
tail -3 $OUT/pytest-gpu.txt
