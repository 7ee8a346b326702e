#!/usr/bin/env bash
# Eighth session, one GPU call: CUDA tests of the NVFP4 GEMMs (the one-step-ahead loads bit-identical to the plain loop);
# `kernels/time_moe_prefill.py` (routed experts' prefill with and without prefetch and per token block, the linears with
# and without prefetch), which writes $OUT/$NAME-tuning.json (the committed file plus its choices); then a same-run
# A/B of the engine: A with the committed tuning file, B with the new one. Usage:
#   NAME=run26 COMMIT=<sha> bash benchmarks/gpu_session8.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/s8-out}"; NAME="${NAME:-s8}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
TUNING="$OUT/$NAME-tuning.json"
cp "$TUNED" "$OUT/$NAME-tuning-committed.json"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-120}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_gemm.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 12
timeout "${TIME_S:-220}" python3 benchmarks/kernels/time_moe_prefill.py "$OUT/$NAME-moe-prefill.json" "$TUNED" "$TUNING" > "$OUT/$NAME-moe-prefill.log" 2>&1
echo "time_moe_prefill rc=$?"; cat "$OUT/$NAME-moe-prefill.log" | grep -v "^$" | tail -n 45
[ -f "$TUNING" ] || { echo "no tuning written: stop"; exit 0; }
BENCH="--no-peer --output-tokens 32 --batch-sizes 32 --gate-prompts 4"
timeout "${A_S:-120}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-A-committed" $BENCH --no-profile > "$OUT/$NAME-A.log" 2>&1
echo "bench A rc=$?"; [ -f "$OUT/$NAME-A-committed.md" ] && grep -E "^\| (TTFT|TPOT|output)|ceilings" "$OUT/$NAME-A-committed.md"
cp "$TUNING" "$TUNED"
timeout "${B_S:-170}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-B-new" $BENCH > "$OUT/$NAME-B.log" 2>&1
echo "bench B rc=$?"; [ -f "$OUT/$NAME-B-new.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over|ceilings" "$OUT/$NAME-B-new.md" | cut -c1-400
[ -f "$OUT/$NAME-B-new.md" ] && sed -n '/One prefill/,/Total over/p' "$OUT/$NAME-B-new.md" | head -n 14
rm -f "$OUT/$NAME-tuning-committed.json"  # few files under $OUT come back
