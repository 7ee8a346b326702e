#!/usr/bin/env bash
# Eleventh session, second GPU call: CUDA tests of the prefill paths (graphs vs eager, tiny model on CUDA vs CPU, the
# full-size preset), `kernels/time_prefill_forms.py` (fused eager MoE block and stacked GDN projections against the
# composed forms, router logits at a padded pitch against F.linear), then the full bench.
# Usage: NAME=run43 COMMIT=<sha> bash benchmarks/gpu_session11b.sh      (writes under $OUT; BENCH=0: no bench)
set -u
OUT="${OUT:-/tmp/s11b-out}"; NAME="${NAME:-s11b}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/test_prefill_graphs.py tests/reference_engine/test_llm_cuda.py \
  tests/reference_engine/test_eager_prefill_ops.py tests/reference_engine/kernels/test_norms.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
timeout "${FORMS_S:-120}" python3 benchmarks/kernels/time_prefill_forms.py "$OUT/$NAME-prefill-forms.json" > "$OUT/$NAME-prefill-forms.log" 2>&1
echo "time_prefill_forms rc=$?"; grep -E "us|Error" "$OUT/$NAME-prefill-forms.log" | cut -c1-220
[ "${BENCH:-1}" = 0 ] && exit 0
timeout "${BENCH_S:-330}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 4
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|ceilings|Total over|Batch-1" "$OUT/$NAME.md" | cut -c1-300
[ -f "$OUT/$NAME.md" ] && sed -n '/One prefill/,/Total over/p' "$OUT/$NAME.md" | head -n 22
