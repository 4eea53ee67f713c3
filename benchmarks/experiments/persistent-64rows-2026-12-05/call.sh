#!/usr/bin/env bash
# Device call (H200, session of 2026-12-05 from 15:42 UTC): tune_low.py at the three
# 64-rows-per-expert points into a copy of the shipped files. Files back: tune.txt, cfgp.tar.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME"
case "$NAME" in  # an H100: its own bf16 files instead (same session plan)
  *H100*) exec bash benchmarks/experiments/h100-configs-2026-12-05/tune.sh bfloat16 480 ;;
esac
D=benchmarks/experiments/persistent-64rows-2026-12-05
rm -rf /tmp/cfgp && cp -r moerun/backends/triton/configs /tmp/cfgp
timeout 200 python3 $D/tune_low.py --shapes qwen3-30b-a3b,qwen3-235b-a22b --T 1024 \
    --budget-s 150 --out-dir /tmp/cfgp > $OUT/tune.txt 2>&1
timeout 120 python3 $D/tune_low.py --shapes qwen3-235b-ep8-local --T 256 \
    --budget-s 90 --out-dir /tmp/cfgp >> $OUT/tune.txt 2>&1
grep "^==\|^tune\|incumbent\|final" $OUT/tune.txt | cut -c1-200
( cd /tmp/cfgp && tar -cf $OUT/cfgp.tar S128_N768_K2048_bfloat16_NVIDIA_H200.json \
    S128_N1536_K4096_bfloat16_NVIDIA_H200.json S16_N1536_K4096_bfloat16_NVIDIA_H200.json )
