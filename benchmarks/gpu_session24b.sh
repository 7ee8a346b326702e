#!/usr/bin/env bash
# Second GPU call of the twenty-fourth session. Usage: OUT=$OUT NAME=run73 COMMIT=<sha> bash benchmarks/gpu_session24b.sh
# 1. CUDA tests (about 120 s): sampler graphs (replays equal the eager op; stale settings caught), async decoding (its
#    launches ahead now include sampler recordings, under the sync check), the top-k selection path.
# 2. `diagnose_async_torch.py` (about 60 s): why async and sync part on the torch ops (run72) and not on Triton.
# 3. The full bench without the peer (about 250 s): sampled TPOT rows with the sampler graphs.
set -u
OUT="${OUT:-/tmp/session24b-out}"; NAME="${NAME:-session24b}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/test_sampler_graphs.py \
  tests/reference_engine/test_async_decode.py tests/reference_engine/test_sampling_top_k_select.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/$NAME-pytest.log" | tail -n 5 | cut -c1-300
grep -E "^E " "$OUT/$NAME-pytest.log" | head -n 8 | cut -c1-300
timeout 90 python3 benchmarks/time_sampling.py "$OUT/$NAME-sampling.json" > "$OUT/$NAME-sampling.log" 2>&1; echo "sampling rc=$?"; tail -n 3 "$OUT/$NAME-sampling.log"
timeout "${DIAG_S:-120}" python3 benchmarks/diagnose_async_torch.py "$OUT/$NAME-diagnose.json" > "$OUT/$NAME-diagnose.log" 2>&1
echo "diagnose rc=$?"; grep -E ": " "$OUT/$NAME-diagnose.log" | grep -vE "Warning|warn" | tail -n 9
timeout "${BENCH_S:-400}" python3 -m toolbox.cli engine bench ${BENCH_ARGS:---no-peer} --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -E "^\| (TTFT|TPOT|output)|^WARNING" "$OUT/$NAME.md" 2>/dev/null
grep -E "^Batch-1 decode step" "$OUT/$NAME.md" 2>/dev/null | cut -c1-200
python3 - "$OUT/$NAME.json" <<'PY' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))["ours"]
print("tpot", {k: d["tpot"].get(k) for k in ("seconds", "engine_step_seconds", "async_engine_step_seconds", "sampled_engine_step_seconds", "async_sampled_engine_step_seconds", "graph_replay_seconds")})
for b, t in d["throughput"].items():
    print("batch", b, {k: t.get(k) for k in ("tokens_per_second", "async_tokens_per_second", "end_to_end_tokens_per_second", "graph_captured_in_timed_run")})
PY
