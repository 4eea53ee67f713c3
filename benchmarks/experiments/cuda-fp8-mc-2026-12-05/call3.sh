#!/usr/bin/env bash
# Third device call (any sm90 card, about 2 minutes, at most about 270 s: give the call a
# timeout of 300 s or more): the CUDA MoE GEMMs with one cluster per tile in tile order
# (MC_MOE_GRID=tiles) against the persistent grid, same cells, bf16 then fp8, after Nsight
# Compute showed the persistent bf16 gate/up reading its weights about three times from DRAM
# (call2, 2026-12-06). Reviewed, not run. Files back: log.txt, grid-*.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
D=benchmarks/experiments/cuda-fp8-mc-2026-12-05
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -shared -Xcompiler -fPIC \
    -o /tmp/fp8_mc_moe.so $D/fp8_mc_moe.cu > /tmp/build.log 2>&1 \
    || { tail -3 /tmp/build.log | tee -a $OUT/log.txt; exit 1; }
for dt in bf16 fp8; do
  for g in tiles persistent; do
    MC_MOE_GRID=$g timeout -k 5 60 python3 $D/moe_probe.py --dtype $dt --mc 1,2 --stages 4 \
        --cells deepseek-v3:8192,mixtral8x7b:1024 > $OUT/grid-$dt-$g.txt 2>&1
    echo "$dt $g rc=$? at ${SECONDS}s" | tee -a $OUT/log.txt
    grep '^{"cell"' $OUT/grid-$dt-$g.txt | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if "error" in r:
        print("   ERROR", r["cell"], r["impl"], r["error"][:150])
    elif "us" in r:
        print("  ", r["cell"], r["impl"], r["us"], r["vs_shipped"], "%.2e" % r["rel_ref"],
              "" if r["ok"] else "WRONG")
' | tee -a $OUT/log.txt
  done
done
