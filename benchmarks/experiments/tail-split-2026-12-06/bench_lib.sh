# Sourced by the call scripts of this folder and of ../retune-1024-2026-12-06/.
# `new_dir` makes /tmp/new: the tree's config files with tail_split on the H200 bf16 file's
# mixtral8x7b T=1024 entry (the tree ships it only in the H100 file).
# `bench NAME DIR [FLAGS...]` runs the bf16 matrix
# with the flags of run c (2026-12-05) plus FLAGS, on the config files in DIR (empty: the
# tree's, with MOERUN_TRITON_CONFIG_DIR unset), under `timeout ${BENCH_TIMEOUT:-150}`, into
# /tmp/runs/NAME.{json,txt}; it logs the mixtral T=1024 row and the summaries to
# $OUT/summary.txt and re-packs /tmp/runs into $OUT/runs.tar.
bench() {
  local name=$1 dir=$2; shift 2
  date -u +"$name start %H:%M:%S" >> $OUT/summary.txt
  if [ -n "$dir" ]; then export MOERUN_TRITON_CONFIG_DIR=$dir; else unset MOERUN_TRITON_CONFIG_DIR; fi
  timeout ${BENCH_TIMEOUT:-150} python3 -m moerun.cli bench --backends triton --dtype bfloat16 \
    --repeats 20 --warmup 3 --graph-max-tokens 1024 --calls-per-graph 10 --check-tokens 64 \
    --seed 0 --peers none --no-progress --out /tmp/runs/$name.json "$@" \
    > /tmp/runs/$name.txt 2>&1
  echo "$name rc=$? at ${SECONDS}s" | tee -a $OUT/summary.txt
  grep "^mixtral8x7b  1024" /tmp/runs/$name.txt | tee -a $OUT/summary.txt
  grep "^summary" /tmp/runs/$name.txt | cut -c1-150 | tee -a $OUT/summary.txt
  unset MOERUN_TRITON_CONFIG_DIR
  tar -cf $OUT/runs.tar -C /tmp/runs .
}
new_dir() {
  rm -rf /tmp/new && cp -r moerun/backends/triton/configs /tmp/new
  python3 - <<'PY'
import json
p = '/tmp/new/S8_N14336_K4096_bfloat16_NVIDIA_H200.json'
d = json.load(open(p)); d['entries']['1024']['config']['tail_split'] = True
json.dump(d, open(p, 'w'), indent=1)
PY
}
