#!/usr/bin/env bash
# The tail split through moerun bench, any sm90 card: the mixtral8x7b bf16 rows of the matrix
# (flags of run c) on the tree's files ("new": mixtral T=1024 with tail_split on this card's
# file) and on a copy with that entry's tail_split removed ("old"), interleaved
# new/old/new/old; then, on an H200 only, the whole bf16 matrix on the tree's files.
# (call5.sh's first form set MOERUN_TRITON_CONFIG_DIR= empty for the tree's files, which the
# lookup read as the current directory: heuristic configs. Now unset; the lookup also treats
# an empty value as unset since this session.)
# Files back: summary.txt, runs.tar.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME" | tee $OUT/summary.txt
date -u +"start %H:%M:%S" >> $OUT/summary.txt
rm -rf /tmp/old /tmp/runs && cp -r moerun/backends/triton/configs /tmp/old && mkdir -p /tmp/runs
python3 - <<'PY'
import glob, json
for p in glob.glob('/tmp/old/S8_N14336_K4096_bfloat16_*.json'):
    d = json.load(open(p)); e = d['entries'].get('1024', {})
    if e.get('config', {}).pop('tail_split', None) is not None:
        e.pop('source', None); json.dump(d, open(p, 'w'), indent=1); print('old:', p)
PY
bench() {  # $1: run name, $2: config dir (none: the tree's), then extra flags
  local name=$1 dir=$2; shift 2
  date -u +"$name start %H:%M:%S" >> $OUT/summary.txt
  if [ -n "$dir" ]; then export MOERUN_TRITON_CONFIG_DIR=$dir; else unset MOERUN_TRITON_CONFIG_DIR; fi
  timeout 150 python3 -m moerun.cli bench --backends triton --dtype bfloat16 --repeats 20 \
    --warmup 3 --graph-max-tokens 1024 --calls-per-graph 10 --check-tokens 64 --seed 0 \
    --peers none --no-progress --out /tmp/runs/$name.json "$@" > /tmp/runs/$name.txt 2>&1
  echo "$name rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
  grep "^mixtral8x7b  1024" /tmp/runs/$name.txt | tee -a $OUT/summary.txt
  grep "^summary" /tmp/runs/$name.txt | cut -c1-150 | tee -a $OUT/summary.txt
  unset MOERUN_TRITON_CONFIG_DIR
  tar -cf $OUT/runs.tar -C /tmp/runs .
}
for r in new-1 old-1 new-2 old-2; do
  d=""; [[ $r == old* ]] && d=/tmp/old
  bench $r "$d" --shapes mixtral8x7b
done
if [[ "$NAME" == *H200* ]] && [ $SECONDS -lt 380 ]; then bench matrix-new ""; fi
date -u +"end %H:%M:%S" >> $OUT/summary.txt
