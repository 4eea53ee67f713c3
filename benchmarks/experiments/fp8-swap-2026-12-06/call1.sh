#!/usr/bin/env bash
# ExpertsConfig.swap_ab on any sm90 card: the direct path's GPU tests (swap off and on),
# then `moerun tune --T 1 --dry-run` of the four model shapes, fp8 then bf16: every direct
# config (the 15 / 42 of before and the 6 / 8 swap_ab copies) timed as whole calls in graph
# replay, the incumbent (the card's shipped entry) among them, three interleaved finals.
# Nothing is written. Files back: summary.txt, gpu-tests.txt, tune-fp8.txt, tune-bf16.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee $OUT/summary.txt
timeout -k 10 170 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_triton_fp8.py \
    tests/test_triton_gpu.py -k "direct" > $OUT/gpu-tests.txt 2>&1
echo "gpu tests rc=$? at ${SECONDS}s: $(tail -1 $OUT/gpu-tests.txt | cut -c1-150)" | tee -a $OUT/summary.txt
for dt in fp8 bfloat16; do
  timeout -k 10 190 python3 -m moerun.cli tune --dtype $dt --shapes $S --T 1 --dry-run \
      --budget-s 170 > $OUT/tune-$dt.txt 2>&1
  echo "tune $dt rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
  grep -h "^==" $OUT/tune-$dt.txt | cut -c1-220 | tee -a $OUT/summary.txt
  grep -h "incumbent\|final:" $OUT/tune-$dt.txt | cut -c1-160 | tee -a $OUT/summary.txt
done
