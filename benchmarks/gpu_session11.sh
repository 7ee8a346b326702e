#!/usr/bin/env bash
# Eleventh session, first GPU call: CUDA tests of the swapped grouped decode MoE and the fused router settings, then
# `kernels/time_router.py` (rows x warps per program of the fused router) and `kernels/time_moe_grouped_swap.py`
# (the tensor-core grouping with the weights as wgmma's M against the committed path at 8..64 tokens); each writes its
# choice into the tuning file only for a 3% gain, and the file ends up in $OUT/$NAME-tuning.json.
# Usage: NAME=run41 bash benchmarks/gpu_session11.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/s11-out}"; NAME="${NAME:-s11}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_moe_grouped_decode.py \
  tests/reference_engine/kernels/test_router.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
timeout "${ROUTER_S:-120}" python3 benchmarks/kernels/time_router.py "$OUT/$NAME-router.json" --tuning "$TUNED" "$OUT/$NAME-tuning-router.json" > "$OUT/$NAME-router.log" 2>&1
echo "time_router rc=$?"; grep -E "batch 1:|settings|wrote|Error" "$OUT/$NAME-router.log" | cut -c1-200
[ -f "$OUT/$NAME-tuning-router.json" ] && cp "$OUT/$NAME-tuning-router.json" "$TUNED"
timeout "${SWAP_S:-200}" python3 benchmarks/kernels/time_moe_grouped_swap.py "$OUT/$NAME-grouped-swap.json" --tuning "$TUNED" "$OUT/$NAME-tuning-swap.json" > "$OUT/$NAME-grouped-swap.log" 2>&1
echo "time_moe_grouped_swap rc=$?"; grep -E "^T=|best|wrote|Error" "$OUT/$NAME-grouped-swap.log" | cut -c1-200
[ -f "$OUT/$NAME-tuning-swap.json" ] && cp "$OUT/$NAME-tuning-swap.json" "$TUNED"
cp "$TUNED" "$OUT/$NAME-tuning.json"
