#!/usr/bin/env bash
# The issue 12 matrix alone on the submitted tree (what call2.sh ends with), for an H200 when
# little device time is left; REQUIRE=H200 stops at once on another card. Files back:
# fp8.json, fp8.txt, log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME"
if [ -n "${REQUIRE:-}" ] && [[ "$NAME" != *"$REQUIRE"* ]]; then echo "not $REQUIRE: stop"; exit 3; fi
timeout 200 python3 -m moerun.cli bench --dtype fp8 \
    --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --no-progress \
    --out $OUT/fp8.json > $OUT/fp8.txt 2>>$OUT/log.txt
grep -v "^ *$" $OUT/fp8.txt | tail -25 | cut -c1-120
echo "done at ${SECONDS}s"
