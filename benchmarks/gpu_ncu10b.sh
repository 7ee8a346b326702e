#!/usr/bin/env bash
# Tenth session, last GPU call: stall reasons, shared-memory bank conflicts and tensor-pipe use of the 1024-token prefill
# kernels (`kernels/profile_ncu_prefill.py`: the routed experts' grouped GEMMs, the chunked GDN prefill), to tell which
# of shared memory, the tensor pipe or dependent latency bounds the experts' gate/up launch (run35: L1/shared 73% busy).
# Usage: NAME=run39 bash benchmarks/gpu_ncu10b.sh      (writes under $OUT)
set -u
OUT="${OUT:-/tmp/ncu10b-out}"; NAME="${NAME:-ncu10b}"
export PYTHONPATH="${PYTHONPATH:-}:." PYTHONUNBUFFERED=1
STALLS=""
for reason in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait lg_throttle not_selected selected dispatch_stall membar no_instruction branch_resolving tex_throttle drain; do
  STALLS="$STALLS,smsp__average_warps_issue_stalled_${reason}_per_issue_active.ratio"
done
METRICS="gpu__time_duration.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
METRICS="$METRICS,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed"
METRICS="$METRICS,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active"
METRICS="$METRICS,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed$STALLS"
timeout "${NCU_S:-150}" ncu --clock-control none --profile-from-start off --kernel-name "regex:_moe_gate_up_kernel|_moe_down_kernel|_gdn_chunk" \
  --metrics "$METRICS" python3 benchmarks/kernels/profile_ncu_prefill.py > "$OUT/$NAME-ncu.txt" 2>&1
echo "ncu rc=$?"; grep -E "^  [_a-zA-Z].*\(|gpu__time|bank_conflicts|wavefronts|pipe_tensor|pipe_lsu|issue_active|dram__|stalled" "$OUT/$NAME-ncu.txt" | sed 's/  */ /g' | head -n 120
