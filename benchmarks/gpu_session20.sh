#!/usr/bin/env bash
# GPU calls of the twentieth session. Usage: NAME=run63 COMMIT=<sha> PHASE=e4m3|bench|timing bash benchmarks/gpu_session20.sh
# PHASE=e4m3 (about 500 s on an H100): CUDA tests of the E4M3 decode (GEMV WORDS 3, MoE block WORDS 3, grouped half fp8), then
#   `time_e4m3_decode.py` (writes $OUT/$NAME-tuning.json with the settings that won), then with time left a short bench
#   (no peer, batches 1 and 32, 64 tokens) on that tuning ($NAME-e4m3) and one on the committed tuning ($NAME-base), in that order.
# PHASE=bench (about 220 s): the full bench with the peer on the committed tuning (the headline; an H200 first); with
#   GROUPED_PLANS (names of `time_moe_grouped_half.PLANS`) and time left, those grouped-half plans at 16, 32 and 64 tokens.
# PHASE=timing (about 300 s): the side-stream CUDA test, then the GDN b/a side stream timed at batches 1, 8 and 32.
# Copy a tuning file back into the repository only after reading the logs.
set -u
OUT="${OUT:-/tmp/session20-out}"; NAME="${NAME:-session20}"; COMMIT="${COMMIT:-unknown}"; PHASE="${PHASE:-bench}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNING="reference_engine/kernels/tuned/nvidia-h200.json"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
short_bench() {  # $1: run name
  timeout "${BENCH_S:-150}" python3 -m toolbox.cli engine bench --no-peer --output-tokens 64 --batch-sizes 1,32 --out-dir "$OUT" --commit "$COMMIT" \
      --name "$1" > "$OUT/$1-bench.log" 2>&1
  echo "bench $1 rc=$?"; grep -E "^\| (TTFT|TPOT|output)" "$OUT/$1.md" 2>/dev/null
  grep -E "^Batch-1 decode step|^Total over" "$OUT/$1.md" 2>/dev/null | cut -c1-200
}
if [ "$PHASE" = e4m3 ]; then
  timeout "${TEST_S:-130}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_gemv.py \
      tests/reference_engine/kernels/test_moe_block_decode.py tests/reference_engine/kernels/test_moe_grouped_half.py \
      > "$OUT/$NAME-pytest.log" 2>&1
  echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/$NAME-pytest.log" | tail -n 8 | cut -c1-300
  if grep -q "FAILED" "$OUT/$NAME-pytest.log"; then grep -E "^E " "$OUT/$NAME-pytest.log" | head -n 10 | cut -c1-300; fi
  timeout "${TIME_S:-220}" python3 benchmarks/kernels/time_e4m3_decode.py "$OUT/$NAME-e4m3.json" --tuning "$TUNING" \
      --tuning-out "$OUT/$NAME-tuning.json" > "$OUT/$NAME-e4m3.log" 2>&1
  echo "e4m3 timing rc=$?"; grep -E "^GEMV|^MoE|tuning:|Error" "$OUT/$NAME-e4m3.log" | cut -c1-300
  if grep -q "FAILED" "$OUT/$NAME-pytest.log"; then echo "benches skipped: a CUDA test failed"; exit 0; fi
  if [ -s "$OUT/$NAME-tuning.json" ] && ! cmp -s <(python3 -c "import json,sys; print(json.load(open(sys.argv[1])))" "$TUNING") \
      <(python3 -c "import json,sys; print(json.load(open(sys.argv[1])))" "$OUT/$NAME-tuning.json"); then
    cp "$TUNING" "$OUT/$NAME-committed-tuning.json"
    cp "$OUT/$NAME-tuning.json" "$TUNING"
    short_bench "$NAME-e4m3"
    cp "$OUT/$NAME-committed-tuning.json" "$TUNING"
    if [ "$SECONDS" -lt "${BASE_BEFORE_S:-440}" ]; then short_bench "$NAME-base"; else echo "base bench skipped: ${SECONDS} s used"; fi
  else
    echo "tuning unchanged: no bench"
  fi
  exit 0
fi
if [ "$PHASE" = bench ]; then
  timeout "${BENCH_S:-400}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
  echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -E "^\| (TTFT|TPOT|output)" "$OUT/$NAME.md" 2>/dev/null
  grep -E "^Batch-1 decode step|^Total over|^Peer" "$OUT/$NAME.md" 2>/dev/null | cut -c1-200
  if [ -n "${GROUPED_PLANS:-}" ] && [ "$SECONDS" -lt "${GROUPED_BEFORE_S:-380}" ]; then  # the grouped half tiles with the E4M3 decode
    timeout "${GROUPED_S:-200}" python3 benchmarks/kernels/time_moe_grouped_half.py "$OUT/$NAME-grouped-half.json" --tokens 16,32,64 \
        --plans "$GROUPED_PLANS" --tuning "$TUNING" "$OUT/$NAME-grouped-tuning.json" > "$OUT/$NAME-grouped-half.log" 2>&1
    echo "grouped half rc=$?"; grep -E "^T=|best plan|wrote|Error" "$OUT/$NAME-grouped-half.log" | cut -c1-200
  fi
  exit 0
fi
timeout "${TEST_S:-90}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_side_stream.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/$NAME-pytest.log" | tail -n 3
timeout "${SIDE_S:-420}" python3 benchmarks/kernels/time_side_stream.py "$OUT/$NAME-side-stream-batches.json" --batches 1,8,32 --rounds 2 \
    --tuning "$TUNING" > "$OUT/$NAME-side-stream-batches.log" 2>&1
echo "side stream rc=$?"; grep -E "tuning:|Error|changed" "$OUT/$NAME-side-stream-batches.log" | tail -n 3 | cut -c1-400
cp "$TUNING" "$OUT/$NAME-tuning.json"
