#!/usr/bin/env bash
# One GPU call for the packed-float16 batch-1 kernels (`kernels/nvfp4_half_dot.py`): their CUDA tests (and the
# conv / paged-prefill refactor's), the batch-1 GEMV sweep and the MoE decode settings with them, a tuning file
# merged over the committed one (`write_tuning.py --base`), then a short engine bench on that tuning.
# Run from the repository root on the GPU machine; everything lands under $OUT.
# Usage: NAME=run9 COMMIT=<sha> bash benchmarks/gpu_half.sh
set -u
OUT="${OUT:-/tmp/half-out}"; NAME="${NAME:-half}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-110}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_gemv.py \
  tests/reference_engine/kernels/test_moe_block_decode.py tests/reference_engine/kernels/test_causal_conv1d.py \
  tests/contracts/test_attention_contracts.py tests/reference_engine/test_eager_prefill_ops.py > "$OUT/pytest_$NAME.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_$NAME.log" | tail -n 15
timeout "${MOE_S:-110}" python3 benchmarks/kernels/time_moe_decode.py "$OUT/moe_times.json" 2>&1 | grep -E "T= 1|T=32|Error" | tail -n 30
timeout "${SWEEP_S:-130}" python3 benchmarks/kernels/sweep_w4a16_gemv.py "$OUT/gemv_sweep.json" --batch-one 2>&1 | grep -v "^$" | tail -n 8
python3 benchmarks/kernels/write_tuning.py "$OUT/gemv_sweep.json" "$OUT/moe_times.json" "$OUT/tuning.json" --base "$TUNED" && cp "$OUT/tuning.json" "$TUNED"
timeout "${BENCH_S:-170}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" --no-peer \
  --output-tokens 64 --batch-sizes 1,32 > "$OUT/bench_$NAME.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/bench_$NAME.log" | tail -n 6
[ -f "$OUT/$NAME.md" ] && sed -n 1,45p "$OUT/$NAME.md"
