#!/usr/bin/env bash
# One device call (under 10 minutes by its timeouts), session of 2026-12-05 from 10:27 UTC:
# the GPU tests of what changed on the CPU today, then the fp8 and bf16 expert matrices on the
# submitted tree (issue 12's and 11's bars). Files back (6): gpu-tests.txt, fp8.{json,txt},
# bench.{json,txt}, log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG=$OUT/log.txt

# 1. check_inputs' CUDA default, forward_async on its stream, the ws kernels (gather result)
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_layer_gpu.py \
    tests/test_forward_async.py tests/test_fp8_ws.py tests/test_program_gpu.py \
    > $OUT/gpu-tests.txt 2>&1
tail -2 $OUT/gpu-tests.txt

# 2. the fp8 matrix (issue 12): the 20 model cells
timeout 150 python3 -m moerun.cli bench --dtype fp8 \
    --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --no-progress \
    --out $OUT/fp8.json > $OUT/fp8.txt 2>>$LOG
tail -4 $OUT/fp8.txt

# 3. the bf16 matrix (issue 11), the command of the 03:54 UTC matrix, if time is left
if [ $SECONDS -lt 300 ]; then
  timeout $((570 - SECONDS)) python3 -m moerun.cli bench --backends triton --dtype bfloat16 \
      --repeats 20 --warmup 3 --graph-max-tokens 1024 --calls-per-graph 10 --check-tokens 64 \
      --seed 0 --peers none --no-progress --out $OUT/bench.json > $OUT/bench.txt 2>>$LOG
  tail -3 $OUT/bench.txt
else
  echo "bf16 matrix skipped at ${SECONDS}s" | tee -a $LOG
fi
