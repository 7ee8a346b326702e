#!/usr/bin/env bash
# One short GPU call: CUDA tests of the kept bfloat16 weight copies (`nvfp4_dequant.CACHE`), then a short bench (batch 1,
# 16 output tokens, 16 gate prompts, no peer, prefill profile) with `dequant_cache` on in a copy of the tuning file.
# Compare with run28-B (the same bench without it). Usage: NAME=run29 COMMIT=<sha> bash benchmarks/gpu_cache8.sh
set -u
OUT="${OUT:-/tmp/c8-out}"; NAME="${NAME:-c8}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
timeout "${TEST_S:-40}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_dequant.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 6
python3 -c "import json; p='$TUNED'; d=json.load(open(p)); d['dequant_cache']=True; json.dump(d, open(p, 'w'), indent=1)"
timeout "${BENCH_S:-130}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" --no-peer --output-tokens 16 --batch-sizes 1 > "$OUT/$NAME.log" 2>&1
echo "bench rc=$?"; [ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT)|accuracy gate|ceilings" "$OUT/$NAME.md" | sed 's/.*vs float32 twin (eager), bfloat16)//' | cut -c1-300
[ -f "$OUT/$NAME.md" ] && sed -n '/One prefill/,/Total over/p' "$OUT/$NAME.md" | grep -E "dequant|aten::mm|Total"
