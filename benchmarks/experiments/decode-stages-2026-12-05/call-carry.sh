#!/usr/bin/env bash
# The per-kernel breakdown again (breakdown.py), then Nsight Compute on the carried fp8 ws
# kernels at qwen3-30b-a3b T=8192 (the fp8 matrix's short-K compute cell: 16 gate/up and 6
# down K steps per tile): speed of light, warp states and per-instruction stall samples.
# Any card. Files back: breakdown.json, details-carry.csv, source-carry.csv, ncu-log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/decode-stages-2026-12-05
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null \
      | head -1)
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 150 python3 $D/breakdown.py --out $OUT/breakdown.json 2>&1 | grep -v Warn \
    | cut -c1-300
timeout 150 $NCU --clock-control none --profile-from-start off -k regex:carry \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section SourceCounters --import-source no \
    -f -o /tmp/carry python3 benchmarks/experiments/ncu-2026-12-05/target.py \
    --target fp8:qwen3-30b-a3b:8192 > $OUT/ncu-log.txt 2>&1
echo "profile rc=$?"
$NCU -i /tmp/carry.ncu-rep --page details --csv > $OUT/details-carry.csv 2>>$OUT/ncu-log.txt
for k in gate_up down; do
  echo "#KERNEL ${k}_carry_kernel" >> $OUT/source-carry.csv
  $NCU -i /tmp/carry.ncu-rep -k regex:"${k}_carry" --page source --print-source sass --csv \
      >> $OUT/source-carry.csv 2>>$OUT/ncu-log.txt
done
grep -E "\"(Duration|DRAM Throughput|Compute \(SM\) Throughput|L2 Cache Throughput|Warp Cycles Per Issued Instruction|SM Frequency)\"" \
    $OUT/details-carry.csv | awk -F'","' '{print $5" | "$(NF-2)" | "$(NF-1)" | "$NF}' | cut -c1-120
echo "done at ${SECONDS}s"
