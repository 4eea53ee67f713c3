#!/usr/bin/env bash
# One device call (under 10 minutes): the GPU tests of what changed on the CPU in the session
# of 2026-12-05 from 10:27 UTC (check_inputs' CUDA default, forward_async on its stream; the ws
# kernels' tests are in call.sh), then ../fp8-scales-ahead-2026-12-05/
# call3.sh with its third A/B round only if time is left. Files back (7): session-tests.txt
# and call3.sh's six.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_forward_async.py \
    "tests/test_layer_gpu.py::test_check_inputs_defaults_off_on_cuda" \
    tests/test_layer_gpu.py::test_nonfinite_logits_raise_and_leave_the_layer_usable \
    tests/test_program_gpu.py::test_the_one_rank_forward_replays_as_one_program \
    > $OUT/session-tests.txt 2>&1
tail -2 $OUT/session-tests.txt
ROUND3_BEFORE_S=$((400 - SECONDS)) bash benchmarks/experiments/fp8-scales-ahead-2026-12-05/call3.sh
