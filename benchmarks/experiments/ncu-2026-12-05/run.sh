#!/usr/bin/env bash
# Device script: Nsight Compute over the prefill calls and cuBLAS references (README here).
# Writes $OUT/all.csv (every target's --page raw CSV behind a '#TARGET name' line),
# $OUT/summary.txt, $OUT/metrics.txt, $OUT/log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/ncu-2026-12-05
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee -a $OUT/log.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv | tee -a $OUT/log.txt
$NCU --query-metrics 2>/dev/null | grep -iE "tensor|gmma|lts__t_bytes|lts__throughput" > $OUT/metrics.txt
for t in ${TARGETS:-cublas_bf16 cublas_fp8_block cublas_fp8_fast bf16:deepseek-v3:8192 fp8:deepseek-v3:8192 bf16:mixtral8x7b:1024 fp8:mixtral8x7b:1024}; do
  echo "== $t" | tee -a $OUT/log.txt
  python3 $D/target.py --target $t --time 2>&1 | tail -3 | tee -a $OUT/log.txt
  f=$OUT/ncu-$(echo $t | tr ':' '_').csv
  timeout 240 $NCU --clock-control none --profile-from-start off --csv --page raw \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section LaunchStats --section Occupancy \
    python3 $D/target.py --target $t > $f 2>>$OUT/log.txt
  echo "rc=$? $(wc -l < $f) lines" | tee -a $OUT/log.txt
done
for f in $OUT/ncu-*.csv; do echo "#TARGET $(basename $f .csv)"; cat $f; done > $OUT/all.csv
rm -f $OUT/ncu-*.csv
python3 $D/summarize.py $OUT/all.csv | tee $OUT/summary.txt
