# Sourced by call2.sh and call2-short.sh from the checkout's root (D set to this folder): the
# prefetch is a patch the submitted tree does not carry. prefetch.diff is against the tree of
# 2026-12-05 13:25 UTC (rebased onto that day's docstring lines, same patched result);
# prefetch-on-scales.diff against the 08:50 UTC tree with
# ../fp8-scales-ahead-2026-12-05/scales.diff in the package (the tree has act_scales). Applied
# on the device copy unless it is applied already (git not needed); exits 3 if it is not.
if ! grep -q "prefetch: int = 0" moerun/backends/triton/config_types.py; then
  PF=$D/prefetch.diff
  grep -q "def act_scales" moerun/backends/triton/fp8_tiles.py && PF=$D/prefetch-on-scales.diff
  python3 benchmarks/experiments/fp8-scales-ahead-2026-12-05/apply_diff.py $PF --root .
fi
grep -q "prefetch: int = 0" moerun/backends/triton/config_types.py || {
  echo "prefetch.diff is not applied: apply it in the checkout first"; exit 3; }
