#!/usr/bin/env bash
# The fp8 launch program: its GPU tests (test_program_gpu.py, then the fp8 kernel, ws and
# layer files), then the host-time probe (programs off / on). Any sm90 card.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee $OUT/summary.txt
for f in tests/test_program_gpu.py tests/test_triton_fp8.py tests/test_fp8_ws.py tests/test_layer_gpu.py; do
  n=$(basename $f .py)
  timeout -k 10 150 python3 -m pytest -m gpu -q -p no:cacheprovider $f > /tmp/gpu-$n.txt 2>&1
  rc=$?
  { echo "===== $n rc=$rc"; cat /tmp/gpu-$n.txt; } >> $OUT/gpu.txt
  echo "$n rc=$rc at ${SECONDS}s: $(tail -1 /tmp/gpu-$n.txt | cut -c1-120)" | tee -a $OUT/summary.txt
done
timeout -k 10 240 python3 benchmarks/experiments/session-2026-12-06c/fp8_program_probe.py \
  --out $OUT/probe.json 2>&1 | grep -v Warning | tee $OUT/probe.txt
