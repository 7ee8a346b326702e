#!/usr/bin/env bash
# Ninth session, one GPU call: CUDA tests of the packed float16 grouped MoE decode (`moe_grouped_half`) and of the
# tensor-core grouping; `kernels/time_moe_grouped_half.py` (the whole MoE block at batch 2 to 64: committed path,
# per-pair, tensor-core grouped, and the new kernels under 8 plans), which writes $OUT/$NAME-tuning.json (the committed
# file plus `moe_grouped_half`) when the new kernels win somewhere; then the engine with that file (short bench at
# batch 8, 32, 64; the gate's 32 prompts decode as one batch of 32). Usage:
#   NAME=run31 COMMIT=<sha> TOKENS=16,32,64 bash benchmarks/gpu_session9.sh      (writes under $OUT; TOKENS, PLANS: subsets)
set -u
OUT="${OUT:-/tmp/s9-out}"; NAME="${NAME:-s9}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
TUNING="$OUT/$NAME-tuning.json"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_moe_grouped_half.py \
  > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 12
timeout "${TIME_S:-220}" python3 benchmarks/kernels/time_moe_grouped_half.py "$OUT/$NAME-moe-half.json" --tuning "$TUNED" "$TUNING" \
  --tokens "${TOKENS:-2,4,8,16,32,64}" --plans "${PLANS:-default,gate_up_16_rows,k_step_4,gate_up_16_k_step_4}" > "$OUT/$NAME-moe-half.log" 2>&1
echo "time_moe_grouped_half rc=$?"; grep -v "^$" "$OUT/$NAME-moe-half.log" | tail -n 66
if [ ! -f "$TUNING" ]; then echo "no tuning written: no engine bench"; exit 0; fi
cp "$TUNING" "$TUNED"
BENCH="--no-peer --no-profile --output-tokens 32 --batch-sizes 8,32,64 --gate-prompts ${GATE_PROMPTS:-32}"
timeout "${B_S:-200}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-B-half" $BENCH > "$OUT/$NAME-B.log" 2>&1
echo "bench B rc=$?"; [ -f "$OUT/$NAME-B-half.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over|ceilings" "$OUT/$NAME-B-half.md" | cut -c1-400
[ -f "$OUT/$NAME-B-half.md" ] || tail -n 30 "$OUT/$NAME-B.log"
