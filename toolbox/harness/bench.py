"""`toolbox bench`: time an implementation on a contract's benchmark shapes (CUDA) and compare with the roofline.

Per benchmark: fresh seeded input sets from make_inputs, rotated so their total exceeds twice the
L2 cache; a warm-up; then the median of at least 50 timed runs, replaying a CUDA graph of one
pass over all sets when the implementation can be captured, else CUDA events around each call.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolbox.harness.hardware import HardwareProfile
from toolbox.harness.hardware import profile as get_profile
from toolbox.harness.inputs import allocate_outputs, bind, make_inputs
from toolbox.harness.loading import LoadedContract, import_function, load_contract
from toolbox.harness.outcome import last_line
from toolbox.harness.records import Record, environment
from toolbox.harness.roofline import input_sets_needed, roofline_point
from toolbox.harness.statuses import ContractError, Status, UsageError

MIN_RUNS = 50
DEFAULT_L2_BYTES = 50 * 1024 * 1024


def bench_contract(
    contract: str | Path,
    impl: str,
    profile: str = "h200",
    benchmarks: list[str] | None = None,
    runs: int = 100,
    contracts_dir: Path | None = None,
    env: dict[str, Any] | None = None,
) -> list[Record]:
    """One record (kind "benchmark") per benchmark shape, with latency_ms and roofline_fraction."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError("toolbox bench times on a CUDA device and none is available here (use `toolbox test` on the CPU)")
    hardware = get_profile(profile)
    loaded = load_contract(contract, contracts_dir)
    function = import_function(impl)
    if loaded.contract.interface != "dps":
        raise UsageError(f"{loaded.id} uses interface {loaded.contract.interface}; bench times destination-passing contracts only")
    chosen = [b for b in loaded.contract.benchmarks if not benchmarks or b.name in benchmarks]
    if not chosen:
        names = ", ".join(b.name for b in loaded.contract.benchmarks) or "none"
        raise UsageError(f"{loaded.id}: no benchmark to run (asked {benchmarks or 'all'}; the contract has: {names})")
    env = env if env is not None else environment()
    return [_bench_one(loaded, function, impl, benchmark, hardware, max(runs, MIN_RUNS), env) for benchmark in chosen]


def _bench_one(loaded: LoadedContract, function: Callable, impl: str, benchmark, hardware: HardwareProfile, runs: int, env) -> Record:

    contract = loaded.contract
    base = dict(contract_id=contract.id, contract_version=contract.version, implementation=impl, case=benchmark.name,
                kind="benchmark", device="cuda", dtype=benchmark.dtype, axes=dict(benchmark.axes), environment=env)
    try:
        binding = bind(contract, benchmark.axes, benchmark.params, benchmark.dtype, "cuda", 0, f"benchmark {benchmark.name!r}")
        base["axes"] = dict(binding.axes)
        calls = _input_sets(loaded, binding)
        latency_s, method = _time(function, calls, runs)
    except ContractError as error:
        return Record(**base, status=Status.RUNTIME_ERROR, message=f"contract bug in {contract.id}: {error}")
    except Exception as error:
        return Record(**base, status=Status.RUNTIME_ERROR, message=f"implementation raised {last_line(error)}")
    fraction, note = None, "no roofline in the contract"
    if contract.roofline is not None:
        point = roofline_point(contract.roofline, binding, hardware)
        fraction = point.fraction(latency_s)
        bound = "memory" if point.memory_s >= point.compute_s else "compute"
        note = f"{bound}-bound ideal {point.ideal_s * 1e3:.4f} ms on {hardware.key} ({point.bytes:.3g} B, {point.flops:.3g} FLOP)"
    message = f"{method}, {len(calls)} input sets, median of {runs} runs; {note}; timing only (correctness: toolbox test)"
    return Record(**base, status=Status.PASSED, message=message, latency_ms=latency_s * 1e3, roofline_fraction=fraction)


def _input_sets(loaded: LoadedContract, binding) -> list[dict[str, Any]]:
    """Keyword arguments for each call; as many distinct sets as it takes to exceed 2x the L2 cache."""
    import torch

    first = make_inputs(loaded, binding)
    outputs = allocate_outputs(loaded, binding, pattern=1)
    set_bytes = sum(t.numel() * t.element_size() for t in [*first.values(), *outputs.values()])
    properties = torch.cuda.get_device_properties(0)
    l2 = int(getattr(properties, "L2_cache_size", 0) or DEFAULT_L2_BYTES)
    free, _ = torch.cuda.mem_get_info()
    count = input_sets_needed(set_bytes, l2, free)
    calls = [{**first, **outputs, **binding.params}]
    for index in range(1, count):
        seeded = type(binding)(binding.axes, binding.params, binding.dtype, binding.device, binding.seed + index)
        calls.append({**make_inputs(loaded, seeded), **allocate_outputs(loaded, binding, pattern=1), **binding.params})
    return calls


def _time(function: Callable, calls: list[dict[str, Any]], runs: int) -> tuple[float, str]:
    """Median seconds per call: CUDA-graph replay of one pass over all input sets when capturable, else events."""
    import torch

    for kwargs in calls:  # warm-up (also triggers any JIT compilation) on every set
        function(**kwargs)
    torch.cuda.synchronize()
    graph = _capture(function, calls)
    if graph is not None:
        times = _event_times(graph.replay, runs)
        return statistics.median(times) / len(calls), "cuda graph replay"
    index = [0]

    def one_call() -> None:
        function(**calls[index[0] % len(calls)])
        index[0] += 1

    return statistics.median(_event_times(one_call, max(runs, len(calls)))), "cuda events per call"


def _capture(function: Callable, calls: list[dict[str, Any]]):
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            for kwargs in calls:  # warm-up on the capture stream, as capture requires
                function(**kwargs)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for kwargs in calls:
                function(**kwargs)
        graph.replay()
        torch.cuda.synchronize()
        return graph
    except Exception:
        torch.cuda.synchronize()
        return None


def _event_times(step: Callable[[], None], runs: int) -> list[float]:
    import torch

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for start, end in pairs:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in pairs]
