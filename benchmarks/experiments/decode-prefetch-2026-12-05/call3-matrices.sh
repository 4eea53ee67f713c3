#!/usr/bin/env bash
# The call right after call2.sh on the same warm machine (2026-12-05, session from 13:16 UTC):
# both expert matrices on the tree with the prefetch patch and, where call2.sh's
# write_winner.py wrote one, the winning T=1 entry (/tmp/cfg-pf, left on the machine by
# call2.sh; without it the shipped files). Under 10 minutes by its timeouts. Files back (6):
# bench.{json,txt}, fp8.{json,txt}, log.txt and the config copy's qwen3-30b files (cfg-pf.tgz).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/decode-prefetch-2026-12-05
LOG=$OUT/log.txt
source $D/apply_patch.sh
if [ -d /tmp/cfg-pf ]; then
  export MOERUN_TRITON_CONFIG_DIR=/tmp/cfg-pf
  tar -czf $OUT/cfg-pf.tgz -C /tmp/cfg-pf $(cd /tmp/cfg-pf && ls S128_N768_K2048_*.json)
fi
echo "configs: ${MOERUN_TRITON_CONFIG_DIR:-shipped}" | tee -a $LOG

# 1. the bf16 matrix (issue 11), the command of the 12:11 UTC matrix (the H100 probe of
#    14:54 UTC showed prefetch mode 2 ahead only in bf16)
timeout 430 python3 -m moerun.cli bench --backends triton --dtype bfloat16 \
    --repeats 20 --warmup 3 --graph-max-tokens 1024 --calls-per-graph 10 --check-tokens 64 \
    --seed 0 --peers none --no-progress --out $OUT/bench.json > $OUT/bench.txt 2>>$LOG
tail -3 $OUT/bench.txt

# 2. the fp8 matrix (issue 12), the 20 model cells, if time is left (about 90 s at 12:10 UTC)
if [ $SECONDS -lt 450 ]; then
  timeout $((585 - SECONDS)) python3 -m moerun.cli bench --dtype fp8 \
      --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --no-progress \
      --out $OUT/fp8.json > $OUT/fp8.txt 2>>$LOG
  tail -4 $OUT/fp8.txt
else
  echo "fp8 matrix skipped at ${SECONDS}s" | tee -a $LOG
fi
