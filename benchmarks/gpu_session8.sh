#!/usr/bin/env bash
# Eighth session, one GPU call: CUDA tests of the NVFP4 GEMMs (the one-step-ahead loads bit-identical to the plain loop)
# and GEMVs; `kernels/time_moe_prefill.py` (routed experts' prefill with and without prefetch and per token block, the
# linears with and without prefetch) and `kernels/time_gemv_loops.py` (the batch-1 GEMV tiles with each K-loop form),
# which write $OUT/$NAME-tuning.json (the committed file plus their choices); then the engine with the new file (B), and
# with RUN_A=1 first with the committed file (A, same run). Usage:
#   NAME=run26 COMMIT=<sha> bash benchmarks/gpu_session8.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/s8-out}"; NAME="${NAME:-s8}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
TUNING="$OUT/$NAME-tuning.json"
cp "$TUNED" "$OUT/$NAME-tuning-committed.json"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-120}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_gemm.py \
  tests/reference_engine/kernels/test_nvfp4_gemv.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 12
timeout "${TIME_S:-200}" python3 benchmarks/kernels/time_moe_prefill.py "$OUT/$NAME-moe-prefill.json" "$TUNED" "$OUT/$NAME-tuning-moe.json" > "$OUT/$NAME-moe-prefill.log" 2>&1
echo "time_moe_prefill rc=$?"; grep -v "^$" "$OUT/$NAME-moe-prefill.log" | tail -n 45
[ -f "$OUT/$NAME-tuning-moe.json" ] || cp "$TUNED" "$OUT/$NAME-tuning-moe.json"
timeout "${GEMV_S:-60}" python3 benchmarks/kernels/time_gemv_loops.py "$OUT/$NAME-gemv-loops.json" "$OUT/$NAME-tuning-moe.json" "$TUNING" > "$OUT/$NAME-gemv-loops.log" 2>&1
echo "time_gemv_loops rc=$?"; tail -n 6 "$OUT/$NAME-gemv-loops.log"
[ -f "$TUNING" ] || cp "$OUT/$NAME-tuning-moe.json" "$TUNING"
rm -f "$OUT/$NAME-tuning-moe.json"
if cmp -s "$TUNING" "$TUNED"; then echo "tuning unchanged: no engine bench"; exit 0; fi
BENCH="--no-peer --output-tokens 32 --batch-sizes 32 --gate-prompts 4"
if [ "${RUN_A:-0}" = 1 ]; then
  timeout "${A_S:-120}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-A-committed" $BENCH --no-profile > "$OUT/$NAME-A.log" 2>&1
  echo "bench A rc=$?"; [ -f "$OUT/$NAME-A-committed.md" ] && grep -E "^\| (TTFT|TPOT|output)|ceilings" "$OUT/$NAME-A-committed.md"
fi
cp "$TUNING" "$TUNED"
timeout "${B_S:-170}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-B-new" $BENCH > "$OUT/$NAME-B.log" 2>&1
echo "bench B rc=$?"; [ -f "$OUT/$NAME-B-new.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over|ceilings" "$OUT/$NAME-B-new.md" | cut -c1-400
[ -f "$OUT/$NAME-B-new.md" ] && sed -n '/One prefill/,/Total over/p' "$OUT/$NAME-B-new.md" | head -n 14
rm -f "$OUT/$NAME-tuning-committed.json"  # few files under $OUT come back
