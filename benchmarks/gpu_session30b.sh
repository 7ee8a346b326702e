#!/usr/bin/env bash
# Thirtieth session, the call actually planned (about 590 s). Usage:
#   OUT=$OUT NAME=runNN COMMIT=<sha> bash benchmarks/gpu_session30b.sh
# 1. CUDA tests: the committed small-batch MoE settings (run80's `moe_decode_small_batches`) and the norms' float16
#    pairs output (`pairs_out`) against `x_half_pairs`, the GDN step's pairs for out_proj and
#    the paged decode's for o_proj, at the real heads.
# 2. `kernels/time_gemv_tiled.py --x-pairs`: the batch-1 GEMVs with x given as float16 pairs, per shape, kernel alone.
# 3. `kernels/time_float16_pairs.py --tuning` (now with the MoE's pairs keys too): the batch-1 decode graph with the norm before each mixer, the GDN step
#    before out_proj and the paged decode before o_proj writing the pairs
#    (`gemv_x_pairs` 0, 1, 2; logits must be equal); writes the key into the card's tuning file on the device, copied
#    back as $OUT/$NAME-tuning.json, so the bench below runs what it chose.
# 4. The bench (`gpu_bench_tail.sh`; BENCH_ARGS default "--output-tokens 64 --no-peer").
# A short call: SKIP_TILED=1 leaves out step 2; PAIRS_S, CALL_S and BENCH_ARGS shorten steps 3 and 4.
set -u
OUT="${OUT:-/tmp/session30-out}"; NAME="${NAME:-session30}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
echo "commit $COMMIT"; nvidia-smi --query-gpu=name --format=csv,noheader
AUX="$OUT/aux"; mkdir -p "$AUX"
timeout 120 python3 -m pytest -m cuda -q -p no:cacheprovider \
  "tests/reference_engine/kernels/test_moe_block_decode.py::test_the_committed_small_batch_settings_match_the_torch_op_on_cuda" \
  "tests/reference_engine/kernels/test_norms.py::test_norm_pairs_on_cuda" \
  "tests/reference_engine/kernels/test_gemv_pairs.py::test_gdn_step_pairs_on_cuda_at_the_real_heads" \
  "tests/reference_engine/kernels/test_gemv_pairs.py::test_paged_decode_pairs_on_cuda_at_the_real_heads" > "$AUX/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$AUX/$NAME-pytest.log" | tail -n 3 | cut -c1-300; grep -E "^E " "$AUX/$NAME-pytest.log" | head -n 6 | cut -c1-300
if [ -z "${SKIP_TILED:-}" ]; then
  timeout 100 python3 benchmarks/kernels/time_gemv_tiled.py "$AUX/$NAME-gemv-x-pairs.json" --x-pairs > "$AUX/$NAME-gemv-x-pairs.log" 2>&1
  echo "gemv x pairs rc=$?"; grep -E "^GEMV|pairs" "$AUX/$NAME-gemv-x-pairs.log" | cut -c1-200
fi
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
timeout "${PAIRS_S:-170}" python3 benchmarks/kernels/time_float16_pairs.py "$AUX/$NAME-x-pairs-model.json" --rounds 2 --tuning "$TUNED" > "$AUX/$NAME-x-pairs-model.log" 2>&1
echo "x pairs model rc=$?"; tail -n 3 "$AUX/$NAME-x-pairs-model.log" | cut -c1-400
cp "$TUNED" "$OUT/$NAME-tuning.json"
CALL_S="${CALL_S:-585}"; BENCH_S="${BENCH_S:-420}"; BENCH_ARGS="${BENCH_ARGS:---output-tokens 64 --no-peer}"
. benchmarks/gpu_bench_tail.sh
