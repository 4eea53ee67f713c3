#!/usr/bin/env bash
# One device call (any sm90 card; about 7 minutes): build the two CUDA probes, check every
# cluster size of each (dense: small shapes against the fp32 reference; MoE: small whole calls
# against DESIGN 11a's reference and the shipped call), each form in its own process under
# its own timeout so that a hang names its form, then time the forms that passed: the dense
# GEMM against cuBLAS's block-scaled GEMM and the Gluon probe, the whole fp8 calls against
# the shipped ones. A dense form that fails its check runs again on two small shapes under
# compute-sanitizer (memcheck). Files back (7): log.txt, check.txt, moe-check.txt,
# probe.txt, probe.json, moe.txt, moe.json.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
D=benchmarks/experiments/cuda-fp8-mc-2026-12-05
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee $OUT/log.txt
for f in fp8_mc_gemm fp8_mc_moe; do
  nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -shared -Xcompiler -fPIC \
      -o /tmp/$f.so $D/$f.cu >> $OUT/log.txt 2>&1 || { echo "build $f failed" | tee -a $OUT/log.txt; exit 1; }
done
echo "built at ${SECONDS}s" | tee -a $OUT/log.txt
MC=""
for mc in 1 2 4; do
  echo "== dense mc=$mc" >> $OUT/check.txt
  timeout -k 5 90 python3 $D/probe.py --check --mc $mc >> $OUT/check.txt 2>&1
  echo "dense check mc=$mc rc=$? at ${SECONDS}s: $(tail -1 $OUT/check.txt | cut -c1-150)" | tee -a $OUT/log.txt
  if tail -1 $OUT/check.txt | grep -q "^ok mc=$mc"; then
    MC="$MC,$mc"
  else
    echo "== sanitizer mc=$mc" >> $OUT/check.txt
    timeout -k 5 120 compute-sanitizer --tool memcheck python3 $D/probe.py --check --small \
        --stages 4 --mc $mc >> $OUT/check.txt 2>&1
    echo "sanitizer mc=$mc rc=$? at ${SECONDS}s" | tee -a $OUT/log.txt
  fi
done
[ -z "$MC" ] && { echo "no dense form passed its check: stop" | tee -a $OUT/log.txt; exit 2; }
MOE=""
for mc in ${MC//,/ }; do
  echo "== moe mc=$mc" >> $OUT/moe-check.txt
  timeout -k 5 120 python3 $D/moe_probe.py --check --mc $mc >> $OUT/moe-check.txt 2>&1
  echo "moe check mc=$mc rc=$? at ${SECONDS}s: $(tail -1 $OUT/moe-check.txt | cut -c1-150)" | tee -a $OUT/log.txt
  tail -1 $OUT/moe-check.txt | grep -q "^ok mc=$mc" && MOE="$MOE,$mc"
done
timeout -k 5 150 python3 $D/probe.py --mc ${MC#,} --out $OUT/probe.json > $OUT/probe.txt 2>&1
echo "dense probe rc=$? at ${SECONDS}s" | tee -a $OUT/log.txt
grep -h '"impl"' $OUT/probe.txt | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r['shape'], r['impl'], r.get('stages',''), r.get('epi',''), r.get('us'), r.get('tflops'), r.get('rel_err', r.get('error','')))"
if [ -n "$MOE" ] && [ $SECONDS -lt 450 ]; then
  timeout -k 5 $((580 - SECONDS)) python3 $D/moe_probe.py --mc ${MOE#,} --out $OUT/moe.json \
      > $OUT/moe.txt 2>&1
  echo "moe probe rc=$? at ${SECONDS}s" | tee -a $OUT/log.txt
  grep -h '"us"' $OUT/moe.txt | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r['cell'], r['impl'], r['us'], r['vs_shipped'], round(r['rel_ref'],5), round(r['rel_shipped'],5))"
fi
