#!/usr/bin/env bash
# One device call, prepared on 2026-12-05 when no device was lent; see the README here. The
# submitted tree is "old"; /tmp/new is it with scales.diff applied. Its timeouts keep it under
# 10 minutes (the A/B's third round runs only if time is left). Files back (6):
# gpu-tests.txt, outputs.txt, ab.txt, bench-model.txt, bench-ep.txt, log.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=benchmarks/experiments/fp8-scales-ahead-2026-12-05
LOG=$OUT/log.txt
ROOT=$(pwd)
rm -rf /tmp/new /tmp/ab && mkdir -p /tmp/new /tmp/ab
cp -r moerun schedulers traces eplb tests pyproject.toml /tmp/new/
python3 $D/apply_diff.py $D/scales.diff --root /tmp/new >> $LOG 2>&1 || { cat $LOG; exit 3; }

# 1. the fp8 Triton kernels' GPU tests on the new tree (reference and bars)
(cd /tmp/new && timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider \
    tests/test_triton_fp8.py) > $OUT/gpu-tests.txt 2>&1
tail -2 $OUT/gpu-tests.txt

# 2. bit-for-bit: the layer's fp8 call at every touched cell, old tree against new
# (each tree's commands run from its root with PYTHONPATH=.: `python3 -m` puts the working
# folder first on sys.path, so a tree is chosen by where the command runs)
timeout 75 python3 $D/outputs.py --save /tmp/ab/old.pt >> $LOG 2>&1
(cd /tmp/new && timeout 75 python3 $ROOT/$D/outputs.py --save /tmp/ab/new.pt) >> $LOG 2>&1
python3 $D/outputs.py --compare /tmp/ab/old.pt /tmp/ab/new.pt > $OUT/outputs.txt 2>&1
tail -1 $OUT/outputs.txt

# 3. the bench cells, old and new trees alternating (the bf16 column is the drift control)
for round in 1 2 3; do
  if [ $round = 3 ] && [ $SECONDS -gt ${ROUND3_BEFORE_S:-400} ]; then
    echo "round 3 skipped at ${SECONDS}s"; break; fi
  trees="old new"; [ $round = 2 ] && trees="new old"  # alternate which tree runs first
  for tree in $trees; do
    [ $tree = old ] && P=$ROOT || P=/tmp/new
    echo "## round $round, $tree tree" | tee -a $OUT/bench-model.txt >> $OUT/bench-ep.txt
    (cd $P && timeout 60 python3 -m moerun.cli bench --dtype fp8 \
        --shapes mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --tokens 1,16,128 \
        --out /tmp/ab/$tree-model-$round.json) >> $OUT/bench-model.txt 2>>$LOG
    (cd $P && timeout 45 python3 -m moerun.cli bench --dtype fp8 \
        --shapes qwen3-235b-ep8-local,deepseek-v3-ep8-local --tokens 256,2048 \
        --out /tmp/ab/$tree-ep-$round.json) >> $OUT/bench-ep.txt 2>>$LOG
  done
done
python3 $D/summarize.py /tmp/ab > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
