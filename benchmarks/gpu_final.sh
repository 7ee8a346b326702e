#!/usr/bin/env bash
# The session's last GPU call: time the batch-1 launch savings against the paths they replace and write the
# faster choice of each into the committed tuning file (`kernels/time_decode_pieces.py`), then the full
# `benchmarks/gpu_bench.sh` (CUDA tests, full bench with peer, NVFP4 LM-head variant) on that tuning.
# Usage: NAME=run12 COMMIT=<sha> [TESTS=...] bash benchmarks/gpu_final.sh
set -u
OUT="${OUT:-/tmp/final-out}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
timeout "${PIECES_S:-50}" python3 benchmarks/kernels/time_decode_pieces.py "$OUT/decode_pieces.json" "$TUNED" 2>&1 | tail -n 30
cp "$TUNED" "$OUT/tuning-used.json"
OUT="$OUT" bash benchmarks/gpu_bench.sh
