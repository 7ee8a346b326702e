"""Where a step's wall time goes on the GPU machine: host work versus device work.

Measures, on the full-size preset (NVFP4 linears, bf16 LM head):
- prefill of `--prompt-tokens` tokens: wall time of the runner's step (synchronised) against the CUDA-event
  time of the same step, and the device time of the same forward captured in a CUDA graph (no launch gaps),
  when the forward can be captured;
- batch-1 decode: the pieces of one runner step (staging the inputs, the graph launch, the wait for the
  token) over many steps, and the graph's device time replayed back to back;
- the per-kernel tables (top `--top`) of a prefill and of a static decode step at `--batch`.
Writes one JSON file. Usage (GPU machine): python benchmarks/diagnose_host.py --out $OUT/diagnose.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import torch

from reference_engine.bench.measure import EngineBench
from reference_engine.bench.profile import profile_decode_step, profile_prefill
from reference_engine.ops.host_values import one_forward
from reference_engine.presets import build_preset
from reference_engine.tokenizer import load_tokenizer


def _events_ms(fn) -> tuple[float, float]:
    """(wall ms, device ms) of fn(), synchronised before and after."""
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin = time.perf_counter()
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return (time.perf_counter() - begin) * 1e3, start.elapsed_time(stop)


def prefill_figures(bench: EngineBench, prompt: list[int]) -> dict:
    runner = bench.recorder.runner
    execute = runner.execute
    seen: list = []

    def timed(plan, rows):
        if plan.is_decode:
            return execute(plan, rows)
        holder = {}
        seen.append((plan, _events_ms(lambda: holder.setdefault("value", execute(plan, rows)))))
        return holder["value"]

    runner.execute = timed  # an instance attribute: the recorder calls it
    try:
        for _ in range(4):  # the first warms up
            bench._run([prompt], max_tokens=1)
    finally:
        del runner.execute
    result = {"wall_ms": [t[0] for _, t in seen[1:]], "device_ms": [t[1] for _, t in seen[1:]]}
    # the same forward captured in a CUDA graph: its replay is the device time without launch gaps
    try:
        batch = runner.prepare(seen[-1][0])
        with torch.inference_mode(), one_forward():
            runner.model.forward(batch, runner.caches)  # reads the batch metadata to the host once
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                runner.model.forward(batch, runner.caches)
        result["graph_device_ms"] = [_events_ms(graph.replay)[1] for _ in range(5)]
    except Exception as error:  # noqa: BLE001 - the diagnosis records why capture failed
        result["graph_error"] = f"{type(error).__name__}: {error}"[:500]
    return result


def _params(max_tokens: int):
    from reference_engine.sampling_params import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def decode_pieces(bench: EngineBench, prompt: list[int], steps: int) -> dict:
    """Host clock around the pieces of each batch-1 decode step."""
    engine = bench.engine
    decoder = bench.recorder.runner.decoder
    bench._run([prompt[:16]], max_tokens=3)  # captures the batch-1 graph
    marks: dict[str, list[float]] = {"fill": [], "replay_call": [], "run_total": [], "execute": [], "engine_step": []}
    fill, run = decoder.fill, decoder.run
    runner = bench.recorder.runner
    execute = runner.execute

    def timed_fill(plan):
        begin = time.perf_counter()
        value = fill(plan)
        marks["fill"].append(time.perf_counter() - begin)
        return value

    def timed_run(plan):
        begin = time.perf_counter()
        value = run(plan)
        marks["run_total"].append(time.perf_counter() - begin)
        return value

    def timed_execute(plan, rows):
        begin = time.perf_counter()
        value = execute(plan, rows)
        marks["execute"].append(time.perf_counter() - begin)
        return value

    graphs = decoder._graphs

    class TimedGraph:
        def __init__(self, graph):
            self.graph = graph

        def replay(self):
            begin = time.perf_counter()
            self.graph.replay()
            marks["replay_call"].append(time.perf_counter() - begin)

    decoder.fill, decoder.run, runner.execute = timed_fill, timed_run, timed_execute
    decoder._graphs = {bucket: TimedGraph(graph) for bucket, graph in graphs.items()}
    engine.add_request(prompt_token_ids=prompt[:64], params=_params(steps))
    while engine.has_unfinished():
        begin = time.perf_counter()
        engine.step()
        marks["engine_step"].append(time.perf_counter() - begin)
    decoder.fill, decoder.run, runner.execute = fill, run, execute
    decoder._graphs = graphs
    return {name: {"median_us": statistics.median(values) * 1e6, "count": len(values)} for name, values in marks.items() if values} | {
        "graph_device_us": (bench.graph_replay_seconds(1) or float("nan")) * 1e6
    }


def python_profile(bench: EngineBench, prompt: list[int], steps: int, top: int) -> dict:
    """cProfile (host functions by own time) of one prefill and of `steps` batch-1 decode steps."""
    result = {}
    for name, prompt_ids, max_tokens in (("prefill", prompt, 1), ("decode", prompt[:64], steps)):
        bench._run([prompt_ids], max_tokens=max_tokens)  # warm
        profiler = cProfile.Profile()
        profiler.enable()
        bench._run([prompt_ids], max_tokens=max_tokens)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
        result[name] = text.getvalue()[:12000]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--max-batches", default="1,64", help="engine sizes (max_num_seqs) to compare, comma-separated")
    parser.add_argument("--skip-tables", action="store_true", help="no per-kernel tables")
    args = parser.parse_args()
    device = torch.device("cuda")
    model = build_preset("full", device=device, dtype=torch.bfloat16, seed=0, quantize="nvfp4")
    tokenizer = load_tokenizer("full")
    result: dict = {}

    def save() -> None:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)

    for max_batch in (int(v) for v in args.max_batches.split(",")):
        bench = EngineBench(model, tokenizer, "graphs", args.prompt_tokens, 64, args.steps, max_batch=max_batch)
        prompt = bench._random_prompt(args.prompt_tokens)
        for name, fn, fn_args in (("decode_pieces", decode_pieces, (bench, prompt, args.steps)), ("prefill", prefill_figures, (bench, prompt)),
                                  ("python_profile", python_profile, (bench, prompt, 20, 30))):  # fmt: skip
            key = f"{name}_max{max_batch}"
            try:
                result[key] = fn(*fn_args)
            except Exception as error:  # noqa: BLE001 - keep the other figures
                result[key] = {"error": f"{type(error).__name__}: {error}"[:500]}
            print(key, json.dumps(result[key])[:3000] if name != "python_profile" else "", flush=True)
            save()
        bench = fn_args = None
        torch.cuda.empty_cache()
    if args.skip_tables:
        return
    result["profile_prefill"] = profile_prefill(model, tokenizer, args.prompt_tokens, top=args.top)
    save()
    result[f"profile_decode_b{args.batch}"] = profile_decode_step(model, tokenizer, batch=args.batch, top=args.top)
    save()
    for key in ("profile_prefill", f"profile_decode_b{args.batch}"):
        table = result[key]
        print(key, f"{table['total_us']:.0f} us in {table['launches']} launches")
        for row in table["kernels"]:
            print(f"  {row['calls']:5d} {row['time_us']:10.1f}  {row['name'][:100]}")


if __name__ == "__main__":
    main()
