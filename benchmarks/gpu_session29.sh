#!/usr/bin/env bash
# Twenty-ninth session, first call (about 420 s). Usage:
#   OUT=$OUT NAME=runNN COMMIT=<sha> bash benchmarks/gpu_session29.sh
# 1. `kernels/time_stream_shapes.py`: the fastest pure read of each batch-1 kernel's bytes over grid shapes, with the
#    real batch-1 GEMVs timed in the same run (best read / GEMV).
# 2. `kernels/time_moe_pairs_fused.py --tokens 1,2`: the one-launch experts with the waiting programs sleeping between
#    counter reads (run79: spinning, 1.65x the two launches at one token); writes the tuning keys into a copy.
# 3. `kernels/time_moe_decode.py --small-batches`: the per-pair MoE block at 2, 4, 8 and 12 tokens over tile settings
#    (run79: two launches took 50 us at 2 tokens against 17.6 at one; batches 2 to 15 run run9's larger-batch setting).
set -u
OUT="${OUT:-/tmp/session29-out}"; NAME="${NAME:-session29}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
echo "commit $COMMIT"; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout 330 python3 benchmarks/kernels/time_stream_shapes.py "$OUT/$NAME-stream-shapes.json" ${STREAM_ARGS:-} > "$OUT/$NAME-stream-shapes.log" 2>&1
echo "stream shapes rc=$?"; grep -v "^ " "$OUT/$NAME-stream-shapes.log" | tail -n 12 | cut -c1-300
TUNING="$OUT/$NAME-tuning.json"; cp reference_engine/kernels/tuned/nvidia-h200.json "$TUNING"
timeout 200 python3 benchmarks/kernels/time_moe_pairs_fused.py "$OUT/$NAME-pairs-fused.json" --tokens "${TOKENS:-1,2}" --tuning "$TUNING" > "$OUT/$NAME-pairs-fused.log" 2>&1
echo "pairs fused rc=$?"; grep -v "^$" "$OUT/$NAME-pairs-fused.log" | tail -n 6 | cut -c1-600
timeout 150 python3 benchmarks/kernels/time_moe_decode.py "$OUT/$NAME-moe-small.json" --small-batches > "$OUT/$NAME-moe-small.log" 2>&1
echo "moe small batches rc=$?"; grep "^T=" "$OUT/$NAME-moe-small.log" | cut -c1-200
echo "elapsed ${SECONDS} s"
