#!/usr/bin/env bash
# One GPU session on an H200 (about 8 minutes): CUDA tests of the graph decode path and the kernels,
# then `toolbox engine bench` in the full setting (gate, ceilings, profile, TTFT/TPOT, peer, then
# tokens/s at batch 1, 8, 32, 64; results saved after each figure), then the NVFP4 LM head variant
# if time remains. Everything goes under "$OUT". Run from the repository root; installs nothing.
set -u
OUT="${OUT:-/tmp/bench-out}"
BUDGET_S="${BUDGET_S:-480}"
# EXTRA_ARGS: appended to every bench call (a CPU dry run: EXTRA_ARGS="--model tiny --device cpu")
mkdir -p "$OUT/results"
export PYTHONPATH=.
start=$SECONDS
left() { echo $(( BUDGET_S - (SECONDS - start) )); }

{
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv || true
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  python3 -c "import importlib.util as u; print({m: bool(u.find_spec(m)) for m in ('click', 'pytest', 'fla', 'tokenizers', 'safetensors')})"
  git rev-parse HEAD 2>/dev/null || echo "commit: no git on this machine"
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"
COMMIT="${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"

# 1. CUDA tests (graphs, static ops, kernels, contracts' cuda cases), bounded.
if python3 -c "import pytest" 2>/dev/null; then
  MINE="tests/reference_engine/test_cuda_graphs.py tests/reference_engine/test_bench_pipeline.py"
  timeout 100 python3 -m pytest -m cuda -x -q -p no:cacheprovider --continue-on-collection-errors $MINE > "$OUT/pytest_cuda_graphs.log" 2>&1
  echo "pytest (graphs, bench) rc=$?"; tail -n 15 "$OUT/pytest_cuda_graphs.log"
  timeout 90 python3 -m pytest -m cuda -x -q -p no:cacheprovider --continue-on-collection-errors tests/reference_engine tests/contracts \
    --ignore=tests/reference_engine/test_cuda_graphs.py --ignore=tests/reference_engine/test_bench_pipeline.py \
    > "$OUT/pytest_cuda_rest.log" 2>&1
  echo "pytest (kernels, contracts, engine) rc=$? (124: out of time)"; tail -n 15 "$OUT/pytest_cuda_rest.log"
else
  echo "pytest is not installed here: CUDA tests skipped" | tee "$OUT/pytest_cuda_graphs.log"
fi

bench() {  # bench <timeout_s> <log name> <args...>
  local limit=$1 name=$2; shift 2
  if python3 -c "import click" 2>/dev/null; then
    timeout "$limit" python3 -m toolbox.cli engine bench --out-dir "$OUT/results" --commit "$COMMIT" "$@" ${EXTRA_ARGS:-} > "$OUT/$name.log" 2>&1
  else
    echo "click is not installed: running the pipeline without the CLI" > "$OUT/$name.log"
    timeout "$limit" python3 -m reference_engine.bench "$OUT/results" "$COMMIT" "$@" ${EXTRA_ARGS:-} >> "$OUT/$name.log" 2>&1
  fi
  local rc=$?
  echo "$name rc=$rc (1: accuracy gate failed, 124: out of time)"; tail -n 40 "$OUT/$name.log"
}

# 2. Full setting: full-size architecture, NVFP4 linears, bf16 LM head, 256 output tokens at batch 1, 8, 32, 64,
#    with the peer and the profile. Results are written after each figure, so a timeout keeps what was measured.
full_limit=$(( $(left) - 15 )); [ "$full_limit" -lt 120 ] && full_limit=120
bench "$full_limit" bench_full

# 3. The NVFP4 LM head variant, quick, if time remains.
if [ "$(left)" -gt 150 ]; then
  bench "$(( $(left) - 10 ))" bench_lmhead_nvfp4 --lm-head nvfp4 --output-tokens 32 --batch-sizes 1,8 --no-peer --no-profile
else
  echo "no time left for the NVFP4 LM head variant ($(left) s)"
fi
ls -la "$OUT/results"
for summary in "$OUT"/results/*.md; do [ -f "$summary" ] && sed -n '1,25p' "$summary"; done
