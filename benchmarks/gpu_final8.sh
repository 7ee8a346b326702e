#!/usr/bin/env bash
# Eighth session's last GPU call: CUDA tests of the NVFP4 GEMMs; `kernels/time_moe_prefill.py` (the routed experts'
# prefill tiles the tuning keys express: prefetch, largest token block, gate/up rows), whose choice is written into the
# tuning file before the full `toolbox engine bench` (gate, TTFT, TPOT, tokens/s at 1/8/32/64, peer, profiles).
# Usage: NAME=run27 COMMIT=<sha> bash benchmarks/gpu_final8.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/f8-out}"; NAME="${NAME:-f8}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${TEST_S:-70}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_gemm.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
timeout "${TIME_S:-100}" python3 benchmarks/kernels/time_moe_prefill.py "$OUT/$NAME-moe-prefill.json" "$TUNED" "$OUT/$NAME-tuning.json" > "$OUT/$NAME-moe-prefill.log" 2>&1
echo "time_moe_prefill rc=$?"; grep -E "^moe|tuning|summed" "$OUT/$NAME-moe-prefill.log"
[ -f "$OUT/$NAME-tuning.json" ] && cp "$OUT/$NAME-tuning.json" "$TUNED"
timeout "${BENCH_S:-330}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 4
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate|ceilings|Peer|Total over|Batch-1" "$OUT/$NAME.md" | cut -c1-420
[ -f "$OUT/$NAME.md" ] && sed -n '/One prefill/,/Total over/p' "$OUT/$NAME.md" | head -n 10
