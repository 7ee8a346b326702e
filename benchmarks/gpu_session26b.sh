#!/usr/bin/env bash
# Twenty-sixth session, second call (about 350 s). Usage:
#   OUT=$OUT NAME=runNN COMMIT=<sha> bash benchmarks/gpu_session26b.sh
# 1. `kernels/time_moe_tiled.py --per-pair --tokens 2,4,8,12,16`: below 16 tokens the MoE block runs the per-pair kernels
#    (row-major weights, each expert decoded once per (token, slot) pair). Do the grouped kernels on the tile-major copies
#    (each expert decoded once per chunk of 4 of its tokens, the shared expert too) beat them now?
# 2. `adopt_measured.py --tiled` lowers `moe_grouped_half.min_tokens` where they do (3% or more at every batch below).
# 3. `time_gemv_tiled.py --lm-head`: the NVFP4 LM head's GEMV on its tile-major copy (the engine makes one when
#    `gemv_tiled` is on and the head is NVFP4), information only.
# 4. CUDA tests of the grouped kernels, then the bench (peer, 64 output tokens) on that file.
set -u
OUT="${OUT:-/tmp/session26b-out}"; NAME="${NAME:-session26b}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
AUX="$OUT/aux"; mkdir -p "$AUX"
TUNING=reference_engine/kernels/tuned/nvidia-h200.json  # the H100 takes the H200's file (same architecture)
cp "$TUNING" "$AUX/$NAME-tuning-before.json"
timeout 150 python3 benchmarks/kernels/time_moe_tiled.py "$AUX/$NAME-tiled.json" --per-pair --tokens 2,4,8,12,16 > "$AUX/$NAME-tiled.log" 2>&1
echo "tiled rc=$?"; tail -n 12 "$AUX/$NAME-tiled.log" | cut -c1-300
python3 benchmarks/kernels/adopt_measured.py "$TUNING" --tiled "$AUX/$NAME-tiled.json"
cp "$TUNING" "$AUX/$NAME-tuning.json"
timeout 120 python3 benchmarks/kernels/time_gemv_tiled.py "$AUX/$NAME-gemv-lmhead.json" --lm-head > "$AUX/$NAME-gemv-lmhead.log" 2>&1
echo "gemv lm head rc=$?"; tail -n 4 "$AUX/$NAME-gemv-lmhead.log" | cut -c1-300
timeout 120 python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_moe_grouped_half.py > "$AUX/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$AUX/$NAME-pytest.log" | tail -n 3 | cut -c1-300; grep -E "^E " "$AUX/$NAME-pytest.log" | head -n 6 | cut -c1-300
BENCH_ARGS="${BENCH_ARGS:---output-tokens 64}"
. benchmarks/gpu_bench_tail.sh  # archive, then the bench in the time left
