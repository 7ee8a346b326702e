#!/usr/bin/env bash
# Fifteenth session: the L2 prefetch of the next layer's weights in the decode graph, and the GDN decode step in one
# launch (written into this copy's tuning file when faster). CUDA test (graph logits with each
# prefetch point equal those without), the batch-1 kernels with weights in L2 and out of it, the batch-1 graph timed with each point (the faster one, if more than 2% ahead
# of off, written into the tuning file of this copy), then the full bench with the peer on that tuning.
# Usage: NAME=run56 COMMIT=<sha> bash benchmarks/gpu_session15.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/session15-out}"; NAME="${NAME:-session15}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNING="reference_engine/kernels/tuned/nvidia-h200.json"
timeout "${TEST_S:-60}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_l2_prefetch.py tests/reference_engine/kernels/test_gdn_decode_step.py > "$OUT/$NAME-pytest.log" 2>&1
TESTS_RC=$?; echo "pytest rc=$TESTS_RC"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 5
[ "$TESTS_RC" = 0 ] || { grep -E "^E |error" "$OUT/$NAME-pytest.log" | head -n 30 | cut -c1-300; exit 1; }
timeout "${HOTCOLD_S:-90}" python3 benchmarks/kernels/time_l2_hot_cold.py "$OUT/$NAME-l2-hot-cold.json" > "$OUT/$NAME-l2-hot-cold.log" 2>&1
echo "hot/cold rc=$?"; cut -c1-200 "$OUT/$NAME-l2-hot-cold.log" | tail -n 6
timeout "${FUSED_S:-60}" python3 benchmarks/kernels/time_gdn_fused_conv.py "$OUT/$NAME-gdn-fused-conv.json" --tuning "$TUNING" > "$OUT/$NAME-gdn-fused-conv.log" 2>&1
echo "gdn fused conv rc=$?"; cut -c1-220 "$OUT/$NAME-gdn-fused-conv.log" | tail -n 6
timeout "${PREFETCH_S:-110}" python3 benchmarks/kernels/time_l2_prefetch.py "$OUT/$NAME-l2-prefetch.json" --rounds 2 --tuning "$TUNING" > "$OUT/$NAME-l2-prefetch.log" 2>&1
echo "prefetch timing rc=$?"; tail -n 22 "$OUT/$NAME-l2-prefetch.log" | cut -c1-300
grep -o '"l2_prefetch": "[a-z]*"' "$TUNING"
timeout "${BENCH_S:-330}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 3 | cut -c1-300
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over|Peer vs|GPU time of the graph" "$OUT/$NAME.md" | cut -c1-250
