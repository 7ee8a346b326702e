#!/usr/bin/env bash
# One GPU call: the accuracy gate with more prompts (GATE_PROMPTS, default 16) on two tuning files, each in its own
# short bench (batch 1, 16 output tokens, no peer, no profile): A = $A_TUNING (run26's MoE prefill tiles), B = the
# committed file (run27's). Settles whether run27's top-1 at its bound was the 20-row sample. Writes under $OUT.
# Usage: NAME=run28 COMMIT=<sha> A_TUNING=path bash benchmarks/gpu_gate8.sh
set -u
OUT="${OUT:-/tmp/g8-out}"; NAME="${NAME:-g8}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNED=reference_engine/kernels/tuned/nvidia-h200.json
BENCH="--no-peer --no-profile --output-tokens 16 --batch-sizes 1 --gate-prompts ${GATE_PROMPTS:-16}"
cp "$TUNED" /tmp/committed-tuning.json
for side in B A; do
  if [ "$side" = A ]; then cp "$A_TUNING" "$TUNED"; else cp /tmp/committed-tuning.json "$TUNED"; fi
  timeout "${SIDE_S:-200}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME-$side" $BENCH > "$OUT/$NAME-$side.log" 2>&1
  echo "bench $side rc=$?"; [ -f "$OUT/$NAME-$side.md" ] && grep -E "^\| (TTFT|TPOT)|accuracy gate" "$OUT/$NAME-$side.md" | sed 's/.*vs float32 twin (eager), bfloat16)//' | cut -c1-420
done
cp /tmp/committed-tuning.json "$TUNED"
