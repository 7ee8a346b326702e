#!/usr/bin/env bash
# Prepared in the twenty-fifth session for the next one's first call (about 520 s with the peer). Usage:
#   OUT=$OUT NAME=runNN COMMIT=<sha> bash benchmarks/gpu_session26.sh
# 1. `kernels/time_weight_layout.py --shapes gemv_...`: do the batch-1 GEMVs' committed tiles (256 or 64 rows by
#    64 bytes a step, split-K) lose bandwidth to their row-major access pattern as the grouped MoE tiles did (run74)?
#    About 30 s. Also the per-pair MoE tiles of batch 8 (32 rows by 64 bytes a step), the next candidate for copies.
# 1b. `kernels/time_gemv_tiled.py --sweep`: the real packed-float16 GEMV reading tile-major copies (bit-equal first), and
#    tile-major copies for neighbouring tiles (about 120 s).
# 2. `kernels/time_moe_tiled.py --sweep`: the tile-major expert copies on this card (run74 measured them on an H100 only),
#    and copies for wider K steps, 64 gate rows or 8 warps (`VARIANTS`); adopted when 3% faster at every batch.
# 3. `kernels/adopt_measured.py` turns on the GEMV copies (`gemv_tiled`) if 1b showed them faster; then the full bench
#    with the peer on that file (expert copies and the fused sampler on): the first end-to-end figures on this card.
# Results: $NAME.json / .md, $NAME-bench.log, $NAME-aux.tgz (the other logs and JSON).
set -u
OUT="${OUT:-/tmp/session26-out}"; NAME="${NAME:-session26}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
AUX="$OUT/aux"; mkdir -p "$AUX"
timeout 90 python3 benchmarks/kernels/time_weight_layout.py "$AUX/$NAME-layout.json" --shapes gemv_12288x2048,gemv_9216x2048,gemv_2048x4096,pair_gate_up_b8 \
  > "$AUX/$NAME-layout.log" 2>&1; echo "layout rc=$?"; cut -c1-160 "$AUX/$NAME-layout.log"
timeout 170 python3 benchmarks/kernels/time_gemv_tiled.py "$AUX/$NAME-gemv-tiled.json" --sweep > "$AUX/$NAME-gemv-tiled.log" 2>&1; echo "gemv tiled rc=$?"; tail -n 30 "$AUX/$NAME-gemv-tiled.log" | cut -c1-300
timeout 200 python3 benchmarks/kernels/time_moe_tiled.py "$AUX/$NAME-tiled.json" --sweep > "$AUX/$NAME-tiled.log" 2>&1; echo "tiled rc=$?"; tail -n 24 "$AUX/$NAME-tiled.log" | cut -c1-300
TUNING=reference_engine/kernels/tuned/nvidia-h200.json  # the H100 takes the H200's file (same architecture)
python3 benchmarks/kernels/adopt_measured.py "$TUNING" --gemv-tiled "$AUX/$NAME-gemv-tiled.json" --tiled "$AUX/$NAME-tiled.json"
cp "$TUNING" "$AUX/$NAME-tuning.json"
. benchmarks/gpu_bench_tail.sh  # archive, then the bench in the time left
