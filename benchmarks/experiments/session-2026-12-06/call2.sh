#!/usr/bin/env bash
# Second call (any sm90 card, at most about 330 s): the division probe (div_ties.py, about
# 20 s), then the CUDA MoE grid-order probe (../cuda-fp8-mc-2026-12-05/call3.sh). Files back:
# divties.txt, log.txt, grid-*.txt.
set -u
PYTHONPATH=. timeout -k 5 60 python3 benchmarks/experiments/session-2026-12-06/div_ties.py \
    > $OUT/divties.txt 2>&1
echo "div_ties rc=$?: $(tail -1 $OUT/divties.txt | cut -c1-300)"
bash benchmarks/experiments/cuda-fp8-mc-2026-12-05/call3.sh
