#!/usr/bin/env bash
# One GPU call for the kernels alone: CUDA tests of the NVFP4 GEMV, MoE decode and chunked GDN prefill kernels,
# then their timings (GDN prefill vs torch op and fla; MoE decode settings incl. word reads and the grouped
# tensor-core kernels; GEMV tile sweep incl. word reads and the GEMV/GEMM crossover) and the tuning file
# they imply. Run from the repository root on the GPU machine; everything lands under $OUT.
# Usage: bash benchmarks/gpu_kernels.sh
set -u
OUT="${OUT:-/tmp/kernels-out}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_gemv.py \
  tests/reference_engine/kernels/test_moe_block_decode.py tests/reference_engine/kernels/test_gdn_chunked_prefill.py \
  tests/reference_engine/kernels/test_moe_decode.py "tests/contracts/test_linear_attention_contracts.py" > "$OUT/pytest_kernels.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_kernels.log" | tail -n 15
timeout "${GDN_S:-70}" python3 benchmarks/kernels/time_gdn_prefill.py "$OUT/gdn_prefill_times.json" 2>&1 | tail -n 14
timeout "${MOE_S:-120}" python3 benchmarks/kernels/time_moe_decode.py "$OUT/moe_times.json" 2>&1 | tail -n 40
timeout "${SWEEP_S:-200}" python3 benchmarks/kernels/sweep_w4a16_gemv.py "$OUT/gemv_sweep.json" 2>&1 | grep -v "^$" | tail -n 20
python3 benchmarks/kernels/write_tuning.py "$OUT/gemv_sweep.json" "$OUT/moe_times.json" "$OUT/tuning.json"
