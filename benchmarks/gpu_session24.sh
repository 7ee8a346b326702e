#!/usr/bin/env bash
# GPU call of the twenty-fourth session. Usage: OUT=$OUT NAME=run72 COMMIT=<sha> bash benchmarks/gpu_session24.sh
# 1. CUDA tests (about 100 s): async decoding at one decode bucket (run71 failed at buckets 1, 2, 4 on bf16 near-ties),
#    the top-k selection sampling path, and the tiny bench with graphs (no decode graph captured inside a timed run).
# 2. `time_sampling.py` (about 20 s): the filtered sampling path, sort vs top-k selection, at V = 248,320.
# 3. The full bench without the peer unless BENCH_ARGS says otherwise (about 250 s): the warm-up now reaches each batch's
#    decode graph, and the sampled rows take the selection path.
set -u
OUT="${OUT:-/tmp/session24-out}"; NAME="${NAME:-session24}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
timeout "${TEST_S:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests/reference_engine/test_async_decode.py \
  tests/reference_engine/test_sampling_top_k_select.py tests/reference_engine/test_bench_pipeline.py > "$OUT/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/$NAME-pytest.log" | tail -n 5 | cut -c1-300
grep -E "^E " "$OUT/$NAME-pytest.log" | head -n 8 | cut -c1-300
timeout 90 python3 benchmarks/time_sampling.py "$OUT/$NAME-sampling.json" > "$OUT/$NAME-sampling.log" 2>&1
echo "sampling rc=$?"; cat "$OUT/$NAME-sampling.log" | tail -n 4
timeout "${BENCH_S:-420}" python3 -m toolbox.cli engine bench ${BENCH_ARGS:---no-peer} --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -E "^\| (TTFT|TPOT|output)|^WARNING" "$OUT/$NAME.md" 2>/dev/null
grep -E "^Batch-1 decode step|^Total over" "$OUT/$NAME.md" 2>/dev/null | cut -c1-200
python3 - "$OUT/$NAME.json" <<'PY' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))["ours"]
print("tpot", {k: d["tpot"].get(k) for k in ("seconds", "engine_step_seconds", "async_engine_step_seconds", "sampled_engine_step_seconds", "async_sampled_engine_step_seconds", "graph_replay_seconds")})
for b, t in d["throughput"].items():
    print("batch", b, {k: t.get(k) for k in ("tokens_per_second", "async_tokens_per_second", "end_to_end_tokens_per_second", "slowest_step_seconds", "graph_captured_in_timed_run")})
PY
