#!/usr/bin/env bash
# Tail split, H200 call: mixtral8x7b T=1024 re-tuned (bf16) into a copy of the shipped files
# (the persistent candidates now include the tail split), then the bf16 matrix (flags of run
# c) on the copy and on the shipped files, interleaved copy/shipped/copy; then ab.py at
# mixtral T=1024 (head/off/on) and t128.py. H200 only (stops at once on another card).
# Files back: summary.txt, tune.txt, cfg.tar, runs.tar (bench json+txt), ab.txt, t128.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME" | tee $OUT/summary.txt
if [[ "$NAME" != *H200* ]] && [ -z "${ANY_CARD:-}" ]; then echo "not H200: stop"; exit 3; fi
date -u +"start %H:%M:%S" >> $OUT/summary.txt
rm -rf /tmp/cfg /tmp/runs && cp -r moerun/backends/triton/configs /tmp/cfg && mkdir -p /tmp/runs
timeout 130 python3 -m moerun.cli tune --shapes mixtral8x7b --T 1024 --budget-s 110 \
    --out-dir /tmp/cfg > $OUT/tune.txt 2>&1
echo "tune rc=$? at ${SECONDS}s" >> $OUT/summary.txt
grep -h "^==" $OUT/tune.txt | cut -c1-200 | tee -a $OUT/summary.txt
tar -cf $OUT/cfg.tar -C /tmp/cfg .
bench() {  # $1: run name, $2: config dir ('' = shipped)
  date -u +"$1 start %H:%M:%S" >> $OUT/summary.txt
  MOERUN_TRITON_CONFIG_DIR=$2 timeout 150 python3 -m moerun.cli bench --backends triton \
    --dtype bfloat16 --repeats 20 --warmup 3 --graph-max-tokens 1024 --calls-per-graph 10 \
    --check-tokens 64 --seed 0 --peers none --no-progress --out /tmp/runs/$1.json \
    > /tmp/runs/$1.txt 2>&1
  echo "$1 rc=$? at ${SECONDS}s: $(grep '^summary' /tmp/runs/$1.txt | cut -c1-150 | tr '\n' ' ')" \
    | tee -a $OUT/summary.txt
}
bench copy-1 /tmp/cfg
bench shipped-1 ""
bench copy-2 /tmp/cfg
tar -cf $OUT/runs.tar -C /tmp/runs .
[ $SECONDS -lt 470 ] && timeout $((540 - SECONDS)) python3 \
    benchmarks/experiments/tail-split-2026-12-06/ab.py --cells mixtral8x7b:1024 \
    --variants head,off,on --no-breakdown > $OUT/ab.txt 2>&1
[ $SECONDS -lt 540 ] && timeout $((590 - SECONDS)) python3 \
    benchmarks/experiments/tail-split-2026-12-06/t128.py > $OUT/t128.txt 2>&1
date -u +"end %H:%M:%S" >> $OUT/summary.txt
cat $OUT/summary.txt; tail -8 $OUT/ab.txt; cat $OUT/t128.txt
