#!/usr/bin/env bash
# Tenth session, first GPU call: CUDA tests of the NVFP4 GEMMs (swap 0 and 1) and of both grouped MoE decode paths
# (the ninth session's review commit was not run on a GPU); `kernels/time_moe_prefill.py` (operand order, token block,
# gate/up rows of the routed experts' prefill at 1024 tokens; operand order of the linears at 8..128 tokens), whose
# choice goes into the tuning file; `kernels/time_gdn_prefill.py` (launch 2 pipelined, 16 value columns); then a short engine bench (no peer, 32 output tokens, batches 1 and 32).
# Usage: NAME=run34 COMMIT=<sha> bash benchmarks/gpu_session10.sh      (writes under $OUT; BENCH=0: no bench)
set -u
OUT="${OUT:-/tmp/s10-out}"; NAME="${NAME:-s10}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-170}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_gemm.py \
  tests/reference_engine/kernels/test_moe_grouped_half.py tests/reference_engine/kernels/test_moe_grouped_decode.py \
  tests/reference_engine/kernels/test_gdn_chunked_prefill.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
timeout "${TIME_S:-150}" python3 benchmarks/kernels/time_moe_prefill.py "$OUT/$NAME-moe-prefill.json" "$TUNED" "$OUT/$NAME-tuning.json" > "$OUT/$NAME-moe-prefill.log" 2>&1
echo "time_moe_prefill rc=$?"; grep -E "^moe|^linear|tuning|summed|failed" "$OUT/$NAME-moe-prefill.log" | cut -c1-200
[ -f "$OUT/$NAME-tuning.json" ] && cp "$OUT/$NAME-tuning.json" "$TUNED"
timeout "${GDN_S:-90}" python3 benchmarks/kernels/time_gdn_prefill.py "$OUT/$NAME-gdn-prefill.json" > "$OUT/$NAME-gdn-prefill.log" 2>&1
echo "time_gdn_prefill rc=$?"; grep -E "^T=|fla" "$OUT/$NAME-gdn-prefill.log" | cut -c1-160
[ "${BENCH:-1}" = 0 ] && exit 0
timeout "${BENCH_S:-200}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" --no-peer --output-tokens 32 \
  --batch-sizes 1,32 --gate-prompts 4 > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 4
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|ceilings|Total over|Batch-1" "$OUT/$NAME.md" | cut -c1-300
[ -f "$OUT/$NAME.md" ] && sed -n '/One prefill/,/Total over/p' "$OUT/$NAME.md" | head -n 12
[ -f "$OUT/$NAME.md" ] && sed -n '/batch 32/,/Total over/p' "$OUT/$NAME.md" | head -n 10
