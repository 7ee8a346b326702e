"""`benchmarks/kernels/ncu_stalls.py`: the Nsight Compute raw-page summary the GPU scripts print (no GPU needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks" / "kernels"))

import ncu_stalls

REPORT = """==PROF== Connected to process 4242
==PROF== Profiling "_gate_up_kernel": 0%....50%....100% - 9 passes
  _gate_up_kernel (4224, 16, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: Command line profiler metrics
    ----------------------------------------------------------------------- ----------- ------------
    Metric Name                                                             Metric Unit Metric Value
    ----------------------------------------------------------------------- ----------- ------------
    dram__throughput.avg.pct_of_peak_sustained_elapsed                                %        37.12
    gpu__time_duration.sum                                                      usecond       111.20
    launch__grid_size                                                                         67,584
    sm__warps_active.avg.pct_of_peak_sustained_active                                 %        43.07
    smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio                                12.51
    smsp__average_warp_latency_issue_stalled_wait.ratio                                            2.10
    smsp__average_warp_latency_issue_stalled_lg_throttle.ratio                                     4.30
  _down_kernel (264, 64, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: Command line profiler metrics
    gpu__time_duration.sum                                                      usecond        62.50
    smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio                    0.90
"""


def test_parse_reads_every_launch_and_its_metrics():
    launches = ncu_stalls.parse(REPORT)
    assert [name for name, _ in launches] == ["_gate_up_kernel grid (4224, 16, 1)", "_down_kernel grid (264, 64, 1)"]
    gate_up = launches[0][1]
    assert gate_up["gpu__time_duration.sum"] == ("usecond", 111.2)
    assert gate_up["launch__grid_size"][1] == 67584.0  # thousands separators read
    assert launches[1][1]["gpu__time_duration.sum"][1] == 62.5  # a later launch's rows are not the first's


def test_summary_orders_stall_reasons_and_names_both_metric_spellings():
    lines = ncu_stalls.summary(ncu_stalls.parse(REPORT), top=2)
    assert lines[1].startswith("    duration 111.20 usecond; DRAM % peak 37.12; achieved occupancy % 43.07")
    assert lines[2] == "    stalls per issue: long_scoreboard 12.51, lg_throttle 4.30"  # the top 2, largest first
    assert lines[5] == "    stalls per issue: math_pipe_throttle 0.90"


def test_a_report_without_launches_exits_1(tmp_path):
    empty = tmp_path / "ncu.txt"
    empty.write_text("==ERROR== the application returned an error code (1)\n")
    result = subprocess.run([sys.executable, str(REPO / "benchmarks/kernels/ncu_stalls.py"), str(empty)], capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "no kernel launch" in result.stderr
