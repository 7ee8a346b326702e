# Sourced by the GPU session scripts (gpu_session25.sh on) after their timing steps. Archives $AUX into
# $OUT/$NAME-aux.tgz first (a call cut at its limit keeps those), then runs the engine bench in the time the call has
# left (CALL_S, default 590 s, less the script's SECONDS; at most BENCH_S; skipped under BENCH_MIN_S), prints its rows
# and removes $AUX. Needs OUT, NAME, COMMIT, AUX; BENCH_ARGS go to `toolbox engine bench`.
tar -czf "$OUT/$NAME-aux.tgz" -C "$AUX" .
LEFT=$(( ${CALL_S:-590} - SECONDS )); BENCH_T=$(( ${BENCH_S:-420} < LEFT ? ${BENCH_S:-420} : LEFT )); echo "bench gets ${BENCH_T} s"
if [ "$BENCH_T" -ge "${BENCH_MIN_S:-150}" ]; then
  timeout "$BENCH_T" python3 -m toolbox.cli engine bench ${BENCH_ARGS:-} --out-dir "$OUT" --commit "$COMMIT" --name "$NAME" > "$OUT/$NAME-bench.log" 2>&1
  echo "bench rc=$? (1: gate failed, 124: out of time)"
else
  echo "bench skipped: ${BENCH_T} s left"
fi
grep -E "^\| (TTFT|TPOT|output)|^WARNING" "$OUT/$NAME.md" 2>/dev/null | cut -c1-250
grep -E "^Batch-1 decode step" "$OUT/$NAME.md" 2>/dev/null | cut -c1-200
rm -rf "$AUX"; ls "$OUT"
