#!/usr/bin/env bash
# One GPU call: Nsight Compute on the dominant decode kernels (`kernels/profile_ncu.py`), then the MoE prefill
# block table (`kernels/time_block_table.py`). Run from the repository root on the GPU machine; writes under $OUT.
# Usage: NAME=run21 bash benchmarks/gpu_ncu.sh
set -u
OUT="${OUT:-/tmp/ncu-out}"; NAME="${NAME:-ncu}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout "${NCU_S:-240}" ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
  python3 benchmarks/kernels/profile_ncu.py > "$OUT/$NAME-ncu.txt" 2>&1
echo "ncu rc=$?"; grep -E "^  [_a-zA-Z].*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issued Warp|No Eligible|Grid Size|Block Size" "$OUT/$NAME-ncu.txt" | head -n 150
timeout "${TABLE_S:-60}" python3 benchmarks/kernels/time_block_table.py "$OUT/$NAME-block-table.json" > "$OUT/$NAME-block-table.log" 2>&1
echo "block table rc=$?"; tail -n 5 "$OUT/$NAME-block-table.log"
