#!/usr/bin/env bash
# Ninth session's GPU calls (run32: BENCH=0, TOKENS=8,16,32,64, PLANS=k_step_4,pairs,k_step_4_pairs,k_step_16_pairs;
# run33: the defaults): the CUDA test of the packed float16 grouped MoE decode at batch 32 (`pairs` 1 bit-identical to 0);
# `kernels/time_moe_grouped_half.py` (the committed path against the plans), writing $OUT/$NAME-tuning.json only when a
# plan lowers the committed total; then the full bench (peer included) with that file. Usage:
#   NAME=run32 COMMIT=<sha> bash benchmarks/gpu_final9.sh      (writes under $OUT; BENCH=0: no bench)
set -u
OUT="${OUT:-/tmp/f9-out}"; NAME="${NAME:-f9}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-80}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_moe_grouped_half.py -k "32" > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
timeout "${TIME_S:-140}" python3 benchmarks/kernels/time_moe_grouped_half.py "$OUT/$NAME-moe-half.json" --tuning "$TUNED" "$OUT/$NAME-tuning.json" \
  --tokens "${TOKENS:-1,2,8,16,32,64}" --plans "${PLANS:-k_step_4_pairs,k_step_2_pairs,gate_up_16_k_step_4_pairs,down_64_k_step_4_pairs,gate_up_k_step_8_pairs}" > "$OUT/$NAME-moe-half.log" 2>&1
echo "time_moe_grouped_half rc=$?"; grep -v "^$" "$OUT/$NAME-moe-half.log" | tail -n 30
[ -f "$OUT/$NAME-tuning.json" ] && cp "$OUT/$NAME-tuning.json" "$TUNED"
[ "${BENCH:-1}" = 0 ] && exit 0
timeout "${BENCH_S:-370}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 4
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|ceilings|Peer|Total over|Batch-1" "$OUT/$NAME.md" | cut -c1-420
[ -f "$OUT/$NAME.md" ] && sed -n '/One prefill/,/Total over/p' "$OUT/$NAME.md" | head -n 10
