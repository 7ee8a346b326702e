#!/usr/bin/env bash
# One GPU call for the engine: CUDA tests of the eager prefill selection, graph replay and the engine, then the full
# `toolbox engine bench` (gate, TTFT, TPOT, tokens/s at 1/8/32/64, peer, per-kernel profiles), then a shorter
# run with the NVFP4 LM head (no peer). Run from the repository root on the GPU machine; writes under $OUT.
# Usage: NAME=run5 COMMIT=<sha> [TESTS='tests/...' LMHEAD=0] bash benchmarks/gpu_bench.sh
set -u
OUT="${OUT:-/tmp/bench-out}"; NAME="${NAME:-bench}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
TESTS="${TESTS:-tests/reference_engine/test_eager_prefill_ops.py tests/reference_engine/test_cuda_graphs.py tests/reference_engine/test_bench_pipeline.py}"
timeout "${TEST_S:-120}" python3 -m pytest -m cuda -q -p no:cacheprovider $TESTS > "$OUT/pytest_$NAME.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_$NAME.log" | tail -n 12
timeout "${BENCH_S:-330}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/bench_$NAME.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/bench_$NAME.log" | tail -n 8
[ -f "$OUT/$NAME.md" ] && cat "$OUT/$NAME.md"
[ "${LMHEAD:-1}" = 1 ] || exit 0
timeout "${LMHEAD_S:-100}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-lmhead-nvfp4" --lm-head nvfp4 \
  --no-peer --no-profile --output-tokens 64 --batch-sizes 1,32 --gate-prompts 16 > "$OUT/bench_$NAME-lmhead.log" 2>&1
echo "lm-head nvfp4 bench rc=$?"; grep -v "^\s*$" "$OUT/bench_$NAME-lmhead.log" | tail -n 4
[ -f "$OUT/$NAME-lmhead-nvfp4.md" ] && sed -n 1,20p "$OUT/$NAME-lmhead-nvfp4.md"
