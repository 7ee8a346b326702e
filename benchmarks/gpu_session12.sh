#!/usr/bin/env bash
# Twelfth session: the register-operand Gluon experts with cp.async activation stages (`kernels/moe_prefill_gluon.py`):
# their CUDA tests against the Triton launches, `kernels/time_moe_prefill.py --gluon` (gate/up alone and with the down
# launch, three tiles each; the tuning file changes only for a 2% gain and only if the tests passed), Nsight Compute on
# the experts' launches with the resulting tuning (stall reasons, issue and DRAM use), then the full bench.
# Usage: NAME=run49 COMMIT=<sha> bash benchmarks/gpu_session12.sh      (writes under $OUT; BENCH=0: no bench)
set -u
OUT="${OUT:-/tmp/session12-out}"; NAME="${NAME:-session12}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-200}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_moe_prefill_gluon.py > "$OUT/$NAME-pytest.log" 2>&1
TESTS=$?; echo "pytest rc=$TESTS (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
[ "$TESTS" = 0 ] || { grep -E "^E |error" "$OUT/$NAME-pytest.log" | head -n 30 | cut -c1-300; exit 1; }
timeout "${TIME_S:-150}" python3 benchmarks/kernels/time_moe_prefill.py "$OUT/$NAME-moe-gluon.json" "$TUNED" "$OUT/$NAME-tuning.json" --gluon > "$OUT/$NAME-moe-gluon.log" 2>&1
echo "time_moe_prefill --gluon rc=$?"; grep -E "^moe|tuning|failed|rejected" "$OUT/$NAME-moe-gluon.log" | cut -c1-200
[ -f "$OUT/$NAME-tuning.json" ] && cp "$OUT/$NAME-tuning.json" "$TUNED"
STALLS=""
for reason in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait lg_throttle not_selected selected dispatch_stall membar; do
  STALLS="$STALLS,smsp__average_warps_issue_stalled_${reason}_per_issue_active.ratio"
done
METRICS="gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed"
METRICS="$METRICS,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active"
METRICS="$METRICS,smsp__inst_executed.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem$STALLS"
timeout "${NCU_S:-120}" ncu --clock-control none --profile-from-start off --kernel-name "regex:gluon|_moe_gate_up_kernel|_moe_down_kernel" \
  --metrics "$METRICS" python3 benchmarks/kernels/profile_ncu_prefill.py > "$OUT/$NAME-ncu.txt" 2>&1
echo "ncu rc=$?"; grep -E "^  [_a-zA-Z].*\(|gpu__time|issue_active|dram__|gmma|warps_active|inst_executed|registers|occupancy|stalled" "$OUT/$NAME-ncu.txt" | sed 's/  */ /g' | head -n 60
[ "${BENCH:-1}" = 0 ] && exit 0
timeout "${BENCH_S:-330}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 4
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over|gluon" "$OUT/$NAME.md" | cut -c1-300
