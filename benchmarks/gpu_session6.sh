#!/usr/bin/env bash
# The sixth session's last GPU call: the decode launch savings at batches 1 to 64 (`kernels/time_decode_pieces.py`,
# writing the GDN-step split and fused-router limits into the tuning file), then `gpu_bench.sh` (CUDA tests of this
# session's kernels, the full bench with the peer) without the NVFP4 LM-head run. Run from the repository root on
# the GPU machine; writes under $OUT.
# Usage: NAME=run20 COMMIT=<sha> bash benchmarks/gpu_session6.sh
set -u
OUT="${OUT:-/tmp/session6-out}"; NAME="${NAME:-session6}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
timeout "${PIECES_S:-60}" python3 benchmarks/kernels/time_decode_pieces.py "$OUT/$NAME-decode-pieces.json" "$TUNED" > "$OUT/$NAME-decode-pieces.log" 2>&1
echo "decode pieces rc=$?"; grep "^tuning" "$OUT/$NAME-decode-pieces.log"
cp "$TUNED" "$OUT/$NAME-tuning-used.json"
TESTS="tests/reference_engine/kernels/test_gdn_chunked_prefill.py tests/reference_engine/kernels/test_nvfp4_gemm.py tests/reference_engine/kernels/test_moe_grouped_decode.py tests/reference_engine/test_eager_prefill_ops.py tests/reference_engine/test_cuda_graphs.py tests/reference_engine/test_bench_pipeline.py" \
  OUT="$OUT" NAME="$NAME" LMHEAD=0 bash benchmarks/gpu_bench.sh
