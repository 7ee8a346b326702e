#!/usr/bin/env bash
# Twelfth session, last GPU call: the Gluon experts' CUDA tests (register cap included), `kernels/time_moe_prefill.py
# --gluon` with the register-capped variants (three 4-warp gate/up programs per SM under 170 registers), and a short
# bench without the peer only when the tuning file changed.
# Usage: NAME=run50 COMMIT=<sha> bash benchmarks/gpu_session12b.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/session12b-out}"; NAME="${NAME:-session12b}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_moe_prefill_gluon.py > "$OUT/$NAME-pytest.log" 2>&1
TESTS=$?; echo "pytest rc=$TESTS (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
[ "$TESTS" = 0 ] || { grep -E "^E |error" "$OUT/$NAME-pytest.log" | head -n 30 | cut -c1-300; exit 1; }
timeout "${TIME_S:-120}" python3 benchmarks/kernels/time_moe_prefill.py "$OUT/$NAME-moe-gluon.json" "$TUNED" "$OUT/$NAME-tuning.json" --gluon > "$OUT/$NAME-moe-gluon.log" 2>&1
echo "time_moe_prefill --gluon rc=$?"; grep -E "^moe|tuning|failed|rejected" "$OUT/$NAME-moe-gluon.log" | cut -c1-200
if [ -f "$OUT/$NAME-tuning.json" ] && ! python3 -c "import json,sys; sys.exit(json.load(open('$TUNED')) != json.load(open('$OUT/$NAME-tuning.json')))"; then
  cp "$OUT/$NAME-tuning.json" "$TUNED"; echo "tuning changed: short bench"
  timeout "${BENCH_S:-200}" python3 -m toolbox.cli engine bench --no-peer --output-tokens 64 --batch-sizes 1,32 --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
  echo "bench rc=$?"; [ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|gluon" "$OUT/$NAME.md" | cut -c1-200
else
  echo "tuning unchanged"
fi
