#!/usr/bin/env bash
# The tail split through moerun bench, any sm90 card: the mixtral8x7b bf16 rows of the matrix
# (flags of run c) on the tree's files ("new": mixtral T=1024 with tail_split on this card's
# file) and on a copy with that entry's tail_split removed ("old"), interleaved
# new/old/new/old; then, on an H200 only, the whole bf16 matrix on the tree's files.
# (An inline run before this one set MOERUN_TRITON_CONFIG_DIR= empty for the tree's files,
# which the lookup read as the current directory: heuristic configs. bench_lib.sh unsets it;
# the lookup also treats an empty value as unset since this session.)
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
source benchmarks/experiments/tail-split-2026-12-06/bench_lib.sh  # bench NAME DIR [FLAGS]
for r in new-1 old-1 new-2 old-2; do
  d=""; [[ $r == old* ]] && d=/tmp/old
  bench $r "$d" --shapes mixtral8x7b
done
if [[ "$NAME" == *H200* ]] && [ $SECONDS -lt 380 ]; then bench matrix-new ""; fi
date -u +"end %H:%M:%S" >> $OUT/summary.txt
