#!/usr/bin/env bash
# Thirty-second session, the second call (about 590 s): the bench alone, on the tuning file the first call
# (gpu_session32.sh) chose, once its keys are copied into reference_engine/kernels/tuned/nvidia-h200.json and committed.
#   OUT=$OUT NAME=runNN COMMIT=<sha> bash benchmarks/gpu_session32b.sh
# BENCH_ARGS default "--output-tokens 64 --no-peer" (every batch size); on an H200 with its memory to spare, the full
# bench with the peer is BENCH_ARGS="" (256 output tokens; about 10 minutes, so it may need a call of its own).
set -u
OUT="${OUT:-/tmp/session32b-out}"; NAME="${NAME:-session32b}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
echo "commit $COMMIT"; nvidia-smi --query-gpu=name --format=csv,noheader
AUX="$OUT/aux"; mkdir -p "$AUX"
cp reference_engine/kernels/tuned/nvidia-h200.json "$AUX/$NAME-tuning.json"
CALL_S="${CALL_S:-585}"; BENCH_S="${BENCH_S:-570}"; BENCH_ARGS="${BENCH_ARGS---output-tokens 64 --no-peer}"
. benchmarks/gpu_bench_tail.sh
