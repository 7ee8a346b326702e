#!/usr/bin/env bash
# GPU calls of the twenty-first session. Usage: OUT=$OUT NAME=run65 COMMIT=<sha> PHASE=addnorm|bench bash benchmarks/gpu_session21.sh
# PHASE=addnorm (about 350 s on an H100): the CUDA tests of the norm folded into the MoE router launch and of the GDN
#   step, then `time_gdn_state_first.py` (the GDN step's state load first, batches 1 to 64; writes `gdn_step_state_first`),
#   then `time_router_add_norm.py` (batch-1 decode graph, off vs on, ROUNDS rounds) writing `router_add_norm` into the tuning
#   file in place (the next phase runs on it; copy it back into the repository only after reading the log), then with
#   time left a short bench (no peer, batches 1 and 32, 64 tokens).
# PHASE=bench: `benchmarks/gpu_session20.sh` PHASE=bench (the full bench with the peer, then GROUPED_PLANS if set).
set -u
OUT="${OUT:-/tmp/session21-out}"; NAME="${NAME:-session21}"; COMMIT="${COMMIT:-unknown}"; PHASE="${PHASE:-addnorm}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
TUNING="reference_engine/kernels/tuned/nvidia-h200.json"
if [ "$PHASE" = bench ]; then exec env OUT="$OUT" NAME="$NAME" COMMIT="$COMMIT" PHASE=bench bash benchmarks/gpu_session20.sh; fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout "${TEST_S:-120}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/kernels/test_router_add_norm.py \
    tests/reference_engine/kernels/test_router.py tests/reference_engine/kernels/test_gdn_decode_step.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/$NAME-pytest.log" | tail -n 6 | cut -c1-300
if grep -q "FAILED" "$OUT/$NAME-pytest.log"; then grep -E "^E " "$OUT/$NAME-pytest.log" | head -n 10 | cut -c1-300; echo "timing skipped"; exit 0; fi
timeout "${GDN_S:-90}" python3 benchmarks/kernels/time_gdn_state_first.py "$OUT/$NAME-gdn-state-first.json" --tuning "$TUNING" \
    > "$OUT/$NAME-gdn-state-first.log" 2>&1
echo "gdn state-first timing rc=$?"; grep -E "^[0-9]+ |tuning:|Error|disagree" "$OUT/$NAME-gdn-state-first.log" | \
    python3 -c "import sys,json
for line in sys.stdin:
    b, _, rest = line.partition(' ')
    try: r = json.loads(rest); print(b, 'committed', round(r['committed_us'], 2), 'first', round(r['state_first_us'], 2), 'bits', r['bits_equal'])
    except Exception: print(line.rstrip()[:300])"
timeout "${TIME_S:-300}" python3 benchmarks/kernels/time_router_add_norm.py "$OUT/$NAME-add-norm.json" --rounds "${ROUNDS:-2}" \
    --tuning "$TUNING" > "$OUT/$NAME-add-norm.log" 2>&1
echo "add-norm timing rc=$?"; grep -E "tuning:|Error|top-1|on_over_off" "$OUT/$NAME-add-norm.log" | cut -c1-400
cp "$TUNING" "$OUT/$NAME-tuning.json"
if [ "$SECONDS" -lt "${BENCH_BEFORE_S:-420}" ]; then
  timeout "${BENCH_S:-160}" python3 -m toolbox.cli engine bench --no-peer --output-tokens 64 --batch-sizes 1,32 --out-dir "$OUT" --commit "$COMMIT" \
      --name "$NAME-short" > "$OUT/$NAME-short-bench.log" 2>&1
  echo "short bench rc=$?"; grep -E "^\| (TTFT|TPOT|output)" "$OUT/$NAME-short.md" 2>/dev/null
  grep -E "^Batch-1 decode step|^Total over" "$OUT/$NAME-short.md" 2>/dev/null | cut -c1-200
else
  echo "short bench skipped: ${SECONDS} s used"
fi
