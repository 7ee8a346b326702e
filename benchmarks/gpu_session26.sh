#!/usr/bin/env bash
# Prepared in the twenty-fifth and twenty-sixth sessions. Usage (CALL_S=0: the timings only, about 450 s; the bench
# then in a second call on the warm machine: `. benchmarks/gpu_bench_tail.sh` with OUT, NAME, COMMIT and AUX set):
#   OUT=$OUT NAME=runNN COMMIT=<sha> [CALL_S=0] bash benchmarks/gpu_session26.sh
# 1. `kernels/time_weight_layout.py --shapes gemv_...`: do the batch-1 GEMVs' committed tiles (256 or 64 rows by
#    64 bytes a step, split-K) lose bandwidth to their row-major access pattern as the grouped MoE tiles did (run74)?
#    About 30 s. Also the per-pair MoE tiles of batch 8 (32 rows by 64 bytes a step), the next candidate for copies.
# 1b. `kernels/time_gemv_tiled.py --sweep`: the real packed-float16 GEMV reading tile-major copies (bit-equal first), and
#    tile-major copies for neighbouring tiles (about 120 s).
# 2. `kernels/time_moe_tiled.py --sweep`: the tile-major expert copies on this card (run74 measured them on an H100 only),
#    and copies for wider K steps, 64 gate rows or 8 warps (`VARIANTS`); adopted when 3% faster at every batch.
# 2b. `test_gemm_tiled.py` on CUDA, then `kernels/time_gemm_tiled.py`: the decode-batch GEMM (batches 8 to 64) on
#    tile-major copies of the linears (its tiles read 32 bytes from each of 64 rows a step), bit-equal first.
# 3. `kernels/adopt_measured.py` turns on whichever copies were shown faster; then (with CALL_S left) the full bench
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
timeout 100 python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_gemm_tiled.py > "$AUX/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$AUX/$NAME-pytest.log" | tail -n 3 | cut -c1-300; grep -E "^E " "$AUX/$NAME-pytest.log" | head -n 6 | cut -c1-300
timeout 120 python3 benchmarks/kernels/time_gemm_tiled.py "$AUX/$NAME-gemm-tiled.json" > "$AUX/$NAME-gemm-tiled.log" 2>&1; echo "gemm tiled rc=$?"; tail -n 9 "$AUX/$NAME-gemm-tiled.log" | cut -c1-300
TUNING=reference_engine/kernels/tuned/nvidia-h200.json  # the H100 takes the H200's file (same architecture)
python3 benchmarks/kernels/adopt_measured.py "$TUNING" --gemv-tiled "$AUX/$NAME-gemv-tiled.json" --tiled "$AUX/$NAME-tiled.json" --gemm-tiled "$AUX/$NAME-gemm-tiled.json"
cp "$TUNING" "$AUX/$NAME-tuning.json"
. benchmarks/gpu_bench_tail.sh  # archive, then the bench in the time left
