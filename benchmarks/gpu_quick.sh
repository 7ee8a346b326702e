#!/usr/bin/env bash
# One quick GPU call: CUDA tests of the kernels and of graph replay, then a short `toolbox engine bench`
# (no peer) with the per-kernel profile. Run from the repository root on the GPU machine; writes under $OUT.
# Usage: NAME=run2 COMMIT=<sha> [TOKENS=256 BATCHES=1,8,32,64 PEER=--peer] bash benchmarks/gpu_quick.sh [extra bench args]
set -u
OUT="${OUT:-/tmp/bench-out}"; NAME="${NAME:-quick}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider --timeout 120 tests/reference_engine/kernels \
  tests/reference_engine/test_cuda_graphs.py > "$OUT/pytest_$NAME.log" 2>&1
echo "pytest rc=$? (124: out of time)"; tail -n 20 "$OUT/pytest_$NAME.log"
timeout "${BENCH_S:-300}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" \
  --output-tokens "${TOKENS:-64}" --batch-sizes "${BATCHES:-1,8,32}" ${PEER:---no-peer} "$@" > "$OUT/bench_$NAME.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; tail -n 80 "$OUT/bench_$NAME.log"
for f in "$OUT"/*.md; do [ -f "$f" ] && cat "$f"; done
if [ -n "${FP32_GATE:-}" ]; then
  timeout "${FP32_GATE_S:-150}" python3 benchmarks/gate_float32.py > "$OUT/gate_float32_$NAME.log" 2>&1
  echo "float32 gate rc=$?"; tail -n 5 "$OUT/gate_float32_$NAME.log"
fi
