#!/usr/bin/env bash
# Ninth session, last GPU call: Nsight Compute on the MoE decode kernels only (`kernels/profile_ncu.py` with the
# committed tuning: batch 1 runs the per-pair kernels, batch 32 the grouped packed float16 ones), with the instruction
# mix, to see where the grouped kernels lose their time. Usage: NAME=run34 bash benchmarks/gpu_ncu9.sh (writes under $OUT)
set -u
OUT="${OUT:-/tmp/ncu9-out}"; NAME="${NAME:-ncu9}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
timeout "${NCU_S:-150}" ncu --clock-control none --profile-from-start off --kernel-name "regex:_gate_up_kernel|_down_kernel|_pairs_kernel" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
  python3 benchmarks/kernels/profile_ncu.py > "$OUT/$NAME-ncu.txt" 2>&1
echo "ncu rc=$?"; grep -E "^  [_a-zA-Z].*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issued Warp|Issue Slots Busy|No Eligible|Executed Ipc A|Grid Size|Block Size|Executed Instructions  " "$OUT/$NAME-ncu.txt" | head -n 120
