#!/usr/bin/env bash
# For the next GPU call (an H200 first: its last full bench is run53/54, before the nineteenth session's changes).
# PHASE=bench (about 220 s): the full bench with the peer on the committed tuning. PHASE=timing (about 300 s): the side-stream
# CUDA test, then the GDN b/a side stream timed at batches 1, 8 and 32 (writes `gdn_ba_side_max_batch` into this copy's
# tuning file: copy it back only after reading the log). Run the bench first: it is the headline.
# Usage: NAME=run63 COMMIT=<sha> PHASE=bench|timing bash benchmarks/gpu_session20.sh
set -u
OUT="${OUT:-/tmp/session20-out}"; NAME="${NAME:-session20}"; COMMIT="${COMMIT:-unknown}"; PHASE="${PHASE:-bench}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNING="reference_engine/kernels/tuned/nvidia-h200.json"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
if [ "$PHASE" = bench ]; then
  timeout "${BENCH_S:-400}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
  echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -E "^\| (TTFT|TPOT|output)" "$OUT/$NAME.md" 2>/dev/null
  grep -E "^Batch-1 decode step|^Total over|^Peer" "$OUT/$NAME.md" 2>/dev/null | cut -c1-200
  exit 0
fi
timeout "${TEST_S:-90}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_side_stream.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/$NAME-pytest.log" | tail -n 3
timeout "${SIDE_S:-420}" python3 benchmarks/kernels/time_side_stream.py "$OUT/$NAME-side-stream-batches.json" --batches 1,8,32 --rounds 2 \
    --tuning "$TUNING" > "$OUT/$NAME-side-stream-batches.log" 2>&1
echo "side stream rc=$?"; grep -E "tuning:|Error|changed" "$OUT/$NAME-side-stream-batches.log" | tail -n 3 | cut -c1-400
cp "$TUNING" "$OUT/$NAME-tuning.json"
