#!/usr/bin/env bash
# The third device call on the H100: with the H100 files now in moerun/backends/triton/configs,
# the whole GPU suite (it runs the tuned kernels through the default config table), then the
# bf16 matrix (model and EP-local cells) and the fp8 matrix of issue 12's command, both with
# every cell's config source. Files back: gpu-tests.txt, bench.{json,txt}, fp8.{json,txt},
# log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $OUT/gpu-tests.txt 2>&1
tail -3 $OUT/gpu-tests.txt
timeout 170 python3 -m moerun.cli bench --backends triton --dtype bfloat16 --repeats 20 \
    --warmup 3 --graph-max-tokens 1024 --calls-per-graph 10 --check-tokens 64 --seed 0 \
    --peers none --no-progress --out $OUT/bench.json > $OUT/bench.txt 2>>$LOG
tail -3 $OUT/bench.txt
timeout $((585 - SECONDS)) python3 -m moerun.cli bench --dtype fp8 \
    --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --no-progress \
    --out $OUT/fp8.json > $OUT/fp8.txt 2>>$LOG
tail -4 $OUT/fp8.txt
