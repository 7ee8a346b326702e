"""Timing helpers: device events on CUDA, a synchronised host clock elsewhere; medians of repeats."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(
    fn: Callable[[], object], device: torch.device, warmup: int = 2, repeat: int = 5
) -> float:
    """Median seconds of `fn()` over `repeat` runs after `warmup` runs (CUDA events on CUDA)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - begin)
    return statistics.median(samples)


class HostClock:
    """Wall time of host-visible steps (each engine step ends by reading tokens back, so it is synchronised)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()


def graph_seconds(step: Callable[[], object], replays: int = 7) -> float:
    """Median seconds of one replay of a CUDA graph holding `step` (warmed up on a side stream first).

    Kernel timing scripts put several back-to-back calls in `step` and divide: the in-graph cost of a
    call, launch gaps included, as a decode step pays it.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    samples = []
    for _ in range(replays):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / 1e3)
    return statistics.median(samples)
