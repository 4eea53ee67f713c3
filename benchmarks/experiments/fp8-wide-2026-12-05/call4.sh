#!/usr/bin/env bash
# Call 4 (device): the fp8 GPU tests again on the final tree (the ws kernels' shared pieces
# moved to fp8_ws_parts.py after call 3), then fp8 config files for the two EP-local shapes
# (moerun tune, into a copy of the config folder) and their fp8 cells on those files.
# Files back: the test log, the two new fp8 files (cfg-ep.tgz), the tune log, the cells.
export PYTHONPATH=.
timeout 150 python3 -m pytest -m gpu -q -x tests/test_fp8_ws.py tests/test_triton_fp8.py \
    > $OUT/pytest-gpu.txt 2>&1
tail -2 $OUT/pytest-gpu.txt
C=/tmp/cfg
mkdir -p $C && cp moerun/backends/triton/configs/*.json $C/
S=deepseek-v3-ep8-local,qwen3-235b-ep8-local
timeout 170 python3 -m moerun.cli tune --dtype fp8 --shapes $S --budget-s 120 --out-dir $C \
    > $OUT/tune-fp8-ep-log.txt 2>&1
tar czf $OUT/cfg-ep.tgz -C $C $(cd $C && ls S32_*float8* S16_*float8*)
grep "^==" $OUT/tune-fp8-ep-log.txt
MOERUN_TRITON_CONFIG_DIR=$C timeout 80 python3 -m moerun.cli bench --dtype fp8 --shapes $S \
    --peers none --no-progress --out $OUT/fp8-ep-cells.json > $OUT/fp8-ep-cells.txt 2>&1
grep -E "T=|geomean|wall" $OUT/fp8-ep-cells.txt
