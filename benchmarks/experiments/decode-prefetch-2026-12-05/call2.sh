#!/usr/bin/env bash
# One device call, prepared on 2026-12-05 when no device was lent; see the README here. Its
# timeouts keep it under 10 minutes (the benches' second round runs only if time is left).
# Run after (or instead of) ../fp8-open-questions-2026-12-05/call1.sh. Files back (7):
# gpu-tests.txt, probe.json, probe-log.txt, winner.txt, bench-bf16.txt, bench-fp8.txt,
# bench-log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/decode-prefetch-2026-12-05

# 0. the patch, applied unless it is already (apply_patch.sh)
source $D/apply_patch.sh

# 1. the direct path's GPU tests with the patch: the prefetch changes no value; PDL and the
#    direct path as before
timeout 150 python3 -m pytest -m gpu -q tests/test_prefetch.py \
    "tests/test_triton_gpu.py::test_direct_decode_path" \
    "tests/test_triton_gpu.py::test_pdl_launches_equal_serialized_launches" \
    > $OUT/gpu-tests.txt 2>&1
tail -2 $OUT/gpu-tests.txt

# 2. the sweep and the interleaved A/B at qwen3-30b T=1, bf16 and fp8
timeout 240 python3 $D/prefetch_probe.py --out $OUT/probe.json > $OUT/probe-log.txt 2>&1
echo "probe rc=$?"; grep "^ab" $OUT/probe-log.txt | cut -c1-600

# 3. the bench cells against the shipped files, alternating, twice
timeout 20 python3 $D/write_winner.py --probe $OUT/probe.json --out-dir /tmp/cfg-pf \
    > $OUT/winner.txt 2>&1
cat $OUT/winner.txt
for round in 1 2; do
  if [ $round = 2 ] && [ $SECONDS -gt 400 ]; then echo "round 2 skipped at ${SECONDS}s"; break; fi
  for files in shipped pf; do
    if [ $files = pf ]; then export MOERUN_TRITON_CONFIG_DIR=/tmp/cfg-pf; \
    else unset MOERUN_TRITON_CONFIG_DIR; fi
    echo "## round $round, $files files" | tee -a $OUT/bench-bf16.txt >> $OUT/bench-fp8.txt
    timeout 40 python3 -m moerun.cli bench --shapes qwen3-30b-a3b --tokens 1 \
        --backends triton --peers none >> $OUT/bench-bf16.txt 2>>$OUT/bench-log.txt
    timeout 40 python3 -m moerun.cli bench --dtype fp8 --shapes qwen3-30b-a3b --tokens 1 \
        --peers none >> $OUT/bench-fp8.txt 2>>$OUT/bench-log.txt
  done
done
unset MOERUN_TRITON_CONFIG_DIR
grep -h "qwen3-30b-a3b\|^##" $OUT/bench-bf16.txt $OUT/bench-fp8.txt | cut -c1-200
