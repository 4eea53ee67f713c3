#!/usr/bin/env bash
# The GPU tests file by file, each under its own timeout, each file's output appended to
# $OUT/gpu-all.txt as it finishes (a call that runs past its limit still returns what is
# there). Prepared after the whole-suite call of 2026-12-05 19:48 UTC hung and returned
# nothing, so a hang names its file. Any sm90 card. Two files back (a call returns at most
# 8): gpu-all.txt (every file's pytest output, in turn) and summary.txt (one line a file).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee $OUT/summary.txt
for f in $(grep -l "mark.gpu" tests/test_*.py); do
  n=$(basename $f .py)
  echo "$n start at ${SECONDS}s" >> $OUT/summary.txt
  # -k: a process stuck in a CUDA call that ignores SIGTERM is killed 10 s later
  timeout -k 10 150 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 $f \
      > /tmp/gpu-$n.txt 2>&1
  rc=$?
  { echo "===== $n rc=$rc"; cat /tmp/gpu-$n.txt; } >> $OUT/gpu-all.txt
  echo "$n rc=$rc at ${SECONDS}s: $(tail -1 /tmp/gpu-$n.txt | cut -c1-120)" | tee -a $OUT/summary.txt
  [ $SECONDS -gt 560 ] && { echo "stopping: time" | tee -a $OUT/summary.txt; break; }
done
