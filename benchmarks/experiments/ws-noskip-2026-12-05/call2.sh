#!/usr/bin/env bash
# Device call (2026-12-05, session from 17:01 UTC), on the tree with ExpertsConfig.skip_padding:
# the skip A/B over every ws cell of this card's files, the ws GPU tests, then the fp8 matrix
# (issue 12's command). REQUIRE=H200 stops at once on another card. Files back: ab.json,
# gpu.txt, fp8.json, fp8.txt, log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME"
if [ -n "${REQUIRE:-}" ] && [[ "$NAME" != *"$REQUIRE"* ]]; then echo "not $REQUIRE: stop"; exit 3; fi
timeout 170 python3 benchmarks/experiments/ws-noskip-2026-12-05/ab_noskip.py --out $OUT/ab.json \
    2>>$OUT/log.txt | cut -c1-150
echo "-- ab at ${SECONDS}s"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8_ws.py > $OUT/gpu.txt 2>&1
tail -2 $OUT/gpu.txt; echo "-- gpu at ${SECONDS}s"
timeout $((585 - SECONDS)) python3 -m moerun.cli bench --dtype fp8 \
    --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --no-progress \
    --out $OUT/fp8.json > $OUT/fp8.txt 2>>$OUT/log.txt
grep "^summary\|geomean" $OUT/fp8.txt | head -4
echo "done at ${SECONDS}s"
