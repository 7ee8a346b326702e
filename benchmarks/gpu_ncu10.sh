#!/usr/bin/env bash
# Tenth session, second GPU call: Nsight Compute on the 1024-token prefill kernels (`kernels/profile_ncu_prefill.py`:
# the routed experts' grouped GEMMs and the chunked GDN prefill, committed tuning), then `kernels/time_moe_prefill.py
# --tiles` (single tile changes of the experts' GEMMs no tuning key expresses). Usage: NAME=run35 bash
# benchmarks/gpu_ncu10.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/ncu10-out}"; NAME="${NAME:-ncu10}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
timeout "${NCU_S:-200}" ncu --clock-control none --profile-from-start off --kernel-name "regex:_moe_gate_up_kernel|_moe_down_kernel|_gdn_chunk" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
  --section MemoryWorkloadAnalysis python3 benchmarks/kernels/profile_ncu_prefill.py > "$OUT/$NAME-ncu.txt" 2>&1
echo "ncu rc=$?"; grep -E "^  [_a-zA-Z].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issued Warp|Issue Slots Busy|No Eligible|Executed Ipc A|Grid Size|Block Size|Executed Instructions  |Stall|Warp Cycles Per Issued|L2 Hit|Block Limit" "$OUT/$NAME-ncu.txt" | head -n 150
timeout "${TIME_S:-150}" python3 benchmarks/kernels/time_moe_prefill.py "$OUT/$NAME-moe-tiles.json" reference_engine/kernels/tuned/nvidia-h200.json --tiles > "$OUT/$NAME-moe-tiles.log" 2>&1
echo "time_moe_prefill --tiles rc=$?"; grep -E "^moe|failed|rejected" "$OUT/$NAME-moe-tiles.log" | cut -c1-200
