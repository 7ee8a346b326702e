#!/usr/bin/env bash
# The nineteenth session's third GPU call: CUDA tests of the two side-stream branches (graph decode of the tiny model) and of
# the MoE decode kernels, the shared expert's side-stream timing on the full model (writes `moe_shared_side_max_batch` into
# this copy's tuning file), then a short bench without the peer (batches 1 and 32) on that tuning.
# It ran once, as run62 at commit ece7445; the shared expert's side stream (and `--switch`) were removed after it measured slower.
# Usage: NAME=run62 COMMIT=<sha> bash benchmarks/gpu_session19b.sh   (about 330 s on an H100; the timeouts are caps)
set -u
OUT="${OUT:-/tmp/session19b-out}"; NAME="${NAME:-session19b}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNING="reference_engine/kernels/tuned/nvidia-h200.json"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout "${TEST_S:-120}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_side_stream.py \
    tests/reference_engine/kernels/test_moe_block_decode.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/$NAME-pytest.log" | tail -n 5
if grep -q "FAILED.*test_side_stream" "$OUT/$NAME-pytest.log"; then
  grep -E "^E " "$OUT/$NAME-pytest.log" | head -n 10 | cut -c1-300; echo "shared side timing skipped: its CUDA test failed"
else
  timeout "${SIDE_S:-170}" python3 benchmarks/kernels/time_side_stream.py "$OUT/$NAME-moe-shared-side.json" --switch moe_shared --rounds 2 \
      --tuning "$TUNING" > "$OUT/$NAME-moe-shared-side.log" 2>&1
  echo "moe shared side rc=$?"; grep -E "tuning:|on_over_off|Error|changed" "$OUT/$NAME-moe-shared-side.log" | tail -n 3 | cut -c1-400
fi
cp "$TUNING" "$OUT/$NAME-tuning.json"
timeout "${BENCH_S:-150}" python3 -m toolbox.cli engine bench --no-peer --output-tokens 64 --batch-sizes 1,32 --out-dir "$OUT" --commit "$COMMIT" \
    --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$?"; grep -E "^\| (TTFT|TPOT|output)" "$OUT/$NAME.md" 2>/dev/null
grep -E "^Batch-1 decode step|^Total over" "$OUT/$NAME.md" 2>/dev/null | cut -c1-200
