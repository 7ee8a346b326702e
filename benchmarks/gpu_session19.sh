#!/usr/bin/env bash
# The nineteenth session's second GPU call (an H200 if one comes, else an H100). CUDA tests of the side-stream b/a projection,
# the GDN step's batch-limited fused conv and the L2-prefetch test (its decode helper moved), then the side stream's
# timing (writes `gdn_ba_side_max_batch` into this copy's tuning file), then the full bench with the peer on that tuning.
# Usage: NAME=run61 COMMIT=<sha> bash benchmarks/gpu_session19.sh   (about 450 s on an H100; the timeouts are caps)
set -u
OUT="${OUT:-/tmp/session19-out}"; NAME="${NAME:-session19}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNING="reference_engine/kernels/tuned/nvidia-h200.json"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_side_stream.py \
    tests/reference_engine/kernels/test_gdn_decode_step.py tests/reference_engine/kernels/test_l2_prefetch.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/$NAME-pytest.log" | tail -n 5
if grep -q "FAILED.*test_side_stream" "$OUT/$NAME-pytest.log"; then
  echo "side stream timing skipped: its CUDA test failed"
else
  timeout "${SIDE_S:-200}" python3 benchmarks/kernels/time_side_stream.py "$OUT/$NAME-side-stream.json" --rounds 2 --tuning "$TUNING" \
      > "$OUT/$NAME-side-stream.log" 2>&1
  echo "side stream rc=$?"; grep -E "tuning:|on_over_off|Error" "$OUT/$NAME-side-stream.log" | tail -n 3 | cut -c1-300
fi
cp "$TUNING" "$OUT/$NAME-tuning.json"
timeout "${BENCH_S:-330}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -E "^\| (TTFT|TPOT|output)" "$OUT/$NAME.md" 2>/dev/null
grep -E "^Batch-1 decode step|^Total over" "$OUT/$NAME.md" 2>/dev/null | cut -c1-200
