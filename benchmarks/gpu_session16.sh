#!/usr/bin/env bash
# For the next GPU call (an H200 or, since the bench parks our weights on the host while the peer runs, an H100). CUDA tests of the fifteenth
# session's pieces (L2 prefetch, one-launch GDN step, the router's expert prefetch; the sixteenth's parked weights and
# short-row norms), then their timings, each writing its
# switch into this copy's tuning file when it wins by more than 2% (copy the file back into the repository only after
# reading the logs), then the full bench with the peer on that tuning.
# Usage: NAME=run59 COMMIT=<sha> [PHASE=kernels|bench|all] bash benchmarks/gpu_session16.sh   (the kernel JSONs in one .tgz)
# Expected about 600 s in all (tests ~60, timings ~250, bench ~300): two calls on the same warm machine, PHASE=kernels
# then PHASE=bench in the same directory (the second reads the tuning copy the first wrote); the timeouts are caps.
set -u
OUT="${OUT:-/tmp/session16-out}"; NAME="${NAME:-session16}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNING="reference_engine/kernels/tuned/nvidia-h200.json"
LOG="$OUT/$NAME-kernels.log"; PHASE="${PHASE:-all}"
if [ "$PHASE" != bench ]; then
timeout "${TEST_S:-120}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_l2_prefetch.py \
    tests/reference_engine/kernels/test_gdn_decode_step.py tests/reference_engine/kernels/test_router.py \
    tests/reference_engine/test_bench_offload.py tests/reference_engine/kernels/test_norms.py > "$OUT/$NAME-pytest.log" 2>&1
TESTS_RC=$?; echo "pytest rc=$TESTS_RC"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 5
[ "$TESTS_RC" = 0 ] || { grep -E "^E |error" "$OUT/$NAME-pytest.log" | head -n 30 | cut -c1-300; exit 1; }
{
  timeout 90 python3 benchmarks/kernels/time_moe_expert_prefetch.py "$OUT/$NAME-expert-prefetch.json" --tuning "$TUNING"; echo "expert prefetch rc=$?"
  timeout 60 python3 benchmarks/kernels/time_gdn_fused_conv.py "$OUT/$NAME-gdn-fused-conv.json" --tuning "$TUNING"; echo "gdn fused conv rc=$?"
  timeout 110 python3 benchmarks/kernels/time_l2_prefetch.py "$OUT/$NAME-l2-prefetch.json" --rounds 2 --tuning "$TUNING"; echo "l2 prefetch rc=$?"
  timeout 60 python3 benchmarks/kernels/time_norm_rows.py "$OUT/$NAME-norm-rows.json" --tuning "$TUNING"; echo "norm rows rc=$?"
  timeout 90 python3 benchmarks/kernels/time_l2_hot_cold.py "$OUT/$NAME-l2-hot-cold.json"; echo "hot/cold rc=$?"  # run58's were untuned
} > "$LOG" 2>&1
grep -E "rc=|tuning:|^[0-9]+ \{|hot_us" "$LOG" | cut -c1-240
cp "$TUNING" "$OUT/$NAME-tuning.json"
(cd "$OUT" && tar -czf "$NAME-kernels.tgz" "$NAME"-*.json 2>/dev/null && rm -f "$NAME"-*.json)  # one file: 8 come back at most
fi
[ "$PHASE" = kernels ] && exit 0
timeout "${BENCH_S:-330}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 3 | cut -c1-300
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over|Peer vs|GPU time of the graph" "$OUT/$NAME.md" | cut -c1-250
