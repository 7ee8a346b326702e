#!/usr/bin/env bash
# Seventh session, one GPU call: CUDA tests of the bfloat16-copy prefill linear and the paged-decode plan; the timings that
# choose `dequant_min_tokens` and the paged split plan (written into $OUT/$NAME-tuning.json, a copy of the committed
# file); then a same-run A/B of the engine: A with the committed tuning file, B with the new one (the prefill linears
# through the bfloat16 copy from dequant_min_tokens, the paged plan). TTFT differs by the prefill linears only, TPOT by
# the paged plan only. Writes under $OUT. Usage: NAME=run23 COMMIT=<sha> bash benchmarks/gpu_session7c.sh
set -u
OUT="${OUT:-/tmp/s7c-out}"; NAME="${NAME:-s7c}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
TUNING="$OUT/$NAME-tuning.json"
cp "$TUNED" "$TUNING"; cp "$TUNED" "$OUT/$NAME-tuning-committed.json"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-70}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_dequant.py \
  tests/reference_engine/kernels/test_paged_decode.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 12
timeout "${DEQUANT_S:-90}" python3 benchmarks/kernels/time_dequant_gemm.py "$OUT/$NAME-dequant.json" "$TUNING" > "$OUT/$NAME-dequant.log" 2>&1
echo "dequant rc=$?"; tail -n 27 "$OUT/$NAME-dequant.log"
timeout "${PAGED_S:-45}" python3 benchmarks/kernels/time_paged_decode.py "$OUT/$NAME-paged.json" "$TUNING" > "$OUT/$NAME-paged.log" 2>&1
echo "paged rc=$?"; tail -n 22 "$OUT/$NAME-paged.log"
BENCH="--no-peer --output-tokens 32 --batch-sizes 32 --gate-prompts ${GATE_PROMPTS:-4}"  # run23 used 2: too few rows for the top-1 bound
timeout "${A_S:-130}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-A-committed" $BENCH --no-profile > "$OUT/$NAME-A.log" 2>&1
echo "bench A rc=$?"; [ -f "$OUT/$NAME-A-committed.md" ] && grep -E "^\| (TTFT|TPOT|output)" "$OUT/$NAME-A-committed.md"
cp "$TUNING" "$TUNED"
timeout "${B_S:-180}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-B-new" $BENCH > "$OUT/$NAME-B.log" 2>&1
echo "bench B rc=$?"; [ -f "$OUT/$NAME-B-new.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over" "$OUT/$NAME-B-new.md"
[ -f "$OUT/$NAME-B-new.md" ] && sed -n '/One prefill/,/Total over/p' "$OUT/$NAME-B-new.md" | head -n 14
