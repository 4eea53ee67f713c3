#!/usr/bin/env bash
# Device call: lockstep.diff applied on the device copy, then ab.py. Files back: ab.json, log.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 benchmarks/experiments/fp8-scales-ahead-2026-12-05/apply_diff.py \
    benchmarks/experiments/ws-lockstep-2026-12-05/lockstep.diff --root . || exit 1
grep -q MOERUN_WS_LOCKSTEP moerun/backends/triton/fp8_ws.py || { echo not applied; exit 3; }
timeout ${LIMIT_S:-240} python3 benchmarks/experiments/ws-lockstep-2026-12-05/ab.py \
    --out $OUT/ab.json > $OUT/ab-log.txt 2>&1
tail -8 $OUT/ab-log.txt | cut -c1-300
