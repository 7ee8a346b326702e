#!/usr/bin/env bash
# Seventh session, first GPU call: CUDA tests of the prescaled half-dot (WORDS 3), the split MoE down kernel and the
# GDN step splits; then the batch-1 GEMV sweep over packed float16 configurations (plain and prescaled), the MoE block
# settings at 1, 8 and 32 tokens, a tuning file written from both (`write_tuning.py`, the committed file as base), and
# the decode pieces (GDN step splits 4/8/16, router, dense b/a) updating it. Writes under $OUT; the tuning file the
# records choose is $OUT/$NAME-tuning.json (copied into place only by a later call, after the quick bench checks it).
# Usage: NAME=run22 bash benchmarks/gpu_session7.sh
set -u
OUT="${OUT:-/tmp/s7-out}"; NAME="${NAME:-s7}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_gemv.py \
  tests/reference_engine/kernels/test_moe_block_decode.py tests/reference_engine/kernels/test_moe_decode.py tests/reference_engine/kernels/test_gdn_decode_step.py \
  > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 15
timeout "${GEMV_S:-170}" python3 benchmarks/kernels/sweep_w4a16_gemv.py "$OUT/$NAME-gemv.json" --batch-one-half > "$OUT/$NAME-gemv.log" 2>&1
echo "gemv sweep rc=$?"; grep -E "M=1" "$OUT/$NAME-gemv.log" | tail -n 6
timeout "${MOE_S:-120}" python3 benchmarks/kernels/time_moe_decode.py "$OUT/$NAME-moe.json" --blocks-only > "$OUT/$NAME-moe.log" 2>&1
echo "moe rc=$?"; grep -E "^T=" "$OUT/$NAME-moe.log" | tail -n 45
python3 benchmarks/kernels/write_tuning.py "$OUT/$NAME-gemv.json" "$OUT/$NAME-moe.json" "$OUT/$NAME-tuning.json" --base "$TUNED" > "$OUT/$NAME-write.log" 2>&1
echo "write tuning rc=$?"; tail -c 1500 "$OUT/$NAME-write.log"; echo
timeout "${PIECES_S:-80}" python3 benchmarks/kernels/time_decode_pieces.py "$OUT/$NAME-pieces.json" "$OUT/$NAME-tuning.json" > "$OUT/$NAME-pieces.log" 2>&1
echo "pieces rc=$?"; grep -E "tuning:|split|one program" "$OUT/$NAME-pieces.log" | tail -n 30
