#!/usr/bin/env bash
# Tenth session, extra GPU call: the chunked GDN prefill's first launch with 4 warps (two programs per SM at 255
# registers) against 8: CUDA tests, `kernels/time_gdn_prefill.py`; if 4 warps is at least 2% faster at 1024 tokens the
# tuning file gets `gdn_prefill_prepare_warps` 4 and a short TTFT bench runs with it (no peer, batch 1, 2 output tokens).
# Usage: NAME=run40 COMMIT=<sha> bash benchmarks/gpu_gdn10.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/gdn10-out}"; NAME="${NAME:-gdn10}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
timeout "${TEST_S:-70}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_gdn_chunked_prefill.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$? (124: out of time)"; grep -E "passed|failed|FAILED|Error" "$OUT/$NAME-pytest.log" | tail -n 8
timeout "${GDN_S:-80}" python3 benchmarks/kernels/time_gdn_prefill.py "$OUT/$NAME-gdn-prefill.json" > "$OUT/$NAME-gdn-prefill.log" 2>&1
echo "time_gdn_prefill rc=$?"; grep -E "^T=" "$OUT/$NAME-gdn-prefill.log" | cut -c1-160
python3 - "$OUT/$NAME-gdn-prefill.json" "$TUNED" "$OUT/$NAME-tuning.json" <<'PY' || exit 0
import json, sys
records = [r for r in json.load(open(sys.argv[1])) if r["tokens"] == 1024 and r["seqs"] == 1]
ms = {r["impl"]: r["ms"] for r in records}
base, four = ms.get("triton stages 2 prepare warps 8"), ms.get("triton stages 2 prepare warps 4")
print("1024 tokens: prepare warps 8", base, "ms, 4", four, "ms")
if not (base and four and four <= 0.98 * base):
    sys.exit(1)
tuning = json.load(open(sys.argv[2])) | {"gdn_prefill_prepare_warps": 4}
open(sys.argv[3], "w").write(json.dumps(tuning, indent=1) + "\n")
print("tuning: gdn_prefill_prepare_warps 4")
PY
cp "$OUT/$NAME-tuning.json" "$TUNED"
timeout "${BENCH_S:-150}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" --no-peer --output-tokens 2 \
  --batch-sizes 1 --gate-prompts 4 --no-profile > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/$NAME-bench.log" | tail -n 3
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT)|accuracy gate|ceilings" "$OUT/$NAME.md" | cut -c1-300
