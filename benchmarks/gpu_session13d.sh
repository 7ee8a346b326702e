#!/usr/bin/env bash
# Thirteenth session, last GPU call: the Gluon experts' CUDA tests with the committed tuning (the 32-token class on),
# then the full bench with the peer.
# Usage: NAME=run54 COMMIT=<sha> bash benchmarks/gpu_session13d.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/session13d-out}"; NAME="${NAME:-session13d}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
timeout "${TEST_S:-120}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_moe_prefill_gluon.py > "$OUT/$NAME-pytest.log" 2>&1
TESTS_RC=$?; echo "pytest rc=$TESTS_RC (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
[ "$TESTS_RC" = 0 ] || { grep -E "^E |error" "$OUT/$NAME-pytest.log" | head -n 30 | cut -c1-300; exit 1; }
timeout "${BENCH_S:-330}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 3 | cut -c1-300
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over|Peer vs" "$OUT/$NAME.md" | cut -c1-250
[ -f "$OUT/$NAME.md" ] && sed -n '/One prefill/,$p' "$OUT/$NAME.md" | head -n 22 | cut -c1-170
