#!/usr/bin/env bash
# Thirty-second session, the first call (about 590 s). Usage:
#   OUT=$OUT NAME=runNN COMMIT=<sha> bash benchmarks/gpu_session32.sh
# As gpu_session31.sh (unrun), plus this session's launch savings: the GDN step's b/a fold, the MoE top-k in the
# experts' launch and programmatic dependent launch. Their CUDA tests join step 1; before step 2,
# `kernels/time_ba_fold.py --tuning` (the step alone at batches 1 to 64; writes `gdn_step_ba_fold_max_batch`; BA_S,
# default 90 s) and `kernels/time_launch_folds.py --tuning` (the batch-1 graph with each on and off, PDL in both modes;
# writes `moe_gate_up_topk_max_tokens` and `pdl`, and `gdn_step_ba_fold_max_batch` 0 when the graph shows no gain;
# FOLDS_S default 150 s, FOLDS_ROUNDS default 1). Step 2 times three pairs settings in one round by default
# (PAIRS_SETTINGS, ROUNDS), and the bench runs batches 1 and 32 only (BENCH_ARGS) in what is left.
# 1. CUDA tests: the committed small-batch MoE settings (run80's `moe_decode_small_batches`); the float16 pairs of the
#    norms, the GDN step and the paged decode (for the batch-1 GEMVs), of the MoE gate/up kernel (for the down kernel)
#    and of the fused router's norm (for the gate/up kernel), each against converting, at the real shapes.
# 2. `kernels/time_float16_pairs.py --tuning`: the batch-1 decode graph with `gemv_x_pairs`, `moe_act_pairs` and
#    `moe_x_pairs` set alone and together (logits must be equal); writes the three keys into the card's tuning file on the device, copied back as
#    $OUT/$NAME-tuning.json, so the bench below runs what it chose. Copy the three keys into the repo's file by hand.
# 3. The bench (`gpu_bench_tail.sh`; BENCH_ARGS default "--output-tokens 64 --no-peer --batch-sizes 1,32"), skipped under
#    150 s left (BENCH_MIN_S); `gpu_session32b.sh` runs the bench alone as a second call.
# A short call: SKIP_TESTS=1 leaves out step 1 (step 2 still checks the logits); ROUNDS, PAIRS_SETTINGS (a subset of
# the settings, e.g. "2,0,0 0,2,2"), PAIRS_S, CALL_S and BENCH_ARGS shorten steps 2 and 3.
set -u
OUT="${OUT:-/tmp/session32-out}"; NAME="${NAME:-session32}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
echo "commit $COMMIT"; nvidia-smi --query-gpu=name --format=csv,noheader
AUX="$OUT/aux"; mkdir -p "$AUX"
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TESTS_S:-180}" python3 -m pytest -m cuda -q -p no:cacheprovider \
    "tests/reference_engine/kernels/test_moe_block_decode.py::test_the_committed_small_batch_settings_match_the_torch_op_on_cuda" \
    "tests/reference_engine/kernels/test_norms.py::test_norm_pairs_on_cuda" \
    "tests/reference_engine/kernels/test_gemv_pairs.py::test_gdn_step_pairs_on_cuda_at_the_real_heads" \
    "tests/reference_engine/kernels/test_gemv_pairs.py::test_paged_decode_pairs_on_cuda_at_the_real_heads" \
    "tests/reference_engine/kernels/test_moe_act_pairs.py::test_act_pairs_are_bit_equal_on_cuda_at_the_real_shape" \
    "tests/reference_engine/kernels/test_moe_act_pairs.py::test_x_pairs_from_the_fused_router_are_bit_equal_on_cuda_at_the_real_shape" \
    "tests/reference_engine/kernels/test_gdn_ba_fold.py::test_the_fold_matches_the_b_a_launch_on_cuda_at_the_real_shape" \
    "tests/reference_engine/kernels/test_moe_gate_up_topk.py::test_the_moved_top_k_is_bit_equal_on_cuda_at_the_real_shape" \
    "tests/reference_engine/kernels/test_pdl.py" > "$AUX/$NAME-pytest.log" 2>&1
  echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$AUX/$NAME-pytest.log" | tail -n 3 | cut -c1-300; grep -E "^E " "$AUX/$NAME-pytest.log" | head -n 6 | cut -c1-300
fi
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
timeout "${BA_S:-90}" python3 benchmarks/kernels/time_ba_fold.py "$AUX/$NAME-ba-fold.json" --tuning "$TUNED" > "$AUX/$NAME-ba-fold.log" 2>&1
echo "ba fold rc=$?"; tail -n 5 "$AUX/$NAME-ba-fold.log" | cut -c1-400
timeout "${FOLDS_S:-150}" python3 benchmarks/kernels/time_launch_folds.py "$AUX/$NAME-launch-folds.json" --rounds "${FOLDS_ROUNDS:-1}" --tuning "$TUNED" > "$AUX/$NAME-launch-folds.log" 2>&1
echo "launch folds rc=$?"; tail -n 3 "$AUX/$NAME-launch-folds.log" | cut -c1-700
PAIRS_SETTINGS="${PAIRS_SETTINGS-2,0,0 0,2,2 2,2,2}"
timeout "${PAIRS_S:-110}" python3 benchmarks/kernels/time_float16_pairs.py "$AUX/$NAME-float16-pairs.json" --rounds "${ROUNDS:-1}" ${PAIRS_SETTINGS:+--settings "$PAIRS_SETTINGS"} --tuning "$TUNED" > "$AUX/$NAME-float16-pairs.log" 2>&1
echo "float16 pairs rc=$?"; tail -n 4 "$AUX/$NAME-float16-pairs.log" | cut -c1-600
cp "$TUNED" "$OUT/$NAME-tuning.json"
CALL_S="${CALL_S:-585}"; BENCH_S="${BENCH_S:-420}"; BENCH_ARGS="${BENCH_ARGS:---output-tokens 64 --no-peer --batch-sizes 1,32}"
. benchmarks/gpu_bench_tail.sh
