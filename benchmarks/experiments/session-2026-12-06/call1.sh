#!/usr/bin/env bash
# First call of the session of 2026-12-06 from 02:31 UTC. On an H200: the mid-point retune
# and both issue matrices (../retune-mid-2026-12-05/call.sh). On any other card: the GPU
# tests file by file (../retune-mid-2026-12-05/gpu-suite.sh); call2.sh follows on the warm
# machine.
set -u
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$NAME" == *H200* ]]; then
  bash benchmarks/experiments/retune-mid-2026-12-05/call.sh
else
  bash benchmarks/experiments/retune-mid-2026-12-05/gpu-suite.sh
fi
