#!/usr/bin/env bash
# Device script, second call: the A/B of the variants (ab.py) and Nsight Compute's DRAM bytes,
# L2 hit rate and tensor-pipe activity of the variants' GEMMs at deepseek-v3 T=8192.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/ncu-2026-12-05
timeout 420 python3 $D/ab.py --out $OUT/ab.json --which ${WHICH:-fp8,bf16} 2>&1 | grep -v "^{" | tail -30
NCU=$(command -v ncu)
M=gpu__time_duration.sum,dram__bytes.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,gpc__cycles_elapsed.avg.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed
for tv in ${NCU_RUNS:-fp8:deepseek-v3:8192@base fp8:deepseek-v3:8192@eg fp8:deepseek-v3:8192@order bf16:deepseek-v3:8192@base bf16:deepseek-v3:8192@eg}; do
  t=${tv%@*}; v=${tv#*@}
  echo "#TARGET $t@$v" >> $OUT/ncu2.csv
  timeout 120 $NCU --clock-control none --profile-from-start off --csv --page raw --metrics $M \
    -k regex:"gate_up|down" python3 $D/target.py --target $t --variant $v 2>>$OUT/ncu2.err | grep -v "^==" >> $OUT/ncu2.csv
done
python3 $D/ncu_table.py variants $OUT/ncu2.csv
