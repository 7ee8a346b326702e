"""Measure a GPU's two ceilings once: device-to-device copy bandwidth and dense bf16 GEMM rate.

The hygiene of the skill in one file: random data (and zeros beside it, to show the difference),
warm-up, CUDA events (no host timer around asynchronous work), one synchronisation after all
timed runs, the median of many runs, buffers far larger than L2, the environment recorded, the
clocks read but never changed. Prints one JSON document.

Usage:
  python measure_ceilings.py                      # on a CUDA device (about 10 s)
  python measure_ceilings.py --device cpu --small # dry run of the logic on a CPU (host timer)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time


def read_clocks() -> dict[str, str]:
    """Current SM/memory clocks and power, read-only (never lock or reset clocks on a shared card)."""
    query = "clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu,driver_version"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(zip(query.split(","), (v.strip() for v in out.split("\n")[0].split(",")))) if out else {}


def time_runs(torch, step, runs: int, device: str) -> list[float]:
    """Seconds per run: device events on CUDA (one sync at the end), perf_counter around a sync on CPU."""
    for _ in range(3):  # warm-up: clocks ramp, caches and handles are created
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
        for start, end in pairs:
            start.record()
            step()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in pairs]
    times = []
    for _ in range(runs):
        begin = time.perf_counter()
        step()
        times.append(time.perf_counter() - begin)
    return times


def copy_bandwidth(torch, device: str, nbytes: int, runs: int, zeros: bool) -> dict[str, float]:
    elements = nbytes // 2
    source = torch.zeros(elements, dtype=torch.bfloat16, device=device) if zeros else \
        torch.randn(elements, dtype=torch.bfloat16, device=device)
    target = torch.empty_like(source)
    times = time_runs(torch, lambda: target.copy_(source), runs, device)
    moved = 2 * source.numel() * source.element_size()  # bytes read + bytes written
    return {"bytes_per_run": moved, "median_s": statistics.median(times), "TB_per_s": moved / statistics.median(times) / 1e12,
            "spread_pct": 100 * (max(times) - min(times)) / statistics.median(times)}


def gemm_rate(torch, device: str, n: int, runs: int, zeros: bool) -> dict[str, float]:
    make = (lambda: torch.zeros(n, n, dtype=torch.bfloat16, device=device)) if zeros else \
        (lambda: torch.randn(n, n, dtype=torch.bfloat16, device=device))
    a, b = make(), make()
    out = torch.empty(n, n, dtype=torch.bfloat16, device=device)
    times = time_runs(torch, lambda: torch.matmul(a, b, out=out), runs, device)
    flops = 2.0 * n ** 3
    return {"n": n, "median_s": statistics.median(times), "TFLOP_per_s": flops / statistics.median(times) / 1e12}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny sizes (logic check, not a measurement)")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --small for a dry run", file=sys.stderr)
        return 2
    copy_bytes = (8 << 20) if args.small else (4 << 30)  # 4 GiB: far beyond any L2
    gemm_n = 256 if args.small else 8192
    env = {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform()}
    if args.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, sm_count=props.multi_processor_count,
                   l2_bytes=getattr(props, "L2_cache_size", None), clocks_before=read_clocks())
    results = {"environment": env}
    # Alternate orders so that a clock ramp does not favour whichever runs second.
    for label, zeros in (("random", False), ("zeros", True), ("random-again", False)):
        results[f"copy-{label}"] = copy_bandwidth(torch, args.device, copy_bytes, args.runs, zeros)
        results[f"gemm-{label}"] = gemm_rate(torch, args.device, gemm_n, args.runs, zeros)
    if args.device == "cuda":
        env["clocks_after"] = read_clocks()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
