#!/usr/bin/env bash
# On an H200: the prepared H200 call (../retune-1024-2026-12-06/call.sh). Elsewhere:
# probe.py (the fp8 direct down with a given amax against the shipped form), then the fp8
# GPU tests.
set -u
source benchmarks/experiments/retune-1024-2026-12-06/h200_first.sh  # H200: call.sh
D=benchmarks/experiments/down-amax-2026-12-06
timeout -k 10 240 python3 $D/probe.py --out $OUT/probe.json > $OUT/probe.txt 2>&1
echo "probe rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
tail -5 $OUT/probe.txt
