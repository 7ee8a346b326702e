"""Summarise an Nsight Compute `--page raw` report: per kernel launch, the headline figures and the largest stall reasons.

    python3 benchmarks/kernels/ncu_stalls.py report.txt [--top 6]

Reads the text ncu prints with `--page raw` (a header line per launch, `name (grid)x(block), Context ..., CC 9.0`,
then `metric unit value` rows). Prints per launch: duration, DRAM throughput as a percent of peak, achieved
occupancy, issue slots busy, warp cycles per issued instruction, then the `--top` stall reasons by their
per-issue ratio (metrics named `smsp__average_warp[s]_latency_issue_stalled_<reason>...ratio` or
`smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`, whichever the ncu version reports).
Exit 1 when the report holds no launch (ncu failed or filtered everything out).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HEADER = re.compile(r"^\s{2}(\S.*?)\s\((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\)")
HEADLINE = {  # label: metric names, the first found wins
    "duration": ("gpu__time_duration.sum",),
    "DRAM % peak": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
    "achieved occupancy %": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "issue slots busy %": ("sm__inst_issued.avg.pct_of_peak_sustained_active", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
    "cycles per issue": ("smsp__average_warp_latency_per_inst_issued.ratio", "smsp__average_warps_issue_stalled_per_issue_active.ratio"),
}
STALL = re.compile(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)(?:_per_issue_active)?\.ratio$")


def parse(text: str) -> list[tuple[str, dict[str, tuple[str, float]]]]:
    """[(launch header, {metric: (unit, value)})] in report order."""
    launches: list[tuple[str, dict[str, tuple[str, float]]]] = []
    for line in text.splitlines():
        header = HEADER.match(line)
        if header:
            launches.append((f"{header.group(1)} grid ({header.group(2)}, {header.group(3)}, {header.group(4)})", {}))
            continue
        if not launches:
            continue
        parts = line.split()
        if len(parts) < 2 or "__" not in parts[0]:
            continue
        try:
            value = float(parts[-1].replace(",", ""))
        except ValueError:
            continue
        launches[-1][1][parts[0]] = (parts[1] if len(parts) > 2 else "", value)
    return launches


def summary(launches, top: int) -> list[str]:
    lines = []
    for name, metrics in launches:
        lines.append(name[:150])
        figures = []
        for label, names in HEADLINE.items():
            found = next((metrics[n] for n in names if n in metrics), None)
            if found is not None:
                figures.append(f"{label} {found[1]:,.2f}{(' ' + found[0]) if found[0] and label == 'duration' else ''}")
        lines.append("    " + "; ".join(figures))
        stalls = sorted(((STALL.match(m).group(1), v[1]) for m, v in metrics.items() if STALL.match(m)), key=lambda item: -item[1])
        if stalls:
            lines.append("    stalls per issue: " + ", ".join(f"{reason} {value:.2f}" for reason, value in stalls[:top]))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report")
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args(argv)
    launches = parse(Path(args.report).read_text(errors="replace"))
    if not launches:
        print(f"no kernel launch found in {args.report}", file=sys.stderr)
        return 1
    print("\n".join(summary(launches, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
