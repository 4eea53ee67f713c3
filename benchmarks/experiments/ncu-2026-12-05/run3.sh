#!/usr/bin/env bash
# Device script, call 3: the bf16 down-kernel A/B (ab.py --module variants2), then which L2
# sub-unit sets lts__throughput for the fp8 and bf16 gate/up GEMMs and cuBLAS (ncu's
# breakdown: metrics). Writes $OUT/ab2.json, $OUT/ncu3.csv.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/ncu-2026-12-05
timeout 400 python3 $D/ab.py --module variants2 --which bf16 --out $OUT/ab2.json 2>&1 \
  | grep -v '^{\|UserWarning\|_warn_once' | tail -12
NCU=$(command -v ncu)
M=breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum
for tk in "fp8:deepseek-v3:8192@gate_up" "bf16:deepseek-v3:8192@gate_up" "cublas_bf16@nvjet" "cublas_fp8_fast@nvjet"; do
  t=${tk%@*}; k=${tk#*@}
  echo "#TARGET $t" >> $OUT/ncu3.csv
  timeout 100 $NCU --clock-control none --profile-from-start off --csv --page raw --metrics $M \
    -k regex:"$k" python3 $D/target.py --target $t 2>>$OUT/ncu3.err | grep -v "^==" >> $OUT/ncu3.csv
done
python3 $D/ncu_table.py breakdown $OUT/ncu3.csv
