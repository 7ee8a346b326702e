#!/usr/bin/env bash
# The Gluon experts' launches (`reference_engine/kernels/moe_prefill_gluon.py`, gate/up and down, the decoded weights as
# wgmma's register operand; twelfth session): their CUDA tests against the Triton launches, then
# `kernels/time_moe_prefill.py --gluon` (the experts at 1024 tokens, committed against Gluon gate/up at four tiles and
# both launches at two; the tuning file gets `moe_prefill_gluon` (and `moe_prefill_gluon_down`) only for a 2% gain and
# only if the tests passed), then the full bench when it was taken.
# Usage: NAME=run46 COMMIT=<sha> bash benchmarks/gpu_gluon.sh      (writes under $OUT; BENCH=0: no bench)
set -u
OUT="${OUT:-/tmp/gluon-out}"; NAME="${NAME:-gluon}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-200}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_moe_prefill_gluon.py > "$OUT/$NAME-pytest.log" 2>&1
TESTS=$?; echo "pytest rc=$TESTS (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
timeout "${TIME_S:-150}" python3 benchmarks/kernels/time_moe_prefill.py "$OUT/$NAME-moe-gluon.json" "$TUNED" "$OUT/$NAME-tuning.json" --gluon > "$OUT/$NAME-moe-gluon.log" 2>&1
echo "time_moe_prefill --gluon rc=$?"; grep -E "^moe|tuning|failed|rejected" "$OUT/$NAME-moe-gluon.log" | cut -c1-200
if [ "$TESTS" = 0 ] && [ -f "$OUT/$NAME-tuning.json" ] && grep -q '"moe_prefill_gluon": 1' "$OUT/$NAME-tuning.json"; then
  cp "$OUT/$NAME-tuning.json" "$TUNED"; echo "Gluon gate/up taken into the tuning file"
else
  echo "tuning unchanged"; [ "${BENCH:-1}" = 1 ] && BENCH=0
fi
[ "${BENCH:-1}" = 0 ] && exit 0
timeout "${BENCH_S:-330}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 4
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over" "$OUT/$NAME.md" | cut -c1-300
