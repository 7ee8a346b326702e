#!/usr/bin/env bash
# GPU calls of the twenty-third session. Usage: OUT=$OUT NAME=run71 COMMIT=<sha> PHASE=all|bench|ncu bash benchmarks/gpu_session23.sh
# PHASE=ncu (about 200 s): `gpu_session22.sh` PHASE=ncu with NCU_EXTRA=" " (Nsight Compute raw metrics on the decode
#   kernels, summarised by `kernels/ncu_stalls.py`).
# PHASE=bench (about 350 s): the async-decoding CUDA tests (graphs, torch and Triton ops), then the full bench, without
#   the peer unless BENCH_ARGS says otherwise (run69 measured it: 114 / 111 ms); it times the engine with async decoding
#   beside the synchronous runner steps, greedy and sampled.
set -u
OUT="${OUT:-/tmp/session23-out}"; NAME="${NAME:-session23}"; COMMIT="${COMMIT:-unknown}"; PHASE="${PHASE:-bench}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
if [ "$PHASE" = ncu ]; then
  OUT="$OUT" NAME="$NAME" COMMIT="$COMMIT" NCU_EXTRA=" " PHASE=ncu bash benchmarks/gpu_session22.sh
  exit 0
fi
if [ "$PHASE" = all ]; then  # one call (about 560 s): bench, then the tiny model's async timing, then ncu with the time left
  OUT="$OUT" NAME="$NAME" COMMIT="$COMMIT" PHASE=bench bash "$0"
  timeout 60 python3 benchmarks/time_async_decode.py "$OUT/$NAME-async-tiny.json" > "$OUT/$NAME-async-tiny.log" 2>&1
  echo "async tiny rc=$?"; grep -E "^batch" "$OUT/$NAME-async-tiny.log"
  if [ "$SECONDS" -lt "${NCU_BEFORE_S:-400}" ]; then
    NCU_S=$((570 - SECONDS)) OUT="$OUT" NAME="$NAME" COMMIT="$COMMIT" NCU_EXTRA=" " PHASE=ncu bash benchmarks/gpu_session22.sh
  else
    echo "ncu skipped: ${SECONDS} s used"
  fi
  exit 0
fi
timeout "${TEST_S:-90}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/test_async_decode.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/$NAME-pytest.log" | tail -n 4 | cut -c1-300
grep -E "^E " "$OUT/$NAME-pytest.log" | head -n 8 | cut -c1-300
timeout "${BENCH_S:-420}" python3 -m toolbox.cli engine bench ${BENCH_ARGS:---no-peer} --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -E "^\| (TTFT|TPOT|output)" "$OUT/$NAME.md" 2>/dev/null
grep -E "^Batch-1 decode step|^Total over" "$OUT/$NAME.md" 2>/dev/null | cut -c1-200
python3 - "$OUT/$NAME.json" <<'PY' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))["ours"]
print("tpot", {k: d["tpot"].get(k) for k in ("seconds", "engine_step_seconds", "async_engine_step_seconds", "graph_replay_seconds")})
for b, t in d["throughput"].items():
    print("batch", b, {k: t.get(k) for k in ("tokens_per_second", "async_tokens_per_second", "end_to_end_tokens_per_second")})
PY
