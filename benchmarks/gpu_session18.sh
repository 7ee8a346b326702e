#!/usr/bin/env bash
# The eighteenth session's GPU call (an H100 or an H200). CUDA tests of the persistent MoE block (seventeenth session)
# and of the sixteenth's pieces (parked weights, short-row norms), then the persistent block's timing (kernel forms and
# the full model's batch-1 graph off and on) and the switch timings, each writing its key into this copy's tuning file;
# then the full bench with the peer on that tuning (copy the file back into the repository only after reading the logs).
# Usage: NAME=run59 COMMIT=<sha> [PHASE=kernels|bench|all] bash benchmarks/gpu_session18.sh   (kernel JSONs in one .tgz)
# Two calls on the same warm machine, PHASE=kernels (~400 s) then PHASE=bench in the same directory (the second reads
# the tuning copy the first wrote); the timeouts are caps.
set -u
OUT="${OUT:-/tmp/session18-out}"; NAME="${NAME:-session18}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNING="reference_engine/kernels/tuned/nvidia-h200.json"
LOG="$OUT/$NAME-kernels.log"; PHASE="${PHASE:-all}"
if [ "$PHASE" != bench ]; then
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_moe_block_persistent.py \
    tests/reference_engine/test_bench_offload.py tests/reference_engine/kernels/test_norms.py > "$OUT/$NAME-pytest.log" 2>&1
TESTS_RC=$?; echo "pytest rc=$TESTS_RC"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 5
if [ "$TESTS_RC" != 0 ]; then grep -E "^E |error|Timeout" "$OUT/$NAME-pytest.log" | head -n 30 | cut -c1-300; fi
{
  if grep -q "test_one_launch_with_barriers.*PASSED\|passed" "$OUT/$NAME-pytest.log" && ! grep -q "FAILED.*test_moe_block_persistent" "$OUT/$NAME-pytest.log"; then
    timeout 270 python3 benchmarks/kernels/time_moe_persistent.py "$OUT/$NAME-moe-persistent.json" --tuning "$TUNING" --model full; echo "moe persistent rc=$?"
  else echo "moe persistent skipped: its CUDA test did not pass"; fi
  if [ "${ONLY_PERSISTENT:-0}" != 1 ]; then  # ONLY_PERSISTENT=1: a short call, the persistent block alone
    timeout 60 python3 benchmarks/kernels/time_norm_rows.py "$OUT/$NAME-norm-rows.json" --tuning "$TUNING"; echo "norm rows rc=$?"
    timeout 80 python3 benchmarks/kernels/time_moe_expert_prefetch.py "$OUT/$NAME-expert-prefetch.json" --tuning "$TUNING"; echo "expert prefetch rc=$?"
  fi
} > "$LOG" 2>&1
grep -E "rc=|tuning:|refused|skipped|^model |us/block|^[0-9]+ \{" "$LOG" | cut -c1-260
cp "$TUNING" "$OUT/$NAME-tuning.json"
(cd "$OUT" && tar -czf "$NAME-kernels.tgz" "$NAME"-*.json 2>/dev/null && rm -f "$NAME"-*.json)  # one file: 8 come back at most
fi
[ "$PHASE" = kernels ] && exit 0
OUT="$OUT" NAME="$NAME" COMMIT="$COMMIT" PHASE=bench bash benchmarks/gpu_session16.sh  # its bench phase: the full bench with the peer
