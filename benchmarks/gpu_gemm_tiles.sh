#!/usr/bin/env bash
# One GPU call: the tensor-core GEMM sweep (weight decode, decode-batch tiles) writing a tuning file, which then
# replaces the committed one for the CUDA tests of the GEMMs and the quick bench. Run from the repository root.
# Usage: NAME=run13 COMMIT=<sha> bash benchmarks/gpu_gemm_tiles.sh   (writes under $OUT)
set -u
OUT="${OUT:-/tmp/gemm-out}"; NAME="${NAME:-gemm}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
timeout "${SWEEP_S:-270}" python3 benchmarks/kernels/time_gemm_tiles.py "$OUT/$NAME-gemm-tiles.json" "$OUT/$NAME-tuning.json" > "$OUT/$NAME-gemm-tiles.log" 2>&1
echo "sweep rc=$?"; grep -E "^prefill|^moe|wrote|decode 0/1" "$OUT/$NAME-gemm-tiles.log" | tail -n 25
[ -f "$OUT/$NAME-tuning.json" ] && cp "$OUT/$NAME-tuning.json" reference_engine/kernels/tuned/nvidia-h200.json
timeout "${TEST_S:-90}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_nvfp4_gemm.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
timeout "${BENCH_S:-190}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-quick" --no-peer \
  --output-tokens 64 --batch-sizes 1,32 > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$?"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 3
[ -f "$OUT/$NAME-quick.md" ] && sed -n 5,16p "$OUT/$NAME-quick.md"
