#!/usr/bin/env bash
# Seventh session, second GPU call: CUDA tests of the bfloat16-copy prefill linear, the paged-decode plan knobs and the
# split MoE down kernel; then the timings that choose their settings, each updating $OUT/$NAME-tuning.json (a copy of
# the committed file): prefill linears tensor-core GEMM vs bfloat16 copy + cuBLAS (`dequant_min_tokens`), the paged
# decode split plan, the MoE block settings at 1, 8 and 32 tokens (`write_tuning.py`), and the decode pieces.
# Writes under $OUT; nothing is copied into the tree. Usage: NAME=run23 bash benchmarks/gpu_session7b.sh
set -u
OUT="${OUT:-/tmp/s7b-out}"; NAME="${NAME:-s7b}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNING="$OUT/$NAME-tuning.json"
cp reference_engine/kernels/tuned/nvidia-h200.json "$TUNING"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-120}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_dequant.py \
  tests/reference_engine/kernels/test_paged_decode.py tests/reference_engine/kernels/test_moe_block_decode.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 15
timeout "${DEQUANT_S:-120}" python3 benchmarks/kernels/time_dequant_gemm.py "$OUT/$NAME-dequant.json" "$TUNING" > "$OUT/$NAME-dequant.log" 2>&1
echo "dequant rc=$?"; tail -n 28 "$OUT/$NAME-dequant.log"
timeout "${PAGED_S:-60}" python3 benchmarks/kernels/time_paged_decode.py "$OUT/$NAME-paged.json" "$TUNING" > "$OUT/$NAME-paged.log" 2>&1
echo "paged rc=$?"; tail -n 23 "$OUT/$NAME-paged.log"
timeout "${MOE_S:-110}" python3 benchmarks/kernels/time_moe_decode.py "$OUT/$NAME-moe.json" --blocks-only > "$OUT/$NAME-moe.log" 2>&1
echo "moe rc=$?"; grep -E "^T=" "$OUT/$NAME-moe.log" | tail -n 36
python3 benchmarks/kernels/write_tuning.py "$OUT/none.json" "$OUT/$NAME-moe.json" "$TUNING.moe" --base "$TUNING" > "$OUT/$NAME-write.log" 2>&1 && mv "$TUNING.moe" "$TUNING"
echo "write tuning rc=$?"
timeout "${PIECES_S:-70}" python3 benchmarks/kernels/time_decode_pieces.py "$OUT/$NAME-pieces.json" "$TUNING" > "$OUT/$NAME-pieces.log" 2>&1
echo "pieces rc=$?"; grep -E "^tuning" "$OUT/$NAME-pieces.log"
python3 -c "import json,sys; t=json.load(open(sys.argv[1])); print({k: t.get(k) for k in ('moe_decode', 'moe_decode_batch_one', 'dequant_min_tokens', 'paged_min_tokens_per_split', 'paged_waves', 'gdn_step_split')})" "$TUNING"
