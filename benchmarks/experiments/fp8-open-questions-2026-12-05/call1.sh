#!/usr/bin/env bash
# One device call (at most 9 minutes by its timeouts), prepared on 2026-12-05 when no
# device was lent; see the README here. Files back (8): gpu-tests.txt, timing.json,
# timing-nopdl.json, timing-log.txt, clock.csv, carried.ncu-rep, source.csv, ncu-log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/fp8-open-questions-2026-12-05
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null \
      | head -1)

# 1. the ws kernels as submitted (the argument tuples and the loop's last scale moved after
#    the last device run; identical PTX offline, this runs them)
timeout 110 python3 -m pytest -m gpu -q -x tests/test_fp8_ws.py > $OUT/gpu-tests.txt 2>&1
tail -2 $OUT/gpu-tests.txt

# 2. the layer-vs-direct, bench-vs-tune and decode-breakdown questions, the SM clock sampled
#    beside them
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader \
    -lms 50 > $OUT/clock.csv 2>/dev/null &
SMI=$!
timeout 200 python3 $D/timing_check.py --out $OUT/timing.json > $OUT/timing-log.txt 2>&1
kill $SMI 2>/dev/null
# with PDL a kernel's profiled duration includes its wait for the previous one, so the
# decode gaps read low; once more without PDL for the launch gaps themselves
MOERUN_PDL=0 timeout 60 python3 $D/timing_check.py --only decode --out $OUT/timing-nopdl.json \
    >> $OUT/timing-log.txt 2>&1
grep -v "^ *$" $OUT/timing-log.txt | cut -c1-400 | tail -8

# 3. where the carried kernels' warps stall: per-instruction samples (SourceCounters) and
#    the pipe / memory sections, one call of deepseek-v3 T=8192 (the ncu experiment's target)
echo "ncu: $NCU" > $OUT/ncu-log.txt
timeout 170 $NCU --clock-control none --profile-from-start off -k regex:carry \
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
