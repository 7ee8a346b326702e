#!/usr/bin/env bash
# One GPU call: the tensor-core GEMMs' weight decodes (`time_gemm_tiles.DECODES`; run18 compared 1 with the scale-word
# decode 2, since reverted; committed decode-batch tiles),
# then the grouped MoE decode against the per-pair kernels (`kernels/time_moe_grouped.py`), each writing the
# tuning file the next step and the bench use; the CUDA tests of both; the quick bench (batches 1 and 32).
# Run from the repository root on the GPU machine; writes under $OUT.
# Usage: NAME=run18 COMMIT=<sha> bash benchmarks/gpu_grouped.sh
set -u
OUT="${OUT:-/tmp/grouped-out}"; NAME="${NAME:-grouped}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${GEMM_S:-120}" python3 benchmarks/kernels/time_gemm_tiles.py "$OUT/$NAME-gemm-decodes.json" "$OUT/$NAME-tuning-gemm.json" --decodes-only > "$OUT/$NAME-gemm-decodes.log" 2>&1
echo "gemm decodes rc=$?"; grep -E "^prefill|^moe|wrote|decode \(|auto decode" "$OUT/$NAME-gemm-decodes.log" | tail -n 40
[ -f "$OUT/$NAME-tuning-gemm.json" ] && cp "$OUT/$NAME-tuning-gemm.json" "$TUNED"
timeout "${MOE_S:-150}" python3 benchmarks/kernels/time_moe_grouped.py "$OUT/$NAME-moe-grouped.json" "$OUT/$NAME-tuning-moe.json" > "$OUT/$NAME-moe-grouped.log" 2>&1
echo "moe grouped rc=$?"; tail -n 60 "$OUT/$NAME-moe-grouped.log"
[ -f "$OUT/$NAME-tuning-moe.json" ] && cp "$OUT/$NAME-tuning-moe.json" "$TUNED"
cp "$TUNED" "$OUT/$NAME-tuning-used.json"
timeout "${TEST_S:-120}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_moe_grouped_decode.py tests/reference_engine/kernels/test_nvfp4_gemm.py \
  tests/reference_engine/kernels/test_moe_block_decode.py tests/reference_engine/test_cuda_graphs.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 15
timeout "${BENCH_S:-170}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" --no-peer \
  --output-tokens 64 --batch-sizes 1,8,32 > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 3
[ -f "$OUT/$NAME.md" ] && sed -n 5,50p "$OUT/$NAME.md"
