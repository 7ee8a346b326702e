#!/usr/bin/env bash
# Thirtieth session, first call (about 590 s). Usage:
#   OUT=$OUT NAME=runNN COMMIT=<sha> bash benchmarks/gpu_session30.sh
# 1. CUDA tests: the committed small-batch MoE settings (run80's `moe_decode_small_batches`, 2 to 12 tokens) and the
#    norms' float16-pairs output (`pairs_out`) against `x_half_pairs`.
# 2. `kernels/time_gemv_tiled.py --x-pairs`: the batch-1 GEMVs with x given as float16 pairs (no conversion in every
#    program; sm_90 SASS: 0.70 to 0.86 of the instructions at the committed tiles), against converting it, per shape.
# 3. The bench on the committed tuning file (`gpu_bench_tail.sh`; BENCH_ARGS default "--output-tokens 64", with the
#    peer): the first end-to-end figures since run76, the small-batch tiles' effect at batch 8 included.
# Short on device time: BENCH_ARGS="--output-tokens 64 --no-peer" (about 90 s less).
set -u
OUT="${OUT:-/tmp/session30-out}"; NAME="${NAME:-session30}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
echo "commit $COMMIT"; nvidia-smi --query-gpu=name --format=csv,noheader
AUX="$OUT/aux"; mkdir -p "$AUX"
timeout 120 python3 -m pytest -m cuda -q -p no:cacheprovider \
  "tests/reference_engine/kernels/test_moe_block_decode.py::test_the_committed_small_batch_settings_match_the_torch_op_on_cuda" \
  "tests/reference_engine/kernels/test_norms.py::test_norm_pairs_on_cuda" > "$AUX/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$AUX/$NAME-pytest.log" | tail -n 3 | cut -c1-300; grep -E "^E " "$AUX/$NAME-pytest.log" | head -n 6 | cut -c1-300
timeout 120 python3 benchmarks/kernels/time_gemv_tiled.py "$AUX/$NAME-gemv-x-pairs.json" --x-pairs > "$AUX/$NAME-gemv-x-pairs.log" 2>&1
echo "gemv x pairs rc=$?"; grep -E "^GEMV|pairs" "$AUX/$NAME-gemv-x-pairs.log" | cut -c1-200
CALL_S="${CALL_S:-590}"; BENCH_S="${BENCH_S:-560}"; BENCH_ARGS="${BENCH_ARGS:---output-tokens 64}"
. benchmarks/gpu_bench_tail.sh
