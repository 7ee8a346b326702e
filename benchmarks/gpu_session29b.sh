#!/usr/bin/env bash
# Twenty-ninth session, second call (about 300 s). Usage:
#   OUT=$OUT NAME=runNN COMMIT=<sha> bash benchmarks/gpu_session29b.sh
# `kernels/time_gemv_tiled.py --stream-like`: the batch-1 GEMVs on tile-major copies at small row tiles with split-K 1
# or 2 (run80: a pure read of their bytes at 400 to 800 programs and 2 KB steps took 0.55 to 0.65 of the real GEMV),
# beside the committed tiles and their neighbours; then `adopt_measured.py --gemv-tiled` writes a config that beat the
# committed tile by 3% into $OUT/$NAME-tuning.json (copy it into the repository and commit it).
# BENCH=1: then the bench in the time left (`gpu_bench_tail.sh`, CALL_S 590) on that file, installed over this copy's
# tuning file (BENCH_ARGS, default "--output-tokens 64 --no-peer").
set -u
OUT="${OUT:-/tmp/session29b-out}"; NAME="${NAME:-session29b}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
echo "commit $COMMIT"; nvidia-smi --query-gpu=name --format=csv,noheader
TUNING="$OUT/$NAME-tuning.json"; cp reference_engine/kernels/tuned/nvidia-h200.json "$TUNING"
timeout 240 python3 benchmarks/kernels/time_gemv_tiled.py "$OUT/$NAME-gemv-stream-like.json" --stream-like --tuning "$TUNING" > "$OUT/$NAME-gemv-stream-like.log" 2>&1
echo "gemv stream-like rc=$?"; grep -E "^GEMV|skipped" "$OUT/$NAME-gemv-stream-like.log" | cut -c1-200
python3 - "$OUT/$NAME-gemv-stream-like.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["records"]:
    top = sorted(r["sweep"], key=lambda item: item["tile_major_us"])[:6]
    print(r["rows"], r["k_bytes"], "committed", r["config"], round(r["tile_major_us"], 2), "| fastest:", [(i["config"][1:6], round(i["tile_major_us"], 2)) for i in top])
PY
python3 benchmarks/kernels/adopt_measured.py "$TUNING" --gemv-tiled "$OUT/$NAME-gemv-stream-like.json"
echo "elapsed ${SECONDS} s"
if [ "${BENCH:-0}" = 1 ]; then
  cp "$TUNING" reference_engine/kernels/tuned/nvidia-h200.json
  AUX="$OUT/aux"; mkdir -p "$AUX"; CALL_S="${CALL_S:-590}"; BENCH_ARGS="${BENCH_ARGS:---output-tokens 64 --no-peer}"
  . benchmarks/gpu_bench_tail.sh
fi
