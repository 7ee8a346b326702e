#!/usr/bin/env bash
# The twenty-fifth session's GPU call (about 560 s with BENCH_ARGS=--no-peer). Usage: OUT=$OUT NAME=runNN COMMIT=<sha> bash benchmarks/gpu_session25.sh
# 0. `kernels/time_weight_layout.py`: the grouped MoE's access pattern, row-major against tile-major (about 40 s).
# 1. `kernels/time_moe_tiled.py`: the grouped experts reading tile-major copies, bit-equality then time (about 60 s).
# 2. CUDA tests not yet run on a GPU (about 150 s): the async test's criteria (torch ops: async equals async drained;
#    Triton: async equals sync), the fused selection sampler, sampler graphs, LLM on CUDA, the grouped experts.
# 3. `time_sampling.py` (sort / torch selection / fused selection in graphs) and `time_topk.py` (about 60 s).
# 4. `kernels/adopt_measured.py` turns on, in this copy's tuning file, what 1 and 3 showed faster (tile-major copies;
#    the fused selection), and the full bench runs on that file (copied into the results archive).
# Results: $NAME.json / .md, $NAME-bench.log, and $NAME-aux.tgz with every other log and JSON (the device returns few files).
set -u
OUT="${OUT:-/tmp/session25-out}"; NAME="${NAME:-session25}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
AUX="$OUT/aux"; mkdir -p "$AUX"
TUNING=reference_engine/kernels/tuned/nvidia-h200.json  # the H100 takes the H200's file (same architecture)
timeout 90 python3 benchmarks/kernels/time_weight_layout.py "$AUX/$NAME-layout.json" > "$AUX/$NAME-layout.log" 2>&1; echo "layout rc=$?"; cut -c1-160 "$AUX/$NAME-layout.log"
timeout 150 python3 benchmarks/kernels/time_moe_tiled.py "$AUX/$NAME-tiled.json" > "$AUX/$NAME-tiled.log" 2>&1; echo "tiled rc=$?"; tail -n 4 "$AUX/$NAME-tiled.log" | cut -c1-300
timeout "${TEST_S:-200}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/test_async_decode.py \
  tests/reference_engine/kernels/test_sampling_select.py tests/reference_engine/test_sampler_graphs.py tests/reference_engine/test_llm_cuda.py \
  tests/reference_engine/kernels/test_moe_grouped_half.py > "$AUX/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$AUX/$NAME-pytest.log" | tail -n 5 | cut -c1-300
grep -E "^E " "$AUX/$NAME-pytest.log" | head -n 8 | cut -c1-300
timeout 90 python3 benchmarks/time_sampling.py "$AUX/$NAME-sampling.json" > "$AUX/$NAME-sampling.log" 2>&1; echo "sampling rc=$?"; tail -n 3 "$AUX/$NAME-sampling.log" | cut -c1-300
timeout 40 python3 benchmarks/time_topk.py "$AUX/$NAME-topk.json" > "$AUX/$NAME-topk.log" 2>&1; echo "topk rc=$?"; tail -n 2 "$AUX/$NAME-topk.log" | cut -c1-300
python3 benchmarks/kernels/adopt_measured.py "$TUNING" --tiled "$AUX/$NAME-tiled.json" --sampling "$AUX/$NAME-sampling.json"
cp "$TUNING" "$AUX/$NAME-tuning.json"
. benchmarks/gpu_bench_tail.sh  # archive, then the bench in the time left
