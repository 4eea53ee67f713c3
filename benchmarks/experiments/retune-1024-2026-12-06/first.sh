#!/usr/bin/env bash
# The session's first device call. On an H200: call.sh (then call-b.sh on the warm machine).
# On any other card: the GPU tests file by file (../retune-mid-2026-12-05/gpu-suite.sh), the
# first whole-suite run since the persistent kernels' tail split (2026-12-06).
set -u
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$NAME" == *H200* ]]; then
  bash benchmarks/experiments/retune-1024-2026-12-06/call.sh
else
  bash benchmarks/experiments/retune-mid-2026-12-05/gpu-suite.sh
fi
