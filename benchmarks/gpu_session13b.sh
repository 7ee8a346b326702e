#!/usr/bin/env bash
# Thirteenth session, second GPU call: CUDA tests of this session's prefill changes (GDN q/k/v read through strides,
# the shared expert added in the slot-sum launch, the causal conv's inputs-only branch) and of the prefill paths
# (graph vs eager, eager ops), `kernels/profile_prefill_ops.py` in eager and static (padded, graph-captured) modes
# with the graph replay timed, then a short bench without the peer.
# Usage: NAME=run52 COMMIT=<sha> bash benchmarks/gpu_session13b.sh      (writes under $OUT; BENCH=0: no bench)
set -u
OUT="${OUT:-/tmp/session13b-out}"; NAME="${NAME:-session13b}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
K=tests/reference_engine/kernels
timeout "${TEST_S:-240}" python3 -m pytest -m cuda -q -p no:cacheprovider $K/test_gdn_chunked_prefill.py $K/test_causal_conv1d.py $K/test_nvfp4_gemm.py \
  $K/test_moe_prefill_gluon.py tests/reference_engine/test_prefill_graphs.py tests/reference_engine/test_eager_prefill_ops.py > "$OUT/$NAME-pytest.log" 2>&1
TESTS_RC=$?; echo "pytest rc=$TESTS_RC (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
[ "$TESTS_RC" = 0 ] || { grep -E "^E |error" "$OUT/$NAME-pytest.log" | head -n 30 | cut -c1-300; exit 1; }
for mode in eager static; do
  timeout "${PROFILE_S:-100}" python3 benchmarks/kernels/profile_prefill_ops.py "$OUT/$NAME-prefill-$mode.txt" --layers 4 --mode $mode > /dev/null 2> "$OUT/$NAME-prefill-$mode.err"
  echo "profile_prefill_ops $mode rc=$?"; head -n 25 "$OUT/$NAME-prefill-$mode.txt" 2>/dev/null | cut -c1-160; grep -E "graph replay" "$OUT/$NAME-prefill-$mode.txt"; tail -n 3 "$OUT/$NAME-prefill-$mode.err" | cut -c1-300
done
[ "${BENCH:-1}" = 0 ] && exit 0
timeout "${BENCH_S:-200}" python3 -m toolbox.cli engine bench --no-peer --output-tokens 64 --batch-sizes 1,32 --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$?"; [ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over" "$OUT/$NAME.md" | cut -c1-200
[ -f "$OUT/$NAME.md" ] && sed -n '/One prefill/,$p' "$OUT/$NAME.md" | head -n 22 | cut -c1-170
