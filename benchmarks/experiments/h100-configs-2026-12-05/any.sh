#!/usr/bin/env bash
# Device call that branches on the card. H100: tune.sh bfloat16 (the H100 files). H200: the
# T=1 bf16 tune with the 42 direct configs into a copy of the shipped files, then the bf16
# matrix (issue 11's command) on that copy. Files back (H200): device.txt, tune-t1.txt,
# cfg-t1.tar (the four model files), bench.{json,txt}, log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME"
case "$NAME" in
  *H100*) exec bash benchmarks/experiments/h100-configs-2026-12-05/tune.sh bfloat16 480 ;;
esac
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total,driver_version \
    --format=csv > $OUT/device.txt 2>&1
rm -rf /tmp/cfg200 && cp -r moerun/backends/triton/configs /tmp/cfg200
timeout 200 python3 -m moerun.cli tune --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 \
    --T 1 --budget-s 170 --out-dir /tmp/cfg200 > $OUT/tune-t1.txt 2>&1
grep "^==\|^tune" $OUT/tune-t1.txt | cut -c1-220
( cd /tmp/cfg200 && tar -cf $OUT/cfg-t1.tar S8_N14336_K4096_bfloat16_NVIDIA_H200.json \
    S128_N768_K2048_bfloat16_NVIDIA_H200.json S128_N1536_K4096_bfloat16_NVIDIA_H200.json \
    S256_N2048_K7168_bfloat16_NVIDIA_H200.json )
MOERUN_TRITON_CONFIG_DIR=/tmp/cfg200 timeout $((590 - SECONDS)) python3 -m moerun.cli bench \
    --backends triton --dtype bfloat16 --repeats 20 --warmup 3 --graph-max-tokens 1024 \
    --calls-per-graph 10 --check-tokens 64 --seed 0 --peers none --no-progress \
    --out $OUT/bench.json > $OUT/bench.txt 2>>$OUT/log.txt
tail -3 $OUT/bench.txt
