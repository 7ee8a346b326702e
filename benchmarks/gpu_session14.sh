#!/usr/bin/env bash
# Fourteenth session's change, for the next GPU call: the norm before the MoE block writes the Gluon experts' operand
# copy (no permute_steps copy launch in the prefill). CUDA tests of the pieces it touches, then the full bench with
# the peer (the prefill table should show the 40 direct_copy launches gone).
# Usage: NAME=run55 COMMIT=<sha> bash benchmarks/gpu_session14.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/session14-out}"; NAME="${NAME:-session14}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
timeout "${TEST_S:-200}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_norms.py \
    tests/reference_engine/kernels/test_moe_prefill_gluon.py tests/reference_engine/test_eager_prefill_ops.py \
    tests/reference_engine/test_prefill_graphs.py tests/reference_engine/test_llm_cuda.py > "$OUT/$NAME-pytest.log" 2>&1
TESTS_RC=$?; echo "pytest rc=$TESTS_RC (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
[ "$TESTS_RC" = 0 ] || { grep -E "^E |error" "$OUT/$NAME-pytest.log" | head -n 30 | cut -c1-300; exit 1; }
timeout "${BENCH_S:-400}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 3 | cut -c1-300
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over|Peer vs" "$OUT/$NAME.md" | cut -c1-250
[ -f "$OUT/$NAME.md" ] && sed -n '/One prefill/,$p' "$OUT/$NAME.md" | head -n 22 | cut -c1-170
