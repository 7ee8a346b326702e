#!/usr/bin/env bash
# One GPU call: CUDA tests of the tensor-core NVFP4 GEMMs (byte and word reads), their timing (which sets
# `gemm_words` in the card's tuning file), then the full `toolbox engine bench` with that tuning.
# Usage: NAME=run6 COMMIT=<sha> bash benchmarks/gpu_gemm_words.sh
set -u
OUT="${OUT:-/tmp/bench-out}"; NAME="${NAME:-bench}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_gemm.py > "$OUT/pytest_$NAME.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_$NAME.log" | tail -n 12
timeout "${TIME_S:-150}" python3 benchmarks/kernels/time_gemm_words.py "$OUT/gemm_words_times.json" "$TUNED" 2>&1 | tail -n 14
cp "$TUNED" "$OUT/tuning.json"
timeout "${BENCH_S:-330}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/bench_$NAME.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/bench_$NAME.log" | tail -n 4
[ -f "$OUT/$NAME.md" ] && cat "$OUT/$NAME.md"
