#!/usr/bin/env bash
# Nsight Compute on the fp8 decode call (qwen3-30b-a3b T=1, the fp8 matrix's lowest cell,
# and deepseek-v3 T=1): per kernel the speed of light, memory, warp-state and launch sections
# and the per-instruction stall samples. One eager call each (the ncu experiment's target).
# Files back: decode-<shape>.ncu-rep, details-<shape>.csv, source-<shape>.csv, ncu-log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null \
      | head -1)
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); ncu: $NCU"
for S in qwen3-30b-a3b deepseek-v3; do
  timeout 150 $NCU --clock-control none --profile-from-start off \
      -k regex:"quantize_rows|fp8_direct|down_direct" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section LaunchStats --section Occupancy --section SchedulerStats \
      --section SourceCounters --import-source no -f -o $OUT/decode-$S \
      python3 benchmarks/experiments/ncu-2026-12-05/target.py --target fp8:$S:1 \
      >> $OUT/ncu-log.txt 2>&1
  echo "$S profile rc=$?"
  $NCU -i $OUT/decode-$S.ncu-rep --page details --csv > $OUT/details-$S.csv 2>>$OUT/ncu-log.txt
  for k in gate_up_fp8_direct down_direct; do
    echo "#KERNEL $k" >> $OUT/source-$S.csv
    $NCU -i $OUT/decode-$S.ncu-rep -k regex:$k --page source --print-source sass --csv \
        >> $OUT/source-$S.csv 2>>$OUT/ncu-log.txt
  done
  grep -E "\"(Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Grid Size|Waves Per SM|Warp Cycles Per Issued Instruction|Stall Long Scoreboard|Dynamic Shared Memory Per Block)\"" \
      $OUT/details-$S.csv | awk -F'","' '{print $5" | "$(NF-2)" | "$(NF-1)" | "$NF}' | cut -c1-160
done
echo "done at ${SECONDS}s"
