#!/usr/bin/env bash
# Thirteenth session, first GPU call: the Gluon experts' CUDA tests (the down-only launch, the unpermuted known-wrong
# run and the 32-token class never ran on a GPU), `kernels/time_moe_prefill.py --gluon` with the split token classes,
# `kernels/profile_prefill_ops.py` (which lines launch the prefill's copies), and a short bench without the peer only
# when the tuning file changed.
# Usage: NAME=run51 COMMIT=<sha> bash benchmarks/gpu_session13.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/session13-out}"; NAME="${NAME:-session13}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider ${TESTS:-tests/reference_engine/kernels/test_moe_prefill_gluon.py} > "$OUT/$NAME-pytest.log" 2>&1
TESTS_RC=$?; echo "pytest rc=$TESTS_RC (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
[ "$TESTS_RC" = 0 ] || { grep -E "^E |error" "$OUT/$NAME-pytest.log" | head -n 30 | cut -c1-300; exit 1; }
timeout "${TIME_S:-120}" python3 benchmarks/kernels/time_moe_prefill.py "$OUT/$NAME-moe-gluon.json" "$TUNED" "$OUT/$NAME-tuning.json" --gluon > "$OUT/$NAME-moe-gluon.log" 2>&1
echo "time_moe_prefill --gluon rc=$?"; grep -E "^moe|tuning|failed|rejected" "$OUT/$NAME-moe-gluon.log" | cut -c1-200
timeout "${PROFILE_S:-100}" python3 benchmarks/kernels/profile_prefill_ops.py "$OUT/$NAME-prefill-ops.txt" --layers 4 > "$OUT/$NAME-prefill-ops.log" 2>&1
echo "profile_prefill_ops rc=$?"; head -n 30 "$OUT/$NAME-prefill-ops.txt" 2>/dev/null | cut -c1-200; tail -n 5 "$OUT/$NAME-prefill-ops.log" | cut -c1-300
if [ -f "$OUT/$NAME-tuning.json" ] && ! python3 -c "import json,sys; sys.exit(json.load(open('$TUNED')) != json.load(open('$OUT/$NAME-tuning.json')))"; then
  cp "$OUT/$NAME-tuning.json" "$TUNED"; echo "tuning changed: short bench"
  timeout "${BENCH_S:-200}" python3 -m toolbox.cli engine bench --no-peer --output-tokens 64 --batch-sizes 1,32 --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
  echo "bench rc=$?"; [ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|gluon" "$OUT/$NAME.md" | cut -c1-200
else
  echo "tuning unchanged"
fi
