#!/usr/bin/env bash
# The T=1 points tuned with the deeper direct pipelines (tune_stages.py), fp8 then bf16, into
# copies of the shipped files (the tuner times the shipped entry in the same run). Any card;
# REQUIRE=H200 stops at once on another. Files back: tune-fp8.txt, tune-bf16.txt, cfg.tar.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/decode-stages-2026-12-05
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME"
if [ -n "${REQUIRE:-}" ] && [[ "$NAME" != *"$REQUIRE"* ]]; then echo "not $REQUIRE: stop"; exit 3; fi
S=qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3,mixtral8x7b
rm -rf /tmp/cfg && cp -r moerun/backends/triton/configs /tmp/cfg
timeout 200 python3 $D/tune_stages.py --dtype fp8 --shapes $S --T 1 --budget-s 170 \
    --out-dir /tmp/cfg > $OUT/tune-fp8.txt 2>&1
timeout 200 python3 $D/tune_stages.py --shapes $S --T 1 --budget-s 170 \
    --out-dir /tmp/cfg > $OUT/tune-bf16.txt 2>&1
tar -cf $OUT/cfg.tar -C /tmp/cfg .
for f in $OUT/tune-fp8.txt $OUT/tune-bf16.txt; do
    grep -A1 "^==" $f | cut -c1-190; grep "^tune: wrote\|rror" $f | head -5
done
echo "done at ${SECONDS}s"
