#!/usr/bin/env bash
# Tenth session's last GPU call: CUDA tests of the NVFP4 GEMMs (decode 2 included); `kernels/time_moe_prefill.py --tiles`
# (the routed experts' prefill with decode 2, the register operand, against the committed plans; its choice goes into the
# tuning file only for a 2% gain); then the full bench (peer included). Usage: NAME=run36 COMMIT=<sha> bash
# benchmarks/gpu_final10.sh      (writes under $OUT; BENCH=0: no bench)
set -u
OUT="${OUT:-/tmp/f10-out}"; NAME="${NAME:-f10}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-100}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_gemm.py -k "moe_prefill or register" > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
timeout "${TIME_S:-90}" python3 benchmarks/kernels/time_moe_prefill.py "$OUT/$NAME-moe-tiles.json" "$TUNED" "$OUT/$NAME-tuning.json" --tiles > "$OUT/$NAME-moe-tiles.log" 2>&1
echo "time_moe_prefill --tiles rc=$?"; grep -E "^moe|tuning|failed|rejected" "$OUT/$NAME-moe-tiles.log" | cut -c1-200
[ -f "$OUT/$NAME-tuning.json" ] && cp "$OUT/$NAME-tuning.json" "$TUNED"
[ "${BENCH:-1}" = 0 ] && exit 0
timeout "${BENCH_S:-390}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 4
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|ceilings|Peer|Total over|Batch-1" "$OUT/$NAME.md" | cut -c1-420
[ -f "$OUT/$NAME.md" ] && sed -n '/One prefill/,/Total over/p' "$OUT/$NAME.md" | head -n 14
