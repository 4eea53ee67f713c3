#!/usr/bin/env bash
# The GPU tests file by file, each under its own timeout, each file's output written to $OUT
# as it finishes (a call that runs past its limit still returns what is there). Prepared
# after the whole-suite call of 2026-12-05 19:48 UTC hung and returned nothing, so a hang
# names its file. Any sm90 card. Files back: gpu-<file>.txt, summary.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee $OUT/summary.txt
for f in $(grep -l "mark.gpu" tests/test_*.py); do
  n=$(basename $f .py)
  echo "$n start at ${SECONDS}s" >> $OUT/summary.txt
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 $f \
      > $OUT/gpu-$n.txt 2>&1
  echo "$n rc=$? at ${SECONDS}s: $(tail -1 $OUT/gpu-$n.txt | cut -c1-120)" | tee -a $OUT/summary.txt
  [ $SECONDS -gt 560 ] && { echo "stopping: time" | tee -a $OUT/summary.txt; break; }
done
