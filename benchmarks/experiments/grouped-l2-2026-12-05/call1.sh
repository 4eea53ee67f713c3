#!/usr/bin/env bash
# Device call 1 (2026-12-05, session from 17:01 UTC): `moerun tune` at the points whose
# decode-style tiles now come with group_m=4 (tune_plan._grouped_l2) -- the cells with about
# 32 rows per hit expert -- and the 64-rows-per-expert points, whose 128-row set now has
# 2-stage tiles (two CTAs per SM), into a copy of the shipped files. Files back: device.txt,
# tunes.tar (the nine tune logs), cfg.tar (the whole tuned copy); then, time left, the bf16
# matrix on it (bench.json, bench.txt, log.txt).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME"
if [ -n "${REQUIRE:-}" ] && [[ "$NAME" != *"$REQUIRE"* ]]; then echo "not $REQUIRE: stop"; exit 3; fi
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total,driver_version \
    --format=csv > $OUT/device.txt 2>&1
rm -rf /tmp/cfg /tmp/r && mkdir -p /tmp/r && cp -r moerun/backends/triton/configs /tmp/cfg
run() {  # name dtype shape T budget
  timeout $(( $5 + 40 )) python3 -m moerun.cli tune --dtype $2 --shapes $3 --T $4 \
      --budget-s $5 --out-dir /tmp/cfg > /tmp/r/tune-$1.txt 2>&1
  echo "-- $1 rc=$? at ${SECONDS}s"; grep "^==\|incumbent\|final:" /tmp/r/tune-$1.txt | cut -c1-230
}
run bf16-mixtral-128 bfloat16 mixtral8x7b 128 70
run bf16-dsv3-1024 bfloat16 deepseek-v3 1024 80
run bf16-dsv3ep8-256 bfloat16 deepseek-v3-ep8-local 256 70
run bf16-qwen30-1024 bfloat16 qwen3-30b-a3b 1024 70
run bf16-qwen235-1024 bfloat16 qwen3-235b-a22b 1024 70
run bf16-q235ep8-256 bfloat16 qwen3-235b-ep8-local 256 70
run fp8-mixtral-128 fp8 mixtral8x7b 128 90
run fp8-dsv3-1024 fp8 deepseek-v3 1024 100
run fp8-dsv3ep8-256 fp8 deepseek-v3-ep8-local 256 90
tar -cf $OUT/cfg.tar -C /tmp/cfg . && tar -cf $OUT/tunes.tar -C /tmp/r .
echo "tunes done at ${SECONDS}s"
# the bf16 matrix (issue 11's command) on the tuned copy, if the call has time left
if [ $SECONDS -lt 400 ]; then
  MOERUN_TRITON_CONFIG_DIR=/tmp/cfg timeout $((590 - SECONDS)) python3 -m moerun.cli bench \
      --backends triton --dtype bfloat16 --repeats 20 --warmup 3 --graph-max-tokens 1024 \
      --calls-per-graph 10 --check-tokens 64 --seed 0 --peers none --no-progress \
      --out $OUT/bench.json > $OUT/bench.txt 2>>$OUT/log.txt
  tail -4 $OUT/bench.txt
fi
echo "done at ${SECONDS}s"
