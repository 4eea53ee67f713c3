#!/usr/bin/env bash
# On an H200: the prepared H200 call (../retune-1024-2026-12-06/call.sh). Elsewhere: probe.py
# (the fp8 ws call's four timings at three EP-local cells and qwen3-30b T=8192).
set -u
source benchmarks/experiments/retune-1024-2026-12-06/h200_first.sh  # H200: call.sh
D=benchmarks/experiments/ws-host-2026-12-06
timeout -k 10 300 python3 $D/probe.py --out $OUT/probe.json > $OUT/probe.txt 2>&1
echo "probe rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
grep -v Warning $OUT/probe.txt | tail -20
