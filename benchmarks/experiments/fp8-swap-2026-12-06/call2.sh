#!/usr/bin/env bash
# ExpertsConfig.swap_ab on the grouped kernels at 16/32-row tiles, any sm90 card (about 200 s):
# the GPU tests that run it (fp8 and bf16), then `moerun tune --T 16,128 --dry-run` of the four
# model shapes, fp8 then bf16: the x W^T tiles as before, and at 16/32-row points the swap
# forms (qualifying gate/up tiles alone, then each qualifying down tile as a whole call with
# the best), the incumbent among them, three interleaved finals. Nothing is written.
# Files back: summary.txt, gpu-tests.txt, tune-fp8.txt, tune-bfloat16.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee $OUT/summary.txt
timeout -k 10 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_triton_fp8.py \
    tests/test_triton_gpu.py -k "swap or (cuda and kernels)" > $OUT/gpu-tests.txt 2>&1
echo "gpu tests rc=$? at ${SECONDS}s: $(tail -1 $OUT/gpu-tests.txt | cut -c1-150)" | tee -a $OUT/summary.txt
for dt in fp8 bfloat16; do
  timeout -k 10 130 python3 -m moerun.cli tune --dtype $dt --shapes $S --T 16,128 --dry-run \
      --budget-s 110 > $OUT/tune-$dt.txt 2>&1
  echo "tune $dt rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
  grep -h "^==" $OUT/tune-$dt.txt | cut -c1-220 | tee -a $OUT/summary.txt
  grep -h "incumbent\|final:" $OUT/tune-$dt.txt | cut -c1-160 | tee -a $OUT/summary.txt
done
