#!/usr/bin/env bash
# On an H200: the prepared H200 call (../retune-1024-2026-12-06/call.sh). On any other card:
# ab.py (the fp8 T=1 calls with the quantization releasing the gate/up early and the gate/up
# prefetching its weights into L2 before its wait), then the GPU tests of the fp8 direct path.
# Needs this folder's patch applied (README: release-prefetch.diff and l2.py).
set -u
source benchmarks/experiments/retune-1024-2026-12-06/h200_first.sh  # H200: call.sh
D=benchmarks/experiments/decode-release-2026-12-06
timeout -k 10 300 python3 $D/ab.py --out $OUT/ab.json > $OUT/ab.txt 2>&1
echo "ab rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
cat $OUT/ab.txt | tail -8
timeout -k 10 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_triton_fp8.py \
    tests/test_pdl.py > $OUT/gpu.txt 2>&1
echo "gpu tests rc=$? at ${SECONDS}s: $(tail -1 $OUT/gpu.txt)" | tee -a $OUT/summary.txt
