#!/usr/bin/env bash
# The sixth session's last GPU call: the chunked GDN prefill variants (`kernels/time_gdn_prefill.py`), then
# `gpu_bench.sh` (CUDA tests including the grouped MoE decode and the GDN prefill, the full bench with the peer)
# without the NVFP4 LM-head run. Run from the repository root on the GPU machine; writes under $OUT.
# Usage: NAME=run19 COMMIT=<sha> bash benchmarks/gpu_session6.sh
set -u
OUT="${OUT:-/tmp/session6-out}"; NAME="${NAME:-session6}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
timeout "${GDN_S:-60}" python3 benchmarks/kernels/time_gdn_prefill.py "$OUT/$NAME-gdn-prefill.json" > "$OUT/$NAME-gdn-prefill.log" 2>&1
echo "gdn prefill timing rc=$?"; grep -E "^T=|fla" "$OUT/$NAME-gdn-prefill.log" | tail -n 16
TESTS="tests/reference_engine/kernels/test_gdn_chunked_prefill.py tests/reference_engine/kernels/test_moe_grouped_decode.py tests/reference_engine/test_eager_prefill_ops.py tests/reference_engine/test_cuda_graphs.py tests/reference_engine/test_bench_pipeline.py" \
  OUT="$OUT" NAME="$NAME" LMHEAD=0 bash benchmarks/gpu_bench.sh
