#!/usr/bin/env bash
# One short GPU call: the CUDA tests named in TESTS, then the quick engine bench (64 output tokens, batches 1 and 32,
# no peer, with the per-kernel profiles). Run from the repository root on the GPU machine; writes under $OUT.
# Usage: NAME=run11 COMMIT=<sha> TESTS='tests/...' bash benchmarks/gpu_quick.sh
set -u
OUT="${OUT:-/tmp/quick-out}"; NAME="${NAME:-quick}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider ${TESTS:-tests/reference_engine/kernels} > "$OUT/pytest_$NAME.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_$NAME.log" | tail -n 15
timeout "${BENCH_S:-170}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" --no-peer \
  --output-tokens 64 --batch-sizes 1,32 > "$OUT/bench_$NAME.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/bench_$NAME.log" | tail -n 3
[ -f "$OUT/$NAME.md" ] && sed -n 5,42p "$OUT/$NAME.md"
