#!/usr/bin/env bash
# Prepared in the twenty-fourth session for the next one's first call. Usage: OUT=$OUT NAME=runNN COMMIT=<sha> bash benchmarks/gpu_session25.sh
# 0. `kernels/time_weight_layout.py`: the grouped MoE's access pattern, row-major against tile-major (about 40 s).
# 0b. `kernels/time_moe_tiled.py`: the grouped experts reading tile-major copies, bit-equality then time (about 60 s).
# 1. CUDA tests not yet run on a GPU (about 150 s): the async test's new criteria (torch ops: async equals async drained;
#    Triton: async equals sync), the fused selection sampler (`kernels/sampling_select.py`), sampler graphs, LLM on CUDA.
# 2. `time_sampling.py` (sort / torch selection / fused selection, device time in graphs) and `time_topk.py` (about 40 s).
# 3. The full bench, with the peer unless BENCH_ARGS says otherwise (about 330 s).
# If the fused selection draws the same tokens and is faster in graphs at every batch, set `sampling_fused_select: 1`
# in the card's tuning file and rerun the bench's sampled rows.
set -u
OUT="${OUT:-/tmp/session25-out}"; NAME="${NAME:-session25}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
timeout 90 python3 benchmarks/kernels/time_weight_layout.py "$OUT/$NAME-layout.json" > "$OUT/$NAME-layout.log" 2>&1; echo "layout rc=$?"; cat "$OUT/$NAME-layout.log" | cut -c1-200
timeout 120 python3 benchmarks/kernels/time_moe_tiled.py "$OUT/$NAME-tiled.json" > "$OUT/$NAME-tiled.log" 2>&1; echo "tiled rc=$?"; tail -n 4 "$OUT/$NAME-tiled.log" | cut -c1-300
timeout "${TEST_S:-200}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/test_async_decode.py \
  tests/reference_engine/kernels/test_sampling_select.py tests/reference_engine/test_sampler_graphs.py tests/reference_engine/test_llm_cuda.py tests/reference_engine/kernels/test_moe_grouped_half.py \
  > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/$NAME-pytest.log" | tail -n 5 | cut -c1-300
grep -E "^E " "$OUT/$NAME-pytest.log" | head -n 8 | cut -c1-300
timeout 90 python3 benchmarks/time_sampling.py "$OUT/$NAME-sampling.json" > "$OUT/$NAME-sampling.log" 2>&1; echo "sampling rc=$?"; tail -n 3 "$OUT/$NAME-sampling.log"
timeout 40 python3 benchmarks/time_topk.py "$OUT/$NAME-topk.json" > "$OUT/$NAME-topk.log" 2>&1; echo "topk rc=$?"; tail -n 2 "$OUT/$NAME-topk.log"
timeout "${BENCH_S:-420}" python3 -m toolbox.cli engine bench ${BENCH_ARGS:-} --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -E "^\| (TTFT|TPOT|output)|^WARNING" "$OUT/$NAME.md" 2>/dev/null
grep -E "^Batch-1 decode step" "$OUT/$NAME.md" 2>/dev/null | cut -c1-200
