#!/usr/bin/env bash
# Thirteenth session, third GPU call: CUDA tests of the prefill launch cuts (GDN gates kernel, states in the pools,
# the attention prep kernel in the eager prefill, plus the earlier strided q/k/v, shared-expert slot sum and conv
# branch) and of the model paths (graph vs eager prefill, the tiny model on CUDA against the CPU), the static-mode
# op profile with the graph replay timed, then the full bench with the peer.
# Usage: NAME=run53 COMMIT=<sha> bash benchmarks/gpu_session13c.sh      (writes under $OUT; BENCH=0: no bench)
set -u
OUT="${OUT:-/tmp/session13c-out}"; NAME="${NAME:-session13c}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
K=tests/reference_engine/kernels; R=tests/reference_engine
timeout "${TEST_S:-240}" python3 -m pytest -m cuda -q -p no:cacheprovider $K/test_gdn_chunked_prefill.py $K/test_causal_conv1d.py $K/test_gdn_gates.py \
  $K/test_nvfp4_gemm.py -k "moe or wiring or gdn or conv or gates or prefill or graph or llm or tiny" $R/test_prefill_graphs.py $R/test_eager_prefill_ops.py \
  $R/test_llm_cuda.py $R/test_cuda_graphs.py > "$OUT/$NAME-pytest.log" 2>&1
TESTS_RC=$?; echo "pytest rc=$TESTS_RC (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
[ "$TESTS_RC" = 0 ] || { grep -E "^E |error" "$OUT/$NAME-pytest.log" | head -n 30 | cut -c1-300; exit 1; }
timeout "${PROFILE_S:-100}" python3 benchmarks/kernels/profile_prefill_ops.py "$OUT/$NAME-prefill-static.txt" --layers 4 --mode static > /dev/null 2>&1
echo "profile_prefill_ops static rc=$?"; sed -n '/kernels:/,$p' "$OUT/$NAME-prefill-static.txt" | head -n 24 | cut -c1-150; grep -E "graph replay" "$OUT/$NAME-prefill-static.txt"
[ "${BENCH:-1}" = 0 ] && exit 0
timeout "${BENCH_S:-330}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 3 | cut -c1-300
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|Total over" "$OUT/$NAME.md" | cut -c1-250
[ -f "$OUT/$NAME.md" ] && sed -n '/One prefill/,$p' "$OUT/$NAME.md" | head -n 22 | cut -c1-170
