# Sourced first by a device call that is to run the prepared H200 call (call.sh, this folder)
# when the card is an H200, and its own work on any other card: exports PYTHONPATH=. and
# PYTHONUNBUFFERED=1; on an H200 it execs call.sh (the sourcing script ends there); else it
# writes "card: NAME" to $OUT/summary.txt and returns.
export PYTHONPATH=. PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$NAME" == *H200* ]]; then
  exec bash benchmarks/experiments/retune-1024-2026-12-06/call.sh
fi
echo "card: $NAME" | tee $OUT/summary.txt
