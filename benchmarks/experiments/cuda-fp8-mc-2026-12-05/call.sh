#!/usr/bin/env bash
# One device call (any sm90 card; up to 10 minutes): build the three CUDA probes, then check
# each form in its own process under its own timeout (so that a hang names its form), then
# time what passed, same run, same inputs, the whole expert calls first:
#   decode call (decode_probe)  against the shipped T <= 4 calls, graph replay, fp8 and bf16;
#   MoE prefill (moe_probe)     against the shipped calls at the prefill cells, eager, fp8 and
#                               bf16 (the bf16 pair of fp8_mc_moe.cu, issue 11);
#   dense GEMM (probe.py)       against cuBLAS's block-scaled GEMM and the Gluon probe.
# A dense form that fails its check runs again on two small shapes under compute-sanitizer.
# Files back (7; every row is a JSON line): log.txt, check.txt, moe-check.txt, probe.txt,
# decode.txt, moe.txt, moe-bf16.txt.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
D=benchmarks/experiments/cuda-fp8-mc-2026-12-05
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee $OUT/log.txt
# the timing builds, and for the two cluster GEMMs the check builds (_wd.so: -DMC_WATCHDOG,
# an mbarrier wait open for 10 s records its barrier and traps instead of hanging), in parallel
build() {  # build <source> <library> [flags]
  nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -shared -Xcompiler -fPIC \
      -Xptxas -v "${@:3}" -o $2 $D/$1.cu > $2.log 2>&1 \
      || echo "build $2 failed: $(tail -3 $2.log)" | tee -a $OUT/log.txt
}
for f in fp8_mc_gemm fp8_mc_moe fp8_decode; do build $f /tmp/$f.so & done
for f in fp8_mc_gemm fp8_mc_moe; do build $f /tmp/${f}_wd.so -DMC_WATCHDOG & done
wait
# ptxas's C7510 (wgmmas serialized) must not appear: the checks would not test the pipelining
grep -h "C7510\|spill stores" /tmp/*.so.log | grep -v " 0 bytes spill" | sort | uniq -c \
    | head -5 | tee -a $OUT/log.txt
echo "built at ${SECONDS}s" | tee -a $OUT/log.txt
last() { tail -1 "$1" | cut -c1-150; }
# 1. checks: decode pairs, dense cluster sizes, then the MoE pairs at the sizes that passed
DEC=""
for dt in fp8 bf16; do
  echo "== decode $dt" >> $OUT/check.txt
  timeout -k 5 90 python3 $D/decode_probe.py --check --dtype $dt >> $OUT/check.txt 2>&1
  echo "decode check $dt rc=$? at ${SECONDS}s: $(last $OUT/check.txt)" | tee -a $OUT/log.txt
  tail -1 $OUT/check.txt | grep -q "^ok decode $dt" && DEC="$DEC $dt"
done
MC=""
for mc in 1 2 4; do
  echo "== dense mc=$mc" >> $OUT/check.txt
  timeout -k 5 75 python3 $D/probe.py --check --lib /tmp/fp8_mc_gemm_wd.so --mc $mc \
      >> $OUT/check.txt 2>&1
  echo "dense check mc=$mc rc=$? at ${SECONDS}s: $(last $OUT/check.txt)" | tee -a $OUT/log.txt
  if tail -1 $OUT/check.txt | grep -q "^ok mc=$mc"; then
    MC="$MC,$mc"
  elif [ $SECONDS -lt 200 ]; then
    echo "== sanitizer mc=$mc" >> $OUT/check.txt
    timeout -k 5 60 compute-sanitizer --tool memcheck python3 $D/probe.py --check --small \
        --lib /tmp/fp8_mc_gemm_wd.so --stages 4 --mc $mc >> $OUT/check.txt 2>&1
    echo "sanitizer mc=$mc rc=$? at ${SECONDS}s" | tee -a $OUT/log.txt
  fi
done
MOE=""
MOEB=""
for mc in ${MC//,/ }; do
  for dt in fp8 bf16; do
    [ $SECONDS -lt 300 ] || { echo "moe checks: out of time" | tee -a $OUT/log.txt; break 2; }
    echo "== moe mc=$mc $dt" >> $OUT/moe-check.txt
    timeout -k 5 120 python3 $D/moe_probe.py --check --lib /tmp/fp8_mc_moe_wd.so --mc $mc \
        --dtype $dt >> $OUT/moe-check.txt 2>&1
    echo "moe check mc=$mc $dt rc=$? at ${SECONDS}s: $(last $OUT/moe-check.txt)" \
        | tee -a $OUT/log.txt
    if tail -1 $OUT/moe-check.txt | grep -q "^ok mc=$mc $dt"; then
      if [ $dt = fp8 ]; then MOE="$MOE,$mc"; else MOEB="$MOEB,$mc"; fi
    fi
  done
done
# 2. timing, whole calls first
if [ -n "$MOE" ] && [ $SECONDS -lt 420 ]; then
  timeout -k 5 100 python3 $D/moe_probe.py --mc ${MOE#,} > $OUT/moe.txt 2>&1
  echo "moe probe fp8 rc=$? at ${SECONDS}s" | tee -a $OUT/log.txt
fi
if [ -n "$MOEB" ] && [ $SECONDS -lt 450 ]; then
  timeout -k 5 100 python3 $D/moe_probe.py --dtype bf16 --mc ${MOEB#,} > $OUT/moe-bf16.txt 2>&1
  echo "moe probe bf16 rc=$? at ${SECONDS}s" | tee -a $OUT/log.txt
fi
for dt in $DEC; do
  [ $SECONDS -lt 520 ] || break
  timeout -k 5 $((585 - SECONDS > 60 ? 60 : 585 - SECONDS)) python3 $D/decode_probe.py \
      --dtype $dt >> $OUT/decode.txt 2>&1
  echo "decode probe $dt rc=$? at ${SECONDS}s" | tee -a $OUT/log.txt
done
if [ -n "$MC" ] && [ $SECONDS -lt 540 ]; then
  timeout -k 5 $((585 - SECONDS)) python3 $D/probe.py --mc ${MC#,} > $OUT/probe.txt 2>&1
  echo "dense probe rc=$? at ${SECONDS}s" | tee -a $OUT/log.txt
fi
python3 - "$OUT" <<'PY' | tee -a $OUT/log.txt
import json, os, sys
out = sys.argv[1]
for name in ("moe.txt", "moe-bf16.txt", "decode.txt", "probe.txt"):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        continue
    print("==", name)
    for line in open(path):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "us" in r:
            keys = [k for k in ("shape", "cell", "dtype", "impl", "stages", "epi", "ks", "kw",
                                "pdl")
                    if k in r]
            err = r.get("rel_err", r.get("rel_ref"))
            print(" ".join(str(r[k]) for k in keys), r["us"], r.get("tflops", r.get(
                "vs_shipped", "")), f"{err:.2e}" if err is not None else "",
                "WRONG" if r.get("ok") is False else "")
        elif "error" in r:
            print("ERROR", r)
PY
