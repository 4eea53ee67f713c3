#!/usr/bin/env bash
# Any sm90 card: the GPU test files other than test_fp8_ws.py and test_triton_fp8.py (which
# call3.sh ran after the FastLauncher change), file by file under timeouts, as
# ../retune-mid-2026-12-05/gpu-suite.sh does; stops starting files past LIMIT seconds.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-300}
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee $OUT/summary.txt
for f in $(grep -l "mark.gpu" tests/test_*.py | grep -v -e test_fp8_ws.py -e test_triton_fp8.py); do
  n=$(basename $f .py)
  [ $SECONDS -gt $LIMIT ] && { echo "stopping before $n: time" | tee -a $OUT/summary.txt; break; }
  timeout -k 10 120 python3 -m pytest -m gpu -q -p no:cacheprovider $f > /tmp/gpu-$n.txt 2>&1
  rc=$?
  { echo "===== $n rc=$rc"; cat /tmp/gpu-$n.txt; } >> $OUT/gpu-all.txt
  echo "$n rc=$rc at ${SECONDS}s: $(tail -1 /tmp/gpu-$n.txt | cut -c1-120)" | tee -a $OUT/summary.txt
done
