#!/usr/bin/env bash
# Same-run A/B of the fp8 direct decode kernels with their K loops' scale rows loaded once
# ("new", the working tree) against the tree before ("old": the HEAD versions of down.py, fp8_direct.py and fp8_tiles.py over a
# copy of the package), the fp8 matrix's T=1 cells, three alternating rounds of
# `moerun bench --dtype fp8 --tokens 1` (graph replay; the bf16 column is the drift control),
# then the fp8 GPU tests on the new tree. Any card. Files back: bench-{old,new}-{1,2,3}.txt,
# gpu.txt.
set -u
export PYTHONUNBUFFERED=1
D=benchmarks/experiments/decode-scales-2026-12-05
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r moerun /tmp/old/ && cp $D/old/*.py /tmp/old/moerun/backends/triton/
for r in 1 2 3; do
  for t in old new; do
    P=$PWD; [ $t = old ] && P=/tmp/old
    PYTHONPATH=$P timeout 100 python3 -m moerun.cli bench --dtype fp8 --tokens 1 \
        --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --no-progress \
        > $OUT/bench-$t-$r.txt 2>&1
    echo "$t $r: $(grep 'T=     1' $OUT/bench-$t-$r.txt | awk '{printf "%s %s %s  ", $1, $6, $13}')"
  done
done
PYTHONPATH=. timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_triton_fp8.py \
    tests/test_triton_direct.py > $OUT/gpu.txt 2>&1
tail -1 $OUT/gpu.txt
echo "done at ${SECONDS}s"
