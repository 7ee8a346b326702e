#!/usr/bin/env bash
# One short GPU call: the engine bench with the committed tuning file (default 4 gate prompts, batch 32, 32 output tokens,
# no peer, no profile). Writes under $OUT. Usage: NAME=run24 COMMIT=<sha> bash benchmarks/gpu_confirm.sh
set -u
OUT="${OUT:-/tmp/confirm-out}"; NAME="${NAME:-confirm}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
timeout "${BENCH_S:-190}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" --no-peer --no-profile \
  --output-tokens 32 --batch-sizes 32 > "$OUT/$NAME.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -E "^gate|failed|capture" "$OUT/$NAME.log" | head -n 6
[ -f "$OUT/$NAME.md" ] && grep -E "^\| (TTFT|TPOT|output)|accuracy gate" "$OUT/$NAME.md"
