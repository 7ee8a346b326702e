#!/usr/bin/env bash
# One GPU call: time the MoE decode settings and sweep the GEMV tiles, write the card's tuning file
# (reference_engine/kernels/tuned/<device>.json, applied by ops/backend.select_ops), then the full
# `toolbox engine bench` with it. Run from the repository root; everything lands under $OUT.
# Usage: NAME=run3 COMMIT=<sha> bash benchmarks/gpu_tune_and_bench.sh
set -u
OUT="${OUT:-/tmp/bench-out}"; NAME="${NAME:-tuned}"; COMMIT="${COMMIT:-unknown}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
timeout "${MOE_S:-90}" python3 benchmarks/kernels/time_moe_decode.py "$OUT/moe_times.json" 2>&1 | tail -n 26
timeout "${SWEEP_S:-120}" python3 benchmarks/kernels/sweep_w4a16_gemv.py "$OUT/gemv_sweep.json" 2>&1 | grep -v "^$" | tail -n 6
python3 benchmarks/kernels/write_tuning.py "$OUT/gemv_sweep.json" "$OUT/moe_times.json" "$OUT/tuning.json" \
  && mkdir -p reference_engine/kernels/tuned && cp "$OUT/tuning.json" "reference_engine/kernels/tuned/$(python3 -c 'import torch, re; print(re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-"))').json"
timeout "${BENCH_S:-240}" python3 -m toolbox.cli engine bench --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" "$@" > "$OUT/bench_$NAME.log" 2>&1
echo "bench rc=$? (1: gate failed, 124: out of time)"; grep -v "^\s*$" "$OUT/bench_$NAME.log" | tail -n 12
[ -f "$OUT/$NAME.md" ] && cat "$OUT/$NAME.md"
