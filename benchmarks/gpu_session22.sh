#!/usr/bin/env bash
# GPU calls of the twenty-second session. Usage: OUT=$OUT NAME=run67 COMMIT=<sha> PHASE=h200|loop|ncu bash benchmarks/gpu_session22.sh
# PHASE=h200 (about 400 s): the full bench with the peer on the committed tuning (the card; the last H200 bench
#   was run53/54), then with time left the NVFP4 LM head variant (no peer, 64 tokens, batches 1 and 32).
# PHASE=loop (about 300 s): the grouped-half CUDA test, then `time_moe_grouped_half.py` over GROUPED_PLANS at 16, 32, 64
#   tokens (run68, at fbebcae, timed the plan field `loop`'s forms; measured slower, that field was removed after it) (writes
#   $OUT/$NAME-grouped-tuning.json when a plan wins by 3%), then with time left short benches on that tuning and on the
#   committed one, in that order; then with time left the NVFP4 LM head at batch 1 (its TTFT after d754835).
# PHASE=ncu (about 200 s): Nsight Compute on the decode MoE kernels (`kernels/profile_ncu.py`: batch 1 per-pair kernels,
#   batch 32 grouped packed float16 ones), the batch-1 GEMVs, the router and the GDN step, raw metrics, summarised by
#   `kernels/ncu_stalls.py` (duration, DRAM %, occupancy, issue, the largest stall reasons).
set -u
OUT="${OUT:-/tmp/session22-out}"; NAME="${NAME:-session22}"; COMMIT="${COMMIT:-unknown}"; PHASE="${PHASE:-h200}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
if [ "$PHASE" = h200 ]; then
  timeout "${BENCH_S:-420}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
  echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -E "^\| (TTFT|TPOT|output)" "$OUT/$NAME.md" 2>/dev/null
  grep -E "^Batch-1 decode step|^Total over|^Peer" "$OUT/$NAME.md" 2>/dev/null | cut -c1-200
  if [ "$SECONDS" -lt "${HEAD_BEFORE_S:-400}" ]; then
    timeout "${HEAD_S:-170}" python3 -m toolbox.cli engine bench --lm-head nvfp4 --no-peer --output-tokens 64 --batch-sizes 1,32 \
        --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-lmhead-nvfp4" > "$OUT/$NAME-lmhead-nvfp4-bench.log" 2>&1
    echo "nvfp4 head bench rc=$?"; grep -E "^\| (TTFT|TPOT|output)" "$OUT/$NAME-lmhead-nvfp4.md" 2>/dev/null
    grep -E "^Batch-1 decode step|^Total over" "$OUT/$NAME-lmhead-nvfp4.md" 2>/dev/null | cut -c1-200
  else
    echo "nvfp4 head bench skipped: ${SECONDS} s used"
  fi
  exit 0
fi
short_bench() {  # $1: run name
  timeout "${SHORT_S:-150}" python3 -m toolbox.cli engine bench --no-peer --output-tokens 64 --batch-sizes 1,32 --out-dir "$OUT" --commit "$COMMIT" \
      --name "$1" > "$OUT/$1-bench.log" 2>&1
  echo "bench $1 rc=$?"; grep -E "^\| (TTFT|TPOT|output)" "$OUT/$1.md" 2>/dev/null
  grep -E "^Batch-1 decode step|^Total over" "$OUT/$1.md" 2>/dev/null | cut -c1-200
}
if [ "$PHASE" = loop ]; then
  TUNING="reference_engine/kernels/tuned/nvidia-h200.json"
  timeout "${TEST_S:-120}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_moe_grouped_half.py \
      tests/reference_engine/kernels/test_nvfp4_gemm.py -k "real_layer or eager_path" > "$OUT/$NAME-pytest.log" 2>&1
  echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/$NAME-pytest.log" | tail -n 4 | cut -c1-300
  if grep -q "FAILED" "$OUT/$NAME-pytest.log"; then grep -E "^E " "$OUT/$NAME-pytest.log" | head -n 10 | cut -c1-300; echo "timing skipped"; exit 0; fi
  timeout "${GROUPED_S:-240}" python3 benchmarks/kernels/time_moe_grouped_half.py "$OUT/$NAME-grouped-half.json" --tokens "${GROUPED_TOKENS:-16,32,64}" \
      --plans "${GROUPED_PLANS:-fp8_k_step_4_pairs,fp8_k_step_8_pairs,fp8_down_64_k_step_4_pairs}" \
      --tuning "$TUNING" "$OUT/$NAME-grouped-tuning.json" > "$OUT/$NAME-grouped-half.log" 2>&1
  echo "grouped half rc=$?"; grep -E "^T=|best plan|wrote|Error" "$OUT/$NAME-grouped-half.log" | cut -c1-160
  if [ -s "$OUT/$NAME-grouped-tuning.json" ] && [ "$SECONDS" -lt "${BENCH_BEFORE_S:-300}" ]; then
    cp "$TUNING" "$OUT/$NAME-committed-tuning.json"; cp "$OUT/$NAME-grouped-tuning.json" "$TUNING"
    short_bench "$NAME-loop"
    cp "$OUT/$NAME-committed-tuning.json" "$TUNING"
    if [ "$SECONDS" -lt "${BASE_BEFORE_S:-400}" ]; then short_bench "$NAME-base"; else echo "base bench skipped: ${SECONDS} s used"; fi
  fi
  if [ "$SECONDS" -lt "${HEAD_BEFORE_S:-470}" ]; then  # the NVFP4 LM head's TTFT with the prefill's head row on the Triton GEMV (d754835)
    timeout "${HEAD_S:-120}" python3 -m toolbox.cli engine bench --lm-head nvfp4 --no-peer --no-profile --output-tokens 32 --batch-sizes 1 \
        --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-lmhead-nvfp4" > "$OUT/$NAME-lmhead-nvfp4-bench.log" 2>&1
    echo "nvfp4 head bench rc=$?"; grep -E "^\| (TTFT|TPOT|output)" "$OUT/$NAME-lmhead-nvfp4.md" 2>/dev/null
  else
    echo "nvfp4 head bench skipped: ${SECONDS} s used"
  fi
  exit 0
fi
timeout "${NCU_S:-300}" ncu --clock-control none --profile-from-start off --page raw \
  --kernel-name "regex:_gate_up_kernel|_down_kernel|_w4a16_gemv_half_kernel|_router_gemv_topk_kernel|_recurrent_norm_kernel" \
  --launch-count "${NCU_LAUNCHES:-12}" --section SpeedOfLight --section Occupancy --section WarpStateStats ${NCU_EXTRA:---section LaunchStats --section SchedulerStats} \
  python3 benchmarks/kernels/profile_ncu.py > "$OUT/$NAME-ncu.txt" 2>&1
echo "ncu rc=$?"; python3 benchmarks/kernels/ncu_stalls.py "$OUT/$NAME-ncu.txt" | cut -c1-200 | head -n 60
