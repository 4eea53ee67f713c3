#!/usr/bin/env bash
# One device call on an H100 (session of 2026-12-05 from 15:42 UTC): `moerun tune` of every
# bench shape (the four model shapes, T 1..8192, and the two EP-local ones, T 256..32768) in
# one dtype, writing ..._NVIDIA_H100_80GB_HBM3.json files into an empty folder (the H200 files
# are not touched). Usage: bash tune.sh bfloat16|fp8 BUDGET_S. Files back: device.txt,
# tune-<dtype>.txt, cfg-<dtype>.tar (the written files).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
DT=$1; BUDGET=$2
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total,driver_version \
    --format=csv > $OUT/device.txt 2>&1
cat $OUT/device.txt
rm -rf /tmp/h100cfg-$DT && mkdir -p /tmp/h100cfg-$DT
timeout $((BUDGET + 60)) python3 -m moerun.cli tune --dtype $DT --budget-s $BUDGET \
    --out-dir /tmp/h100cfg-$DT > $OUT/tune-$DT.txt 2>&1
echo "tune rc=$?"
grep "^==\|^tune" $OUT/tune-$DT.txt | cut -c1-200
tar -C /tmp/h100cfg-$DT -cf $OUT/cfg-$DT.tar .
ls /tmp/h100cfg-$DT
