#!/usr/bin/env bash
# call2.sh cut to what 400 s of device time holds (2026-12-05, 12:20 UTC): the patch, its GPU
# tests, and the probe (sweep, interleaved A/B, bit-equality, per-kernel times) at qwen3-30b
# T=1 in bf16 and fp8; no bench rounds; then write_winner.py from probe.json.
# Files back (4): gpu-tests.txt, probe.json, probe-log.txt, winner.txt (and /tmp/cfg-pf stays
# on the machine for call3-matrices.sh).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/decode-prefetch-2026-12-05
source $D/apply_patch.sh
timeout 80 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_prefetch.py \
    > $OUT/gpu-tests.txt 2>&1
tail -2 $OUT/gpu-tests.txt
timeout $((${LIMIT_S:-350} - SECONDS)) python3 $D/prefetch_probe.py ${PROBE_ARGS:---rounds 5} \
    --out $OUT/probe.json \
    > $OUT/probe-log.txt 2>&1
echo "probe rc=$?"; grep "^ab" $OUT/probe-log.txt | cut -c1-600
# the winner's config copy for call3-matrices.sh on the same warm machine (/tmp/cfg-pf)
timeout 20 python3 $D/write_winner.py --probe $OUT/probe.json --out-dir /tmp/cfg-pf \
    > $OUT/winner.txt 2>&1
cat $OUT/winner.txt
