#!/usr/bin/env bash
# Second device call of the CUDA probes (any sm90 card, about 5 minutes): the fp8 decode pair
# with its scale rule fixed (2026-12-06), checked (timing build) and, if it passes, timed;
# the fp8 MoE forms timed against the shipped call (the first run checked them but did not
# time them); then Nsight Compute over one bf16 and one fp8 CUDA MoE call at deepseek-v3
# T=8192 (why the bf16 form's GEMMs run near 270 TFLOP/s); between them the package's fp8 GPU
# tests. Files back: log.txt, check.txt, decode.txt, moe.txt, gpu-fp8.txt, ncu-bf16.csv,
# ncu-fp8.csv.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
D=benchmarks/experiments/cuda-fp8-mc-2026-12-05
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $OUT/log.txt
build() {  # build <source> <library> [flags]
  nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -shared -Xcompiler -fPIC \
      -Xptxas -v -lineinfo "${@:3}" -o $2 $D/$1.cu > $2.log 2>&1 \
      || echo "build $2 failed: $(tail -3 $2.log)" | tee -a $OUT/log.txt
}
build fp8_mc_moe /tmp/fp8_mc_moe.so &
build fp8_decode /tmp/fp8_decode.so &
wait
grep -h "C7510\|spill stores" /tmp/*.so.log | grep -v " 0 bytes spill" | sort | uniq -c | head -5 \
    | tee -a $OUT/log.txt
echo "built at ${SECONDS}s" | tee -a $OUT/log.txt
timeout -k 5 90 python3 $D/decode_probe.py --check --dtype fp8 > $OUT/check.txt 2>&1
echo "decode check fp8 rc=$? at ${SECONDS}s: $(tail -1 $OUT/check.txt | cut -c1-150)" \
    | tee -a $OUT/log.txt
if tail -1 $OUT/check.txt | grep -q "^ok decode fp8"; then
  timeout -k 5 60 python3 $D/decode_probe.py --dtype fp8 > $OUT/decode.txt 2>&1
  echo "decode probe fp8 rc=$? at ${SECONDS}s" | tee -a $OUT/log.txt
fi
timeout -k 5 120 python3 $D/moe_probe.py --dtype fp8 --mc 1,2,4 > $OUT/moe.txt 2>&1
echo "moe probe fp8 rc=$? at ${SECONDS}s" | tee -a $OUT/log.txt
# the fp8 GPU tests of the package after the scale-rule change (moerun/quant.py, 2026-12-06)
timeout -k 10 130 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_triton_fp8.py \
    tests/test_fp8_ws.py > $OUT/gpu-fp8.txt 2>&1
echo "gpu fp8 tests rc=$? at ${SECONDS}s: $(tail -1 $OUT/gpu-fp8.txt | cut -c1-120)" \
    | tee -a $OUT/log.txt
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee -a $OUT/log.txt
for dt in bf16 fp8; do
  [ $SECONDS -lt 480 ] || break
  timeout -k 5 $((580 - SECONDS)) $NCU --clock-control none --csv --page raw \
      -k regex:moe_kernel --launch-skip 2 --launch-count 2 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --section Occupancy --section SourceCounters \
      python3 $D/ncu_target.py --dtype $dt --mc 2 --stages 4 > $OUT/ncu-$dt.csv 2>>$OUT/log.txt
  echo "ncu $dt rc=$? at ${SECONDS}s $(wc -l < $OUT/ncu-$dt.csv) lines" | tee -a $OUT/log.txt
done
python3 - "$OUT/moe.txt" "$OUT/decode.txt" <<'PY' | tee -a $OUT/log.txt
import json, os, sys
for line in (l for p in sys.argv[1:] if os.path.exists(p) for l in open(p)):
    if line.startswith("{") and "cell" in line:
        r = json.loads(line)
        if "us" in r:
            form = " ".join(f"{k}={r[k]}" for k in ("ks", "kw", "pdl") if k in r)
            err = r.get("rel_ref")
            print(r["cell"], r["impl"], form, r["us"], r.get("vs_shipped", ""),
                  f"{err:.2e}" if err is not None else "",
                  "WRONG" if r.get("ok") is False else "")
        elif "kernels_us" in r:
            print(json.dumps(r["kernels_us"])[:600])
        elif "error" in r:
            print("ERROR", r)
PY
