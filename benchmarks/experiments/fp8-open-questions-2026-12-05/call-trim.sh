#!/usr/bin/env bash
# call1.sh trimmed to what 350 s of device time holds (session of 2026-12-05 from 15:42 UTC):
# question 4 (timing_check.py --only decode) and question 1 (Nsight Compute on the carried
# kernels). Files back: timing-decode.json, timing-log.txt, carried.ncu-rep, source.csv,
# ncu-log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/fp8-open-questions-2026-12-05
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null \
      | head -1)
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME"
case "$NAME" in *${REQUIRE:-}*) ;; *) echo "not a ${REQUIRE} card: stop"; exit 4 ;; esac
timeout 80 python3 $D/timing_check.py --only decode --out $OUT/timing-decode.json \
    > $OUT/timing-log.txt 2>&1
grep -v "^ *$" $OUT/timing-log.txt | cut -c1-400 | tail -8

# 3. where the carried kernels' warps stall: per-instruction samples (SourceCounters) and
#    the pipe / memory sections, one call of deepseek-v3 T=8192 (the ncu experiment's target)
echo "ncu: $NCU" > $OUT/ncu-log.txt
timeout 160 $NCU --clock-control none --profile-from-start off -k regex:carry \
    --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section SourceCounters --import-source no -f -o $OUT/carried \
    python3 benchmarks/experiments/ncu-2026-12-05/target.py --target fp8:deepseek-v3:8192 \
    >> $OUT/ncu-log.txt 2>&1
echo "profile rc=$?" | tee -a $OUT/ncu-log.txt
for k in gate_up down; do  # both kernels' SASS pages in one file, each behind a #KERNEL line
  echo "#KERNEL ${k}_carry_kernel" >> $OUT/source.csv
  $NCU -i $OUT/carried.ncu-rep -k regex:"${k}_carry" --page source --print-source sass --csv \
      > $OUT/src.tmp 2>>$OUT/ncu-log.txt \
    || $NCU -i $OUT/carried.ncu-rep -k regex:"${k}_carry" --page details --csv \
      > $OUT/src.tmp 2>>$OUT/ncu-log.txt
  echo "$k: $(wc -l < $OUT/src.tmp) lines" | tee -a $OUT/ncu-log.txt
  cat $OUT/src.tmp >> $OUT/source.csv
done
rm -f $OUT/src.tmp
$NCU -i $OUT/carried.ncu-rep --page details --csv 2>/dev/null | \
    grep -E "Duration|Throughput|Stall|Issued|Eligible|Tensor|L2 Hit|DRAM" | cut -c1-200 \
    | head -40
