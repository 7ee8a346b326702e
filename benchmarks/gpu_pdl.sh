#!/usr/bin/env bash
# One GPU call for programmatic dependent launch (`kernels/pdl.py`): CUDA tests of the decode graphs (PDL off and on
# must give identical logits) and of the kernels whose launches changed, a decode-like kernel chain timed with PDL
# off and on, then the short engine bench twice: the committed tuning (PDL off) and the same with "pdl": true.
# Run from the repository root on the GPU machine; everything lands under $OUT.
# Usage: NAME=run10 COMMIT=<sha> bash benchmarks/gpu_pdl.sh
set -u
OUT="${OUT:-/tmp/pdl-out}"; NAME="${NAME:-pdl}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-120}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/test_cuda_graphs.py \
  tests/reference_engine/kernels/test_norms.py tests/reference_engine/kernels/test_router.py tests/reference_engine/kernels/test_paged_decode.py \
  tests/reference_engine/kernels/test_gdn_decode_step.py tests/reference_engine/kernels/test_attention_decode_fused.py > "$OUT/pytest_$NAME.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_$NAME.log" | tail -n 15
timeout "${CHAIN_S:-90}" python3 benchmarks/kernels/time_pdl.py "$OUT/pdl_chain.json" 2>&1 | tail -n 3
for mode in off on; do
  if [ "$mode" = on ]; then python3 -c "import json; p='$TUNED'; t=json.load(open(p)); t['pdl']=True; json.dump(t, open(p, 'w'), indent=1)"; fi
  timeout "${BENCH_S:-150}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-pdl-$mode" --no-peer \
    --output-tokens 64 --batch-sizes 1,32 > "$OUT/bench_$NAME-pdl-$mode.log" 2>&1
  echo "bench pdl $mode rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/bench_$NAME-pdl-$mode.log" | tail -n 2
  [ -f "$OUT/$NAME-pdl-$mode.md" ] && sed -n 12,36p "$OUT/$NAME-pdl-$mode.md"
done
