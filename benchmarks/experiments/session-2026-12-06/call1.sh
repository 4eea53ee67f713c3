#!/usr/bin/env bash
# First call of the session of 2026-12-06 from 02:31 UTC. On an H200: the mid-point retune
# and both issue matrices (../retune-mid-2026-12-05/call.sh). On any other sm90 card: the
# CUDA MoE grid-order probe (../cuda-fp8-mc-2026-12-05/call3.sh), then the GPU tests file by
# file until 580 s (../retune-mid-2026-12-05/gpu-suite.sh, its own clock moved by the time
# call3 took).
set -u
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$NAME" == *H200* ]]; then
  bash benchmarks/experiments/retune-mid-2026-12-05/call.sh
else
  bash benchmarks/experiments/cuda-fp8-mc-2026-12-05/call3.sh
  used=$SECONDS
  sed "s/\$SECONDS -gt 560/\$((SECONDS + $used)) -gt 440/" \
      benchmarks/experiments/retune-mid-2026-12-05/gpu-suite.sh > /tmp/gpu-suite.sh
  bash /tmp/gpu-suite.sh
fi
